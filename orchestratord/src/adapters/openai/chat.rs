//! `POST /v1/chat/completions` and `GET /v1/models`.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::Response;
use axum::response::IntoResponse;
use axum::Json;
use contracts::TaskRequest;
use futures::StreamExt;

use super::response_format::schema_of;
use super::tools;
use super::types::*;
use super::{DONE, FINGERPRINT};
use crate::adapters::follow;
use crate::adapters::tool_calls::{AnswerStream, Toolbox};
use crate::app_state::SharedState;
use crate::auth::Caller;
use crate::error::openai::{body as error_body, OpenAiError};
use crate::error::ApiError;
use crate::json_body::JsonBody;
use crate::lifecycle::deadline::Delivery;
use crate::lifecycle::subscription::Followed;
use crate::lifecycle::task::TaskEvent;

/// The request's `n` choices as tasks: the same prompt (the engine shares its prefill), each
/// its own sample — with a `seed`, choice `i` draws with `seed + i`, so each is reproducible.
fn to_tasks(
    req: &ChatRequest,
    max_n: usize,
    tools: Option<&Toolbox>,
) -> Result<Vec<TaskRequest>, ApiError> {
    let n = req.n.unwrap_or(1);
    if n == 0 || n as usize > max_n {
        return Err(ApiError::invalid("n", format!("n must be 1-{max_n}")));
    }
    let task = to_task(req, tools)?;
    Ok((0..u64::from(n))
        .map(|i| TaskRequest {
            seed: task.seed.map(|s| s.wrapping_add(i)),
            ..task.clone()
        })
        .collect())
}

fn to_task(req: &ChatRequest, tools: Option<&Toolbox>) -> Result<TaskRequest, ApiError> {
    req.unimplemented.check()?;
    let continuing = req.continue_final_message == Some(true);
    let mut messages = chat_turns(&req.messages)?;
    let mut json_schema = schema_of(&req.response_format)?;
    if let Some(t) = tools {
        // the answer is decoded under the tools' schema: nothing else may shape it
        let clash = [
            ("response_format", json_schema.is_some()),
            ("continue_final_message", continuing),
            ("logprobs", req.logprobs == Some(true)),
        ];
        if let Some((field, _)) = clash.iter().find(|(_, set)| *set) {
            return Err(ApiError::invalid(
                *field,
                format!("{field} cannot be combined with tools"),
            ));
        }
        crate::adapters::tool_calls::instruct(&mut messages, t);
        json_schema = Some(t.schema());
    }
    if req
        .add_generation_prompt
        .is_some_and(|add| add == continuing)
    {
        return Err(ApiError::invalid(
            "add_generation_prompt",
            "add_generation_prompt must be the opposite of continue_final_message (the default)",
        ));
    }
    Ok(TaskRequest {
        messages: Some(messages),
        max_tokens: req.max_completion_tokens.or(req.max_tokens),
        model: req.model.clone(),
        seed: req.seed,
        temperature: req.temperature,
        top_p: req.top_p,
        stop: req.stop.clone(),
        presence_penalty: req.presence_penalty,
        frequency_penalty: req.frequency_penalty,
        session_id: super::session_of(req.user.as_deref()),
        prompt_cache_key: req.prompt_cache_key.clone(),
        top_k: req.top_k,
        min_p: req.min_p,
        repetition_penalty: req.repetition_penalty,
        draft_tokens: req.draft_tokens,
        continue_final_message: req.continue_final_message,
        json_schema,
        logprobs: req.logprobs,
        top_logprobs: req.top_logprobs,
        priority: req.priority,
        ..Default::default()
    })
}

/// OpenAI chat completions, streaming (`chat.completion.chunk` then `[DONE]`) or not.
#[utoipa::path(
    post, operation_id = "openaiChatCompletions", path = "/v1/chat/completions", tag = "openai",
    request_body = ChatRequest,
    responses(
        (status = 200, description = "The completion; with `stream: true` an SSE stream of `chat.completion.chunk` frames (each event's `data` a `Chunk`), an optional usage frame, then `data: [DONE]`. A failure after the stream began is an `{\"error\": …}` frame then `[DONE]`.", content(
            (ChatResponse = "application/json"),
            (contracts::SseEvent = "text/event-stream"),
        )),
        (status = 400, description = "Bad request", body = crate::error::openai::ErrorBody, example = crate::examples::openai_invalid),
        (status = 404, description = "Unknown model", body = crate::error::openai::ErrorBody, example = crate::examples::openai_not_found),
        (status = 422, description = "The client's stated timeout (`X-Request-Deadline-Ms`, `x-stainless-read-timeout`, `x-stainless-timeout`) cannot be met even by an idle pool", body = crate::error::openai::ErrorBody, example = crate::examples::openai_deadline_unmet),
        (status = 429, description = "Queue full, or the predicted wait misses the client's stated timeout: retry after `retry-after-ms` (also `Retry-After` seconds); a retry (`x-stainless-retry-count` ≥ 1) keeps its place in line", body = crate::error::openai::ErrorBody, example = crate::examples::openai_rate_limited),
        (status = 503, description = "No pool for the model is ready", body = crate::error::openai::ErrorBody, example = crate::examples::openai_unready),
        (status = 504, description = "Queued, it could no longer start in time for the client (`QUEUE_TIMEOUT`, retriable, with `retry-after-ms`); a stream begins only with its first token, so this is never a 200", body = crate::error::openai::ErrorBody, example = crate::examples::openai_queue_timeout),
    )
)]
pub async fn chat_completions(
    State(state): State<SharedState>,
    caller: Caller,
    body: Result<JsonBody<ChatRequest>, ApiError>,
) -> Result<Response<Body>, OpenAiError> {
    let JsonBody(req) = body?;
    let delivery = Delivery::of(req.stream);
    let toolbox = tools::toolbox(
        req.tools.as_deref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
    )?;
    // the constraint's errors name the field the client used for it
    let shaped_by = if toolbox.is_some() {
        "tools"
    } else {
        "response_format"
    };
    let reqs = to_tasks(
        &req,
        state.cfg.admission.max_prompts_per_request,
        toolbox.as_ref(),
    )?;
    let tasks = follow::admit_all(&state, reqs, &caller, delivery)
        .await
        .map_err(|e| follow::renamed(e, "json_schema", shaped_by))?;
    let model = follow::model_name(&state, req.model.as_deref(), &tasks[0]);
    let id = format!("chatcmpl-{}", tasks[0].id);
    let created = follow::unix_now();
    let scored = req.logprobs == Some(true);
    // the prompt is counted once (its count may come with the first choice's end, from an
    // engine that counts its own); each choice's tokens are counted
    let counted = tasks[0].clone();
    if !req.stream {
        // the first failure answers at once; dropping the other subscriptions cancels them
        let results = follow::collect_all(&state, &tasks, toolbox.is_some())
            .await
            .map_err(|e| follow::renamed(e, "json_schema", shaped_by))?;
        let mut completion_tokens = 0;
        let mut choices = Vec::with_capacity(results.len());
        for (i, (text, scores, end)) in results.into_iter().enumerate() {
            completion_tokens += end.tokens_out;
            let (content, tool_calls, finish_reason) = match &toolbox {
                // cut short too: its whole calls, or its text as far as it went
                Some(_) => tools::answer(&text, end.finish_reason, &tasks[i].id.to_string()),
                None => (Some(text), None, end.finish_reason),
            };
            choices.push(Choice {
                index: i as u32,
                message: AssistantMessage {
                    role: "assistant",
                    content,
                    tool_calls,
                },
                finish_reason,
                stop_reason: end.stop_sequence,
                logprobs: scored.then(|| super::logprobs::chat(&scores)),
            });
        }
        return Ok(Json(ChatResponse {
            id,
            object: "chat.completion",
            created,
            model,
            system_fingerprint: FINGERPRINT.into(),
            choices,
            usage: Usage::of(&tasks[0], completion_tokens),
        })
        .into_response());
    }
    let mut subs: Vec<_> = tasks.iter().map(|t| follow::subscribe(&state, t)).collect();
    // the response begins with the first choice that does; an error before is the answer
    follow::until_answer_begins(&mut subs)
        .await
        .map_err(|e| follow::renamed(e, "json_schema", shaped_by))?;
    // under tools: each choice's answer scanned as it streams, and whether it made a call
    let mut answers: Vec<Option<(AnswerStream, bool)>> = tasks
        .iter()
        .map(|_| toolbox.as_ref().map(|_| (AnswerStream::new(), false)))
        .collect();
    let task_ids: Vec<String> = tasks.iter().map(|t| t.id.to_string()).collect();
    let followed = tasks.clone();
    let include_usage = req.stream_options.as_ref().is_some_and(|o| o.include_usage);
    let chunk = move |index: usize,
                      delta: Delta,
                      finish: Option<String>,
                      stop: Option<String>,
                      logprobs: Option<super::logprobs::ChatLogprobs>,
                      usage: Option<Usage>| {
        follow::sse_data(&Chunk {
            id: id.clone(),
            object: "chat.completion.chunk",
            created,
            model: model.clone(),
            system_fingerprint: FINGERPRINT.into(),
            choices: if usage.is_some() {
                vec![]
            } else {
                vec![ChunkChoice {
                    index: index as u32,
                    delta,
                    finish_reason: finish,
                    stop_reason: stop,
                    logprobs,
                }]
            },
            usage,
        })
    };
    let keepalive = follow::keepalive(&state);
    let merged = futures::stream::select_all(subs.into_iter().enumerate().map(|(i, s)| {
        // one keep-alive ticker is enough
        s.into_stream(keepalive.filter(|_| i == 0))
            .map(move |f| (i, f))
            .boxed()
    }));
    // (choices still open, their completion tokens so far, the stream is over)
    let stream = merged
        .scan(
            (tasks.len(), 0u32, false),
            move |(open, out, over), (i, f)| {
                if *over {
                    return futures::future::ready(None);
                }
                let ev = match f {
                    Followed::Event(_, ev) => ev,
                    Followed::KeepAlive => {
                        return futures::future::ready(Some(vec![Bytes::from_static(
                            follow::SSE_KEEPALIVE,
                        )]))
                    }
                };
                let frames: Vec<Bytes> = match ev {
                    TaskEvent::Started(_) => {
                        let delta = Delta {
                            role: Some("assistant"),
                            content: Some(String::new()),
                            tool_calls: None,
                        };
                        vec![chunk(i, delta, None, None, None, None)]
                    }
                    TaskEvent::Token(t) => match answers[i].as_mut() {
                        // a tool answer: its pieces as they complete, to a repeated call
                        Some((scan, called)) => {
                            let frames = scan
                                .push(&t.t)
                                .into_iter()
                                .map(|piece| {
                                    let (content, call) = tools::delta_of(piece, &task_ids[i]);
                                    *called |= call.is_some();
                                    let delta = Delta {
                                        role: None,
                                        content,
                                        tool_calls: call.map(|c| vec![c]),
                                    };
                                    chunk(i, delta, None, None, None, None)
                                })
                                .collect();
                            if scan.repeated() {
                                follow::end_at_repeat(&state, &followed[i]);
                            }
                            frames
                        }
                        None => {
                            let logprobs = t
                                .logprobs
                                .filter(|_| scored)
                                .map(|l| super::logprobs::chat(std::slice::from_ref(&l)));
                            let delta = Delta {
                                role: None,
                                content: Some(t.t),
                                tool_calls: None,
                            };
                            vec![chunk(i, delta, None, None, logprobs, None)]
                        }
                    },
                    TaskEvent::Metrics(_) => vec![],
                    TaskEvent::End(end) => {
                        *open -= 1;
                        *out += end.tokens_out;
                        let called = answers[i].as_ref().is_some_and(|(_, c)| *c);
                        let finish = if called && end.finish_reason == "stop" {
                            "tool_calls".to_string()
                        } else {
                            end.finish_reason
                        };
                        let mut v = vec![chunk(
                            i,
                            Delta::default(),
                            Some(finish),
                            end.stop_sequence,
                            None,
                            None,
                        )];
                        if *open == 0 {
                            if include_usage {
                                let usage = Usage::of(&counted, *out);
                                v.push(chunk(0, Delta::default(), None, None, None, Some(usage)));
                            }
                            v.push(Bytes::from_static(DONE));
                            *over = true;
                        }
                        v
                    }
                    TaskEvent::Error(e) => {
                        // the other choices are cancelled when the stream ends
                        *over = true;
                        let env = contracts::ErrorEnvelope::new(e.code, e.message, e.retriable);
                        vec![
                            follow::sse_data(&error_body(&env)),
                            Bytes::from_static(DONE),
                        ]
                    }
                };
                futures::future::ready(Some(frames))
            },
        )
        .flat_map(|frames| futures::stream::iter(frames.into_iter().map(Ok::<_, std::io::Error>)));
    Ok(crate::lifecycle::sse::event_stream_response(
        Body::from_stream(stream),
    ))
}

/// Seconds since the Unix epoch of `t` (0 when unknown).
fn unix_secs(t: Option<std::time::SystemTime>) -> u64 {
    t.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs())
}

/// What `/v1/models` says of the model `pool` serves (blocking: before a load, its file's
/// header; `created` is when its file last changed, 0 for a remote worker's model).
fn model_of(pool: &pool_manager::Pool) -> Model {
    let spec = pool.spec();
    let file = spec
        .worker_id()
        .is_none()
        .then(|| std::fs::metadata(&spec.model_ref).ok()?.modified().ok())
        .flatten();
    Model {
        id: spec.model_alias.clone(),
        object: "model",
        created: unix_secs(file),
        owned_by: spec
            .worker_id()
            .map_or_else(|| "orchestratord".to_string(), |w| format!("worker:{w}")),
        max_model_len: pool.served_context(),
        loaded: pool.engine().is_some(),
        architecture: None,
        quantization: None,
        size_bytes: None,
    }
}

/// [`model_of`] each pool, off the async threads (file reads).
async fn models_of(pools: Vec<std::sync::Arc<pool_manager::Pool>>) -> Vec<Model> {
    tokio::task::spawn_blocking(move || pools.iter().map(|p| model_of(p)).collect())
        .await
        .unwrap_or_default()
}

/// A model of the folder (`models.dirs`), as its file's header describes it.
fn folder_model(e: &crate::models_folder::Entry) -> Option<Model> {
    let facts = e.facts.as_ref().ok()?;
    Some(Model {
        id: e.name.clone(),
        object: "model",
        created: unix_secs(e.modified),
        owned_by: "orchestratord".into(),
        // what a load serves (the KV cache budget may hold less than the trained context)
        max_model_len: e
            .served_ctx
            .unwrap_or(facts.context_length.unwrap_or(0) as usize),
        loaded: false,
        architecture: Some(facts.architecture.clone()),
        quantization: Some(facts.quantization.clone()),
        size_bytes: Some(e.bytes),
    })
}

/// Adds the folder's facts to a served model of the same name, or the folder model itself.
fn merge_folder(data: &mut Vec<Model>, m: Model) {
    match data.iter_mut().find(|d| d.id == m.id) {
        Some(d) => {
            d.architecture = m.architecture;
            d.quantization = m.quantization;
            d.size_bytes = m.size_bytes;
        }
        None => data.push(m),
    }
}

/// Adds `m` to `data`, or keeps the smaller context of the two pools serving it.
fn merge(data: &mut Vec<Model>, m: Model) {
    match data.iter_mut().find(|d| d.id == m.id) {
        Some(d) => d.max_model_len = d.max_model_len.min(m.max_model_len),
        None => data.push(m),
    }
}

/// The models the Ready pools serve, then every model of the model folder (`models.dirs`),
/// loaded or not (`loaded`), with its architecture, quantization and size.
#[utoipa::path(
    get, operation_id = "openaiListModels", path = "/v1/models", tag = "openai",
    responses((status = 200, description = "Models of the pools that take work, and of the model folder", body = ModelList))
)]
pub async fn models(State(state): State<SharedState>) -> Json<ModelList> {
    let mut data: Vec<Model> = Vec::new();
    let pools: Vec<_> = state
        .pools
        .all()
        .into_iter()
        .filter(|p| p.accepts_work())
        .collect();
    for m in models_of(pools).await {
        merge(&mut data, m);
    }
    for e in state.models_folder.entries(&state.lifecycle).await {
        if let Some(m) = folder_model(&e) {
            merge_folder(&mut data, m);
        }
    }
    Json(ModelList {
        object: "list",
        data,
    })
}

/// One model by the name clients use (its alias, the model's own name or a pool id), whatever
/// its pools' state; 404 `NOT_FOUND` in OpenAI's error shape when no pool serves it.
#[utoipa::path(
    get, operation_id = "openaiRetrieveModel", path = "/v1/models/{model}", tag = "openai",
    params(("model" = String, Path, description = "The model's name")),
    responses(
        (status = 200, description = "The model", body = Model),
        (status = 404, description = "No pool serves this model", body = crate::error::openai::ErrorBody, example = crate::examples::openai_not_found),
    )
)]
pub async fn model(
    State(state): State<SharedState>,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Result<Json<Model>, OpenAiError> {
    let mut found: Vec<Model> = Vec::new();
    let pools: Vec<_> = state
        .pools
        .all()
        .into_iter()
        .filter(|p| p.serves(&name))
        .collect();
    for m in models_of(pools).await {
        merge(&mut found, m);
    }
    for e in state.models_folder.entries(&state.lifecycle).await {
        if let Some(m) = folder_model(&e).filter(|m| m.id == name) {
            merge_folder(&mut found, m);
        }
    }
    let mut m = found
        .into_iter()
        .next()
        .ok_or_else(|| ApiError::not_found("model", &name).with_field("model"))?;
    // asked by its own name or a pool id: answered under the name asked
    m.id = name;
    Ok(Json(m))
}
