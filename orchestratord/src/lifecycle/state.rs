//! The shared state of the server and the task-ending helpers every path uses.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use metrics_exporter_prometheus::PrometheusHandle;
use pool_manager::{PoolRegistry, PoolSnapshot};
use tokio::sync::Notify;

use crate::config::Config;
use crate::lifecycle::queue::TaskQueue;
use crate::lifecycle::task::Task;
use crate::lifecycle::task_store::TaskStore;
use crate::metrics;
use crate::sessions::SessionStore;

pub struct AppState {
    pub cfg: Config,
    pub pools: PoolRegistry,
    pub queue: TaskQueue,
    /// Tenants' quotas and their per-minute windows.
    pub quotas: crate::lifecycle::quota::Quotas,
    pub tasks: TaskStore,
    /// The tasks in a slot now, by pool (for start predictions).
    pub running: crate::lifecycle::running::RunningTasks,
    pub sessions: SessionStore,
    /// Which pool each conversation last ran on (placement's session affinity).
    pub placement_sessions: crate::lifecycle::placement::PlacementSessions,
    /// The prefixes placement sent to pools whose engines do not say what they hold.
    pub placement_sent: crate::lifecycle::placement::SentPrefixes,
    /// Wakes the dispatcher: new task queued, slot freed, pool state changed.
    pub wake: Arc<Notify>,
    pub metrics: PrometheusHandle,
    pub shutting_down: AtomicBool,
    /// Cancelled when the server shuts down: background adapters stop on it.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// What the Hyperswarm host reports to `/v1/capabilities`, set by the host once it runs.
    pub hyperswarm: std::sync::OnceLock<CapabilityReport<contracts::HyperswarmCapability>>,
    /// Where prompts are templated and tokenized and grammars compiled: threads of their own,
    /// below the decode loop, fair among tenants (`request_work.rs`).
    pub request_work: crate::lifecycle::request_work::RequestWork,
    /// Connected remote workers.
    pub workers: crate::remote_workers::WorkerRegistry,
    /// API keys and the failed-attempt limiter.
    pub auth: Arc<crate::auth::Auth>,
    /// Where models may be loaded from (`POST /engines`, reloads).
    pub model_dirs: crate::model_paths::ModelDirs,
    /// The model folder: its models listed, loaded on demand, unloaded when idle.
    pub models_folder: crate::models_folder::ModelsFolder,
    /// SHA-256 of model files, remembered per file version (Ollama's `digest`).
    pub model_digests: crate::model_digest::ModelDigests,
    /// Task records and artifacts that outlive the process.
    pub records: crate::records::Records,
    /// This replica's link to its cluster (`cluster.nats_urls`), set once connected at start.
    pub cluster: std::sync::OnceLock<Arc<crate::cluster::Cluster>>,
    /// The cluster's task path (queues, relay), set with `cluster`.
    pub cluster_tasks: std::sync::OnceLock<Arc<dyn crate::lifecycle::cluster_port::ClusterPort>>,
    /// In a cluster: the admissions under way, by client task id (`in_flight.rs`).
    pub admitting: crate::lifecycle::in_flight::InFlight,
    /// The console's last minutes (throughput, time to first token).
    pub console_history: crate::routes::console::History,
    pub started_at: Instant,
}

pub type SharedState = Arc<AppState>;

/// How a background adapter reports its live status without core state knowing its types.
pub type CapabilityReport<T> = Box<dyn Fn() -> T + Send + Sync>;

impl AppState {
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    /// Snapshots of the pools that could run `task` (its pin, or the pools serving its model).
    pub fn candidate_snapshots(&self, task: &Task) -> Vec<PoolSnapshot> {
        self.pools
            .all()
            .into_iter()
            .filter(|p| match (&task.pin, &task.model) {
                (Some(pin), _) => p.id() == pin,
                (None, Some(m)) => p.serves(m),
                (None, None) => true,
            })
            .map(|p| p.snapshot())
            .collect()
    }

    /// Refreshes the pool gauges.
    pub fn publish_pool_gauges(&self) {
        for p in self.pools.all() {
            metrics::pool(&p.snapshot(), self.queued_for(&p));
        }
    }

    /// Queued tasks `pool` could serve: pinned to it, or of a model it serves, or of no model.
    pub fn queued_for(&self, pool: &pool_manager::Pool) -> usize {
        self.queue.count_where(|t| match (&t.pin, &t.model) {
            (Some(pin), _) => pin == pool.id(),
            (None, Some(m)) => pool.serves(m),
            (None, None) => true,
        })
    }

    /// Runs the metrics upkeep (see `metrics.rs`) every `metrics.upkeep_interval_ms` until
    /// shutdown.
    pub async fn metrics_upkeep_loop(self: Arc<Self>) {
        let period = std::time::Duration::from_millis(self.cfg.metrics.upkeep_interval_ms);
        let mut every = tokio::time::interval(period);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => return,
                _ = every.tick() => {}
            }
            let pools: Vec<(PoolSnapshot, usize)> = self
                .pools
                .all()
                .iter()
                .map(|p| (p.snapshot(), self.queued_for(p)))
                .collect();
            metrics::upkeep(
                &self.metrics,
                &pools,
                self.cfg.queue.capacity,
                self.records.total_bytes(),
            );
        }
    }
}

/// Remote workers reach the server through this (given to each when it connects).
impl crate::remote_workers::WorkerHost for AppState {
    fn config(&self) -> &Config {
        &self.cfg
    }

    fn pools(&self) -> &PoolRegistry {
        &self.pools
    }

    fn workers(&self) -> &crate::remote_workers::WorkerRegistry {
        &self.workers
    }

    fn wake(&self) {
        self.wake.notify_one();
    }

    fn shutdown(&self) -> &tokio_util::sync::CancellationToken {
        &self.shutdown
    }

    fn is_shutting_down(&self) -> bool {
        AppState::is_shutting_down(self)
    }
}
