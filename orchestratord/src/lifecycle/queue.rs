//! The bounded two-class admission queue: `interactive` before `batch`, in order of place in
//! line within a class. A place is reserved in the same locked step that checks capacity, so a
//! burst cannot overshoot the bound.
//!
//! A task's place in line (`Task::rank`) is when it arrived, except for a retry that takes back
//! a place kept for it: a refusal that tells the client when to come back (429 with
//! `Retry-After`, or a queue deadline that passed) keeps the refused request's place for the
//! advised wait plus a grace, and a request that says it is a retry claims the oldest place
//! kept (ORCH-ADM-RETRY-1). Kept places count ahead of newcomers in every prediction, so the
//! clients that backed off are not starved by those that arrived while they waited — but
//! never ahead of a free slot (admission, deadline.rs). A place is kept only for a client
//! that counts its tries (its retry says so and can claim it), one a connection: a client
//! refused again on the same connection replaces its place (ORCH-ADM-RETRY-3).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use contracts::Priority;

use crate::config::FullPolicy;
use crate::lifecycle::task::{Claimant, Task};

pub struct TaskQueue {
    inner: Mutex<Classes>,
    capacity: usize,
    policy: FullPolicy,
}

#[derive(Default)]
struct Classes {
    interactive: VecDeque<Arc<Task>>,
    batch: VecDeque<Arc<Task>>,
    /// Places kept for refused requests, oldest place first.
    kept: VecDeque<KeptPlace>,
    /// Admissions that were promised a place and are being tokenized: they count ahead of
    /// later admissions until their task is queued (or they fail), so a burst arriving at
    /// once is not all predicted onto an empty line.
    pending: Vec<Pending>,
    next_pending: u64,
}

/// An admission between its prediction and its task's arrival in the queue.
#[derive(Debug, Clone, Copy)]
struct Pending {
    id: u64,
    priority: Priority,
    rank: Instant,
    /// (max_tokens, prompt tokens)
    need: (usize, usize),
}

/// A place promised to an admission: released when dropped (after its task is queued, or when
/// the admission fails).
pub struct Promised<'a> {
    queue: &'a TaskQueue,
    id: u64,
}

impl Drop for Promised<'_> {
    fn drop(&mut self) {
        let mut q = self.queue.lock();
        q.pending.retain(|p| p.id != self.id);
    }
}

/// A place in line kept for a refused request until it lapses.
#[derive(Debug, Clone, Copy)]
struct KeptPlace {
    rank: Instant,
    lapses: Instant,
    owner: Option<SocketAddr>,
}

/// Inserts `task` after every task of its class ranked at or before it.
fn insert_ranked(q: &mut VecDeque<Arc<Task>>, task: Arc<Task>) {
    let at = q
        .iter()
        .rposition(|t| t.rank <= task.rank)
        .map_or(0, |i| i + 1);
    q.insert(at, task);
}

/// What is ahead of a place in line: queued tasks (in dispatch order), admissions promised a
/// place before it ((max_tokens, prompt tokens) each) and kept places.
pub struct Ahead {
    pub tasks: Vec<Arc<Task>>,
    pub promised: Vec<(usize, usize)>,
    pub kept_places: usize,
}

impl Classes {
    fn drop_lapsed(&mut self, now: Instant) {
        self.kept.retain(|k| k.lapses > now);
    }

    fn len(&self) -> usize {
        self.interactive.len() + self.batch.len()
    }

    fn position(&self, task: &Task) -> Option<usize> {
        self.interactive
            .iter()
            .chain(self.batch.iter())
            .position(|t| std::ptr::eq(Arc::as_ptr(t), task))
    }
}

/// One place in the line: a queued task, or a place kept for a refused request.
pub enum InLine {
    Task(Arc<Task>),
    Kept,
}

/// Outcome of an enqueue attempt.
pub enum Enqueued {
    /// Queued with this many tasks ahead of it.
    Queued { position: usize },
    /// Queued after evicting the oldest batch task (drop-lru); the caller ends the evicted one.
    QueuedEvicting { position: usize, evicted: Arc<Task> },
    /// The queue is full and the policy refuses.
    Full,
}

impl TaskQueue {
    pub fn new(capacity: usize, policy: FullPolicy) -> Self {
        Self {
            inner: Mutex::new(Classes::default()),
            capacity,
            policy,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Classes> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn policy(&self) -> FullPolicy {
        self.policy
    }

    /// Admits `task` if there is room (or room can be made under drop-lru). As many tasks
    /// more than the capacity as `free_slots()` counts idle slots may wait: those slots take
    /// queued tasks at once, so a burst arriving faster than the dispatcher places it is not
    /// refused while slots are idle; what waits for a slot to free up stays within the
    /// capacity. The idle slots are counted under the queue's lock: the dispatcher takes a
    /// slot before it removes the task from the queue, so a count taken here never sees a
    /// task both gone from the line and its slot still idle (a count taken outside the lock
    /// could, and let a burst overshoot the bound by one).
    pub fn push(&self, task: Arc<Task>, free_slots: impl FnOnce() -> usize) -> Enqueued {
        let mut q = self.lock();
        let mut evicted = None;
        // below the capacity there is room whatever the slots: no pool snapshots taken
        if q.len() >= self.capacity && q.len() >= self.capacity + free_slots() {
            match self.policy {
                FullPolicy::Reject => return Enqueued::Full,
                FullPolicy::DropLru => match q.batch.pop_front() {
                    Some(oldest) => evicted = Some(oldest),
                    None => return Enqueued::Full,
                },
            }
        }
        let this = task.clone();
        match task.priority {
            Priority::Interactive => insert_ranked(&mut q.interactive, task),
            Priority::Batch => insert_ranked(&mut q.batch, task),
        }
        let position = q.position(&this).unwrap_or(0);
        crate::metrics::queue_depth(q.interactive.len(), q.batch.len());
        match evicted {
            Some(evicted) => Enqueued::QueuedEvicting { position, evicted },
            None => Enqueued::Queued { position },
        }
    }

    /// Whether [`TaskQueue::push`] would take a task now (a cheap check before the costly part
    /// of admission; the push itself still decides).
    pub fn has_room(&self, free_slots: usize) -> bool {
        let q = self.lock();
        q.len() < self.capacity + free_slots
            || (matches!(self.policy, FullPolicy::DropLru) && !q.batch.is_empty())
    }

    /// Puts a task that already held a place back at the front of its class (a requeue after
    /// its worker was lost keeps its turn); the capacity does not apply.
    pub fn push_front(&self, task: Arc<Task>) {
        let mut q = self.lock();
        match task.priority {
            Priority::Interactive => q.interactive.push_front(task),
            Priority::Batch => q.batch.push_front(task),
        }
        crate::metrics::queue_depth(q.interactive.len(), q.batch.len());
    }

    /// Keeps a place in line ranked `rank` until `lapses`, for a refused request told to come
    /// back: one place a connection (a place its connection held before is replaced), at most
    /// `capacity` in all (false when none could be kept).
    pub fn keep_place(&self, rank: Instant, lapses: Instant, claimant: Claimant) -> bool {
        let mut q = self.lock();
        q.drop_lapsed(Instant::now());
        let owner = claimant.connection;
        if owner.is_some() {
            q.kept.retain(|k| k.owner != owner);
        }
        if q.kept.len() >= self.capacity {
            return false;
        }
        let at = q
            .kept
            .iter()
            .rposition(|k| k.rank <= rank)
            .map_or(0, |i| i + 1);
        q.kept.insert(
            at,
            KeptPlace {
                rank,
                lapses,
                owner,
            },
        );
        true
    }

    /// A retry takes the place kept on its own connection, else the oldest kept place: its
    /// rank, if one is kept.
    pub fn claim_place(&self, now: Instant, claimant: Claimant) -> Option<Instant> {
        let mut q = self.lock();
        q.drop_lapsed(now);
        let own = claimant
            .connection
            .and_then(|c| q.kept.iter().position(|k| k.owner == Some(c)));
        q.kept.remove(own.unwrap_or(0)).map(|k| k.rank)
    }

    /// Places kept now.
    pub fn kept_places(&self) -> usize {
        let mut q = self.lock();
        q.drop_lapsed(Instant::now());
        q.kept.len()
    }

    /// What a task of `priority` ranked `rank` would have ahead of it — the queued tasks that
    /// dispatch before it, the admissions promised a place before it and the places kept
    /// before its rank — and a place promised to it in the same step (`need`: its
    /// `max_tokens` and prompt tokens), held until the returned guard drops.
    pub fn ahead_of(
        &self,
        priority: Priority,
        rank: Instant,
        need: (usize, usize),
    ) -> (Ahead, Promised<'_>) {
        let mut q = self.lock();
        q.drop_lapsed(Instant::now());
        let before = |t: &&Arc<Task>| t.rank <= rank;
        let tasks = match priority {
            Priority::Interactive => q.interactive.iter().filter(before).cloned().collect(),
            Priority::Batch => q
                .interactive
                .iter()
                .cloned()
                .chain(q.batch.iter().filter(before).cloned())
                .collect(),
        };
        let first = |p: &Priority| matches!(p, Priority::Interactive);
        let promised = q
            .pending
            .iter()
            .filter(|p| match priority {
                Priority::Interactive => first(&p.priority) && p.rank <= rank,
                Priority::Batch => first(&p.priority) || p.rank <= rank,
            })
            .map(|p| p.need)
            .collect();
        let kept_places = q.kept.iter().filter(|k| k.rank < rank).count();
        q.next_pending += 1;
        let id = q.next_pending;
        q.pending.push(Pending {
            id,
            priority,
            rank,
            need,
        });
        (
            Ahead {
                tasks,
                promised,
                kept_places,
            },
            Promised { queue: self, id },
        )
    }

    /// Removes a queued task; false if it was not queued.
    pub fn remove(&self, task: &Task) -> bool {
        let mut q = self.lock();
        let before = q.len();
        q.interactive
            .retain(|t| !std::ptr::eq(Arc::as_ptr(t), task));
        q.batch.retain(|t| !std::ptr::eq(Arc::as_ptr(t), task));
        crate::metrics::queue_depth(q.interactive.len(), q.batch.len());
        q.len() != before
    }

    pub fn position(&self, task: &Task) -> Option<usize> {
        self.lock().position(task)
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// (interactive, batch) depths.
    pub fn depths(&self) -> (usize, usize) {
        let q = self.lock();
        (q.interactive.len(), q.batch.len())
    }

    /// The line in dispatch order, kept places included: interactive tasks and kept places
    /// by rank (a retry that claims a kept place dispatches there), then batch tasks.
    pub fn line(&self) -> Vec<InLine> {
        let mut q = self.lock();
        q.drop_lapsed(Instant::now());
        let mut out = Vec::with_capacity(q.len() + q.kept.len());
        let mut kept = q.kept.iter().peekable();
        for t in &q.interactive {
            while kept.next_if(|k| k.rank < t.rank).is_some() {
                out.push(InLine::Kept);
            }
            out.push(InLine::Task(t.clone()));
        }
        out.extend(kept.map(|_| InLine::Kept));
        out.extend(q.batch.iter().cloned().map(InLine::Task));
        out
    }

    /// Queued tasks in dispatch order (interactive first, FIFO within a class).
    pub fn in_order(&self) -> Vec<Arc<Task>> {
        let q = self.lock();
        q.interactive
            .iter()
            .chain(q.batch.iter())
            .cloned()
            .collect()
    }

    /// Queued tasks that `pred` selects (e.g. pinned to a pool), in order.
    pub fn count_where(&self, pred: impl Fn(&Task) -> bool) -> usize {
        let q = self.lock();
        q.interactive
            .iter()
            .chain(q.batch.iter())
            .filter(|t| pred(t))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn task(id: &str) -> Arc<Task> {
        ranked(id, None)
    }

    fn ranked(id: &str, rank: Option<Instant>) -> Arc<Task> {
        crate::lifecycle::task::test_task(id, rank)
    }

    /// ORCH-Q-1: a burst that arrives before the dispatcher has placed it is admitted up to
    /// the capacity plus the idle slots; what must wait for a busy slot stays within the
    /// capacity.
    #[test]
    fn idle_slots_add_room_only_for_what_they_take_at_once() {
        let q = TaskQueue::new(2, FullPolicy::Reject);
        let tasks: Vec<_> = (0..4).map(|i| task(&format!("t{i}"))).collect();
        for t in &tasks {
            assert!(matches!(q.push(t.clone(), || 2), Enqueued::Queued { .. }));
        }
        assert!(matches!(q.push(task("t4"), || 2), Enqueued::Full));
        // the dispatcher placed two: no idle slot left, two waiting is the capacity
        assert!(q.remove(&tasks[0]) && q.remove(&tasks[1]));
        assert!(matches!(q.push(task("t5"), || 0), Enqueued::Full));
    }

    /// ORCH-ADM-RETRY-1: a retry that claims a kept place is queued at that place, ahead of
    /// the newcomers that arrived while it waited; kept places count ahead of newcomers and
    /// lapse; at most `capacity` are kept.
    #[test]
    fn a_claimed_place_goes_before_newcomers_and_places_lapse() {
        let q = TaskQueue::new(2, FullPolicy::Reject);
        let early = Instant::now();
        let now = early + Duration::from_millis(10);
        let anyone = Claimant { connection: None };
        assert!(q.keep_place(early, now + Duration::from_secs(5), anyone));
        assert!(q.keep_place(early, now + Duration::from_secs(5), anyone));
        assert!(!q.keep_place(early, now, anyone), "bounded by the capacity");
        let newcomer = task("new");
        assert!(matches!(
            q.push(newcomer.clone(), || 0),
            Enqueued::Queued { position: 0 }
        ));
        let (a, promise) = q.ahead_of(Priority::Interactive, Instant::now(), (1, 1));
        assert_eq!((a.tasks.len(), a.promised.len(), a.kept_places), (1, 0, 2));
        // an admission promised a place counts ahead of the next one until it is dropped
        let (b, _) = q.ahead_of(Priority::Interactive, Instant::now(), (1, 1));
        assert_eq!(b.promised, vec![(1, 1)]);
        drop(promise);
        let rank = q.claim_place(now, anyone).unwrap();
        assert_eq!(rank, early);
        let retry = ranked("retry", Some(rank));
        assert!(matches!(
            q.push(retry.clone(), || 1),
            Enqueued::Queued { position: 0 }
        ));
        let order: Vec<_> = q.in_order().iter().map(|t| t.id.clone()).collect();
        assert_eq!(order, ["retry", "new"]);
        assert_eq!(q.kept_places(), 1);
        // the last kept place lapses unclaimed
        assert_eq!(q.claim_place(now + Duration::from_secs(6), anyone), None);
    }

    /// ORCH-ADM-RETRY-3: a connection holds one kept place at most (refused again, it
    /// replaces its place), and its retry takes back its own place before anyone else's.
    #[test]
    fn one_kept_place_a_connection() {
        let q = TaskQueue::new(8, FullPolicy::Reject);
        let (a, b) = (
            Claimant {
                connection: Some("127.0.0.1:4001".parse().unwrap()),
            },
            Claimant {
                connection: Some("127.0.0.1:4002".parse().unwrap()),
            },
        );
        let t0 = Instant::now();
        let lapses = t0 + Duration::from_secs(30);
        assert!(q.keep_place(t0, lapses, a));
        for i in 1..50 {
            assert!(q.keep_place(t0 + Duration::from_millis(i), lapses, b));
        }
        assert_eq!(q.kept_places(), 2, "one place a connection");
        assert_eq!(q.claim_place(t0, b), Some(t0 + Duration::from_millis(49)));
        assert_eq!(q.claim_place(t0, b), Some(t0), "then the oldest");
        assert_eq!(q.kept_places(), 0);
    }
}
