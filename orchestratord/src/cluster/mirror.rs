//! Following a task another replica runs: a local task fed from the relay, so every route and
//! adapter reads it as it reads a task of its own (replay, live events, `Last-Event-ID`, the
//! disconnect grace). The replica that admitted a task follows it from its `started`; any other
//! adopts it when a client asks for it there (a stream resumed after its replica died).
//!
//! A followed task that ends here (a cancel, the client's or its disconnect's, or a tool answer
//! ended at a repeated call) stops where it runs: the cancel goes to the other replicas, and the
//! `end` it had here goes on the relay, so a task still queued is dropped by whoever takes it.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use contracts::ErrorCode;
use futures::{Stream, StreamExt};

use super::cancel::CancelAsk;
use super::event_relay::Relayed;
use super::task_path::TaskPath;
use super::ClusterError;
use crate::error::ApiError;
use crate::lifecycle::handoff::WireEvent;
use crate::lifecycle::relayed_task::{self, Purpose};
use crate::lifecycle::state::Lifecycle;
use crate::lifecycle::task::{Task, TaskEvent};
use crate::lifecycle::task_store::Inserted;

pub(super) type Events = Pin<Box<dyn Stream<Item = Result<Relayed, ClusterError>> + Send>>;

/// How long adopting a task waits for the relay's first event of it.
const FIRST_EVENT_WAIT: Duration = Duration::from_millis(500);
/// The event number of the cancelled `end` a follower puts on the relay (not an event number
/// the running replica uses).
const CANCEL_NUMBER: u64 = u64::MAX;

impl TaskPath {
    /// Feeds `task` from `events` until its end; a cancel here goes to where it runs.
    pub(super) fn spawn_feeder(
        self: &Arc<Self>,
        state: Arc<Lifecycle>,
        task: Arc<Task>,
        events: Events,
    ) {
        task.mark_relayed();
        let path = self.clone();
        tokio::spawn(async move { path.feed(state, task, events).await });
    }

    async fn feed(self: Arc<Self>, state: Arc<Lifecycle>, task: Arc<Task>, mut events: Events) {
        tracing::debug!(task_id = %task.id, "cluster: following a task");
        loop {
            tokio::select! {
                _ = task.cancel.cancelled() => break,
                _ = state.shutdown.cancelled() => return,
                next = events.next() => match next {
                    Some(Ok(r)) => {
                        if apply(&state, &task, &r) {
                            // ended by this event, or here meanwhile (a cancel that came
                            // beside it: `select!` may take either first)
                            if WireEvent::ends_task(&r.payload) {
                                tracing::debug!(task_id = %task.id, id = r.id, "cluster: a followed task ended on the relay");
                                return;
                            }
                            break;
                        }
                    }
                    Some(Err(e)) => {
                        tracing::warn!(task_id = %task.id, error = %e, "cluster: following a task's events");
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    None => return,
                },
            }
        }
        // it ended here, not by the relay (a cancel, or a tool answer that began repeating a
        // call): it stops where it runs
        tracing::debug!(task_id = %task.id, ended = task.is_terminal(), "cluster: following a task ended here");
        if task.is_terminal() {
            self.stop_elsewhere(&task).await;
        }
    }

    /// Gives `task` (admitted here, run here) one event of its run as the relay holds it
    /// (`run_here.rs`), as a follower reading the relay applies it; true once it has ended.
    pub(super) fn hand_over(&self, state: &Lifecycle, task: &Task, relayed: &Relayed) -> bool {
        apply(state, task, relayed)
    }

    /// Follows `task` on the relay after event `after` (every event before came from this
    /// replica's run of it, `run_here.rs`); a relay that does not answer for
    /// [`super::task_path::ANNOUNCE_FOR`] fails it.
    pub(super) async fn follow_from(
        self: &Arc<Self>,
        state: &Arc<Lifecycle>,
        task: Arc<Task>,
        after: u64,
    ) {
        let until = tokio::time::Instant::now() + super::task_path::ANNOUNCE_FOR;
        loop {
            match self.relay.follow(&task.id, after).await {
                Ok(events) => return self.spawn_feeder(state.clone(), task, Box::pin(events)),
                Err(_) if tokio::time::Instant::now() < until => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(e) => {
                    state.fail_task(
                        &task,
                        ErrorCode::ClusterUnavailable,
                        format!("the cluster's event relay did not answer: {e}"),
                        true,
                        Some(1000),
                    );
                    return;
                }
            }
        }
    }

    /// Puts the `end` it had here on the relay and asks the replica running `task` to stop it.
    async fn stop_elsewhere(&self, task: &Task) {
        self.relay_end_here(task).await;
        let ask = CancelAsk {
            tenant: task.owner.clone(),
            sees_all: false,
        };
        if let Err(e) = self.cluster.cancel_elsewhere(&task.id, &ask).await {
            tracing::warn!(task_id = %task.id, error = %e, "cluster: cancel not sent to the other replicas");
        }
    }

    /// Puts the `end` `task` had here (not from its run) on the relay: the task's terminal
    /// there, before whatever its run appends after.
    pub(super) async fn relay_end_here(&self, task: &Task) {
        let end = task.lock().events.last().cloned();
        if let Some(end @ TaskEvent::End(_)) = end {
            if let Err(e) = self
                .relay
                .publish(&task.id, CANCEL_NUMBER, WireEvent::of(&end).encode())
                .await
            {
                tracing::warn!(task_id = %task.id, error = %e, "cluster: cancel not put on the relay");
            }
        }
    }

    /// The task `id` as the relay holds it, followed from here from now on, when `tenant` may
    /// see it (`sees_all`: any tenant's). `None` when the relay has no such task (for them).
    pub async fn adopt_task(
        self: &Arc<Self>,
        state: &Arc<Lifecycle>,
        tenant: &str,
        sees_all: bool,
        id: &str,
    ) -> Result<Option<Arc<Task>>, ApiError> {
        let unavailable = |e: ClusterError| {
            ApiError::new(
                ErrorCode::ClusterUnavailable,
                format!("the cluster's event relay did not answer: {e}"),
                true,
            )
            .with_retry_after(1000)
        };
        // ids admission would not take are nobody's
        if !crate::lifecycle::admission::valid_id(id) {
            return Ok(None);
        }
        let Some(last) = self.relay.last_id(id).await.map_err(unavailable)? else {
            return Ok(None);
        };
        let mut events: Events = Box::pin(self.relay.follow(id, 0).await.map_err(unavailable)?);
        let first = match tokio::time::timeout(FIRST_EVENT_WAIT, events.next()).await {
            Ok(Some(Ok(r))) => r,
            Ok(Some(Err(e))) => return Err(unavailable(e)),
            _ => return Ok(None),
        };
        let wires = WireEvent::decode_all(&first.payload);
        let Some((wire, with_it)) = wires.split_first() else {
            return Ok(None);
        };
        let (Some(handoff), Some(started @ TaskEvent::Started(_))) =
            (&wire.handoff, wire.to_event())
        else {
            return Ok(None);
        };
        if handoff.owner != tenant && !sees_all {
            return Ok(None);
        }
        let task = relayed_task::build(state, handoff, Purpose::Follow).await?;
        if let TaskEvent::Started(s) = started {
            task.push_started(s);
        }
        // what came in one message with it (a `started` is appended alone today)
        for w in with_it {
            apply_one(state, &task, w, first.at);
        }
        match state.tasks.insert(task.clone()) {
            Inserted::New => {}
            // adopted meanwhile by another request
            Inserted::Existing(t) => {
                tracing::debug!(task_id = %id, "cluster: adopted meanwhile");
                return Ok(Some(t));
            }
            Inserted::Full => {
                return Err(ApiError::new(
                    ErrorCode::AdmissionReject,
                    "too many unfinished tasks on this replica",
                    true,
                )
                .with_retry_after(1000))
            }
        }
        // everything so far before answering (a resumed stream names an event from it)
        let mut seen = first.id;
        while seen < last {
            match tokio::time::timeout(FIRST_EVENT_WAIT, events.next()).await {
                Ok(Some(Ok(r))) => {
                    seen = r.id;
                    if apply(state, &task, &r) {
                        tracing::debug!(task_id = %id, "cluster: adopted after its end");
                        return Ok(Some(task));
                    }
                }
                _ => break,
            }
        }
        self.spawn_feeder(state.clone(), task.clone(), events);
        Ok(Some(task))
    }
}

/// Applies one relayed message's events to `task`, timed when the relay stored it; true once
/// the task has ended.
fn apply(state: &Lifecycle, task: &Task, relayed: &Relayed) -> bool {
    for wire in WireEvent::decode_all(&relayed.payload) {
        apply_one(state, task, &wire, relayed.at);
    }
    task.is_terminal()
}

/// Applies one relayed event to `task`, timed at `at`.
fn apply_one(state: &Lifecycle, task: &Task, wire: &WireEvent, at: std::time::Instant) {
    if let Some(placed) = wire.placed.clone() {
        task.mark_placed_elsewhere(placed);
    }
    let Some(ev) = wire.to_event() else {
        return;
    };
    match ev {
        TaskEvent::Started(s) => task.push_started(s),
        TaskEvent::Token(t) => {
            task.mark_running_elsewhere(at);
            task.push_relayed_token(t.t, t.logprobs, at);
        }
        TaskEvent::Metrics(m) => {
            task.mark_running_elsewhere(at);
            task.push_relayed_metrics(m, at);
        }
        end @ (TaskEvent::End(_) | TaskEvent::Error(_)) => {
            state.end_relayed(task, end, at);
        }
    }
}
