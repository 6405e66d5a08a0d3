//! The tasks in a slot now, by pool: what admission's start predictions read (eta.rs). An
//! index only — each task's own record says whether it runs; the runner enters a task here
//! when it starts and the guard takes it out however the run ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::lifecycle::eta::InSlot;
use crate::lifecycle::task::{Task, PACE_FROM_TOKEN};

/// Token gaps a task's pace is read over, at least (fewer are too noisy to act on).
const PACE_MIN_GAPS: u32 = 4;

#[derive(Default)]
pub struct RunningTasks {
    by_pool: Mutex<HashMap<String, Vec<Arc<Task>>>>,
}

/// Takes its task out of the index when dropped.
pub struct Entered<'a> {
    set: &'a RunningTasks,
    pool: String,
    task: Arc<Task>,
}

impl RunningTasks {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<Arc<Task>>>> {
        self.by_pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `task` as running on `pool` until the returned guard drops.
    pub fn enter(&self, pool: &str, task: &Arc<Task>) -> Entered<'_> {
        self.lock()
            .entry(pool.to_string())
            .or_default()
            .push(task.clone());
        Entered {
            set: self,
            pool: pool.to_string(),
            task: task.clone(),
        }
    }

    /// How far each task running on `pool` got: its limit, prompt, tokens produced, time in
    /// the slot and its own time per token (from token [`PACE_FROM_TOKEN`] on, once it has
    /// [`PACE_MIN_GAPS`] gaps). A task that has ended (a drain's deadline, a cancel) is not in
    /// it, though its runner may not have returned yet: whether its row is still taken is the
    /// engine's count (`slots_busy`), not a whole task's time left.
    pub fn in_slots(&self, pool: &str) -> Vec<InSlot> {
        let tasks: Vec<Arc<Task>> = self.lock().get(pool).cloned().unwrap_or_default();
        let now = Instant::now();
        tasks
            .iter()
            .filter_map(|t| {
                let g = t.lock();
                if g.is_terminal() {
                    return None;
                }
                let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
                let gaps = g.tokens_out.saturating_sub(PACE_FROM_TOKEN + 1);
                let ms_per_token_now = match (g.pace_from_at, g.last_token_at) {
                    (Some(a), Some(b)) if gaps >= PACE_MIN_GAPS => Some(ms(b - a) / gaps as f64),
                    _ => None,
                };
                Some(InSlot {
                    max_tokens: t.spec.max_tokens,
                    prompt_tokens: t.prompt_tokens,
                    tokens_out: g.tokens_out as usize,
                    placed_ms_ago: g.placed_at.map_or(0.0, |p| ms(now - p)),
                    ms_per_token_now,
                    pace_gaps: if ms_per_token_now.is_some() {
                        gaps as usize
                    } else {
                        0
                    },
                })
            })
            .collect()
    }

    /// The tasks running on `pool` now, in the order they started (ended ones left out).
    pub fn tasks_on(&self, pool: &str) -> Vec<Arc<Task>> {
        let tasks: Vec<Arc<Task>> = self.lock().get(pool).cloned().unwrap_or_default();
        tasks.into_iter().filter(|t| !t.is_terminal()).collect()
    }

    /// The tenants of the tasks running now, one entry a task.
    pub fn owners(&self) -> Vec<String> {
        self.lock()
            .values()
            .flatten()
            .map(|t| t.owner.clone())
            .collect()
    }

    /// Tasks running now, across pools.
    pub fn len(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        let mut g = self.set.lock();
        if let Some(v) = g.get_mut(&self.pool) {
            v.retain(|t| !Arc::ptr_eq(t, &self.task));
            if v.is_empty() {
                g.remove(&self.pool);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// ORCH-ADM-DL-6: a task's own pace is read from its 4th token on, once it has 4 gaps: the
    /// slow first gaps (other prompts of a burst prefilled meanwhile) do not count.
    #[test]
    fn a_pace_is_read_after_the_start_up_gaps() {
        let set = RunningTasks::default();
        let task = crate::lifecycle::task::test_task("t", None);
        let _in = set.enter("p", &task);
        let pace = || set.in_slots("p")[0].ms_per_token_now;
        // four tokens 60 ms apart: a burst's start-up
        for i in 0..4 {
            if i > 0 {
                std::thread::sleep(Duration::from_millis(60));
            }
            assert!(task.push_token("x".into()));
        }
        assert_eq!(pace(), None, "no gap after the 4th token yet");
        // then four as fast as they come (read from the first token: 180 ms / 7 = 26 ms each)
        for _ in 0..4 {
            assert!(task.push_token("x".into()));
        }
        let ms = pace().expect("4 gaps after the 4th token");
        assert!(ms < 5.0, "the start-up gaps are not in it: {ms} ms a token");
    }

    /// ORCH-ADM-DL-6: a task that has ended no longer holds a place in the prediction, even
    /// while its runner has not let go of it (a drain ended it; the pool resumes at once).
    #[test]
    fn an_ended_task_is_not_predicted_to_hold_its_slot() {
        let set = RunningTasks::default();
        let task = crate::lifecycle::task::test_task("t", None);
        let _in = set.enter("p", &task);
        assert!(task.push_token("x".into()));
        assert_eq!(set.in_slots("p").len(), 1);
        assert!(task.finish("cancelled", None));
        assert!(
            set.in_slots("p").is_empty(),
            "ended: its row is the engine's count"
        );
        assert_eq!(
            set.len(),
            1,
            "the index entry itself goes with the runner's guard"
        );
    }
}
