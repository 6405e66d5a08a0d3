//! `/v1/artifacts/{id}`: the per-task record.

use axum::extract::{Path, State};
use axum::Json;
use contracts::{ErrorEnvelope, TaskRecord};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::examples;
use crate::state::SharedState;

/// The record of a task (params with the prompt redacted, seed, timings, terminal event,
/// transcript). Kept for the configured TTL after the task ends.
#[utoipa::path(
    get, operation_id = "getArtifact", path = "/v1/artifacts/{id}", tag = "data",
    params(("id" = String, Path, description = "Task id")),
    responses(
        (status = 200, description = "The record", body = TaskRecord, example = examples::record),
        (status = 404, description = "Unknown or expired", body = ErrorEnvelope, example = examples::not_found),
    )
)]
pub async fn get(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<TaskRecord>, ApiError> {
    state
        .tasks
        .get(caller.tenant(), &id, caller.principal.sees_all())
        .map(|t| Json(t.record()))
        .ok_or_else(|| ApiError::not_found("artifact", &id))
}
