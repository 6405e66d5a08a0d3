//! The line re-played at the pace the pools show now (ORCH-ADM-DL-6).
//!
//! Admission predicts with what the pools measured before: at load (an idle machine, short
//! probe prompts) or from tasks that ended. Under a burst the real pace can be several times
//! slower (in the overload bench: ~70 ms a step against the 17 the load-time probe measured),
//! and tasks admitted on the old pace would wait in line until their start budget ran out,
//! then leave with a 504 having spent most of their client's time. Once the pace is settled
//! (eta.rs: the running tasks show theirs, and a full pool's pace was seen on real tasks —
//! ended ones, or most of a full pool's over `SETTLE_GAPS` gaps; the first second of a burst,
//! with its clients starting on the same machine, reads slower than what follows, so a few
//! gaps are not acted on), the dispatcher plays the line forward
//! again — queued tasks and kept places in dispatch order — and sends back at once, with a 429
//! and the wait that would fit, every queued task now predicted to start later than it may
//! (by more than a tolerance). A task sent back keeps its place for the retry and costs no
//! compute; its turn still counts in the line, so each one behind it is advised its own later
//! wait.

use std::collections::HashMap;
use std::time::Instant;

use contracts::ErrorCode;
use pool_manager::PoolSnapshot;

use crate::lifecycle::deadline;
use crate::lifecycle::eta::{Line, Need, PoolLine};
use crate::lifecycle::queue::InLine;
use crate::lifecycle::state::SharedLifecycle;
use crate::metrics;

/// How far past its start budget a task must be predicted before it is sent back: a tenth of
/// the budget, and at least this (the pace read from a few tokens is noisy).
const MIN_TOLERANCE_MS: u64 = 250;

fn tolerance_ms(allowed_ms: u64) -> u64 {
    (allowed_ms / 10).max(MIN_TOLERANCE_MS)
}

/// Re-plays the line and sends back the queued tasks that would start too late. Does nothing
/// for pools whose pace is not settled (eta.rs: the running tasks show theirs, and a full
/// pool's pace was seen on real tasks); the dispatcher's start budgets cover those.
pub fn shed_late(state: &SharedLifecycle) {
    let line = state.queue.line();
    if !line
        .iter()
        .any(|i| matches!(i, InLine::Task(t) if t.start_by.is_some()))
    {
        return;
    }
    // a kept place is a task like the usual one, in every line
    let kept = Need {
        max_tokens: state.cfg.admission.default_max_tokens as usize,
        prompt_tokens: 0,
    };
    let now = Instant::now();
    // one line per set of pools that could run a task: its pin, or its model (the pools'
    // snapshots are taken once per line, not per queued task)
    let mut lines: HashMap<(Option<&str>, Option<&str>), Option<Line>> = HashMap::new();
    let mut kept_so_far = 0;
    for item in &line {
        match item {
            InLine::Kept => {
                kept_so_far += 1;
                for l in lines.values_mut().flatten() {
                    l.take(kept);
                }
            }
            InLine::Task(task) => {
                // a pin decides the pools alone (as in `candidate_snapshots`)
                let key = match task.pin.as_deref() {
                    Some(pin) => (Some(pin), None),
                    None => (None, task.model.as_deref()),
                };
                let Some(l) = lines.entry(key).or_insert_with(|| {
                    // the kept places met so far are ahead of this line's first task
                    let mut l = settled_line(state, &state.candidate_snapshots(task))?;
                    for _ in 0..kept_so_far {
                        l.take(kept);
                    }
                    Some(l)
                }) else {
                    continue;
                };
                let need = Need {
                    max_tokens: task.spec.max_tokens,
                    prompt_tokens: task.prompt_tokens,
                };
                let Some(start_by) = task.start_by else {
                    l.take(need);
                    continue;
                };
                let allowed = start_by.saturating_duration_since(now).as_millis() as u64;
                let predicted = l.next_start_ms();
                if predicted <= allowed + tolerance_ms(allowed)
                    || task.is_terminal()
                    || task.last_attempt
                {
                    l.take(need);
                    continue;
                }
                let retry = deadline::retry_after_ms(predicted - allowed, allowed);
                let sent_back = state.fail_task(
                    task,
                    ErrorCode::AdmissionReject,
                    format!(
                        "the line is slower than admission predicted: at the pace the running tasks show, a slot frees for this task in {predicted} ms, past the {allowed} ms it may still wait: come back in {retry} ms"
                    ),
                    true,
                    Some(retry),
                );
                if sent_back {
                    metrics::shed();
                    deadline::keep_place(state, task.rank, retry, task.claimant);
                    tracing::debug!(
                        task_id = %task.id,
                        predicted_start_ms = predicted,
                        allowed_wait_ms = allowed,
                        retry_after_ms = retry,
                        "sent back: the line re-played at the measured pace starts it too late"
                    );
                }
                // its place is kept: the retry takes its turn, and those behind it are advised
                // to come back after it (one wait each, not one for all)
                l.take(need);
            }
        }
    }
}

/// The line of these pools when its pace is settled; `None` otherwise.
fn settled_line(state: &SharedLifecycle, snapshots: &[PoolSnapshot]) -> Option<Line> {
    let pools: Vec<PoolLine<'_>> = snapshots
        .iter()
        .map(|s| PoolLine {
            snapshot: s,
            in_slots: state.running.in_slots(&s.id),
        })
        .collect();
    Line::new(&pools, state.cfg.admission.probe_pace_factor).filter(Line::is_settled)
}
