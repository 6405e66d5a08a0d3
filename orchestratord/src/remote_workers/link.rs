//! One connected worker: what the socket loop and the worker's engines share. The link owns the
//! worker's capacity (`max_concurrent` spans all its models), its requests in flight, and the
//! frames waiting to be written.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use contracts::worker::{ServerToWorker, TokenCounts};
use pool_manager::{CachedPrefixes, SlotPermit, Slots, MAX_PUBLISHED_BLOCKS};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::held_changes::Followed;

/// Frames waiting for the socket writer, per worker.
pub const OUTBOUND_CAPACITY: usize = 1024;

/// How long after one of our requests ended a load report may still count it: the worker
/// computes `current_load` when it answers a ping, which can be before it let go of a request
/// whose last frame it already sent, or before our cancel reached it (one round trip).
pub const REPORT_LAG: Duration = Duration::from_millis(500);

/// What the worker sent about one request, routed to the engine relay that waits for it.
#[derive(Debug)]
pub enum RequestEvent {
    Chunk(String),
    Complete {
        status_code: u16,
        body: Option<String>,
        token_counts: Option<TokenCounts>,
    },
    Error {
        code: String,
        message: String,
    },
}

pub struct WorkerLink {
    pub id: String,
    pub name: String,
    pub protocol_version: Option<String>,
    pub max_concurrent: usize,
    pub chunk_backlog: usize,
    outbound: mpsc::Sender<ServerToWorker>,
    inflight: Mutex<HashMap<String, mpsc::Sender<RequestEvent>>>,
    /// The worker's `max_concurrent` slots, shared by all its models' pools.
    slots: Slots,
    /// Load the worker reported beyond our own requests (other servers' work): reported
    /// `current_load` minus what we had in flight then. Ours is counted live, so a report
    /// that lags behind our requests ending never holds a free slot back.
    external_load: AtomicUsize,
    /// When our requests gave their slots back, the last [`REPORT_LAG`] of them (bounded):
    /// a report may still count these, so they are not read as others' load.
    released: Mutex<VecDeque<Instant>>,
    draining: AtomicBool,
    /// Fired when the socket is gone: engines report dead, relays see their channel close.
    pub closed: CancellationToken,
    /// Fired when a drained worker has nothing left in flight: the socket loop closes it.
    pub drained: CancellationToken,
    models: Mutex<Vec<String>>,
    /// What its engines hold, per model it serves, as its `held_prefixes` frames say (PLACE-6).
    held: Mutex<HashMap<String, Followed>>,
}

impl WorkerLink {
    pub fn new(
        id: String,
        name: String,
        protocol_version: Option<String>,
        max_concurrent: usize,
        chunk_backlog: usize,
        initial_load: usize,
    ) -> (Self, mpsc::Receiver<ServerToWorker>) {
        let (tx, rx) = mpsc::channel(OUTBOUND_CAPACITY);
        (
            Self {
                id,
                name,
                protocol_version,
                max_concurrent,
                chunk_backlog,
                outbound: tx,
                inflight: Mutex::new(HashMap::new()),
                slots: Slots::new(max_concurrent),
                external_load: AtomicUsize::new(initial_load),
                released: Mutex::new(VecDeque::new()),
                draining: AtomicBool::new(false),
                closed: CancellationToken::new(),
                drained: CancellationToken::new(),
                models: Mutex::new(Vec::new()),
                held: Mutex::new(HashMap::new()),
            },
            rx,
        )
    }

    fn inflight(&self) -> std::sync::MutexGuard<'_, HashMap<String, mpsc::Sender<RequestEvent>>> {
        self.inflight.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a frame for the worker; false when the socket is gone or hopelessly behind.
    pub fn send(&self, msg: ServerToWorker) -> bool {
        !self.closed.is_cancelled() && self.outbound.try_send(msg).is_ok()
    }

    /// Registers a request about to be sent; its events arrive on the returned channel, which
    /// closes without a terminal event when the worker is lost.
    pub fn open_request(&self, request_id: &str) -> Option<mpsc::Receiver<RequestEvent>> {
        if self.closed.is_cancelled() {
            return None;
        }
        let (tx, rx) = mpsc::channel(self.chunk_backlog);
        self.inflight().insert(request_id.to_string(), tx);
        Some(rx)
    }

    /// Forgets a request (finished, cancelled or failed).
    pub fn close_request(&self, request_id: &str) {
        self.inflight().remove(request_id);
    }

    /// Where the events of `request_id` go, if it is still in flight here.
    pub fn route(&self, request_id: &str) -> Option<mpsc::Sender<RequestEvent>> {
        self.inflight().get(request_id).cloned()
    }

    /// Drops every request's channel: their tasks see the worker lost.
    pub fn lose_all(&self) {
        self.inflight().clear();
    }

    /// Our requests the worker runs (slots taken).
    pub fn in_flight(&self) -> usize {
        self.slots.in_use()
    }

    /// Whether `permit` is one of this worker's slots.
    pub fn owns(&self, permit: &SlotPermit) -> bool {
        self.slots.owns(permit)
    }

    /// One of the worker's slots, unless it is gone or draining; a drained worker's last
    /// slot given back fires `drained`.
    pub fn try_acquire(self: &Arc<Self>) -> Option<SlotPermit> {
        if self.closed.is_cancelled() || self.is_draining() {
            return None;
        }
        let mut permit = self.slots.try_acquire()?;
        let me = Arc::downgrade(self);
        permit.on_release(move || {
            if let Some(link) = me.upgrade() {
                link.note_released(Instant::now());
                if link.is_draining() && link.in_flight() == 0 {
                    link.drained.cancel();
                }
            }
        });
        Some(permit)
    }

    fn released(&self) -> std::sync::MutexGuard<'_, VecDeque<Instant>> {
        self.released.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn note_released(&self, at: Instant) {
        let mut r = self.released();
        while r
            .front()
            .is_some_and(|t| at.duration_since(*t) > REPORT_LAG)
        {
            r.pop_front();
        }
        // more ends within the lag than this bound count as this bound
        if r.len() >= self.max_concurrent.max(1) * 4 {
            r.pop_front();
        }
        r.push_back(at);
    }

    /// Our requests that ended within [`REPORT_LAG`] before `now`.
    fn recently_released(&self, now: Instant) -> usize {
        self.released()
            .iter()
            .filter(|t| now.saturating_duration_since(**t) <= REPORT_LAG)
            .count()
    }

    /// Takes a `current_load` report; returns whether the load beyond ours changed. What we
    /// run is counted live, and what ended here just before the report is not others' load.
    pub fn set_reported_load(&self, load: usize) -> bool {
        let ours = self.in_flight() + self.recently_released(Instant::now());
        self.set_external(load.saturating_sub(ours))
    }

    /// The worker refused a request for want of a slot: until its next report it counts as
    /// full (others' work fills what ours leaves).
    pub fn note_full(&self) {
        self.set_external(self.max_concurrent.saturating_sub(self.in_flight()));
    }

    fn set_external(&self, external: usize) -> bool {
        self.external_load.swap(external, Ordering::SeqCst) != external
    }

    /// What the worker runs now: our requests (live) plus its last report of others'.
    pub fn load(&self) -> usize {
        self.in_flight() + self.external_load.load(Ordering::SeqCst)
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Starts draining: no new requests; `drained` fires once nothing is in flight.
    /// False if it was already draining.
    pub fn start_drain(&self) -> bool {
        if self.draining.swap(true, Ordering::SeqCst) {
            return false;
        }
        if self.in_flight() == 0 {
            self.drained.cancel();
        }
        true
    }

    pub fn models(&self) -> Vec<String> {
        self.models
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn set_models(&self, models: Vec<String>) {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|m, _| models.contains(m));
        *self.models.lock().unwrap_or_else(|p| p.into_inner()) = models;
    }

    /// Takes a `held_prefixes` frame in (at most [`MAX_PUBLISHED_BLOCKS`] blocks a model); one
    /// for a model the worker does not serve is dropped.
    pub fn take_held(&self, model: &str, seq: u64, full: bool, added: &[u64], evicted: &[u64]) {
        if !self.models().iter().any(|m| m == model) {
            return;
        }
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let followed = held.entry(model.to_string()).or_default();
        if !followed.take(seq, full, added, evicted, MAX_PUBLISHED_BLOCKS) {
            tracing::debug!(worker_id = %self.id, model, seq, "held prefixes: a frame missed; waiting for a whole set");
        }
    }

    /// What the worker's engines hold for `model`, once it said so (a worker that does not
    /// say: `None`, and placement counts what it sent there instead).
    pub fn held(&self, model: &str) -> Option<Arc<CachedPrefixes>> {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.get(model).and_then(|f| f.held()).cloned()
    }
}
