//! Secrets compared in constant time (both sides hashed first, so neither content nor length
//! leaks through timing), and failed attempts limited per client and credential tried. Used
//! for API keys and the worker secret.
//!
//! A failure is counted under the client's address (behind `http.trusted_proxies`, the one
//! the proxy forwarded: `client_addr.rs`) and a fingerprint of the credential it tried, so a
//! client repeating a wrong key is told to back off (429), while a valid credential is never
//! refused for anyone's failures — not even from the same address, where every client behind
//! a proxy or NAT sits. Keys are at least 16 characters of secret: the limit bounds the noise
//! a misconfigured or guessing client makes, not the odds of a guess.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Attempts whose failures are remembered at once; the stalest go first.
const MAX_TRACKED: usize = 4096;
const WINDOW: Duration = Duration::from_secs(60);

/// Whether `offered` equals `secret`, in time independent of both.
pub fn secret_matches(secret: &str, offered: &str) -> bool {
    let a = Sha256::digest(secret.as_bytes());
    let b = Sha256::digest(offered.as_bytes());
    a.ct_eq(&b).into()
}

/// What a failed attempt is counted under: who tried, and what (a fingerprint of the
/// credential, never the credential itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Attempt {
    client: IpAddr,
    tried: [u8; 8],
}

impl Attempt {
    pub fn new(client: IpAddr, tried: &str) -> Self {
        let d = Sha256::digest(tried.as_bytes());
        let mut tried = [0u8; 8];
        tried.copy_from_slice(&d[..8]);
        Self { client, tried }
    }
}

/// Failed secret checks per attempt over a one-minute window.
pub struct FailureLimiter {
    per_minute: u32,
    seen: Mutex<HashMap<Attempt, (Instant, u32)>>,
}

impl FailureLimiter {
    pub fn new(per_minute: u32) -> Self {
        Self {
            per_minute,
            seen: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Attempt, (Instant, u32)>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long `attempt` stays limited, when it has used up its failures for this window (it
    /// is answered 429 unchecked). A credential that ever verified has no failures.
    pub fn limited_for(&self, attempt: &Attempt) -> Option<Duration> {
        self.lock()
            .get(attempt)
            .filter(|(since, n)| since.elapsed() < WINDOW && *n >= self.per_minute)
            .map(|(since, _)| WINDOW.saturating_sub(since.elapsed()))
    }

    pub fn record_failure(&self, attempt: Attempt) {
        let mut g = self.lock();
        if g.len() >= MAX_TRACKED && !g.contains_key(&attempt) {
            g.retain(|_, (since, _)| since.elapsed() < WINDOW);
            if g.len() >= MAX_TRACKED {
                if let Some(oldest) = g.iter().min_by_key(|(_, (s, _))| *s).map(|(k, _)| *k) {
                    g.remove(&oldest);
                }
            }
        }
        let e = g.entry(attempt).or_insert((Instant::now(), 0));
        if e.0.elapsed() >= WINDOW {
            *e = (Instant::now(), 0);
        }
        e.1 += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// WRK-AUTH-1: only the exact secret matches.
    #[test]
    fn secret_comparison() {
        assert!(secret_matches("s3cret", "s3cret"));
        assert!(!secret_matches("s3cret", "s3cre"));
        assert!(!secret_matches("s3cret", "s3cret "));
        assert!(!secret_matches("s3cret", ""));
    }

    /// WRK-AUTH-2, SEC-AUTH-3: an attempt is limited after its failures for the window; the
    /// same client trying another credential, and other clients, are not.
    #[test]
    fn failures_are_limited_per_client_and_credential() {
        let l = FailureLimiter::new(3);
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let wrong = Attempt::new(a, "wrong");
        for _ in 0..3 {
            assert!(l.limited_for(&wrong).is_none());
            l.record_failure(wrong);
        }
        assert!(l.limited_for(&wrong).is_some());
        assert!(l.limited_for(&Attempt::new(a, "right")).is_none());
        assert!(l.limited_for(&Attempt::new(b, "wrong")).is_none());
    }
}
