//! Admission: validate, resolve the pools, count prompt tokens, check context, budgets and
//! deadline, then reserve the queue place in the same step. Every adapter admits through here.

use std::sync::Arc;
use std::time::Duration;

use contracts::{AdmissionResponse, ErrorCode, Priority, StreamLinks, TaskRequest};
use pool_manager::{ChatTurn, OutputConstraint, Pool, PortError, PromptInput, SamplingParams};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::lifecycle::cluster_port::ClusterRefusal;
use crate::lifecycle::deadline::{self, Delivery, Limits};
use crate::lifecycle::eta;
use crate::lifecycle::handoff::{unix_ms, Handoff};
use crate::lifecycle::queue::{Enqueued, Eviction};
use crate::lifecycle::quota::{InFlight, OverQuota};
use crate::lifecycle::state::SharedState;
use crate::lifecycle::task::Claimant;
use crate::lifecycle::task::{NewTask, RunSpec, Task};
use crate::lifecycle::task_store::Inserted;
use crate::lifecycle::tokenize::PromptIds;
use crate::metrics;

const MAX_ID_LEN: usize = 128;

/// A client-chosen task or session id: 1-128 characters of `A-Z a-z 0-9 - _ . :`.
pub(crate) fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_ID_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
}

/// Lowest `top_p` and `repetition_penalty`: the API takes JSON numbers, the sampler `f32`, and
/// a tinier positive one would round to 0 (or overflow a logit it divides).
pub const SMALLEST_FACTOR: f32 = 1e-6;

fn check_range(
    field: &str,
    v: Option<f32>,
    lo: f32,
    hi: f32,
    lo_open: bool,
) -> Result<(), ApiError> {
    if let Some(x) = v {
        let ok = x.is_finite() && x <= hi && if lo_open { x > lo } else { x >= lo };
        if !ok {
            let lo_br = if lo_open { "(" } else { "[" };
            return Err(ApiError::invalid(
                field,
                format!("{field} must be within {lo_br}{lo}, {hi}]"),
            ));
        }
    }
    Ok(())
}

/// The prompt of a request, checked, and the text to continue (a final assistant turn under
/// `continue_final_message`).
pub fn prompt_of(req: &TaskRequest) -> Result<(PromptInput, String), ApiError> {
    let prompt = prompt_input(req)?;
    if req.continue_final_message != Some(true) {
        return Ok((prompt, String::new()));
    }
    // a final assistant turn is continued; without one, the assistant turn to continue is
    // empty, which is starting a new one; a lone assistant turn has no chat to template and is
    // continued as raw text (as a raw prompt always is)
    match prompt {
        PromptInput::Chat(mut turns) if turns.last().is_some_and(|t| t.role == "assistant") => {
            let last = turns.pop().map(|t| t.content).unwrap_or_default();
            if turns.is_empty() {
                if last.is_empty() {
                    return Err(ApiError::invalid("messages", "nothing to continue"));
                }
                return Ok((PromptInput::Text(last), String::new()));
            }
            Ok((PromptInput::Chat(turns), last))
        }
        other => Ok((other, String::new())),
    }
}

fn prompt_input(req: &TaskRequest) -> Result<PromptInput, ApiError> {
    match (&req.prompt, &req.messages) {
        (Some(_), Some(_)) => Err(ApiError::invalid(
            "messages",
            "give either prompt or messages, not both",
        )),
        (None, None) => Err(ApiError::invalid(
            "prompt",
            "prompt or messages is required",
        )),
        (Some(p), None) => {
            if p.is_empty() {
                return Err(ApiError::invalid("prompt", "prompt is empty"));
            }
            Ok(PromptInput::Text(p.clone()))
        }
        (None, Some(m)) => {
            if m.is_empty() {
                return Err(ApiError::invalid("messages", "messages is empty"));
            }
            for (i, t) in m.iter().enumerate() {
                if !matches!(t.role.as_str(), "system" | "user" | "assistant") {
                    return Err(ApiError::invalid(
                        format!("messages[{i}].role"),
                        format!("role {:?} is not system, user or assistant", t.role),
                    ));
                }
            }
            Ok(PromptInput::Chat(
                m.iter()
                    .map(|t| ChatTurn {
                        role: t.role.clone(),
                        content: t.content.clone(),
                    })
                    .collect(),
            ))
        }
    }
}

/// The request as recorded: prompt text and message contents replaced by their length.
pub fn redact(req: &TaskRequest) -> serde_json::Value {
    let mut r = req.clone();
    if let Some(p) = &r.prompt {
        r.prompt = Some(format!("[redacted {} chars]", p.chars().count()));
    }
    if let Some(m) = &mut r.messages {
        for t in m.iter_mut() {
            t.content = format!("[redacted {} chars]", t.content.chars().count());
        }
    }
    serde_json::to_value(r).unwrap_or(serde_json::Value::Null)
}

/// The pools a task may run on.
struct Resolved {
    pools: Vec<Arc<Pool>>,
    /// The predicted wait for their load when every one of them is still loading (`pools` is
    /// empty then: the task waits in the queue for them).
    load_wait_ms: u64,
    /// The model asked for, or the default pool's (unpinned tasks).
    model: Option<String>,
}

/// Picks the pools a task may run on: the pinned one, or those serving the model.
fn resolve_pools(state: &SharedState, req: &TaskRequest) -> Result<Resolved, ApiError> {
    let all = state.pools.all();
    if let Some(pin) = &req.pool_id {
        if !state.cfg.admission.pinning_enabled {
            return Err(ApiError::invalid(
                "pool_id",
                "pinning to a pool is disabled by policy",
            ));
        }
        // seed 003 OC-CTRL-2014: a deterministic INVALID_PARAMS for an unknown pool
        let Some(pool) = all.into_iter().find(|p| p.id() == pin) else {
            if elsewhere(state, Some(pin), "") {
                // another replica's pool: the task waits in its queue for it
                return Ok(Resolved {
                    pools: Vec::new(),
                    load_wait_ms: 0,
                    model: req.model.clone(),
                });
            }
            return Err(ApiError::invalid(
                "pool_id",
                format!("pool_id {pin:?} names no pool of this server"),
            ));
        };
        if let Some(m) = &req.model {
            if !pool.serves(m) {
                return Err(ApiError::invalid(
                    "model",
                    format!("pool {pin:?} does not serve model {m:?}"),
                )
                .with_pool(pin));
            }
        }
        if !pool.accepts_work() {
            // a pool still loading says when it is predicted to serve
            let retry = state
                .models_folder
                .load_progress(&pool, state.started_at)
                .map_or(1000, |(_, left)| left.max(1000));
            return Err(ApiError::new(
                ErrorCode::PoolUnready,
                format!("pool {pin:?} is {}", pool.state().as_str()),
                true,
            )
            .with_pool(pin)
            .with_retry_after(retry));
        }
        return Ok(Resolved {
            pools: vec![pool],
            load_wait_ms: 0,
            model: req.model.clone(),
        });
    }
    let model = match &req.model {
        Some(m) => m.clone(),
        None => state
            .cfg
            .pools
            .first()
            .and_then(|p| state.pools.get(&p.id))
            .or_else(|| all.first().cloned())
            .map(|p| p.spec().model_alias.clone())
            .ok_or_else(|| ApiError::new(ErrorCode::PoolUnavailable, "no pools", true))?,
    };
    let serving: Vec<Arc<Pool>> = all.into_iter().filter(|p| p.serves(&model)).collect();
    // remote workers here, or any pool of another replica, serve it: the task waits for one
    let from_workers = state.workers.knows_model(&model) || elsewhere(state, None, &model);
    if serving.is_empty() {
        if from_workers {
            // a model remote workers serve: the task waits for one (queue timeout)
            return Ok(Resolved {
                pools: Vec::new(),
                load_wait_ms: 0,
                model: Some(model),
            });
        }
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("no pool serves model {model:?}"),
            false,
        )
        .with_field("model"));
    }
    // a pool loading (a configured one at start-up, a model of the folder on demand): the
    // task waits in the queue for it, the load in its predicted start
    let loading = serving
        .iter()
        .any(|p| p.state() == pool_manager::PoolState::Loading);
    let load_wait = state.models_folder.load_wait_ms(&serving, state.started_at);
    let ready: Vec<Arc<Pool>> = serving.into_iter().filter(|p| p.accepts_work()).collect();
    if ready.is_empty() && loading {
        return Ok(Resolved {
            pools: Vec::new(),
            load_wait_ms: load_wait,
            model: Some(model),
        });
    }
    if ready.is_empty() && !from_workers {
        return Err(ApiError::new(
            ErrorCode::PoolUnavailable,
            format!("no pool serving {model:?} is ready"),
            true,
        )
        .with_retry_after(1000));
    }
    Ok(Resolved {
        pools: ready,
        load_wait_ms: 0,
        model: Some(model),
    })
}

/// Whether, in a cluster, another replica has a pool that takes tasks pinned to `pin`, or
/// else of `model`.
fn elsewhere(state: &SharedState, pin: Option<&str>, model: &str) -> bool {
    state
        .cluster_tasks
        .get()
        .is_some_and(|path| path.serves_elsewhere(pin, model))
}

pub(super) struct Validated {
    pub(super) prompt: PromptInput,
    pub(super) continuation: String,
    pub(super) max_tokens: usize,
    pub(super) stop: Vec<String>,
    pub(super) sampling: SamplingParams,
    pub(super) constraint: Option<OutputConstraint>,
    pub(super) logprobs: Option<usize>,
}

impl Validated {
    /// What the engine runs.
    pub(super) fn into_spec(self) -> RunSpec {
        RunSpec {
            prompt: self.prompt,
            continuation: self.continuation,
            sampling: self.sampling,
            max_tokens: self.max_tokens,
            stop: self.stop,
            constraint: self.constraint,
            logprobs: self.logprobs,
        }
    }
}

/// `logprobs` and `top_logprobs` as the run's: `Some(n)` when asked for.
fn logprobs_of(req: &TaskRequest) -> Result<Option<usize>, ApiError> {
    let top = req.top_logprobs.unwrap_or(0) as usize;
    if top > pool_manager::MAX_TOP_LOGPROBS {
        return Err(ApiError::invalid(
            "top_logprobs",
            format!("top_logprobs must be 0-{}", pool_manager::MAX_TOP_LOGPROBS),
        ));
    }
    match req.logprobs {
        Some(true) => Ok(Some(top)),
        _ if top > 0 => Err(ApiError::invalid(
            "top_logprobs",
            "top_logprobs needs logprobs: true",
        )),
        _ => Ok(None),
    }
}

/// The longest JSON Schema or grammar a request may give, in bytes of its text.
const MAX_CONSTRAINT_BYTES: usize = 64 * 1024;

/// The request's structured-output constraint: a JSON Schema or a grammar, not both.
fn constraint_of(req: &TaskRequest) -> Result<Option<OutputConstraint>, ApiError> {
    let too_long = |field: &str| {
        ApiError::invalid(
            field,
            format!("{field} is over {MAX_CONSTRAINT_BYTES} bytes"),
        )
    };
    match (&req.json_schema, &req.grammar) {
        (Some(_), Some(_)) => Err(ApiError::invalid(
            "grammar",
            "give json_schema or grammar, not both",
        )),
        (Some(schema), None) => {
            if !(schema.is_object() || schema.is_boolean()) {
                return Err(ApiError::invalid(
                    "json_schema",
                    "json_schema must be a JSON Schema: an object (or true)",
                ));
            }
            let text = schema.to_string();
            if text.len() > MAX_CONSTRAINT_BYTES {
                return Err(too_long("json_schema"));
            }
            Ok(Some(OutputConstraint::JsonSchema(text)))
        }
        (None, Some(grammar)) => {
            if grammar.trim().is_empty() {
                return Err(ApiError::invalid("grammar", "the grammar is empty"));
            }
            if grammar.len() > MAX_CONSTRAINT_BYTES {
                return Err(too_long("grammar"));
            }
            Ok(Some(OutputConstraint::Grammar(grammar.clone())))
        }
        (None, None) => Ok(None),
    }
}

pub(super) fn validate(state: &SharedState, req: &TaskRequest) -> Result<Validated, ApiError> {
    let a = &state.cfg.admission;
    let (prompt, continuation) = prompt_of(req)?;
    let max_tokens = req.max_tokens.unwrap_or(a.default_max_tokens);
    if max_tokens == 0 || max_tokens > a.max_tokens_out {
        return Err(ApiError::invalid(
            "max_tokens",
            format!("max_tokens must be within [1, {}]", a.max_tokens_out),
        ));
    }
    if let Some(id) = &req.task_id {
        if !valid_id(id) {
            return Err(ApiError::invalid(
                "task_id",
                "task_id must be 1-128 characters of [A-Za-z0-9-_.:]",
            ));
        }
    }
    if let Some(id) = &req.session_id {
        if !valid_id(id) {
            return Err(ApiError::invalid(
                "session_id",
                "session_id must be 1-128 characters of [A-Za-z0-9-_.:]",
            ));
        }
    }
    check_range("temperature", req.temperature, 0.0, 100.0, false)?;
    check_range("top_p", req.top_p, SMALLEST_FACTOR, 1.0, false)?;
    check_range("min_p", req.min_p, 0.0, 1.0, false)?;
    check_range(
        "repetition_penalty",
        req.repetition_penalty,
        SMALLEST_FACTOR,
        10.0,
        false,
    )?;
    check_range("presence_penalty", req.presence_penalty, -2.0, 2.0, false)?;
    check_range("frequency_penalty", req.frequency_penalty, -2.0, 2.0, false)?;
    if req.deadline_ms == Some(0) {
        return Err(ApiError::invalid(
            "deadline_ms",
            "deadline_ms must be positive",
        ));
    }
    let stop = req.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > a.max_stop_sequences {
        return Err(ApiError::invalid(
            "stop",
            format!("at most {} stop sequences", a.max_stop_sequences),
        ));
    }
    if stop
        .iter()
        .any(|s| s.is_empty() || s.chars().count() > a.max_stop_chars)
    {
        return Err(ApiError::invalid(
            "stop",
            format!("stop sequences must be 1-{} characters", a.max_stop_chars),
        ));
    }
    let sampling = SamplingParams {
        temperature: req.temperature.unwrap_or(0.0),
        top_k: req.top_k.unwrap_or(0) as usize,
        top_p: req.top_p.unwrap_or(1.0),
        min_p: req.min_p.unwrap_or(0.0),
        repetition_penalty: req.repetition_penalty.unwrap_or(1.0),
        presence_penalty: req.presence_penalty.unwrap_or(0.0),
        frequency_penalty: req.frequency_penalty.unwrap_or(0.0),
        seed: req.seed.unwrap_or_else(rand_seed),
    };
    Ok(Validated {
        prompt,
        continuation,
        max_tokens: max_tokens as usize,
        stop,
        sampling,
        constraint: constraint_of(req)?,
        logprobs: logprobs_of(req)?,
    })
}

/// Prompt tokens, counted by the tokenizer of a pool that would run the task, and whether the
/// count is exact. Engines that take text (remote workers) count on their side; without a
/// local tokenizer the count is an estimate of one token per 4 bytes, for budgets only.
/// The ids come with the count when a local tokenizer made it (exact); they go with the task so
/// the runner does not tokenize again.
pub(super) async fn count_prompt(
    state: &SharedState,
    pools: &[Arc<Pool>],
    v: &Validated,
) -> Result<(usize, Option<PromptIds>), ApiError> {
    for engine in pools.iter().filter_map(|p| p.engine()) {
        let counted = state
            .tokenizers
            .tokenize(engine, &v.prompt, &v.continuation)
            .await
            .map_err(|e| {
                let field = if matches!(v.prompt, PromptInput::Chat(_)) {
                    "messages"
                } else {
                    "prompt"
                };
                reject(
                    ErrorCode::InvalidParams,
                    ApiError::invalid(field, e.to_string()),
                )
            })?;
        if let Some(ids) = counted {
            return Ok((ids.ids.len(), Some(ids)));
        }
    }
    Ok((estimated_tokens(&v.prompt, &v.continuation), None))
}

/// Compiles the constraint for a loaded engine of the pools that would run the task (engines
/// remember what they compiled: the run then starts from it), so a schema or grammar that does
/// not compile, or pools with no constrained decoding, are refused before the task queues.
/// Without a loaded engine the run compiles it (a failure then ends the task).
pub(super) async fn prepare_constraint(
    state: &SharedState,
    pools: &[Arc<Pool>],
    c: &OutputConstraint,
) -> Result<(), ApiError> {
    let Some(engine) = pools.iter().find_map(|p| p.engine()) else {
        return Ok(());
    };
    state
        .tokenizers
        .prepare_constraint(engine, c)
        .await
        .map_err(|e| {
            let message = match e {
                PortError::InvalidInput(m) => m,
                other => other.to_string(),
            };
            reject(
                ErrorCode::InvalidParams,
                ApiError::invalid(c.field(), message),
            )
        })
}

/// A seed the server chooses: below 2^53, so JavaScript and jq show it exactly (FC-SEED-1).
fn rand_seed() -> u64 {
    let u = uuid::Uuid::new_v4();
    let b = u.as_bytes();
    u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) & ((1 << 53) - 1)
}

fn admission_of(
    task: &Task,
    position: usize,
    predicted_start_ms: u64,
    backoff_ms: u64,
) -> AdmissionResponse {
    AdmissionResponse {
        task_id: task.id.clone(),
        queue_position: position as u32,
        predicted_start_ms,
        backoff_ms,
        streams: StreamLinks {
            sse: format!("/v1/tasks/{}/stream", task.id),
        },
    }
}

fn reject(code: ErrorCode, err: ApiError) -> ApiError {
    metrics::rejected(code);
    err
}

/// The size of a prompt in tokens before any tokenizer ran: one per 4 bytes, for budgets and
/// predictions only.
fn estimated_tokens(prompt: &PromptInput, continuation: &str) -> usize {
    let bytes = match prompt {
        PromptInput::Text(t) => t.len(),
        PromptInput::Chat(turns) => turns.iter().map(|t| t.content.len() + 8).sum(),
    } + continuation.len();
    bytes.div_ceil(4).max(1)
}

/// The answer to a request over its tenant's quota: 429 with the wait after which it would
/// pass, or 400 naming the field when it never could.
fn over_quota(e: OverQuota) -> ApiError {
    match e {
        OverQuota::Wait {
            why,
            retry_after_ms,
        } => ApiError::new(ErrorCode::AdmissionReject, why, true)
            .with_retry_after(retry_after_ms)
            .with_policy("quota"),
        OverQuota::Never { field, why } => ApiError::invalid(field, why),
    }
}

/// The 429 of a full queue (the refused request's place is kept for its retry).
fn queue_full(
    state: &SharedState,
    rank: std::time::Instant,
    retry_after_ms: u64,
    caller: &Caller,
) -> ApiError {
    deadline::keep_place(state, rank, retry_after_ms, Claimant::of(caller));
    let cap = state.queue.capacity();
    reject(
        ErrorCode::AdmissionReject,
        ApiError::new(
            ErrorCode::AdmissionReject,
            format!("queue full ({cap} tasks waiting)"),
            true,
        )
        .with_retry_after(retry_after_ms)
        .with_policy(state.queue.policy().label()),
    )
}

/// Admits a task. Returns the 202 body and whether the task is new (false for an idempotent
/// resubmission of an existing `task_id`). `delivery` says what the client's stated timeout
/// bounds (deadline.rs). A refusal is counted for the caller's tenant.
pub async fn admit(
    state: &SharedState,
    req: TaskRequest,
    caller: &Caller,
    delivery: Delivery,
) -> Result<(AdmissionResponse, Arc<Task>, bool), ApiError> {
    let out = match state.cluster_tasks.get() {
        None => admit_task(state, req, caller, delivery).await,
        Some(_) => admit_in_cluster(state, req, caller, delivery).await,
    };
    if let Err(e) = &out {
        metrics::tenant_refused(state.queue.fair().label(caller.tenant()), e.code());
    }
    out
}

/// In a cluster: the admission runs on its own (a client gone mid-way does not cut it short),
/// and one task id's admissions one after the other (`in_flight.rs`).
async fn admit_in_cluster(
    state: &SharedState,
    req: TaskRequest,
    caller: &Caller,
    delivery: Delivery,
) -> Result<(AdmissionResponse, Arc<Task>, bool), ApiError> {
    let owner = caller.tenant().to_string();
    let (state, caller) = (state.clone(), caller.clone());
    let run = tokio::spawn(async move {
        let _running = match req.task_id.clone() {
            Some(id) => loop {
                match state.admitting.begin(&owner, &id) {
                    Ok(running) => break Some(running),
                    // the same id under way: its outcome first (then it is known here, or not)
                    Err(mut first) => {
                        let _ = first.wait_for(|done| *done).await;
                    }
                }
            },
            None => None,
        };
        admit_task(&state, req, &caller, delivery).await
    });
    run.await.unwrap_or_else(|e| {
        Err(ApiError::new(
            ErrorCode::Internal,
            format!("the admission stopped: {e}"),
            false,
        ))
    })
}

async fn admit_task(
    state: &SharedState,
    req: TaskRequest,
    caller: &Caller,
    delivery: Delivery,
) -> Result<(AdmissionResponse, Arc<Task>, bool), ApiError> {
    let owner = caller.tenant();
    if state.is_shutting_down() {
        return Err(reject(
            ErrorCode::ShuttingDown,
            ApiError::new(ErrorCode::ShuttingDown, "the server is shutting down", true)
                .with_retry_after(1000),
        ));
    }
    if let Some(id) = &req.task_id {
        if let Some(existing) = state.tasks.get(owner, id, false) {
            let pos = state.queue.position(&existing).unwrap_or(0);
            return Ok((admission_of(&existing, pos, 0, 0), existing, false));
        }
    }
    let v = validate(state, &req).map_err(|e| reject(e.code(), e))?;
    // a model of the folder no pool serves starts loading; the task waits for it (or for a
    // configured pool still loading at start-up), unless the client's deadline comes before
    // the load is predicted to end (503 with that wait)
    let folder_wait_ms = match req.model.as_deref().filter(|_| req.pool_id.is_none()) {
        Some(model) => crate::models_folder::ModelsFolder::ensure(state, model)
            .await
            .map_err(|e| reject(e.code(), e))?,
        None => 0,
    };
    let resolved = resolve_pools(state, &req).map_err(|e| reject(e.code(), e))?;
    let confirmed_elsewhere = state.cluster_tasks.get().is_some_and(|path| {
        let model = resolved.model.as_deref().unwrap_or("");
        path.pace_confirmed_elsewhere(req.pool_id.as_deref(), model)
    });
    let pools = resolved.pools;
    let load_wait_ms = folder_wait_ms.max(resolved.load_wait_ms);
    if req.deadline_ms.is_some_and(|d| d < load_wait_ms) {
        return Err(reject(
            ErrorCode::PoolUnavailable,
            ApiError::new(
                ErrorCode::PoolUnavailable,
                format!("the model is loading: about {load_wait_ms} ms, past the task's deadline"),
                true,
            )
            .with_retry_after(load_wait_ms),
        ));
    }
    let snapshots: Vec<_> = pools.iter().map(|p| p.snapshot()).collect();
    let typical = state.cfg.admission.default_max_tokens as usize;
    let est_now = eta::estimate(state.queue.len(), &snapshots, typical);
    let free_slots: usize = snapshots.iter().map(|s| s.slots_free()).sum();
    // refusals first, before the prompt is tokenized: a 429 costs no tokenizer time
    let priority = req.priority.unwrap_or(Priority::Interactive);
    let plan = deadline::plan(
        state,
        &pools,
        &snapshots,
        &Limits {
            end_within: req.deadline_ms.map(Duration::from_millis),
            max_tokens: v.max_tokens,
            prompt_tokens: estimated_tokens(&v.prompt, &v.continuation),
            priority,
            confirmed_elsewhere,
        },
        caller,
        delivery,
    )?;
    // in a cluster the bound is the pool's queue on JetStream, checked when admitting there
    if state.cluster_tasks.get().is_none() && !state.queue.has_room(free_slots, owner) {
        return Err(queue_full(state, plan.rank, est_now.retry_after_ms, caller));
    }
    let (n_prompt, prompt_ids) = count_prompt(state, &pools, &v).await?;
    if let Some(c) = &v.constraint {
        prepare_constraint(state, &pools, c).await?;
    }
    let no_logprobs = pools
        .iter()
        .find_map(|p| p.engine())
        .is_some_and(|e| !e.gives_logprobs());
    if v.logprobs.is_some() && no_logprobs {
        return Err(reject(
            ErrorCode::InvalidParams,
            ApiError::invalid(
                "logprobs",
                "this pool's engine does not report log-probabilities",
            ),
        ));
    }
    let exact = prompt_ids.is_some();
    if n_prompt == 0 {
        return Err(reject(
            ErrorCode::InvalidParams,
            ApiError::invalid("prompt", "the prompt has no tokens"),
        ));
    }
    let ctx = pools
        .iter()
        .filter_map(|p| p.engine().map(|e| e.descriptor().ctx_max))
        .max()
        .unwrap_or(0);
    if exact && ctx > 0 && n_prompt + v.max_tokens > ctx {
        return Err(reject(
            ErrorCode::InvalidParams,
            ApiError::invalid(
                "max_tokens",
                format!(
                    "prompt of {n_prompt} tokens plus max_tokens {} exceeds the context of {ctx} tokens",
                    v.max_tokens
                ),
            ),
        ));
    }
    let reserved = (n_prompt + v.max_tokens) as u64;
    let quota_ticket = state
        .quotas
        .admit(
            owner,
            priority,
            reserved,
            || InFlight {
                unfinished: state.tasks.unfinished_of(owner),
                queued: state
                    .queue
                    .by_tenant()
                    .iter()
                    .find(|(t, _)| t == owner)
                    .map_or(0, |(_, n)| *n),
            },
            est_now.retry_after_ms,
            std::time::Instant::now(),
        )
        .map_err(|e| {
            let e = over_quota(e);
            reject(e.code(), e)
        })?;
    let release = |state: &SharedState| {
        if let Some(t) = quota_ticket {
            state.quotas.release(owner, t);
        }
    };
    if let Some(sid) = &req.session_id {
        state.sessions.reserve(owner, sid, reserved).map_err(|e| {
            release(state);
            reject(
                ErrorCode::BudgetExceeded,
                ApiError::new(ErrorCode::BudgetExceeded, e.to_string(), false),
            )
        })?;
    }
    let refund = |state: &SharedState| {
        release(state);
        if let Some(sid) = &req.session_id {
            state.sessions.settle(owner, sid, reserved, 0);
        }
    };
    let pin = req.pool_id.clone();
    let model = if pin.is_none() {
        Some(
            req.model
                .clone()
                .or(resolved.model)
                .or_else(|| pools.first().map(|p| p.spec().model_alias.clone()))
                .unwrap_or_default(),
        )
    } else {
        req.model.clone()
    };
    let task = Arc::new(Task::new(NewTask {
        id: req
            .task_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
        owner: owner.to_string(),
        correlation_id: caller.correlation_id.clone(),
        priority,
        session_id: req.session_id.clone(),
        pin,
        model,
        spec: v.into_spec(),
        prompt_tokens: n_prompt,
        prompt_ids,
        params: redact(&req),
        ctx,
        deadline: req.deadline_ms.map(Duration::from_millis),
        start_by: plan.start_budget,
        rank: Some(plan.rank),
        predicted_start: plan.predicted_start,
        last_attempt: caller.patience.is_last_attempt(),
        claimant: Claimant::of(caller),
        quota_ticket,
    }));
    match state.tasks.insert(task.clone()) {
        Inserted::New => {}
        Inserted::Existing(t) => {
            refund(state);
            let pos = state.queue.position(&t).unwrap_or(0);
            return Ok((admission_of(&t, pos, 0, 0), t, false));
        }
        Inserted::Full => {
            refund(state);
            return Err(reject(
                ErrorCode::AdmissionReject,
                ApiError::new(
                    ErrorCode::AdmissionReject,
                    "too many unfinished tasks",
                    true,
                )
                .with_retry_after(est_now.retry_after_ms)
                .with_policy(state.queue.policy().label()),
            ));
        }
    }
    // idle slots now, not when admission began: the prompt was tokenized since, and a slot
    // counted idle then may hold a queued task by now (a stale count lets a burst overshoot
    // the queue's bound by the slots taken meanwhile); the queue counts them under its lock
    let free_slots = || pools.iter().map(|p| p.snapshot().slots_free()).sum();
    let cluster = state.cluster_tasks.get().map(|path| {
        let handoff = Handoff {
            task_id: task.id.clone(),
            owner: owner.to_string(),
            correlation_id: task.correlation_id.clone(),
            request: req.clone(),
            prompt_tokens: n_prompt as u32,
            admitted_unix_ms: unix_ms(),
        };
        (path, handoff)
    });
    let mut cluster_start_ms = None;
    let position = if let Some((path, handoff)) = &cluster {
        match path.admit(&task, handoff.clone(), plan.wait_allowed).await {
            Ok(place) => {
                cluster_start_ms = place.predicted_start_ms;
                place.position
            }
            Err(e) => {
                state.tasks.remove(&task);
                refund(state);
                return Err(match e {
                    ClusterRefusal::Full { retry_after_ms } => queue_full(
                        state,
                        plan.rank,
                        retry_after_ms.unwrap_or(est_now.retry_after_ms),
                        caller,
                    ),
                    ClusterRefusal::Late {
                        predicted_start_ms,
                        allowed_ms,
                    } => {
                        let retry = deadline::retry_after_ms(
                            predicted_start_ms.saturating_sub(allowed_ms),
                            allowed_ms,
                        );
                        reject(
                            ErrorCode::AdmissionReject,
                            ApiError::new(
                                ErrorCode::AdmissionReject,
                                format!(
                                    "the predicted wait for a slot of the cluster ({predicted_start_ms} ms) leaves no time to answer within the task's limits (a wait of {allowed_ms} ms at most): come back in {retry} ms"
                                ),
                                true,
                            )
                            .with_retry_after(retry)
                            .with_policy("deadline"),
                        )
                    }
                    ClusterRefusal::Unavailable(e) => reject(
                        ErrorCode::ClusterUnavailable,
                        ApiError::new(
                            ErrorCode::ClusterUnavailable,
                            format!("the cluster's queue did not answer: {e}"),
                            true,
                        )
                        .with_retry_after(1000),
                    ),
                });
            }
        }
    } else {
        match state.queue.push(task.clone(), free_slots) {
            Enqueued::Queued { position } => position,
            Enqueued::QueuedEvicting {
                position,
                evicted,
                why: Eviction::DropLru,
            } => {
                state.fail_task(
                    &evicted,
                    ErrorCode::QueueFullDropLru,
                    "evicted from a full queue by a newer task (drop-lru)",
                    true,
                    Some(est_now.retry_after_ms),
                );
                position
            }
            Enqueued::QueuedEvicting {
                position,
                evicted,
                why: Eviction::FairShare,
            } => {
                // its tenant holds more than its share of the queue: sent back before any compute,
                // its place kept for the retry
                let label = state.queue.fair().label(&evicted.owner);
                metrics::tenant_refused(label, ErrorCode::AdmissionReject);
                if state.fail_task(
                &evicted,
                ErrorCode::AdmissionReject,
                "sent back from a full queue: this tenant holds more than its share of it, and another tenant below its share came",
                true,
                Some(est_now.retry_after_ms),
            ) {
                deadline::keep_place(
                    state,
                    evicted.rank,
                    est_now.retry_after_ms,
                    evicted.claimant,
                );
            }
                position
            }
            Enqueued::Full => {
                state.tasks.remove(&task);
                refund(state);
                return Err(queue_full(state, plan.rank, est_now.retry_after_ms, caller));
            }
        }
    };
    let est = eta::estimate(position, &snapshots, typical);
    // in a cluster, the cluster's line (every replica's slots), else this replica's
    let predicted_start_ms =
        cluster_start_ms.unwrap_or(plan.predicted_start.as_millis() as u64) + load_wait_ms;
    task.push_started(contracts::SseStarted {
        queue_position: position as u32,
        predicted_start_ms,
        tenant_queue_share: state.queue.share_of(owner),
    });
    if let Some((path, handoff)) = cluster {
        // the task's first event on the relay: what the replica that takes it waits for
        if let Err(e) = path.announce(&task, handoff).await {
            // never started: the replica that takes it drops it without its `started`
            state.tasks.remove(&task);
            refund(state);
            return Err(reject(
                ErrorCode::ClusterUnavailable,
                ApiError::new(
                    ErrorCode::ClusterUnavailable,
                    format!("the cluster's event relay did not answer: {e}"),
                    true,
                )
                .with_retry_after(1000),
            ));
        }
    }
    metrics::enqueued(task.priority);
    metrics::tokens_in(n_prompt);
    let depth = state.queue.len();
    let backoff_ms = if depth * 2 > state.queue.capacity() {
        est.retry_after_ms * depth as u64 / state.queue.capacity().max(1) as u64
    } else {
        0
    };
    tracing::info!(
        task_id = %task.id,
        queue_position = position,
        predicted_start_ms,
        prompt_tokens = n_prompt,
        max_tokens = task.spec.max_tokens,
        priority = task.priority.as_str(),
        "task admitted"
    );
    state.wake.notify_one();
    Ok((
        admission_of(&task, position, predicted_start_ms, backoff_ms),
        task,
        true,
    ))
}
