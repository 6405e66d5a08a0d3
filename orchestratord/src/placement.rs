//! Placement: which pool runs a queued task. A pin means that pool only, never a fallback;
//! otherwise the Ready pools serving the model, most free slots first (a remote worker's
//! reported load counts as busy), then least engine load, then lowest recent latency, then
//! pool id.

use std::cmp::Ordering;

use pool_manager::SlotLease;

use crate::metrics;
use crate::state::AppState;
use crate::task::Task;

/// The outcome of trying to place one task now.
pub enum Placement {
    Leased(SlotLease),
    /// No slot free now; stay queued.
    Wait,
    /// The pinned pool is gone or no longer takes work, or no pool serves the task's model any
    /// more (its engine was removed): the task fails typed.
    Unavailable(String),
}

pub fn place(state: &AppState, task: &Task) -> Placement {
    if let Some(pin) = &task.pin {
        let Some(pool) = state.pools.get(pin) else {
            return Placement::Unavailable(format!("pinned pool {pin:?} was removed"));
        };
        let st = pool.state();
        if !st.accepts_work() {
            return Placement::Unavailable(format!("pinned pool {pin:?} is {}", st.as_str()));
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
        return Placement::Unavailable(format!("no pool serves model {model:?} any more"));
    }
    let mut candidates: Vec<_> = serving
        .into_iter()
        .map(|p| (p.snapshot(), p))
        .filter(|(s, _)| s.state.accepts_work() && s.slots_free() > 0)
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
