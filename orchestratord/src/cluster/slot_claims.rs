//! The free slots this replica's admissions are taking a task for (CLU-PATH-1): an
//! admission's take (`run_here.rs`) claims one of a pool's free slots before it pulls from the
//! queue and holds the claim until the task it pulled has a slot or was given back; the pool's
//! take loop (`taker.rs`) pulls only while a free slot is unclaimed, but claims none itself (a
//! loop that held claims across its looks at the queues made admissions miss their run here
//! and ask the stream for their place instead — slow while a stream changes leaders). Two
//! admissions on one replica so never count on the same free slot: before, two at one moment
//! with one slot free each pulled a task, one found the slot gone and gave its task back
//! (30–83 give-backs in a burst of 90 tasks through three one-slot replicas), each a nak, a
//! count in `given_back.rs` and a delivery more.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Claims on free slots, per pool of this replica.
#[derive(Clone, Default)]
pub(super) struct SlotClaims(Arc<Mutex<HashMap<String, usize>>>);

/// One claimed slot of a pool, until dropped.
pub(super) struct SlotClaim {
    claims: SlotClaims,
    pool: String,
}

impl SlotClaims {
    /// A claim on one of the `free` slots of `pool`, unless they are all claimed already.
    pub(super) fn claim(&self, pool: &str, free: usize) -> Option<SlotClaim> {
        let mut held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = held.entry(pool.to_string()).or_insert(0);
        if *n >= free {
            return None;
        }
        *n += 1;
        Some(SlotClaim {
            claims: self.clone(),
            pool: pool.to_string(),
        })
    }

    /// The free slots of `pool` no take claimed: of `free` now.
    pub(super) fn unclaimed(&self, pool: &str, free: usize) -> usize {
        let held = self.0.lock().unwrap_or_else(|e| e.into_inner());
        free.saturating_sub(held.get(pool).copied().unwrap_or(0))
    }
}

impl Drop for SlotClaim {
    fn drop(&mut self) {
        let mut held = self.claims.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&self.pool) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.pool);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_free_slot_is_claimed_once_until_let_go() {
        let claims = SlotClaims::default();
        let a = claims.claim("p", 2).expect("one of two");
        let b = claims.claim("p", 2).expect("the other");
        assert!(claims.claim("p", 2).is_none(), "both claimed");
        assert_eq!(claims.unclaimed("p", 2), 0);
        // another pool's slots are its own
        assert!(claims.claim("q", 1).is_some());
        drop(a);
        assert_eq!(claims.unclaimed("p", 2), 1);
        let c = claims.claim("p", 2).expect("the one let go");
        drop((b, c));
        assert_eq!(claims.unclaimed("p", 1), 1);
        assert!(
            claims.0.lock().unwrap().get("p").is_none(),
            "nothing kept for a pool"
        );
    }
}
