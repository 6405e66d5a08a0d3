//! `POST /v1/messages` (one message, or with `stream: true` Anthropic's event sequence) and
//! `POST /v1/messages/count_tokens`.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::Response;
use axum::response::IntoResponse;
use axum::Json;
use futures::StreamExt;
use serde_json::json;

use super::request::{count_task, messages_task};
use super::types::*;
use crate::adapters::follow;
use crate::adapters::tool_calls::{BlockStream, Step};
use crate::app_state::SharedState;
use crate::auth::Caller;
use crate::error::anthropic::{body as error_body, AnthropicError};
use crate::error::ApiError;
use crate::json_body::JsonBody;
use crate::lifecycle::deadline::Delivery;
use crate::lifecycle::subscription::Followed;
use crate::lifecycle::task::TaskEvent;

/// Anthropic's `stop_reason` for a task's end (`called`: the answer made tool calls).
fn stop_reason(end: &contracts::SseEnd, called: bool) -> String {
    match (end.finish_reason.as_str(), &end.stop_sequence) {
        ("stop", None) if called => "tool_use".into(),
        ("stop", Some(_)) => "stop_sequence".into(),
        ("stop", None) => "end_turn".into(),
        ("length", _) => "max_tokens".into(),
        (other, _) => other.to_string(),
    }
}

/// Anthropic's Messages API: the system prompt and the turns through the model's chat
/// template; a final assistant turn is continued.
#[utoipa::path(
    post, operation_id = "anthropicMessages", path = "/v1/messages", tag = "anthropic",
    request_body = MessagesRequest,
    responses(
        (status = 200, description = "The message; with `stream: true` SSE events `message_start`, `content_block_start`, `ping`, `content_block_delta`* (`text_delta`), `content_block_stop`, `message_delta` (`stop_reason`, `stop_sequence`, `usage.output_tokens`), `message_stop` (`ping` also while a long prompt is read). A failure after the stream began is an `error` event.", content(
            (MessageResponse = "application/json"),
            (contracts::SseEvent = "text/event-stream", example = json!("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_6f1c0d9e\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"SmolLM2-135M-Instruct.Q4_1\",\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":37,\"output_tokens\":0}}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Paris\"}}\n\nevent: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":1}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")),
        )),
        (status = 400, description = "Bad request: `max_tokens` missing, a block or field this server does not serve (named)", body = crate::error::anthropic::ErrorBody, example = json!({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: field required"}})),
        (status = 404, description = "No pool serves the model", body = crate::error::anthropic::ErrorBody, example = json!({"type": "error", "error": {"type": "not_found_error", "message": "model: no pool serves model \"claude-x\""}})),
        (status = 422, description = "The client's stated timeout cannot be met even by an idle pool", body = crate::error::anthropic::ErrorBody, example = json!({"type": "error", "error": {"type": "invalid_request_error", "message": "the deadline cannot be met"}})),
        (status = 429, description = "Queue full, or the predicted wait misses the client's stated timeout: retry after `retry-after` (`retry-after-ms`), which the SDK honours", body = crate::error::anthropic::ErrorBody, example = json!({"type": "error", "error": {"type": "rate_limit_error", "message": "queue full"}})),
        (status = 503, description = "No pool for the model is ready", body = crate::error::anthropic::ErrorBody, example = json!({"type": "error", "error": {"type": "overloaded_error", "message": "no pool is ready"}})),
        (status = 504, description = "Queued, it could no longer start in time for the client", body = crate::error::anthropic::ErrorBody, example = json!({"type": "error", "error": {"type": "api_error", "message": "queued past its start-by time"}})),
    )
)]
pub async fn messages(
    State(state): State<SharedState>,
    caller: Caller,
    body: Result<JsonBody<MessagesRequest>, ApiError>,
) -> Result<Response<Body>, AnthropicError> {
    let JsonBody(req) = body?;
    let (task_req, toolbox) = messages_task(&req)?;
    if task_req.max_tokens == Some(0) {
        // Anthropic's cache pre-warm: nothing generated, the prompt counted
        let input_tokens = input_tokens(&state, &caller, &task_req, &req.model).await?;
        return Ok(nothing_generated(&req, input_tokens));
    }
    let tools = toolbox.is_some();
    let shaped_by = if tools {
        "tools"
    } else {
        "output_config.format"
    };
    let rename = |e| follow::renamed(e, "json_schema", shaped_by);
    let delivery = Delivery::of(req.stream);
    let task = follow::admit(&state, task_req, &caller, delivery)
        .await
        .map_err(rename)?;
    let task_id = task.id.to_string();
    let id = format!("msg_{}", task.id);
    let model = req.model.clone();
    let mut sub = follow::subscribe(&state, &task);
    if !req.stream {
        let (text, _, end) = match tools {
            true => follow::collect_tool_answer(&state, &task, sub).await,
            false => follow::collect_scored(sub).await,
        }
        .map_err(rename)?;
        let (content, called) = if tools {
            super::tools::content(&text, &task_id)
        } else {
            (vec![ContentBlock::Text { text }], false)
        };
        return Ok(Json(MessageResponse {
            id,
            kind: "message",
            role: "assistant",
            model,
            content,
            stop_reason: Some(stop_reason(&end, called)),
            stop_sequence: end.stop_sequence.clone(),
            usage: Usage::of(&task, end.tokens_out),
        })
        .into_response());
    }
    follow::until_answer_begins(std::slice::from_mut(&mut sub))
        .await
        .map_err(rename)?;
    let start = MessageResponse {
        id,
        kind: "message",
        role: "assistant",
        model,
        content: vec![],
        stop_reason: None,
        stop_sequence: None,
        // what the cache held is known at the end: `message_delta` says it
        usage: Usage::of(&task, 0),
    };
    let mut opening = vec![follow::sse_event(
        "message_start",
        &json!({"type": "message_start", "message": start}),
    )];
    if !tools {
        // a plain answer is one text block, open from the start
        opening.push(follow::sse_event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ));
    }
    opening.push(follow::sse_event("ping", &json!({"type": "ping"})));
    // under tools: the answer followed block by block (and whether the open one is a call)
    let blocks = tools.then(|| (BlockStream::new(), false));
    let followed = task.clone();
    let rest = sub
        .into_stream(follow::keepalive(&state))
        .scan(blocks, move |blocks, f| {
            let frames = match (f, blocks.as_mut()) {
                (Followed::KeepAlive, _) => {
                    vec![follow::sse_event("ping", &json!({"type": "ping"}))]
                }
                (Followed::Event(_, TaskEvent::Token(t)), Some((scan, in_call))) => {
                    let steps = scan.push(&t.t);
                    if scan.repeated() {
                        follow::end_at_repeat(&state, &followed);
                    }
                    let calls = scan.calls();
                    steps
                        .into_iter()
                        .map(|step| block_frame(step, in_call, calls, &task_id))
                        .collect()
                }
                (Followed::Event(_, TaskEvent::Token(t)), None) if !t.t.is_empty() => {
                    vec![follow::sse_event(
                        "content_block_delta",
                        &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t.t}}),
                    )]
                }
                (Followed::Event(_, TaskEvent::End(end)), blocks) => {
                    let mut v = match blocks {
                        Some((scan, in_call)) => {
                            let calls = scan.calls();
                            scan.finish()
                                .into_iter()
                                .map(|step| block_frame(step, in_call, calls, &task_id))
                                .collect()
                        }
                        None => vec![follow::sse_event(
                            "content_block_stop",
                            &json!({"type": "content_block_stop", "index": 0}),
                        )],
                    };
                    let called = blocks.as_ref().is_some_and(|(scan, _)| scan.calls() > 0);
                    v.push(follow::sse_event(
                        "message_delta",
                        &json!({"type": "message_delta", "delta": {"stop_reason": stop_reason(&end, called), "stop_sequence": end.stop_sequence}, "usage": Usage::of(&followed, end.tokens_out)}),
                    ));
                    v.push(follow::sse_event("message_stop", &json!({"type": "message_stop"})));
                    v
                }
                (Followed::Event(_, TaskEvent::Error(e)), _) => {
                    let env = contracts::ErrorEnvelope::new(e.code, e.message, e.retriable);
                    vec![follow::sse_event("error", &json!(error_body(&env)))]
                }
                (Followed::Event(..), _) => vec![],
            };
            futures::future::ready(Some(frames))
        })
        .flat_map(|frames| futures::stream::iter(frames.into_iter().map(Ok::<_, std::io::Error>)));
    let stream =
        futures::stream::iter(opening.into_iter().map(Ok::<_, std::io::Error>)).chain(rest);
    Ok(crate::lifecycle::sse::event_stream_response(
        Body::from_stream(stream),
    ))
}

/// A step of an answer under tools as its event: a block opens (`tool_use` with its id and
/// name, `input` empty), grows (`text_delta`, or `input_json_delta` fragments of the input's
/// JSON) or stops. `calls`: calls begun so far (the open call is the last).
fn block_frame(step: Step, in_call: &mut bool, calls: usize, task_id: &str) -> Bytes {
    match step {
        Step::Open { index, call } => {
            *in_call = call.is_some();
            let block = match call {
                Some(name) => {
                    json!({"type": "tool_use", "id": super::tools::tool_use_id(task_id, calls.saturating_sub(1)), "name": name, "input": {}})
                }
                None => json!({"type": "text", "text": ""}),
            };
            follow::sse_event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": index, "content_block": block}),
            )
        }
        Step::Delta { index, text } => {
            let delta = if *in_call {
                json!({"type": "input_json_delta", "partial_json": text})
            } else {
                json!({"type": "text_delta", "text": text})
            };
            follow::sse_event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index, "delta": delta}),
            )
        }
        Step::Close { index, .. } => follow::sse_event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": index}),
        ),
    }
}

/// The input tokens a message request would be charged: the system prompt and turns through
/// the model's chat template, as `/v1/messages` runs them.
#[utoipa::path(
    post, operation_id = "anthropicCountTokens", path = "/v1/messages/count_tokens", tag = "anthropic",
    request_body = CountRequest,
    responses(
        (status = 200, description = "The count", body = TokenCount),
        (status = 400, description = "Bad request; a model served by a remote worker (no token ids)", body = crate::error::anthropic::ErrorBody, example = json!({"type": "error", "error": {"type": "invalid_request_error", "message": "messages[0].content[0]: content blocks of type \"image\" are not supported: the models served here read text only"}})),
        (status = 404, description = "No pool serves the model", body = crate::error::anthropic::ErrorBody, example = json!({"type": "error", "error": {"type": "not_found_error", "message": "model: no pool serves model \"claude-x\""}})),
        (status = 503, description = "No pool serving the model has it loaded", body = crate::error::anthropic::ErrorBody, example = json!({"type": "error", "error": {"type": "overloaded_error", "message": "no pool serving the model has it loaded"}})),
    )
)]
pub async fn count_tokens(
    State(state): State<SharedState>,
    caller: Caller,
    body: Result<JsonBody<CountRequest>, ApiError>,
) -> Result<Json<TokenCount>, AnthropicError> {
    let JsonBody(req) = body?;
    let task = count_task(&req)?;
    Ok(Json(TokenCount {
        input_tokens: input_tokens(&state, &caller, &task, &req.model).await?,
    }))
}

/// The prompt tokens of `task` as the model would run it.
async fn input_tokens(
    state: &SharedState,
    caller: &Caller,
    task: &contracts::TaskRequest,
    model: &str,
) -> Result<u32, ApiError> {
    let (prompt, continuation) = crate::lifecycle::admission::prompt_of(task)?;
    let engine = crate::adapters::tokenize::engine_for(state, Some(model))?;
    let tenant = caller.tenant();
    state
        .quotas
        .count_request(tenant, std::time::Instant::now())
        .map_err(crate::lifecycle::quota::OverQuota::into_api)?;
    let ids = state
        .request_work
        .tokenize(
            crate::lifecycle::request_work::Turn::Request(tenant),
            engine,
            &prompt,
            &continuation,
        )
        .await
        .map_err(|e| e.into_api("messages"))?
        .ok_or_else(|| {
            ApiError::invalid(
                "model",
                "the model is served by a remote worker, which takes text: it has no token count to give",
            )
        })?;
    Ok(u32::try_from(ids.ids.len()).unwrap_or(u32::MAX))
}

/// The answer to `max_tokens: 0`: no content, `stop_reason: max_tokens`, the prompt counted;
/// as one message or as the event sequence without deltas.
fn nothing_generated(req: &MessagesRequest, input_tokens: u32) -> Response<Body> {
    let message = MessageResponse {
        id: format!("msg_{}", uuid::Uuid::new_v4().simple()),
        kind: "message",
        role: "assistant",
        model: req.model.clone(),
        content: vec![],
        stop_reason: Some("max_tokens".into()),
        stop_sequence: None,
        usage: Usage {
            input_tokens,
            output_tokens: 0,
            cache_read_input_tokens: 0,
            cache_creation_input_tokens: 0,
        },
    };
    if !req.stream {
        return Json(message).into_response();
    }
    let opening = MessageResponse {
        stop_reason: None,
        ..message
    };
    let frames = [
        follow::sse_event(
            "message_start",
            &json!({"type": "message_start", "message": opening}),
        ),
        follow::sse_event(
            "message_delta",
            &json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": null}, "usage": {"output_tokens": 0}}),
        ),
        follow::sse_event("message_stop", &json!({"type": "message_stop"})),
    ];
    crate::lifecycle::sse::event_stream_response(Body::from(frames.concat()))
}
