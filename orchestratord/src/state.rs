//! The shared state of the server and the task-ending helpers every path uses.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use contracts::worker::{CancelReason as WireCancel, MAX_REQUEUE_COUNT};
use contracts::{ErrorCode, SseError};
use metrics_exporter_prometheus::PrometheusHandle;
use pool_manager::{PoolRegistry, PoolSnapshot};
use tokio::sync::Notify;

use crate::config::Config;
use crate::lifecycle::queue::TaskQueue;
use crate::lifecycle::task::Task;
use crate::lifecycle::task_store::TaskStore;
use crate::metrics::{self, CancelReason};
use crate::sessions::SessionStore;

pub struct AppState {
    pub cfg: Config,
    pub pools: PoolRegistry,
    pub queue: TaskQueue,
    pub tasks: TaskStore,
    /// The tasks in a slot now, by pool (for start predictions).
    pub running: crate::lifecycle::running::RunningTasks,
    pub sessions: SessionStore,
    /// Wakes the dispatcher: new task queued, slot freed, pool state changed.
    pub wake: Arc<Notify>,
    pub metrics: PrometheusHandle,
    pub shutting_down: AtomicBool,
    /// Cancelled when the server shuts down: background adapters stop on it.
    pub shutdown: tokio_util::sync::CancellationToken,
    /// What the Hyperswarm host reports to `/v1/capabilities`, set by the host once it runs.
    pub hyperswarm: std::sync::OnceLock<CapabilityReport<contracts::HyperswarmCapability>>,
    /// Where prompts are templated and tokenized (bounded, off the async runtime).
    pub tokenizers: crate::lifecycle::tokenize::Tokenizers,
    /// Connected remote workers.
    pub workers: crate::remote_workers::WorkerRegistry,
    /// API keys and the failed-attempt limiter.
    pub auth: crate::auth::Auth,
    /// Where models may be loaded from (`POST /engines`, reloads).
    pub model_dirs: crate::model_paths::ModelDirs,
    /// Task records and artifacts that outlive the process.
    pub records: crate::records::Records,
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

    fn after_end(&self, task: &Task) {
        self.queue.remove(task);
        self.records.task_ended(&task.owner, task.record());
        if let Some(sid) = &task.session_id {
            let g = task.lock();
            let refund = (task.spec.max_tokens as u64).saturating_sub(g.tokens_out as u64);
            let time = match (g.first_token_at, g.ended_at) {
                (Some(a), Some(b)) => (b - a).as_millis() as u64,
                _ => 0,
            };
            drop(g);
            self.sessions.settle(&task.owner, sid, refund, time);
        }
        self.wake.notify_one();
    }

    /// Cancels a queued or running task. After this returns, the task emits no more tokens.
    /// False if it had already ended.
    pub fn cancel_task(&self, task: &Task, reason: CancelReason) -> bool {
        task.stop_cause.set(WireCancel::ClientDisconnect);
        if !task.finish("cancelled") {
            return false;
        }
        metrics::cancelled(reason);
        metrics::finished("cancelled");
        tracing::info!(task_id = %task.id, ?reason, "task cancelled");
        self.after_end(task);
        true
    }

    /// Ends a task with `end` (`stop` or `length`). False if it had already ended.
    pub fn complete_task(&self, task: &Task, finish_reason: &'static str) -> bool {
        if !task.finish(finish_reason) {
            return false;
        }
        metrics::finished(finish_reason);
        tracing::info!(task_id = %task.id, finish_reason, "task ended");
        self.after_end(task);
        true
    }

    /// Ends a task with an `error` event. False if it had already ended.
    pub fn fail_task(
        &self,
        task: &Task,
        code: ErrorCode,
        message: impl Into<String>,
        retriable: bool,
        retry_after_ms: Option<u64>,
    ) -> bool {
        let message = message.into();
        task.stop_cause.set(match code {
            ErrorCode::DecodeTimeout | ErrorCode::DeadlineUnmet | ErrorCode::QueueTimeout => {
                WireCancel::Timeout
            }
            ErrorCode::ShuttingDown => WireCancel::ServerShutdown,
            ErrorCode::PoolUnready => WireCancel::GracefulShutdown,
            ErrorCode::ReplicaExhausted => WireCancel::RequeueExhausted,
            _ => WireCancel::ClientDisconnect,
        });
        if !task.fail(SseError {
            code,
            message: message.clone(),
            retriable,
            retry_after_ms,
        }) {
            return false;
        }
        metrics::error(code);
        metrics::finished("error");
        tracing::warn!(task_id = %task.id, code = code.as_str(), %message, "task failed");
        self.after_end(task);
        true
    }

    /// A running task whose remote worker was lost goes back to the front of the queue,
    /// keeping its turn; past `MAX_REQUEUE_COUNT` requeues it ends `REPLICA_EXHAUSTED` (the
    /// seed's cancel reason `requeue_exhausted`).
    pub fn requeue_lost(&self, task: &Arc<Task>, why: &str) {
        let Some(n) = task.back_to_queue() else {
            return;
        };
        if n > MAX_REQUEUE_COUNT {
            self.fail_task(
                task,
                ErrorCode::ReplicaExhausted,
                format!(
                    "requeue attempts exhausted ({MAX_REQUEUE_COUNT}): {why} (requeue_exhausted)"
                ),
                true,
                Some(1000),
            );
            return;
        }
        metrics::requeued();
        tracing::warn!(task_id = %task.id, requeues = n, %why, "worker lost: task requeued");
        self.queue.push_front(task.clone());
        self.wake.notify_one();
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
