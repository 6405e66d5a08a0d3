//! The host's connections, for its limits: at most `max_clients` at once, and when full a
//! newcomer takes the place of the connection idle the longest (no request running, idle for
//! at least a second) rather than being refused; at most one connection per remote public key at a time (the
//! sidecar's `_peer` line says whose it is).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

struct Entry {
    id: u64,
    key: Option<String>,
    running: usize,
    last_activity: Instant,
    /// Fired to evict this connection for a newcomer.
    evict: CancellationToken,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    entries: Vec<Entry>,
}

/// Every live connection of the host.
pub struct Peers {
    max: usize,
    /// A connection idle for less than this is not evicted (a burst of newcomers does not
    /// push out a peer that has just connected and is about to ask).
    min_idle: Duration,
    inner: Mutex<Inner>,
}

/// A connection's place; dropping it frees the place.
pub struct PeerHandle {
    peers: Arc<Peers>,
    id: u64,
    evict: CancellationToken,
}

/// A key that already has a connection.
#[derive(Debug)]
pub struct AlreadyConnected;

impl Peers {
    pub fn new(max: usize, min_idle: Duration) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            min_idle,
            inner: Mutex::new(Inner::default()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for a new connection: free, or taken from the connection idle the longest
    /// (which is told to leave); `None` when every connection has a request running.
    pub fn admit(self: &Arc<Self>) -> Option<PeerHandle> {
        let mut g = self.lock();
        if g.entries.len() >= self.max {
            let idle = g
                .entries
                .iter()
                .filter(|e| {
                    e.running == 0
                        && !e.evict.is_cancelled()
                        && e.last_activity.elapsed() >= self.min_idle
                })
                .min_by_key(|e| e.last_activity)?;
            idle.evict.cancel();
            let gone = idle.id;
            // its place is ours now; its handle's drop finds nothing to remove
            g.entries.retain(|e| e.id != gone);
        }
        g.next_id += 1;
        let id = g.next_id;
        let evict = CancellationToken::new();
        g.entries.push(Entry {
            id,
            key: None,
            running: 0,
            last_activity: Instant::now(),
            evict: evict.clone(),
        });
        Some(PeerHandle {
            peers: self.clone(),
            id,
            evict,
        })
    }
}

impl PeerHandle {
    fn with<R>(&self, f: impl FnOnce(&mut Entry) -> R) -> Option<R> {
        let mut g = self.peers.lock();
        g.entries.iter_mut().find(|e| e.id == self.id).map(f)
    }

    /// Records whose connection this is; refused while another connection has that key.
    pub fn set_key(&self, key: &str) -> Result<(), AlreadyConnected> {
        let mut g = self.peers.lock();
        if g.entries
            .iter()
            .any(|e| e.id != self.id && e.key.as_deref() == Some(key))
        {
            return Err(AlreadyConnected);
        }
        if let Some(e) = g.entries.iter_mut().find(|e| e.id == self.id) {
            e.key = Some(key.to_string());
        }
        Ok(())
    }

    /// Records activity and how many requests run now (idle connections are evicted first).
    pub fn update(&self, running: usize) {
        self.with(|e| {
            e.running = running;
            e.last_activity = Instant::now();
        });
    }

    /// Resolves when a newcomer took this connection's place.
    pub async fn evicted(&self) {
        self.evict.cancelled().await
    }
}

impl Drop for PeerHandle {
    fn drop(&mut self) {
        let id = self.id;
        self.peers.lock().entries.retain(|e| e.id != id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SEC-HS-1: full means the idlest connection makes room; busy ones are never evicted;
    /// one connection per key.
    #[test]
    fn idle_connections_make_room_and_keys_are_unique() {
        let peers = Peers::new(2, Duration::ZERO);
        let a = peers.admit().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let b = peers.admit().unwrap();
        a.set_key("k1").unwrap();
        assert!(b.set_key("k1").is_err(), "one connection per key");
        b.update(1);
        // full: a (idle) makes room
        let c = peers.admit().unwrap();
        assert!(a.evict.is_cancelled());
        assert!(!b.evict.is_cancelled());
        assert_eq!(peers.lock().entries.len(), 2);
        drop(a);
        assert_eq!(
            peers.lock().entries.len(),
            2,
            "the evicted handle's drop frees nothing twice"
        );
        // both busy: refused
        c.update(1);
        assert!(peers.admit().is_none());
        // a connection idle for less than the minimum is not evicted
        let young = Peers::new(1, Duration::from_secs(60));
        let _first = young.admit().unwrap();
        assert!(young.admit().is_none());
        // k1 is free again once its connection left
        c.set_key("k1").unwrap();
        drop(b);
        assert_eq!(peers.lock().entries.len(), 1);
    }
}
