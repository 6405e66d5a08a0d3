//! All known tasks by tenant and id, bounded: finished tasks are kept for a TTL, and at most
//! `max_retained` records exist; the oldest finished ones are dropped first. Ids are per
//! tenant: two tenants may both use `task_id: "job-1"`, and neither can see the other's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::lifecycle::task::Task;

/// A task's key: its owner and its id.
type Key = (String, String);

fn key_of(task: &Task) -> Key {
    (task.owner.clone(), task.id.clone())
}

pub struct TaskStore {
    map: Mutex<HashMap<Key, Arc<Task>>>,
    ttl: Duration,
    max_retained: usize,
}

/// Result of inserting a task under a client-chosen id.
pub enum Inserted {
    New,
    /// A task with this id exists: idempotent resubmission returns it.
    Existing(Arc<Task>),
    /// The store is full of unfinished tasks.
    Full,
}

impl TaskStore {
    pub fn new(ttl: Duration, max_retained: usize) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            ttl,
            max_retained: max_retained.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Arc<Task>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The task `id` of `owner`; with `any_tenant` (an admin), when `owner` has none, the
    /// first of another tenant's. The owner's own is a map lookup: only an admin's miss scans.
    pub fn get(&self, owner: &str, id: &str, any_tenant: bool) -> Option<Arc<Task>> {
        let map = self.lock();
        if let Some(t) = map.get(&(owner.to_string(), id.to_string())) {
            return Some(t.clone());
        }
        if any_tenant {
            return map.values().find(|t| t.id == id).cloned();
        }
        None
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Inserts unless the id exists. Makes room by dropping expired, then oldest finished tasks.
    pub fn insert(&self, task: Arc<Task>) -> Inserted {
        let mut map = self.lock();
        if let Some(t) = map.get(&key_of(&task)) {
            return Inserted::Existing(t.clone());
        }
        if map.len() >= self.max_retained {
            Self::evict(&mut map, self.ttl, self.max_retained - 1);
            if map.len() >= self.max_retained {
                return Inserted::Full;
            }
        }
        map.insert(key_of(&task), task);
        Inserted::New
    }

    /// Drops finished tasks past their TTL (called periodically).
    pub fn sweep(&self) {
        let mut map = self.lock();
        let cap = map.len();
        Self::evict(&mut map, self.ttl, cap);
    }

    fn evict(map: &mut HashMap<Key, Arc<Task>>, ttl: Duration, target: usize) {
        let now = Instant::now();
        map.retain(|_, t| {
            let ended = t.lock().ended_at;
            ended.is_none_or(|e| now.duration_since(e) < ttl)
        });
        if map.len() <= target {
            return;
        }
        let mut finished: Vec<(Instant, Key)> = map
            .iter()
            .filter_map(|(id, t)| t.lock().ended_at.map(|e| (e, id.clone())))
            .collect();
        finished.sort();
        let excess = map.len() - target;
        for (_, id) in finished.into_iter().take(excess) {
            map.remove(&id);
        }
    }

    /// How many of `owner`'s tasks have not ended (queued or running).
    pub fn unfinished_of(&self, owner: &str) -> usize {
        self.lock()
            .values()
            .filter(|t| t.owner == owner && !t.is_terminal())
            .count()
    }

    /// Unfinished tasks (for shutdown).
    pub fn unfinished(&self) -> Vec<Arc<Task>> {
        self.lock()
            .values()
            .filter(|t| !t.is_terminal())
            .cloned()
            .collect()
    }
}

impl TaskStore {
    /// Forgets a task that never got admitted.
    pub fn remove(&self, task: &Task) {
        self.lock().remove(&key_of(task));
    }
}
