//! Queues this replica knows are full (CLU-ADMIT-1): once the stream refused an admission into
//! a queue's class as full, the replica answers the next admissions there 429 itself, with no
//! round trip to JetStream. Each task of that queue and class that leaves the stream — whichever
//! replica lets it go says so on core NATS (`orchd.freed.<queue>`, fire and forget) — is one
//! place: one admission at a time asks the stream for it (a probe) while the others are still
//! refused here, as one box refuses all but the first of many requests that race for one free
//! place. The mark ends after [`KNOWN_FOR`] (a lost message costs at most that) or when the
//! queue's bound changed (a replica joined or left). The stream stays the one that admits:
//! this only refuses, and only what the stream refused a moment ago with no place freed since
//! that no probe is asking for, so the cluster's bound is never passed.
//!
//! A refusal that crossed a `freed` on its way back marks nothing: each queue's count of
//! `freed` messages is read before the admission and compared after. A probe that got no
//! answer from the stream (an error, or its admission dropped) gives its place back.

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
    /// Places freed since the mark that no probe is asking the stream for yet.
    room: u32,
}

/// The marks, per queue name and class.
#[derive(Default)]
pub struct KnownFull {
    queues: Mutex<HashMap<(String, Class), Entry>>,
}

/// What an admission read before it asked the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Known {
    /// Refused a moment ago and no place left since that no probe asks for: refuse
    /// without asking.
    Full,
    /// Ask the stream; `seen` is the queue's count of `freed` messages now.
    Ask { seen: u64 },
}

/// An admission's leave to ask the stream, from [`KnownFull::claim`]: when it holds a freed
/// place of a full queue (a probe), the place is given back unless [`Self::answered`] says the
/// stream answered.
pub struct Claim<'a> {
    known: &'a KnownFull,
    key: (String, Class),
    probe: bool,
    /// The queue's count of `freed` messages when it was claimed.
    pub seen: u64,
}

impl Claim<'_> {
    /// It holds a freed place of a queue the stream refused into a moment ago: the tasks
    /// that filled it wait before this one.
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    /// The stream answered (admitted, or refused as full): the place is spent.
    pub fn answered(mut self) {
        self.probe = false;
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if self.probe {
            let mut q = self.known.lock();
            if let Some(e) = q.get_mut(&self.key) {
                e.room = e.room.saturating_add(1);
            }
        }
    }
}

impl KnownFull {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, Class), Entry>> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `queue`'s `class` is known full at `bound` (a look: nothing is claimed).
    pub fn check(&self, queue: &str, class: Class, bound: i64, now: Instant) -> Known {
        let q = self.lock();
        match q.get(&(queue.to_string(), class)) {
            Some(e) if e.marked(bound, now) && e.room == 0 => Known::Full,
            Some(e) => Known::Ask { seen: e.freed },
            None => Known::Ask { seen: 0 },
        }
    }

    /// Leave to ask the stream for a place in `queue`'s `class` at `bound`: none when it is
    /// known full; a freed place of a full queue is held by the claim until the stream answers.
    pub fn claim(&self, queue: &str, class: Class, bound: i64, now: Instant) -> Option<Claim<'_>> {
        let key = (queue.to_string(), class);
        let mut q = self.lock();
        let (seen, probe) = match q.get_mut(&key) {
            Some(e) if e.marked(bound, now) => {
                if e.room == 0 {
                    return None;
                }
                e.room -= 1;
                (e.freed, true)
            }
            Some(e) => (e.freed, false),
            None => (0, false),
        };
        drop(q);
        Some(Claim {
            known: self,
            key,
            probe,
            seen,
        })
    }

    /// The stream refused an admission into `queue`'s `class` at `bound` as full; `seen` is
    /// what [`Self::claim`] read before it asked.
    pub fn refused(&self, queue: &str, class: Class, bound: i64, seen: u64, now: Instant) {
        let mut q = self.lock();
        let e = entry(&mut q, queue, class);
        // a task left meanwhile: the refusal is older than the room it made
        if e.freed == seen {
            if !e.marked(bound, now) {
                e.room = 0;
            }
            e.full = Some((bound, now + KNOWN_FOR));
        }
    }

    /// A task of `queue`'s `class` left the stream (on any replica): one place more for a
    /// probe while the queue is marked full.
    pub fn freed(&self, queue: &str, class: Class) {
        let mut q = self.lock();
        let e = entry(&mut q, queue, class);
        e.freed += 1;
        if e.full.is_some() {
            e.room = e.room.saturating_add(1);
        }
    }
}

impl Entry {
    /// Marked full at `bound`, and not old.
    fn marked(&self, bound: i64, now: Instant) -> bool {
        self.full
            .is_some_and(|(b, until)| b == bound && now < until)
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
    fn each_freed_place_lets_one_admission_at_a_time_ask() {
        let k = KnownFull::default();
        let t0 = Instant::now();
        let seen = k.claim("q", I, 6, t0).expect("nothing known yet").seen;
        k.refused("q", I, 6, seen, t0);
        assert!(k.claim("q", I, 6, t0).is_none(), "full: refused here");
        // one place left the stream: one probe asks for it, the others are refused meanwhile
        k.freed("q", I);
        assert!(matches!(k.check("q", I, 6, t0), Known::Ask { seen: 1 }));
        let probe = k.claim("q", I, 6, t0).expect("the freed place");
        assert_eq!(probe.seen, 1);
        assert!(k.claim("q", I, 6, t0).is_none(), "one probe per place");
        assert_eq!(k.check("q", I, 6, t0), Known::Full);
        // a probe with no answer (an error, its admission dropped) gives the place back
        drop(probe);
        let probe = k.claim("q", I, 6, t0).expect("the place given back");
        // answered (here: another replica's probe had it): full again, no place left
        probe.answered();
        k.refused("q", I, 6, 1, t0);
        assert!(k.claim("q", I, 6, t0).is_none());
        // two places: two probes at once
        k.freed("q", I);
        k.freed("q", I);
        let (a, b) = (k.claim("q", I, 6, t0), k.claim("q", I, 6, t0));
        assert!(a.is_some() && b.is_some() && k.claim("q", I, 6, t0).is_none());
        // old, or another bound: every admission asks
        assert!(k.claim("q", I, 6, t0 + KNOWN_FOR).is_some());
        assert!(k.claim("q", I, 8, t0).is_some());
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
