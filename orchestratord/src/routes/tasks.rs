//! `/v1/tasks`: submit, status, stream, cancel.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use contracts::{AdmissionResponse, ErrorCode, ErrorEnvelope, TaskRequest, TaskStatus};

use crate::app_state::SharedState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::examples;
use crate::json_body::JsonBody;
use crate::lifecycle::admission;
use crate::lifecycle::deadline::Delivery;
use crate::lifecycle::sse;
use crate::lifecycle::subscription::{Resume, Subscription};
use crate::metrics::CancelReason;

/// Submit a task.
#[utoipa::path(
    post, operation_id = "submitTask", path = "/v1/tasks", tag = "data",
    request_body(content = TaskRequest, example = json!({"prompt": "Write a haiku about the sea.", "max_tokens": 32, "seed": 7})),
    responses(
        (status = 202, description = "Admitted and queued", body = AdmissionResponse),
        (status = 400, description = "Invalid parameters (names the field), context overflow, a `pool_id` that names no pool", body = ErrorEnvelope, example = examples::invalid_params),
        (status = 404, description = "No pool serves the model (names the field)", body = ErrorEnvelope, example = examples::not_found),
        (status = 413, description = "Body too large", body = ErrorEnvelope, example = examples::payload_too_large),
        (status = 422, description = "`deadline_ms` or `X-Request-Deadline-Ms` cannot be met even by an idle pool", body = ErrorEnvelope, example = examples::deadline_unmet),
        (status = 429, description = "Queue full, the predicted wait misses `deadline_ms` / `X-Request-Deadline-Ms` (`policy_label: deadline`; the place in line is kept for a retry that sends `X-Retry-Count` ≥ 1), or session budget exceeded", body = ErrorEnvelope,
            headers(("Retry-After" = u64, description = "Seconds to wait, at least 1"), ("retry-after-ms" = u64, description = "Advised wait in ms"), ("X-Backoff-Ms" = u64, description = "Advised wait in ms")),
            example = examples::admission_reject),
        (status = 503, description = "The pinned pool is not Ready, or no pool serving the model is", body = ErrorEnvelope, example = examples::pool_unready),
    )
)]
pub async fn submit(
    State(state): State<SharedState>,
    caller: Caller,
    JsonBody(req): JsonBody<TaskRequest>,
) -> Result<Response, ApiError> {
    let (body, _task, _new) =
        admission::admit(&state.lifecycle, req, &caller, Delivery::Whole).await?;
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

/// The task `id` as `caller` may see it: its own tenant's, or any for an admin. Another
/// tenant's task is 404, as if it did not exist.
pub fn visible_task(
    state: &SharedState,
    caller: &Caller,
    id: &str,
) -> Result<std::sync::Arc<crate::lifecycle::task::Task>, ApiError> {
    state
        .tasks
        .get(caller.tenant(), id, caller.principal.sees_all())
        .ok_or_else(|| ApiError::not_found("task", id))
}

/// [`visible_task`], or in a cluster a task admitted on another replica, followed from here
/// from now on (its events from the cluster's relay).
pub async fn find_task(
    state: &SharedState,
    caller: &Caller,
    id: &str,
) -> Result<std::sync::Arc<crate::lifecycle::task::Task>, ApiError> {
    let not_here = match visible_task(state, caller, id) {
        Ok(task) => return Ok(task),
        Err(e) => e,
    };
    let Some(path) = state.cluster_tasks.get() else {
        return Err(not_here);
    };
    path.adopt(caller.tenant(), caller.principal.sees_all(), id)
        .await?
        .ok_or(not_here)
}

/// A task's state and record; an ended task's comes from the record store once it has left
/// memory (after `stream.transcript_ttl_ms`, or a restart).
#[utoipa::path(
    get, operation_id = "getTask", path = "/v1/tasks/{id}", tag = "data",
    params(("id" = String, Path, description = "Task id")),
    responses(
        (status = 200, description = "State and record", body = TaskStatus, example = examples::task_status),
        (status = 404, description = "Unknown task, or its record was deleted by retention", body = ErrorEnvelope, example = examples::not_found),
    )
)]
pub async fn status(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<TaskStatus>, ApiError> {
    let Ok(task) = find_task(&state, &caller, &id).await else {
        // ended before the TTL or a restart: its stored record
        let stored = crate::routes::artifacts::stored_task_record(
            &state,
            caller.tenant(),
            caller.principal.sees_all(),
            &id,
        )
        .await?;
        return stored
            .map(|r| Json(status_of_record(r)))
            .ok_or_else(|| ApiError::not_found("task", &id));
    };
    let (st, code) = {
        let g = task.lock();
        (g.state, g.error_code)
    };
    Ok(Json(TaskStatus {
        task_id: task.id.clone(),
        state: st,
        queue_position: state.queue.position(&task).map(|p| p as u32),
        error_code: code,
        record: task.record(),
    }))
}

/// The status of an ended task from its stored record.
fn status_of_record(record: contracts::TaskRecord) -> TaskStatus {
    use contracts::{TaskState, TerminalEvent};
    let (state, error_code) = match &record.terminal {
        Some(TerminalEvent::End(e)) if e.finish_reason == "cancelled" => {
            (TaskState::Cancelled, None)
        }
        Some(TerminalEvent::End(_)) => (TaskState::Completed, None),
        Some(TerminalEvent::Error(e)) => (TaskState::Failed, Some(e.code)),
        // only ended tasks are stored; one without a terminal event did not finish
        None => (TaskState::Failed, None),
    };
    TaskStatus {
        task_id: record.task_id.clone(),
        state,
        queue_position: None,
        error_code,
        record,
    }
}

/// Stream a task's events as SSE, from the start or, with `Last-Event-ID`, right after the
/// event with that id. Each event carries its `id:`. A stream that goes away before the end
/// cancels the task only when nobody follows it again within the disconnect grace period.
#[utoipa::path(
    get, operation_id = "streamTask", path = "/v1/tasks/{id}/stream", tag = "data",
    params(
        ("id" = String, Path, description = "Task id"),
        ("Last-Event-ID" = Option<u64>, Header, nullable = false, description = "Resume after the event with this id (what `EventSource` sends when it reconnects)"),
    ),
    responses(
        (status = 200, description = "SSE: started, token*, metrics*, then exactly one end or error; every event with its id", content_type = "text/event-stream", body = contracts::SseEvent, example = examples::sse_stream),
        (status = 204, description = "The stream already delivered its terminal event to this reader (`Last-Event-ID` is the last event): nothing more will come, do not reconnect"),
        (status = 400, description = "`Last-Event-ID` is not an event id", body = ErrorEnvelope, example = examples::invalid_params),
        (status = 409, description = "`Last-Event-ID` names an event this task has not sent", body = ErrorEnvelope, example = examples::conflict),
        (status = 404, description = "Unknown or expired task", body = ErrorEnvelope, example = examples::not_found),
    )
)]
pub async fn stream(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let task = find_task(&state, &caller, &id).await?;
    let from = match headers.get(LAST_EVENT_ID) {
        None => 0,
        Some(v) => {
            let (len, terminal) = {
                let g = task.lock();
                (g.events.len(), g.is_terminal())
            };
            let last = v
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .ok_or_else(|| {
                    ApiError::invalid(LAST_EVENT_ID, "Last-Event-ID must be an event id")
                })?;
            if last >= len {
                // well formed, but this task has not sent that event (yet)
                return Err(ApiError::new(
                    contracts::ErrorCode::Conflict,
                    format!("Last-Event-ID must be the id of an event this task sent (0..{len})"),
                    false,
                )
                .with_field(LAST_EVENT_ID));
            }
            if terminal && last + 1 == len {
                return Ok(StatusCode::NO_CONTENT.into_response());
            }
            last + 1
        }
    };
    let sub = Subscription::new(&state.lifecycle, task, from, Resume::WithinGrace);
    Ok(sse::response(sub, state.cfg.stream.keepalive_ms))
}

/// The header an `EventSource` sends when it reconnects.
const LAST_EVENT_ID: &str = "last-event-id";

/// Cancel a queued or running task. After 204, no `token` event is ever sent.
#[utoipa::path(
    post, operation_id = "cancelTask", path = "/v1/tasks/{id}/cancel", tag = "data",
    params(("id" = String, Path, description = "Task id")),
    responses(
        (status = 204, description = "Cancelled (or had already ended)"),
        (status = 404, description = "Unknown or expired task (in a cluster: on every replica)", body = ErrorEnvelope, example = examples::not_found),
        (status = 503, description = "In a cluster: the cancel could not reach the other replicas", body = ErrorEnvelope, example = examples::cluster_unavailable),
    )
)]
pub async fn cancel(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let task = match visible_task(&state, &caller, &id) {
        Ok(task) => task,
        // in a cluster, another replica may hold it: the replicas running or following it end
        // it with their own clocks (adopted here first, its decode would be timed from the
        // replay: issue 49 saw `decode_time_ms: 0` after 170 tokens)
        Err(not_here) => {
            let Some(cluster) = state.cluster.get() else {
                return Err(not_here);
            };
            let ask = crate::cluster::cancel::CancelAsk {
                tenant: caller.tenant().to_string(),
                sees_all: caller.principal.sees_all(),
            };
            match cluster.cancel_elsewhere(&id, &ask).await {
                Ok(Some(replica)) => {
                    tracing::info!(task_id = %id, %replica, "cancelled on another replica");
                    return Ok(StatusCode::NO_CONTENT);
                }
                // only on the relay (no replica follows or runs it): ended from here, so
                // whoever takes it from the queue drops it
                Ok(None) => find_task(&state, &caller, &id).await?,
                Err(e) => {
                    return Err(ApiError::new(
                        ErrorCode::ClusterUnavailable,
                        format!("the cancel could not reach the other replicas: {e}"),
                        true,
                    )
                    .with_retry_after(1000))
                }
            }
        }
    };
    state.cancel_task(&task, CancelReason::Client);
    Ok(StatusCode::NO_CONTENT)
}
