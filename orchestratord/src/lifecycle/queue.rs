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
//!
//! Across tenants, fair share decides (fair_share.rs): within a class the tenants' tasks are
//! merged by the service each tenant received, and a tenant below its share of a full queue
//! is admitted with room taken from the tenant furthest over its own (ORCH-FAIR-1..3). The
//! queue stores each class in first-come order; every reading of the line applies the merge.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use contracts::Priority;

use crate::config::FullPolicy;
use crate::lifecycle::fair_share::{Entry, FairShare};
use crate::lifecycle::task::{Claimant, Task};

pub struct TaskQueue {
    inner: Mutex<Classes>,
    capacity: usize,
    policy: FullPolicy,
    fair: FairShare,
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
#[derive(Debug, Clone)]
struct Pending {
    id: u64,
    tenant: String,
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

/// The tokens a queued task is expected to take: what the fair order charges it ahead.
fn cost(t: &Task) -> f64 {
    (t.prompt_tokens + t.spec.max_tokens) as f64
}

fn entries(class: &VecDeque<Arc<Task>>) -> Vec<Entry<'_>> {
    class
        .iter()
        .map(|t| Entry {
            tenant: &t.owner,
            cost: cost(t),
        })
        .collect()
}

/// One class in the order its tasks start.
fn class_order(fair: &FairShare, class: &VecDeque<Arc<Task>>) -> Vec<Arc<Task>> {
    fair.order(&entries(class), None)
        .into_iter()
        .map(|i| class[i].clone())
        .collect()
}

/// Why a queued task was sent back to make room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// The oldest batch task, under `drop-lru`.
    DropLru,
    /// The newest task of the tenant furthest over its share, for a tenant below its own.
    FairShare,
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

    /// Both classes in the order their tasks start.
    fn ordered(&self, fair: &FairShare) -> Vec<Arc<Task>> {
        let mut out = class_order(fair, &self.interactive);
        out.extend(class_order(fair, &self.batch));
        out
    }

    fn position(&self, fair: &FairShare, task: &Task) -> Option<usize> {
        self.ordered(fair)
            .iter()
            .position(|t| std::ptr::eq(Arc::as_ptr(t), task))
    }

    fn iter(&self) -> impl Iterator<Item = &Arc<Task>> {
        self.interactive.iter().chain(self.batch.iter())
    }

    fn holds_tenant(&self, tenant: &str) -> bool {
        self.iter().any(|t| t.owner == tenant)
    }

    /// Tenants with tasks queued and how many, in order of first appearance.
    fn waiting(&self) -> Vec<(&str, usize)> {
        let mut out: Vec<(&str, usize)> = Vec::new();
        for t in self.iter() {
            match out.iter_mut().find(|(o, _)| *o == t.owner) {
                Some(e) => e.1 += 1,
                None => out.push((&t.owner, 1)),
            }
        }
        out
    }

    /// Takes out the newest queued task of `tenant` (of the lower class first).
    fn take_newest_of(&mut self, tenant: &str) -> Option<Arc<Task>> {
        for class in [&mut self.batch, &mut self.interactive] {
            if let Some(i) = class.iter().rposition(|t| t.owner == tenant) {
                return class.remove(i);
            }
        }
        None
    }

    fn publish(&self, fair: &FairShare) {
        crate::metrics::queue_depth(self.interactive.len(), self.batch.len());
        fair.publish_queued(self.iter().map(|t| t.owner.as_str()));
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
    /// Queued after sending another task back (`why`); the caller ends the evicted one.
    QueuedEvicting {
        position: usize,
        evicted: Arc<Task>,
        why: Eviction,
    },
    /// The queue is full and the policy refuses.
    Full,
}

impl TaskQueue {
    /// A queue with fair share across tenants at equal weights.
    pub fn new(capacity: usize, policy: FullPolicy) -> Self {
        let fair = FairShare::new(Default::default(), &Default::default(), &[]);
        Self::with_fair_share(capacity, policy, fair)
    }

    pub fn with_fair_share(capacity: usize, policy: FullPolicy, fair: FairShare) -> Self {
        Self {
            inner: Mutex::new(Classes::default()),
            capacity,
            policy,
            fair,
        }
    }

    /// The tenants' counters and shares.
    pub fn fair(&self) -> &FairShare {
        &self.fair
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
    ///
    /// A full queue still takes a task of a tenant below its share of the capacity: the newest
    /// task of the tenant furthest over its share is sent back instead (fair_share.rs).
    pub fn push(&self, task: Arc<Task>, free_slots: impl FnOnce() -> usize) -> Enqueued {
        let mut q = self.lock();
        let mut evicted = None;
        // below the capacity there is room whatever the slots: no pool snapshots taken
        if q.len() >= self.capacity && q.len() >= self.capacity + free_slots() {
            let over = self
                .fair
                .room_from(self.capacity, &q.waiting(), &task.owner)
                .map(str::to_string);
            if let Some(newest) = over.and_then(|t| q.take_newest_of(&t)) {
                evicted = Some((newest, Eviction::FairShare));
            } else {
                match self.policy {
                    FullPolicy::Reject => return Enqueued::Full,
                    FullPolicy::DropLru => match q.batch.pop_front() {
                        Some(oldest) => evicted = Some((oldest, Eviction::DropLru)),
                        None => return Enqueued::Full,
                    },
                }
            }
        }
        if !q.holds_tenant(&task.owner) {
            let waiting: Vec<&str> = q.waiting().into_iter().map(|(t, _)| t).collect();
            self.fair.activate(&task.owner, &waiting);
        }
        let this = task.clone();
        match task.priority {
            Priority::Interactive => insert_ranked(&mut q.interactive, task),
            Priority::Batch => insert_ranked(&mut q.batch, task),
        }
        let position = q.position(&self.fair, &this).unwrap_or(0);
        q.publish(&self.fair);
        match evicted {
            Some((evicted, why)) => Enqueued::QueuedEvicting {
                position,
                evicted,
                why,
            },
            None => Enqueued::Queued { position },
        }
    }

    /// Whether [`TaskQueue::push`] would take a task now (a cheap check before the costly part
    /// of admission; the push itself still decides).
    pub fn has_room(&self, free_slots: usize, tenant: &str) -> bool {
        let q = self.lock();
        q.len() < self.capacity + free_slots
            || (matches!(self.policy, FullPolicy::DropLru) && !q.batch.is_empty())
            || self
                .fair
                .room_from(self.capacity, &q.waiting(), tenant)
                .is_some()
    }

    /// Puts a task that already held a place back at the front of its class (a requeue after
    /// its worker was lost keeps its turn); the capacity does not apply.
    pub fn push_front(&self, task: Arc<Task>) {
        let mut q = self.lock();
        if !q.holds_tenant(&task.owner) {
            let waiting: Vec<&str> = q.waiting().into_iter().map(|(t, _)| t).collect();
            self.fair.activate(&task.owner, &waiting);
        }
        match task.priority {
            Priority::Interactive => q.interactive.push_front(task),
            Priority::Batch => q.batch.push_front(task),
        }
        q.publish(&self.fair);
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

    /// What a task of `tenant` and `priority` ranked `rank` would have ahead of it — the
    /// queued tasks that dispatch before it in the fair order, the admissions promised a place
    /// before it and the places kept before its rank — and a place promised to it in the same
    /// step (`need`: its `max_tokens` and prompt tokens), held until the returned guard drops.
    pub fn ahead_of(
        &self,
        tenant: &str,
        priority: Priority,
        rank: Instant,
        need: (usize, usize),
    ) -> (Ahead, Promised<'_>) {
        let mut q = self.lock();
        q.drop_lapsed(Instant::now());
        let newcomer = (!q.holds_tenant(tenant)).then_some(tenant);
        // its class with it in its place: those merged before it are ahead
        let before_in = |class: &VecDeque<Arc<Task>>| -> Vec<Arc<Task>> {
            let at = class
                .iter()
                .rposition(|t| t.rank <= rank)
                .map_or(0, |i| i + 1);
            let mut e = entries(class);
            e.insert(
                at,
                Entry {
                    tenant,
                    cost: (need.0 + need.1) as f64,
                },
            );
            self.fair
                .order(&e, newcomer)
                .into_iter()
                .take_while(|&i| i != at)
                .map(|i| class[if i < at { i } else { i - 1 }].clone())
                .collect()
        };
        let tasks = match priority {
            Priority::Interactive => before_in(&q.interactive),
            Priority::Batch => {
                let mut all = class_order(&self.fair, &q.interactive);
                all.extend(before_in(&q.batch));
                all
            }
        };
        let first = |p: &Priority| matches!(p, Priority::Interactive);
        // only the tenant's own admissions in flight: another tenant's may yet be refused (a
        // prompt larger than the context, its quota, its own line) and holds no place ahead of
        // anyone but its own tenant's later requests (ISO-3: four loops of refused prompts
        // made every other tenant's request predicted minutes late)
        let promised = q
            .pending
            .iter()
            .filter(|p| match priority {
                Priority::Interactive => first(&p.priority) && p.rank <= rank,
                Priority::Batch => first(&p.priority) || p.rank <= rank,
            })
            .filter(|p| p.tenant == tenant)
            .map(|p| p.need)
            .collect();
        let kept_places = q.kept.iter().filter(|k| k.rank < rank).count();
        q.next_pending += 1;
        let id = q.next_pending;
        q.pending.push(Pending {
            id,
            tenant: tenant.to_string(),
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
        q.publish(&self.fair);
        q.len() != before
    }

    pub fn position(&self, task: &Task) -> Option<usize> {
        self.lock().position(&self.fair, task)
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
        for t in class_order(&self.fair, &q.interactive) {
            while kept.next_if(|k| k.rank < t.rank).is_some() {
                out.push(InLine::Kept);
            }
            out.push(InLine::Task(t));
        }
        out.extend(kept.map(|_| InLine::Kept));
        out.extend(
            class_order(&self.fair, &q.batch)
                .into_iter()
                .map(InLine::Task),
        );
        out
    }

    /// Queued tasks in dispatch order: interactive first; within a class, tenants merged by
    /// fair share, each tenant's own tasks first come, first served.
    pub fn in_order(&self) -> Vec<Arc<Task>> {
        self.lock().ordered(&self.fair)
    }

    /// Under fair share, the places of the queue `tenant` is entitled to now: the capacity
    /// times its weight over the weights of the tenants waiting, itself included.
    pub fn share_of(&self, tenant: &str) -> Option<f64> {
        if self.fair.mode() == crate::config::Fairness::Fifo {
            return None;
        }
        let q = self.lock();
        let waiting = q.waiting();
        let others: f64 = waiting
            .iter()
            .filter(|(t, _)| *t != tenant)
            .map(|(t, _)| self.fair.weight(t))
            .sum();
        let own = self.fair.weight(tenant);
        Some(self.capacity as f64 * own / (own + others))
    }

    /// Tasks queued by tenant.
    pub fn by_tenant(&self) -> Vec<(String, usize)> {
        let q = self.lock();
        q.waiting()
            .into_iter()
            .map(|(t, n)| (t.to_string(), n))
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
        let (a, promise) = q.ahead_of("local", Priority::Interactive, Instant::now(), (1, 1));
        assert_eq!((a.tasks.len(), a.promised.len(), a.kept_places), (1, 0, 2));
        // an admission promised a place counts ahead of the next one until it is dropped
        let (b, _) = q.ahead_of("local", Priority::Interactive, Instant::now(), (1, 1));
        assert_eq!(b.promised, vec![(1, 1)]);
        // ISO-3: another tenant's admission in flight is no place ahead of this one
        let (c, _) = q.ahead_of("other", Priority::Interactive, Instant::now(), (1, 1));
        assert!(c.promised.is_empty(), "{:?}", c.promised);
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
