//! Fewer compute threads while other processes hold the cores (ISO-2).
//!
//! A decode step is hundreds of parallel jobs, and each ends only when every worker has taken
//! its part: a worker whose core another process holds (a build, another server's busy
//! threads) keeps each job waiting until the scheduler gives the core back, and the step
//! goes at a fraction of either thread count's pace. Measured beside one process burning one
//! of two cores (SmolLM2, `ci/busy_core_bench.py`): two threads decode at 25 tok/s, one at 51
//! (quiet: 78 and 52).
//!
//! So the decode thread reads, over each window of steps, the share of its time in parallel
//! jobs that it spent waiting for workers after it had run out of work to take
//! (`cpu_parallel::take_waits`): above [`WAIT_SHARE_HIGH`] it gives up a worker. With fewer
//! than its configured threads it tries the configured count again for a window every
//! [`PROBE_EVERY`], and keeps it when the waits fall below [`WAIT_SHARE_LOW`] (the neighbour
//! has gone). A quiet machine waits a few percent: nothing changes there.

use std::time::{Duration, Instant};

use crate::cpu_parallel::{set_threads, take_waits, Waits};

/// How long the waits are read over before a decision.
const WINDOW: Duration = Duration::from_millis(250);
/// Time in parallel jobs a window needs to say anything (an idle engine's windows do not).
const MIN_IN_JOBS: Duration = Duration::from_millis(25);
/// Waiting share above which a worker is given up.
pub const WAIT_SHARE_HIGH: f64 = 0.3;
/// Waiting share below which the configured count is kept again after a probe.
pub const WAIT_SHARE_LOW: f64 = 0.15;
/// How often the configured count is tried again while running with fewer.
pub const PROBE_EVERY: Duration = Duration::from_secs(2);

/// The decode thread's choice of compute threads.
pub(crate) struct Governor {
    configured: usize,
    current: usize,
    window_from: Instant,
    seen: Waits,
    /// Trying the configured count: the count to go back to if the waits say no.
    probing: Option<usize>,
    next_probe: Instant,
}

impl Governor {
    /// For a thread whose jobs use `configured` threads (the caller included).
    pub(crate) fn new(configured: usize) -> Self {
        let now = Instant::now();
        Self {
            configured: configured.max(1),
            current: configured.max(1),
            window_from: now,
            seen: Waits::default(),
            probing: None,
            next_probe: now,
        }
    }

    /// Threads the jobs use now.
    #[cfg(test)]
    fn threads(&self) -> usize {
        self.current
    }

    fn set(&mut self, n: usize) {
        self.current = n;
        set_threads(n);
    }

    /// After a step: takes the waits of its jobs and, at the end of a window, decides.
    pub(crate) fn after_step(&mut self) {
        let w = take_waits();
        self.seen.in_jobs += w.in_jobs;
        self.seen.waited += w.waited;
        let now = Instant::now();
        if now - self.window_from < WINDOW {
            return;
        }
        let seen = std::mem::take(&mut self.seen);
        self.window_from = now;
        if self.probing.is_none() && self.current < self.configured && now >= self.next_probe {
            self.probing = Some(self.current);
            self.set(self.configured);
            return;
        }
        if seen.in_jobs < MIN_IN_JOBS {
            return;
        }
        let share = seen.waited.as_secs_f64() / seen.in_jobs.as_secs_f64();
        match self.probing.take() {
            Some(before) => {
                if share > WAIT_SHARE_LOW {
                    self.set(before);
                    self.next_probe = now + PROBE_EVERY;
                } else {
                    tracing::info!(
                        threads = self.current,
                        wait_share = share,
                        "the compute threads are back to their configured count: the cores are free again"
                    );
                }
            }
            None if share > WAIT_SHARE_HIGH && self.current > 1 => {
                self.set(self.current - 1);
                self.next_probe = now + PROBE_EVERY;
                tracing::info!(
                    threads = self.current,
                    wait_share = share,
                    "fewer compute threads: other processes hold the cores"
                );
            }
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds the governor a window with `share` of its job time waited.
    fn window(g: &mut Governor, share: f64) {
        let in_jobs = Duration::from_millis(200);
        g.seen.in_jobs += in_jobs;
        g.seen.waited += in_jobs.mul_f64(share);
        g.window_from = Instant::now() - WINDOW;
        g.after_step();
    }

    /// ISO-2: a worker is given up while the waits are high, tried again after a while, and
    /// kept once they are low; a quiet machine changes nothing.
    #[test]
    fn a_worker_is_given_up_while_others_hold_the_cores_and_taken_back_after() {
        let mut g = Governor::new(2);
        window(&mut g, 0.05);
        assert_eq!(g.threads(), 2, "quiet");
        window(&mut g, 0.6);
        assert_eq!(g.threads(), 1);
        // before the probe is due nothing changes
        window(&mut g, 0.0);
        assert_eq!(g.threads(), 1);
        g.next_probe = Instant::now();
        window(&mut g, 0.0);
        assert_eq!(g.threads(), 2, "probing");
        window(&mut g, 0.5);
        assert_eq!(g.threads(), 1, "still busy: back to one");
        g.next_probe = Instant::now();
        window(&mut g, 0.0);
        window(&mut g, 0.05);
        assert_eq!(g.threads(), 2, "the neighbour has gone");
        window(&mut g, 0.1);
        assert_eq!(g.threads(), 2);
    }

    /// A window with too little job time says nothing.
    #[test]
    fn an_idle_window_decides_nothing() {
        let mut g = Governor::new(2);
        g.seen.in_jobs = Duration::from_millis(5);
        g.seen.waited = Duration::from_millis(5);
        g.window_from = Instant::now() - WINDOW;
        g.after_step();
        assert_eq!(g.threads(), 2);
    }
}
