//! One pool: a model loaded into an engine with N slots, and its lifecycle.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::port::{
    Engine, EngineDescriptor, EngineFactory, EngineJob, OnLoss, PortError, PromptInput,
    SamplingParams, SeqEvent,
};
use crate::spec::PoolSpec;
use crate::state::{PoolEvent, PoolState, TransitionError};

mod lease;

pub use lease::SlotLease;

/// Failures of control-plane actions on a pool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error(transparent)]
    Transition(#[from] TransitionError),
    /// Loading or self-testing the new model failed; the old one keeps serving.
    #[error("reload failed, rolled back: {0}")]
    ReloadFailed(String),
}

/// A consistent view of a pool for health, capabilities and placement.
#[derive(Debug, Clone)]
pub struct PoolSnapshot {
    pub id: String,
    pub state: PoolState,
    /// Whether the pool grants slots now (`Pool::accepts_work`).
    pub accepts_work: bool,
    pub descriptor: Option<EngineDescriptor>,
    pub model_alias: String,
    pub slots_total: usize,
    pub slots_busy: usize,
    /// What the engine says it runs from every source (a remote worker's `current_load`).
    pub engine_load: Option<usize>,
    pub last_error: Option<String>,
    pub engine_alive: bool,
    pub tasks_started: u64,
    pub tasks_finished: u64,
    pub reloads_ok: u64,
    pub reloads_failed: u64,
    pub restarts: u64,
    pub model_load_ms: u64,
    pub service_ms_ewma: Option<f64>,
    /// Smoothed decode time per generated token, seeded by the self-test.
    pub ms_per_token_ewma: Option<f64>,
    /// Time per token of one sequence alone: measured by the self-test when the engine loads,
    /// then by tasks that ran alone, and lowered by any task that went faster (see
    /// `Pool::record_service`).
    pub solo_ms_per_token: Option<f64>,
    /// Whether a real task (of two tokens or more) has finished on this pool since it loaded:
    /// until one has, every pace is what the load-time measurements saw, on a machine that may
    /// have been busy then.
    pub pace_confirmed: bool,
    /// Time per token of a sequence while every slot is busy: measured when the engine loads
    /// (all slots decoding at once) and refined by tasks that finish in a full pool.
    pub full_ms_per_token_ewma: Option<f64>,
    /// Whether that pace is still the load-time measurement only (short prompts: it leaves out
    /// the stalls other slots' prefills cause), not yet refined by real tasks.
    pub full_pace_from_probe_only: bool,
    /// Whether the measurement with every slot busy runs now (after a load, until a lease
    /// cancels it).
    pub measuring: bool,
    /// Smoothed prefill time per prompt token: taking the slot to the first token, less one
    /// step.
    pub prefill_ms_per_token_ewma: Option<f64>,
    /// Smoothed share of their `max_tokens` that finished tasks produced (they stop at end of
    /// text or a stop sequence before it): how long a task in a slot is expected to run.
    pub used_share_ewma: Option<f64>,
    pub drain_deadline_remaining_ms: Option<u64>,
    /// Tasks the current (or last) drain's deadline ended before they finished.
    pub drain_cut_off: u32,
    pub consecutive_failures: u32,
    /// Tokens per second of the last finished task (admission to end, prefill included).
    pub last_tokens_per_s: Option<f64>,
    /// Prompt tokens the current engine took from its prefix cache.
    pub prompt_tokens_reused: u64,
    /// Prompt tokens of every sequence the current engine started (the reused ones included).
    pub prompt_tokens_taken: u64,
    /// An embedding engine's passes: the inputs they carried and how many there were.
    pub embed_passes: Option<(u64, u64)>,
    /// Bytes the current engine's host-memory prompt cache holds.
    pub prompt_cache_bytes: u64,
    /// The prefixes the current engine holds, as it last published them (`None`: it does not
    /// say).
    pub cached_prefixes: Option<Arc<crate::port::CachedPrefixes>>,
}

impl PoolSnapshot {
    /// Whether repeated load failures opened the circuit breaker.
    pub fn circuit_open(&self) -> bool {
        self.consecutive_failures >= CIRCUIT_OPEN_AFTER
    }

    pub fn slots_free(&self) -> usize {
        if self.accepts_work {
            let used = self.slots_busy.max(self.engine_load.unwrap_or(0));
            self.slots_total.saturating_sub(used)
        } else {
            0
        }
    }
}

struct Inner {
    state: PoolState,
    engine: Option<Arc<dyn Engine>>,
    /// Engines this pool ran before a reload or a death whose sequences may still hold slots:
    /// their slots count against the pool until the engine lets go of them.
    retiring: Vec<Weak<dyn Engine>>,
    /// The operator drained the pool and has not resumed it: a restart after an engine death
    /// brings it back drained, not serving.
    held_drained: bool,
    /// The state a reload under way started in: it serves meanwhile only if that was
    /// `Ready`, and goes back to it if the new model fails.
    reload_from: PoolState,
    last_error: Option<String>,
    drain_token: CancellationToken,
    drain_deadline: Option<Instant>,
    /// Tasks the current (or last) drain's deadline ended.
    drain_cut_off: u32,
    model_load_ms: u64,
    service_ms_ewma: Option<f64>,
    ms_per_token_ewma: Option<f64>,
    solo_ms_per_token: Option<f64>,
    /// The solo pace is still the self-test's.
    solo_from_probe_only: bool,
    /// No real task has finished with two tokens or more since the engine loaded.
    pace_from_probe_only: bool,
    used_share_ewma: Option<f64>,
    prefill_ms_per_token_ewma: Option<f64>,
    /// The prefill pace is still the load-time measurement's.
    prefill_from_probe_only: bool,
    full_ms_per_token_ewma: Option<f64>,
    full_pace_from_probe_only: bool,
    last_tokens_per_s: Option<f64>,
    consecutive_failures: u32,
    /// The full-occupancy measurement under way (after a load): cancelled by the first
    /// lease, so it never keeps a real task waiting (ISO-7).
    probe: Option<(u64, CancellationToken)>,
    /// Measurements started so far (which one `probe` is).
    probes: u64,
}

/// Weight of the newest sample in the service-time EWMA.
const EWMA_ALPHA: f64 = 0.2;
/// Longest wait for the one-token self-test.
const SELF_TEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Failures in a row after which the circuit breaker opens (retries wait the cap).
pub const CIRCUIT_OPEN_AFTER: u32 = 3;
/// Load retry backoff: first wait and cap.
const RETRY_BASE: Duration = Duration::from_millis(500);
const RETRY_CAP: Duration = Duration::from_secs(30);

/// A pool of engine slots.
pub struct Pool {
    spec: PoolSpec,
    factory: Arc<dyn EngineFactory>,
    inner: Mutex<Inner>,
    wake: Arc<Notify>,
    /// An operator's resume: a pool waiting to retry its load tries now.
    retry_now: Notify,
    tasks_started: AtomicU64,
    tasks_finished: AtomicU64,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
    restarts: AtomicU64,
}

impl Pool {
    /// A pool in `Loading`; call [`Pool::load`] to bring it up.
    pub fn new(spec: PoolSpec, factory: Arc<dyn EngineFactory>, wake: Arc<Notify>) -> Arc<Self> {
        Arc::new(Self {
            spec,
            factory,
            inner: Mutex::new(Inner {
                state: PoolState::Loading,
                engine: None,
                retiring: Vec::new(),
                held_drained: false,
                reload_from: PoolState::Ready,
                last_error: None,
                drain_token: CancellationToken::new(),
                drain_deadline: None,
                drain_cut_off: 0,
                model_load_ms: 0,
                service_ms_ewma: None,
                ms_per_token_ewma: None,
                solo_ms_per_token: None,
                solo_from_probe_only: false,
                pace_from_probe_only: false,
                used_share_ewma: None,
                prefill_ms_per_token_ewma: None,
                prefill_from_probe_only: false,
                full_ms_per_token_ewma: None,
                full_pace_from_probe_only: false,
                last_tokens_per_s: None,
                consecutive_failures: 0,
                probe: None,
                probes: 0,
            }),
            wake,
            retry_now: Notify::new(),
            tasks_started: AtomicU64::new(0),
            tasks_finished: AtomicU64::new(0),
            reloads_ok: AtomicU64::new(0),
            reloads_failed: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
        })
    }

    /// A pool that is `Ready` at once with an engine it did not load (a remote worker's).
    pub fn with_engine(
        spec: PoolSpec,
        engine: Arc<dyn Engine>,
        factory: Arc<dyn EngineFactory>,
        wake: Arc<Notify>,
    ) -> Arc<Self> {
        let pool = Self::new(spec, factory, wake);
        {
            let mut g = pool.lock();
            g.engine = Some(engine);
            let _ = pool.apply(&mut g, PoolEvent::Loaded);
        }
        pool
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // a poisoned lock only means a panic elsewhere; the data is still consistent
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn id(&self) -> &str {
        &self.spec.id
    }

    pub fn spec(&self) -> &PoolSpec {
        &self.spec
    }

    pub fn state(&self) -> PoolState {
        self.lock().state
    }

    /// Slots the pool's engines hold now (the current one's and those of engines it replaced):
    /// what the snapshot's `slots_busy` says, without building a snapshot.
    pub fn slots_busy(&self) -> usize {
        busy_with_tasks(&self.lock())
    }

    /// Whether new slot leases may be granted: a ready pool, or one reloading from ready
    /// whose old engine serves until the new one takes over.
    pub fn accepts_work(&self) -> bool {
        accepts_work(&self.lock())
    }

    /// Whether this pool serves `model` (its alias, the model's name, or the pool id).
    pub fn serves(&self, model: &str) -> bool {
        if model == self.spec.model_alias || model == self.spec.id {
            return true;
        }
        self.lock()
            .engine
            .as_ref()
            .is_some_and(|e| e.descriptor().model_name == model)
    }

    pub fn engine(&self) -> Option<Arc<dyn Engine>> {
        self.lock().engine.clone()
    }

    /// The context per sequence it serves: its engine's, or before one is loaded what a load
    /// would serve (blocking then: the model file's header), else the configured `ctx`.
    pub fn served_context(&self) -> usize {
        match self.engine() {
            Some(e) => e.descriptor().ctx_max,
            None => self
                .factory
                .served_context(&self.spec, &self.spec.model_ref)
                .unwrap_or(self.spec.ctx),
        }
    }

    pub fn snapshot(&self) -> PoolSnapshot {
        let g = self.lock();
        PoolSnapshot {
            id: self.spec.id.clone(),
            state: g.state,
            accepts_work: accepts_work(&g),
            descriptor: g.engine.as_ref().map(|e| e.descriptor()),
            model_alias: self.spec.model_alias.clone(),
            slots_total: self.spec.slots,
            slots_busy: busy_with_tasks(&g),
            engine_load: g.engine.as_ref().and_then(|e| e.current_load()),
            last_error: g.last_error.clone(),
            engine_alive: g.engine.as_ref().is_some_and(|e| e.is_alive()),
            tasks_started: self.tasks_started.load(Ordering::Relaxed),
            tasks_finished: self.tasks_finished.load(Ordering::Relaxed),
            reloads_ok: self.reloads_ok.load(Ordering::Relaxed),
            reloads_failed: self.reloads_failed.load(Ordering::Relaxed),
            restarts: self.restarts.load(Ordering::Relaxed),
            model_load_ms: g.model_load_ms,
            service_ms_ewma: g.service_ms_ewma,
            ms_per_token_ewma: g.ms_per_token_ewma,
            solo_ms_per_token: g.solo_ms_per_token,
            pace_confirmed: !g.pace_from_probe_only,
            used_share_ewma: g.used_share_ewma,
            prefill_ms_per_token_ewma: g.prefill_ms_per_token_ewma,
            full_ms_per_token_ewma: g.full_ms_per_token_ewma,
            full_pace_from_probe_only: g.full_pace_from_probe_only,
            measuring: g.probe.is_some(),
            drain_deadline_remaining_ms: g
                .drain_deadline
                .filter(|_| g.state == PoolState::Draining)
                .map(|d| d.saturating_duration_since(Instant::now()).as_millis() as u64),
            drain_cut_off: g.drain_cut_off,
            consecutive_failures: g.consecutive_failures,
            last_tokens_per_s: g.last_tokens_per_s,
            prompt_tokens_reused: g.engine.as_ref().map_or(0, |e| e.prompt_tokens_reused()),
            prompt_tokens_taken: g.engine.as_ref().map_or(0, |e| e.prompt_tokens_taken()),
            embed_passes: g.engine.as_ref().and_then(|e| e.embed_passes()),
            prompt_cache_bytes: g.engine.as_ref().map_or(0, |e| e.prompt_cache_bytes()),
            cached_prefixes: g.engine.as_ref().and_then(|e| e.cached_prefixes()),
        }
    }

    fn apply(&self, g: &mut Inner, event: PoolEvent) -> Result<PoolState, TransitionError> {
        let next = g.state.on(event)?;
        if next != g.state {
            tracing::info!(pool = %self.spec.id, from = g.state.as_str(), to = next.as_str(), ?event, "pool state");
        }
        g.state = next;
        self.wake.notify_one();
        Ok(next)
    }

    /// Grants a slot if the pool takes work and its engine has one free (slots that an
    /// engine replaced by a reload still holds count against the pool).
    pub fn try_lease(self: &Arc<Self>) -> Option<SlotLease> {
        let mut g = self.lock();
        if !accepts_work(&g) {
            return None;
        }
        // a real task wants a slot: the load-time measurement gives way at once (its
        // sequences end within a step; their slots wake the dispatcher when they are free).
        // It stays `measuring` until they did: its slots count free for admission meanwhile.
        if let Some((_, probe)) = &g.probe {
            probe.cancel();
        }
        let engine = g.engine.clone()?;
        if !engine.is_alive() {
            return None;
        }
        g.retiring
            .retain(|e| e.upgrade().is_some_and(|e| e.slots_in_use() > 0));
        if busy(&g) >= self.spec.slots {
            return None;
        }
        let mut permit = engine.try_acquire()?;
        let drain_deadline = g.drain_token.clone();
        drop(g);
        let me = Arc::downgrade(self);
        permit.on_release(move || {
            if let Some(pool) = me.upgrade() {
                pool.slot_returned();
            }
        });
        self.tasks_started.fetch_add(1, Ordering::Relaxed);
        Some(SlotLease {
            pool: self.clone(),
            engine,
            drain_deadline,
            permit: Some(permit),
        })
    }

    /// An engine gave a slot of this pool back: a draining pool may be done, the dispatcher
    /// may place the next task.
    fn slot_returned(&self) {
        self.tasks_finished.fetch_add(1, Ordering::Relaxed);
        let mut g = self.lock();
        if g.state == PoolState::Draining && busy(&g) == 0 {
            let _ = self.apply(&mut g, PoolEvent::DrainComplete);
        }
        drop(g);
        self.wake.notify_one();
    }

    /// Feeds a finished task's measurements into the EWMAs: service time, time per token after
    /// the first, time to the first token per prompt token, and the share of its limit used.
    pub fn record_service(&self, m: ServiceSample) {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        let total = ms(m.took);
        let mut g = self.lock();
        g.service_ms_ewma = Some(ewma(g.service_ms_ewma, total));
        if m.max_tokens > 0 {
            let share = (m.tokens_out as f64 / m.max_tokens as f64).clamp(0.0, 1.0);
            g.used_share_ewma = Some(ewma(g.used_share_ewma, share));
        }
        // the pace of decoding is read from the gaps between tokens: a task of one token has
        // none (its time is its prefill, behind every other slot's when a burst lands), and
        // taken as one step it made a full pool's pace 5–10× too slow and every wait in line
        // with it (a client's one-token requests before a burst: 60 s advised to all)
        let per_token = match m.first_token_after {
            Some(first) if m.tokens_out >= 2 => {
                Some(ms(m.took.saturating_sub(first)) / (m.tokens_out - 1) as f64)
            }
            None if m.tokens_out >= 2 => Some(total / m.tokens_out as f64),
            _ => None,
        };
        if let Some(t) = per_token {
            // the first real task's pace replaces the load-time one: that was measured on a
            // machine that may have been busy then (issue 33: 1 s a token measured while
            // another process compiled; the idle machine then ran 14 ms, and 13 tasks were
            // needed to average it away while every deadline was refused)
            g.ms_per_token_ewma = Some(match g.pace_from_probe_only {
                true => t,
                false => ewma(g.ms_per_token_ewma, t),
            });
            g.pace_from_probe_only = false;
            let solo_before = g.solo_ms_per_token;
            if m.ran_alone {
                g.solo_ms_per_token = Some(match g.solo_from_probe_only {
                    true => t,
                    false => ewma(g.solo_ms_per_token, t),
                });
                g.solo_from_probe_only = false;
            } else if g.solo_ms_per_token.is_some_and(|s| t < s) {
                // a sequence in company went faster than one alone was thought to: alone
                // goes at least as fast
                g.solo_ms_per_token = Some(t);
            }
            if let (Some(before), Some(now), true) = (
                solo_before,
                g.solo_ms_per_token,
                g.full_pace_from_probe_only && !m.pool_was_full,
            ) {
                // no real task measured a full pool yet: the load-time measurement of it
                // keeps its ratio to the pace of one sequence, as real tasks show that one
                if before > 0.0 {
                    let r = now / before;
                    g.full_ms_per_token_ewma = g.full_ms_per_token_ewma.map(|f| f * r);
                }
            }
            if m.pool_was_full {
                // a real task's pace includes the other slots' prefills: it replaces the probe's
                g.full_ms_per_token_ewma = Some(match g.full_pace_from_probe_only {
                    true => t,
                    false => ewma(g.full_ms_per_token_ewma, t),
                });
                g.full_pace_from_probe_only = false;
            }
        }
        // the first token is the prompt's prefill plus one step like the others
        if let (Some(first), true) = (m.first_token_after, m.prompt_tokens > 0) {
            let step = per_token.or(g.ms_per_token_ewma).unwrap_or(0.0);
            let per = (ms(first) - step).max(0.0) / m.prompt_tokens as f64;
            g.prefill_ms_per_token_ewma = Some(match g.prefill_from_probe_only {
                true => per,
                false => ewma(g.prefill_ms_per_token_ewma, per),
            });
            g.prefill_from_probe_only = false;
        }
        if m.tokens_out > 0 {
            g.last_tokens_per_s = Some(m.tokens_out as f64 * 1000.0 / total.max(1e-3));
        }
    }

    /// Loads `model_ref` and runs the self-test (a few tokens: the engine works, and the pace
    /// of one sequence alone). The pool is ready then; what a full pool's pace is, is measured
    /// after ([`Pool::measure_full_pace`]) or shown by real tasks (ISO-7: a server beside a
    /// busy core was ready 40 s after a load of under a second).
    async fn load_engine(&self, model_ref: &str) -> Result<(Arc<dyn Engine>, u64), LoadFailure> {
        let (engine, ms, solo) = self.load_and_probe(model_ref).await?;
        let mut g = self.lock();
        // a new model is a new pace: the measurements replace what the old one showed, until
        // real tasks show theirs
        if let Some(solo) = solo {
            g.solo_ms_per_token = Some(solo);
            g.solo_from_probe_only = true;
            g.ms_per_token_ewma = Some(solo);
            g.pace_from_probe_only = true;
        }
        g.full_ms_per_token_ewma = None;
        g.full_pace_from_probe_only = true;
        g.prefill_ms_per_token_ewma = None;
        g.prefill_from_probe_only = true;
        Ok((engine, ms))
    }

    /// Measures `engine` with every slot busy (what a wait in line is paced by), in the
    /// background of a pool that serves already: the first lease cancels it (real tasks then
    /// show the pace), and a pool whose real tasks measured a full pool keeps theirs.
    fn measure_full_pace(self: &Arc<Self>, engine: Arc<dyn Engine>) {
        let token = CancellationToken::new();
        let id = {
            let mut g = self.lock();
            g.probes += 1;
            let id = g.probes;
            if let Some((_, old)) = g.probe.replace((id, token.clone())) {
                old.cancel();
            }
            id
        };
        let me = self.clone();
        tokio::spawn(async move {
            let full = full_occupancy_pace(engine.as_ref(), &token).await;
            let mut g = me.lock();
            if g.probe.as_ref().is_some_and(|(p, _)| *p == id) {
                g.probe = None;
            }
            let current = g.engine.as_ref().is_some_and(|e| Arc::ptr_eq(e, &engine));
            match full {
                Some(f) if current && g.full_pace_from_probe_only && !token.is_cancelled() => {
                    tracing::info!(
                        pool = %me.spec.id,
                        ms_per_token = f.ms_per_token,
                        prefill_ms_per_token = f.prefill_ms_per_token,
                        "measured with every slot busy"
                    );
                    g.full_ms_per_token_ewma = Some(f.ms_per_token);
                    if g.prefill_from_probe_only {
                        g.prefill_ms_per_token_ewma = Some(f.prefill_ms_per_token);
                    }
                }
                _ => tracing::debug!(
                    pool = %me.spec.id,
                    "the measurement with every slot busy gave way to real tasks"
                ),
            }
            // its slots are free again: a drain that waited for them is done
            if g.state == PoolState::Draining && busy(&g) == 0 {
                let _ = me.apply(&mut g, PoolEvent::DrainComplete);
            }
            drop(g);
            me.wake.notify_one();
        });
    }

    async fn load_and_probe(
        &self,
        model_ref: &str,
    ) -> Result<(Arc<dyn Engine>, u64, Option<f64>), LoadFailure> {
        let started = Instant::now();
        let factory = self.factory.clone();
        let spec = self.spec.clone();
        let model = model_ref.to_string();
        let load = tokio::task::spawn_blocking(move || factory.load(&spec, &model));
        let engine = self
            .logging_progress("reading the model", load)
            .await
            .map_err(|e| LoadFailure::passing(format!("load task failed: {e}")))?
            .map_err(|e| LoadFailure {
                lasting: matches!(e, PortError::Unloadable(_)),
                message: e.to_string(),
            })?;
        let load_ms = started.elapsed().as_millis() as u64;
        let solo = self
            .logging_progress("its self-test", self_test(engine.as_ref()))
            .await
            .map_err(LoadFailure::passing)?;
        Ok((engine, load_ms, solo))
    }

    /// Runs `step` of a load, logging every few seconds that it is still under way (a load
    /// on a busy machine is not silent: ISO-7).
    async fn logging_progress<T>(
        &self,
        what: &str,
        step: impl std::future::Future<Output = T>,
    ) -> T {
        let started = Instant::now();
        tokio::pin!(step);
        let mut every = tokio::time::interval_at(
            tokio::time::Instant::now() + LOAD_PROGRESS_EVERY,
            LOAD_PROGRESS_EVERY,
        );
        loop {
            tokio::select! {
                out = &mut step => return out,
                _ = every.tick() => tracing::info!(
                    pool = %self.spec.id,
                    seconds = started.elapsed().as_secs(),
                    "still loading: {what}"
                ),
            }
        }
    }

    /// One load attempt: load, self-test, `Ready`; on failure `Unready` with `last_error`.
    pub async fn load_once(self: &Arc<Self>) -> Result<(), LoadFailure> {
        match self.load_engine(&self.spec.model_ref).await {
            Ok((engine, ms)) => {
                let mut g = self.lock();
                g.engine = Some(engine.clone());
                g.model_load_ms = ms;
                g.last_error = None;
                g.consecutive_failures = 0;
                let _ = self.apply(&mut g, PoolEvent::Loaded);
                if g.held_drained {
                    // the engine died while the pool was drained or draining: it stays so
                    let _ = self.apply(&mut g, PoolEvent::Drain);
                    if busy(&g) == 0 {
                        let _ = self.apply(&mut g, PoolEvent::DrainComplete);
                    }
                }
                drop(g);
                self.measure_full_pace(engine);
                Ok(())
            }
            Err(e) => {
                tracing::warn!(pool = %self.spec.id, error = %e.message, lasting = e.lasting, "pool load failed");
                let mut g = self.lock();
                g.consecutive_failures += 1;
                g.last_error = Some(if e.lasting {
                    // no timed retry: the circuit is open until the file changes
                    g.consecutive_failures = g.consecutive_failures.max(CIRCUIT_OPEN_AFTER);
                    format!(
                        "{} (not retried until the model file changes, a reload or a resume)",
                        e.message
                    )
                } else {
                    e.message.clone()
                });
                let _ = self.apply(&mut g, PoolEvent::LoadFailed);
                Err(e)
            }
        }
    }

    /// Brings the pool up: load, self-test, Ready. A failure that may pass is retried with
    /// exponential backoff and jitter; one that lasts as long as the file does (an unsupported
    /// architecture) is tried again only when the file changes or an operator resumes the pool.
    /// Failures leave it `Unready` with `last_error`.
    pub async fn load(self: Arc<Self>) {
        let mut attempt: u32 = 0;
        while let Err(failure) = self.load_once().await {
            if failure.lasting {
                self.until_the_model_changes().await;
            } else {
                attempt = attempt.saturating_add(1);
                let open = self.lock().consecutive_failures >= CIRCUIT_OPEN_AFTER;
                let wait = if open { RETRY_CAP } else { backoff(attempt) };
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = self.retry_now.notified() => {}
                }
            }
            if self.state() != PoolState::Unready {
                return;
            }
        }
    }

    /// Returns when the model file changes (size, modification time, or it appears or goes),
    /// when an operator resumes the pool, or when the pool leaves `Unready`.
    async fn until_the_model_changes(&self) {
        let seen = file_identity(&self.spec.model_ref);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(FILE_CHECK_EVERY) => {}
                _ = self.retry_now.notified() => return,
            }
            if self.state() != PoolState::Unready || file_identity(&self.spec.model_ref) != seen {
                return;
            }
        }
    }

    /// Marks the engine dead (its decode thread stopped, its worker went away) and does what
    /// the engine said of its loss: a local engine is loaded again with backoff; a remote
    /// one's pool only goes `Unready` (its worker's registry removes it).
    pub fn engine_died(self: &Arc<Self>, why: &str) {
        let on_loss = {
            let mut g = self.lock();
            if g.state == PoolState::Unready {
                return;
            }
            // an engine says; a pool without one is local (a remote pool is built with its engine)
            let on_loss = g
                .engine
                .as_ref()
                .map_or(OnLoss::Restart, |e| e.descriptor().on_loss);
            g.last_error = Some(format!("engine died: {why}"));
            retire(&mut g, None);
            let _ = self.apply(&mut g, PoolEvent::EngineDied);
            on_loss
        };
        if on_loss != OnLoss::Restart {
            return;
        }
        self.restarts.fetch_add(1, Ordering::Relaxed);
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(backoff(1)).await;
            me.load().await;
        });
    }

    /// Starts draining: no new leases at once; running tasks get until `deadline` to finish.
    pub fn drain(self: &Arc<Self>, deadline: Duration) -> Result<(), PoolError> {
        let mut g = self.lock();
        self.apply(&mut g, PoolEvent::Drain)?;
        // the load-time measurement is no task to wait for
        if let Some((_, probe)) = g.probe.take() {
            probe.cancel();
        }
        g.held_drained = true;
        g.drain_deadline = Some(Instant::now() + deadline);
        g.drain_cut_off = 0;
        let token = g.drain_token.clone();
        if busy(&g) == 0 {
            let _ = self.apply(&mut g, PoolEvent::DrainComplete);
        }
        drop(g);
        tokio::spawn(async move {
            tokio::time::sleep(deadline).await;
            token.cancel();
        });
        Ok(())
    }

    /// A task of this pool was ended by the drain deadline (its runner says so).
    pub fn note_cut_by_drain(&self) {
        let mut g = self.lock();
        g.drain_cut_off = g.drain_cut_off.saturating_add(1);
    }

    /// Brings a pool that refuses work back into service: a draining or drained one at once;
    /// one reloading from drained serves with its old engine until the new one takes over;
    /// one loading or restarting serves when its engine is up (and retries its load now).
    pub fn resume(&self) -> Result<(), PoolError> {
        let mut g = self.lock();
        // only a pool waiting to load again has a load to hurry (a permit left for anyone
        // else would skip the backoff of its next failure)
        let waiting_to_load = g.state == PoolState::Unready;
        self.apply(&mut g, PoolEvent::Resume)?;
        g.held_drained = false;
        g.reload_from = PoolState::Ready;
        g.drain_token = CancellationToken::new();
        g.drain_deadline = None;
        drop(g);
        if waiting_to_load {
            self.retry_now.notify_one();
        }
        Ok(())
    }

    /// Loads `new_ref` beside the current model, self-tests it and switches atomically. On
    /// failure the old model keeps serving and the cause is returned.
    pub async fn reload(self: &Arc<Self>, new_ref: &str) -> Result<u64, PoolError> {
        {
            let mut g = self.lock();
            let from = g.state;
            self.apply(&mut g, PoolEvent::ReloadStart)?;
            g.reload_from = from;
        }
        match self.load_engine(new_ref).await {
            Ok((engine, ms)) => {
                let mut g = self.lock();
                // running leases keep their Arc to the old engine; it is freed after them
                retire(&mut g, Some(engine.clone()));
                g.model_load_ms = ms;
                g.last_error = None;
                g.drain_token = CancellationToken::new();
                g.drain_deadline = None;
                // a reload puts the pool back into service (also a drained one)
                g.held_drained = false;
                let _ = self.apply(&mut g, PoolEvent::ReloadDone);
                self.reloads_ok.fetch_add(1, Ordering::Relaxed);
                drop(g);
                self.measure_full_pace(engine);
                Ok(ms)
            }
            Err(LoadFailure { message: e, .. }) => {
                let mut g = self.lock();
                let had_engine = g.engine.is_some();
                let from = g.reload_from;
                // back where it was: a drained pool stays drained (and says so)
                let _ = self.apply(&mut g, PoolEvent::ReloadFailed { had_engine, from });
                self.reloads_failed.fetch_add(1, Ordering::Relaxed);
                Err(PoolError::ReloadFailed(e))
            }
        }
    }
}

fn accepts_work(g: &Inner) -> bool {
    match g.state {
        PoolState::Ready => true,
        PoolState::Reloading => g.reload_from == PoolState::Ready && g.engine.is_some(),
        _ => false,
    }
}

/// How often a load under way says it still is.
const LOAD_PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// How often a pool whose model cannot load looks at the file for a change.
const FILE_CHECK_EVERY: Duration = Duration::from_secs(2);

/// What a failed load says: why, and whether it lasts as long as the model file does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct LoadFailure {
    pub message: String,
    pub lasting: bool,
}

impl LoadFailure {
    fn passing(message: String) -> Self {
        Self {
            message,
            lasting: false,
        }
    }
}

/// A file's size and modification time, when it can be read.
fn file_identity(path: &str) -> Option<(u64, std::time::SystemTime)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.len(), m.modified().ok()?))
}

/// Slots the pool's engines hold now: the current one's and those of engines it replaced.
fn busy(g: &Inner) -> usize {
    let current = g.engine.as_ref().map_or(0, |e| e.slots_in_use());
    let old: usize = g
        .retiring
        .iter()
        .filter_map(Weak::upgrade)
        .map(|e| e.slots_in_use())
        .sum();
    current + old
}

/// Slots tasks hold: the engine's, less those the load-time measurement holds while it runs
/// (it gives them up to the first lease, so admission counts them free). While it runs no
/// task has leased the current engine (a lease cancels it first): all its slots are the
/// measurement's.
fn busy_with_tasks(g: &Inner) -> usize {
    // once a lease cancelled it, tasks may hold slots beside its last sequences: all count
    let measuring = match (&g.probe, &g.engine) {
        (Some((_, probe)), Some(e)) if !probe.is_cancelled() => e.slots_in_use(),
        _ => 0,
    };
    busy(g).saturating_sub(measuring)
}

/// Puts `next` in the place of the pool's engine; the one it replaces keeps counting its
/// slots until its sequences are let go.
fn retire(g: &mut Inner, next: Option<Arc<dyn Engine>>) {
    if let Some(old) = std::mem::replace(&mut g.engine, next) {
        if old.slots_in_use() > 0 {
            g.retiring.push(Arc::downgrade(&old));
        }
    }
}

fn ewma(prev: Option<f64>, sample: f64) -> f64 {
    match prev {
        Some(p) => p + EWMA_ALPHA * (sample - p),
        None => sample,
    }
}

fn backoff(attempt: u32) -> Duration {
    let exp = RETRY_BASE.saturating_mul(1u32 << attempt.min(8));
    let capped = exp.min(RETRY_CAP);
    let jitter = rand::rng().random_range(0.5..1.0);
    capped.mul_f64(jitter)
}

/// What a finished task measured, for [`Pool::record_service`].
#[derive(Debug, Clone, Copy)]
pub struct ServiceSample {
    /// From taking the slot to the end.
    pub took: Duration,
    /// From taking the slot to the first token.
    pub first_token_after: Option<Duration>,
    pub prompt_tokens: usize,
    pub tokens_out: usize,
    pub max_tokens: usize,
    /// Every slot of the pool was busy when the task ended (its pace is a full pool's).
    pub pool_was_full: bool,
    /// No other task held a slot of the pool when it started or when it ended (its pace is
    /// one sequence's alone).
    pub ran_alone: bool,
}

/// Tokens each sequence decodes in the full-occupancy measurement. The sequences start one
/// after another, and the engine decodes the first ones while it prefills the others beside
/// them (a pass takes a budget of prompt tokens beside decoding sequences): the first can
/// make a dozen tokens before the last has its first one, and only the gaps after that are a
/// full pool's.
const FULL_PROBE_TOKENS: usize = 24;

/// Least number of token gaps, over all sequences, with every slot decoding for the
/// measurement to stand.
const FULL_PROBE_MIN_GAPS: usize = 8;

/// The measurement's prompt (each sequence's starts with its own number, so no prefix cache
/// serves it): about thirty tokens, the size of a short chat turn.
const FULL_PROBE_TEXT: &str =
    "is the number of this line, and the rest of it is plain text of ordinary words that a short question to a chat model could hold";

/// A pool measured with every slot busy: time per token of one sequence, and prefill time per
/// prompt token.
#[derive(Debug, Clone, Copy)]
struct FullPace {
    ms_per_token: f64,
    prefill_ms_per_token: f64,
}

/// From when each sequence's tokens came: the mean gap between two tokens of a sequence
/// after the last sequence had its first one (every slot decoding), and the prefill time per
/// prompt token until then. `None` with fewer than `FULL_PROBE_MIN_GAPS` such gaps.
fn full_pace_of(
    started: Instant,
    tokens: &[Vec<Instant>],
    prompt_tokens: usize,
) -> Option<FullPace> {
    // every sequence must have made a token
    let firsts = tokens.iter().map(|t| t.first().copied());
    let last_first = firsts.collect::<Option<Vec<_>>>()?.into_iter().max()?;
    let (mut gaps, mut span) = (0usize, 0.0f64);
    for seq in tokens {
        // a sequence's tokens come in time order
        let after = &seq[seq.partition_point(|&t| t < last_first)..];
        if let (Some(a), Some(b)) = (after.first(), after.last()) {
            gaps += after.len() - 1;
            span += (*b - *a).as_secs_f64() * 1000.0;
        }
    }
    if gaps < FULL_PROBE_MIN_GAPS {
        return None;
    }
    let ms_per_token = (span / gaps as f64).max(1e-3);
    let prefilled = (last_first - started).as_secs_f64() * 1000.0;
    let prefill_ms_per_token = if prompt_tokens > 0 {
        (prefilled - ms_per_token).max(0.0) / prompt_tokens as f64
    } else {
        0.0
    };
    Some(FullPace {
        ms_per_token,
        prefill_ms_per_token,
    })
}

/// Every slot starts a greedy sequence with a prompt of its own, one after another; the gaps
/// between tokens once every slot decodes give the pace of a full pool. `None` when the
/// engine has no free slot, fails (the self-test already proved it works) or `cancel` stops
/// it (its sequences end at once).
async fn full_occupancy_pace(engine: &dyn Engine, cancel: &CancellationToken) -> Option<FullPace> {
    let slots = engine.descriptor().slots.max(1);
    let started = Instant::now();
    let mut readers = Vec::with_capacity(slots);
    let mut prompt_tokens = 0usize;
    // a slot taken by a real task meanwhile: the sequences already started end too
    let stop_all = cancel.clone().drop_guard();
    for i in 0..slots {
        let prompt = PromptInput::Text(format!("{i} {FULL_PROBE_TEXT}"));
        let tokens = engine.tokenize(&prompt, "").ok()?;
        prompt_tokens += tokens.as_ref().map_or(0, Vec::len);
        if cancel.is_cancelled() {
            return None;
        }
        let permit = engine.try_acquire()?;
        let mut job = EngineJob::new(permit, prompt, SamplingParams::default(), FULL_PROBE_TOKENS);
        job.prompt_tokens = tokens;
        job.cancel = cancel.child_token();
        let mut rx = engine.start(job).ok()?;
        // read every stream at once: when each token comes is the measurement
        readers.push(tokio::spawn(async move {
            let mut at = Vec::with_capacity(FULL_PROBE_TOKENS);
            while let Some(ev) = rx.recv().await {
                match ev {
                    SeqEvent::Token { .. } => at.push(Instant::now()),
                    SeqEvent::Done(_) | SeqEvent::Failed(_) => break,
                }
            }
            at
        }));
    }
    let all = async {
        let mut out = Vec::with_capacity(readers.len());
        for r in readers {
            out.push(r.await.ok()?);
        }
        Some(out)
    };
    let tokens = tokio::time::timeout(SELF_TEST_TIMEOUT, all).await.ok()??;
    if cancel.is_cancelled() {
        return None;
    }
    stop_all.disarm();
    full_pace_of(started, &tokens, prompt_tokens)
}

/// Tokens the self-test decodes: the first proves the engine works, the gaps between the
/// others are the pace of one sequence alone.
const SELF_TEST_TOKENS: usize = 8;

/// Least number of gaps between the self-test's tokens for its pace to stand.
const SELF_TEST_MIN_GAPS: usize = 3;

/// Decodes a few tokens greedily to prove the engine works before it takes traffic. Returns
/// the mean gap between its tokens after the first (one sequence alone), when there were
/// [`SELF_TEST_MIN_GAPS`] gaps or more (a model may end its answer sooner).
async fn self_test(engine: &dyn Engine) -> Result<Option<f64>, String> {
    if !engine.descriptor().generates {
        return embed_self_test(engine).await.map(|()| None);
    }
    let prompt = PromptInput::Text("Hello".into());
    let tokens = engine
        .tokenize(&prompt, "")
        .map_err(|e| format!("self-test tokenize: {e}"))?;
    let permit = engine
        .try_acquire()
        .ok_or_else(|| "self-test: the new engine has no free slot".to_string())?;
    let mut job = EngineJob::new(permit, prompt, SamplingParams::default(), SELF_TEST_TOKENS);
    job.prompt_tokens = tokens;
    let mut rx = engine
        .start(job)
        .map_err(|e: PortError| format!("self-test start: {e}"))?;
    let run = async {
        let mut at: Vec<Instant> = Vec::with_capacity(SELF_TEST_TOKENS);
        while let Some(ev) = rx.recv().await {
            match ev {
                SeqEvent::Token { .. } => at.push(Instant::now()),
                SeqEvent::Done(_) => return Ok(solo_pace_of(&at)),
                SeqEvent::Failed(m) => return Err(format!("self-test decode: {m}")),
            }
        }
        Err("self-test: engine stopped".to_string())
    };
    tokio::time::timeout(SELF_TEST_TIMEOUT, run)
        .await
        .map_err(|_| "self-test timed out".to_string())?
}

/// The self-test of a model that only embeds: one text embedded to a vector of the length
/// the engine says, every element finite.
async fn embed_self_test(engine: &dyn Engine) -> Result<(), String> {
    let input = engine_port::EmbedInput::Text("Hello".into());
    let tokens = engine
        .embed_tokens(&input, true)
        .map_err(|e| format!("self-test tokenize: {e}"))?;
    let permit = engine
        .try_acquire()
        .ok_or_else(|| "self-test: the new engine has no free slot".to_string())?;
    let dims = engine.descriptor().embedding.map_or(0, |e| e.dims);
    let rx = engine
        .embed(engine_port::EmbedJob {
            permit,
            inputs: vec![input],
            tokens: tokens.map(|t| vec![t]),
            // a vector of the model's width whatever its own pooling (a reranker scores)
            pooling: Some(engine_port::Pooling::Mean),
            normalize: true,
            cancel: CancellationToken::new(),
        })
        .map_err(|e| format!("self-test embed: {e}"))?;
    let answer = tokio::time::timeout(SELF_TEST_TIMEOUT, rx)
        .await
        .map_err(|_| "self-test timed out".to_string())?
        .map_err(|_| "self-test: engine stopped".to_string())?
        .map_err(|e| format!("self-test embed: {e}"))?;
    let v = answer.first().and_then(|vs| vs.first());
    match v {
        Some(v) if v.len() == dims && v.iter().all(|x| x.is_finite()) => Ok(()),
        _ => Err(format!("self-test embed: not one finite vector of {dims}")),
    }
}

/// The mean gap in ms between tokens that came at `at` (after the first: its time is the
/// prompt's), with at least [`SELF_TEST_MIN_GAPS`] gaps.
fn solo_pace_of(at: &[Instant]) -> Option<f64> {
    let (first, last) = (at.first()?, at.last()?);
    let gaps = at.len() - 1;
    (gaps >= SELF_TEST_MIN_GAPS)
        .then(|| ((*last - *first).as_secs_f64() * 1000.0 / gaps as f64).max(1e-3))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(start: Instant, ms: &[u64]) -> Vec<Instant> {
        ms.iter()
            .map(|&m| start + Duration::from_millis(m))
            .collect()
    }

    fn measured_pool() -> Arc<Pool> {
        let spec = PoolSpec::local("p", "m", None, 2, 512, Default::default());
        let pool = Pool::new(
            spec,
            Arc::new(crate::registry::NothingToLoad),
            Arc::new(Notify::new()),
        );
        // as after the load: the self-test's step and the full-occupancy measurement
        {
            let mut g = pool.lock();
            g.ms_per_token_ewma = Some(20.0);
            g.full_ms_per_token_ewma = Some(40.0);
            g.full_pace_from_probe_only = true;
            g.prefill_ms_per_token_ewma = Some(1.0);
        }
        pool
    }

    /// A task of 30 prompt tokens that ended in a full pool.
    fn full_pool_sample(
        took_ms: u64,
        first_ms: u64,
        tokens_out: usize,
        max: usize,
    ) -> ServiceSample {
        ServiceSample {
            took: Duration::from_millis(took_ms),
            first_token_after: Some(Duration::from_millis(first_ms)),
            prompt_tokens: 30,
            tokens_out,
            max_tokens: max,
            pool_was_full: true,
            ran_alone: false,
        }
    }

    /// ORCH-ADM-DL-7: a one-token task (a client's classification or warm-up) has no gap
    /// between tokens: its time, a prefill queued behind the other slots', leaves every pace
    /// as it was and measures the prefill only; a task of many tokens in a full pool replaces
    /// the probe's pace with what its gaps showed.
    #[test]
    fn a_one_token_task_says_nothing_of_the_decode_pace() {
        let pool = measured_pool();
        pool.record_service(full_pool_sample(400, 400, 1, 1));
        let s = pool.snapshot();
        assert_eq!(s.ms_per_token_ewma, Some(20.0));
        assert_eq!(s.full_ms_per_token_ewma, Some(40.0));
        assert!(s.full_pace_from_probe_only);
        // the prefill: 400 ms less one step, over 30 prompt tokens, into the average
        let prefill = 1.0 + EWMA_ALPHA * ((400.0 - 20.0) / 30.0 - 1.0);
        assert!(
            (s.prefill_ms_per_token_ewma.unwrap() - prefill).abs() < 1e-9,
            "{s:?}"
        );

        pool.record_service(full_pool_sample(100 + 50 * 10, 100, 11, 16));
        let s = pool.snapshot();
        assert_eq!(s.full_ms_per_token_ewma, Some(50.0));
        assert!(!s.full_pace_from_probe_only);
    }

    /// ORCH-ADM-DL-8: paces measured at load on a busy machine (solo 1,000 ms, a full pool
    /// 1,085 ms) are replaced by the first real task: one alone sets the solo and mean pace,
    /// and the full pool's load-time pace keeps its ratio to the solo one until a real task
    /// measures a full pool; a task in company that went faster than the solo pace lowers it.
    #[test]
    fn the_first_real_task_replaces_paces_measured_on_a_busy_machine() {
        let pool = measured_pool();
        {
            let mut g = pool.lock();
            g.ms_per_token_ewma = Some(1000.0);
            g.solo_ms_per_token = Some(1000.0);
            g.solo_from_probe_only = true;
            g.pace_from_probe_only = true;
            g.full_ms_per_token_ewma = Some(1085.0);
            g.prefill_ms_per_token_ewma = Some(300.0);
            g.prefill_from_probe_only = true;
        }
        assert!(!pool.snapshot().pace_confirmed);
        // 64 tokens alone, 14 ms apart, the first after 30 ms (30 prompt tokens)
        pool.record_service(ServiceSample {
            ran_alone: true,
            pool_was_full: false,
            ..full_pool_sample(30 + 14 * 63, 30, 64, 64)
        });
        let s = pool.snapshot();
        assert!(s.pace_confirmed);
        assert_eq!(s.solo_ms_per_token, Some(14.0));
        assert_eq!(s.ms_per_token_ewma, Some(14.0));
        assert!(
            (s.full_ms_per_token_ewma.unwrap() - 1085.0 * 0.014).abs() < 1e-9,
            "{s:?}"
        );
        assert!(
            (s.prefill_ms_per_token_ewma.unwrap() - 16.0 / 30.0).abs() < 1e-9,
            "{s:?}"
        );
        // beside another task, 10 ms a token: one alone is no slower
        pool.record_service(ServiceSample {
            pool_was_full: false,
            ..full_pool_sample(20 + 10 * 9, 20, 10, 10)
        });
        assert_eq!(pool.snapshot().solo_ms_per_token, Some(10.0));
    }

    /// ORCH-ADM-DL-7: the first sequence decodes fast while the second is prefilled beside it; only the gaps
    /// after the second's first token are a full pool's (the mean over all tokens, or the
    /// tail divided by the tokens per sequence, would read 10–17 ms here).
    #[test]
    fn a_full_pool_is_measured_after_every_slot_has_its_first_token() {
        let t0 = Instant::now();
        let early: Vec<u64> = (1..=10)
            .map(|k| k * 10)
            .chain([130, 160, 190, 220])
            .collect();
        let late = [100, 130, 160, 190, 220];
        let pace = full_pace_of(t0, &[at(t0, &early), at(t0, &late)], 50).unwrap();
        assert!((pace.ms_per_token - 30.0).abs() < 1e-6, "{pace:?}");
        // prefilled when the last first token came, less one step, over 50 prompt tokens
        assert!(
            (pace.prefill_ms_per_token - 70.0 / 50.0).abs() < 1e-6,
            "{pace:?}"
        );
        // too few gaps with every slot busy: no measurement
        assert!(full_pace_of(t0, &[at(t0, &early), at(t0, &late[..3])], 50).is_none());
        // a sequence that made no token: no measurement
        assert!(full_pace_of(t0, &[at(t0, &early), Vec::new()], 50).is_none());
    }
}
