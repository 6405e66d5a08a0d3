//! Wait-time predictions from the measured service rate of the pools (EWMAs kept by
//! pool-manager: task service time, and decode time per token seeded by each pool's
//! self-test), never from a constant.
//!
//! A start is predicted by playing the line forward: every slot of the pools that could run
//! the task frees up when the task in it has produced the tokens it is expected to (the share
//! of its `max_tokens` the pool's finished tasks used), and each task ahead takes the first
//! slot to free up (ORCH-ADM-DL-2).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use pool_manager::PoolSnapshot;

/// Predictions for a queue position.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// Expected wait until a slot starts the task.
    pub predicted_start_ms: u64,
    /// Expected time until one queue place frees up (advice for a 429).
    pub retry_after_ms: u64,
}

/// Expected service time of one task on a pool, in ms.
fn service_ms(p: &PoolSnapshot, typical_tokens: usize) -> Option<f64> {
    p.service_ms_ewma
        .or_else(|| p.ms_per_token_ewma.map(|t| t * typical_tokens as f64))
        .filter(|v| v.is_finite() && *v > 0.0)
}

/// Estimates for a task with `position` tasks ahead of it, served by `pools` (the rate model:
/// what a 429 advises when no per-task picture is at hand).
pub fn estimate(position: usize, pools: &[PoolSnapshot], typical_tokens: usize) -> Estimate {
    let serving: Vec<&PoolSnapshot> = pools.iter().filter(|p| p.accepts_work).collect();
    let free: usize = serving.iter().map(|p| p.slots_free()).sum();
    // tasks finished per ms across the pools
    let rate: f64 = serving
        .iter()
        .filter_map(|p| service_ms(p, typical_tokens).map(|s| p.slots_total as f64 / s))
        .sum();
    if rate <= 0.0 {
        // nothing measured yet (no pool serving): advise a short retry
        return Estimate {
            predicted_start_ms: 0,
            retry_after_ms: 1000,
        };
    }
    let ahead = (position + 1).saturating_sub(free) as f64;
    Estimate {
        predicted_start_ms: (ahead / rate).ceil() as u64,
        retry_after_ms: (1.0 / rate).ceil().max(1.0) as u64,
    }
}

/// The mean of a measured, positive figure over the pools that take work.
fn mean_over(pools: &[PoolSnapshot], figure: impl Fn(&PoolSnapshot) -> Option<f64>) -> Option<f64> {
    let v: Vec<f64> = pools
        .iter()
        .filter(|p| p.accepts_work)
        .filter_map(figure)
        .filter(|t| t.is_finite() && *t > 0.0)
        .collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// Mean measured decode time per token of the pools that take work.
pub fn mean_ms_per_token(pools: &[PoolSnapshot]) -> Option<f64> {
    mean_over(pools, |p| p.ms_per_token_ewma)
}

/// Mean measured prefill time per prompt token of the pools that take work.
pub fn mean_prefill_ms_per_token(pools: &[PoolSnapshot]) -> Option<f64> {
    mean_over(pools, |p| p.prefill_ms_per_token_ewma)
}

/// A task in a slot now, as far as it got.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct InSlot {
    pub max_tokens: usize,
    pub prompt_tokens: usize,
    pub tokens_out: usize,
    /// Time since it took the slot.
    pub placed_ms_ago: f64,
    /// Its own recent time per token (running.rs: read from its 4th token on).
    pub ms_per_token_now: Option<f64>,
    /// The token gaps `ms_per_token_now` is read over (0 without it).
    pub pace_gaps: usize,
}

/// Token gaps most running tasks of a full pool must have read their pace over before it
/// settles the line without a task having ended at it (see `Pace::settled`): ~1 s of a
/// burst's decode here, where a task ends only after ~8 s.
pub const SETTLE_GAPS: usize = 16;

/// What a task waiting in line will need of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    pub max_tokens: usize,
    pub prompt_tokens: usize,
}

/// One pool as the line sees it: its snapshot and the tasks in its slots.
pub struct PoolLine<'a> {
    pub snapshot: &'a PoolSnapshot,
    pub in_slots: Vec<InSlot>,
}

/// Tokens a task with `max_tokens` is expected to produce on a pool whose finished tasks used
/// `share` of their limit (they stop at end of text before it).
fn expected_tokens(max_tokens: usize, share: Option<f64>) -> f64 {
    let m = max_tokens.max(1) as f64;
    share.map_or(m, |s| (m * s.clamp(0.0, 1.0)).max(1.0))
}

/// How fast a pool goes now: time per token (a full pool's, or the median of what its running
/// tasks show when slower; else its EWMA), time per prompt token (EWMA; else half a decode step, see deadline.rs) and the
/// share of `max_tokens` tasks use.
#[derive(Debug, Clone, Copy)]
struct Pace {
    per_token: f64,
    per_prompt_token: f64,
    share: Option<f64>,
    /// Prefills of other slots a task's life is expected to be stalled by, on top of its own,
    /// when `per_token` does not already include them (the load-time pace: every slot of a
    /// pool that serves a line turns over about once per task, and one engine runs one
    /// prefill at a time).
    stalls: f64,
    /// Whether the pace is settled: the running tasks show theirs, and a full pool's pace was
    /// seen on real tasks — tasks that ended in a full pool, or most tasks of a full pool
    /// reading theirs over [`SETTLE_GAPS`] gaps — not only the load-time probe (an idle
    /// machine, greedy 8-token answers: the first wave of the overload bench ran 1.3–1.8×
    /// slower than it, with 64 clients on the same cores).
    settled: bool,
}

impl Pace {
    fn of(line: &PoolLine<'_>, probe_factor: f64) -> Option<Self> {
        let p = line.snapshot;
        let positive = |v: &f64| v.is_finite() && *v > 0.0;
        let mut live: Vec<f64> = line
            .in_slots
            .iter()
            .filter_map(|s| s.ms_per_token_now)
            .filter(positive)
            .collect();
        live.sort_by(f64::total_cmp);
        // a wait in line is a wait for a full pool: its pace is a full pool's, or what the
        // running tasks show when that is slower
        let full = p.full_ms_per_token_ewma.filter(positive);
        let now = live.get(live.len() / 2).copied();

        // most tasks of a full pool read their pace over a second or so: what a wait in line
        // is paced by, seen, though no task ended at it yet
        let read_long = line.in_slots.len() >= p.slots_total.max(1)
            && 2 * line
                .in_slots
                .iter()
                .filter(|s| s.ms_per_token_now.is_some() && s.pace_gaps >= SETTLE_GAPS)
                .count()
                > line.in_slots.len();
        // without the load-time measurement (a lease cancelled it: traffic came first), the
        // running tasks' own pace settles the line once most of a full pool read it long
        let settled = now.is_some()
            && match full {
                Some(_) => !p.full_pace_from_probe_only || read_long,
                None => read_long,
            };
        // until the line settles, the load-time probe's pace is a lower bound of what a burst
        // will show: taken `probe_factor` times slower
        let full = match (settled, p.full_pace_from_probe_only) {
            (false, true) => full.map(|f| f * probe_factor.max(1.0)),
            _ => full,
        };
        let per_token = match (now, full) {
            (Some(a), Some(b)) => a.max(b),
            (a, b) => a.or(b).or(p.ms_per_token_ewma.filter(positive))?,
        };
        let probe_paced = now.is_none() && full.is_some() && p.full_pace_from_probe_only;
        let stalls = if probe_paced {
            p.slots_total.saturating_sub(1) as f64
        } else {
            0.0
        };
        let per_prompt_token = p
            .prefill_ms_per_token_ewma
            .filter(positive)
            .unwrap_or(per_token * PREFILL_SHARE_OF_A_STEP);
        Some(Self {
            per_token,
            per_prompt_token,
            share: p.used_share_ewma,
            stalls,
            settled,
        })
    }

    /// A whole task's time in a slot.
    fn service_ms(&self, n: Need) -> f64 {
        n.prompt_tokens as f64 * self.per_prompt_token * (1.0 + self.stalls)
            + expected_tokens(n.max_tokens, self.share) * self.per_token
    }

    /// What a task in a slot still needs.
    fn left_ms(&self, s: &InSlot) -> f64 {
        let total = expected_tokens(s.max_tokens, self.share)
            .max((s.tokens_out + 1).min(s.max_tokens) as f64);
        let decode = (total - s.tokens_out as f64).max(0.0) * self.per_token;
        if s.tokens_out > 0 {
            return decode;
        }
        let prefill = s.prompt_tokens as f64 * self.per_prompt_token - s.placed_ms_ago;
        prefill.max(0.0) + decode
    }
}

/// Prefill cost of a prompt token relative to a decode step, before any was measured: prompt
/// tokens go through the model together (about half a step each on CPU for the default
/// model: ~150 prompt tokens/s against ~80 decoded tokens/s).
pub const PREFILL_SHARE_OF_A_STEP: f64 = 0.5;

/// The slots of the pools that could run a task, played forward: when each frees up, and
/// what each task taken in line order holds it for.
pub struct Line {
    /// (time the slot frees up in µs from now, pool index)
    free_at: BinaryHeap<Reverse<(u64, usize)>>,
    paces: Vec<Option<Pace>>,
    /// Whether some pool's pace is settled (see `Pace::settled`).
    settled: bool,
}

impl Line {
    /// The line as it stands; `None` when no pool that takes work has a measured decode time.
    /// `probe_factor`: how many times slower than the load-time probe a pool whose pace is
    /// not settled is taken to go (`admission.probe_pace_factor`).
    pub fn new(pools: &[PoolLine<'_>], probe_factor: f64) -> Option<Self> {
        let mut free_at = BinaryHeap::new();
        let mut paces: Vec<Option<Pace>> = Vec::with_capacity(pools.len());
        let mut settled = false;
        for (i, line) in pools.iter().enumerate() {
            let p = line.snapshot;
            let pace = Pace::of(line, probe_factor).filter(|_| p.accepts_work);
            paces.push(pace);
            let Some(pace) = pace else {
                continue;
            };
            settled |= pace.settled;
            let busy = p.slots_busy.max(line.in_slots.len()).min(p.slots_total);
            for k in 0..p.slots_total {
                let left_ms = if k >= busy {
                    0.0
                } else {
                    match line.in_slots.get(k) {
                        Some(s) => pace.left_ms(s),
                        // placed, not yet seen running: a whole task, as long as the last ones
                        None => p.service_ms_ewma.unwrap_or(pace.per_token),
                    }
                };
                free_at.push(Reverse(((left_ms * 1000.0) as u64, i)));
            }
        }
        (!free_at.is_empty()).then_some(Self {
            free_at,
            paces,
            settled,
        })
    }

    /// When the next task in line is predicted to start, in ms from now.
    pub fn next_start_ms(&self) -> u64 {
        self.free_at
            .peek()
            .map_or(0, |Reverse((at, _))| at.div_ceil(1000))
    }

    /// The next task in line takes the first slot to free up and holds it for what it needs.
    pub fn take(&mut self, need: Need) {
        if let Some(Reverse((at, i))) = self.free_at.pop() {
            let took = self.paces[i].map_or(0.0, |pace| pace.service_ms(need));
            self.free_at.push(Reverse((at + (took * 1000.0) as u64, i)));
        }
    }

    /// Whether the pace is settled: measured on the running tasks now and on real tasks in a
    /// full pool before.
    pub fn is_settled(&self) -> bool {
        self.settled
    }

    /// Each pool's slots as played forward now, for a task like `need`, by pool index
    /// (`None`: a pool with no measured pace, or that takes no work).
    pub fn forecasts(&self, need: Need) -> Vec<Option<SlotForecast>> {
        let mut out: Vec<Option<SlotForecast>> = self
            .paces
            .iter()
            .map(|pace| {
                pace.map(|p| SlotForecast {
                    free_in_ms: Vec::new(),
                    task_ms: p.service_ms(need).ceil() as u64,
                    confirmed: false,
                })
            })
            .collect();
        for Reverse((at, i)) in self.free_at.iter() {
            if let Some(Some(f)) = out.get_mut(*i) {
                f.free_in_ms.push(at.div_ceil(1000));
            }
        }
        for f in out.iter_mut().flatten() {
            f.free_in_ms.sort_unstable();
        }
        out
    }
}

/// One pool's line as a replica tells the others (issue 38): when each of its slots is
/// predicted to free up, and how long a typical task then holds one.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SlotForecast {
    /// Per slot, ms from the forecast until it is free (0: free now), soonest first.
    pub free_in_ms: Vec<u64>,
    /// What a typical task holds a slot of this pool for, in ms.
    pub task_ms: u64,
    /// Whether the pool's pace was confirmed by a real task (see [`pace_confirmed`]).
    #[serde(default)]
    pub confirmed: bool,
}

impl SlotForecast {
    /// The forecast `ms` later (each slot that much closer to free).
    pub fn aged(mut self, ms: u64) -> Self {
        for f in &mut self.free_in_ms {
            *f = f.saturating_sub(ms);
        }
        self
    }
}

/// The predicted wait, in ms, of a task with `ahead` tasks in front of it, over the slots of
/// every pool that could run it (any replica's): each task ahead takes the first slot to free
/// up and holds it for its pool's typical task. `None` without any slot.
pub fn start_over(pools: &[SlotForecast], ahead: usize) -> Option<u64> {
    let mut free_at: BinaryHeap<Reverse<(u64, usize)>> = pools
        .iter()
        .enumerate()
        .flat_map(|(i, p)| p.free_in_ms.iter().map(move |&at| Reverse((at, i))))
        .collect();
    for _ in 0..ahead {
        let Reverse((at, i)) = free_at.pop()?;
        free_at.push(Reverse((at.saturating_add(pools[i].task_ms.max(1)), i)));
    }
    free_at.peek().map(|Reverse((at, _))| *at)
}

/// Time per token of one sequence alone on the fastest pool that takes work (its solo pace,
/// else its mean pace): what a task needs at the least, the pools idle.
pub fn solo_ms_per_token(pools: &[PoolSnapshot]) -> Option<f64> {
    pools
        .iter()
        .filter(|p| p.accepts_work)
        .filter_map(|p| p.solo_ms_per_token.or(p.ms_per_token_ewma))
        .filter(|t| t.is_finite() && *t > 0.0)
        .min_by(f64::total_cmp)
}

/// Whether a wait in line can be predicted from a measurement: some pool that takes work has
/// finished a real task since it loaded, or measured itself with every slot busy. Until then
/// a prediction is an estimate (from one sequence's pace alone), and admission does not refuse
/// on it (ISO-7).
pub fn pace_measured(pools: &[PoolSnapshot]) -> bool {
    pools
        .iter()
        .any(|p| p.accepts_work && (p.pace_confirmed || p.full_ms_per_token_ewma.is_some()))
}

/// Whether every pace admission would refuse on for good was confirmed by a real task: some
/// pool that takes work has finished one since it loaded.
pub fn pace_confirmed(pools: &[PoolSnapshot]) -> bool {
    pools.iter().any(|p| p.accepts_work && p.pace_confirmed)
}

/// Time per token a task admitted now is expected to run at: its pool's pace alone while it
/// would run alone, a full pool's (as the line takes it) when every slot would be busy, and in
/// between as the slots fill with the tasks running and the `ahead` waiting before it. The
/// lowest over the pools that take work; `None` when none has a measured pace.
pub fn run_ms_per_token(pools: &[PoolLine<'_>], ahead: usize, probe_factor: f64) -> Option<f64> {
    pools
        .iter()
        .filter(|line| line.snapshot.accepts_work)
        .filter_map(|line| {
            let p = line.snapshot;
            let full = Pace::of(line, probe_factor)?.per_token;
            let solo = p.solo_ms_per_token.filter(|t| t.is_finite() && *t > 0.0);
            let Some(solo) = solo.map(|s| s.min(full)) else {
                return Some(full);
            };
            let n = p.slots_total.max(1);
            let busy = p.slots_busy.max(line.in_slots.len());
            let together = (busy + ahead + 1).min(n);
            let share = match together {
                0 | 1 => 0.0,
                _ => (together - 1) as f64 / (n - 1) as f64,
            };
            Some(solo + (full - solo) * share)
        })
        .min_by(f64::total_cmp)
}

/// Predicted wait, in ms, until a slot starts a task that has `ahead` (each task before it,
/// in order) in front of it; `None` when no pool that takes work has a measured decode time.
pub fn predict_start_ms(pools: &[PoolLine<'_>], ahead: &[Need], probe_factor: f64) -> Option<u64> {
    let mut line = Line::new(pools, probe_factor)?;
    for &need in ahead {
        line.take(need);
    }
    Some(line.next_start_ms())
}

/// Rough probability of finishing by the deadline: the ratio of time left to time needed,
/// capped at 1 (1.0 when there is no deadline or nothing is measured).
pub fn on_time_probability(
    remaining_ms: Option<u64>,
    tokens_left: usize,
    ms_per_token: Option<f64>,
) -> f64 {
    match (remaining_ms, ms_per_token) {
        (Some(left), Some(t)) if tokens_left > 0 && t > 0.0 => {
            (left as f64 / (tokens_left as f64 * t)).clamp(0.0, 1.0)
        }
        (Some(0), _) => 0.0,
        _ => 1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pool_manager::PoolState;

    /// CLU-ETA-1: the cluster's line: tasks ahead take the soonest slot of any replica's pool
    /// and hold it for that pool's typical task; a forecast read later is that much closer.
    #[test]
    fn the_clusters_line_takes_the_soonest_slot_of_any_pool() {
        let fast = SlotForecast {
            free_in_ms: vec![100, 900],
            task_ms: 1000,
            confirmed: true,
        };
        let slow = SlotForecast {
            free_in_ms: vec![300],
            task_ms: 4000,
            confirmed: false,
        };
        let both = [fast.clone(), slow.clone()];
        assert_eq!(start_over(&both, 0), Some(100));
        // the first ahead takes the fast slot at 100 (free again at 1100), the second the slow
        // one at 300, the third the fast one at 900
        assert_eq!(start_over(&both, 1), Some(300));
        assert_eq!(start_over(&both, 2), Some(900));
        assert_eq!(start_over(&both, 3), Some(1100));
        assert_eq!(start_over(&both, 4), Some(1900));
        assert_eq!(start_over(&[], 0), None);
        assert_eq!(fast.clone().aged(500).free_in_ms, vec![0, 400]);
        assert_eq!(start_over(&[fast.aged(5000)], 0), Some(0));
    }

    /// A load-time pace factor for the tests (`admission.probe_pace_factor`; its default is
    /// the config's): it changes only lines a load-time pace alone measures.
    const PROBE_FACTOR: f64 = 1.5;

    fn pool(
        slots: usize,
        busy: usize,
        service: Option<f64>,
        per_token: Option<f64>,
    ) -> PoolSnapshot {
        PoolSnapshot {
            id: "p".into(),
            state: PoolState::Ready,
            accepts_work: true,
            descriptor: None,
            model_alias: "m".into(),
            slots_total: slots,
            slots_busy: busy,
            engine_load: None,
            last_error: None,
            engine_alive: true,
            tasks_started: 0,
            tasks_finished: 0,
            reloads_ok: 0,
            reloads_failed: 0,
            restarts: 0,
            model_load_ms: 0,
            service_ms_ewma: service,
            ms_per_token_ewma: per_token,
            solo_ms_per_token: None,
            pace_confirmed: true,
            used_share_ewma: None,
            prefill_ms_per_token_ewma: None,
            full_ms_per_token_ewma: None,
            full_pace_from_probe_only: false,
            measuring: false,
            drain_deadline_remaining_ms: None,
            drain_cut_off: 0,
            consecutive_failures: 0,
            last_tokens_per_s: None,
            prompt_tokens_reused: 0,
            prompt_tokens_taken: 0,
            embed_passes: None,
            prompt_cache_bytes: 0,
            cached_prefixes: None,
        }
    }

    #[test]
    fn free_slot_means_no_wait() {
        let e = estimate(0, &[pool(2, 1, Some(1000.0), None)], 64);
        assert_eq!(e.predicted_start_ms, 0);
    }

    #[test]
    fn wait_grows_with_position_and_service_time() {
        let pools = [pool(2, 2, Some(1000.0), None)];
        let a = estimate(0, &pools, 64);
        let b = estimate(3, &pools, 64);
        assert_eq!(a.predicted_start_ms, 500); // 2 slots each finishing per 1000 ms
        assert_eq!(b.predicted_start_ms, 2000);
        assert_eq!(a.retry_after_ms, 500);
        let slower = estimate(0, &[pool(2, 2, Some(3000.0), None)], 64);
        assert!(slower.predicted_start_ms > a.predicted_start_ms);
    }

    #[test]
    fn per_token_rate_seeds_the_estimate_before_any_task_finished() {
        let e = estimate(0, &[pool(1, 1, None, Some(10.0))], 100);
        assert_eq!(e.predicted_start_ms, 1000);
    }

    fn slots(in_slots: &[(usize, usize)]) -> Vec<InSlot> {
        in_slots
            .iter()
            .map(|&(max_tokens, tokens_out)| InSlot {
                max_tokens,
                prompt_tokens: 0,
                tokens_out,
                placed_ms_ago: 0.0,
                ms_per_token_now: None,
                pace_gaps: 0,
            })
            .collect()
    }

    fn needs(max_tokens: &[usize]) -> Vec<Need> {
        max_tokens
            .iter()
            .map(|&max_tokens| Need {
                max_tokens,
                prompt_tokens: 0,
            })
            .collect()
    }

    /// ORCH-ADM-DL-2: a burst that filled every slot at once frees them all one service time
    /// later; the line is played forward, not averaged.
    #[test]
    fn the_line_is_played_forward() {
        // 2 slots, 10 ms per token, tasks usually run to their limit
        let p = pool(2, 2, Some(1000.0), Some(10.0));
        let just_started = [PoolLine {
            snapshot: &p,
            in_slots: slots(&[(100, 0), (100, 0)]),
        }];
        // nothing ahead: the first slot frees after 100 tokens
        assert_eq!(
            predict_start_ms(&just_started, &[], PROBE_FACTOR),
            Some(1000)
        );
        // two ahead take both slots at 1 s; the third waits for them to finish too
        assert_eq!(
            predict_start_ms(&just_started, &needs(&[100, 100]), PROBE_FACTOR),
            Some(2000)
        );
        // a half-done slot frees first
        let half = [PoolLine {
            snapshot: &p,
            in_slots: slots(&[(100, 50), (100, 0)]),
        }];
        assert_eq!(predict_start_ms(&half, &[], PROBE_FACTOR), Some(500));
        // a free slot: no wait
        let idle = pool(2, 1, Some(1000.0), Some(10.0));
        let one_free = [PoolLine {
            snapshot: &idle,
            in_slots: slots(&[(100, 0)]),
        }];
        assert_eq!(predict_start_ms(&one_free, &[], PROBE_FACTOR), Some(0));
        // tasks that usually stop at a fifth of their limit free their slots sooner
        let mut short = pool(1, 1, Some(200.0), Some(10.0));
        short.used_share_ewma = Some(0.2);
        let stops_early = [PoolLine {
            snapshot: &short,
            in_slots: slots(&[(100, 5)]),
        }];
        assert_eq!(predict_start_ms(&stops_early, &[], PROBE_FACTOR), Some(150));
        // nothing measured: no prediction
        let unmeasured = pool(1, 1, None, None);
        let none = [PoolLine {
            snapshot: &unmeasured,
            in_slots: Vec::new(),
        }];
        assert_eq!(predict_start_ms(&none, &[], PROBE_FACTOR), None);
        // what the running tasks show beats the EWMA; prompts cost their prefill
        let p = pool(1, 1, None, Some(10.0));
        let slower_now = [PoolLine {
            snapshot: &p,
            in_slots: vec![InSlot {
                max_tokens: 100,
                prompt_tokens: 0,
                tokens_out: 50,
                placed_ms_ago: 1000.0,
                ms_per_token_now: Some(20.0),
                pace_gaps: 40,
            }],
        }];
        assert_eq!(predict_start_ms(&slower_now, &[], PROBE_FACTOR), Some(1000));
        // a line waits for a full pool: its measured pace, when slower than the tasks show
        let mut measured = pool(1, 1, None, Some(10.0));
        measured.full_ms_per_token_ewma = Some(40.0);
        let full = [PoolLine {
            snapshot: &measured,
            in_slots: slower_now[0].in_slots.clone(),
        }];
        assert_eq!(predict_start_ms(&full, &[], PROBE_FACTOR), Some(2000));
        let mut prefilled = pool(1, 1, None, Some(10.0));
        prefilled.prefill_ms_per_token_ewma = Some(2.0);
        let in_prefill = [PoolLine {
            snapshot: &prefilled,
            in_slots: vec![InSlot {
                max_tokens: 10,
                prompt_tokens: 100,
                tokens_out: 0,
                placed_ms_ago: 50.0,
                ms_per_token_now: None,
                pace_gaps: 0,
            }],
        }];
        // 150 ms of prefill left, 100 ms of decode; then a task of 100 prompt tokens + 10
        assert_eq!(predict_start_ms(&in_prefill, &[], PROBE_FACTOR), Some(250));
        let next = [Need {
            max_tokens: 10,
            prompt_tokens: 100,
        }];
        assert_eq!(
            predict_start_ms(&in_prefill, &next, PROBE_FACTOR),
            Some(550)
        );
    }

    /// `n` tasks of 100 tokens in slots, 10 + `gaps` out, reading `per_token` over `gaps` gaps.
    fn running_for_gaps(per_token: Option<f64>, gaps: usize, n: usize) -> Vec<InSlot> {
        vec![
            InSlot {
                max_tokens: 100,
                prompt_tokens: 0,
                tokens_out: 10 + gaps,
                placed_ms_ago: 100.0,
                ms_per_token_now: per_token,
                pace_gaps: gaps,
            };
            n
        ]
    }

    /// A full pool of 2 at 10 ms a token measured by the load-time probe alone, and the same
    /// pace seen on real tasks.
    fn probe_and_seen() -> (PoolSnapshot, PoolSnapshot) {
        let mut probe_only = pool(2, 2, None, Some(10.0));
        probe_only.full_ms_per_token_ewma = Some(10.0);
        probe_only.full_pace_from_probe_only = true;
        let mut seen = probe_only.clone();
        seen.full_pace_from_probe_only = false;
        (probe_only, seen)
    }

    /// ORCH-ADM-DL-6: a line's pace is settled only when the running tasks show theirs and a
    /// full pool's pace was seen on real tasks: one that ended in a full pool, or most tasks
    /// of a full pool reading theirs over `SETTLE_GAPS` gaps (not the load-time probe alone).
    #[test]
    fn a_pace_is_settled_by_running_and_ended_tasks() {
        let running = running_for_gaps;
        let (probe_only, seen) = probe_and_seen();
        let line = |p: &PoolSnapshot, now: Option<f64>, gaps: usize, n: usize| {
            Line::new(
                &[PoolLine {
                    snapshot: p,
                    in_slots: running(now, gaps, n),
                }],
                PROBE_FACTOR,
            )
            .unwrap()
        };
        assert!(!line(&probe_only, Some(40.0), 4, 2).is_settled());
        assert!(!line(&seen, None, 0, 2).is_settled());
        let settled = line(&seen, Some(40.0), 4, 2);
        assert!(settled.is_settled());
        // the running tasks' slower pace is what the line is played at: 86 tokens left
        assert_eq!(settled.next_start_ms(), 3440);
        // probe only, but a full pool whose tasks read their pace long enough
        let read = line(&probe_only, Some(40.0), SETTLE_GAPS, 2);
        assert!(read.is_settled());
        assert_eq!(read.next_start_ms(), (100 - 10 - SETTLE_GAPS as u64) * 40);
        // not yet long enough, or a pool with a free slot (no line waits for it)
        assert!(!line(&probe_only, Some(40.0), SETTLE_GAPS - 1, 2).is_settled());
        assert!(!line(&probe_only, Some(40.0), SETTLE_GAPS, 1).is_settled());
    }

    /// ORCH-ADM-DL-7: until the line settles, the load-time probe's pace is taken
    /// `probe_pace_factor` times slower; a pace seen on real tasks, or read long enough by a
    /// full pool's running tasks, is taken as it is.
    #[test]
    fn an_unsettled_probe_pace_is_taken_slower() {
        let running = |per_token, gaps| running_for_gaps(per_token, gaps, 2);
        let (probe_only, seen) = probe_and_seen();
        let start = |p: &PoolSnapshot, now: Option<f64>, gaps: usize, factor: f64| {
            let l = [PoolLine {
                snapshot: p,
                in_slots: running(now, gaps),
            }];
            predict_start_ms(&l, &[], factor).unwrap()
        };
        // 90 tokens left at 10 ms × 1.5
        assert_eq!(start(&probe_only, None, 0, PROBE_FACTOR), 1350);
        assert_eq!(start(&probe_only, None, 0, 1.0), 900);
        // a slower pace the running tasks show still wins
        assert_eq!(start(&probe_only, Some(20.0), 4, PROBE_FACTOR), 1720);
        // seen on real tasks: no factor
        assert_eq!(start(&seen, None, 0, PROBE_FACTOR), 900);
        // settled by a full pool reading its pace over SETTLE_GAPS gaps: what it read, 74 left
        assert_eq!(
            start(&probe_only, Some(12.0), SETTLE_GAPS, PROBE_FACTOR),
            74 * 12
        );
    }

    #[test]
    fn on_time_probability_is_bounded() {
        assert_eq!(on_time_probability(None, 10, Some(5.0)), 1.0);
        assert_eq!(on_time_probability(Some(1000), 10, Some(5.0)), 1.0);
        assert!((on_time_probability(Some(25), 10, Some(5.0)) - 0.5).abs() < 1e-9);
    }
}
