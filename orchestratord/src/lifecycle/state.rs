//! The lifecycle's state, which every step of a task reads and changes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use metrics_exporter_prometheus::PrometheusHandle;
use pool_manager::{PoolRegistry, PoolSnapshot};
use tokio::sync::Notify;

use crate::config::Config;
use crate::lifecycle::ports::{ModelsPort, WorkersPort};
use crate::lifecycle::queue::TaskQueue;
use crate::lifecycle::task::Task;
use crate::lifecycle::task_store::TaskStore;
use crate::metrics;
use crate::sessions::SessionStore;

/// What the lifecycle owns: the pools, the queue, the tasks and everything their admission,
/// placement, run and ending read and change. The composition root (`app_state.rs`) builds it
/// and holds it beside the parts above the lifecycle (remote workers, the models folder, the
/// cluster, keys, the console), which reach it through [`SharedLifecycle`]; the lifecycle
/// reaches them only through its ports (`ports.rs`, `cluster_port.rs`).
pub struct Lifecycle {
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
    pub placement_sessions: crate::lifecycle::placement::sessions::PlacementSessions,
    /// The prefixes placement sent to pools whose engines do not say what they hold.
    pub placement_sent: crate::lifecycle::placement::sent::SentPrefixes,
    /// Wakes the dispatcher: new task queued, slot freed, pool state changed.
    pub wake: Arc<Notify>,
    pub metrics: PrometheusHandle,
    pub shutting_down: AtomicBool,
    /// Cancelled when the server shuts down: background adapters stop on it.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// Where prompts are templated and tokenized and grammars compiled: threads of their own,
    /// below the decode loop, fair among tenants (`request_work.rs`).
    pub request_work: crate::lifecycle::request_work::RequestWork,
    /// Task records and artifacts that outlive the process.
    pub records: crate::records::Records,
    /// The cluster's task path (queues, relay), set once this replica is connected to its
    /// cluster (`cluster.nats_urls`).
    pub cluster_tasks: std::sync::OnceLock<Arc<dyn crate::lifecycle::cluster_port::ClusterPort>>,
    /// In a cluster: the admissions under way, by client task id (`in_flight.rs`).
    pub admitting: crate::lifecycle::in_flight::InFlight,
    /// What the lifecycle asks of remote workers.
    pub workers_port: Arc<dyn WorkersPort>,
    /// What admission asks of the models folder.
    pub models_port: Arc<dyn ModelsPort>,
    pub started_at: Instant,
}

pub type SharedLifecycle = Arc<Lifecycle>;

impl Lifecycle {
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
