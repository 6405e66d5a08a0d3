//! Which pool each conversation last ran on (PLACE-3): keyed by the tenant and the
//! conversation's key (`prompt_cache_key`, else the `user` / `session_id`), bounded by
//! `placement.sessions` (the least recently used go first) and forgotten after
//! `placement.session_idle_ms` unused. Keys are kept as hashes: their length costs nothing.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use hashlink::LruCache;
use xxhash_rust::xxh3::xxh3_64;

/// A conversation's key as placement remembers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConversationKey(u64);

impl ConversationKey {
    /// The key of `key` for `tenant` (one tenant's keys never meet another's).
    pub fn of(tenant: &str, key: &str) -> Self {
        let mut bytes = Vec::with_capacity(tenant.len() + key.len() + 1);
        bytes.extend_from_slice(tenant.as_bytes());
        bytes.push(0);
        bytes.extend_from_slice(key.as_bytes());
        Self(xxh3_64(&bytes))
    }
}

pub struct PlacementSessions {
    pools: Mutex<LruCache<ConversationKey, (String, Instant)>>,
    idle: Duration,
}

impl PlacementSessions {
    pub fn new(capacity: usize, idle: Duration) -> Self {
        Self {
            pools: Mutex::new(LruCache::new(capacity.max(1))),
            idle,
        }
    }

    /// The pool the conversation last ran on, unless it was forgotten.
    pub fn pool_of(&self, key: ConversationKey) -> Option<String> {
        let mut g = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        match g.get(&key) {
            Some((pool, at)) if at.elapsed() <= self.idle => Some(pool.clone()),
            Some(_) => {
                g.remove(&key);
                None
            }
            None => None,
        }
    }

    /// The conversation runs on `pool` now.
    pub fn ran_on(&self, key: ConversationKey, pool: &str) {
        let mut g = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        g.insert(key, (pool.to_string(), Instant::now()));
    }

    pub fn len(&self) -> usize {
        self.pools.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversations_are_remembered_bounded_and_forgotten_when_idle() {
        let s = PlacementSessions::new(2, Duration::from_secs(60));
        let (a, b, c) = (
            ConversationKey::of("t", "a"),
            ConversationKey::of("t", "b"),
            ConversationKey::of("t", "c"),
        );
        s.ran_on(a, "p1");
        s.ran_on(b, "p2");
        assert_eq!(s.pool_of(a).as_deref(), Some("p1"));
        s.ran_on(c, "p1"); // b is the least recently used: it goes
        assert_eq!(s.len(), 2);
        assert_eq!(s.pool_of(b), None);
        assert_eq!(s.pool_of(c).as_deref(), Some("p1"));
        assert_ne!(ConversationKey::of("t", "a"), ConversationKey::of("u", "a"));
        let idle = PlacementSessions::new(2, Duration::ZERO);
        idle.ran_on(a, "p1");
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(idle.pool_of(a), None);
    }
}
