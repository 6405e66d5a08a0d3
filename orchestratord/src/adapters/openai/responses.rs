//! `POST /v1/responses`: OpenAI's Responses API, stateless (nothing is stored: `store` is
//! false, `previous_response_id` is refused). Instructions and input as chat turns; the answer
//! one output message, streamed as `response.*` events.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::Response;
use axum::response::IntoResponse;
use axum::Json;
use contracts::{ChatTurn, TaskRequest};
use futures::StreamExt;
use serde_json::{json, Value};

use super::responses_types::*;
use crate::adapters::follow;
use crate::auth::Caller;
use crate::error::openai::{error_type, OpenAiError};
use crate::error::ApiError;
use crate::json_body::JsonBody;
use crate::lifecycle::deadline::Delivery;
use crate::lifecycle::state::SharedState;
use crate::lifecycle::subscription::Followed;
use crate::lifecycle::task::TaskEvent;

fn refuse(field: impl Into<String>, why: impl Into<String>) -> ApiError {
    ApiError::invalid(field, why)
}

/// What a stateless server without tools or reasoning cannot honour, refused by name.
fn unserved(req: &ResponsesRequest) -> Result<(), ApiError> {
    if req.store == Some(true) {
        return Err(refuse(
            "store",
            "responses are not stored here (stateless): send store: false",
        ));
    }
    if req.previous_response_id.is_some() {
        return Err(refuse(
            "previous_response_id",
            "responses are not stored here (stateless): send the conversation as input",
        ));
    }
    if req
        .tools
        .as_ref()
        .is_some_and(|t| !(t.is_null() || t.as_array().is_some_and(|a| a.is_empty())))
    {
        return Err(refuse(
            "tools",
            "tools are not supported by this server yet",
        ));
    }
    if req
        .tool_choice
        .as_ref()
        .is_some_and(|c| !(c.is_null() || c == "none"))
    {
        return Err(refuse(
            "tool_choice",
            "tool_choice must be none (no tools here)",
        ));
    }
    if req.reasoning.as_ref().is_some_and(|r| !r.is_null()) {
        return Err(refuse("reasoning", "no model served here reasons"));
    }
    if req.truncation.as_deref().is_some_and(|t| t != "disabled") {
        return Err(refuse("truncation", "truncation must be disabled"));
    }
    if req.include.as_ref().is_some_and(|i| !i.is_empty()) {
        return Err(refuse("include", "no extra output can be included here"));
    }
    if req.background == Some(true) {
        return Err(refuse(
            "background",
            "answers are not kept to be fetched later (stateless)",
        ));
    }
    Ok(())
}

fn part_text(p: &InputPart, field: &str) -> Result<String, ApiError> {
    match (p.kind.as_str(), &p.text) {
        ("input_text" | "output_text" | "text", Some(t)) => Ok(t.clone()),
        ("input_text" | "output_text" | "text", None) => {
            Err(refuse(field, "a text part needs its text"))
        }
        (kind, _) => {
            let shown: String = kind.escape_debug().take(40).collect();
            Err(refuse(
                field,
                format!("parts of type \"{shown}\" are not supported: the models served here read text only"),
            ))
        }
    }
}

/// The instructions and input as chat turns.
fn turns(req: &ResponsesRequest) -> Result<Vec<ChatTurn>, ApiError> {
    let mut out = Vec::new();
    if let Some(i) = req.instructions.as_ref().filter(|i| !i.is_empty()) {
        out.push(ChatTurn {
            role: "system".into(),
            content: i.clone(),
        });
    }
    let items = match &req.input {
        Input::Text(t) => {
            out.push(ChatTurn {
                role: "user".into(),
                content: t.clone(),
            });
            return Ok(out);
        }
        Input::Items(items) => items,
    };
    if items.is_empty() {
        return Err(refuse("input", "input has no items"));
    }
    for (i, item) in items.iter().enumerate() {
        let field = format!("input[{i}]");
        if item.kind.as_deref().is_some_and(|k| k != "message") {
            let shown: String = item
                .kind
                .as_deref()
                .unwrap_or("")
                .escape_debug()
                .take(40)
                .collect();
            return Err(refuse(
                field,
                format!("input items of type \"{shown}\" are not supported (messages only)"),
            ));
        }
        let role = match item.role.as_deref() {
            Some("developer") | Some("system") => "system",
            Some("user") => "user",
            Some("assistant") => "assistant",
            _ => {
                return Err(refuse(
                    format!("{field}.role"),
                    "role must be user, assistant, system or developer",
                ))
            }
        };
        let content = match &item.content {
            Some(InputContent::Text(t)) => t.clone(),
            Some(InputContent::Parts(parts)) => {
                let mut texts = Vec::with_capacity(parts.len());
                for (j, p) in parts.iter().enumerate() {
                    texts.push(part_text(p, &format!("{field}.content[{j}]"))?);
                }
                texts.join("\n")
            }
            None => {
                return Err(refuse(
                    format!("{field}.content"),
                    "a message needs content",
                ))
            }
        };
        out.push(ChatTurn {
            role: role.into(),
            content,
        });
    }
    Ok(out)
}

fn to_task(req: &ResponsesRequest) -> Result<TaskRequest, ApiError> {
    unserved(req)?;
    let json_schema = match req.text.as_ref().and_then(|t| t.format.as_ref()) {
        None | Some(TextFormat::Text) => None,
        Some(TextFormat::JsonObject) => Some(json!({"type": "object"})),
        Some(TextFormat::JsonSchema { schema, .. }) => Some(schema.clone()),
    };
    let user = req.user.as_deref().or(req.safety_identifier.as_deref());
    Ok(TaskRequest {
        model: req.model.clone(),
        messages: Some(turns(req)?),
        max_tokens: req.max_output_tokens,
        temperature: req.temperature,
        top_p: req.top_p,
        session_id: super::session_of(user),
        json_schema,
        ..Default::default()
    })
}

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
        output: Vec<OutputMessage>,
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
            parallel_tool_calls: false,
            tool_choice: "none",
            tools: vec![],
            text: self.text_config(),
            metadata: self.req.metadata.clone().unwrap_or_else(|| json!({})),
            store: false,
        }
    }
}

fn message(id: &str, status: &'static str, text: Option<String>) -> OutputMessage {
    OutputMessage {
        kind: "message",
        id: id.to_string(),
        status,
        role: "assistant",
        content: text
            .map(|text| OutputText {
                kind: "output_text",
                text,
                annotations: vec![],
            })
            .into_iter()
            .collect(),
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

/// `event: <type>` with `data` carrying `type` and `sequence_number`.
fn event(seq: &mut u64, kind: &str, mut data: Value) -> Bytes {
    data["type"] = json!(kind);
    data["sequence_number"] = json!(*seq);
    *seq += 1;
    follow::sse_event(kind, &data)
}

/// OpenAI's Responses API, stateless: `input` (a string or messages) after `instructions`,
/// one output message; `text.format` for structured output.
#[utoipa::path(
    post, operation_id = "openaiResponses", path = "/v1/responses", tag = "openai",
    request_body = ResponsesRequest,
    responses(
        (status = 200, description = "The response; with `stream: true` SSE events `response.created`, `response.in_progress`, `response.output_item.added`, `response.content_part.added`, `response.output_text.delta`*, `response.output_text.done`, `response.content_part.done`, `response.output_item.done`, then `response.completed` (its response's `status` `incomplete` when `max_output_tokens` cut it, as vLLM's server does: the SDK's stream helper waits for `response.completed`); a failure after the stream began is an `error` event.", content(
            (ResponseObject = "application/json"),
            (contracts::SseEvent = "text/event-stream", example = json!("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"item_id\":\"msg_6f1c0d9e\",\"output_index\":0,\"content_index\":0,\"delta\":\" Paris\",\"logprobs\":[],\"sequence_number\":4}\n\n")),
        )),
        (status = 400, description = "Bad request: a field this stateless server does not serve is named (`store: true`, `previous_response_id`, tools, reasoning, non-text input)", body = crate::error::openai::ErrorBody, example = crate::examples::openai_invalid),
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
    let rename = |e| follow::renamed(e, "json_schema", "text.format");
    let task = follow::admit(&state, to_task(&req)?, &caller, delivery)
        .await
        .map_err(rename)?;
    let shell = Shell {
        id: format!("resp_{}", task.id.replace('-', "")),
        created_at: follow::unix_now(),
        model: follow::model_name(&state, req.model.as_deref(), &task),
        req: req.clone(),
    };
    let msg_id = format!("msg_{}", task.id.replace('-', ""));
    let mut sub = follow::subscribe(&state, &task);
    let usage = |input: u32, output: u32| ResponseUsage {
        input_tokens: input,
        output_tokens: output,
        total_tokens: input + output,
    };
    if !req.stream {
        let (text, end) = follow::collect(sub).await.map_err(rename)?;
        let status = status_of(&end);
        let out = vec![message(&msg_id, status, Some(text))];
        let used = usage(task.prompt_tokens_used(), end.tokens_out);
        return Ok(Json(shell.object(status, out, Some(used))).into_response());
    }
    follow::until_answer_begins(std::slice::from_mut(&mut sub))
        .await
        .map_err(rename)?;
    let mut seq = 0u64;
    let opening = shell.object("in_progress", vec![], None);
    let part = json!({"type": "output_text", "text": "", "annotations": []});
    let first = vec![
        event(&mut seq, "response.created", json!({"response": opening})),
        event(
            &mut seq,
            "response.in_progress",
            json!({"response": opening}),
        ),
        event(
            &mut seq,
            "response.output_item.added",
            json!({"output_index": 0, "item": message(&msg_id, "in_progress", None)}),
        ),
        event(
            &mut seq,
            "response.content_part.added",
            json!({"item_id": msg_id, "output_index": 0, "content_index": 0, "part": part}),
        ),
    ];
    let counted = task.clone();
    let at = |id: &str| json!({"item_id": id, "output_index": 0, "content_index": 0});
    let rest = sub
        .into_stream(follow::keepalive(&state))
        .scan((seq, String::new()), move |(seq, text), f| {
            let frames = match f {
                Followed::KeepAlive => vec![Bytes::from_static(follow::SSE_KEEPALIVE)],
                Followed::Event(_, TaskEvent::Token(t)) if !t.t.is_empty() => {
                    text.push_str(&t.t);
                    let mut d = at(&msg_id);
                    d["delta"] = json!(t.t);
                    d["logprobs"] = json!([]);
                    vec![event(seq, "response.output_text.delta", d)]
                }
                Followed::Event(_, TaskEvent::End(end)) => {
                    let status = status_of(&end);
                    let done = std::mem::take(text);
                    let mut d = at(&msg_id);
                    d["text"] = json!(done);
                    d["logprobs"] = json!([]);
                    let mut p = at(&msg_id);
                    p["part"] = json!({"type": "output_text", "text": done, "annotations": []});
                    let item = message(&msg_id, status, Some(done.clone()));
                    let used = usage(counted.prompt_tokens_used(), end.tokens_out);
                    let whole = shell.object(status, vec![item.clone()], Some(used));
                    vec![
                        event(seq, "response.output_text.done", d),
                        event(seq, "response.content_part.done", p),
                        event(
                            seq,
                            "response.output_item.done",
                            json!({"output_index": 0, "item": item}),
                        ),
                        // always `response.completed` (its `status` says incomplete): the
                        // SDK's stream helper waits for it, as vLLM's server sends it
                        event(seq, "response.completed", json!({"response": whole})),
                    ]
                }
                Followed::Event(_, TaskEvent::Error(e)) => vec![event(
                    seq,
                    "error",
                    json!({"code": e.code, "message": e.message, "param": e.field,
                           "error_type": error_type(e.code)}),
                )],
                Followed::Event(..) => vec![],
            };
            futures::future::ready(Some(frames))
        })
        .flat_map(|frames| futures::stream::iter(frames.into_iter().map(Ok::<_, std::io::Error>)));
    let stream = futures::stream::iter(first.into_iter().map(Ok::<_, std::io::Error>)).chain(rest);
    Ok(crate::lifecycle::sse::event_stream_response(
        Body::from_stream(stream),
    ))
}
