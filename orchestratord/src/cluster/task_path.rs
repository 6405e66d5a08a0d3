//! The cluster's task path (ARCHITECTURE.md "Replicas"): with `cluster.nats_urls` set, every
//! admitted task goes into its pool's queue on JetStream instead of this replica's queue, any
//! replica with a free slot of that pool takes it (`taker.rs`), and its events go through the
//! relay to every replica following it (`mirror.rs`): the one that admitted it, and any other
//! a client asks for it. Admission's own checks (the request, its prompt and context, the
//! tenant's quota and session budget) stay on the admitting replica; the bound is the stream's,
//! and the place and predicted start are the cluster's: the stream's depth, played forward
//! over the slots of every replica's pools that take from the queue (each replica announces
//! when its slots free up, `pool_directory.rs`), checked against the task's limits.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::event_relay::{EventRelay, RelayLimits};
use super::head_start::Preference;
use super::known_full::{Known, KnownFull};
use super::record_stream::RecordStream;
use super::task_queue::{AdmitError, ClusterQueue, PoolQueue};
use super::{Cluster, ClusterError};
use crate::lifecycle::handoff::{Handoff, WireEvent};
use contracts::TaskRecord;
use futures::future::BoxFuture;
use futures::StreamExt;

use crate::error::ApiError;
use crate::lifecycle::cluster_port::{ClusterPlace, ClusterPort, ClusterRefusal};
use crate::lifecycle::deadline;
use crate::lifecycle::eta::{start_over, SlotForecast};
use crate::lifecycle::state::Lifecycle;
use crate::lifecycle::task::{Task, TaskEvent};

/// How long a task admitted into its queue waits for the relay to take its `started` (a
/// stream electing a new leader answers nobody for a few seconds). The replica that takes the
/// task waits longer for it (`taker.rs`).
pub(super) const ANNOUNCE_FOR: Duration = Duration::from_secs(10);

pub struct TaskPath {
    /// The lifecycle's state (weak: it holds this path).
    state: std::sync::Weak<Lifecycle>,
    pub(super) cluster: Arc<Cluster>,
    pub(super) relay: EventRelay,
    /// Ended tasks' records, for every replica (none while `records.enabled` is off).
    records: Option<RecordStream>,
    queues: ClusterQueue,
    pub(super) ack_wait: Duration,
    /// Each pool's queue as opened, with the bound it was opened with.
    opened: Mutex<HashMap<String, (i64, Arc<PoolQueue>)>>,
    /// The tasks this replica took from the cluster's queues and runs now (for cancels).
    running: Mutex<HashMap<String, Arc<Task>>>,
    /// The head start of each task admitted and not yet announced (PLACE-8), named again in
    /// its announcement's nudge; at most [`MAX_PENDING_HEAD_STARTS`].
    head_starts: Mutex<HashMap<String, Preference>>,
    /// The queues the stream refused an admission into a moment ago (`known_full.rs`).
    pub(super) known_full: KnownFull,
    /// Admitted tasks this replica took to run itself, until announced (`run_here.rs`; each
    /// holds a slot).
    here: Mutex<HashMap<String, Here>>,
    /// The free slots this replica's takes are pulling a task for (`slot_claims.rs`).
    pub(super) slot_claims: super::slot_claims::SlotClaims,
    /// When an early run here last missed, per queue (`run_here.rs`).
    pub(super) early_misses: super::early_run::EarlyMisses,
    /// When the queue streams were last asked for the cluster's task gauge.
    gauged_at: Mutex<Option<Instant>>,
}

/// An admitted task taken from its queue by this replica to run here (`run_here.rs`), its run
/// started on a slot here, waiting for its announcement to put its events on the relay.
pub(super) struct Here {
    pub(super) pool: String,
    pub(super) handoff: Handoff,
    pub(super) run: Arc<Task>,
    /// The run's first event to put on the relay.
    pub(super) from: usize,
    pub(super) taken: super::task_queue::Taken,
}

/// How long a scrape waits for the queue streams' counts (past it, the gauge keeps its last
/// value).
const GAUGE_WAIT: Duration = Duration::from_secs(1);
/// How long one try at opening a queue (its stream and consumers, created or looked up)
/// waits before it is made again.
const OPEN_TRY: Duration = Duration::from_secs(2);
/// Admitted tasks whose head start waits for their announcement, at most (past it the map is
/// emptied: a task that loses its entry is announced with a plain nudge).
const MAX_PENDING_HEAD_STARTS: usize = 4096;
/// How long the admitting replica's take waits for the task it just put in the queue: the
/// queue's consumer may live on another NATS node than the stream's leader and see the task
/// a moment after the stream took it (a take that only looks would find the queue empty and
/// leave the task to another replica's next look). Ends as soon as a task comes. On two cores
/// that also run three NATS nodes and real models, the consumer's node saw the task more than
/// 50 ms after the stream took it (`cache_placement`'s conversation then went to the other
/// replica, whose head start had just ended): a longer wait costs only the admission that
/// loses its task to another replica's take in that moment.
const TAKE_ADMITTED_WITHIN: Duration = Duration::from_millis(250);

impl TaskPath {
    /// Opens the relay (its stream created by the first replica) for `cluster`.
    pub async fn open(cluster: Arc<Cluster>, state: &Arc<Lifecycle>) -> Result<Self, ClusterError> {
        let cfg = &state.cfg;
        let limits = RelayLimits {
            keep: Duration::from_millis(cfg.stream.transcript_ttl_ms.max(1000)),
            // a token each, a metrics frame at most each, started and the end
            per_task: 2 * i64::from(cfg.admission.max_tokens_out) + 16,
            bytes: cfg.cluster.relay_max_bytes.min(i64::MAX as u64) as i64,
        };
        let relay = cluster.events(limits).await?;
        let records = if cfg.records.enabled {
            let keep = Duration::from_secs(cfg.records.max_age_s.max(1));
            Some(cluster.records(keep, cfg.records.max_bytes).await?)
        } else {
            None
        };
        let ack_wait = Duration::from_millis(cfg.cluster.ack_wait_ms);
        Ok(Self {
            state: Arc::downgrade(state),
            queues: cluster.queue(ack_wait),
            cluster,
            relay,
            records,
            ack_wait,
            opened: Mutex::new(HashMap::new()),
            running: Mutex::new(HashMap::new()),
            head_starts: Mutex::new(HashMap::new()),
            known_full: KnownFull::default(),
            here: Mutex::new(HashMap::new()),
            slot_claims: Default::default(),
            early_misses: Default::default(),
            gauged_at: Mutex::new(None),
        })
    }

    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    pub(super) fn running(&self) -> MutexGuard<'_, HashMap<String, Arc<Task>>> {
        self.running.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores the record of a task this replica followed, for every replica to read (in the
    /// background: a task's end never waits on the cluster).
    fn store_record(&self, tenant: &str, record: contracts::TaskRecord) {
        let Some(records) = self.records.clone() else {
            return;
        };
        let tenant = tenant.to_string();
        tokio::spawn(async move {
            if let Err(e) = records.put(&tenant, record).await {
                tracing::warn!(error = %e, "cluster: a task record was not stored");
            }
        });
    }

    /// The record of task `id` as a replica that followed it stored it.
    async fn read_record(
        &self,
        tenant: &str,
        any_tenant: bool,
        id: &str,
    ) -> Result<Option<contracts::TaskRecord>, ClusterError> {
        match &self.records {
            Some(r) => r.get(tenant, any_tenant, id).await,
            None => Ok(None),
        }
    }

    /// Tasks in the cluster's queues (queued and running), interactive and batch.
    pub async fn queued_and_running(&self) -> Result<(u64, u64), ClusterError> {
        self.queues.tasks_by_class().await
    }

    /// Sets the cluster's gauges for a scrape: its live replicas, and its tasks as the queue
    /// streams count them, asked at most once a heartbeat (and for at most [`GAUGE_WAIT`]): a
    /// cluster nobody scrapes asks its streams nothing.
    pub async fn publish_gauges(&self) {
        let directory = self.cluster.directory();
        crate::metrics::cluster_replicas(directory.live_replicas());
        let due = {
            let mut at = self.gauged_at.lock().unwrap_or_else(|p| p.into_inner());
            let due = at.is_none_or(|t| t.elapsed() >= directory.heartbeat());
            if due {
                *at = Some(Instant::now());
            }
            due
        };
        if due {
            match tokio::time::timeout(GAUGE_WAIT, self.queued_and_running()).await {
                Ok(Ok((interactive, batch))) => crate::metrics::cluster_tasks(interactive, batch),
                Ok(Err(e)) => tracing::debug!(error = %e, "cluster: the task gauge not refreshed"),
                Err(_) => tracing::debug!("cluster: the task gauge not refreshed in time"),
            }
        }
    }

    /// The task `id` when this replica took it from the cluster's queue and runs it now.
    pub fn running_task(&self, id: &str) -> Option<Arc<Task>> {
        self.running().get(id).cloned()
    }

    /// The bound of `key`'s queue, per class, queued and running together: the configured
    /// capacity plus the slots of the pools that take from it on every live replica.
    pub fn bound_for(&self, state: &Lifecycle, key: &QueueKey) -> i64 {
        let here: usize = state
            .pools
            .all()
            .iter()
            .filter(|p| key.taken_by(p.id(), &p.spec().model_alias))
            .map(|p| p.snapshot().slots_total)
            .sum();
        let elsewhere = self.cluster.directory().sum_over_others(|h| {
            if key.taken_by(&h.pool_id, h.model_alias.as_deref().unwrap_or("")) {
                i64::from(h.slots_total)
            } else {
                0
            }
        });
        state.cfg.queue.capacity as i64 + here as i64 + elsewhere
    }

    /// Whether a live replica other than this one has a pool that takes from `key`'s queue.
    fn taken_elsewhere(&self, key: &QueueKey) -> bool {
        self.cluster
            .directory()
            .any_other_pool(|h| key.taken_by(&h.pool_id, h.model_alias.as_deref().unwrap_or("")))
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
        // a JetStream API request a stream just created (or between leaders) does not answer
        // is lost, not refused: asked again after a short wait rather than the client's 5 s
        // twice (a fresh cluster's first admission on a replica was seen to fail so, once in
        // many runs on a loaded machine)
        let until = Instant::now() + ANNOUNCE_FOR;
        let q = loop {
            let tried = tokio::time::timeout(OPEN_TRY, self.queues.pool(&name, bound))
                .await
                .unwrap_or_else(|_| {
                    Err(ClusterError::JetStream(format!(
                        "queue {name} not opened within {} ms",
                        OPEN_TRY.as_millis()
                    )))
                });
            match tried {
                Ok(q) => break Arc::new(q),
                Err(e) if Instant::now() >= until => return Err(e),
                Err(e) => {
                    tracing::debug!(queue = %name, error = %e, "cluster: a queue not opened; trying again");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        };
        self.opened
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name, (bound, q.clone()));
        Ok(q)
    }

    /// The lines of every pool that takes from `key`'s queue, this replica's as they stand
    /// and the others' as last announced.
    fn lines_of(&self, state: &Arc<Lifecycle>, key: &QueueKey) -> Vec<SlotForecast> {
        let here: Vec<_> = state
            .pools
            .all()
            .into_iter()
            .filter(|p| key.taken_by(p.id(), &p.spec().model_alias))
            .collect();
        let mut lines: Vec<SlotForecast> = deadline::forecasts(state, &here)
            .into_iter()
            .map(|(_, f)| f)
            .collect();
        lines.extend(
            self.cluster
                .directory()
                .other_lines(|h| key.taken_by(&h.pool_id, h.model_alias.as_deref().unwrap_or(""))),
        );
        lines
    }

    /// Admits `task` (built from `handoff`) into its queue — its pinned pool's, or its
    /// model's — with its place and predicted start there; taken out again when that start
    /// comes after `wait_allowed`.
    async fn admit_task(
        self: &Arc<Self>,
        state: &Arc<Lifecycle>,
        task: &Arc<Task>,
        handoff: Handoff,
        wait_allowed: Option<Duration>,
    ) -> Result<ClusterPlace, ClusterRefusal> {
        let unavailable = |e: ClusterError| ClusterRefusal::Unavailable(e.to_string());
        let key = QueueKey::of(task);
        let bound = self.bound_for(state, &key);
        let q = self.queue(&key, bound).await.map_err(unavailable)?;
        // a place frees when the first of the cluster's slots does
        let full = || ClusterRefusal::Full {
            retry_after_ms: start_over(&self.lines_of(state, &key), 0).map(|ms| ms.max(1)),
        };
        let Some(claim) = self
            .known_full
            .claim(q.name(), task.priority, bound, Instant::now())
        else {
            return Err(full());
        };
        // the pool holding its prefix is named before the task is in the queue: no other
        // pool finds it there first (and an admission's take elsewhere gives it back)
        let prefer = super::head_start::preferred(&self.cluster, state, task);
        let mut handoff = handoff;
        handoff.head_start = prefer.clone();
        let payload =
            serde_json::to_vec(&handoff).map_err(|e| unavailable(ClusterError::jetstream(e)))?;
        if let Some(p) = &prefer {
            self.cluster.nudge(&key.name(), Some(p)).await;
        }
        // with a slot free here, the task's run starts while the stream takes it
        // (CLU-PATH-2): its first token does not wait for the queue's round trips — unless
        // the queue was full a moment ago, or an early run here missed a moment ago (other
        // tasks were waiting first): then it starts once the take brought it
        let own = self.free_pool_here(state, &key, prefer.as_ref());
        let pool_here = own.as_ref().map(|(pool, _)| pool.clone());
        if own.is_none() {
            tracing::debug!(task_id = %task.id, queue = %q.name(), "cluster: no free slot here for the task admitted; it waits in the queue");
        }
        let early_now = !claim.is_probe() && !self.early_misses.recent(q.name(), Instant::now());
        let (own_now, own_later) = if early_now { (own, None) } else { (None, own) };
        let early = async {
            match own_now {
                Some((pool, slot)) => self.start_early(state, task, &handoff, pool, slot).await,
                None => None,
            }
        };
        // with that slot, the queue's next task is taken as soon as the stream took this one:
        // it runs here (on the early run) when it is this one (`run_here.rs`)
        let admit_and_take = async {
            let admitted = q.admit(task.priority, &task.id, payload.into()).await;
            let pulled = match &admitted {
                Ok(a) if pool_here.is_some() && !a.duplicate => {
                    Some(q.take(task.priority, TAKE_ADMITTED_WITHIN).await)
                }
                _ => None,
            };
            (admitted, pulled)
        };
        let ((admitted, pulled), early) = tokio::join!(admit_and_take, early);
        let withdraw = |early: Option<super::early_run::Early>| {
            if let Some(e) = early {
                self.early_misses.missed(q.name(), Instant::now());
                state.withdraw_run(&e.run);
            }
        };
        let admitted = match admitted {
            Ok(a) => {
                claim.answered();
                a
            }
            Err(AdmitError::Full { .. }) => {
                withdraw(early);
                let seen = claim.seen;
                claim.answered();
                self.known_full
                    .refused(q.name(), task.priority, bound, seen, Instant::now());
                return Err(full());
            }
            // no answer: a freed place it held is given back
            Err(AdmitError::Cluster(e)) => {
                withdraw(early);
                return Err(unavailable(e));
            }
        };
        let own = match (pulled, early, &pool_here) {
            (Some(pulled), Some(early), _) => {
                self.keep_pulled(state, task, &handoff, &q, pulled, early)
                    .await
            }
            (Some(pulled), None, Some(pool)) => {
                self.start_taken(state, task, &handoff, &q, pool, pulled, own_later)
                    .await
            }
            (_, early, _) => {
                withdraw(early);
                false
            }
        };
        if own {
            return Ok(ClusterPlace {
                position: 0,
                predicted_start_ms: Some(0),
            });
        }
        let depth = q.depth(task.priority).await.unwrap_or(0);
        // the stream's leader enforces the bound from the subject's count it holds; a leader
        // elected a moment ago (its old one stopped and back) has been seen to take one task
        // past it: the count read here, this task included, holds the bound whatever the
        // server did (CLU-TASK-7)
        if depth > bound.max(0) as u64 && !admitted.duplicate {
            tracing::warn!(task_id = %task.id, queue = %q.name(), depth, bound, "cluster: the stream took a task past the bound; taken out again");
            match q.withdraw(admitted.sequence).await {
                Ok(()) => self.cluster.say_freed(q.name(), task.priority).await,
                Err(e) => {
                    tracing::warn!(task_id = %task.id, error = %e, "cluster: a task past the bound not taken out of its queue")
                }
            }
            return Err(full());
        }
        let slots = (bound - state.cfg.queue.capacity as i64).max(0) as u64;
        // the tasks ahead of it in the queue, as one box counts them (the stream counts the
        // running ones and this one too)
        let position = depth.saturating_sub(slots + 1) as usize;
        // played forward: the tasks before it in the stream not yet in a slot each take the
        // first slot to free up (the stream counts those already running too)
        let lines = self.lines_of(state, &key);
        let busy = lines
            .iter()
            .flat_map(|l| &l.free_in_ms)
            .filter(|&&f| f > 0)
            .count() as u64;
        let before = depth.saturating_sub(1).saturating_sub(busy) as usize;
        let predicted_start_ms = start_over(&lines, before);
        if let (Some(predicted), Some(allowed)) = (predicted_start_ms, wait_allowed) {
            let allowed_ms = allowed.as_millis() as u64;
            // a retry of an admitted task (the same id) is the task already there: kept
            if predicted > allowed_ms && !admitted.duplicate {
                match q.withdraw(admitted.sequence).await {
                    Ok(()) => self.cluster.say_freed(q.name(), task.priority).await,
                    // it stays queued without its `started`: the taker drops it
                    Err(e) => {
                        tracing::warn!(task_id = %task.id, error = %e, "cluster: a late task not taken out of its queue")
                    }
                }
                return Err(ClusterRefusal::Late {
                    predicted_start_ms: predicted,
                    allowed_ms,
                });
            }
        }
        if let Some(p) = prefer {
            let mut pending = self.head_starts.lock().unwrap_or_else(|e| e.into_inner());
            if pending.len() >= MAX_PENDING_HEAD_STARTS {
                pending.clear();
            }
            pending.insert(task.id.clone(), p);
        }
        Ok(ClusterPlace {
            position,
            predicted_start_ms,
        })
    }

    /// Puts a task's `started` (`payload`) on the relay as its first event, trying again
    /// while the relay is between leaders (the same event id makes a resend safe): its id.
    pub(super) async fn publish_started(
        &self,
        task_id: &str,
        payload: bytes::Bytes,
    ) -> Result<u64, ClusterError> {
        let until = tokio::time::Instant::now() + ANNOUNCE_FOR;
        loop {
            match self.relay.publish(task_id, 0, payload.clone()).await {
                Ok(id) => return Ok(id),
                Err(_) if tokio::time::Instant::now() < until => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The admitted tasks taken to run here, waiting for their announcement.
    pub(super) fn here(&self) -> MutexGuard<'_, HashMap<String, Here>> {
        self.here.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts `task`'s `started` (its first event) on the relay with `handoff`, and follows the
    /// task's later events from there.
    async fn announce_task(
        self: &Arc<Self>,
        state: &Arc<Lifecycle>,
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
        let payload = wire.encode();
        if let Some(here) = self.start_here(state, task, payload.clone()).await {
            return here;
        }
        // the task is in its queue already: the relay between leaders (a NATS node lost) is
        // waited for, the same event id making a resend safe
        let until = tokio::time::Instant::now() + ANNOUNCE_FOR;
        let (id, events) = loop {
            // the follower's consumer is set up while the event goes out (one round trip
            // less before the task can start); it skips the `started` it was made before
            let tried = async {
                let (id, events) = tokio::join!(
                    self.relay.publish(&task.id, 0, payload.clone()),
                    self.relay.follow(&task.id, 0)
                );
                let id = id?;
                let events = events?
                    .skip_while(move |r| std::future::ready(matches!(r, Ok(r) if r.id <= id)));
                Ok::<_, ClusterError>((id, events))
            };
            match tried.await {
                Ok(done) => break done,
                Err(_) if tokio::time::Instant::now() < until => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(e) => return Err(e),
            }
        };
        tracing::debug!(task_id = %task.id, started_id = id, "task announced");
        // now the task can start: the replicas taking from its queue may look, the pool
        // holding its prefix first
        let prefer = self
            .head_starts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&task.id);
        self.cluster
            .nudge(&QueueKey::of(task).name(), prefer.as_ref())
            .await;
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
    /// The queue of `task`: its pinned pool's, or its model's.
    pub fn of(task: &Task) -> Self {
        match (&task.pin, &task.model) {
            (Some(pool), _) => Self::Pool(pool.clone()),
            (None, model) => Self::Model(model.clone().unwrap_or_default()),
        }
    }

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

impl ClusterPort for Arc<TaskPath> {
    fn publish_gauges(&self) -> BoxFuture<'_, ()> {
        Box::pin(TaskPath::publish_gauges(self))
    }

    fn serves_elsewhere(&self, pin: Option<&str>, model: &str) -> bool {
        let key = match pin {
            Some(p) => QueueKey::Pool(p.to_string()),
            None => QueueKey::Model(model.to_string()),
        };
        self.taken_elsewhere(&key)
    }

    fn known_full(
        &self,
        pin: Option<&str>,
        model: &str,
        class: contracts::Priority,
    ) -> Option<Option<u64>> {
        let state = self.state.upgrade()?;
        let key = match pin {
            Some(p) => QueueKey::Pool(p.to_string()),
            None => QueueKey::Model(model.to_string()),
        };
        let bound = self.bound_for(&state, &key);
        let known = self
            .known_full
            .check(&key.name(), class, bound, Instant::now());
        (known == Known::Full)
            .then(|| start_over(&self.lines_of(&state, &key), 0).map(|ms| ms.max(1)))
    }

    fn pace_confirmed_elsewhere(&self, pin: Option<&str>, model: &str) -> bool {
        let key = match pin {
            Some(p) => QueueKey::Pool(p.to_string()),
            None => QueueKey::Model(model.to_string()),
        };
        self.cluster.directory().any_other_line(
            |h| key.taken_by(&h.pool_id, h.model_alias.as_deref().unwrap_or("")),
            |l| l.confirmed,
        )
    }

    fn admit<'a>(
        &'a self,
        task: &'a Arc<Task>,
        handoff: Handoff,
        wait_allowed: Option<Duration>,
    ) -> BoxFuture<'a, Result<ClusterPlace, ClusterRefusal>> {
        Box::pin(async move {
            let Some(state) = self.state.upgrade() else {
                return Err(ClusterRefusal::Unavailable("the server is stopping".into()));
            };
            self.admit_task(&state, task, handoff, wait_allowed).await
        })
    }

    fn announce<'a>(
        &'a self,
        task: &'a Arc<Task>,
        handoff: Handoff,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let Some(state) = self.state.upgrade() else {
                return Err("the server is stopping".into());
            };
            self.announce_task(&state, task, handoff)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn adopt<'a>(
        &'a self,
        tenant: &'a str,
        sees_all: bool,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Arc<Task>>, ApiError>> {
        Box::pin(async move {
            let Some(state) = self.state.upgrade() else {
                return Ok(None);
            };
            self.adopt_task(&state, tenant, sees_all, id).await
        })
    }

    fn record_ended(&self, tenant: &str, record: TaskRecord) {
        self.store_record(tenant, record);
    }

    fn stored_record<'a>(
        &'a self,
        tenant: &'a str,
        any_tenant: bool,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<TaskRecord>, String>> {
        Box::pin(async move {
            self.read_record(tenant, any_tenant, id)
                .await
                .map_err(|e| e.to_string())
        })
    }
}
