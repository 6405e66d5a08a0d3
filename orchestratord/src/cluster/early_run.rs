//! A run started before its admission was answered (CLU-PATH-2, `run_here.rs`), and the
//! back-off after such runs missed: when an early run here last missed, per queue.

use std::sync::Arc;

use crate::lifecycle::task::Task;

/// How long after an early run here missed (its task refused, or another task first in its
/// queue) the admissions into that queue start their runs only once the take brought them:
/// under a flood most early runs would be withdrawn, each a prefill for nothing.
const MISSED_LATELY: std::time::Duration = std::time::Duration::from_millis(500);
/// Queues remembered at most (past it the map is emptied).
const MAX_MISS_MARKS: usize = 1024;

/// When an early run here last missed, per queue.
#[derive(Default)]
pub(super) struct EarlyMisses(
    std::sync::Mutex<std::collections::HashMap<String, tokio::time::Instant>>,
);

impl EarlyMisses {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, tokio::time::Instant>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An early run for `queue` missed at `now`.
    pub(super) fn missed(&self, queue: &str, now: tokio::time::Instant) {
        let mut m = self.lock();
        if m.len() >= MAX_MISS_MARKS && !m.contains_key(queue) {
            m.clear();
        }
        m.insert(queue.to_string(), now);
    }

    /// Whether one missed for `queue` within [`MISSED_LATELY`] of `now`.
    pub(super) fn recent(&self, queue: &str, now: tokio::time::Instant) -> bool {
        self.lock()
            .get(queue)
            .is_some_and(|&at| now.saturating_duration_since(at) < MISSED_LATELY)
    }
}

/// A run started on a slot here before its admission was answered (`start_early`).
pub(super) struct Early {
    pub(super) pool: String,
    pub(super) run: Arc<Task>,
    /// Its first event to put on the relay.
    pub(super) from: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::{Duration, Instant};

    #[test]
    fn a_miss_holds_early_runs_back_for_a_moment_and_per_queue() {
        let m = EarlyMisses::default();
        let t0 = Instant::now();
        assert!(!m.recent("q", t0), "no miss yet");
        m.missed("q", t0);
        assert!(m.recent("q", t0 + Duration::from_millis(499)));
        assert!(
            !m.recent("q", t0 + MISSED_LATELY),
            "over after MISSED_LATELY"
        );
        assert!(!m.recent("other", t0), "another queue is not held back");
        // bounded: past MAX_MISS_MARKS queues the marks start again
        for i in 0..MAX_MISS_MARKS {
            m.missed(&format!("q{i}"), t0);
        }
        assert!(m.lock().len() <= MAX_MISS_MARKS);
    }
}
