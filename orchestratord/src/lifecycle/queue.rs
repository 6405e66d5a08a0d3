//! The bounded two-class admission queue: `interactive` before `batch`, FIFO within a class.
//! A place is reserved in the same locked step that checks capacity, so a burst cannot
//! overshoot the bound.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use contracts::Priority;

use crate::config::FullPolicy;
use crate::lifecycle::task::Task;

pub struct TaskQueue {
    inner: Mutex<Classes>,
    capacity: usize,
    policy: FullPolicy,
}

#[derive(Default)]
struct Classes {
    interactive: VecDeque<Arc<Task>>,
    batch: VecDeque<Arc<Task>>,
}

impl Classes {
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

    /// Admits `task` if there is room (or room can be made under drop-lru). `free_slots`
    /// tasks more than the capacity may wait: that many idle slots take queued tasks at once,
    /// so a burst arriving faster than the dispatcher places it is not refused while slots
    /// are idle; what waits for a slot to free up stays within the capacity.
    pub fn push(&self, task: Arc<Task>, free_slots: usize) -> Enqueued {
        let mut q = self.lock();
        let mut evicted = None;
        if q.len() >= self.capacity + free_slots {
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
            Priority::Interactive => q.interactive.push_back(task),
            Priority::Batch => q.batch.push_back(task),
        }
        let position = q.position(&this).unwrap_or(0);
        crate::metrics::queue_depth(q.interactive.len(), q.batch.len());
        match evicted {
            Some(evicted) => Enqueued::QueuedEvicting { position, evicted },
            None => Enqueued::Queued { position },
        }
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
    use crate::lifecycle::task::{NewTask, RunSpec};
    use pool_manager::PromptInput;

    fn task(id: &str) -> Arc<Task> {
        Arc::new(Task::new(NewTask {
            id: id.into(),
            owner: "local".into(),
            correlation_id: id.into(),
            priority: Priority::Interactive,
            session_id: None,
            pin: None,
            model: None,
            spec: RunSpec {
                prompt: PromptInput::Text("hi".into()),
                continuation: String::new(),
                sampling: Default::default(),
                max_tokens: 1,
                stop: Vec::new(),
            },
            prompt_tokens: 1,
            prompt_ids: None,
            params: serde_json::Value::Null,
            ctx: 16,
            deadline: None,
        }))
    }

    /// ORCH-Q-1: a burst that arrives before the dispatcher has placed it is admitted up to
    /// the capacity plus the idle slots; what must wait for a busy slot stays within the
    /// capacity.
    #[test]
    fn idle_slots_add_room_only_for_what_they_take_at_once() {
        let q = TaskQueue::new(2, FullPolicy::Reject);
        let tasks: Vec<_> = (0..4).map(|i| task(&format!("t{i}"))).collect();
        for t in &tasks {
            assert!(matches!(q.push(t.clone(), 2), Enqueued::Queued { .. }));
        }
        assert!(matches!(q.push(task("t4"), 2), Enqueued::Full));
        // the dispatcher placed two: no idle slot left, two waiting is the capacity
        assert!(q.remove(&tasks[0]) && q.remove(&tasks[1]));
        assert!(matches!(q.push(task("t5"), 0), Enqueued::Full));
    }
}
