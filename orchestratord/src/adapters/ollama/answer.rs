//! `POST /api/chat` and `POST /api/generate`: NDJSON lines as the tokens come (the default),
//! or one object with `stream: false`; the last line carries `done_reason` and the task's
//! counts and durations.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderValue, Response, StatusCode};
use contracts::TaskRequest;
use futures::StreamExt;

use super::request::{chat_task, generate_task, option_name};
use super::tools::ToolCall;
use super::types::*;
use crate::adapters::follow;
use crate::adapters::tool_calls::{AnswerStream, Piece};
use crate::app_state::SharedState;
use crate::auth::Caller;
use crate::error::ollama::{body as error_body, OllamaError};
use crate::error::ApiError;
use crate::json_body::JsonBody;
use crate::lifecycle::deadline::Delivery;
use crate::lifecycle::subscription::Followed;
use crate::lifecycle::task::{Task, TaskEvent};
use crate::models_folder::keep_alive::{self, KeepAlive};

const NDJSON: &str = "application/x-ndjson";

/// Which API's lines: chat's `message`, or generate's `response`.
#[derive(Clone, Copy)]
enum Api {
    Chat,
    Generate,
}

/// Now, as Ollama writes it (RFC 3339, nanoseconds, UTC).
fn now() -> String {
    humantime::format_rfc3339_nanos(std::time::SystemTime::now()).to_string()
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The counts and durations of a finished task.
fn stats(task: &Task, tokens_out: u32) -> Stats {
    let spans = task.spans();
    Stats {
        total_duration: nanos(spans.total),
        load_duration: nanos(spans.waited),
        // Ollama counts the prompt tokens it evaluated: those its cache held are not
        prompt_eval_count: task
            .prompt_tokens_used()
            .saturating_sub(task.prompt_tokens_cached()),
        prompt_eval_duration: nanos(spans.prefill),
        eval_count: tokens_out,
        eval_duration: nanos(spans.decode),
    }
}

/// One line (or the whole answer) as JSON.
fn line(
    api: Api,
    model: &str,
    text: String,
    calls: Option<Vec<ToolCall>>,
    logprobs: Option<Vec<Logprob>>,
    done_reason: Option<String>,
    stats: Option<Stats>,
) -> Vec<u8> {
    let done = done_reason.is_some();
    let mut out = Vec::with_capacity(160 + text.len());
    // serializing plain data into a Vec cannot fail
    let _ = match api {
        Api::Chat => serde_json::to_writer(
            &mut out,
            &ChatLine {
                model: model.to_string(),
                created_at: now(),
                message: AnswerMessage {
                    role: "assistant",
                    content: text,
                    tool_calls: calls,
                },
                done,
                done_reason,
                logprobs,
                stats,
            },
        ),
        Api::Generate => serde_json::to_writer(
            &mut out,
            &GenerateLine {
                model: model.to_string(),
                created_at: now(),
                response: text,
                done,
                done_reason,
                logprobs,
                stats,
            },
        ),
    };
    out
}

fn with_type(body: Body, content_type: &'static str) -> Response<Body> {
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

/// A request with nothing to generate: Ollama loads the model and answers `done_reason:
/// "load"` (with `keep_alive: 0`, `"unload"`); here the model must be served (404 otherwise).
fn loaded(
    state: &SharedState,
    api: Api,
    model: &str,
    stream: bool,
    done_reason: &str,
) -> Result<Response<Body>, ApiError> {
    if !state.pools.all().iter().any(|p| p.serves(model)) {
        return Err(ApiError::not_found("model", model).with_field("model"));
    }
    let mut out = line(
        api,
        model,
        String::new(),
        None,
        None,
        Some(done_reason.into()),
        None,
    );
    if stream {
        out.push(b'\n');
        return Ok(with_type(Body::from(out), NDJSON));
    }
    Ok(with_type(Body::from(out), "application/json"))
}

/// A refusal of a task field that came from `options` or `format`, named as the client sent
/// it.
fn in_options(e: ApiError) -> ApiError {
    let mut e = follow::renamed(e, "json_schema", "format");
    let named = e.envelope.field.as_deref().and_then(option_name);
    if let (Some(name), Some(field)) = (named, e.envelope.field.clone()) {
        e.envelope.message = e.envelope.message.replace(&field, name);
        e.envelope.field = Some(format!("options.{name}"));
    }
    e
}

/// `tools`: the answer is decoded under the request's tools (a chat with `tools`): its calls
/// come as `message.tool_calls` — streamed, in one line before the last, once complete — and a
/// text answer's content as text.
/// A request's `keep_alive`: how long its on-demand model stays loaded once idle (400 naming
/// the field when unreadable).
fn keep_alive_of(v: &Option<serde_json::Value>) -> Result<Option<KeepAlive>, ApiError> {
    v.as_ref()
        .map(keep_alive::parse)
        .transpose()
        .map_err(|why| ApiError::invalid("keep_alive", why))
}

#[allow(clippy::too_many_arguments)]
async fn answer(
    state: SharedState,
    caller: Caller,
    api: Api,
    model: String,
    task: Option<TaskRequest>,
    stream: bool,
    tools: bool,
    keep: Option<KeepAlive>,
) -> Result<Response<Body>, OllamaError> {
    let Some(task) = task else {
        // only a model loaded on demand follows keep_alive; a configured pool stays loaded
        let on_demand = keep.is_some_and(|k| state.models_folder.set_keep_alive(&model, k));
        let unload = keep == Some(KeepAlive::For(Duration::ZERO));
        let mut out = loaded(
            &state,
            api,
            &model,
            stream,
            if unload && on_demand {
                "unload"
            } else {
                "load"
            },
        )?;
        if unload && !on_demand {
            tracing::info!(model, "keep_alive 0 for a configured pool: it stays loaded");
            out.headers_mut().insert(
                "x-orchd-notice",
                HeaderValue::from_static(
                    "keep_alive 0: this model is a configured pool, which stays loaded",
                ),
            );
        }
        return Ok(out);
    };
    let named = move |e: ApiError| {
        if tools {
            follow::renamed(e, "json_schema", "tools")
        } else {
            in_options(e)
        }
    };
    let scored = task.logprobs == Some(true);
    let delivery = Delivery::of(stream);
    let task = follow::admit(&state, task, &caller, delivery)
        .await
        .map_err(named)?;
    // admitted: a model of the folder has its on-demand pool by now
    if let Some(k) = keep {
        state.models_folder.set_keep_alive(&model, k);
    }
    let mut sub = follow::subscribe(&state, &task);
    if !stream {
        let (text, scores, end) = match tools {
            true => follow::collect_tool_answer(&state, &task, sub).await,
            false => follow::collect_scored(sub).await,
        }
        .map_err(named)?;
        let (text, calls) = if tools {
            super::tools::answer(&text)
        } else {
            (text, None)
        };
        let body = line(
            api,
            &model,
            text,
            calls,
            scored.then(|| scores.iter().map(Logprob::from).collect()),
            Some(end.finish_reason),
            Some(stats(&task, end.tokens_out)),
        );
        return Ok(with_type(Body::from(body), "application/json"));
    }
    follow::until_answer_begins(std::slice::from_mut(&mut sub))
        .await
        .map_err(named)?;
    let task: Arc<Task> = task.clone();
    // under tools: the answer so far, and its text pieces as they complete
    let mut whole = String::new();
    let mut scan = AnswerStream::new();
    // NDJSON has no comment lines: no keep-alives
    let lines = sub.into_stream(None).filter_map(move |f| {
        let out = match f {
            Followed::Event(_, TaskEvent::Token(t)) if tools => {
                whole.push_str(&t.t);
                let pieces = scan.push(&t.t);
                if scan.repeated() {
                    follow::end_at_repeat(&state, &task);
                }
                let text: String = pieces
                    .into_iter()
                    .filter_map(|p| match p {
                        Piece::Content(s) => Some(s),
                        _ => None,
                    })
                    .collect();
                (!text.is_empty()).then(|| line(api, &model, text, None, None, None, None))
            }
            Followed::Event(_, TaskEvent::Token(t)) if !t.t.is_empty() || t.logprobs.is_some() => {
                let scores = t
                    .logprobs
                    .as_ref()
                    .filter(|_| scored)
                    .map(|l| vec![Logprob::from(l)]);
                Some(line(api, &model, t.t, None, scores, None, None))
            }
            Followed::Event(_, TaskEvent::End(end)) => {
                let mut out = Vec::new();
                if tools {
                    if let (_, Some(calls)) = super::tools::answer(&std::mem::take(&mut whole)) {
                        out = line(api, &model, String::new(), Some(calls), None, None, None);
                        out.push(b'\n');
                    }
                }
                out.extend(line(
                    api,
                    &model,
                    String::new(),
                    None,
                    None,
                    Some(end.finish_reason),
                    Some(stats(&task, end.tokens_out)),
                ));
                Some(out)
            }
            Followed::Event(_, TaskEvent::Error(e)) => {
                let env = contracts::ErrorEnvelope::new(e.code, e.message, e.retriable);
                serde_json::to_vec(&error_body(&env)).ok()
            }
            Followed::Event(..) | Followed::KeepAlive => None,
        };
        futures::future::ready(out.map(|mut l| {
            l.push(b'\n');
            Ok::<_, std::io::Error>(Bytes::from(l))
        }))
    });
    Ok(with_type(Body::from_stream(lines), NDJSON))
}

/// Ollama's chat: the model's chat template applied to `messages`.
#[utoipa::path(
    post, operation_id = "ollamaChat", path = "/api/chat", tag = "ollama",
    request_body = ChatRequest,
    responses(
        (status = 200, description = "NDJSON, one line per piece of text and a last line with `done: true`, `done_reason` and the counts and durations (nanoseconds); with `stream: false` one object. A failure after the first line is a `{\"error\": …}` line.", content(
            (ChatLine = "application/x-ndjson", example = json!("{\"model\":\"SmolLM2-135M-Instruct.Q4_1\",\"created_at\":\"2026-11-25T12:00:00.1Z\",\"message\":{\"role\":\"assistant\",\"content\":\"The\"},\"done\":false}\n{\"model\":\"SmolLM2-135M-Instruct.Q4_1\",\"created_at\":\"2026-11-25T12:00:00.6Z\",\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,\"done_reason\":\"stop\",\"total_duration\":612000000,\"load_duration\":1200000,\"prompt_eval_count\":14,\"prompt_eval_duration\":41000000,\"eval_count\":32,\"eval_duration\":569000000}\n")),
            (ChatLine = "application/json"),
        )),
        (status = 400, description = "Bad request: a field or option this server does not serve is named", body = crate::error::ollama::ErrorBody, example = json!({"error": "options.mirostat: mirostat = 2 is not supported: this server's sampler has no mirostat (leave it out or send 0)"})),
        (status = 404, description = "No pool serves the model", body = crate::error::ollama::ErrorBody, example = json!({"error": "model \"llama3\" not found"})),
        (status = 429, description = "Queue full or the predicted wait misses the client's stated timeout: retry after `Retry-After`", body = crate::error::ollama::ErrorBody, example = json!({"error": "queue full: 16 tasks waiting; retry after 1200 ms"})),
        (status = 503, description = "No pool for the model is ready", body = crate::error::ollama::ErrorBody, example = json!({"error": "no pool serving \"SmolLM2-135M-Instruct.Q4_1\" is ready"})),
    )
)]
pub async fn chat(
    State(state): State<SharedState>,
    caller: Caller,
    body: Result<JsonBody<ChatRequest>, ApiError>,
) -> Result<Response<Body>, OllamaError> {
    let JsonBody(req) = body?;
    let (task, tools) = chat_task(&state, &req)?;
    let keep = keep_alive_of(&req.keep_alive)?;
    answer(
        state,
        caller,
        Api::Chat,
        req.model,
        task,
        req.stream != Some(false),
        tools,
        keep,
    )
    .await
}

/// Ollama's generate: the prompt as one user turn of the chat template (with `system`), or
/// as is with `raw: true`.
#[utoipa::path(
    post, operation_id = "ollamaGenerate", path = "/api/generate", tag = "ollama",
    request_body = GenerateRequest,
    responses(
        (status = 200, description = "NDJSON lines of `response` text and a last line with `done: true`, `done_reason` and the counts and durations (nanoseconds); with `stream: false` one object.", content(
            (GenerateLine = "application/x-ndjson"),
            (GenerateLine = "application/json"),
        )),
        (status = 400, description = "Bad request: a field or option this server does not serve is named", body = crate::error::ollama::ErrorBody, example = json!({"error": "suffix: fill-in-the-middle (suffix) is not supported"})),
        (status = 404, description = "No pool serves the model", body = crate::error::ollama::ErrorBody, example = json!({"error": "model \"llama3\" not found"})),
        (status = 429, description = "Queue full or the predicted wait misses the client's stated timeout: retry after `Retry-After`", body = crate::error::ollama::ErrorBody, example = json!({"error": "queue full: 16 tasks waiting; retry after 1200 ms"})),
        (status = 503, description = "No pool for the model is ready", body = crate::error::ollama::ErrorBody, example = json!({"error": "no pool serving \"SmolLM2-135M-Instruct.Q4_1\" is ready"})),
    )
)]
pub async fn generate(
    State(state): State<SharedState>,
    caller: Caller,
    body: Result<JsonBody<GenerateRequest>, ApiError>,
) -> Result<Response<Body>, OllamaError> {
    let JsonBody(req) = body?;
    let task = generate_task(&state, &req)?;
    let keep = keep_alive_of(&req.keep_alive)?;
    answer(
        state,
        caller,
        Api::Generate,
        req.model,
        task,
        req.stream != Some(false),
        false,
        keep,
    )
    .await
}
