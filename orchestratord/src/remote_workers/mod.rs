//! Remote workers (seed 002): GPU machines anywhere connect out to `GET /v1/worker/connect`
//! over WebSocket, register their models, and serve the queue. Each model of a worker is a
//! pool of kind `remote` (id `<worker id>:<model>`) with the worker's `max_concurrent` slots,
//! placed, cancelled, drained and measured like a local pool.
//!
//! - `socket`: the route, registration, heartbeat and the frame loop of one worker.
//! - `link`: one worker's shared state (capacity, requests in flight, outbound frames).
//! - `engine`: the Engine port over a link (text in, token events out, requeue on loss).
//! - `embed`: embedding jobs as the backends take them (`/v1/embeddings`, `/v1/rerank`).
//! - `openai_wire`: the OpenAI request body and stream reader the backends speak.
//! - `names`: which worker and model names are accepted.

mod embed;
mod engine;
mod host;
mod link;
mod names;
pub mod openai_wire;
mod socket;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pool_manager::{PoolRegistry, PoolSpec};

pub use engine::{RemoteEngine, ENGINE_NAME};
pub use host::WorkerHost;
pub use link::WorkerLink;
pub use socket::{connect, ConnectQuery};

use crate::config::WorkersConfig;

/// Models remembered as served by workers (beyond the configured ones).
const MAX_KNOWN_MODELS: usize = 1024;

/// The connected workers and the models workers serve.
pub struct WorkerRegistry {
    cfg: WorkersConfig,
    links: Mutex<HashMap<String, Arc<WorkerLink>>>,
    known: Mutex<BTreeSet<String>>,
    limiter: crate::auth::limiter::FailureLimiter,
}

impl WorkerRegistry {
    pub fn new(cfg: &WorkersConfig) -> Self {
        Self {
            limiter: crate::auth::limiter::FailureLimiter::new(cfg.max_auth_failures_per_minute),
            known: Mutex::new(cfg.models.iter().cloned().collect()),
            links: Mutex::new(HashMap::new()),
            cfg: cfg.clone(),
        }
    }

    fn links(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<WorkerLink>>> {
        self.links.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn known(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether workers are on (a secret is set).
    pub fn enabled(&self) -> bool {
        self.cfg.active_secret().is_some()
    }

    /// Whether workers serve `model` (configured, or registered by a worker since start): its
    /// tasks wait for a worker instead of being refused.
    pub fn knows_model(&self, model: &str) -> bool {
        self.enabled() && self.known().contains(model)
    }

    fn remember(&self, models: &[String]) {
        let mut k = self.known();
        for m in models {
            if k.len() >= MAX_KNOWN_MODELS + self.cfg.models.len() {
                break;
            }
            k.insert(m.clone());
        }
    }

    /// The queue timeout of a queued task (pinned to `pin`, or asking for `model`) that only
    /// workers can run (its model has no local pool, or it is pinned to a remote pool);
    /// `None` for tasks local pools serve.
    pub fn queue_timeout_for(
        &self,
        pools: &PoolRegistry,
        pin: Option<&str>,
        model: Option<&str>,
    ) -> Option<Duration> {
        if !self.enabled() {
            return None;
        }
        let pools = pools.all();
        let local_serves = match (pin, model) {
            (Some(pin), _) => pools.iter().any(|p| p.id() == pin && p.spec().is_local()),
            (None, Some(m)) => pools.iter().any(|p| p.spec().is_local() && p.serves(m)),
            (None, None) => true,
        };
        (!local_serves).then(|| Duration::from_millis(self.cfg.queue_timeout_ms))
    }

    pub fn list(&self) -> Vec<Arc<WorkerLink>> {
        let mut v: Vec<_> = self.links().values().cloned().collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    pub fn get(&self, id: &str) -> Option<Arc<WorkerLink>> {
        self.links().get(id).cloned()
    }

    /// Registers a worker named `name` under a free id, built by `make` while the registry is
    /// locked (two workers of one name registering at once get different ids); `None` when
    /// `max_workers` are connected. The id is `w-<name>` (characters a pool id cannot hold
    /// become `_`), with `-2`, `-3`, … while a connected worker holds it: a worker that
    /// reconnects gets its old id back, so its pool ids (and their metric label sets) stay.
    fn add(
        &self,
        name: &str,
        make: impl FnOnce(String) -> Arc<WorkerLink>,
    ) -> Option<Arc<WorkerLink>> {
        let mut g = self.links();
        if g.len() >= self.cfg.max_workers {
            return None;
        }
        let base = format!("w-{}", clean(name));
        let id = std::iter::once(base.clone())
            .chain((2..).map(|n| format!("{base}-{n}")))
            .find(|id| !g.contains_key(id))?;
        let link = make(id.clone());
        g.insert(id, link.clone());
        crate::metrics::workers_connected(g.len());
        Some(link)
    }

    fn remove(&self, id: &str) {
        let mut g = self.links();
        g.remove(id);
        crate::metrics::workers_connected(g.len());
    }

    /// Drains every worker (server shutdown): `graceful_shutdown`, no new work, close when
    /// idle.
    pub fn drain_all(&self, state: &dyn WorkerHost, reason: &str, deadline: Duration) {
        for link in self.list() {
            drain(state, &link, reason, deadline);
        }
    }
}

/// Drains one worker: its pools take no new work, it is told `graceful_shutdown`, and its
/// socket closes once its requests in flight are done (running tasks keep `deadline`).
pub fn drain(state: &dyn WorkerHost, link: &WorkerLink, reason: &str, deadline: Duration) {
    for pool in state.pools().all() {
        if pool.spec().worker_id() == Some(link.id.as_str()) {
            let _ = pool.drain(deadline);
        }
    }
    if link.start_drain() {
        link.send(contracts::worker::ServerToWorker::GracefulShutdown {
            reason: Some(reason.to_string()),
            drain_timeout_secs: Some(deadline.as_secs().max(1)),
        });
    }
}

/// `s` with characters a URL path segment or a pool id may not hold replaced by `_`.
fn clean(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The pool id of a worker's model: `<worker id>:<model>` (cleaned).
pub fn pool_id(worker_id: &str, model: &str) -> String {
    format!("{worker_id}:{}", clean(model))
}

/// Makes the worker's pools match `models`: new models become Ready remote pools, models it
/// no longer lists lose theirs (running tasks keep their lease and finish).
pub fn sync_pools(state: &dyn WorkerHost, link: &Arc<WorkerLink>, models: &[String]) {
    state.workers().remember(models);
    let wanted: BTreeSet<String> = models.iter().map(|m| pool_id(&link.id, m)).collect();
    for pool in state.pools().all() {
        if pool.spec().worker_id() == Some(link.id.as_str()) && !wanted.contains(pool.id()) {
            state.pools().remove(pool.id());
            pool.engine_died("the worker no longer serves this model");
        }
    }
    for model in models {
        let id = pool_id(&link.id, model);
        if state.pools().get(&id).is_some() {
            continue;
        }
        let engine = Arc::new(RemoteEngine::new(
            link.clone(),
            model.clone(),
            state.config().workers.ctx,
        ));
        let spec = PoolSpec::remote(
            id,
            format!("worker:{}/{model}", link.name),
            model.clone(),
            link.id.clone(),
            engine,
        );
        // taken meanwhile (another registration of the same id): the pool there serves
        let _ = state.pools().add(spec);
    }
    link.set_models(models.to_vec());
}

/// Removes every pool of a worker whose socket is gone.
fn remove_pools(state: &dyn WorkerHost, worker_id: &str) {
    for pool in state.pools().all() {
        if pool.spec().worker_id() == Some(worker_id) {
            state.pools().remove(pool.id());
            pool.engine_died("the worker disconnected");
        }
    }
}
