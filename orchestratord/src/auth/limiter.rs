//! Secrets compared in constant time (both sides hashed first, so neither content nor length
//! leaks through timing), and failed attempts limited per peer address. Used for API keys and
//! the worker secret.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Peer addresses whose failures are remembered at once; the stalest go first.
const MAX_TRACKED_PEERS: usize = 4096;
const WINDOW: Duration = Duration::from_secs(60);

/// Whether `offered` equals `secret`, in time independent of both.
pub fn secret_matches(secret: &str, offered: &str) -> bool {
    let a = Sha256::digest(secret.as_bytes());
    let b = Sha256::digest(offered.as_bytes());
    a.ct_eq(&b).into()
}

/// Failed secret checks per peer address over a one-minute window.
pub struct FailureLimiter {
    per_minute: u32,
    peers: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl FailureLimiter {
    pub fn new(per_minute: u32) -> Self {
        Self {
            per_minute,
            peers: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, (Instant, u32)>> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether `peer` has used up its failures for this window (it is answered 429 unchecked).
    pub fn is_limited(&self, peer: IpAddr) -> bool {
        self.limited_for(peer).is_some()
    }

    /// How long `peer` stays limited, when it is.
    pub fn limited_for(&self, peer: IpAddr) -> Option<Duration> {
        self.lock()
            .get(&peer)
            .filter(|(since, n)| since.elapsed() < WINDOW && *n >= self.per_minute)
            .map(|(since, _)| WINDOW.saturating_sub(since.elapsed()))
    }

    pub fn record_failure(&self, peer: IpAddr) {
        let mut g = self.lock();
        if g.len() >= MAX_TRACKED_PEERS && !g.contains_key(&peer) {
            g.retain(|_, (since, _)| since.elapsed() < WINDOW);
            if g.len() >= MAX_TRACKED_PEERS {
                if let Some(oldest) = g.iter().min_by_key(|(_, (s, _))| *s).map(|(k, _)| *k) {
                    g.remove(&oldest);
                }
            }
        }
        let e = g.entry(peer).or_insert((Instant::now(), 0));
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

    /// WRK-AUTH-2: a peer is limited after its failures for the window; others are not.
    #[test]
    fn failures_are_limited_per_peer() {
        let l = FailureLimiter::new(3);
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        for _ in 0..3 {
            assert!(!l.is_limited(a));
            l.record_failure(a);
        }
        assert!(l.is_limited(a));
        assert!(!l.is_limited(b));
    }
}
