//! `POST /completion`: llama-server's text completion, whole or streamed as its `data:` lines.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::Response;
use axum::response::IntoResponse;
use axum::Json;
use contracts::{PromptPart, SseLogprobs, StopField, TaskRequest};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::prompt::{self, Prompt};
use super::settings::{self, GenerationSettings};
use crate::adapters::follow;
use crate::app_state::SharedState;
use crate::auth::Caller;
use crate::error::openai::{body as error_body, OpenAiError};
use crate::error::ApiError;
use crate::json_body::JsonBody;
use crate::lifecycle::deadline::Delivery;
use crate::lifecycle::request_work::Turn;
use crate::lifecycle::subscription::Followed;
use crate::lifecycle::task::{Task, TaskEvent};
use pool_manager::Engine;

/// `POST /completion`: llama-server's fields. Fields llama-server knows and this server does
/// not apply are accepted at their neutral value and refused otherwise, naming the field;
/// fields neither knows are ignored, as llama-server does.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[schema(example = json!({"prompt": "1, 2, 3, 4,", "n_predict": 6, "temperature": 0}))]
pub struct CompletionRequest {
    /// The text to continue: a string, token ids (`[12, 34]`), ids and text mixed
    /// (`[12, " and", 34]`), or several prompts (`["a", [12, 34]]`: one answer each, by
    /// `index`; an array of answers when not streamed).
    #[schema(value_type = Object)]
    pub prompt: Option<serde_json::Value>,
    /// The most tokens to generate; -1 (default): as many as the context allows.
    pub n_predict: Option<i64>,
    #[serde(default)]
    pub stream: bool,
    /// Default 0.8 (llama-server's).
    pub temperature: Option<f32>,
    /// Default 40; 0 = off.
    pub top_k: Option<i64>,
    /// Default 0.95.
    pub top_p: Option<f32>,
    /// Default 0.05.
    pub min_p: Option<f32>,
    pub stop: Option<StopField>,
    /// -1 or 4294967295: a random one.
    pub seed: Option<i64>,
    pub repeat_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// The most tokens guessed ahead per pass (llama-server's speculative decoding; here by
    /// prompt lookup, no draft model): 0 = off; absent = the pool's setting.
    #[serde(rename = "speculative.n_max")]
    #[schema(minimum = 0, maximum = 16)]
    pub speculative_n_max: Option<u32>,
    /// A grammar in llguidance's Lark syntax (`start: "yes" | "no"`); GBNF is refused.
    pub grammar: Option<String>,
    /// The answer follows this JSON schema.
    #[schema(value_type = Option<Object>)]
    pub json_schema: Option<serde_json::Value>,
    /// Each token's probability and the `n_probs` likeliest (`completion_probabilities`).
    pub n_probs: Option<u32>,
    /// Accepted: a prompt's cached prefix is always reused here.
    pub cache_prompt: Option<bool>,
    /// Which model (alias, name or pool id); the first pool's when absent.
    pub model: Option<String>,
    // llama-server's samplers this engine does not have: only their neutral values
    pub typical_p: Option<f32>,
    pub mirostat: Option<i64>,
    pub dry_multiplier: Option<f32>,
    pub xtc_probability: Option<f32>,
    pub dynatemp_range: Option<f32>,
    pub top_n_sigma: Option<f32>,
    pub ignore_eos: Option<bool>,
    pub return_tokens: Option<bool>,
    #[schema(value_type = Option<Object>)]
    pub logit_bias: Option<serde_json::Value>,
}

/// A finished completion, llama-server's fields.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CompletionResponse {
    pub index: u32,
    pub content: String,
    pub stop: bool,
    pub model: String,
    pub tokens_predicted: u32,
    pub tokens_evaluated: u32,
    pub generation_settings: GenerationSettings,
    pub prompt: String,
    pub has_new_line: bool,
    pub truncated: bool,
    /// `eos` (the model ended it), `word` (a stop string), `limit` (`n_predict`), `none`
    /// (cancelled).
    pub stop_type: &'static str,
    pub stopping_word: String,
    pub timings: Timings,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_probabilities: Option<Vec<TokenProbability>>,
}

/// A streamed piece of a completion (the last one is a [`CompletionResponse`]).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CompletionChunk {
    pub index: u32,
    pub content: String,
    pub stop: bool,
    pub tokens_predicted: u32,
    pub tokens_evaluated: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_probabilities: Option<Vec<TokenProbability>>,
}

/// Where the time went: the prompt (its tokens and their pass) and the tokens generated.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Timings {
    /// Prompt tokens read from the cache (a prefix an earlier request left).
    pub cache_n: u32,
    /// Prompt tokens computed (after the cached ones).
    pub prompt_n: u32,
    pub prompt_ms: f64,
    pub prompt_per_token_ms: f64,
    pub prompt_per_second: f64,
    pub predicted_n: u32,
    pub predicted_ms: f64,
    pub predicted_per_token_ms: f64,
    pub predicted_per_second: f64,
}

/// A generated token's log-probability and the likeliest at its step.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TokenProbability {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
    pub top_logprobs: Vec<TopProbability>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TopProbability {
    pub token: String,
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

fn probabilities(scores: &[SseLogprobs]) -> Vec<TokenProbability> {
    scores
        .iter()
        .map(|s| TokenProbability {
            token: s.token.clone(),
            bytes: s.bytes.clone(),
            logprob: s.logprob,
            top_logprobs: s
                .top
                .iter()
                .map(|t| TopProbability {
                    token: t.token.clone(),
                    bytes: t.bytes.clone(),
                    logprob: t.logprob,
                })
                .collect(),
        })
        .collect()
}

/// A field of llama-server's this server does not apply: only its neutral value.
fn neutral<T: PartialEq + std::fmt::Debug>(
    v: Option<T>,
    off: T,
    field: &str,
) -> Result<(), ApiError> {
    match v {
        Some(v) if v != off => Err(ApiError::invalid(
            field,
            format!("{field} is not applied by this server: leave it out or at {off:?}"),
        )),
        _ => Ok(()),
    }
}

/// The task of one of the request's prompts: llama-server's defaults where the request names
/// none, its samplers this engine lacks only at their neutral values.
fn to_task(req: &CompletionRequest, prompt: &Prompt) -> Result<TaskRequest, ApiError> {
    neutral(req.typical_p, 1.0, "typical_p")?;
    neutral(req.mirostat, 0, "mirostat")?;
    neutral(req.dry_multiplier, 0.0, "dry_multiplier")?;
    neutral(req.xtc_probability, 0.0, "xtc_probability")?;
    neutral(req.dynatemp_range, 0.0, "dynatemp_range")?;
    neutral(req.ignore_eos, false, "ignore_eos")?;
    neutral(req.return_tokens, false, "return_tokens")?;
    if req.top_n_sigma.is_some_and(|s| s > 0.0) {
        return Err(ApiError::invalid(
            "top_n_sigma",
            "top_n_sigma is not applied by this server: leave it out or at -1",
        ));
    }
    let empty_bias = match &req.logit_bias {
        None | Some(serde_json::Value::Null) => true,
        Some(serde_json::Value::Array(a)) => a.is_empty(),
        Some(serde_json::Value::Object(o)) => o.is_empty(),
        Some(_) => false,
    };
    if !empty_bias {
        return Err(ApiError::invalid(
            "logit_bias",
            "logit_bias is not applied by this server: leave it out",
        ));
    }
    if req.grammar.as_deref().is_some_and(|g| g.contains("::=")) {
        return Err(ApiError::invalid(
            "grammar",
            "GBNF grammars are not read here: write the grammar in llguidance's Lark syntax (`start: \"yes\" | \"no\"`), or give json_schema",
        ));
    }
    let max_tokens = match req.n_predict {
        None | Some(-1) | Some(-2) => None,
        Some(n) if n >= 1 => Some(u32::try_from(n).unwrap_or(u32::MAX)),
        Some(_) => {
            return Err(ApiError::invalid(
                "n_predict",
                "n_predict must be at least 1, or -1 for as many as the context allows",
            ))
        }
    };
    let top_k = match req.top_k {
        None => Some(settings::TOP_K),
        Some(k) if k <= 0 => None,
        Some(k) => Some(u32::try_from(k).unwrap_or(u32::MAX)),
    };
    Ok(prompt.clone().into_task(TaskRequest {
        max_tokens,
        model: req.model.clone(),
        // llama-server's random seeds: -1 and 2^32-1
        seed: req
            .seed
            .filter(|&s| s >= 0 && s != u32::MAX as i64)
            .map(|s| s as u64),
        temperature: Some(req.temperature.unwrap_or(settings::TEMPERATURE)),
        top_k,
        top_p: Some(req.top_p.unwrap_or(settings::TOP_P)),
        min_p: Some(req.min_p.unwrap_or(settings::MIN_P)),
        stop: req.stop.clone(),
        repetition_penalty: req.repeat_penalty,
        presence_penalty: req.presence_penalty,
        frequency_penalty: req.frequency_penalty,
        draft_tokens: req.speculative_n_max,
        grammar: req.grammar.clone(),
        json_schema: req.json_schema.clone(),
        logprobs: req.n_probs.filter(|&n| n > 0).map(|_| true),
        top_logprobs: req.n_probs.filter(|&n| n > 0),
        ..Default::default()
    }))
}

/// A refusal in llama-server's names (`max_tokens` is `n_predict`, …).
fn renamed(e: ApiError) -> ApiError {
    [
        ("max_tokens", "n_predict"),
        ("repetition_penalty", "repeat_penalty"),
        ("top_logprobs", "n_probs"),
        ("prompt_tokens", "prompt"),
    ]
    .into_iter()
    .fold(e, |e, (task, api)| follow::renamed(e, task, api))
}

fn stop_type(end: &contracts::SseEnd) -> &'static str {
    match (end.finish_reason.as_str(), &end.stop_sequence) {
        ("length", _) => "limit",
        ("stop", Some(_)) => "word",
        ("stop", None) => "eos",
        _ => "none",
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Per-token time and tokens per second of `n` tokens in `ms` (0 when nothing was timed).
fn rates(n: u32, ms: f64) -> (f64, f64) {
    if n == 0 || ms <= 0.0 {
        return (0.0, 0.0);
    }
    (ms / n as f64, n as f64 * 1000.0 / ms)
}

/// The final answer of `task`, the request's `index`th (its whole text, or empty after a
/// stream).
#[allow(clippy::too_many_arguments)]
fn final_response(
    index: u32,
    task: &Task,
    model: String,
    prompt: String,
    content: String,
    scores: Option<Vec<TokenProbability>>,
    end: &contracts::SseEnd,
    stream: bool,
) -> CompletionResponse {
    let spans = task.spans();
    let prompt_all = task.prompt_tokens_used();
    let cache_n = task.prompt_tokens_cached().min(prompt_all);
    let prompt_n = prompt_all - cache_n;
    let (prompt_ms, predicted_ms) = (ms(spans.prefill), ms(spans.decode));
    let (p_tok, p_sec) = rates(prompt_n, prompt_ms);
    let (d_tok, d_sec) = rates(end.tokens_out, predicted_ms);
    CompletionResponse {
        index,
        has_new_line: content.contains('\n'),
        content,
        stop: true,
        model,
        tokens_predicted: end.tokens_out,
        tokens_evaluated: prompt_all,
        generation_settings: GenerationSettings::of(&task.spec, Some(stream)),
        prompt,
        truncated: false,
        stop_type: stop_type(end),
        stopping_word: end.stop_sequence.clone().unwrap_or_default(),
        timings: Timings {
            cache_n,
            prompt_n,
            prompt_ms,
            prompt_per_token_ms: p_tok,
            prompt_per_second: p_sec,
            predicted_n: end.tokens_out,
            predicted_ms,
            predicted_per_token_ms: d_tok,
            predicted_per_second: d_sec,
        },
        completion_probabilities: scores,
    }
}

/// llama-server's text completion.
#[utoipa::path(
    post, operation_id = "llamaServerCompletion", path = "/completion", tag = "llama-server",
    request_body = CompletionRequest,
    responses(
        (status = 200, description = "The completion; with `stream: true` an SSE stream of `data:` lines, one `CompletionChunk` per token and a last `CompletionResponse` (`stop: true`).", content(
            (CompletionResponse = "application/json"),
            (CompletionChunk = "text/event-stream"),
        )),
        (status = 400, description = "Bad request (a field llama-server has and this server does not apply, at a value other than its neutral one, is named)", body = crate::error::openai::ErrorBody, example = crate::examples::openai_invalid),
        (status = 404, description = "Unknown model", body = crate::error::openai::ErrorBody, example = crate::examples::openai_not_found),
        (status = 429, description = "Queue full: retry after `retry-after-ms` (also `Retry-After` seconds)", body = crate::error::openai::ErrorBody, example = crate::examples::openai_rate_limited),
        (status = 503, description = "No pool for the model is ready", body = crate::error::openai::ErrorBody, example = crate::examples::openai_unready),
    )
)]
pub async fn completion(
    State(state): State<SharedState>,
    caller: Caller,
    body: Result<JsonBody<CompletionRequest>, ApiError>,
) -> Result<Response<Body>, OpenAiError> {
    let JsonBody(req) = body?;
    let prompts = prompt::prompts_of(
        req.prompt.as_ref(),
        state.cfg.admission.max_prompts_per_request,
    )?;
    let task_reqs = prompts
        .iter()
        .map(|p| to_task(&req, p))
        .collect::<Result<Vec<_>, _>>()?;
    let tasks = follow::admit_all(&state, task_reqs, &caller, Delivery::of(req.stream))
        .await
        .map_err(renamed)?;
    let model = follow::model_name(&state, req.model.as_deref(), &tasks[0]);
    let shown = shown_prompts(&state, &caller, req.model.as_deref(), &prompts).await;
    let with_probs = req.n_probs.is_some_and(|n| n > 0);
    if !req.stream {
        // the first failure answers at once; dropping the other subscriptions cancels them
        let results = follow::collect_all(&state, &tasks, false)
            .await
            .map_err(renamed)?;
        let mut answers: Vec<CompletionResponse> = results
            .into_iter()
            .zip(tasks.iter().zip(shown))
            .enumerate()
            .map(|(i, ((text, scores, end), (task, prompt)))| {
                let scores = with_probs.then(|| probabilities(&scores));
                let m = model.clone();
                final_response(i as u32, task, m, prompt, text, scores, &end, false)
            })
            .collect();
        // one prompt, one object; several, an array by index (llama-server's shapes)
        return Ok(match answers.len() {
            1 => Json(answers.remove(0)).into_response(),
            _ => Json(answers).into_response(),
        });
    }
    let mut subs: Vec<_> = tasks.iter().map(|t| follow::subscribe(&state, t)).collect();
    follow::until_answer_begins(&mut subs)
        .await
        .map_err(renamed)?;
    let keepalive = follow::keepalive(&state);
    let open = tasks.len();
    let events = futures::stream::select_all(
        subs.into_iter()
            .enumerate()
            .map(|(i, s)| s.into_stream(keepalive).map(move |f| (i, f)).boxed()),
    );
    let framing = Framing {
        tasks,
        model,
        prompts: shown,
        with_probs,
        predicted: vec![0; open],
        open,
    };
    let stream = futures::stream::unfold((events, framing), |(mut events, mut f)| async move {
        loop {
            if f.open == 0 {
                return None;
            }
            let (i, ev) = match events.next().await? {
                (i, Followed::Event(_, ev)) => (i, ev),
                (_, Followed::KeepAlive) => {
                    return Some((Bytes::from_static(follow::SSE_KEEPALIVE), (events, f)))
                }
            };
            if let Some(b) = f.frame(i, ev) {
                return Some((b, (events, f)));
            }
        }
    });
    Ok(crate::lifecycle::sse::event_stream_response(
        Body::from_stream(stream.map(Ok::<_, std::io::Error>)),
    ))
}

/// Each prompt as the answers show it (llama-server's `prompt`): its text, or the text of its
/// ids (control tokens' text left out) with its text pieces, detokenized on a request-work
/// thread by an engine of the model; the pieces alone when no loaded engine gives text.
async fn shown_prompts(
    state: &SharedState,
    caller: &Caller,
    model: Option<&str>,
    prompts: &[Prompt],
) -> Vec<String> {
    let engine = crate::adapters::tokenize::engine_for(state, model).ok();
    let mut shown = Vec::with_capacity(prompts.len());
    for p in prompts {
        let parts = match p {
            Prompt::Text(t) => {
                shown.push(t.clone());
                continue;
            }
            Prompt::Parts(parts) => parts.clone(),
        };
        let engine = engine.clone();
        let text = state
            .request_work
            .run(Turn::Admitted(caller.tenant()), move || {
                text_of_parts(engine.as_deref(), &parts)
            })
            .await
            .unwrap_or_default();
        shown.push(text);
    }
    shown
}

/// The text of a prompt of parts: each run of ids detokenized, each text piece as it is.
fn text_of_parts(engine: Option<&dyn Engine>, parts: &[PromptPart]) -> String {
    let mut out = String::new();
    let mut ids = Vec::new();
    let flush = |ids: &mut Vec<u32>, out: &mut String| {
        if let Some(e) = engine {
            out.push_str(&e.detokenize(ids).ok().flatten().unwrap_or_default());
        }
        ids.clear();
    };
    for part in parts {
        match part {
            PromptPart::Token(id) => ids.push(*id),
            PromptPart::Text(t) => {
                flush(&mut ids, &mut out);
                out.push_str(t);
            }
        }
    }
    flush(&mut ids, &mut out);
    out
}

/// How a stream's lines are written: each prompt's tokens as its `index`'s lines, its last
/// line when it ends; the stream closes after the last prompt's end, or at the first error.
struct Framing {
    tasks: Vec<Arc<Task>>,
    model: String,
    /// Each prompt as its last line shows it (taken then).
    prompts: Vec<String>,
    with_probs: bool,
    /// Tokens streamed so far, by prompt.
    predicted: Vec<u32>,
    /// Prompts still running.
    open: usize,
}

impl Framing {
    fn frame(&mut self, i: usize, ev: TaskEvent) -> Option<Bytes> {
        let task = self.tasks.get(i)?.clone();
        match ev {
            TaskEvent::Started(_) | TaskEvent::Metrics(_) => None,
            TaskEvent::Token(t) => {
                let n = self.predicted.get_mut(i)?;
                *n += 1;
                let probs = match (self.with_probs, t.logprobs) {
                    (true, Some(l)) => Some(probabilities(std::slice::from_ref(&l))),
                    _ => None,
                };
                Some(follow::sse_data(&CompletionChunk {
                    index: i as u32,
                    content: t.t,
                    stop: false,
                    tokens_predicted: *n,
                    tokens_evaluated: task.prompt_tokens_used(),
                    completion_probabilities: probs,
                }))
            }
            TaskEvent::End(end) => {
                self.open = self.open.saturating_sub(1);
                let prompt = self.prompts.get_mut(i).map(std::mem::take);
                Some(follow::sse_data(&final_response(
                    i as u32,
                    &task,
                    self.model.clone(),
                    prompt.unwrap_or_default(),
                    String::new(),
                    None,
                    &end,
                    true,
                )))
            }
            TaskEvent::Error(e) => {
                // the other prompts' subscriptions go with the stream: they are cancelled
                self.open = 0;
                let env = contracts::ErrorEnvelope::new(e.code, e.message, e.retriable);
                Some(follow::sse_data(&error_body(&env)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(v: serde_json::Value) -> CompletionRequest {
        serde_json::from_value(v).unwrap()
    }

    fn task_of(v: serde_json::Value) -> Result<TaskRequest, ApiError> {
        let r = req(v);
        let prompts = prompt::prompts_of(r.prompt.as_ref(), 16)?;
        to_task(&r, &prompts[0])
    }

    /// LLS-API-1: llama-server's sampler defaults where the request names none; its random
    /// seeds; its samplers this engine lacks only at their neutral values; GBNF refused
    /// naming the field; a prompt of ids becomes the task's `prompt_tokens`.
    #[test]
    fn a_completion_request_becomes_a_task_with_llama_servers_defaults() {
        let t = task_of(serde_json::json!({"prompt": "Hi", "seed": -1})).unwrap();
        assert_eq!(t.prompt.as_deref(), Some("Hi"));
        assert_eq!(
            (
                t.temperature,
                t.top_k,
                t.top_p,
                t.min_p,
                t.seed,
                t.max_tokens
            ),
            (Some(0.8), Some(40), Some(0.95), Some(0.05), None, None)
        );
        let t = task_of(serde_json::json!({"prompt": "Hi", "top_k": 0,
            "n_predict": 5, "seed": 7, "typical_p": 1.0, "mirostat": 0, "cache_prompt": true,
            "some_field_of_a_newer_llama_server": 1}))
        .unwrap();
        assert_eq!((t.top_k, t.max_tokens, t.seed), (None, Some(5), Some(7)));
        let t = task_of(serde_json::json!({"prompt": [1, " a", 2]})).unwrap();
        assert_eq!(t.prompt, None);
        assert_eq!(
            t.prompt_tokens,
            Some(vec![
                PromptPart::Token(1),
                PromptPart::Text(" a".into()),
                PromptPart::Token(2)
            ])
        );
        for (body, field) in [
            (
                serde_json::json!({"prompt": "Hi", "mirostat": 2}),
                "mirostat",
            ),
            (
                serde_json::json!({"prompt": "Hi", "logit_bias": [[15, -1]]}),
                "logit_bias",
            ),
            (
                serde_json::json!({"prompt": "Hi", "grammar": "root ::= \"a\""}),
                "grammar",
            ),
            (serde_json::json!({"n_predict": 3}), "prompt"),
            (
                serde_json::json!({"prompt": "Hi", "n_predict": 0}),
                "n_predict",
            ),
        ] {
            let e = task_of(body.clone()).unwrap_err();
            assert_eq!(e.envelope.field.as_deref(), Some(field), "{body}");
        }
    }
}
