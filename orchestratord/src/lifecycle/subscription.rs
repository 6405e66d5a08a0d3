//! Following a task: the one way every protocol reads a task's events (the task API's SSE,
//! OpenAI and Ollama-style chat, Kolosal, Hyperswarm). A subscription replays the stored
//! events from any point, then follows them live, and ends after the terminal event.
//!
//! Event ids are the events' positions in the task (0 = `started`), so a reconnecting reader
//! resumes after the last id it saw with nothing repeated and nothing missing.
//!
//! A subscription that goes away before the terminal event may cancel the task
//! (`stream.cancel_on_disconnect`), but only when it was the task's last follower and nobody
//! followed it again within the grace period: a monitor that leaves, or a browser that
//! reconnects, does not kill it. Protocols that cannot resume a stream use no grace.

use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use tokio::sync::watch;

use super::task::{Task, TaskEvent};
use crate::lifecycle::state::SharedLifecycle;
use crate::metrics::CancelReason;

/// Whether the reader can come back to the same stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// The task API's SSE: a reader may reconnect with `Last-Event-ID` within the configured
    /// grace period (`stream.disconnect_grace_ms`).
    WithinGrace,
    /// Protocols with no way back to the same answer (OpenAI, Ollama-style, Hyperswarm): the
    /// last reader leaving cancels at once.
    Never,
}

/// What a subscription yields.
#[derive(Debug, Clone, PartialEq)]
pub enum Followed {
    /// Event number `id` of the task.
    Event(usize, TaskEvent),
    /// Nothing happened for the keep-alive interval.
    KeepAlive,
}

/// One reader of one task.
pub struct Subscription {
    state: SharedLifecycle,
    task: Arc<Task>,
    changes: watch::Receiver<u64>,
    cursor: usize,
    /// The terminal event was read (the task cannot be cancelled by this reader any more).
    finished: bool,
    resume: Resume,
}

impl Subscription {
    /// Follows `task` from event number `from` (0 = from the first).
    pub fn new(state: &SharedLifecycle, task: Arc<Task>, from: usize, resume: Resume) -> Self {
        task.follow();
        Self {
            state: state.clone(),
            changes: task.subscribe(),
            task,
            cursor: from,
            finished: false,
            resume,
        }
    }

    pub fn task(&self) -> &Arc<Task> {
        &self.task
    }

    /// Looks at every event of the task so far, without reading them (the cursor stays).
    pub fn peek<R>(&self, f: impl FnOnce(&[TaskEvent]) -> R) -> R {
        f(&self.task.lock().events)
    }

    /// Hands every event not read yet to `f` with its id, in order, under the task's lock (no
    /// copy). Returns true once the terminal event has been handed out.
    pub fn read_pending(&mut self, mut f: impl FnMut(usize, &TaskEvent)) -> bool {
        let task = self.task.clone();
        let g = task.lock();
        let from = self.cursor.min(g.events.len());
        for (i, ev) in g.events.iter().enumerate().skip(from) {
            f(i, ev);
        }
        self.cursor = self.cursor.max(g.events.len());
        self.finished = g.is_terminal();
        self.finished
    }

    /// Waits until the task has news; false when `keepalive` passed first.
    pub async fn wait(&mut self, keepalive: Option<Duration>) -> bool {
        let changed = self.changes.changed();
        match keepalive {
            Some(k) => tokio::time::timeout(k, changed).await.is_ok(),
            None => {
                let _ = changed.await;
                true
            }
        }
    }

    /// The events as owned values, with a keep-alive after each `keepalive` of silence;
    /// the stream ends after the terminal event.
    pub fn into_stream(self, keepalive: Option<Duration>) -> impl Stream<Item = Followed> {
        let pending = std::collections::VecDeque::new();
        futures::stream::unfold((self, pending), move |(mut sub, mut pending)| async move {
            loop {
                if let Some(item) = pending.pop_front() {
                    return Some((item, (sub, pending)));
                }
                if sub.finished {
                    return None;
                }
                sub.read_pending(|i, ev| pending.push_back(Followed::Event(i, ev.clone())));
                if !pending.is_empty() || sub.finished {
                    continue;
                }
                if !sub.wait(keepalive).await {
                    return Some((Followed::KeepAlive, (sub, pending)));
                }
            }
        })
    }

    /// Only the task's events (keep-alives are of no use to the caller).
    pub fn events(self) -> impl Stream<Item = TaskEvent> {
        use futures::StreamExt;
        self.into_stream(None).filter_map(|f| async move {
            match f {
                Followed::Event(_, ev) => Some(ev),
                Followed::KeepAlive => None,
            }
        })
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let Some(departure) = self.task.unfollow() else {
            return;
        };
        let cfg = &self.state.cfg.stream;
        if self.finished || !cfg.cancel_on_disconnect || self.task.is_terminal() {
            return;
        }
        let grace = match self.resume {
            Resume::WithinGrace => Duration::from_millis(cfg.disconnect_grace_ms),
            Resume::Never => Duration::ZERO,
        };
        let runtime = tokio::runtime::Handle::try_current();
        match runtime {
            Ok(rt) if !grace.is_zero() => {
                let (state, task) = (self.state.clone(), self.task.clone());
                rt.spawn(async move {
                    tokio::time::sleep(grace).await;
                    if task.unfollowed_since(departure) {
                        state.cancel_task(&task, CancelReason::Disconnect);
                    }
                });
            }
            _ => {
                self.state.cancel_task(&self.task, CancelReason::Disconnect);
            }
        }
    }
}
