//! `/v1/sessions/{id}`.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use contracts::{ErrorEnvelope, SessionInfo};

use crate::app_state::SharedState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::examples;

/// A session's TTL, turns and budgets.
#[utoipa::path(
    get, operation_id = "getSession", path = "/v1/sessions/{id}", tag = "data",
    params(("id" = String, Path, description = "Session id")),
    responses(
        (status = 200, description = "The session", body = SessionInfo),
        (status = 404, description = "Unknown or expired session", body = ErrorEnvelope, example = examples::not_found),
    )
)]
pub async fn get(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<SessionInfo>, ApiError> {
    state
        .sessions
        .info(caller.tenant(), &id, caller.principal.sees_all())
        .map(Json)
        .ok_or_else(|| ApiError::not_found("session", &id))
}

/// Forget a session (its running tasks continue).
#[utoipa::path(
    delete, operation_id = "deleteSession", path = "/v1/sessions/{id}", tag = "data",
    params(("id" = String, Path, description = "Session id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "Unknown session", body = ErrorEnvelope, example = examples::not_found),
    )
)]
pub async fn delete(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    if state
        .sessions
        .delete(caller.tenant(), &id, caller.principal.sees_all())
    {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("session", &id))
    }
}
