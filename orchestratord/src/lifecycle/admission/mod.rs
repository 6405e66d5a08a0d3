//! Admission (ORCH-ADM-*): every adapter admits through [`admit`]. A request's walk, top to
//! bottom, one step a function given what it needs:
//! 1. check the request (`request.rs`): prompt, limits, sampling, constraint, ids — after a
//!    model of the folder's recipe filled in what it left out (`models_folder/recipe.rs`);
//! 2. resolve its pools (`pools.rs`): the pin, or the pools of its model — loading a model of
//!    the folder when none serves it;
//! 3. plan its place and time (`deadline.rs`): the line played forward at the measured pace,
//!    refused at once (429 with the wait that fits) when it would answer too late, before any
//!    work is spent on it; a full queue refuses too;
//! 4. prepare its prompt (`prepare.rs`): templated, tokenized and its grammar compiled on the
//!    request-work threads in its tenant's turn, and checked against the context;
//! 5. reserve its quotas and session budget (`reserve.rs`);
//! 6. take its place in line (`place.rs`): this server's queue or the cluster's;
//! 7. answer: its `started` event and the 202.

mod embed;
mod place;
mod pools;
mod prepare;
mod request;
mod reserve;

use std::sync::Arc;
use std::time::Duration;

use contracts::{AdmissionResponse, ErrorCode, Prediction, Priority, StreamLinks, TaskRequest};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::lifecycle::deadline::{self, Delivery, Limits, Plan};
use crate::lifecycle::eta;
use crate::lifecycle::placement::ConversationKey;
use crate::lifecycle::state::SharedLifecycle;
use crate::lifecycle::task::{Claimant, NewTask, Task};
use crate::lifecycle::task_store::Inserted;
use crate::metrics;

pub use embed::count_inputs;
pub use prepare::{count_prompt, prepare_constraint};
pub(crate) use request::valid_id;
pub use request::{prompt_of, redact, validate, Validated, SMALLEST_FACTOR};

use place::Placed;
use prepare::Prepared;
use reserve::Reservation;

/// A refusal, counted.
fn rejected(e: ApiError) -> ApiError {
    metrics::rejected(e.code());
    e
}

fn admission_of(
    task: &Task,
    position: usize,
    predicted_start_ms: u64,
    prediction: Prediction,
    backoff_ms: u64,
) -> AdmissionResponse {
    AdmissionResponse {
        task_id: task.id.clone(),
        queue_position: position as u32,
        predicted_start_ms,
        prediction,
        backoff_ms,
        streams: StreamLinks {
            sse: format!("/v1/tasks/{}/stream", task.id),
        },
    }
}

/// Admits a task. Returns the 202 body and whether the task is new (false for an idempotent
/// resubmission of an existing `task_id`). `delivery` says what the client's stated timeout
/// bounds (deadline.rs). A refusal is counted for the caller's tenant.
pub async fn admit(
    state: &SharedLifecycle,
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
    state: &SharedLifecycle,
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

type Admitted = (AdmissionResponse, Arc<Task>, bool);

async fn admit_task(
    state: &SharedLifecycle,
    mut req: TaskRequest,
    caller: &Caller,
    delivery: Delivery,
) -> Result<Admitted, ApiError> {
    let owner = caller.tenant();
    // a request that names no class gets the highest its tenant may submit
    req.priority = req
        .priority
        .or_else(|| Some(state.quotas.default_priority(owner)));
    if state.is_shutting_down() {
        return Err(rejected(
            ApiError::new(ErrorCode::ShuttingDown, "the server is shutting down", true)
                .with_retry_after(1000),
        ));
    }
    if let Some(known) = already_admitted(state, owner, &req) {
        return Ok(known);
    }
    // a model of the folder: its own name for the hub name it was pulled as, its recipe's
    // defaults where the request says nothing
    state.models_port.apply_recipe(&mut req).await;
    let v = validate(state, &req).map_err(rejected)?;
    let resolved = pools::resolve(state, &req).await.map_err(rejected)?;
    let typical = state.cfg.admission.default_max_tokens as usize;
    let snapshots: Vec<_> = resolved.pools.iter().map(|p| p.snapshot()).collect();
    let retry_after_ms = eta::estimate(state.queue.len(), &snapshots, typical).retry_after_ms;
    let plan = plan_place(state, &req, &v, &resolved, caller, delivery)?;
    let prepared = prepare::prepare(state, owner, &resolved.pools, &v)
        .await
        .map_err(rejected)?;
    let priority = req.priority.unwrap_or(Priority::Interactive);
    let reserved = (prepared.n_prompt + v.max_tokens) as u64;
    let held = reserve::reserve(state, owner, &req, priority, reserved, retry_after_ms)
        .map_err(rejected)?;
    let task = new_task(&req, caller, v, &resolved, &prepared, &plan, &held);
    match state.tasks.insert(task.clone()) {
        Inserted::New => {}
        Inserted::Existing(t) => {
            held.refund(state, owner);
            let pos = state.queue.position(&t).unwrap_or(0);
            return Ok((admission_of(&t, pos, 0, Prediction::Measured, 0), t, false));
        }
        Inserted::Full => {
            held.refund(state, owner);
            return Err(rejected(
                ApiError::new(
                    ErrorCode::AdmissionReject,
                    "too many unfinished tasks",
                    true,
                )
                .with_retry_after(retry_after_ms)
                .with_policy(state.queue.policy().label()),
            ));
        }
    }
    let placed = place::take_place(
        state,
        &task,
        &req,
        caller,
        &plan,
        &resolved.pools,
        prepared.n_prompt,
        retry_after_ms,
    )
    .await
    .map_err(|e| {
        state.tasks.remove(&task);
        held.refund(state, owner);
        rejected(e)
    })?;
    answer(state, task, &plan, placed, &resolved, &held, &snapshots).await
}

/// A task id this tenant already submitted: the same task, not another.
fn already_admitted(state: &SharedLifecycle, owner: &str, req: &TaskRequest) -> Option<Admitted> {
    let existing = state.tasks.get(owner, req.task_id.as_deref()?, false)?;
    let pos = state.queue.position(&existing).unwrap_or(0);
    Some((
        admission_of(&existing, pos, 0, Prediction::Measured, 0),
        existing,
        false,
    ))
}

/// Its place and predicted time in line, or the refusal (counted by `deadline::plan`), before
/// any work is spent on its prompt; then whether this server's queue has room.
fn plan_place<'a>(
    state: &'a SharedLifecycle,
    req: &TaskRequest,
    v: &Validated,
    resolved: &pools::Resolved,
    caller: &Caller,
    delivery: Delivery,
) -> Result<Plan<'a>, ApiError> {
    let snapshots: Vec<_> = resolved.pools.iter().map(|p| p.snapshot()).collect();
    // a prompt's size before any tokenizer ran, never more than the pools could hold: a
    // request larger than the context is refused once counted, and until then stands for no
    // more than a full context in anyone's line (ISO-3)
    let prompt_tokens = v
        .estimated_tokens()
        .min(pools::context_of(&resolved.pools).unwrap_or(usize::MAX));
    let plan = deadline::plan(
        state,
        &resolved.pools,
        &snapshots,
        &Limits {
            end_within: req.deadline_ms.map(Duration::from_millis),
            max_tokens: v.max_tokens,
            prompt_tokens,
            priority: req.priority.unwrap_or(Priority::Interactive),
            confirmed_elsewhere: pools::confirmed_elsewhere(state, req, resolved),
        },
        caller,
        delivery,
    )?;
    // in a cluster the bound is the pool's queue on JetStream, checked when admitting there
    // (refused here only when the stream refused a moment ago and no task left since)
    let free_slots: usize = snapshots.iter().map(|s| s.slots_free()).sum();
    let typical = state.cfg.admission.default_max_tokens as usize;
    let retry = || eta::estimate(state.queue.len(), &snapshots, typical).retry_after_ms;
    match state.cluster_tasks.get() {
        None if !state.queue.has_room(free_slots, caller.tenant()) => Err(rejected(
            place::queue_full(state, plan.rank, retry(), caller),
        )),
        Some(path) => {
            let model = task_model(req, resolved).unwrap_or_default();
            let class = req.priority.unwrap_or(Priority::Interactive);
            match path.known_full(req.pool_id.as_deref(), &model, class) {
                Some(advised) => Err(rejected(place::queue_full(
                    state,
                    plan.rank,
                    advised.unwrap_or_else(retry),
                    caller,
                ))),
                None => Ok(plan),
            }
        }
        None => Ok(plan),
    }
}

/// The model a task names: the request's, else the one its pools resolved to (none for a
/// task pinned to a pool without one); a cluster's queue of the task is its model's.
fn task_model(req: &TaskRequest, resolved: &pools::Resolved) -> Option<String> {
    if req.pool_id.is_some() {
        return req.model.clone();
    }
    Some(
        req.model
            .clone()
            .or(resolved.model.clone())
            .or_else(|| resolved.pools.first().map(|p| p.spec().model_alias.clone()))
            .unwrap_or_default(),
    )
}

/// The task as admitted.
#[allow(clippy::too_many_arguments)]
fn new_task(
    req: &TaskRequest,
    caller: &Caller,
    v: Validated,
    resolved: &pools::Resolved,
    prepared: &Prepared,
    plan: &Plan<'_>,
    held: &Reservation,
) -> Arc<Task> {
    let pin = req.pool_id.clone();
    let model = task_model(req, resolved);
    Arc::new(Task::new(NewTask {
        id: req
            .task_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string()),
        owner: caller.tenant().to_string(),
        correlation_id: caller.correlation_id.clone(),
        priority: req.priority.unwrap_or(Priority::Interactive),
        session_id: req.session_id.clone(),
        pin,
        model,
        spec: v.into_spec(),
        prompt_tokens: prepared.n_prompt,
        prompt_ids: prepared.ids.clone(),
        conversation: req
            .prompt_cache_key
            .as_deref()
            .or(req.session_id.as_deref())
            .map(|k| ConversationKey::of(caller.tenant(), k)),
        embed_ids: prepared.embed_ids.clone(),
        params: redact(req),
        ctx: prepared.ctx,
        deadline: req.deadline_ms.map(Duration::from_millis),
        start_by: plan.start_budget,
        start_by_servers: plan.start_budget_servers,
        rank: Some(plan.rank),
        predicted_start: plan.predicted_start,
        last_attempt: caller.patience.is_last_attempt(),
        claimant: Claimant::of(caller),
        quota_ticket: held.ticket,
        admitted_ago: Duration::ZERO,
    }))
}

/// The task's `started` event (announced to the cluster's relay in a cluster) and the 202.
async fn answer(
    state: &SharedLifecycle,
    task: Arc<Task>,
    plan: &Plan<'_>,
    placed: Placed,
    resolved: &pools::Resolved,
    held: &Reservation,
    snapshots: &[pool_manager::PoolSnapshot],
) -> Result<Admitted, ApiError> {
    let position = placed.position;
    // in a cluster, the cluster's line (every replica's slots), else this replica's; a task
    // waiting for its pool's load waits for that too
    let predicted_start_ms = placed
        .cluster_start_ms
        .unwrap_or(plan.predicted_start.as_millis() as u64)
        + resolved.load_wait_ms;
    let prediction = if plan.measured || placed.cluster_start_ms.is_some() {
        Prediction::Measured
    } else {
        Prediction::Estimated
    };
    task.push_started(contracts::SseStarted {
        queue_position: position as u32,
        predicted_start_ms,
        prediction,
        tenant_queue_share: state.queue.share_of(&task.owner),
    });
    if let Some((path, handoff)) = placed.announce {
        // the task's first event on the relay: what the replica that takes it waits for
        if let Err(e) = path.announce(&task, handoff).await {
            // never started: the replica that takes it drops it without its `started`
            state.tasks.remove(&task);
            held.refund(state, &task.owner);
            return Err(rejected(
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
    metrics::tokens_in(task.prompt_tokens);
    let typical = state.cfg.admission.default_max_tokens as usize;
    let est = eta::estimate(position, snapshots, typical);
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
        prompt_tokens = task.prompt_tokens,
        max_tokens = task.spec.max_tokens,
        priority = task.priority.as_str(),
        "task admitted"
    );
    state.wake.notify_one();
    Ok((
        admission_of(&task, position, predicted_start_ms, prediction, backoff_ms),
        task,
        true,
    ))
}
