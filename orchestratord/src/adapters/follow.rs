//! What every adapter does with a task it admitted: follow its events from the first one,
//! cancel it when the client goes away, and map the admission outcome for model-addressed APIs.

use std::sync::Arc;

use contracts::{ErrorCode, TaskRequest};

use crate::adapters::tool_calls::AnswerStream;
use crate::app_state::SharedState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::lifecycle::admission;
use crate::lifecycle::deadline::Delivery;
use crate::lifecycle::subscription::{Resume, Subscription};
use crate::lifecycle::task::{Task, TaskEvent};
use crate::metrics::CancelReason;

/// Follows an admitted task for a protocol that cannot come back to the same stream: the
/// client going away (the response dropped) cancels it unless someone else follows it.
pub fn subscribe(state: &SharedState, task: &Arc<Task>) -> Subscription {
    Subscription::new(&state.lifecycle, task.clone(), 0, Resume::Never)
}

/// The keep-alive interval of streaming responses (`stream.keepalive_ms`; 0 = none).
pub fn keepalive(state: &SharedState) -> Option<std::time::Duration> {
    let ms = state.cfg.stream.keepalive_ms;
    (ms > 0).then(|| std::time::Duration::from_millis(ms))
}

/// An SSE comment: keeps proxies from closing a quiet stream; parsers ignore it.
pub const SSE_KEEPALIVE: &[u8] = b": keep-alive\n\n";

/// Admits a task for an API that addresses models by name: a `model` no pool serves, or one a
/// pinned pool does not serve, is 404 (`NOT_FOUND`, param `model`); a model of the folder
/// that cannot be loaded stays a 400 naming `model`.
pub async fn admit(
    state: &SharedState,
    req: TaskRequest,
    caller: &Caller,
    delivery: Delivery,
) -> Result<Arc<Task>, ApiError> {
    admission::admit(&state.lifecycle, req, caller, delivery)
        .await
        .map(|(_, task, _)| task)
        .map_err(|e| {
            if e.code() == ErrorCode::InvalidParams
                && e.envelope.field.as_deref() == Some("model")
                && e.envelope.pool_id.is_some()
            {
                let mut nf = ApiError::new(ErrorCode::NotFound, e.envelope.message.clone(), false);
                nf.envelope.field = Some("model".into());
                nf
            } else {
                e
            }
        })
}

/// A refusal that names a task field (`json_schema`) renamed as the client's API spells it
/// (`response_format`, `format`), in its message too.
pub fn renamed(mut e: ApiError, task_field: &str, api_field: &str) -> ApiError {
    if e.envelope.field.as_deref() == Some(task_field) {
        e.envelope.field = Some(api_field.to_string());
        if let Some(rest) = e.envelope.message.strip_prefix(task_field) {
            e.envelope.message = format!("{api_field}{rest}");
        }
    }
    e
}

/// Admits several tasks as one request: all or none. When one is refused, those already
/// admitted are cancelled and the refusal is returned.
pub async fn admit_all(
    state: &SharedState,
    reqs: Vec<TaskRequest>,
    caller: &Caller,
    delivery: Delivery,
) -> Result<Vec<Arc<Task>>, ApiError> {
    state
        .quotas
        .check_at_once(caller.tenant(), reqs.len())
        .map_err(crate::lifecycle::quota::OverQuota::into_api)?;
    let mut tasks = Vec::with_capacity(reqs.len());
    for req in reqs {
        match admit(state, req, caller, delivery).await {
            Ok(t) => tasks.push(t),
            Err(e) => {
                for t in &tasks {
                    state.cancel_task(t, CancelReason::Client);
                }
                return Err(e);
            }
        }
    }
    Ok(tasks)
}

/// How far a task's answer is: begun (a token or its end), failed before that, or neither.
fn beginning(sub: &Subscription) -> Option<Result<(), ApiError>> {
    sub.peek(|events| {
        events.iter().find_map(|ev| match ev {
            TaskEvent::Token(_) | TaskEvent::End(_) => Some(Ok(())),
            TaskEvent::Error(e) => Some(Err(error_of(e))),
            TaskEvent::Started(_) | TaskEvent::Metrics(_) => None,
        })
    })
}

/// Waits until the answer begins: the first token or end of any of the request's tasks — or
/// an error before any of them began, then answered as an HTTP error with its status and
/// backoff headers, which SDKs retry, instead of a stream that opens only to fail
/// (ORCH-ADM-DL-4). A streamed response's headers go out only after this.
pub async fn until_answer_begins(subs: &mut [Subscription]) -> Result<(), ApiError> {
    loop {
        let states: Vec<_> = subs.iter().map(beginning).collect();
        if states.iter().any(|s| matches!(s, Some(Ok(())))) {
            return Ok(());
        }
        if let Some(Some(Err(e))) = states.into_iter().find(|s| s.is_some()) {
            return Err(e);
        }
        if subs.is_empty() {
            return Ok(());
        }
        let changes = subs.iter_mut().map(|s| Box::pin(s.wait(None)));
        futures::future::select_all(changes).await;
    }
}

/// The model name to report: what the client asked for, else what the task runs.
pub fn model_name(state: &SharedState, asked: Option<&str>, task: &Task) -> String {
    asked
        .map(str::to_string)
        .or_else(|| task.model.clone())
        .or_else(|| {
            state
                .pools
                .all()
                .first()
                .map(|p| p.spec().model_alias.clone())
        })
        .unwrap_or_default()
}

/// The terminal error of a task as an API error (status, retry hints kept).
pub fn error_of(e: &contracts::SseError) -> ApiError {
    let mut err = ApiError::new(e.code, e.message.clone(), e.retriable);
    if let Some(ms) = e.retry_after_ms {
        err = err.with_retry_after(ms);
    }
    if let Some(f) = &e.field {
        err = err.with_field(f.clone());
    }
    err
}

/// Seconds since the Unix epoch, for `created` fields.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Waits for the task's end: its whole text and the `end` event, or its error.
pub async fn collect(sub: Subscription) -> Result<(String, contracts::SseEnd), ApiError> {
    collect_scored(sub).await.map(|(text, _, end)| (text, end))
}

/// A task's whole text, its tokens' log-probabilities (when it has them) and its `end`.
pub type Collected = (String, Vec<contracts::SseLogprobs>, contracts::SseEnd);

/// [`collect`] with the tokens' log-probabilities, when the task has them.
pub async fn collect_scored(sub: Subscription) -> Result<Collected, ApiError> {
    collect_watching(sub, |_| {}).await
}

/// [`collect_scored`] for an answer under tools: the task ends where the model begins a call
/// identical to an earlier one ([`end_at_repeat`]).
pub async fn collect_tool_answer(
    state: &SharedState,
    task: &Arc<Task>,
    sub: Subscription,
) -> Result<Collected, ApiError> {
    let mut scan = AnswerStream::new();
    collect_watching(sub, |text| {
        scan.push(text);
        if scan.repeated() {
            end_at_repeat(state, task);
        }
    })
    .await
}

/// Ends `task` where its answer under tools began a call identical to an earlier one (see
/// [`AnswerStream`]): it stops decoding, and its `end` says `stop` (the adapters' tool-call
/// ending); the repeat is given to no client.
pub fn end_at_repeat(state: &SharedState, task: &Task) {
    if state.complete_task(task, "stop", None) {
        tracing::debug!(task_id = %task.id, "the answer repeated a tool call: it ends there");
    }
}

/// Collects the task's events to its end, showing `watch` each token's text as it comes.
async fn collect_watching(
    sub: Subscription,
    mut watch: impl FnMut(&str),
) -> Result<Collected, ApiError> {
    use futures::StreamExt;
    let mut text = String::new();
    let mut scores = Vec::new();
    let mut events = Box::pin(sub.events());
    while let Some(ev) = events.next().await {
        match ev {
            TaskEvent::Token(t) => {
                watch(&t.t);
                text.push_str(&t.t);
                scores.extend(t.logprobs);
            }
            TaskEvent::End(end) => return Ok((text, scores, end)),
            TaskEvent::Error(e) => return Err(error_of(&e)),
            TaskEvent::Started(_) | TaskEvent::Metrics(_) => {}
        }
    }
    Err(ApiError::internal(
        "the task ended without a terminal event",
    ))
}

/// Waits for the ends of all of a request's tasks: each one's text, log-probabilities and
/// `end` (`tools`: each an answer under tools, see [`collect_tool_answer`]); the first failure
/// answers at once (dropping the other subscriptions cancels them).
pub async fn collect_all(
    state: &SharedState,
    tasks: &[Arc<Task>],
    tools: bool,
) -> Result<Vec<Collected>, ApiError> {
    futures::future::try_join_all(tasks.iter().map(|t| async move {
        let sub = subscribe(state, t);
        match tools {
            true => collect_tool_answer(state, t, sub).await,
            false => collect_scored(sub).await,
        }
    }))
    .await
}

/// `event: <name>\ndata: <json>\n\n`: a named SSE event (Anthropic's, the Responses API's).
pub fn sse_event<T: serde::Serialize>(name: &str, v: &T) -> axum::body::Bytes {
    let mut out = format!("event: {name}\ndata: ").into_bytes();
    // serializing plain data into a Vec cannot fail
    let _ = serde_json::to_writer(&mut out, v);
    out.extend_from_slice(b"\n\n");
    out.into()
}

/// `data: <json>\n\n`.
pub fn sse_data<T: serde::Serialize>(v: &T) -> axum::body::Bytes {
    let mut out = b"data: ".to_vec();
    // serializing plain data into a Vec cannot fail
    let _ = serde_json::to_writer(&mut out, v);
    out.extend_from_slice(b"\n\n");
    out.into()
}
