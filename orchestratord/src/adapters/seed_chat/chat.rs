//! `POST /chat/completions` (one JSON object, or NDJSON lines with `stream: true`) and
//! `POST /chat/sse` (`data:` events then `data: [END]`), as seed 001 specifies.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use contracts::TaskRequest;
use futures::StreamExt;

use super::types::*;
use crate::adapters::follow;
use crate::app_state::SharedState;
use crate::auth::Caller;
use crate::error::openai::{error_type, OpenAiError};
use crate::error::ApiError;
use crate::json_body::JsonBody;
use crate::lifecycle::deadline::Delivery;
use crate::lifecycle::subscription::Followed;
use crate::lifecycle::task::TaskEvent;

/// The SSE terminator.
const END: &[u8] = b"data: [END]\n\n";
/// The NDJSON media type a client may ask for in `Accept`.
const NDJSON: &str = "application/x-ndjson";

fn to_task(req: &ChatRequest) -> Result<TaskRequest, ApiError> {
    Ok(TaskRequest {
        messages: Some(crate::adapters::openai::types::chat_turns(&req.messages)?),
        model: Some(req.model.clone()),
        max_tokens: req.max_tokens,
        seed: req.seed,
        temperature: req.temperature,
        top_p: req.top_p,
        stop: req.stop.clone(),
        ..Default::default()
    })
}

/// How the chunks of one stream are framed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// `declared`: the client's `Accept` names `application/x-ndjson`, so the lines go out
    /// under that type; otherwise under seed 001's `application/json`.
    Ndjson {
        declared: bool,
    },
    Sse,
}

impl Framing {
    fn chunk(self, c: &ChatChunk) -> Bytes {
        match self {
            Self::Sse => follow::sse_data(c),
            Self::Ndjson { .. } => {
                let mut out = Vec::with_capacity(96);
                let _ = serde_json::to_writer(&mut out, c);
                out.push(b'\n');
                out.into()
            }
        }
    }

    fn error(self, e: &contracts::SseError) -> Bytes {
        let err = StreamError {
            message: e.message.clone(),
            kind: error_type(e.code),
            code: e.code,
        };
        let mut out = Vec::with_capacity(160);
        match self {
            Self::Sse => {
                out.extend_from_slice(b"event: error\ndata: ");
                let _ = serde_json::to_writer(&mut out, &err);
                out.extend_from_slice(b"\n\n");
            }
            Self::Ndjson { .. } => {
                let _ = serde_json::to_writer(
                    &mut out,
                    &NdjsonError {
                        error: err,
                        done: true,
                    },
                );
                out.push(b'\n');
            }
        }
        out.into()
    }

    fn content_type(self) -> &'static str {
        match self {
            Self::Sse => "text/event-stream",
            Self::Ndjson { declared: true } => NDJSON,
            Self::Ndjson { declared: false } => "application/json",
        }
    }
}

async fn handle(
    state: SharedState,
    caller: Caller,
    req: ChatRequest,
    framing: Option<Framing>,
) -> Result<Response<Body>, OpenAiError> {
    let delivery = match framing {
        Some(_) => Delivery::Streamed,
        None => Delivery::Whole,
    };
    let task = follow::admit(&state, to_task(&req)?, &caller, delivery).await?;
    let mut sub = follow::subscribe(&state, &task);
    let Some(framing) = framing else {
        let (text, end) = follow::collect(sub).await?;
        return Ok(Json(ChatResponse {
            id: format!("cmpl-{}", task.id),
            model: req.model,
            created: follow::unix_now(),
            message: ChatMessage::assistant(text),
            done: true,
            finish_reason: end.finish_reason,
        })
        .into_response());
    };
    follow::until_answer_begins(std::slice::from_mut(&mut sub)).await?;
    let mut index = 0u32;
    // NDJSON has no comment lines: only the SSE framing sends keep-alives
    let keepalive = follow::keepalive(&state).filter(|_| framing == Framing::Sse);
    let stream = sub.into_stream(keepalive).flat_map(move |f| {
        let ev = match f {
            Followed::Event(_, ev) => ev,
            Followed::KeepAlive => {
                let frames = vec![Bytes::from_static(follow::SSE_KEEPALIVE)];
                return futures::stream::iter(frames.into_iter().map(Ok::<_, std::io::Error>));
            }
        };
        let mut next = |content: String, done: bool, finish: Option<String>| {
            let c = ChatChunk {
                message: ChatMessage::assistant(content),
                done,
                index,
                finish_reason: finish,
            };
            index += 1;
            framing.chunk(&c)
        };
        let frames: Vec<Bytes> = match ev {
            // an incomplete UTF-8 character: nothing to show yet
            TaskEvent::Token(t) if t.t.is_empty() => vec![],
            TaskEvent::Token(t) => vec![next(t.t, false, None)],
            TaskEvent::Started(_) | TaskEvent::Metrics(_) => vec![],
            TaskEvent::End(end) => {
                let mut v = vec![next(String::new(), true, Some(end.finish_reason))];
                if framing == Framing::Sse {
                    v.push(Bytes::from_static(END));
                }
                v
            }
            TaskEvent::Error(e) => {
                let mut v = vec![framing.error(&e)];
                if framing == Framing::Sse {
                    v.push(Bytes::from_static(END));
                }
                v
            }
        };
        futures::stream::iter(frames.into_iter().map(Ok::<_, std::io::Error>))
    });
    let mut resp = Response::new(Body::from_stream(stream));
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(framing.content_type()),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(resp)
}

/// One JSON answer, or with `stream: true` NDJSON lines `{message, done, index}`; the last line
/// has `done: true` (and `finish_reason`). A failure after the first line is one
/// `{"error": {…}, "done": true}` line.
#[utoipa::path(
    post, operation_id = "seedChatCompletions", path = "/chat/completions", tag = "chat",
    request_body = ChatRequest,
    responses(
        (status = 200, description = "`stream: false`: one object. `stream: true`: NDJSON, one chunk per line, the last with `done: true`, under seed 001's `Content-Type: application/json` — or `application/x-ndjson` when the request's `Accept` names it.", content(
            (ChatResponse = "application/json", example = json!({"id": "cmpl-6f1c0d9e", "model": "SmolLM2-135M-Instruct.Q4_1", "created": 1763780000, "message": {"role": "assistant", "content": "I'm doing well, thank you!"}, "done": true, "finish_reason": "stop"})),
            (ChatChunk = "application/x-ndjson", example = json!("{\"message\":{\"role\":\"assistant\",\"content\":\"I'm\"},\"done\":false,\"index\":0}\n{\"message\":{\"role\":\"assistant\",\"content\":\" well\"},\"done\":false,\"index\":1}\n{\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"index\":2,\"finish_reason\":\"stop\"}\n")),
        )),
        (status = 400, description = "Bad request (missing model or messages, bad types)", body = crate::error::openai::ErrorBody, example = crate::examples::openai_invalid),
        (status = 404, description = "Unknown model", body = crate::error::openai::ErrorBody, example = crate::examples::openai_not_found),
        (status = 422, description = "The client's stated timeout (`X-Request-Deadline-Ms`, `x-stainless-read-timeout`, `x-stainless-timeout`) cannot be met even by an idle pool", body = crate::error::openai::ErrorBody, example = crate::examples::openai_deadline_unmet),
        (status = 429, description = "Queue full, or the predicted wait misses the client's stated timeout: retry after `retry-after-ms` (also `Retry-After` seconds); a retry (`x-stainless-retry-count` ≥ 1) keeps its place in line", body = crate::error::openai::ErrorBody, example = crate::examples::openai_rate_limited),
        (status = 503, description = "No pool for the model is ready", body = crate::error::openai::ErrorBody, example = crate::examples::openai_unready),
        (status = 504, description = "Queued, it could no longer start in time for the client (`QUEUE_TIMEOUT`, retriable, with `retry-after-ms`); a stream begins only with its first token, so this is never a 200", body = crate::error::openai::ErrorBody, example = crate::examples::openai_queue_timeout),
    )
)]
pub async fn completions(
    State(state): State<SharedState>,
    caller: Caller,
    headers: HeaderMap,
    body: Result<JsonBody<ChatRequest>, ApiError>,
) -> Result<Response<Body>, OpenAiError> {
    let JsonBody(req) = body?;
    let declared = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains(NDJSON));
    let framing = req.stream.then_some(Framing::Ndjson { declared });
    handle(state, caller, req, framing).await
}

/// Server-sent events: `data: {message, done, index}` per chunk, a last `done: true` chunk,
/// then `data: [END]`. A failure is `event: error` with `{message, type, code}`, then
/// `data: [END]`.
#[utoipa::path(
    post, operation_id = "seedChatSse", path = "/chat/sse", tag = "chat",
    request_body = ChatRequest,
    responses(
        (status = 200, description = "An SSE stream", content(
            (contracts::SseEvent = "text/event-stream", example = json!("data: {\"message\":{\"role\":\"assistant\",\"content\":\"I'm\"},\"done\":false,\"index\":0}\n\ndata: {\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"index\":1,\"finish_reason\":\"stop\"}\n\ndata: [END]\n\n")),
        )),
        (status = 400, description = "Bad request", body = crate::error::openai::ErrorBody, example = crate::examples::openai_invalid),
        (status = 404, description = "Unknown model", body = crate::error::openai::ErrorBody, example = crate::examples::openai_not_found),
        (status = 422, description = "The client's stated timeout (`X-Request-Deadline-Ms`, `x-stainless-read-timeout`, `x-stainless-timeout`) cannot be met even by an idle pool", body = crate::error::openai::ErrorBody, example = crate::examples::openai_deadline_unmet),
        (status = 429, description = "Queue full, or the predicted wait misses the client's stated timeout: retry after `retry-after-ms` (also `Retry-After` seconds); a retry (`x-stainless-retry-count` ≥ 1) keeps its place in line", body = crate::error::openai::ErrorBody, example = crate::examples::openai_rate_limited),
        (status = 503, description = "No pool for the model is ready", body = crate::error::openai::ErrorBody, example = crate::examples::openai_unready),
        (status = 504, description = "Queued, it could no longer start in time for the client (`QUEUE_TIMEOUT`, retriable, with `retry-after-ms`); a stream begins only with its first token, so this is never a 200", body = crate::error::openai::ErrorBody, example = crate::examples::openai_queue_timeout),
    )
)]
pub async fn sse(
    State(state): State<SharedState>,
    caller: Caller,
    body: Result<JsonBody<ChatRequest>, ApiError>,
) -> Result<Response<Body>, OpenAiError> {
    let JsonBody(req) = body?;
    handle(state, caller, req, Some(Framing::Sse)).await
}
