//! Sessions: token and time budgets across a client's tasks, bounded in count and TTL.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use contracts::SessionInfo;

use crate::config::SessionConfig;

struct Session {
    last_used: Instant,
    turns: u32,
    tokens_used: u64,
    time_used_ms: u64,
}

/// Why a session cannot take a task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetError {
    Tokens { needed: u64, remaining: u64 },
    Time { used_ms: u64, budget_ms: u64 },
}

impl std::fmt::Display for BudgetError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tokens { needed, remaining } => write!(
                f,
                "session token budget exceeded: task needs {needed} tokens, {remaining} remain"
            ),
            Self::Time { used_ms, budget_ms } => write!(
                f,
                "session time budget exhausted: {used_ms} of {budget_ms} ms used"
            ),
        }
    }
}

/// Remaining budgets of a session, for `metrics` frames.
#[derive(Debug, Clone, Copy, Default)]
pub struct Remaining {
    pub tokens: Option<u64>,
    pub time_ms: Option<u64>,
}

/// A session's key: the tenant that owns it and its id (ids are per tenant).
type Key = (String, String);

fn key(owner: &str, id: &str) -> Key {
    (owner.to_string(), id.to_string())
}

pub struct SessionStore {
    map: Mutex<HashMap<Key, Session>>,
    cfg: SessionConfig,
}

impl SessionStore {
    pub fn new(cfg: SessionConfig) -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            cfg,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Session>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ttl(&self) -> Duration {
        Duration::from_millis(self.cfg.ttl_ms)
    }

    /// Charges a task's `tokens` (prompt + max_tokens) to the session, creating it if needed.
    pub fn reserve(&self, owner: &str, id: &str, tokens: u64) -> Result<(), BudgetError> {
        let mut map = self.lock();
        let now = Instant::now();
        let ttl = self.ttl();
        let id = key(owner, id);
        if !map.contains_key(&id) && map.len() >= self.cfg.max_sessions.max(1) {
            map.retain(|_, s| now.duration_since(s.last_used) < ttl);
            if map.len() >= self.cfg.max_sessions.max(1) {
                // forget the least recently used session to stay bounded
                if let Some(oldest) = map
                    .iter()
                    .min_by_key(|(_, s)| s.last_used)
                    .map(|(k, _)| k.clone())
                {
                    map.remove(&oldest);
                }
            }
        }
        let s = map.entry(id).or_insert(Session {
            last_used: now,
            turns: 0,
            tokens_used: 0,
            time_used_ms: 0,
        });
        if let Some(budget) = self.cfg.token_budget {
            let remaining = budget.saturating_sub(s.tokens_used);
            if tokens > remaining {
                return Err(BudgetError::Tokens {
                    needed: tokens,
                    remaining,
                });
            }
        }
        if let Some(budget_ms) = self.cfg.time_budget_ms {
            if s.time_used_ms >= budget_ms {
                return Err(BudgetError::Time {
                    used_ms: s.time_used_ms,
                    budget_ms,
                });
            }
        }
        s.tokens_used += tokens;
        s.turns += 1;
        s.last_used = now;
        Ok(())
    }

    /// Returns unused reserved tokens and charges decode time when a task ends.
    pub fn settle(&self, owner: &str, id: &str, refund_tokens: u64, time_ms: u64) {
        if let Some(s) = self.lock().get_mut(&key(owner, id)) {
            s.tokens_used = s.tokens_used.saturating_sub(refund_tokens);
            s.time_used_ms += time_ms;
            s.last_used = Instant::now();
        }
    }

    pub fn remaining(&self, owner: &str, id: &str) -> Remaining {
        let map = self.lock();
        let Some(s) = map.get(&key(owner, id)) else {
            return Remaining::default();
        };
        Remaining {
            tokens: self
                .cfg
                .token_budget
                .map(|b| b.saturating_sub(s.tokens_used)),
            time_ms: self
                .cfg
                .time_budget_ms
                .map(|b| b.saturating_sub(s.time_used_ms)),
        }
    }

    /// The key of session `id`: `owner`'s, or with `any_tenant` (an admin), when `owner` has
    /// none, another tenant's.
    fn find(map: &HashMap<Key, Session>, owner: &str, id: &str, any_tenant: bool) -> Option<Key> {
        let own = key(owner, id);
        if map.contains_key(&own) {
            return Some(own);
        }
        if any_tenant {
            return map.keys().find(|(_, i)| i == id).cloned();
        }
        None
    }

    /// The session `id` of `owner` (see [`Self::find`] for admins).
    pub fn info(&self, owner: &str, id: &str, any_tenant: bool) -> Option<SessionInfo> {
        let map = self.lock();
        let s = map.get(&Self::find(&map, owner, id, any_tenant)?)?;
        let idle = s.last_used.elapsed();
        if idle >= self.ttl() {
            return None;
        }
        Some(SessionInfo {
            session_id: id.to_string(),
            ttl_ms_remaining: (self.ttl() - idle).as_millis() as u64,
            turns: s.turns,
            tokens_used: s.tokens_used,
            token_budget: self.cfg.token_budget,
            tokens_remaining: self
                .cfg
                .token_budget
                .map(|b| b.saturating_sub(s.tokens_used)),
            time_used_ms: s.time_used_ms,
            time_budget_ms: self.cfg.time_budget_ms,
            time_remaining_ms: self
                .cfg
                .time_budget_ms
                .map(|b| b.saturating_sub(s.time_used_ms)),
        })
    }

    /// Forgets the session `id` of `owner` (see [`Self::find`] for admins).
    pub fn delete(&self, owner: &str, id: &str, any_tenant: bool) -> bool {
        let mut map = self.lock();
        match Self::find(&map, owner, id, any_tenant) {
            Some(k) => map.remove(&k).is_some(),
            None => false,
        }
    }

    /// Forgets sessions unused past their TTL (called periodically).
    pub fn sweep(&self) {
        let ttl = self.ttl();
        let now = Instant::now();
        self.lock()
            .retain(|_, s| now.duration_since(s.last_used) < ttl);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(tokens: Option<u64>, max: usize) -> SessionStore {
        SessionStore::new(SessionConfig {
            ttl_ms: 60_000,
            max_sessions: max,
            token_budget: tokens,
            time_budget_ms: Some(1000),
        })
    }

    #[test]
    fn token_budget_is_reserved_and_refunded() {
        let s = store(Some(100), 10);
        s.reserve("t", "a", 60).unwrap();
        assert!(matches!(
            s.reserve("t", "a", 50),
            Err(BudgetError::Tokens { .. })
        ));
        s.settle("t", "a", 40, 10);
        s.reserve("t", "a", 50).unwrap();
        assert_eq!(s.info("t", "a", false).unwrap().tokens_used, 70);
        // another tenant's "a" is another session, and cannot read this one
        s.reserve("u", "a", 100).unwrap();
        assert_eq!(s.info("u", "a", false).unwrap().tokens_used, 100);
        assert!(s.info("v", "a", false).is_none());
        assert!(!s.delete("v", "a", false));
        // an admin finds another tenant's session
        assert!(s.info("admin", "a", true).is_some());
    }

    #[test]
    fn time_budget_blocks_once_spent() {
        let s = store(None, 10);
        s.reserve("t", "a", 1).unwrap();
        s.settle("t", "a", 0, 1000);
        assert!(matches!(
            s.reserve("t", "a", 1),
            Err(BudgetError::Time { .. })
        ));
    }

    #[test]
    fn session_count_is_bounded() {
        let s = store(None, 2);
        for id in ["a", "b", "c", "d"] {
            s.reserve("t", id, 1).unwrap();
        }
        assert_eq!(s.lock().len(), 2);
    }
}
