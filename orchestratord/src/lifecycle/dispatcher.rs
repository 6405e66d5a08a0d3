//! The dispatcher: takes queued tasks, in priority order, onto free pool slots.

use std::time::{Duration, Instant};

use contracts::ErrorCode;
use tracing::Instrument;

use crate::lifecycle::placement::{place, Placement};
use crate::lifecycle::runner;
use crate::state::SharedState;

/// How often the dispatcher looks even without a wake-up (deadlines, sweeps, gauges).
const TICK: Duration = Duration::from_millis(200);

pub async fn run(state: SharedState) {
    let mut last_sweep = Instant::now();
    loop {
        let woken = state.wake.notified();
        dispatch_once(&state);
        if last_sweep.elapsed() >= Duration::from_secs(1) {
            state.tasks.sweep();
            state.sessions.sweep();
            state.publish_pool_gauges();
            last_sweep = Instant::now();
        }
        tokio::select! {
            _ = woken => {}
            _ = tokio::time::sleep(TICK) => {}
        }
    }
}

/// One pass over the queue.
pub fn dispatch_once(state: &SharedState) {
    let now = Instant::now();
    for task in state.queue.in_order() {
        if task.is_terminal() {
            state.queue.remove(&task);
            continue;
        }
        if task.deadline.is_some_and(|d| now >= d) {
            state.fail_task(
                &task,
                ErrorCode::DeadlineUnmet,
                "the deadline passed while the task was queued",
                false,
                None,
            );
            continue;
        }
        match place(state, &task) {
            Placement::Wait => {
                if let Some(limit) = state.workers.queue_timeout_for(state, &task) {
                    if task.lock().queued_since.elapsed() >= limit {
                        state.fail_task(
                            &task,
                            ErrorCode::QueueTimeout,
                            format!(
                                "queue timeout: no worker available within {} ms",
                                limit.as_millis()
                            ),
                            true,
                            Some(1000),
                        );
                    }
                }
            }
            Placement::Unavailable(code, why) => {
                state.fail_task(&task, code, why, true, Some(1000));
            }
            Placement::Leased(lease) => {
                if !state.queue.remove(&task) {
                    // cancelled between the snapshot and now: the lease drops here
                    continue;
                }
                let span = tracing::info_span!(
                    "task",
                    task_id = %task.id,
                    correlation_id = %task.correlation_id,
                    pool = %lease.pool().id()
                );
                tokio::spawn(runner::run(state.clone(), task, lease).instrument(span));
            }
        }
    }
}
