//! The dispatcher: takes queued tasks, in priority order, onto free pool slots.

use std::time::{Duration, Instant};

use contracts::ErrorCode;
use tracing::Instrument;

use crate::lifecycle::deadline;
use crate::lifecycle::eta;
use crate::lifecycle::placement::{place, Placement};
use crate::lifecycle::runner;
use crate::lifecycle::shed;
use crate::lifecycle::state::SharedLifecycle;
use crate::lifecycle::task::Task;

/// How often the dispatcher looks even without a wake-up (deadlines, sweeps, gauges).
const TICK: Duration = Duration::from_millis(200);

/// How often at most the line is re-played at the measured pace (shed.rs).
const REPLAN_EVERY: Duration = Duration::from_millis(100);

pub async fn run(state: SharedLifecycle) {
    let mut last_sweep = Instant::now();
    let mut last_replan = Instant::now();
    loop {
        let woken = state.wake.notified();
        let next_due = dispatch_once(&state);
        if last_replan.elapsed() >= REPLAN_EVERY {
            shed::shed_late(&state);
            last_replan = Instant::now();
        }
        if last_sweep.elapsed() >= Duration::from_secs(1) {
            state.tasks.sweep();
            state.sessions.sweep();
            state.publish_pool_gauges();
            let running = state.running.owners();
            state
                .queue
                .fair()
                .publish_running(running.iter().map(String::as_str));
            last_sweep = Instant::now();
        }
        // a queued task's start budget ends between ticks: look again right then
        let nap = next_due.map_or(TICK, |at| {
            at.saturating_duration_since(Instant::now()).min(TICK)
        });
        tokio::select! {
            _ = woken => {}
            _ = tokio::time::sleep(nap) => {}
        }
    }
}

/// A queued task that can no longer start in time for its client (or waited the longest
/// queue wait) leaves before it costs any compute, with a retriable `QUEUE_TIMEOUT` and a
/// wait to come back after; its place in line is kept for the retry (ORCH-ADM-DL-3).
fn start_budget_spent(state: &SharedLifecycle, task: &Task) {
    let typical = state.cfg.admission.default_max_tokens as usize;
    let retry = eta::estimate(0, &state.candidate_snapshots(task), typical).retry_after_ms;
    let waited = task.submitted.elapsed().as_millis();
    if state.fail_task(
        task,
        ErrorCode::QueueTimeout,
        format!("no slot within the {waited} ms this task could wait to answer in time"),
        true,
        Some(retry),
    ) {
        deadline::keep_place(state, task.rank, retry, task.claimant);
    }
}

/// Whether every pool that could run `task` is loading (at start-up, or on demand): it waits
/// for the load rather than the server's longest queue wait.
fn waits_for_a_load(state: &SharedLifecycle, task: &Task) -> bool {
    let pools = state.candidate_snapshots(task);
    !pools.is_empty()
        && pools
            .iter()
            .all(|p| p.state == pool_manager::PoolState::Loading)
}

/// One pass over the queue. Returns when the earliest start budget of a task left waiting
/// runs out.
pub fn dispatch_once(state: &SharedLifecycle) -> Option<Instant> {
    let now = Instant::now();
    let mut next_due: Option<Instant> = None;
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
        if task.start_by.is_some_and(|d| now >= d)
            && task.lock().first_token_at.is_none()
            && !(task.start_by_servers && waits_for_a_load(state, &task))
        {
            start_budget_spent(state, &task);
            continue;
        }
        match place(state, &task) {
            Placement::Wait => {
                if let Some(at) = task.start_by {
                    next_due = Some(next_due.map_or(at, |n| n.min(at)));
                }
                if let Some(limit) = state.workers_port.queue_timeout_for(
                    &state.pools,
                    task.pin.as_deref(),
                    task.model.as_deref(),
                ) {
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
    next_due
}
