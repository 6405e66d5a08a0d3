//! `/v1/tasks`: submit, status, stream, cancel.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use contracts::{AdmissionResponse, ErrorEnvelope, TaskRequest, TaskStatus};

use crate::correlation::CorrelationId;
use crate::error::ApiError;
use crate::examples;
use crate::json_body::JsonBody;
use crate::lifecycle::admission;
use crate::lifecycle::sse;
use crate::metrics::CancelReason;
use crate::state::SharedState;

/// Submit a task.
#[utoipa::path(
    post, operation_id = "submitTask", path = "/v1/tasks", tag = "data",
    request_body(content = TaskRequest, example = json!({"prompt": "Write a haiku about the sea.", "max_tokens": 32, "seed": 7})),
    responses(
        (status = 202, description = "Admitted and queued", body = AdmissionResponse),
        (status = 400, description = "Invalid parameters (names the field), unknown pool pin, context overflow", body = ErrorEnvelope, example = examples::invalid_params),
        (status = 413, description = "Body too large", body = ErrorEnvelope, example = examples::payload_too_large),
        (status = 422, description = "The deadline cannot be met", body = ErrorEnvelope, example = examples::deadline_unmet),
        (status = 429, description = "Queue full (with Retry-After and X-Backoff-Ms) or session budget exceeded", body = ErrorEnvelope,
            headers(("Retry-After" = u64, description = "Seconds to wait, at least 1"), ("X-Backoff-Ms" = u64, description = "Advised wait in ms")),
            example = examples::admission_reject),
        (status = 503, description = "The pinned pool is not Ready, or no pool serving the model is", body = ErrorEnvelope, example = examples::pool_unready),
    )
)]
pub async fn submit(
    State(state): State<SharedState>,
    Extension(cid): Extension<CorrelationId>,
    JsonBody(req): JsonBody<TaskRequest>,
) -> Result<Response, ApiError> {
    let (body, _task, _new) = admission::admit(&state, req, &cid.0)?;
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

/// A task's state and record.
#[utoipa::path(
    get, operation_id = "getTask", path = "/v1/tasks/{id}", tag = "data",
    params(("id" = String, Path, description = "Task id")),
    responses(
        (status = 200, description = "State and record", body = TaskStatus, example = examples::task_status),
        (status = 404, description = "Unknown or expired task", body = ErrorEnvelope, example = examples::not_found),
    )
)]
pub async fn status(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Json<TaskStatus>, ApiError> {
    let task = state
        .tasks
        .get(&id)
        .ok_or_else(|| ApiError::not_found("task", &id))?;
    let (st, code) = {
        let g = task.lock();
        (g.state, g.error_code)
    };
    Ok(Json(TaskStatus {
        task_id: task.id.clone(),
        state: st,
        queue_position: state.queue.position(&id).map(|p| p as u32),
        error_code: code,
        record: task.record(),
    }))
}

/// Stream a task's events as SSE, from the start.
#[utoipa::path(
    get, operation_id = "streamTask", path = "/v1/tasks/{id}/stream", tag = "data",
    params(("id" = String, Path, description = "Task id")),
    responses(
        (status = 200, description = "SSE: started, token*, metrics*, then exactly one end or error", content_type = "text/event-stream", body = String, example = examples::sse_stream),
        (status = 404, description = "Unknown or expired task", body = ErrorEnvelope, example = examples::not_found),
    )
)]
pub async fn stream(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let task = state
        .tasks
        .get(&id)
        .ok_or_else(|| ApiError::not_found("task", &id))?;
    Ok(sse::response(state, task))
}

/// Cancel a queued or running task. After 204, no `token` event is ever sent.
#[utoipa::path(
    post, operation_id = "cancelTask", path = "/v1/tasks/{id}/cancel", tag = "data",
    params(("id" = String, Path, description = "Task id")),
    responses(
        (status = 204, description = "Cancelled (or had already ended)"),
        (status = 404, description = "Unknown or expired task", body = ErrorEnvelope, example = examples::not_found),
    )
)]
pub async fn cancel(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let task = state
        .tasks
        .get(&id)
        .ok_or_else(|| ApiError::not_found("task", &id))?;
    state.cancel_task(&task, CancelReason::Client);
    Ok(StatusCode::NO_CONTENT)
}
