//! Per-tenant quotas (ORCH-FAIR-5): requests and tokens per minute, tasks unfinished and
//! queued at once, and the highest priority a tenant may ask for. Limits come from
//! `[queue.tenants.<name>]` and the key file's options (`name=value` after a key).
//!
//! The per-minute quotas are sliding windows of the last 60 s. A request reserves its prompt
//! and `max_tokens` when admitted; when its task ends the reservation becomes the tokens it
//! was really served (prompt read and tokens generated; nothing if it never ran), so an answer
//! that stops early gives the rest back. A refusal's wait is the moment the window will have
//! room for this request as the window stands: when enough of the oldest entries leave it.
//!
//! This module owns the windows; admission asks it, the task's ending settles it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use contracts::Priority;

use crate::config::TenantConfig;

const WINDOW: Duration = Duration::from_secs(60);

/// Why a request is over its tenant's quota.
#[derive(Debug, Clone, PartialEq)]
pub enum OverQuota {
    /// Over a per-minute or at-once quota: it would pass after `retry_after_ms`.
    Wait { why: String, retry_after_ms: u64 },
    /// A request that can never pass (larger than the whole per-minute quota, or a priority
    /// the tenant may not use).
    Never { field: &'static str, why: String },
}

impl OverQuota {
    /// The answer: 429 with the wait after which it would pass, or 400 naming the field when
    /// it never could.
    pub fn into_api(self) -> crate::error::ApiError {
        use crate::error::ApiError;
        match self {
            OverQuota::Wait {
                why,
                retry_after_ms,
            } => ApiError::new(contracts::ErrorCode::AdmissionReject, why, true)
                .with_retry_after(retry_after_ms)
                .with_policy("quota"),
            OverQuota::Never { field, why } => ApiError::invalid(field, why),
        }
    }
}

/// A request's reservation in its tenant's token window, settled when its task ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(u64);

#[derive(Default)]
struct Window {
    requests: VecDeque<Instant>,
    /// (when, ticket, tokens)
    tokens: VecDeque<(Instant, u64, u64)>,
}

impl Window {
    fn forget_before(&mut self, since: Instant) {
        while self.requests.front().is_some_and(|t| *t <= since) {
            self.requests.pop_front();
        }
        while self.tokens.front().is_some_and(|t| t.0 <= since) {
            self.tokens.pop_front();
        }
    }
}

pub struct Quotas {
    limits: HashMap<String, TenantConfig>,
    windows: Mutex<(HashMap<String, Window>, u64)>,
}

/// What a tenant has in flight now, for the at-once quotas.
pub struct InFlight {
    /// Tasks admitted and not yet ended (queued or running).
    pub unfinished: usize,
    pub queued: usize,
}

impl Quotas {
    pub fn new(limits: HashMap<String, TenantConfig>) -> Self {
        Self {
            limits,
            windows: Mutex::new((HashMap::new(), 0)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, (HashMap<String, Window>, u64)> {
        self.windows.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn limits(&self, tenant: &str) -> Option<&TenantConfig> {
        self.limits.get(tenant)
    }

    /// The tenants configured (in `[queue.tenants]` or with key options), by name.
    pub fn configured(&self) -> impl Iterator<Item = &str> {
        let mut names: Vec<&str> = self.limits.keys().map(String::as_str).collect();
        names.sort_unstable();
        names.into_iter()
    }

    /// The class a request of `tenant` that names none gets: the highest it may submit.
    pub fn default_priority(&self, tenant: &str) -> contracts::Priority {
        self.limits
            .get(tenant)
            .and_then(|l| l.max_priority)
            .unwrap_or(contracts::Priority::Interactive)
    }

    /// Whether `tenant` may ever hold `n` tasks at once (the choices of one request, `n`,
    /// are admitted together): a 400 naming `n` when its `max_concurrent` is smaller.
    pub fn check_at_once(&self, tenant: &str, n: usize) -> Result<(), OverQuota> {
        match self.limits.get(tenant).and_then(|l| l.max_concurrent) {
            Some(max) if n > max => Err(OverQuota::Never {
                field: "n",
                why: format!(
                    "n = {n} asks for {n} tasks at once; tenant {tenant:?} may hold {max} (its max_concurrent)"
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Checks a request of `tenant` asking `priority` and `tokens` (prompt and `max_tokens`)
    /// with `in_flight` of its tasks, and `typical_wait_ms` (when a task of the tenant's is
    /// predicted to start or end, for the at-once quotas). Passing, the request is counted and
    /// its tokens reserved: the returned ticket settles them (`None`: no per-minute quota).
    pub fn admit(
        &self,
        tenant: &str,
        priority: Priority,
        tokens: u64,
        in_flight: impl FnOnce() -> InFlight,
        typical_wait_ms: u64,
        now: Instant,
    ) -> Result<Option<Ticket>, OverQuota> {
        let Some(l) = self.limits.get(tenant) else {
            return Ok(None);
        };
        if l.max_priority == Some(Priority::Batch) && priority == Priority::Interactive {
            return Err(OverQuota::Never {
                field: "priority",
                why: format!("tenant {tenant:?} may submit batch tasks only"),
            });
        }
        if let Some(tpm) = l.tokens_per_minute.filter(|t| tokens > *t) {
            return Err(OverQuota::Never {
                field: "max_tokens",
                why: format!(
                    "the prompt and max_tokens ({tokens} tokens) exceed tenant {tenant:?}'s quota of {tpm} tokens per minute"
                ),
            });
        }
        if l.max_concurrent.is_some() || l.max_queued.is_some() {
            let f = in_flight();
            if let Some(n) = l.max_concurrent.filter(|n| f.unfinished >= *n) {
                return Err(OverQuota::Wait {
                    why: format!("tenant {tenant:?} has {n} unfinished tasks, its quota"),
                    retry_after_ms: typical_wait_ms,
                });
            }
            if let Some(n) = l.max_queued.filter(|n| f.queued >= *n) {
                return Err(OverQuota::Wait {
                    why: format!("tenant {tenant:?} has {n} queued tasks, its quota"),
                    retry_after_ms: typical_wait_ms,
                });
            }
        }
        if l.requests_per_minute.is_none() && l.tokens_per_minute.is_none() {
            return Ok(None);
        }
        let mut g = self.lock();
        let (windows, next_ticket) = &mut *g;
        let w = windows.entry(tenant.to_string()).or_default();
        if let Some(since) = now.checked_sub(WINDOW) {
            w.forget_before(since);
        }
        let leaves = |at: Instant| (at + WINDOW).saturating_duration_since(now);
        let mut wait = Duration::ZERO;
        let mut why = Vec::new();
        if let Some(rpm) = l.requests_per_minute {
            let rpm = rpm as usize;
            if w.requests.len() >= rpm {
                // the oldest requests leave until one fewer than the quota remain
                let i = w.requests.len() - rpm;
                wait = wait.max(leaves(w.requests[i]));
                why.push(format!("{rpm} requests per minute"));
            }
        }
        if let Some(tpm) = l.tokens_per_minute {
            let used: u64 = w.tokens.iter().map(|t| t.2).sum();
            if used + tokens > tpm {
                let mut freed = 0;
                for (at, _, n) in &w.tokens {
                    freed += n;
                    if used - freed + tokens <= tpm {
                        wait = wait.max(leaves(*at));
                        break;
                    }
                }
                why.push(format!("{tpm} tokens per minute ({used} used)"));
            }
        }
        if !why.is_empty() {
            return Err(OverQuota::Wait {
                why: format!(
                    "tenant {tenant:?} is over its quota of {}",
                    why.join(" and ")
                ),
                // the window moves in whole milliseconds: round up so the retry passes
                retry_after_ms: (wait.as_micros() as u64).div_ceil(1000).max(1),
            });
        }
        w.requests.push_back(now);
        *next_ticket += 1;
        let ticket = *next_ticket;
        w.tokens.push_back((now, ticket, tokens));
        Ok(Some(Ticket(ticket)))
    }

    /// A request of `tenant` that brings work of its own before (or instead of) a task —
    /// `/tokenize`, a count of tokens —: refused when over its requests per minute, else
    /// counted in them (ISO-1).
    pub fn count_request(&self, tenant: &str, now: Instant) -> Result<(), OverQuota> {
        self.requests(tenant, now, true)
    }

    /// Whether a request of `tenant` would pass its requests per minute now (nothing counted:
    /// admission asks before it tokenizes, and counts the request when it is admitted or
    /// refused for the client's own mistake).
    pub fn check_requests(&self, tenant: &str, now: Instant) -> Result<(), OverQuota> {
        self.requests(tenant, now, false)
    }

    /// A request refused for the client's own mistake after its prompt was tokenized (a
    /// prompt larger than the context…): the work it cost counts in its requests per minute.
    pub fn charge_refused(&self, tenant: &str, now: Instant) {
        if self
            .limits
            .get(tenant)
            .is_some_and(|l| l.requests_per_minute.is_some())
        {
            let mut g = self.lock();
            g.0.entry(tenant.to_string())
                .or_default()
                .requests
                .push_back(now);
        }
    }

    fn requests(&self, tenant: &str, now: Instant, count: bool) -> Result<(), OverQuota> {
        let Some(rpm) = self.limits.get(tenant).and_then(|l| l.requests_per_minute) else {
            return Ok(());
        };
        let mut g = self.lock();
        let w = g.0.entry(tenant.to_string()).or_default();
        if let Some(since) = now.checked_sub(WINDOW) {
            w.forget_before(since);
        }
        let rpm = rpm as usize;
        if w.requests.len() >= rpm {
            let first_to_leave = w.requests[w.requests.len() - rpm];
            let wait = (first_to_leave + WINDOW).saturating_duration_since(now);
            return Err(OverQuota::Wait {
                why: format!("tenant {tenant:?} is over its quota of {rpm} requests per minute"),
                retry_after_ms: (wait.as_micros() as u64).div_ceil(1000).max(1),
            });
        }
        if count {
            w.requests.push_back(now);
        }
        Ok(())
    }

    /// The task of `ticket` ended having been served `tokens`: its reservation becomes that.
    pub fn settle(&self, tenant: &str, ticket: Ticket, tokens: u64) {
        let mut g = self.lock();
        if let Some(t) =
            g.0.get_mut(tenant)
                .and_then(|w| w.tokens.iter_mut().find(|t| t.1 == ticket.0))
        {
            t.2 = tokens;
        }
    }

    /// A request that passed but was not admitted after all (refused later): it counts for
    /// nothing.
    pub fn release(&self, tenant: &str, ticket: Ticket) {
        let mut g = self.lock();
        if let Some(w) = g.0.get_mut(tenant) {
            if let Some(i) = w.tokens.iter().position(|t| t.1 == ticket.0) {
                let (at, _, _) = w.tokens.remove(i).unwrap_or((Instant::now(), 0, 0));
                if let Some(j) = w.requests.iter().rposition(|r| *r == at) {
                    w.requests.remove(j);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quotas(l: TenantConfig) -> Quotas {
        Quotas::new([("t".to_string(), l)].into())
    }

    fn none() -> InFlight {
        InFlight {
            unfinished: 0,
            queued: 0,
        }
    }

    /// ORCH-FAIR-5: the n+1-th request in a minute waits exactly until the first leaves the
    /// window; a released request does not count.
    #[test]
    fn requests_per_minute_say_exactly_when_the_next_passes() {
        let q = quotas(TenantConfig {
            requests_per_minute: Some(2),
            ..Default::default()
        });
        let t0 = Instant::now();
        let admit = |at: Instant| q.admit("t", Priority::Interactive, 10, none, 0, at);
        assert!(admit(t0).is_ok());
        let second = admit(t0 + Duration::from_secs(10)).unwrap().unwrap();
        q.release("t", second);
        assert!(admit(t0 + Duration::from_secs(15)).is_ok());
        match admit(t0 + Duration::from_secs(20)) {
            Err(OverQuota::Wait { retry_after_ms, .. }) => assert_eq!(retry_after_ms, 40_000),
            other => panic!("{other:?}"),
        }
        assert!(admit(t0 + Duration::from_secs(60) + Duration::from_millis(1)).is_ok());
        // other tenants have no quota
        assert_eq!(
            q.admit("u", Priority::Interactive, 1, none, 0, t0),
            Ok(None)
        );
    }

    /// ISO-1: requests that bring work before a task (`/tokenize`) and requests refused for the
    /// client's mistake after their prompt was tokenized count in the requests per minute;
    /// a check counts nothing.
    #[test]
    fn work_before_admission_counts_in_requests_per_minute() {
        let q = quotas(TenantConfig {
            requests_per_minute: Some(3),
            ..Default::default()
        });
        let t0 = Instant::now();
        q.count_request("t", t0).unwrap();
        q.check_requests("t", t0).unwrap();
        q.charge_refused("t", t0 + Duration::from_secs(1));
        q.admit(
            "t",
            Priority::Interactive,
            1,
            none,
            0,
            t0 + Duration::from_secs(2),
        )
        .unwrap();
        match q.check_requests("t", t0 + Duration::from_secs(3)) {
            Err(OverQuota::Wait { retry_after_ms, .. }) => assert_eq!(retry_after_ms, 57_000),
            other => panic!("{other:?}"),
        }
        assert!(q.count_request("t", t0 + Duration::from_secs(4)).is_err());
        assert!(q.count_request("t", t0 + Duration::from_secs(61)).is_ok());
        // no quota: nothing counted, nothing refused
        for _ in 0..10 {
            q.count_request("u", t0).unwrap();
        }
    }

    /// ORCH-FAIR-5: tokens per minute count reservations, settled to what was served; the
    /// wait is when enough of the oldest leave; a request larger than the quota never passes.
    #[test]
    fn tokens_per_minute_settle_to_what_was_served() {
        let q = quotas(TenantConfig {
            tokens_per_minute: Some(100),
            ..Default::default()
        });
        let t0 = Instant::now();
        let admit = |n: u64, at: Instant| q.admit("t", Priority::Interactive, n, none, 0, at);
        let a = admit(60, t0).unwrap().unwrap();
        let _b = admit(30, t0 + Duration::from_secs(5)).unwrap();
        match admit(50, t0 + Duration::from_secs(6)) {
            Err(OverQuota::Wait { retry_after_ms, .. }) => assert_eq!(retry_after_ms, 54_000),
            other => panic!("{other:?}"),
        }
        // the first answer stopped after 15 tokens served: 45 free again
        q.settle("t", a, 15);
        assert!(admit(50, t0 + Duration::from_secs(7)).is_ok());
        assert!(matches!(
            admit(101, t0),
            Err(OverQuota::Never {
                field: "max_tokens",
                ..
            })
        ));
    }

    /// ORCH-FAIR-5: at-once quotas and the highest priority.
    #[test]
    fn unfinished_queued_and_priority_quotas() {
        let q = quotas(TenantConfig {
            max_concurrent: Some(3),
            max_queued: Some(1),
            max_priority: Some(Priority::Batch),
            ..Default::default()
        });
        let now = Instant::now();
        let with = |unfinished, queued| {
            q.admit(
                "t",
                Priority::Batch,
                1,
                || InFlight { unfinished, queued },
                700,
                now,
            )
        };
        assert_eq!(with(2, 0), Ok(None));
        assert!(matches!(
            with(3, 0),
            Err(OverQuota::Wait {
                retry_after_ms: 700,
                ..
            })
        ));
        assert!(matches!(with(2, 1), Err(OverQuota::Wait { .. })));
        assert!(matches!(
            q.admit("t", Priority::Interactive, 1, none, 0, now),
            Err(OverQuota::Never {
                field: "priority",
                ..
            })
        ));
    }
}
