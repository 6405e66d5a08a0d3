//! The CPU work a request brings before it is admitted — templating and tokenizing its prompt,
//! compiling its grammar, tokenizing for `/tokenize` — on a few threads of its own (ISO-1).
//!
//! That work is the client's, not yet the server's: it must never take the CPU from the
//! streams already running, and one tenant's must never hold up another's. So:
//! - it runs on `threads` threads made for it (never on the async runtime, never on tokio's
//!   blocking pool, whose threads do other work), each `nice` steps below the process, so
//!   the decode loop keeps its share of the cores whatever a flood of prompts costs;
//! - each tenant has at most `per_tenant` jobs running, and when a thread frees up it takes the
//!   next job of the next tenant in turn (round robin), so a tenant with one small prompt
//!   waits for at most one job of each other tenant, never for a whole flood;
//! - each tenant has at most `waiting_per_tenant` jobs waiting; beyond, the request is refused
//!   at once (429, the time its tenant's jobs ahead are expected to take).
//!
//! A job whose caller went away before it started is skipped.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pool_manager::{Engine, OutputConstraint, PortError, PromptInput};
use tokio::sync::oneshot;

/// Prompt token ids and the model whose tokenizer made them.
#[derive(Debug, Clone)]
pub struct PromptIds {
    /// `EngineDescriptor::model_ref` of the engine that tokenized.
    pub model_ref: String,
    pub ids: Arc<Vec<u32>>,
}

/// How the request-work threads are set up (from `[admission]`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Threads (0: one per CPU).
    pub threads: usize,
    /// Nice steps the threads run below the process (0: the same).
    pub nice: u8,
    /// Jobs of one tenant running at once (0: all the threads but one, at least one).
    pub per_tenant: usize,
    /// Jobs of one tenant waiting for a thread; more are refused.
    pub waiting_per_tenant: usize,
}

/// Least default bound of one tenant's requests waiting for the request-work threads.
const MIN_REQUEST_WORK_WAITING: usize = 16;

impl Limits {
    /// What the config's `[admission]` sets; `could_take`: the tasks the server could hold at
    /// once (its queue's capacity and its pools' slots), the default bound of one tenant's
    /// waiting requests.
    pub fn of(cfg: &crate::config::AdmissionConfig, could_take: usize) -> Self {
        Limits {
            threads: cfg.tokenize_concurrency,
            nice: cfg.request_work_nice.min(pool_manager::candle::MAX_NICE),
            per_tenant: cfg.request_work_per_tenant,
            waiting_per_tenant: match cfg.request_work_waiting_per_tenant {
                0 => could_take.max(MIN_REQUEST_WORK_WAITING),
                n => n,
            },
        }
    }
}

/// Whose work a job is.
#[derive(Debug, Clone, Copy)]
pub enum Turn<'a> {
    /// A request of this tenant not yet admitted: refused when the tenant has as many jobs
    /// waiting as it may.
    Request(&'a str),
    /// A task of this tenant already admitted (a runner tokenizing for another model than
    /// admission's, a replica taking a task of the cluster): never refused.
    Admitted(&'a str),
}

/// Why a job did not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkError {
    /// The tenant has as many jobs waiting as it may: come back after about `retry_after_ms`.
    #[error("{waiting} requests of this tenant are being prepared already (templated, tokenized, or their grammar compiled): come back in {retry_after_ms} ms")]
    Busy { waiting: usize, retry_after_ms: u64 },
    /// The job failed in the engine (a bad template, a grammar that does not compile…).
    #[error(transparent)]
    Port(#[from] PortError),
    /// The threads are gone (the server is stopping) or the job panicked.
    #[error("the request-work threads stopped: {0}")]
    Stopped(String),
}

impl WorkError {
    /// The answer to the request: 429 with the wait for a tenant over its waiting jobs, 400
    /// naming `field` for input the engine refused, 503 when the threads are gone.
    pub fn into_api(self, field: &str) -> crate::error::ApiError {
        use crate::error::ApiError;
        use contracts::ErrorCode;
        match self {
            WorkError::Busy { retry_after_ms, .. } => {
                ApiError::new(ErrorCode::AdmissionReject, self.to_string(), true)
                    .with_retry_after(retry_after_ms)
                    .with_policy("request_work")
            }
            WorkError::Port(PortError::InvalidInput(why)) => ApiError::invalid(field, why),
            WorkError::Port(PortError::Refused { field, message }) => {
                ApiError::invalid(field, message)
            }
            WorkError::Port(other) => {
                ApiError::new(ErrorCode::PoolUnavailable, other.to_string(), true)
                    .with_retry_after(1000)
            }
            WorkError::Stopped(_) => ApiError::new(ErrorCode::ShuttingDown, self.to_string(), true)
                .with_retry_after(1000),
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Waiting {
    jobs: VecDeque<Job>,
    running: usize,
}

struct Line {
    tenants: HashMap<String, Waiting>,
    /// Tenants with jobs waiting, in the order their turn comes.
    turn: VecDeque<String>,
    /// Smoothed time a job takes, in ms (what a refusal's wait is reckoned from).
    job_ms: f64,
}

struct Shared {
    line: Mutex<Line>,
    ready: Condvar,
    per_tenant: usize,
    waiting_per_tenant: usize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Line> {
        self.line.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The request-work threads and their fair line.
pub struct RequestWork {
    shared: Arc<Shared>,
    threads: usize,
}

/// Weight of the newest job in the smoothed job time.
const JOB_MS_ALPHA: f64 = 0.2;

impl RequestWork {
    /// Starts the threads.
    pub fn new(limits: Limits) -> Self {
        let threads = match limits.threads {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let per_tenant = match limits.per_tenant {
            0 => threads.saturating_sub(1).max(1),
            n => n,
        };
        let shared = Arc::new(Shared {
            line: Mutex::new(Line {
                tenants: HashMap::new(),
                turn: VecDeque::new(),
                job_ms: 1.0,
            }),
            ready: Condvar::new(),
            per_tenant,
            waiting_per_tenant: limits.waiting_per_tenant.max(1),
        });
        for i in 0..threads {
            let shared = shared.clone();
            let nice = limits.nice;
            let spawned = std::thread::Builder::new()
                .name(format!("orchd-prep-{i}"))
                .spawn(move || {
                    if nice > 0 {
                        pool_manager::candle::lower_current_thread(nice);
                    }
                    work(&shared);
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start a request-work thread");
            }
        }
        Self { shared, threads }
    }

    /// Threads the work runs on.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f` on a request-work thread in its tenant's turn.
    pub async fn run<T: Send + 'static>(
        &self,
        turn: Turn<'_>,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, WorkError> {
        let (tenant, bounded) = match turn {
            Turn::Request(t) => (t, true),
            Turn::Admitted(t) => (t, false),
        };
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move || {
            // the caller went away before its turn: nothing to do
            if tx.is_closed() {
                return;
            }
            let _ = tx.send(f());
        });
        {
            let mut guard = self.shared.lock();
            let line = &mut *guard;
            let job_ms = line.job_ms;
            let w = line.tenants.entry(tenant.to_string()).or_default();
            if bounded && w.jobs.len() >= self.shared.waiting_per_tenant {
                let waiting = w.jobs.len();
                // its jobs ahead, a thread's worth of them at a time
                let ahead = (waiting + w.running) as f64 / self.shared.per_tenant as f64;
                return Err(WorkError::Busy {
                    waiting,
                    retry_after_ms: (ahead * job_ms).ceil().max(100.0) as u64,
                });
            }
            w.jobs.push_back(job);
            if !line.turn.iter().any(|t| t == tenant) {
                line.turn.push_back(tenant.to_string());
            }
        }
        self.shared.ready.notify_one();
        rx.await
            .map_err(|_| WorkError::Stopped("the job did not finish".into()))
    }

    /// Token ids of `prompt` + `continuation` by `engine` (`None` for engines that take text).
    pub async fn tokenize(
        &self,
        turn: Turn<'_>,
        engine: Arc<dyn Engine>,
        prompt: &PromptInput,
        continuation: &str,
    ) -> Result<Option<PromptIds>, WorkError> {
        let (prompt, continuation) = (prompt.clone(), continuation.to_string());
        let model_ref = engine.descriptor().model_ref;
        let ids = self
            .run(turn, move || engine.tokenize(&prompt, &continuation))
            .await??;
        Ok(ids.map(|ids| PromptIds {
            model_ref,
            ids: Arc::new(ids),
        }))
    }

    /// Readies `constraint` on `engine` (compiling its grammar and its first step).
    pub async fn prepare_constraint(
        &self,
        turn: Turn<'_>,
        engine: Arc<dyn Engine>,
        constraint: &OutputConstraint,
    ) -> Result<(), WorkError> {
        let c = constraint.clone();
        Ok(self
            .run(turn, move || engine.prepare_constraint(&c))
            .await??)
    }
}

/// A thread's loop: the next job in turn, run, and again.
fn work(shared: &Shared) {
    loop {
        let (tenant, job) = {
            let mut line = shared.lock();
            loop {
                if let Some(next) = next_job(&mut line, shared.per_tenant) {
                    break next;
                }
                line = shared.ready.wait(line).unwrap_or_else(|p| p.into_inner());
            }
        };
        let started = Instant::now();
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        if ran.is_err() {
            tracing::error!(tenant, "a request-work job panicked");
        }
        let took = started.elapsed();
        let mut guard = shared.lock();
        let line = &mut *guard;
        line.job_ms += JOB_MS_ALPHA * (ms(took) - line.job_ms);
        let (again, emptied) = match line.tenants.get_mut(&tenant) {
            Some(w) => {
                w.running = w.running.saturating_sub(1);
                (
                    w.running < shared.per_tenant && !w.jobs.is_empty(),
                    w.running == 0 && w.jobs.is_empty(),
                )
            }
            None => (false, false),
        };
        if again && !line.turn.contains(&tenant) {
            line.turn.push_back(tenant.clone());
        }
        if emptied {
            line.tenants.remove(&tenant);
        }
        drop(guard);
        // a job of this tenant may have waited for its running one to end
        shared.ready.notify_one();
    }
}

/// The next job: the first tenant in turn below its running limit gives its oldest job, and
/// goes to the back of the turn while it has more.
fn next_job(line: &mut Line, per_tenant: usize) -> Option<(String, Job)> {
    let at = line.turn.iter().position(|t| {
        line.tenants
            .get(t)
            .is_some_and(|w| w.running < per_tenant && !w.jobs.is_empty())
    })?;
    let tenant = line.turn.remove(at)?;
    let w = line.tenants.get_mut(&tenant)?;
    let job = w.jobs.pop_front()?;
    w.running += 1;
    if !w.jobs.is_empty() && w.running < per_tenant {
        line.turn.push_back(tenant.clone());
    }
    Some((tenant, job))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn work_of(threads: usize, per_tenant: usize, waiting: usize) -> RequestWork {
        RequestWork::new(Limits {
            threads,
            nice: 0,
            per_tenant,
            waiting_per_tenant: waiting,
        })
    }

    /// ISO-1: a tenant whose jobs fill the line waits for its own turn; another tenant's one
    /// job runs on the next free thread, before the rest of the flood.
    #[tokio::test]
    async fn another_tenant_goes_before_the_rest_of_a_flood() {
        let w = Arc::new(work_of(1, 1, 64));
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut flood = Vec::new();
        for i in 0..6 {
            let (w, order) = (w.clone(), order.clone());
            flood.push(tokio::spawn(async move {
                w.run(Turn::Request("noisy"), move || {
                    std::thread::sleep(Duration::from_millis(30));
                    order.lock().unwrap().push(format!("noisy-{i}"));
                })
                .await
            }));
            tokio::task::yield_now().await;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        let o = order.clone();
        w.run(Turn::Request("victim"), move || {
            o.lock().unwrap().push("victim".into())
        })
        .await
        .unwrap();
        for f in flood {
            f.await.unwrap().unwrap();
        }
        let order = order.lock().unwrap().clone();
        let at = order.iter().position(|s| s == "victim").unwrap();
        assert!(at <= 2, "the victim's job waited for the flood: {order:?}");
    }

    /// ISO-1: at most `per_tenant` of a tenant's jobs run at once, whatever the threads.
    #[tokio::test]
    async fn a_tenant_runs_at_most_its_share_of_the_threads() {
        let w = Arc::new(work_of(3, 1, 64));
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let mut all = Vec::new();
        for _ in 0..6 {
            let (w, now, most) = (w.clone(), now.clone(), most.clone());
            all.push(tokio::spawn(async move {
                w.run(Turn::Request("t"), move || {
                    let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(n, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(20));
                    now.fetch_sub(1, Ordering::SeqCst);
                })
                .await
            }));
        }
        for a in all {
            a.await.unwrap().unwrap();
        }
        assert_eq!(most.load(Ordering::SeqCst), 1);
    }

    /// ISO-1: beyond its waiting jobs a tenant is refused at once with a wait; others are not.
    #[tokio::test]
    async fn a_tenant_over_its_waiting_jobs_is_refused_with_a_wait() {
        let w = Arc::new(work_of(1, 1, 2));
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let mut held = Vec::new();
        // one running (held at the gate) and two waiting
        for _ in 0..3 {
            let (w, gate) = (w.clone(), gate.clone());
            held.push(tokio::spawn(async move {
                w.run(Turn::Request("t"), move || {
                    let (m, c) = &*gate;
                    let mut open = m.lock().unwrap();
                    while !*open {
                        open = c.wait(open).unwrap();
                    }
                })
                .await
            }));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        match w.run(Turn::Request("t"), || ()).await {
            Err(WorkError::Busy {
                waiting,
                retry_after_ms,
            }) => {
                assert_eq!(waiting, 2);
                assert!(retry_after_ms >= 100);
            }
            other => panic!("{other:?}"),
        }
        let other = w.clone();
        let u = tokio::spawn(async move { other.run(Turn::Request("u"), || 7).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (m, c) = &*gate;
        *m.lock().unwrap() = true;
        c.notify_all();
        for h in held {
            h.await.unwrap().unwrap();
        }
        assert_eq!(u.await.unwrap().unwrap(), 7);
    }

    /// A job whose caller left before its turn does not run.
    #[tokio::test]
    async fn a_job_whose_caller_left_is_skipped() {
        let w = Arc::new(work_of(1, 1, 8));
        let ran = Arc::new(AtomicUsize::new(0));
        let w2 = w.clone();
        let blocker = tokio::spawn(async move {
            w2.run(Turn::Request("t"), || {
                std::thread::sleep(Duration::from_millis(100))
            })
            .await
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let r = ran.clone();
        let left = tokio::time::timeout(
            Duration::from_millis(10),
            w.run(Turn::Request("t"), move || {
                r.fetch_add(1, Ordering::SeqCst);
            }),
        )
        .await;
        assert!(left.is_err(), "timed out while waiting");
        blocker.await.unwrap().unwrap();
        w.run(Turn::Request("t"), || ()).await.unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 0);
    }
}
