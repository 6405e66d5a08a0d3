//! Deadline-aware admission: how long a task may wait for a slot, how long it is predicted to
//! wait, and the refusal when the prediction misses (ORCH-ADM-DL-1..3).
//!
//! A task's deadlines are the earliest of: `deadline_ms` (task API: the task must end by then),
//! the client's stated timeout (`patience.rs`: for a stream its first token must come by
//! then, for a whole answer its end) and `admission.max_queue_wait_ms` (the longest wait for
//! a slot, on by default). Admission plays the line forward (eta.rs) and refuses at once —
//! 429 with `Retry-After`, `retry-after-ms` and `X-Backoff-Ms` — when the predicted start
//! leaves no time to answer; the refused request's place in line is kept for its retry
//! (queue.rs). A task admitted with a start budget that a slower-than-predicted line eats up
//! leaves the queue when the budget is gone (dispatcher.rs), before it costs any compute.

use std::time::{Duration, Instant};

use contracts::{ErrorCode, Priority};
use pool_manager::{Pool, PoolSnapshot};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::lifecycle::eta::{self, Need, PoolLine};
use crate::lifecycle::queue::Promised;
use crate::lifecycle::state::SharedLifecycle;
use crate::lifecycle::task::Claimant;
use crate::metrics;

/// How the answer reaches the client: what its timeout is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Token by token: the client's timeout bounds the wait for the first token.
    Streamed,
    /// All at once at the end: the client's timeout bounds the whole task.
    Whole,
}

impl Delivery {
    /// `Streamed` when the request asked for a stream, else `Whole`.
    pub fn of(stream: bool) -> Self {
        if stream {
            Self::Streamed
        } else {
            Self::Whole
        }
    }
}

/// Shortest wait a refusal advises: a client coming back sooner would meet the same line.
const MIN_RETRY_MS: u64 = 500;

/// How much longer than the line's excess a refusal advises to wait, as a share of the excess,
/// on top of half the allowed wait. Predictions drift as the pool's measured pace settles
/// under a new load (+8 % between a refusal and its retry in the overload bench; a burst that
/// meets only the load-time pace is 2× slower than it predicted); a client advised too short
/// a wait is refused again and spends a retry — its last one is the client lost.
const RETRY_SLACK: f64 = 0.25;

/// The longest wait a refusal advises: the `openai` and `anthropic` SDKs honour a
/// `retry-after-ms` up to 60 s and fall back to their own short backoff above it (a client
/// that far back is better told to come back in a minute and be told again).
const MAX_RETRY_MS: u64 = 60_000;

/// The wait a refusal advises when the predicted start is `excess_ms` past the `allowed_ms` the
/// client may wait: the line must shorten by the excess, then half the allowed wait more, so
/// that the client comes back with its predicted start mid-window (time to spare on both sides
/// of the prediction), and a quarter of the excess for the pace's drift; between
/// [`MIN_RETRY_MS`] and [`MAX_RETRY_MS`]. Coming back later than needed costs the client
/// nothing in a full line — it waits at home instead of in the queue — while coming back too
/// early costs it an attempt (measured: with a spare of a quarter of the excess at most, 16
/// and 24 of 64 SDK clients spent all three attempts on refusals in two of four overload
/// runs; their line was mispredicted by half a turnover of the slots).
pub fn retry_after_ms(excess_ms: u64, allowed_ms: u64) -> u64 {
    let drift = (excess_ms as f64 * RETRY_SLACK).ceil() as u64;
    (excess_ms + drift + allowed_ms / 2).clamp(MIN_RETRY_MS, MAX_RETRY_MS)
}

/// What admission planned for a task's place and time.
pub struct Plan<'a> {
    /// Its place in line (a claimed place for a retry, else now).
    pub rank: Instant,
    /// Whether `predicted_start` comes from a measured pace (else it is an estimate).
    pub measured: bool,
    /// The predicted wait for a slot.
    pub predicted_start: Duration,
    /// The longest it may wait for a slot before answering in time becomes impossible.
    pub start_budget: Option<Duration>,
    /// Whether that is the server's longest queue wait (not the client's time): a task
    /// waiting for its pool's load waits for the load however long it takes (ISO-7).
    pub start_budget_servers: bool,
    /// The longest predicted wait for a slot it is admitted with (the tightest of its
    /// limits); `None` without a limit, or on the client's last attempt (queued however late
    /// it is predicted). A replica checks the cluster's line against it (`cluster_port.rs`).
    pub wait_allowed: Option<Duration>,
    /// Its place in line, promised until its task is queued (counted ahead of admissions
    /// that plan meanwhile); drop it after the push.
    pub promised: Promised<'a>,
}

/// One limit on a task's wait for a slot.
struct Bound {
    /// The limit, from now.
    limit_ms: u64,
    /// What the answer needs once a slot is taken (first token, decode, margin), at the pace
    /// of one sequence alone: more than the limit, and no wait would do.
    need_alone_ms: u64,
    /// The same at the pace the task is expected to run at beside the others.
    need_ms: u64,
    /// What set it, for the message.
    why: String,
    /// Whether a queued task leaves the queue once it is spent: the client's timeout and the
    /// longest queue wait do; `deadline_ms` does not (a task that stops early may still end
    /// in time, and one that does not ends `DEADLINE_UNMET`).
    expires_queue: bool,
    /// Whether the server set it (the longest queue wait), not the client.
    servers: bool,
}

impl Bound {
    /// The longest wait it allows (negative: even no wait would not do at the expected
    /// pace). A limit that only a pace no real task confirmed says cannot be met allows a
    /// free slot now: the task runs, and what it shows is the pace from then on.
    fn allowed_ms(&self, confirmed: bool) -> i128 {
        if !confirmed && self.limit_ms < self.need_alone_ms {
            return 0;
        }
        self.limit_ms as i128 - self.need_ms as i128
    }
}

/// What a task must fit in, from its request and its client.
pub struct Limits {
    /// `deadline_ms`: the task must end within it.
    pub end_within: Option<Duration>,
    pub max_tokens: usize,
    /// Prompt tokens (an estimate from its size: no tokenizer has run yet).
    pub prompt_tokens: usize,
    pub priority: Priority,
    /// In a cluster: another replica's pool that could run it confirmed its pace on a real
    /// task (what refuses a limit for good, as this replica's own pools would).
    pub confirmed_elsewhere: bool,
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

/// Longest a kept place outlives the advised wait unclaimed.
const MAX_PLACE_GRACE: Duration = Duration::from_secs(5);

/// Keeps the place in line of a request refused with advice to come back after
/// `retry_after_ms`, when its client can claim it (`claimant`, see `Caller::claimant`): for
/// that long plus a grace (half the wait, between 1 and 5 s). A client whose retry would not
/// say it is one gets no place: it could never claim it, and the place would only stand
/// ahead of everyone else (issue 32: two loops without retry headers kept 64 places and an
/// idle pool refused every client).
pub fn keep_place(
    state: &SharedLifecycle,
    rank: Instant,
    retry_after_ms: u64,
    claimant: Option<Claimant>,
) {
    let Some(claimant) = claimant else {
        return;
    };
    let wait = Duration::from_millis(retry_after_ms);
    let grace = (wait / 2).clamp(Duration::from_secs(1), MAX_PLACE_GRACE);
    if state
        .queue
        .keep_place(rank, Instant::now() + wait + grace, claimant)
    {
        metrics::retry_place("kept");
    }
}

/// Plans the task's place and predicted start, or refuses it: 422 `DEADLINE_UNMET` when even
/// an idle pool could not answer in time, 429 `ADMISSION_REJECT` (policy `deadline`) when the
/// line ahead is the reason. Steps: its place in line, what is ahead of it, what its answer
/// needs once it has a slot, the limits that need must fit, then the line played forward.
pub fn plan<'a>(
    state: &'a SharedLifecycle,
    pools: &[std::sync::Arc<Pool>],
    snapshots: &[PoolSnapshot],
    limits: &Limits,
    caller: &Caller,
    delivery: Delivery,
) -> Result<Plan<'a>, ApiError> {
    let rank = place_in_line(state, caller);
    let refuse = |e: ApiError, keep: Option<u64>| {
        if let Some(retry) = keep {
            keep_place(state, rank, retry, Claimant::of(caller));
        }
        metrics::rejected(e.code());
        e
    };
    let (ahead, promised) = line_ahead(state, snapshots, limits, caller, rank);
    let lines: Vec<PoolLine<'_>> = pools
        .iter()
        .zip(snapshots)
        .map(|(p, s)| PoolLine {
            snapshot: s,
            in_slots: state.running.in_slots(p.id()),
        })
        .collect();
    let probe_factor = state.cfg.admission.probe_pace_factor;
    let need = answer_needs(snapshots, &lines, ahead.len(), limits, probe_factor);
    let confirmed = eta::pace_confirmed(snapshots) || limits.confirmed_elsewhere;
    let measured = eta::pace_measured(snapshots) || limits.confirmed_elsewhere;
    let bounds = bounds_of(state, limits, caller, delivery, &need);
    if let Some(e) = unmeetable(&bounds, confirmed) {
        return Err(refuse(e, None));
    }
    let budget = bounds.iter().min_by_key(|b| b.allowed_ms(confirmed));
    let queue_bound = bounds
        .iter()
        .filter(|b| b.expires_queue)
        .min_by_key(|b| b.allowed_ms(confirmed));
    let predicted = eta::predict_start_ms(&lines, &ahead, probe_factor).unwrap_or(0);
    let wait_allowed = budget
        .filter(|_| !caller.patience.is_last_attempt())
        .map(|b| Duration::from_millis(b.allowed_ms(confirmed).clamp(0, u64::MAX as i128) as u64));
    // a replica of a cluster sees only its own slots and none of the cluster's queue: the
    // line is checked against the cluster's once the task has its place there (`wait_allowed`)
    let clustered = state.cluster_tasks.get().is_some();
    if let Some(b) = budget.filter(|_| !clustered) {
        let late = Late {
            predicted,
            allowed: b.allowed_ms(confirmed),
            ahead: ahead.len(),
            measured,
        };
        if let Some((e, retry)) = too_late(&late, b, caller) {
            return Err(refuse(e, Some(retry)));
        }
    }
    Ok(Plan {
        rank,
        measured,
        predicted_start: Duration::from_millis(predicted),
        start_budget: queue_bound
            .map(|b| Duration::from_millis(b.allowed_ms(confirmed).max(0) as u64)),
        start_budget_servers: queue_bound.is_some_and(|b| b.servers),
        wait_allowed,
        promised,
    })
}

/// Its place in line: a place kept for this client's retry when it claims one, else now.
fn place_in_line(state: &SharedLifecycle, caller: &Caller) -> Instant {
    let now = Instant::now();
    match (caller.patience.is_retry(), Claimant::of(caller)) {
        (true, Some(claimant)) => match state.queue.claim_place(now, claimant) {
            Some(kept) => {
                metrics::retry_place("claimed");
                kept
            }
            None => now,
        },
        _ => now,
    }
}

/// What is ahead of a task at `rank`, in the order the slots will take them — queued tasks,
/// its own tenant's admissions being prepared, and kept places — and its own place promised
/// until its task is queued.
fn line_ahead<'a>(
    state: &'a SharedLifecycle,
    snapshots: &[PoolSnapshot],
    limits: &Limits,
    caller: &Caller,
    rank: Instant,
) -> (Vec<Need>, Promised<'a>) {
    let (ahead, promised) = state.queue.ahead_of(
        caller.tenant(),
        limits.priority,
        rank,
        (limits.max_tokens, limits.prompt_tokens),
    );
    let mut needs: Vec<Need> = ahead
        .tasks
        .iter()
        .map(|t| Need {
            max_tokens: t.spec.max_tokens,
            prompt_tokens: t.prompt_tokens,
        })
        .chain(
            ahead
                .promised
                .iter()
                .map(|&(max_tokens, prompt_tokens)| Need {
                    max_tokens,
                    prompt_tokens,
                }),
        )
        .collect();
    // a kept place: a task like this one (its size is all we know of the refused); kept
    // places never stand before a free slot: while the tasks really ahead leave one free,
    // this task takes it (a place is a promise to a client that may not come back)
    let free_now: usize = snapshots.iter().map(|s| s.slots_free()).sum();
    if needs.len() >= free_now {
        let kept = Need {
            max_tokens: state.cfg.admission.default_max_tokens as usize,
            prompt_tokens: limits.prompt_tokens,
        };
        needs.extend(std::iter::repeat_n(kept, ahead.kept_places));
    }
    (needs, promised)
}

/// What an answer needs once it has a slot, in ms: its first token and the whole of it, at
/// the pace of one sequence alone and at the pace expected beside the tasks running and the
/// `ahead` waiting (issue 33: a whole answer admitted on the mean pace ran at a full pool's
/// and missed its deadline).
struct Needs {
    first_alone: u64,
    whole_alone: u64,
    first: u64,
    whole: u64,
}

fn answer_needs(
    snapshots: &[PoolSnapshot],
    lines: &[PoolLine<'_>],
    ahead: usize,
    limits: &Limits,
    probe_factor: f64,
) -> Needs {
    let alone = eta::solo_ms_per_token(snapshots).unwrap_or(0.0);
    let beside = eta::run_ms_per_token(lines, ahead, probe_factor).unwrap_or(alone);
    let per_prompt_token =
        eta::mean_prefill_ms_per_token(snapshots).unwrap_or(alone * eta::PREFILL_SHARE_OF_A_STEP);
    let needs = |per_token: f64| {
        let first = (per_token + limits.prompt_tokens as f64 * per_prompt_token) as u64;
        (first, first + (per_token * limits.max_tokens as f64) as u64)
    };
    let ((first_alone, whole_alone), (first, whole)) = (needs(alone), needs(beside));
    Needs {
        first_alone,
        whole_alone,
        first,
        whole,
    }
}

/// The limits a task's wait must fit: its `deadline_ms`, its client's stated timeout (for a
/// stream its first token, else its end; with the margin kept in hand), the longest queue
/// wait.
fn bounds_of(
    state: &SharedLifecycle,
    limits: &Limits,
    caller: &Caller,
    delivery: Delivery,
    need: &Needs,
) -> Vec<Bound> {
    let margin_ms = state.cfg.admission.deadline_margin_ms;
    let mut bounds: Vec<Bound> = Vec::with_capacity(3);
    if let Some(end) = limits.end_within {
        bounds.push(Bound {
            limit_ms: ms(end),
            need_alone_ms: need.whole_alone,
            need_ms: need.whole,
            why: format!("deadline_ms {}", ms(end)),
            expires_queue: false,
            servers: false,
        });
    }
    if let Some((timeout, source)) = caller.patience.timeout {
        let (need_alone_ms, need_ms) = match delivery {
            Delivery::Streamed => (need.first_alone, need.first),
            Delivery::Whole => (need.whole_alone, need.whole),
        };
        bounds.push(Bound {
            limit_ms: ms(timeout),
            need_alone_ms: need_alone_ms + margin_ms,
            need_ms: need_ms + margin_ms,
            why: format!(
                "the client's timeout of {} ms ({})",
                ms(timeout),
                source.as_str()
            ),
            expires_queue: true,
            servers: false,
        });
    }
    let max_wait = state.cfg.admission.max_queue_wait_ms;
    if max_wait > 0 {
        bounds.push(Bound {
            limit_ms: max_wait,
            need_alone_ms: 0,
            need_ms: 0,
            why: format!("the longest queue wait of {max_wait} ms"),
            expires_queue: true,
            servers: true,
        });
    }
    bounds
}

/// The 422 of a limit no wait at all would meet, at a pace real tasks showed (retrying cannot
/// help); a pace no real task confirmed refuses nothing for good (the task is tried on a free
/// slot).
fn unmeetable(bounds: &[Bound], confirmed: bool) -> Option<ApiError> {
    let b = bounds.iter().find(|b| b.limit_ms < b.need_alone_ms)?;
    if !confirmed {
        tracing::debug!(
            need_ms = b.need_alone_ms,
            limit_ms = b.limit_ms,
            "a limit the load-time pace says cannot be met: tried on a free slot, never refused for good"
        );
        return None;
    }
    Some(ApiError::new(
        ErrorCode::DeadlineUnmet,
        format!(
            "{} cannot be met even with no wait: predicted {} ms to answer ({} ms short)",
            b.why,
            b.need_alone_ms,
            b.need_alone_ms - b.limit_ms
        ),
        false,
    ))
}

/// The line played forward against the tightest limit.
struct Late {
    /// The predicted wait for a slot, ms.
    predicted: u64,
    /// The longest wait the limit allows, ms (negative: even no wait would not do at the
    /// expected pace).
    allowed: i128,
    /// Tasks ahead.
    ahead: usize,
    /// Whether the pace is measured (else the prediction is an estimate).
    measured: bool,
}

/// The 429 of a task whose predicted start is past what its tightest limit `b` allows, with
/// the wait to come back after — unless it is the client's last attempt (queued: it starts if
/// the line moves faster than predicted, and leaves before any compute when its start budget
/// ends) or the pace is an estimate (queued: once the running tasks show the pace the line is
/// played again, shed.rs).
fn too_late(late: &Late, b: &Bound, caller: &Caller) -> Option<(ApiError, u64)> {
    let Late {
        predicted,
        allowed,
        ahead,
        measured,
    } = *late;
    if predicted as i128 <= allowed {
        return None;
    }
    if caller.patience.is_last_attempt() || !measured {
        tracing::debug!(
            predicted_start_ms = predicted,
            allowed_wait_ms = allowed as i64,
            measured,
            "queued though predicted late: the client's last attempt, or an estimate"
        );
        if caller.patience.is_last_attempt() {
            metrics::retry_place("last_attempt_queued");
        }
        return None;
    }
    let excess = (predicted as i128 - allowed) as u64;
    let retry = retry_after_ms(excess, allowed.max(0) as u64);
    tracing::debug!(
        predicted_start_ms = predicted,
        allowed_wait_ms = allowed as i64,
        retry_after_ms = retry,
        retry_count = caller.patience.retry_count,
        ahead,
        "refused: the line is too long for the client's time"
    );
    let why = &b.why;
    let message = if allowed < 0 {
        format!(
            "with {ahead} ahead and the slots busy, an answer takes {} ms at the pace expected now, past {why}: come back in {retry} ms",
            b.need_ms
        )
    } else {
        format!(
            "the predicted wait for a slot ({predicted} ms, {ahead} ahead) leaves no time to answer within {why}: come back in {retry} ms"
        )
    };
    Some((
        ApiError::new(ErrorCode::AdmissionReject, message, true)
            .with_retry_after(retry)
            .with_policy("deadline"),
        retry,
    ))
}

/// The line of each of `pools` as this replica tells the others of a cluster (issue 38): when
/// its slots free up and what a task then holds one for (the mean of the pool's real tasks,
/// else an answer of `admission.default_max_tokens` at its pace, prompt aside); pools without
/// a measured pace are left out.
pub fn forecasts(
    state: &SharedLifecycle,
    pools: &[std::sync::Arc<Pool>],
) -> Vec<(String, eta::SlotForecast)> {
    let snapshots: Vec<PoolSnapshot> = pools.iter().map(|p| p.snapshot()).collect();
    let lines: Vec<PoolLine<'_>> = pools
        .iter()
        .zip(&snapshots)
        .map(|(p, s)| PoolLine {
            snapshot: s,
            in_slots: state.running.in_slots(p.id()),
        })
        .collect();
    let Some(line) = eta::Line::new(&lines, state.cfg.admission.probe_pace_factor) else {
        return Vec::new();
    };
    let typical = Need {
        max_tokens: state.cfg.admission.default_max_tokens as usize,
        prompt_tokens: 0,
    };
    pools
        .iter()
        .zip(&snapshots)
        .zip(line.forecasts(typical))
        .filter_map(|((p, snapshot), f)| {
            let f = f?;
            let f = eta::SlotForecast {
                // the pool's real tasks, as long as they held a slot of late, when measured
                task_ms: snapshot
                    .service_ms_ewma
                    .filter(|v| v.is_finite() && *v > 0.0)
                    .map_or(f.task_ms, |v| v.ceil() as u64),
                confirmed: snapshot.pace_confirmed,
                ..f
            };
            Some((p.id().to_string(), f))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ORCH-ADM-DL-2: the advised wait covers the excess, a quarter of it for drift and half
    /// the allowed wait (the client comes back with its start predicted mid-window), within
    /// 0.5–60 s.
    #[test]
    fn the_advised_wait_covers_the_excess_within_what_sdks_honour() {
        assert_eq!(retry_after_ms(4000, 14_000), 4000 + 1000 + 7000);
        // a line just over the window: back mid-window, not a moment after the excess
        assert_eq!(retry_after_ms(400, 14_000), 400 + 100 + 7000);
        assert_eq!(retry_after_ms(10, 0), MIN_RETRY_MS);
        assert_eq!(retry_after_ms(50_000, 14_000), MAX_RETRY_MS);
    }
}
