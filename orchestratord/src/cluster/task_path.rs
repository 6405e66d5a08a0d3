//! The cluster's task path (ARCHITECTURE.md "Replicas"): with `cluster.nats_urls` set, every
//! admitted task goes into its pool's queue on JetStream instead of this replica's queue, any
//! replica with a free slot of that pool takes it (`taker.rs`), and its events go through the
//! relay to every replica following it (`mirror.rs`): the one that admitted it, and any other
//! a client asks for it. Admission's own checks (the request, its prompt and context, the
//! tenant's quota and session budget, the deadline) stay on the admitting replica; the bound is
//! the stream's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::event_relay::{EventRelay, RelayLimits};
use super::handoff::{Handoff, WireEvent};
use super::task_queue::{AdmitError, ClusterQueue, PoolQueue};
use super::{Cluster, ClusterError};
use crate::config::Config;
use crate::lifecycle::state::AppState;
use crate::lifecycle::task::{Task, TaskEvent};

pub struct TaskPath {
    pub(super) cluster: Arc<Cluster>,
    pub(super) relay: EventRelay,
    queues: ClusterQueue,
    pub(super) ack_wait: Duration,
    /// Each pool's queue as opened, with the bound it was opened with.
    opened: Mutex<HashMap<String, (i64, Arc<PoolQueue>)>>,
    /// The tasks this replica took from the cluster's queues and runs now (for cancels).
    running: Mutex<HashMap<String, Arc<Task>>>,
}

/// A task admitted into the cluster's queue.
pub struct Queued {
    /// Tasks of its class ahead of it waiting for a slot, as the stream counts them.
    pub position: usize,
}

impl TaskPath {
    /// Opens the relay (its stream created by the first replica) for `cluster`.
    pub async fn open(cluster: Arc<Cluster>, cfg: &Config) -> Result<Self, ClusterError> {
        let limits = RelayLimits {
            keep: Duration::from_millis(cfg.stream.transcript_ttl_ms.max(1000)),
            // a token each, a metrics frame at most each, started and the end
            per_task: 2 * i64::from(cfg.admission.max_tokens_out) + 16,
            bytes: cfg.cluster.relay_max_bytes.min(i64::MAX as u64) as i64,
        };
        let relay = cluster.events(limits).await?;
        let ack_wait = Duration::from_millis(cfg.cluster.ack_wait_ms);
        Ok(Self {
            queues: cluster.queue(ack_wait),
            cluster,
            relay,
            ack_wait,
            opened: Mutex::new(HashMap::new()),
            running: Mutex::new(HashMap::new()),
        })
    }

    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    pub(super) fn running(&self) -> MutexGuard<'_, HashMap<String, Arc<Task>>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The task `id` when this replica took it from the cluster's queue and runs it now.
    pub fn running_task(&self, id: &str) -> Option<Arc<Task>> {
        self.running().get(id).cloned()
    }

    /// The bound of `key`'s queue, per class, queued and running together: the configured
    /// capacity plus the slots of the pools that take from it on every live replica.
    pub fn bound_for(&self, state: &AppState, key: &QueueKey) -> i64 {
        let here: usize = state
            .pools
            .all()
            .iter()
            .filter(|p| key.taken_by(p.id(), &p.spec().model_alias))
            .map(|p| p.snapshot().slots_total)
            .sum();
        let elsewhere: i64 = self
            .cluster
            .directory()
            .others()
            .iter()
            .filter(|h| key.taken_by(&h.pool_id, h.model_alias.as_deref().unwrap_or("")))
            .map(|h| i64::from(h.slots_total))
            .sum();
        state.cfg.queue.capacity as i64 + here as i64 + elsewhere
    }

    /// Whether a live replica other than this one has a pool that takes from `key`'s queue.
    pub fn taken_elsewhere(&self, key: &QueueKey) -> bool {
        self.cluster
            .directory()
            .others()
            .iter()
            .any(|h| key.taken_by(&h.pool_id, h.model_alias.as_deref().unwrap_or("")))
    }

    /// `key`'s queue with `bound` (opened once; its bound updated when it changed).
    pub async fn queue(&self, key: &QueueKey, bound: i64) -> Result<Arc<PoolQueue>, ClusterError> {
        let name = key.name();
        let known = self
            .opened
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&name)
            .cloned();
        if let Some((b, q)) = known {
            if b == bound {
                return Ok(q);
            }
        }
        let q = Arc::new(self.queues.pool(&name, bound).await?);
        self.opened
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name, (bound, q.clone()));
        Ok(q)
    }

    /// Admits `task` (built from `handoff`) into its queue: its pinned pool's, or its model's.
    pub async fn admit(
        self: &Arc<Self>,
        state: &Arc<AppState>,
        task: &Arc<Task>,
        handoff: Handoff,
    ) -> Result<Queued, AdmitError> {
        let key = match (&task.pin, &task.model) {
            (Some(pool), _) => QueueKey::Pool(pool.clone()),
            (None, model) => QueueKey::Model(model.clone().unwrap_or_default()),
        };
        let bound = self.bound_for(state, &key);
        let q = self.queue(&key, bound).await?;
        let payload =
            bytes::Bytes::from(serde_json::to_vec(&handoff).map_err(ClusterError::jetstream)?);
        q.admit(task.priority, &task.id, payload).await?;
        let depth = q.depth(task.priority).await.unwrap_or(0);
        let slots = (bound - state.cfg.queue.capacity as i64).max(0) as u64;
        Ok(Queued {
            position: depth.saturating_sub(slots) as usize,
        })
    }

    /// Puts `task`'s `started` (its first event) on the relay with `handoff`, and follows the
    /// task's later events from there.
    pub async fn announce(
        self: &Arc<Self>,
        state: &Arc<AppState>,
        task: &Arc<Task>,
        handoff: Handoff,
    ) -> Result<(), ClusterError> {
        let started = task.lock().events.first().cloned();
        let Some(started @ TaskEvent::Started(_)) = started else {
            return Err(ClusterError::JetStream(format!(
                "task {} has no started event to announce",
                task.id
            )));
        };
        let mut wire = WireEvent::of(&started);
        wire.handoff = Some(Box::new(handoff));
        let id = self.relay.publish(&task.id, 0, wire.encode()).await?;
        let events = self.relay.follow(&task.id, id).await?;
        self.spawn_feeder(state.clone(), task.clone(), Box::pin(events));
        Ok(())
    }
}

/// Which queue a task waits in: its pinned pool's, or its model's, which every pool serving the
/// model takes from (on any replica, a remote worker's included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueKey {
    Pool(String),
    Model(String),
}

impl QueueKey {
    /// The queue's name (its stream's, encoded by `task_queue.rs`).
    pub fn name(&self) -> String {
        match self {
            Self::Pool(p) => format!("pool-{p}"),
            Self::Model(m) => format!("model-{m}"),
        }
    }

    /// Whether the pool `pool_id` serving `alias` takes from this queue.
    pub fn taken_by(&self, pool_id: &str, alias: &str) -> bool {
        match self {
            Self::Pool(p) => p == pool_id,
            Self::Model(m) => m == alias || m == pool_id,
        }
    }
}
