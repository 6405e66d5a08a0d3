//! `POST /v1/completions`: a string prompt or an array of them, each its own task, answered as
//! choices by index.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::Response;
use axum::response::IntoResponse;
use axum::Json;
use contracts::TaskRequest;
use futures::{Stream, StreamExt};

use super::response_format::schema_of;
use super::types::*;
use super::{DONE, FINGERPRINT};
use crate::adapters::follow;
use crate::adapters::raw_prompt::RawPrompt;
use crate::app_state::SharedState;
use crate::auth::Caller;
use crate::error::openai::{body as error_body, OpenAiError};
use crate::error::ApiError;
use crate::json_body::JsonBody;
use crate::lifecycle::deadline::Delivery;
use crate::lifecycle::subscription::{Followed, Subscription};
use crate::lifecycle::task::{Task, TaskEvent};

/// OpenAI's default `max_tokens` for completions.
const DEFAULT_MAX_TOKENS: u32 = 16;

/// The prompts of `req`, in choice order.
fn prompts_of(req: &CompletionRequest) -> Vec<RawPrompt> {
    match &req.prompt {
        PromptField::One(p) => vec![RawPrompt::Text(p.clone())],
        PromptField::Many(v) => v.iter().cloned().map(RawPrompt::Text).collect(),
        PromptField::Tokens(ids) if ids.is_empty() => vec![],
        PromptField::Tokens(ids) => vec![RawPrompt::ids(ids)],
        PromptField::ManyTokens(v) => v.iter().map(|ids| RawPrompt::ids(ids)).collect(),
    }
}

/// The texts `echo` puts before each choice's text: a prompt's own (echo is refused for
/// prompts of token ids, whose text is the model's to say).
fn echoed_texts(req: &CompletionRequest) -> Result<Option<Vec<String>>, ApiError> {
    if !req.echo {
        return Ok(None);
    }
    prompts_of(req)
        .into_iter()
        .map(|p| match p {
            RawPrompt::Text(t) => Ok(t),
            RawPrompt::Parts(_) => Err(ApiError::invalid(
                "echo",
                "echo is given for text prompts only: leave it out with token ids",
            )),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn to_tasks(req: &CompletionRequest, max_prompts: usize) -> Result<Vec<TaskRequest>, ApiError> {
    if req.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid("n", "only n = 1 is supported"));
    }
    if req.best_of.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid(
            "best_of",
            "only best_of = 1 is supported",
        ));
    }
    req.unimplemented.check()?;
    let json_schema = schema_of(&req.response_format)?;
    let prompts = prompts_of(req);
    if prompts.is_empty() {
        return Err(ApiError::invalid("prompt", "the prompt array is empty"));
    }
    if prompts.len() > max_prompts {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "{} prompts in one request; at most {max_prompts}",
                prompts.len()
            ),
        ));
    }
    Ok(prompts
        .into_iter()
        .map(|prompt| {
            prompt.into_task(TaskRequest {
                max_tokens: Some(req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
                model: req.model.clone(),
                seed: req.seed,
                temperature: req.temperature,
                top_p: req.top_p,
                stop: req.stop.clone(),
                presence_penalty: req.presence_penalty,
                frequency_penalty: req.frequency_penalty,
                session_id: super::session_of(req.user.as_deref()),
                prompt_cache_key: req.prompt_cache_key.clone(),
                priority: req.priority,
                top_k: req.top_k,
                min_p: req.min_p,
                repetition_penalty: req.repetition_penalty,
                draft_tokens: req.draft_tokens,
                json_schema: json_schema.clone(),
                logprobs: req.logprobs.map(|_| true),
                top_logprobs: req.logprobs,
                ..Default::default()
            })
        })
        .collect())
}

/// OpenAI text completions, streaming (`text_completion` frames then `[DONE]`) or not.
#[utoipa::path(
    post, operation_id = "openaiCompletions", path = "/v1/completions", tag = "openai",
    request_body = CompletionRequest,
    responses(
        (status = 200, description = "One choice per prompt, by index; with `stream: true` an SSE stream of `text_completion` frames (each event's `data` a `CompletionResponse` with one choice and its index; the last of a choice carries `finish_reason`), an optional usage frame, then `data: [DONE]`. All prompts are admitted or none.", content(
            (CompletionResponse = "application/json"),
            (contracts::SseEvent = "text/event-stream"),
        )),
        (status = 400, description = "Bad request (also: more prompts than allowed, n/best_of ≠ 1, logprobs)", body = crate::error::openai::ErrorBody, example = crate::examples::openai_invalid),
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
    body: Result<JsonBody<CompletionRequest>, ApiError>,
) -> Result<Response<Body>, OpenAiError> {
    let JsonBody(req) = body?;
    let reqs = to_tasks(&req, state.cfg.admission.max_prompts_per_request)?;
    // `echo`: each choice's text starts with its prompt
    let echoed = echoed_texts(&req)?;
    let delivery = Delivery::of(req.stream);
    let tasks = follow::admit_all(&state, reqs, &caller, delivery)
        .await
        .map_err(|e| follow::renamed(e, "json_schema", "response_format"))
        .map_err(|e| follow::renamed(e, "top_logprobs", "logprobs"))
        .map_err(|e| follow::renamed(e, "prompt_tokens", "prompt"))?;
    let model = follow::model_name(&state, req.model.as_deref(), &tasks[0]);
    let id = format!("cmpl-{}", tasks[0].id);
    let created = follow::unix_now();
    let frame = Framer { id, created, model };
    if !req.stream {
        // the first failure answers at once; dropping the other subscriptions cancels them
        let results = follow::collect_all(&state, &tasks, false)
            .await
            .map_err(|e| follow::renamed(e, "json_schema", "response_format"))?;
        let mut choices = Vec::with_capacity(results.len());
        let mut usage = Usage::new(0, 0);
        for ((i, (text, scores, end)), task) in results.into_iter().enumerate().zip(&tasks) {
            usage = usage + Usage::of(task, end.tokens_out);
            let prompt = echoed.as_ref().and_then(|p| p.get(i));
            // offsets count from the choice's text, the echoed prompt included
            let offset = prompt.map_or(0, String::len);
            let text = match prompt {
                Some(prompt) => format!("{prompt}{text}"),
                None => text,
            };
            choices.push(TextChoice {
                index: i as u32,
                text,
                finish_reason: Some(end.finish_reason),
                logprobs: req.logprobs.map(|_| super::logprobs::text(&scores, offset)),
            });
        }
        return Ok(Json(frame.response(choices, Some(usage))).into_response());
    }
    let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let mut subs: Vec<_> = tasks.iter().map(|t| follow::subscribe(&state, t)).collect();
    // the response begins with the first choice that does; an error before is the answer
    follow::until_answer_begins(&mut subs)
        .await
        .map_err(|e| follow::renamed(e, "json_schema", "response_format"))?;
    let n_tasks = tasks.len();
    let stream = stream_frames(
        tasks,
        subs,
        follow::keepalive(&state),
        Framing {
            frame,
            include_usage,
            offsets: req.logprobs.map(|_| {
                echoed
                    .as_ref()
                    .map_or_else(|| vec![0; n_tasks], |p| p.iter().map(String::len).collect())
            }),
            echoed,
        },
    );
    Ok(crate::lifecycle::sse::event_stream_response(
        Body::from_stream(stream.map(Ok::<_, std::io::Error>)),
    ))
}

struct Framer {
    id: String,
    created: u64,
    model: String,
}

impl Framer {
    fn response(&self, choices: Vec<TextChoice>, usage: Option<Usage>) -> CompletionResponse {
        CompletionResponse {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: FINGERPRINT.into(),
            choices,
            usage,
        }
    }

    fn choice(
        &self,
        index: usize,
        text: String,
        finish: Option<String>,
        logprobs: Option<super::logprobs::TextLogprobs>,
    ) -> Bytes {
        follow::sse_data(&self.response(
            vec![TextChoice {
                index: index as u32,
                text,
                finish_reason: finish,
                logprobs,
            }],
            None,
        ))
    }
}

/// Where the merged stream stands. Its subscriptions are dropped (cancelling what still runs)
/// when the stream ends or the client leaves.
struct Merge {
    events: futures::stream::SelectAll<futures::stream::BoxStream<'static, (usize, Followed)>>,
    tasks: Vec<Arc<Task>>,
    open: usize,
    usage: Usage,
    framing: Framing,
    done: bool,
}

/// How a stream's frames are written.
struct Framing {
    frame: Framer,
    include_usage: bool,
    /// With `echo`: the prompts, each sent as its choice's first text when its task starts.
    echoed: Option<Vec<String>>,
    /// With `logprobs`: each choice's text so far, in bytes (its tokens' `text_offset`).
    offsets: Option<Vec<usize>>,
}

/// Every task's frames as they come, interleaved; `[DONE]` after the last end, or an error
/// frame then `[DONE]` at the first failure (the other tasks are cancelled).
fn stream_frames(
    tasks: Vec<Arc<Task>>,
    subs: Vec<Subscription>,
    keepalive: Option<std::time::Duration>,
    framing: Framing,
) -> impl Stream<Item = Bytes> {
    let open = tasks.len();
    let events = futures::stream::select_all(
        subs.into_iter()
            .enumerate()
            .map(|(i, s)| s.into_stream(keepalive).map(move |f| (i, f)).boxed()),
    );
    let merge = Merge {
        events,
        tasks,
        open,
        usage: Usage::new(0, 0),
        framing,
        done: false,
    };
    futures::stream::unfold(merge, |mut m| async move {
        loop {
            if m.done {
                return None;
            }
            let Some((i, followed)) = m.events.next().await else {
                m.done = true;
                return Some((Bytes::from_static(DONE), m));
            };
            let ev = match followed {
                Followed::Event(_, ev) => ev,
                Followed::KeepAlive => return Some((Bytes::from_static(follow::SSE_KEEPALIVE), m)),
            };
            match ev {
                TaskEvent::Started(_) => {
                    let prompt = m.framing.echoed.as_mut().and_then(|p| p.get_mut(i));
                    if let Some(prompt) = prompt.map(std::mem::take) {
                        return Some((m.framing.frame.choice(i, prompt, None, None), m));
                    }
                }
                TaskEvent::Metrics(_) => {}
                TaskEvent::Token(t) => {
                    let scored = match (m.framing.offsets.as_mut(), t.logprobs) {
                        (Some(offsets), Some(l)) => {
                            let at = offsets.get(i).copied().unwrap_or(0);
                            if let Some(o) = offsets.get_mut(i) {
                                *o += l.bytes.len();
                            }
                            Some(super::logprobs::text(std::slice::from_ref(&l), at))
                        }
                        _ => None,
                    };
                    let b = m.framing.frame.choice(i, t.t, None, scored);
                    return Some((b, m));
                }
                TaskEvent::End(end) => {
                    m.open -= 1;
                    m.usage = m.usage + Usage::of(&m.tasks[i], end.tokens_out);
                    let mut b = m
                        .framing
                        .frame
                        .choice(i, String::new(), Some(end.finish_reason), None)
                        .to_vec();
                    if m.open == 0 {
                        if m.framing.include_usage {
                            b.extend_from_slice(&follow::sse_data(
                                &m.framing.frame.response(vec![], Some(m.usage)),
                            ));
                        }
                        b.extend_from_slice(DONE);
                        m.done = true;
                    }
                    return Some((b.into(), m));
                }
                TaskEvent::Error(e) => {
                    let env = contracts::ErrorEnvelope::new(e.code, e.message, e.retriable);
                    let mut b = follow::sse_data(&error_body(&env)).to_vec();
                    b.extend_from_slice(DONE);
                    m.done = true;
                    return Some((b.into(), m));
                }
            }
        }
    })
}
