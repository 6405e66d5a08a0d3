//! Placement: which pool runs a queued task. A pin means that pool only, never a fallback;
//! otherwise, among the Ready pools serving the model that have a free slot: the
//! conversation's pool while it has room, then the pool holding the longest cached prefix of
//! the prompt (what its engine says it holds, or for a pool whose engine cannot say — a remote
//! worker — what placement sent it: `sent.rs`), then the least loaded (most free slots — a remote worker's reported load counts
//! as busy — then least engine load, then lowest recent latency, then pool id); cache and
//! session count only within the load bound (`score.rs`). The choice and its reason go to the
//! task record and `orchd_placement_total{pool, reason}`.

mod score;
pub mod sent;
pub mod sessions;

use contracts::{ErrorCode, PlacementNote};
use pool_manager::{PoolState, SlotLease};

pub use score::{order, Candidate, Reason, Weights};
pub use sent::SentPrefixes;
pub use sessions::{ConversationKey, PlacementSessions};

use crate::lifecycle::state::Lifecycle;
use crate::lifecycle::task::Task;
use crate::metrics;

/// The outcome of trying to place one task now.
pub enum Placement {
    Leased(SlotLease),
    /// No slot free now; stay queued.
    Wait,
    /// The pinned pool is gone or no longer takes work (`POOL_UNREADY`), or no pool serving
    /// the task's model can take it again by itself — removed, draining, drained, or failing
    /// with its circuit open (`POOL_UNAVAILABLE`): the task ends typed instead of waiting
    /// forever.
    Unavailable(ErrorCode, String),
}

/// Whether a pool that takes no work now will again without an operator: loading,
/// restarting with its circuit closed, or reloading.
fn may_come_back(s: &pool_manager::PoolSnapshot) -> bool {
    match s.state {
        PoolState::Ready | PoolState::Reloading | PoolState::Loading => true,
        PoolState::Unready => !s.circuit_open(),
        PoolState::Draining | PoolState::Drained => false,
    }
}

pub fn place(state: &Lifecycle, task: &Task) -> Placement {
    if let Some(pin) = &task.pin {
        let Some(pool) = state.pools.get(pin) else {
            return Placement::Unavailable(
                ErrorCode::PoolUnready,
                format!("pinned pool {pin:?} was removed"),
            );
        };
        if !pool.accepts_work() {
            return Placement::Unavailable(
                ErrorCode::PoolUnready,
                format!("pinned pool {pin:?} is {}", pool.state().as_str()),
            );
        }
        return match pool.try_lease() {
            Some(lease) => {
                // a task taken from the cluster's queue runs where it was taken: the taker
                // says why (`taken_from_cluster`)
                if !task.is_run_for_cluster() {
                    placed(state, task, pin, Reason::Pinned, 0);
                }
                Placement::Leased(lease)
            }
            None => Placement::Wait,
        };
    }
    let serving: Vec<_> = state
        .pools
        .all()
        .into_iter()
        .filter(|p| task.model.as_deref().is_none_or(|m| p.serves(m)))
        .collect();
    if serving.is_empty() {
        let model = task.model.as_deref().unwrap_or("");
        if state.workers_port.knows_model(model) {
            // a worker may (re)connect for it; the queue timeout bounds the wait
            return Placement::Wait;
        }
        return Placement::Unavailable(
            ErrorCode::PoolUnavailable,
            format!("no pool serves model {model:?} any more"),
        );
    }
    let snapshots: Vec<_> = serving.into_iter().map(|p| (p.snapshot(), p)).collect();
    let model = task.model.as_deref().unwrap_or("");
    if !snapshots.iter().any(|(s, _)| may_come_back(s)) && !state.workers_port.knows_model(model) {
        let states: Vec<String> = snapshots
            .iter()
            .map(|(s, _)| format!("{} {}", s.id, s.state.as_str()))
            .collect();
        return Placement::Unavailable(
            ErrorCode::PoolUnavailable,
            format!(
                "no pool serving {model:?} will take work again by itself ({})",
                states.join(", ")
            ),
        );
    }
    // (slots used, slots) of every pool serving the model that takes work: the mean load
    let loads: Vec<(usize, usize)> = snapshots
        .iter()
        .filter(|(s, _)| s.accepts_work)
        .map(|(s, _)| (s.slots_total - s.slots_free(), s.slots_total))
        .collect();
    let free: Vec<_> = snapshots
        .iter()
        .filter(|(s, _)| s.accepts_work && s.slots_free() > 0)
        .collect();
    let candidates: Vec<Candidate<'_>> = free
        .iter()
        .map(|(s, _)| Candidate {
            id: &s.id,
            slots_total: s.slots_total,
            used: s.slots_total - s.slots_free(),
            engine_load: s.engine_load.unwrap_or(0),
            service_ms: s.service_ms_ewma,
            held_tokens: match said_held(s, task) {
                Some(held) => held.held_tokens(&task.prefix_chain),
                None => state.placement_sent.held_tokens(&s.id, &task.prefix_chain),
            },
        })
        .collect();
    let affinity = task
        .conversation
        .and_then(|k| state.placement_sessions.pool_of(k));
    let weights = Weights {
        min_cached_tokens: state.cfg.placement.min_cached_tokens,
        load_bound: state.cfg.placement.load_bound,
    };
    let ranked = order(&candidates, &loads, affinity.as_deref(), weights);
    tracing::debug!(
        task_id = %task.id,
        candidates = ?ranked,
        "placement candidates"
    );
    for (id, reason) in ranked {
        let Some(((snapshot, pool), held)) = free
            .iter()
            .zip(&candidates)
            .find(|((s, _), _)| s.id == id)
            .map(|(f, c)| (*f, c.held_tokens))
        else {
            continue;
        };
        if let Some(lease) = pool.try_lease() {
            placed(state, task, id, reason, held);
            if said_held(snapshot, task).is_none() {
                let pools = &state.pools;
                state
                    .placement_sent
                    .sent(id, &task.prefix_chain, |p| pools.get(p).is_some());
            }
            return Placement::Leased(lease);
        }
    }
    Placement::Wait
}

/// What `pool` says it holds, in the terms of `task`'s chain: engines say it in token blocks,
/// so a chain of the prompt's bytes (a model nothing here tokenizes) is compared with what
/// placement sent the pool instead (PLACE-6).
fn said_held<'a>(
    pool: &'a pool_manager::PoolSnapshot,
    task: &Task,
) -> Option<&'a std::sync::Arc<pool_manager::CachedPrefixes>> {
    pool.cached_prefixes
        .as_ref()
        .filter(|_| task.prompt_ids.is_some())
}

/// Notes why pool `pool_id` of this replica took `task` from the cluster's queue (PLACE-8):
/// the client's pin, else its cached prefix there (`cache`, the pool the head start named, or
/// one that holds as much) or room alone (`load`).
pub fn taken_from_cluster(state: &Lifecycle, task: &Task, pool_id: &str, client_pinned: bool) {
    let held = state
        .pools
        .get(pool_id)
        .and_then(|p| p.engine())
        .and_then(|e| e.cached_prefixes())
        .map_or(0, |h| h.held_tokens(&task.prefix_chain));
    let reason = if client_pinned {
        Reason::Pinned
    } else if held > 0 && held >= state.cfg.placement.min_cached_tokens {
        Reason::Cache
    } else {
        Reason::Load
    };
    placed(state, task, pool_id, reason, held);
}

/// Notes where `task` goes and why: its record, the metric, its conversation's pool.
fn placed(state: &Lifecycle, task: &Task, pool: &str, reason: Reason, held_tokens: usize) {
    metrics::placement(pool, reason);
    tracing::debug!(task_id = %task.id, pool, reason = reason.as_str(), held_tokens, "placed");
    if let Some(k) = task.conversation {
        state.placement_sessions.ran_on(k, pool);
    }
    task.lock().placement = Some(PlacementNote {
        reason,
        held_tokens: held_tokens as u32,
    });
}
