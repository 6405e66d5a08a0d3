//! The head start (PLACE-8): a task queued in a model's queue is taken first by the pool of the
//! cluster that holds the longest cached prefix of its prompt, by any pool after. The admitting
//! replica scores every live pool serving the model — its own from their engines, the others'
//! from what they publish (`held_prefixes.rs`) and their free slots from the directory — with
//! the rule placement uses inside one replica (`lifecycle/placement/score.rs`: the minimum
//! match and the load bound), and names the winner in the task's nudge with an end
//! (`cluster.head_start_ms` from now), sent once before the task goes into the queue (so no
//! other pool finds it there first) and again once it can start. Every other pool taking from
//! the queue leaves its next look until that end, unless a nudge naming it comes first (the
//! nudges that came while it was busy are read before each look); the named pool looks at
//! once. Nothing waits for an answer: a pool that cannot take the task after all (full by
//! then, gone) costs it the head start, never more.

use std::time::Duration;

use super::Cluster;
use crate::lifecycle::handoff::unix_ms;
use crate::lifecycle::placement::{order, Candidate, Reason, Weights};
use crate::lifecycle::state::Lifecycle;
use crate::lifecycle::task::Task;

/// The pool a queued task is left to for a moment (defined with the handoff that carries it).
pub use crate::lifecycle::handoff::HeadStart as Preference;

/// One pool of the cluster serving the task's model.
struct Seat {
    replica: String,
    pool: String,
    slots_total: usize,
    used: usize,
    held_tokens: usize,
}

/// The pool that should take `task` first, if a cached prefix says so.
pub fn preferred(cluster: &Cluster, state: &Lifecycle, task: &Task) -> Option<Preference> {
    let head_start = state.cfg.cluster.head_start_ms;
    if head_start == 0 || task.pin.is_some() || task.prefix_chain.is_empty() {
        return None;
    }
    let model = task.model.as_deref()?;
    let chain = &task.prefix_chain;
    let mut seats = Vec::new();
    for pool in state.pools.all() {
        if pool.spec().model_alias != model || !pool.accepts_work() {
            continue;
        }
        let s = pool.snapshot();
        seats.push(Seat {
            replica: cluster.replica().to_string(),
            held_tokens: s
                .cached_prefixes
                .as_ref()
                .map_or(0, |h| h.held_tokens(chain)),
            used: s.slots_total - s.slots_free(),
            slots_total: s.slots_total,
            pool: s.id,
        });
    }
    let holders = cluster.held().holders(model, chain);
    for p in cluster.directory().others() {
        if p.model_alias.as_deref() != Some(model) || !p.ready || p.draining {
            continue;
        }
        let Some(replica) = p.replica else {
            continue;
        };
        let held_tokens = holders
            .iter()
            .find(|(r, pool, _)| *r == replica && *pool == p.pool_id)
            .map_or(0, |h| h.2);
        seats.push(Seat {
            replica,
            pool: p.pool_id,
            slots_total: p.slots_total as usize,
            used: p.slots_total.saturating_sub(p.slots_free) as usize,
            held_tokens,
        });
    }
    let serving: Vec<(usize, usize)> = seats.iter().map(|s| (s.used, s.slots_total)).collect();
    let ids: Vec<String> = (0..seats.len()).map(|i| i.to_string()).collect();
    let candidates: Vec<Candidate<'_>> = seats
        .iter()
        .zip(&ids)
        .filter(|(s, _)| s.used < s.slots_total)
        .map(|(s, id)| Candidate {
            id,
            slots_total: s.slots_total,
            used: s.used,
            engine_load: 0,
            service_ms: None,
            held_tokens: s.held_tokens,
        })
        .collect();
    let weights = Weights {
        min_cached_tokens: state.cfg.placement.min_cached_tokens,
        load_bound: state.cfg.placement.load_bound,
    };
    let (first, reason) = *order(&candidates, &serving, None, weights).first()?;
    if reason != Reason::Cache {
        return None;
    }
    let seat = &seats[first.parse::<usize>().ok()?];
    tracing::debug!(task_id = %task.id, replica = %seat.replica, pool = %seat.pool, held_tokens = seat.held_tokens, "cluster: head start");
    Some(Preference {
        replica: seat.replica.clone(),
        pool: seat.pool.clone(),
        until_unix_ms: unix_ms() + head_start,
    })
}

/// What a nudge means to one pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heed {
    /// It names this pool: look now.
    Mine,
    /// It names another pool: leave the queue to it this long.
    Wait(Duration),
    /// It names no pool, or its head start is over (or this replica gives none).
    Nothing,
}

/// What a nudge carrying `payload` means to pool `pool` of replica `me`: a head start for
/// another pool lasts until its end, at most `cap` (this replica's `head_start_ms`: the
/// clocks of two hosts differ).
pub fn heed(payload: &[u8], me: &str, pool: &str, cap: Duration) -> Heed {
    if payload.is_empty() || cap.is_zero() {
        return Heed::Nothing;
    }
    let Ok(p) = serde_json::from_slice::<Preference>(payload) else {
        return Heed::Nothing;
    };
    if p.replica == me && p.pool == pool {
        return Heed::Mine;
    }
    let left = Duration::from_millis(p.until_unix_ms.saturating_sub(unix_ms()));
    if left.is_zero() {
        Heed::Nothing
    } else {
        Heed::Wait(left.min(cap))
    }
}

/// Whether `p` leaves its task to another pool than `pool` of replica `me`, still now.
pub fn left_elsewhere(p: &Preference, me: &str, pool: &str) -> bool {
    !(p.replica == me && p.pool == pool) && p.until_unix_ms > unix_ms()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nudge(replica: &str, pool: &str, in_ms: i64) -> Vec<u8> {
        serde_json::to_vec(&Preference {
            replica: replica.into(),
            pool: pool.into(),
            until_unix_ms: (unix_ms() as i64 + in_ms) as u64,
        })
        .unwrap()
    }

    /// PLACE-8: the named pool looks at once; any other waits out the head start, at most
    /// its own cap; a nudge without a name, or one whose head start is over, holds nobody.
    #[test]
    fn a_task_is_left_to_another_pool_until_its_head_start_ends() {
        let p = |replica: &str, pool: &str, in_ms: i64| Preference {
            replica: replica.into(),
            pool: pool.into(),
            until_unix_ms: (unix_ms() as i64 + in_ms) as u64,
        };
        assert!(left_elsewhere(&p("r0", "p", 1000), "r1", "p"));
        assert!(left_elsewhere(&p("r1", "q", 1000), "r1", "p"));
        assert!(!left_elsewhere(&p("r1", "p", 1000), "r1", "p"), "its own");
        assert!(!left_elsewhere(&p("r0", "p", -1), "r1", "p"), "ended");
    }

    #[test]
    fn only_the_pools_not_named_wait_and_never_past_the_cap() {
        let cap = Duration::from_millis(50);
        assert_eq!(heed(&nudge("r1", "p", 40), "r1", "p", cap), Heed::Mine);
        let Heed::Wait(other) = heed(&nudge("r1", "p", 40), "r2", "p", cap) else {
            panic!("another replica's pool waits");
        };
        assert!(other > Duration::from_millis(20) && other <= Duration::from_millis(40));
        // another pool of the named replica waits too
        assert!(matches!(
            heed(&nudge("r1", "p", 40), "r1", "q", cap),
            Heed::Wait(_)
        ));
        assert_eq!(
            heed(&nudge("r1", "p", 60_000), "r2", "p", cap),
            Heed::Wait(cap)
        );
        assert_eq!(heed(&nudge("r1", "p", -5), "r2", "p", cap), Heed::Nothing);
        assert_eq!(heed(b"", "r2", "p", cap), Heed::Nothing);
        assert_eq!(
            heed(&nudge("r1", "p", 40), "r2", "p", Duration::ZERO),
            Heed::Nothing
        );
        assert_eq!(heed(b"{not json", "r2", "p", cap), Heed::Nothing);
    }
}
