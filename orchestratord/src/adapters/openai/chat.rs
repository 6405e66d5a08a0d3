//! `/v1/chat/completions` and `/v1/models`.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::Response;
use axum::response::IntoResponse;
use axum::{Extension, Json};
use contracts::{ChatTurn, ErrorCode, TaskRequest};
use futures::StreamExt;

use super::error::{body as error_body, OpenAiError};
use super::types::*;
use crate::adapters::follow;
use crate::admission;
use crate::correlation::CorrelationId;
use crate::error::ApiError;
use crate::json_body::JsonBody;
use crate::metrics::CancelReason;
use crate::state::SharedState;
use crate::task::{Task, TaskEvent};

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

const FINGERPRINT: &str = concat!("orchestratord-", env!("CARGO_PKG_VERSION"));

fn to_task(req: &ChatRequest) -> Result<TaskRequest, ApiError> {
    if req.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid("n", "only n = 1 is supported"));
    }
    Ok(TaskRequest {
        messages: Some(
            req.messages
                .iter()
                .map(|m| ChatTurn {
                    role: m.role.clone(),
                    content: m.content.clone(),
                })
                .collect(),
        ),
        max_tokens: req.max_completion_tokens.or(req.max_tokens),
        model: req.model.clone(),
        seed: req.seed,
        temperature: req.temperature,
        top_p: req.top_p,
        stop: req.stop.clone(),
        presence_penalty: req.presence_penalty,
        frequency_penalty: req.frequency_penalty,
        session_id: req.user.clone().filter(|u| !u.is_empty() && u.len() <= 128),
        ..Default::default()
    })
}

fn model_name(state: &SharedState, req: &ChatRequest, task: &Task) -> String {
    req.model
        .clone()
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

/// Cancels the task when the client goes away before the end.
struct CancelOnDrop {
    state: SharedState,
    task: Arc<Task>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.task.is_terminal() {
            self.state.cancel_task(&self.task, CancelReason::Disconnect);
        }
    }
}

/// OpenAI chat completions, streaming (`chat.completion.chunk` then `[DONE]`) or not.
pub async fn chat_completions(
    State(state): State<SharedState>,
    Extension(cid): Extension<CorrelationId>,
    body: Result<JsonBody<ChatRequest>, ApiError>,
) -> Result<Response<Body>, OpenAiError> {
    let JsonBody(req) = body?;
    let task_req = to_task(&req)?;
    // unknown model: OpenAI answers 404 model_not_found
    let (_, task, _) = admission::admit(&state, task_req, &cid.0).map_err(|e| {
        if e.code() == ErrorCode::InvalidParams && e.envelope.field.as_deref() == Some("model") {
            ApiError::new(ErrorCode::NotFound, e.envelope.message.clone(), false)
        } else {
            e
        }
    })?;
    let model = model_name(&state, &req, &task);
    let id = format!("chatcmpl-{}", task.id);
    let created = now_secs();
    let guard = CancelOnDrop {
        state: state.clone(),
        task: task.clone(),
    };
    if !req.stream {
        let mut text = String::new();
        let mut events = Box::pin(follow::events(task.clone()));
        while let Some(ev) = events.next().await {
            match ev {
                TaskEvent::Token(t) => text.push_str(&t.t),
                TaskEvent::End(end) => {
                    drop(guard);
                    let prompt = task.prompt_tokens as u32;
                    return Ok(Json(ChatResponse {
                        id,
                        object: "chat.completion",
                        created,
                        model,
                        system_fingerprint: FINGERPRINT.into(),
                        choices: vec![Choice {
                            index: 0,
                            message: AssistantMessage {
                                role: "assistant",
                                content: text,
                            },
                            finish_reason: end.finish_reason,
                        }],
                        usage: Usage {
                            prompt_tokens: prompt,
                            completion_tokens: end.tokens_out,
                            total_tokens: prompt + end.tokens_out,
                        },
                    })
                    .into_response());
                }
                TaskEvent::Error(e) => {
                    let mut err = ApiError::new(e.code, e.message, e.retriable);
                    if let Some(ms) = e.retry_after_ms {
                        err = err.with_retry_after(ms);
                    }
                    return Err(err.into());
                }
                TaskEvent::Started(_) | TaskEvent::Metrics(_) => {}
            }
        }
        return Err(ApiError::internal("the task ended without a terminal event").into());
    }
    let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let prompt = task.prompt_tokens as u32;
    let chunk = move |delta: Delta, finish: Option<String>, usage: Option<Usage>| Chunk {
        id: id.clone(),
        object: "chat.completion.chunk",
        created,
        model: model.clone(),
        system_fingerprint: FINGERPRINT.into(),
        choices: if usage.is_some() {
            vec![]
        } else {
            vec![ChunkChoice {
                index: 0,
                delta,
                finish_reason: finish,
            }]
        },
        usage,
    };
    let frame = |v: &dyn erased::Ser| -> Bytes {
        let mut out = b"data: ".to_vec();
        v.write(&mut out);
        out.extend_from_slice(b"\n\n");
        Bytes::from(out)
    };
    let stream = follow::events(task.clone()).flat_map(move |ev| {
        let _keep = &guard;
        let frames: Vec<Bytes> = match ev {
            TaskEvent::Started(_) => vec![frame(&chunk(
                Delta {
                    role: Some("assistant"),
                    content: Some(String::new()),
                },
                None,
                None,
            ))],
            TaskEvent::Token(t) => vec![frame(&chunk(
                Delta {
                    role: None,
                    content: Some(t.t),
                },
                None,
                None,
            ))],
            TaskEvent::Metrics(_) => vec![],
            TaskEvent::End(end) => {
                let mut v = vec![frame(&chunk(
                    Delta::default(),
                    Some(end.finish_reason),
                    None,
                ))];
                if include_usage {
                    v.push(frame(&chunk(
                        Delta::default(),
                        None,
                        Some(Usage {
                            prompt_tokens: prompt,
                            completion_tokens: end.tokens_out,
                            total_tokens: prompt + end.tokens_out,
                        }),
                    )));
                }
                v.push(Bytes::from_static(b"data: [DONE]\n\n"));
                v
            }
            TaskEvent::Error(e) => {
                let env = contracts::ErrorEnvelope::new(e.code, e.message, e.retriable);
                vec![
                    frame(&error_body(&env)),
                    Bytes::from_static(b"data: [DONE]\n\n"),
                ]
            }
        };
        futures::stream::iter(frames.into_iter().map(Ok::<_, std::io::Error>))
    });
    Ok(crate::sse::event_stream_response(Body::from_stream(stream)))
}

/// Serializing either a chunk or an error body into a frame.
mod erased {
    pub trait Ser {
        fn write(&self, out: &mut Vec<u8>);
    }
    impl<T: serde::Serialize> Ser for T {
        fn write(&self, out: &mut Vec<u8>) {
            // serializing plain data into a Vec cannot fail
            let _ = serde_json::to_writer(out, self);
        }
    }
}

/// The models the Ready pools serve.
pub async fn models(State(state): State<SharedState>) -> Json<ModelList> {
    let mut data: Vec<Model> = Vec::new();
    for p in state.pools.all() {
        if !p.state().accepts_work() {
            continue;
        }
        let id = p.spec().model_alias.clone();
        if !data.iter().any(|m| m.id == id) {
            data.push(Model {
                id,
                object: "model",
                created: 0,
                owned_by: "orchestratord",
            });
        }
    }
    Json(ModelList {
        object: "list",
        data,
    })
}
