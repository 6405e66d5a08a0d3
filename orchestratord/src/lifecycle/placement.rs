//! Placement: which pool runs a queued task. A pin means that pool only, never a fallback;
//! otherwise the Ready pools serving the model, most free slots first (a remote worker's
//! reported load counts as busy), then least engine load, then lowest recent latency, then
//! pool id.

use std::cmp::Ordering;

use contracts::ErrorCode;
use pool_manager::{PoolState, SlotLease};

use crate::lifecycle::state::AppState;
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

pub fn place(state: &AppState, task: &Task) -> Placement {
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
                metrics::placement(pin, true);
                tracing::debug!(task_id = %task.id, pool = %pin, "placed on pinned pool");
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
        if state.workers.knows_model(model) {
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
    if !snapshots.iter().any(|(s, _)| may_come_back(s)) && !state.workers.knows_model(model) {
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
    let mut candidates: Vec<_> = snapshots
        .into_iter()
        .filter(|(s, _)| s.accepts_work && s.slots_free() > 0)
        .collect();
    candidates.sort_by(|(a, _), (b, _)| {
        b.slots_free()
            .cmp(&a.slots_free())
            .then_with(|| a.engine_load.unwrap_or(0).cmp(&b.engine_load.unwrap_or(0)))
            .then_with(|| {
                let la = a.service_ms_ewma.unwrap_or(f64::MAX);
                let lb = b.service_ms_ewma.unwrap_or(f64::MAX);
                la.partial_cmp(&lb).unwrap_or(Ordering::Equal)
            })
            .then_with(|| a.id.cmp(&b.id))
    });
    tracing::debug!(
        task_id = %task.id,
        candidates = ?candidates.iter().map(|(s, _)| (s.id.as_str(), s.slots_free())).collect::<Vec<_>>(),
        "placement candidates"
    );
    for (snap, pool) in candidates {
        if let Some(lease) = pool.try_lease() {
            metrics::placement(&snap.id, false);
            tracing::debug!(task_id = %task.id, pool = %snap.id, "placed");
            return Placement::Leased(lease);
        }
    }
    Placement::Wait
}
