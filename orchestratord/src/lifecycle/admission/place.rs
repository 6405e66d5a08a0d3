//! A task takes its place in line: this server's queue, or its pool's queue of the cluster
//! (whose bound and line are the cluster's). A full line refuses it (429, its place kept for
//! the retry); a full queue may send back another task to make room (`drop-lru`, or fair
//! share: the newest task of the tenant furthest over its share).

use std::sync::Arc;
use std::time::Instant;

use contracts::{ErrorCode, TaskRequest};
use pool_manager::Pool;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::lifecycle::cluster_port::{ClusterPort, ClusterRefusal};
use crate::lifecycle::deadline::{self, Plan};
use crate::lifecycle::handoff::{unix_ms, Handoff};
use crate::lifecycle::queue::{Enqueued, Eviction};
use crate::lifecycle::state::SharedLifecycle;
use crate::lifecycle::task::{Claimant, Task};
use crate::metrics;

/// Where a task stands once in line.
pub(super) struct Placed {
    /// Tasks ahead of it.
    pub position: usize,
    /// In a cluster: the start the cluster's line predicts (every replica's slots).
    pub cluster_start_ms: Option<u64>,
    /// In a cluster: the task's first event for the relay, to announce once it has it.
    pub announce: Option<(Arc<dyn ClusterPort>, Handoff)>,
}

/// The 429 of a full queue (the refused request's place is kept for its retry).
pub(super) fn queue_full(
    state: &SharedLifecycle,
    rank: Instant,
    retry_after_ms: u64,
    caller: &Caller,
) -> ApiError {
    deadline::keep_place(state, rank, retry_after_ms, Claimant::of(caller));
    let cap = state.queue.capacity();
    ApiError::new(
        ErrorCode::AdmissionReject,
        format!("queue full ({cap} tasks waiting)"),
        true,
    )
    .with_retry_after(retry_after_ms)
    .with_policy(state.queue.policy().label())
}

/// Puts `task` in line: the cluster's when this replica is one, else this server's queue.
/// `retry_after_ms` is what a refusal advises.
#[allow(clippy::too_many_arguments)]
pub(super) async fn take_place(
    state: &SharedLifecycle,
    task: &Arc<Task>,
    req: &TaskRequest,
    caller: &Caller,
    plan: &Plan<'_>,
    pools: &[Arc<Pool>],
    prompt_tokens: usize,
    retry_after_ms: u64,
) -> Result<Placed, ApiError> {
    match state.cluster_tasks.get() {
        Some(path) => {
            let handoff = Handoff {
                task_id: task.id.clone(),
                owner: task.owner.clone(),
                correlation_id: task.correlation_id.clone(),
                request: req.clone(),
                prompt_tokens: prompt_tokens as u32,
                admitted_unix_ms: unix_ms(),
                head_start: None,
            };
            match path.admit(task, handoff.clone(), plan.wait_allowed).await {
                Ok(place) => Ok(Placed {
                    position: place.position,
                    cluster_start_ms: place.predicted_start_ms,
                    announce: Some((path.clone(), handoff)),
                }),
                Err(e) => Err(cluster_refusal(state, e, plan.rank, retry_after_ms, caller)),
            }
        }
        None => {
            let position = enqueue(state, task, pools, plan.rank, retry_after_ms, caller)?;
            Ok(Placed {
                position,
                cluster_start_ms: None,
                announce: None,
            })
        }
    }
}

/// The answer to a cluster that did not take the task.
fn cluster_refusal(
    state: &SharedLifecycle,
    e: ClusterRefusal,
    rank: Instant,
    retry_after_ms: u64,
    caller: &Caller,
) -> ApiError {
    match e {
        ClusterRefusal::Full {
            retry_after_ms: advised,
        } => queue_full(state, rank, advised.unwrap_or(retry_after_ms), caller),
        ClusterRefusal::Late {
            predicted_start_ms,
            allowed_ms,
        } => {
            let retry =
                deadline::retry_after_ms(predicted_start_ms.saturating_sub(allowed_ms), allowed_ms);
            ApiError::new(
                ErrorCode::AdmissionReject,
                format!(
                    "the predicted wait for a slot of the cluster ({predicted_start_ms} ms) leaves no time to answer within the task's limits (a wait of {allowed_ms} ms at most): come back in {retry} ms"
                ),
                true,
            )
            .with_retry_after(retry)
            .with_policy("deadline")
        }
        ClusterRefusal::Unavailable(e) => ApiError::new(
            ErrorCode::ClusterUnavailable,
            format!("the cluster's queue did not answer: {e}"),
            true,
        )
        .with_retry_after(1000),
    }
}

/// Pushes `task` into this server's queue; returns its place.
fn enqueue(
    state: &SharedLifecycle,
    task: &Arc<Task>,
    pools: &[Arc<Pool>],
    rank: Instant,
    retry_after_ms: u64,
    caller: &Caller,
) -> Result<usize, ApiError> {
    // idle slots now, not when admission began: the prompt was tokenized since, and a slot
    // counted idle then may hold a queued task by now (a stale count lets a burst overshoot
    // the queue's bound by the slots taken meanwhile); the queue counts them under its lock
    let free_slots = || pools.iter().map(|p| p.snapshot().slots_free()).sum();
    match state.queue.push(task.clone(), free_slots) {
        Enqueued::Queued { position } => Ok(position),
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
                Some(retry_after_ms),
            );
            Ok(position)
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
                Some(retry_after_ms),
            ) {
                deadline::keep_place(state, evicted.rank, retry_after_ms, evicted.claimant);
            }
            Ok(position)
        }
        Enqueued::Full => Err(queue_full(state, rank, retry_after_ms, caller)),
    }
}
