//! Taking tasks from the cluster's queues: per pool of this replica, one loop that pulls a task
//! whenever the pool has a free slot (interactive before batch), runs it on that slot, puts its
//! events on the relay in order, and acknowledges progress to the queue while it runs. A task
//! taken again after its first taker stopped continues after the tokens already on the relay;
//! one whose runners stopped `cluster.max_deliveries` times ends `REPLICA_EXHAUSTED`.

use std::sync::Arc;
use std::time::Duration;

use contracts::{ErrorCode, Priority, SseError};
use futures::{FutureExt, StreamExt};
use tracing::Instrument;

use super::event_relay::{Appended, Relayed};
use super::task_path::{QueueKey, TaskPath};
use super::task_queue::{Take, Taken};
use crate::lifecycle::handoff::{Handoff, WireEvent};
use crate::lifecycle::placement::{place, Placement};
use crate::lifecycle::relayed_task::{self, Purpose};
use crate::lifecycle::runner;
use crate::lifecycle::state::Lifecycle;
use crate::lifecycle::task::{Task, TaskEvent};

/// How often a replica with a free slot looks at its queues without being nudged: every task
/// that goes in, and every task given or handed back, comes with a nudge (core NATS, at most
/// once); only a task whose runner stopped answering comes back without one, after `ack_wait`
/// (10 s by default), and a nudge lost on the way is made up here. Each look is four pull
/// requests (two queues, two classes) per pool and replica: at 250 ms they were most of an idle
/// cluster's NATS CPU.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// How often a pool with no free slot is looked at again.
const SLOT_POLL: Duration = Duration::from_millis(20);
/// How long a taken task waits for the admitting replica's `started` on the relay (longer
/// than the admitting replica tries to put it there).
const STARTED_WAIT: Duration = Duration::from_secs(15);
/// How long a relay publish is tried again (a stream between leaders answers nobody).
const PUBLISH_FOR: Duration = Duration::from_secs(5);
/// How long a taken task waits for the slots the pool's load-time measurement gives up.
const MEASUREMENT_GIVES_WAY: Duration = Duration::from_secs(2);
/// Events in one relay message at most (what a run had pending while its last append was
/// answered goes in one write).
const BATCH_EVENTS: usize = 64;
/// A relay message stops taking events past this many bytes of them (NATS takes 1 MiB).
const BATCH_BYTES: usize = 128 << 10;

impl TaskPath {
    /// Starts taking tasks for each pool of this replica (and for pools added later).
    pub fn spawn_takers(self: &Arc<Self>, state: &Arc<Lifecycle>) {
        // which queues have room again (`known_full.rs`)
        let (path, stop) = (self.clone(), state.shutdown.clone());
        tokio::spawn(async move {
            while let Err(e) = path
                .cluster
                .hear_freed(&path.known_full, stop.clone())
                .await
            {
                tracing::warn!(error = %e, "cluster: cannot listen for tasks leaving the queues");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let (path, state) = (self.clone(), state.clone());
        tokio::spawn(async move {
            let mut taking = std::collections::HashSet::new();
            let mut every = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = state.shutdown.cancelled() => return,
                    _ = every.tick() => {}
                }
                for pool in state.pools.all() {
                    if taking.insert(pool.id().to_string()) {
                        let (p, s, id) = (path.clone(), state.clone(), pool.id().to_string());
                        tokio::spawn(async move { p.take_loop(s, id).await });
                    }
                }
            }
        });
    }

    async fn take_loop(self: Arc<Self>, state: Arc<Lifecycle>, pool_id: String) {
        let Some(alias) = state
            .pools
            .get(&pool_id)
            .map(|p| p.spec().model_alias.clone())
        else {
            return;
        };
        // its own queue (tasks pinned to it) and its model's
        let keys = [QueueKey::Pool(pool_id.clone()), QueueKey::Model(alias)];
        let names: Vec<String> = keys.iter().map(QueueKey::name).collect();
        let mut nudges = loop {
            match self.cluster.nudges(&names).await {
                Ok(n) => break n,
                Err(e) => {
                    tracing::warn!(pool = %pool_id, error = %e, "cluster: cannot listen for new tasks");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        // until when this pool leaves its queues to another pool of the cluster (a head start)
        let mut hold: Option<tokio::time::Instant> = None;
        loop {
            if state.is_shutting_down() || state.shutdown.is_cancelled() {
                return;
            }
            let Some(pool) = state.pools.get(&pool_id) else {
                return;
            };
            if !pool.accepts_work() || pool.snapshot().slots_free() == 0 {
                tokio::time::sleep(SLOT_POLL).await;
                continue;
            }
            let mut queues = Vec::with_capacity(keys.len());
            for key in &keys {
                match self.queue(key, self.bound_for(&state, key)).await {
                    Ok(q) => queues.push(q),
                    Err(e) => {
                        tracing::warn!(queue = %key.name(), error = %e, "cluster: cannot open a queue");
                    }
                }
            }
            if queues.is_empty() {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            // what the nudges that came meanwhile say, then a head start given to another
            // pool waited out (a nudge naming this pool ends it)
            while let Some(Some(n)) = nudges.next().now_or_never() {
                self.heed(&state, &pool_id, &n.payload, &mut hold);
            }
            if let Some(until) = hold.filter(|u| *u > tokio::time::Instant::now()) {
                tokio::select! {
                    n = nudges.next() => {
                        if let Some(n) = n {
                            self.heed(&state, &pool_id, &n.payload, &mut hold);
                        }
                    }
                    _ = tokio::time::sleep_until(until) => hold = None,
                    _ = state.shutdown.cancelled() => return,
                }
                continue;
            }
            // what is there now, interactive first — unless admissions here claimed every
            // free slot for the tasks they take (`slot_claims.rs`; the loop claims none
            // itself, so an admission never waits on it)
            if self
                .slot_claims
                .unclaimed(&pool_id, pool.snapshot().slots_free())
                == 0
            {
                tokio::time::sleep(SLOT_POLL).await;
                continue;
            }
            let mut took = Ok(Take::Empty);
            let mut from = None;
            for class in [Priority::Interactive, Priority::Batch] {
                for q in &queues {
                    took = q.take(class, Duration::ZERO).await;
                    if !matches!(took, Ok(Take::Empty)) {
                        from = Some((q.name().to_string(), class));
                        break;
                    }
                }
                if !matches!(took, Ok(Take::Empty)) {
                    break;
                }
            }
            if matches!(took, Ok(Take::Empty)) {
                // until a replica admits a task here, or a look anyway (a task handed back, or
                // given up by a replica that stopped, comes without a nudge)
                let nudge = tokio::select! {
                    n = nudges.next() => n,
                    _ = tokio::time::sleep(LOOK_EVERY) => None,
                    _ = state.shutdown.cancelled() => return,
                };
                if let Some(n) = nudge {
                    self.heed(&state, &pool_id, &n.payload, &mut hold);
                }
                continue;
            }
            match took {
                Ok(Take::Task(t)) => self.start(&state, &pool_id, *t, None).await,
                Ok(Take::Exhausted { task_id, runs }) => {
                    if let Some((queue, class)) = &from {
                        self.cluster.say_freed(queue, *class).await;
                    }
                    self.exhausted(&task_id, runs).await;
                }
                Ok(Take::Empty) => {}
                Err(e) => {
                    tracing::warn!(pool = %pool_id, error = %e, "cluster: cannot take from the pool's queue");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    /// What a nudge carrying `payload` means for pool `pool_id`'s `hold`: one naming this
    /// pool ends it; one naming another starts one unless one runs (never extended); one
    /// naming no pool leaves it as it is.
    fn heed(
        &self,
        state: &Lifecycle,
        pool_id: &str,
        payload: &[u8],
        hold: &mut Option<tokio::time::Instant>,
    ) {
        let cap = Duration::from_millis(state.cfg.cluster.head_start_ms);
        let now = tokio::time::Instant::now();
        match super::head_start::heed(payload, self.cluster.replica(), pool_id, cap) {
            super::head_start::Heed::Mine => *hold = None,
            super::head_start::Heed::Wait(left) => {
                if hold.is_none_or(|u| u <= now) {
                    *hold = Some(now + left);
                }
            }
            super::head_start::Heed::Nothing => {}
        }
    }

    /// Ends task `task_id`, taken out of its queue after `runs` runs that stopped, on the
    /// relay with `REPLICA_EXHAUSTED`.
    pub(super) async fn exhausted(&self, task_id: &str, runs: i64) {
        tracing::warn!(%task_id, runs, "cluster: task taken too often");
        let error = TaskEvent::Error(SseError {
            code: ErrorCode::ReplicaExhausted,
            message: format!(
                "requeue attempts exhausted: the task was taken {runs} times and each replica running it stopped (requeue_exhausted)"
            ),
            retriable: true,
            retry_after_ms: Some(1000),
            field: None,
        });
        let n = self.history(task_id).await.0.len() as u64;
        self.publish(task_id, n, &error).await;
    }

    /// Lets `taken` go from its queue (it ended, or is nobody's to run), and tells every
    /// replica that its place is free (`known_full.rs`).
    pub(super) async fn let_go(&self, taken: Taken) -> Result<(), super::ClusterError> {
        let (queue, class) = (taken.queue.clone(), taken.class);
        taken.done().await?;
        self.cluster.say_freed(&queue, class).await;
        Ok(())
    }

    /// Gives `taken` back untried (its slot went to another task) and nudges its queue's
    /// takers: another replica takes it now, not at its next look.
    pub(super) async fn give_back(&self, taken: Taken) -> Result<(), super::ClusterError> {
        let queue = taken.queue.clone();
        let given = taken.give_back().await;
        self.cluster.nudge(&queue, None).await;
        given
    }

    /// Hands `taken` back after its run here stopped (a shutdown) and nudges its queue's
    /// takers, as [`Self::give_back`].
    async fn hand_back(&self, taken: Taken) -> Result<(), super::ClusterError> {
        let queue = taken.queue.clone();
        let handed = taken.hand_back().await;
        self.cluster.nudge(&queue, None).await;
        handed
    }

    /// The events of `task_id` on the relay so far and the last one's id, waiting a moment
    /// for its `started` (the admitting replica puts it there right after the queue took the
    /// task). Empty when it has none.
    async fn history(&self, task_id: &str) -> (Vec<WireEvent>, u64) {
        let until = tokio::time::Instant::now() + STARTED_WAIT;
        let last = loop {
            match self.relay.last(task_id).await {
                Ok(Some(last)) => break last,
                _ if tokio::time::Instant::now() < until => {
                    tokio::time::sleep(Duration::from_millis(10)).await
                }
                _ => return (Vec::new(), 0),
            }
        };
        // only its `started` so far (a task taken the first time): that is the history
        if let [w] = WireEvent::decode_all(&last.payload).as_slice() {
            if w.event == "started" {
                return (vec![w.clone()], last.id);
            }
        }
        let last = last.id;
        let Ok(events) = self.relay.follow(task_id, 0).await else {
            return (Vec::new(), 0);
        };
        let mut events = Box::pin(events);
        let mut out = Vec::new();
        while let Ok(Some(Ok(r))) = tokio::time::timeout(STARTED_WAIT, events.next()).await {
            out.extend(WireEvent::decode_all(&r.payload));
            if r.id >= last {
                return (out, r.id);
            }
        }
        // the history could not be read to its end: not a base to go on from
        (Vec::new(), 0)
    }

    /// Puts event `n` of `task_id` on the relay, trying again for a while.
    async fn publish(&self, task_id: &str, n: u64, ev: &TaskEvent) -> bool {
        let payload = WireEvent::of(ev).encode();
        let until = tokio::time::Instant::now() + PUBLISH_FOR;
        loop {
            match self.relay.publish(task_id, n, payload.clone()).await {
                Ok(_) => return true,
                Err(_) if tokio::time::Instant::now() < until => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => {
                    tracing::warn!(%task_id, n, error = %e, "cluster: event not put on the relay");
                    return false;
                }
            }
        }
    }

    /// Runs a taken task on a slot of `pool_id` (or hands it back); `claim` (an admission's
    /// take) holds a free slot for it until it has one.
    pub(super) async fn start(
        self: &Arc<Self>,
        state: &Arc<Lifecycle>,
        pool_id: &str,
        taken: Taken,
        claim: Option<super::slot_claims::SlotClaim>,
    ) {
        let Ok(h) = serde_json::from_slice::<Handoff>(&taken.payload) else {
            tracing::warn!(task_id = %taken.task_id, "cluster: a queued task that is no handoff, dropped");
            let _ = self.let_go(taken).await;
            return;
        };
        let (history, last) = self.history(&h.task_id).await;
        if history.is_empty() {
            // its admitting replica could not put its `started` on the relay, and refused it
            let _ = self.let_go(taken).await;
            return;
        }
        if history.iter().any(WireEvent::is_terminal) {
            // cancelled (or ended) while it waited
            let _ = self.let_go(taken).await;
            return;
        }
        let n = history.len() as u64;
        let task = match relayed_task::build(
            state,
            &h,
            Purpose::Run {
                pool: pool_id,
                counted: None,
            },
        )
        .await
        {
            Ok(t) => t,
            Err(e) => {
                let e = e.envelope;
                let error = TaskEvent::Error(SseError {
                    code: e.code,
                    message: e.message,
                    retriable: e.retriable,
                    retry_after_ms: e.retry_after_ms,
                    field: e.field,
                });
                self.publish(&h.task_id, n, &error).await;
                let _ = self.let_go(taken).await;
                return;
            }
        };
        task.mark_run_for_cluster();
        // taken again after its taker stopped: it goes on after the tokens already sent
        for ev in history.iter().filter_map(WireEvent::to_event) {
            if let TaskEvent::Token(t) = ev {
                task.push_scored_token(t.t, t.logprobs);
            }
        }
        let placed = place_giving_way(state, pool_id, &task).await;
        drop(claim);
        let lease = match placed {
            Placement::Leased(lease) => lease,
            // the slot went to another task meanwhile: someone else's turn
            Placement::Wait => {
                let _ = self.give_back(taken).await;
                return;
            }
            Placement::Unavailable(code, why) => {
                let error = TaskEvent::Error(SseError {
                    code,
                    message: why,
                    retriable: true,
                    retry_after_ms: Some(1000),
                    field: None,
                });
                self.publish(&h.task_id, n, &error).await;
                let _ = self.let_go(taken).await;
                return;
            }
        };
        let run = self.launch(state, pool_id, &h, task, lease, taken);
        let (path, state) = (self.clone(), state.clone());
        tokio::spawn(async move {
            let run = Run { n, last, ..run };
            path.relay_run(state, run).await
        });
    }

    /// Starts the run of `task` (taken from the queue as `taken`) on `lease`, a slot of
    /// `pool_id`: what is left is to put its events on the relay (`relay_run`) once they may
    /// follow the task's last event there (`n` and `last` of the run it returns).
    pub(super) fn launch(
        self: &Arc<Self>,
        state: &Arc<Lifecycle>,
        pool_id: &str,
        h: &Handoff,
        task: Arc<Task>,
        lease: pool_manager::SlotLease,
        taken: Taken,
    ) -> Run {
        // registered first: a cancel finds it from its first event on
        let run = self.register(state, pool_id, h, task, taken, None);
        self.start_engine(state, pool_id, &run.task, lease);
        run
    }

    /// Starts the engine's run of `task` on `lease`, a slot of `pool_id`: its events gather
    /// in `task` until [`Self::relay_run`] puts them on the relay. The number of events it
    /// had before (an earlier run's tokens, on the relay already).
    pub(super) fn start_engine(
        &self,
        state: &Arc<Lifecycle>,
        pool_id: &str,
        task: &Arc<Task>,
        lease: pool_manager::SlotLease,
    ) -> usize {
        // what it had before it runs (tokens of an earlier run) is on the relay already
        let from = task.lock().events.len();
        let span = tracing::info_span!("task", task_id = %task.id, correlation_id = %task.correlation_id, pool = %pool_id);
        tokio::spawn(runner::run(state.clone(), task.clone(), lease).instrument(span));
        from
    }

    /// `task`, taken from its queue as `taken`, as one of this replica's runs (a cancel finds
    /// it; its start, its wait since its admission and where it was placed counted here, not
    /// by the runner: an early run may be withdrawn before it is taken): what is left is to
    /// put its events on the relay, from its event `from` (its number of events now when
    /// `None`), once they may follow the task's last event there (`n` and `last` of the run it
    /// returns).
    pub(super) fn register(
        &self,
        state: &Lifecycle,
        pool_id: &str,
        h: &Handoff,
        task: Arc<Task>,
        taken: Taken,
        from: Option<usize>,
    ) -> Run {
        crate::lifecycle::placement::taken_from_cluster(
            state,
            &task,
            pool_id,
            h.request.pool_id.is_some(),
        );
        let waited_ms = crate::lifecycle::handoff::unix_ms().saturating_sub(h.admitted_unix_ms);
        crate::metrics::started(pool_id);
        crate::metrics::queue_wait(Duration::from_millis(waited_ms), task.priority);
        tracing::info!(task_id = %task.id, pool = %pool_id, waited_ms, delivered = taken.delivered, "cluster: task taken");
        self.running().insert(task.id.clone(), task.clone());
        let from = from.unwrap_or_else(|| task.lock().events.len());
        Run {
            task,
            taken,
            from,
            n: 0,
            last: 0,
            placed_said: false,
            follower: None,
        }
    }

    /// Puts the running task's events on the relay in order, each only while the task's last
    /// event is the one this replica put there last, and acknowledges progress until it ends.
    /// Another replica that took the task meanwhile (this one was stopped past `ack_wait`)
    /// makes this one stop it here; a shutdown hands it back to the queue at once, for another
    /// replica to go on with.
    pub(super) async fn relay_run(self: Arc<Self>, state: Arc<Lifecycle>, mut run: Run) {
        let task = run.task.clone();
        let mut changes = task.subscribe();
        // the first acknowledgement of progress a quarter of `ack_wait` after the take (an
        // interval's first tick is at once: a short task paid a replicated write for nothing)
        let every = self.ack_wait / 4;
        let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        progress.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let outcome = loop {
            // the admitted task ended here (its client's cancel or disconnect): that `end`
            // goes on the relay right after the last event it had, as the task's terminal
            // (as a follower elsewhere puts it), and the run stops (what it would append
            // after is superseded)
            if let Some(f) = run.follower.clone().filter(|f| f.is_terminal()) {
                self.relay_end_here(&f).await;
                state.cancel_task(&task, crate::metrics::CancelReason::Client);
                run.follower = None;
            }
            let pending = {
                let g = task.lock();
                g.events[run.from.min(g.events.len())..].to_vec()
            };
            match self.append_all(&state, &mut run, &pending).await {
                Appending::Ended => break Outcome::Ended,
                Appending::Lost => break Outcome::Lost,
                Appending::More => {}
            }
            let follower_ended = async {
                match &run.follower {
                    // cancelled once it has ended
                    Some(f) => f.cancel.cancelled().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = changes.changed() => {}
                _ = state.shutdown.cancelled() => break Outcome::HandBack,
                _ = progress.tick() => {
                    if let Err(e) = run.taken.progress().await {
                        tracing::warn!(task_id = %task.id, error = %e, "cluster: progress not acknowledged");
                    }
                }
                _ = follower_ended => {}
            }
        };
        self.running().remove(&task.id);
        if let Some(f) = run.follower.take().filter(|f| !f.is_terminal()) {
            // another replica appends to it now, or this one stops: the admitted task
            // follows it on the relay from the last event it had from here
            self.follow_from(&state, f, run.last).await;
        }
        match outcome {
            Outcome::Ended => {
                if let Err(e) = self.let_go(run.taken).await {
                    tracing::warn!(task_id = %task.id, error = %e, "cluster: an ended task stays in the queue");
                }
            }
            Outcome::Lost => {
                state.cancel_task(&task, crate::metrics::CancelReason::Client);
                // ended meanwhile (a follower's cancel, or another replica that took it over
                // finished it): out of the queue now, its place free
                let ended = self
                    .relay
                    .last(&task.id)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|r| WireEvent::ends_task(&r.payload));
                tracing::info!(task_id = %task.id, ended, "cluster: another replica appended to the task; stopped here");
                if ended {
                    let _ = self.let_go(run.taken).await;
                }
            }
            Outcome::HandBack => {
                tracing::info!(task_id = %task.id, "cluster: shutting down, task handed back");
                let _ = self.hand_back(run.taken).await;
                state.cancel_task(&task, crate::metrics::CancelReason::Client);
            }
        }
    }

    /// Appends `events` after `run.last`, as few messages as the bounds of one allow (each
    /// message given to the run's follower once appended), moving `run.from` past them; stops
    /// before the next message while the follower has ended here.
    async fn append_all(
        &self,
        state: &Lifecycle,
        run: &mut Run,
        events: &[TaskEvent],
    ) -> Appending {
        let task_id = run.task.id.clone();
        let task_id = task_id.as_str();
        let mut rest = events;
        while !rest.is_empty() {
            if run.follower.as_ref().is_some_and(|f| f.is_terminal()) {
                return Appending::More;
            }
            let (batch, ends) = self.next_batch(run, &mut rest);
            let count = batch.len() as u64;
            let payload = WireEvent::join_encoded(&batch);
            let until = tokio::time::Instant::now() + PUBLISH_FOR;
            let appended = loop {
                match self
                    .relay
                    .append_after(
                        task_id,
                        run.taken.delivered,
                        run.n,
                        payload.clone(),
                        run.last,
                    )
                    .await
                {
                    Ok(a) => break a,
                    Err(_) if tokio::time::Instant::now() < until => {
                        tokio::time::sleep(Duration::from_millis(50)).await
                    }
                    // the relay is gone for good: leave the task to whoever can reach it
                    Err(e) => {
                        tracing::warn!(%task_id, error = %e, "cluster: the relay does not answer");
                        return Appending::Lost;
                    }
                }
            };
            match appended {
                Appended::At(id) | Appended::Duplicate(id) => {
                    run.last = id;
                    run.n += count;
                    if let Some(f) = &run.follower {
                        let relayed = Relayed {
                            id,
                            payload,
                            at: std::time::Instant::now(),
                        };
                        self.hand_over(state, f, &relayed);
                    }
                }
                Appended::Superseded => return Appending::Lost,
            }
            if ends {
                return Appending::Ended;
            }
        }
        Appending::More
    }

    /// The next relay message's events, each encoded once, from the front of `rest` (moving
    /// `rest` and `run.from` past them): at most [`BATCH_EVENTS`] and about [`BATCH_BYTES`], and none
    /// after a terminal event; whether it holds the terminal.
    fn next_batch(&self, run: &mut Run, rest: &mut &[TaskEvent]) -> (Vec<bytes::Bytes>, bool) {
        let (mut batch, mut bytes, mut ends) = (Vec::new(), 0usize, false);
        while let Some((ev, after)) = rest.split_first() {
            let mut wire = WireEvent::of(ev);
            if !run.placed_said {
                wire.placed = run.task.placement(self.cluster.replica());
                run.placed_said = wire.placed.is_some();
            }
            let encoded = wire.encode();
            bytes += encoded.len();
            batch.push(encoded);
            *rest = after;
            run.from += 1;
            ends = matches!(ev, TaskEvent::End(_) | TaskEvent::Error(_));
            if ends || batch.len() >= BATCH_EVENTS || bytes >= BATCH_BYTES {
                break;
            }
        }
        (batch, ends)
    }
}

/// A task this replica runs, and where its events stand on the relay.
pub(super) struct Run {
    pub(super) task: Arc<Task>,
    pub(super) taken: Taken,
    /// The next of the task's own events to append.
    pub(super) from: usize,
    /// The next event number.
    pub(super) n: u64,
    /// The id of the task's last event on the relay (this replica's, or the history's).
    pub(super) last: u64,
    /// Whether where it runs went on the relay (with the first event appended once placed).
    pub(super) placed_said: bool,
    /// The task as this replica admitted it, when it runs here too (`run_here.rs`): each
    /// event goes to it once the relay has it, read from here rather than from the relay.
    pub(super) follower: Option<Arc<Task>>,
}

enum Appending {
    More,
    Ended,
    /// Another replica appends to the task now (or the relay is unreachable).
    Lost,
}

enum Outcome {
    Ended,
    Lost,
    HandBack,
}

/// A slot of `pool_id` for `task`. A pool that is still measuring its pace with every slot
/// busy counts those slots free, and a lease cancels the measurement: its sequences end
/// within a step or two, and the task waits for them rather than going back to the queue
/// (where it would count as taken by a replica that stopped).
pub(super) async fn place_giving_way(state: &Lifecycle, pool_id: &str, task: &Task) -> Placement {
    let until = tokio::time::Instant::now() + MEASUREMENT_GIVES_WAY;
    let mut last_try = false;
    loop {
        let placed = place(state, task);
        if !matches!(placed, Placement::Wait) || last_try || tokio::time::Instant::now() >= until {
            return placed;
        }
        // once more after the measurement ended: its slots are free then
        last_try = !state
            .pools
            .get(pool_id)
            .is_some_and(|p| p.snapshot().measuring);
        tokio::time::sleep(SLOT_POLL).await;
    }
}
