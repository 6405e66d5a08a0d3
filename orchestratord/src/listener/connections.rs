//! The open connections of the accept loop, and which one gives its place up when the cap is
//! reached: a connection with no request in flight, one that has sent nothing since it became
//! idle first, the longest idle first. A connection busy with a request is never picked.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Every open connection, counted in one place.
pub struct Connections {
    epoch: Instant,
    max: usize,
    table: Mutex<HashMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
    /// A connection closed or became idle: the accept loop may find room now.
    changed: Notify,
}

/// One open connection as the table sees it.
pub struct Conn {
    id: u64,
    /// Requests whose response has not ended (HTTP/1.1: 0 or 1).
    in_flight: AtomicU32,
    /// Milliseconds after the table's epoch at which the last request ended (or the
    /// connection was accepted); meaningless while a request is in flight.
    idle_since_ms: AtomicU64,
    /// A byte arrived since the connection became idle (a request head on its way).
    heard: AtomicBool,
    /// Cancelled when the connection must give its place up.
    evict: CancellationToken,
}

impl Connections {
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            epoch: Instant::now(),
            max: max.max(1),
            table: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            changed: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        // a poisoned lock only means a panic elsewhere; the table is still consistent
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub fn open(&self) -> usize {
        self.lock().len()
    }

    /// Waits until a connection may be accepted: the table is below the cap, or some open
    /// connection has no request in flight (it will give its place up).
    pub async fn room(&self) {
        loop {
            let changed = self.changed.notified();
            {
                let table = self.lock();
                if table.len() < self.max || table.values().any(|c| c.is_idle()) {
                    return;
                }
            }
            changed.await;
        }
    }

    /// Registers a connection just accepted. At the cap, the idle connection that has waited
    /// longest without a word is asked to close and the newcomer takes its place; with every
    /// connection busy, this waits until one ends or goes idle.
    pub async fn admit(self: &Arc<Self>) -> ConnGuard {
        loop {
            let changed = self.changed.notified();
            if let Some(guard) = self.try_admit() {
                return guard;
            }
            changed.await;
        }
    }

    fn try_admit(self: &Arc<Self>) -> Option<ConnGuard> {
        let mut table = self.lock();
        // connections already asked to leave still count until they are gone
        let leaving = table.values().filter(|c| c.evict.is_cancelled()).count();
        if table.len() - leaving >= self.max {
            let victim = table
                .values()
                .filter(|c| c.is_idle() && !c.evict.is_cancelled())
                .min_by_key(|c| (c.heard.load(Ordering::Relaxed), c.idle_since()))?;
            victim.evict.cancel();
            crate::metrics::connection_evicted();
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            id,
            in_flight: AtomicU32::new(0),
            idle_since_ms: AtomicU64::new(self.now_ms()),
            heard: AtomicBool::new(false),
            evict: CancellationToken::new(),
        });
        table.insert(id, conn.clone());
        crate::metrics::connections_open(table.len());
        Some(ConnGuard {
            table: self.clone(),
            conn,
        })
    }
}

impl Conn {
    fn is_idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
    }

    fn idle_since(&self) -> u64 {
        self.idle_since_ms.load(Ordering::Relaxed)
    }

    /// Bytes arrived on the connection.
    pub fn heard(&self) {
        if !self.heard.load(Ordering::Relaxed) {
            self.heard.store(true, Ordering::Relaxed);
        }
    }

    /// Whether the connection was asked to give its place up.
    pub fn evicted(&self) -> &CancellationToken {
        &self.evict
    }

    pub fn is_busy(&self) -> bool {
        !self.is_idle()
    }
}

/// A connection's place in the table; dropping it frees the place.
pub struct ConnGuard {
    table: Arc<Connections>,
    conn: Arc<Conn>,
}

impl ConnGuard {
    pub fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }

    /// A request arrived: the connection is busy until the returned guard (moved into the
    /// response body) is dropped.
    pub fn request(&self) -> InFlight {
        self.conn.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight {
            table: self.table.clone(),
            conn: self.conn.clone(),
        }
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        let mut table = self.table.lock();
        table.remove(&self.conn.id);
        crate::metrics::connections_open(table.len());
        drop(table);
        self.table.changed.notify_one();
    }
}

/// A request in flight on a connection; its response body holds it to the end.
pub struct InFlight {
    table: Arc<Connections>,
    conn: Arc<Conn>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let conn = &self.conn;
        conn.idle_since_ms
            .store(self.table.now_ms(), Ordering::Relaxed);
        conn.heard.store(false, Ordering::Relaxed);
        if conn.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.table.changed.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SEC-CONN-2: at the cap, the idle connection that said nothing longest gives its place
    /// up; a connection with a request in flight never does.
    #[test]
    fn the_cap_evicts_the_longest_silent_idle_connection() {
        let t = Connections::new(3);
        let busy = t.try_admit().unwrap();
        let _req = busy.request();
        let talked = t.try_admit().unwrap();
        talked.conn().heard();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let silent = t.try_admit().unwrap();
        assert_eq!(t.open(), 3);
        let new = t.try_admit().unwrap();
        assert!(silent.conn().evicted().is_cancelled(), "silent one evicted");
        assert!(!talked.conn().evicted().is_cancelled());
        assert!(!busy.conn().evicted().is_cancelled());
        drop(silent);
        // the newcomer is silent too: it goes before the one whose request head is coming
        let newer = t.try_admit().unwrap();
        assert!(new.conn().evicted().is_cancelled());
        assert!(!talked.conn().evicted().is_cancelled());
        drop(new);
        let _newest = t.try_admit().unwrap();
        assert!(newer.conn().evicted().is_cancelled());
        assert!(!busy.conn().evicted().is_cancelled());
    }

    /// SEC-CONN-2: with every connection busy there is no room until one ends its request.
    #[tokio::test]
    async fn no_room_while_every_connection_is_busy() {
        let t = Connections::new(1);
        let c = t.try_admit().unwrap();
        let req = c.request();
        assert!(
            t.try_admit().is_none(),
            "a place while the only connection is busy"
        );
        let waited = tokio::time::timeout(std::time::Duration::from_millis(50), t.room()).await;
        assert!(waited.is_err(), "room while the only connection is busy");
        drop(req);
        let waited = tokio::time::timeout(std::time::Duration::from_millis(500), t.room()).await;
        assert!(waited.is_ok(), "an idle connection makes room");
    }
}
