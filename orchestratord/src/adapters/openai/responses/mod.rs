//! `POST /v1/responses`: OpenAI's Responses API, stateless (nothing is stored: `store` is
//! false, `previous_response_id` is refused). Instructions and input as chat turns; the answer
//! one output message — or, under function tools, one `function_call` item per call —
//! streamed as `response.*` events.

mod output;
mod request;
mod tools;
pub mod types;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::Response;
use axum::response::IntoResponse;
use axum::Json;
use futures::StreamExt;
use serde_json::{json, Value};

use crate::adapters::follow;
use crate::adapters::tool_calls::{self, Block, BlockStream, Step};
use crate::app_state::SharedState;
use crate::auth::Caller;
use crate::error::openai::{error_type, OpenAiError};
use crate::error::ApiError;
use crate::json_body::JsonBody;
use crate::lifecycle::deadline::Delivery;
use crate::lifecycle::subscription::Followed;
use crate::lifecycle::task::{Task, TaskEvent};
use output::{message, Events};
use request::to_task;
use types::*;

/// The response object around `output` (none while in progress).
struct Shell {
    id: String,
    created_at: u64,
    model: String,
    req: ResponsesRequest,
}

impl Shell {
    fn text_config(&self) -> Value {
        match self.req.text.as_ref().and_then(|t| t.format.as_ref()) {
            None | Some(TextFormat::Text) => json!({"format": {"type": "text"}}),
            Some(TextFormat::JsonObject) => json!({"format": {"type": "json_object"}}),
            Some(TextFormat::JsonSchema { name, schema, .. }) => {
                json!({"format": {"type": "json_schema", "name": name, "schema": schema, "strict": true}})
            }
        }
    }

    fn object(
        &self,
        status: &'static str,
        output: Vec<OutputItem>,
        usage: Option<ResponseUsage>,
    ) -> ResponseObject {
        ResponseObject {
            id: self.id.clone(),
            object: "response",
            created_at: self.created_at,
            status,
            model: self.model.clone(),
            output,
            usage,
            incomplete_details: (status == "incomplete").then_some(IncompleteDetails {
                reason: "max_output_tokens",
            }),
            error: None,
            instructions: self.req.instructions.clone(),
            max_output_tokens: self.req.max_output_tokens,
            temperature: self.req.temperature,
            top_p: self.req.top_p,
            parallel_tool_calls: self.req.parallel_tool_calls.unwrap_or(true),
            tool_choice: self
                .req
                .tool_choice
                .clone()
                .filter(|c| !c.is_null())
                .unwrap_or_else(|| json!("auto")),
            tools: self
                .req
                .tools
                .as_ref()
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            text: self.text_config(),
            metadata: self.req.metadata.clone().unwrap_or_else(|| json!({})),
            store: false,
        }
    }
}

/// `completed`, or `incomplete` when the budget cut the answer.
fn status_of(end: &contracts::SseEnd) -> &'static str {
    if end.finish_reason == "length" {
        "incomplete"
    } else {
        "completed"
    }
}

/// OpenAI's Responses API, stateless: `input` (a string or messages) after `instructions`,
/// one output message; `text.format` for structured output.
#[utoipa::path(
    post, operation_id = "openaiResponses", path = "/v1/responses", tag = "openai",
    request_body = ResponsesRequest,
    responses(
        (status = 200, description = "The response; with `stream: true` SSE events `response.created`, `response.in_progress`, `response.output_item.added`, `response.content_part.added`, `response.output_text.delta`*, `response.output_text.done`, `response.content_part.done`, `response.output_item.done`, then `response.completed` (its response's `status` `incomplete` when `max_output_tokens` cut it, as vLLM's server does: the SDK's stream helper waits for `response.completed`); under function tools each call is an item of its own: `response.output_item.added` (`function_call`), `response.function_call_arguments.delta`*, `response.function_call_arguments.done`, `response.output_item.done`. A failure after the stream began is an `error` event.", content(
            (ResponseObject = "application/json"),
            (contracts::SseEvent = "text/event-stream", example = json!("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"msg_6f1c0d9e\",\"output_index\":0,\"content_index\":0,\"delta\":\" Paris\",\"logprobs\":[],\"sequence_number\":4}\n\n")),
        )),
        (status = 400, description = "Bad request: a field this stateless server does not serve is named (`store: true`, `previous_response_id`, built-in tools, reasoning, non-text input)", body = crate::error::openai::ErrorBody, example = crate::examples::openai_invalid),
        (status = 404, description = "Unknown model", body = crate::error::openai::ErrorBody, example = crate::examples::openai_not_found),
        (status = 429, description = "Queue full, or the predicted wait misses the client's stated timeout: retry after `retry-after-ms`", body = crate::error::openai::ErrorBody, example = crate::examples::openai_rate_limited),
        (status = 503, description = "No pool for the model is ready", body = crate::error::openai::ErrorBody, example = crate::examples::openai_unready),
    )
)]
pub async fn responses(
    State(state): State<SharedState>,
    caller: Caller,
    body: Result<JsonBody<ResponsesRequest>, ApiError>,
) -> Result<Response<Body>, OpenAiError> {
    let JsonBody(req) = body?;
    let delivery = Delivery::of(req.stream);
    let (task_req, toolbox) = to_task(&req)?;
    let tools = toolbox.is_some();
    let shaped_by = if tools { "tools" } else { "text.format" };
    let rename = |e| {
        let e = follow::renamed(e, "json_schema", shaped_by);
        follow::renamed(e, "max_tokens", "max_output_tokens")
    };
    let task = follow::admit(&state, task_req, &caller, delivery)
        .await
        .map_err(rename)?;
    let task_id = task.id.to_string();
    let shell = Shell {
        id: format!("resp_{}", task.id.replace('-', "")),
        created_at: follow::unix_now(),
        model: follow::model_name(&state, req.model.as_deref(), &task),
        req: req.clone(),
    };
    let msg_id = format!("msg_{}", task.id.replace('-', ""));
    let mut sub = follow::subscribe(&state, &task);
    let usage = |task: &Task, output: u32| {
        let input = task.prompt_tokens_used();
        ResponseUsage {
            input_tokens: input,
            input_tokens_details: InputTokensDetails {
                cached_tokens: task.prompt_tokens_cached(),
            },
            output_tokens: output,
            total_tokens: input + output,
        }
    };
    if !req.stream {
        let (text, _, end) = match tools {
            true => follow::collect_tool_answer(&state, &task, sub).await,
            false => follow::collect_scored(sub).await,
        }
        .map_err(rename)?;
        let status = status_of(&end);
        let out = if tools {
            output::items(tool_calls::blocks(&text), &task_id, &msg_id, status)
        } else {
            vec![OutputItem::Message(message(&msg_id, status, Some(text)))]
        };
        let used = usage(&task, end.tokens_out);
        return Ok(Json(shell.object(status, out, Some(used))).into_response());
    }
    follow::until_answer_begins(std::slice::from_mut(&mut sub))
        .await
        .map_err(rename)?;
    let mut events = Events::new(&task_id, &msg_id);
    let opening = shell.object("in_progress", vec![], None);
    let mut first = vec![
        events.event("response.created", json!({"response": opening})),
        events.event("response.in_progress", json!({"response": opening})),
    ];
    if !tools {
        // a plain answer is one message, open from the start
        first.extend(events.step(Step::Open {
            index: 0,
            call: None,
        }));
    }
    let counted = task.clone();
    // under tools the answer is followed block by block; else its text is gathered
    let answer = tools.then(BlockStream::new);
    let rest = sub
        .into_stream(follow::keepalive(&state))
        .scan(
            (events, answer, String::new()),
            move |(events, answer, text), f| {
                let frames = match f {
                    Followed::KeepAlive => vec![Bytes::from_static(follow::SSE_KEEPALIVE)],
                    Followed::Event(_, TaskEvent::Token(t)) => match answer.as_mut() {
                        Some(scan) => {
                            let steps = scan.push(&t.t);
                            if scan.repeated() {
                                follow::end_at_repeat(&state, &counted);
                            }
                            steps.into_iter().flat_map(|s| events.step(s)).collect()
                        }
                        None if t.t.is_empty() => vec![],
                        None => {
                            text.push_str(&t.t);
                            events.step(Step::Delta {
                                index: 0,
                                text: t.t,
                            })
                        }
                    },
                    Followed::Event(_, TaskEvent::End(end)) => {
                        let status = status_of(&end);
                        events.closing = status;
                        let last = match answer.as_mut() {
                            Some(scan) => scan.finish(),
                            None => vec![Step::Close {
                                index: 0,
                                block: Block::Text(std::mem::take(text)),
                            }],
                        };
                        let mut frames: Vec<Bytes> =
                            last.into_iter().flat_map(|s| events.step(s)).collect();
                        let used = usage(&counted, end.tokens_out);
                        let whole = shell.object(status, events.output(), Some(used));
                        // always `response.completed` (its `status` says incomplete): the
                        // SDK's stream helper waits for it, as vLLM's server sends it
                        frames.push(events.event("response.completed", json!({"response": whole})));
                        frames
                    }
                    Followed::Event(_, TaskEvent::Error(e)) => vec![events.event(
                        "error",
                        json!({"code": e.code, "message": e.message, "param": e.field,
                               "error_type": error_type(e.code)}),
                    )],
                    Followed::Event(..) => vec![],
                };
                futures::future::ready(Some(frames))
            },
        )
        .flat_map(|frames| futures::stream::iter(frames.into_iter().map(Ok::<_, std::io::Error>)));
    let stream = futures::stream::iter(first.into_iter().map(Ok::<_, std::io::Error>)).chain(rest);
    Ok(crate::lifecycle::sse::event_stream_response(
        Body::from_stream(stream),
    ))
}
