//! Queues this replica knows are full (CLU-ADMIT-1): once the stream refused an admission into
//! a queue's class as full, the replica answers the next admissions there 429 itself, with no
//! round trip to JetStream, until a task of that queue and class leaves the stream — whichever
//! replica lets it go says so on core NATS (`orchd.freed.<queue>`, fire and forget) — or
//! [`KNOWN_FOR`] has passed (a lost message costs at most that), or the queue's bound changed
//! (a replica joined or left). The stream stays the one that admits: this only refuses, and
//! only what the stream refused a moment ago, so the cluster's bound is never passed.
//!
//! A refusal that crossed a `freed` on its way back marks nothing: each queue's count of
//! `freed` messages is read before the admission and compared after.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use contracts::Priority as Class;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::subject_token::subject_token;
use super::{Cluster, ClusterError};

/// How long a full queue is believed full without news of a task leaving it.
pub const KNOWN_FOR: Duration = Duration::from_millis(500);
/// Queues (and classes) remembered at most; past it the marks are forgotten (a forgotten mark
/// costs a round trip, never a wrong answer).
const MAX_QUEUES: usize = 4096;

/// What goes on `orchd.freed.<queue>`: a task of `queue`'s `class` left the stream.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Freed {
    pub queue: String,
    pub class: Class,
}

#[derive(Default)]
struct Entry {
    /// `freed` messages seen for it so far.
    freed: u64,
    /// Full with this bound until then.
    full: Option<(i64, Instant)>,
}

/// The marks, per queue name and class.
#[derive(Default)]
pub struct KnownFull {
    queues: Mutex<HashMap<(String, Class), Entry>>,
}

/// What an admission read before it asked the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known {
    /// Refused a moment ago and nothing left since: refuse without asking.
    Full,
    /// Ask the stream; `seen` is the queue's count of `freed` messages now.
    Ask { seen: u64 },
}

impl KnownFull {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, Class), Entry>> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `queue`'s `class` is known full at `bound`.
    pub fn check(&self, queue: &str, class: Class, bound: i64, now: Instant) -> Known {
        let q = self.lock();
        match q.get(&(queue.to_string(), class)) {
            Some(e) => match e.full {
                Some((b, until)) if b == bound && now < until => Known::Full,
                _ => Known::Ask { seen: e.freed },
            },
            None => Known::Ask { seen: 0 },
        }
    }

    /// The stream refused an admission into `queue`'s `class` at `bound` as full; `seen` is
    /// what [`Self::check`] read before it asked.
    pub fn refused(&self, queue: &str, class: Class, bound: i64, seen: u64, now: Instant) {
        let mut q = self.lock();
        let e = entry(&mut q, queue, class);
        // a task left meanwhile: the refusal is older than the room it made
        if e.freed == seen {
            e.full = Some((bound, now + KNOWN_FOR));
        }
    }

    /// A task of `queue`'s `class` left the stream (on any replica).
    pub fn freed(&self, queue: &str, class: Class) {
        let mut q = self.lock();
        let e = entry(&mut q, queue, class);
        e.freed += 1;
        e.full = None;
    }
}

/// `queue`'s `class` entry, made if new (all forgotten first when [`MAX_QUEUES`] are kept).
fn entry<'a>(
    q: &'a mut HashMap<(String, Class), Entry>,
    queue: &str,
    class: Class,
) -> &'a mut Entry {
    let key = (queue.to_string(), class);
    if q.len() >= MAX_QUEUES && !q.contains_key(&key) {
        q.clear();
    }
    q.entry(key).or_default()
}

/// Largest `freed` message read (a queue's name and a class).
const MAX_FREED_BYTES: usize = 1024;

impl Cluster {
    /// Tells every replica that a task of `queue`'s `class` left the stream (core NATS, at
    /// most once: a replica that misses it asks the stream again after [`KNOWN_FOR`]).
    pub async fn say_freed(&self, queue: &str, class: Class) {
        let subject = format!("orchd.freed.{}", subject_token(queue));
        let Ok(payload) = serde_json::to_vec(&Freed {
            queue: queue.to_string(),
            class,
        }) else {
            return;
        };
        if let Err(e) = self.client.publish(subject, payload.into()).await {
            tracing::debug!(error = %e, "cluster: freed not sent");
        }
    }

    /// Applies every replica's `freed` messages (this one's too) to `known` until `stop`.
    pub async fn hear_freed(
        &self,
        known: &KnownFull,
        stop: tokio_util::sync::CancellationToken,
    ) -> Result<(), ClusterError> {
        let mut heard = self
            .client
            .subscribe("orchd.freed.*")
            .await
            .map_err(ClusterError::jetstream)?;
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                m = heard.next() => m,
            };
            let Some(msg) = msg else {
                return Ok(());
            };
            if msg.payload.len() > MAX_FREED_BYTES {
                continue;
            }
            if let Ok(f) = serde_json::from_slice::<Freed>(&msg.payload) {
                known.freed(&f.queue, f.class);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const I: Class = Class::Interactive;

    #[test]
    fn a_refusal_is_believed_until_a_task_leaves_or_it_is_old() {
        let k = KnownFull::default();
        let t0 = Instant::now();
        let Known::Ask { seen } = k.check("model-m", I, 6, t0) else {
            panic!("nothing known yet")
        };
        k.refused("model-m", I, 6, seen, t0);
        assert_eq!(k.check("model-m", I, 6, t0), Known::Full);
        // the other class and another queue are not
        assert!(matches!(
            k.check("model-m", Class::Batch, 6, t0),
            Known::Ask { .. }
        ));
        assert!(matches!(k.check("pool-a", I, 6, t0), Known::Ask { .. }));
        // a bound that grew (a replica joined): asked again
        assert!(matches!(k.check("model-m", I, 8, t0), Known::Ask { .. }));
        // old: asked again
        assert!(matches!(
            k.check("model-m", I, 6, t0 + KNOWN_FOR),
            Known::Ask { .. }
        ));
        // a task left: asked again
        k.freed("model-m", I);
        assert!(matches!(
            k.check("model-m", I, 6, t0),
            Known::Ask { seen: 1 }
        ));
    }

    #[test]
    fn a_refusal_that_crossed_a_freed_marks_nothing() {
        let k = KnownFull::default();
        let t0 = Instant::now();
        // a task leaves before this replica knew the queue at all
        k.freed("q", I);
        // an admission read `seen = 0` before the task left; its refusal comes back after
        k.refused("q", I, 6, 0, t0);
        assert!(matches!(k.check("q", I, 6, t0), Known::Ask { seen: 1 }));
        k.refused("q", I, 6, 1, t0);
        assert_eq!(k.check("q", I, 6, t0), Known::Full);
    }

    #[test]
    fn the_marks_are_bounded() {
        let k = KnownFull::default();
        let t0 = Instant::now();
        for i in 0..MAX_QUEUES + 10 {
            k.refused(&format!("q{i}"), I, 1, 0, t0);
        }
        assert!(k.lock().len() <= MAX_QUEUES);
        for i in 0..MAX_QUEUES + 10 {
            k.freed(&format!("f{i}"), I);
        }
        assert!(k.lock().len() <= MAX_QUEUES);
    }
}
