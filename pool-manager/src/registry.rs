//! All pools of the server, by id.

use std::sync::Arc;

use tokio::sync::Notify;

use crate::pool::{Pool, PoolSpec};
use crate::port::{Engine, EngineFactory, PortError};

/// The factory of pools whose engine runs elsewhere: there is nothing to load here.
pub(crate) struct NothingToLoad;

impl EngineFactory for NothingToLoad {
    fn load(&self, spec: &PoolSpec, _: &str) -> Result<Arc<dyn Engine>, PortError> {
        Err(PortError::Load(format!(
            "pool {} is served by a remote worker; load models on the worker",
            spec.id
        )))
    }
}

/// The pools, in id order (placement breaks ties by id).
pub struct PoolRegistry {
    pools: std::sync::RwLock<Vec<Arc<Pool>>>,
    factory: Arc<dyn EngineFactory>,
    wake: Arc<Notify>,
}

impl PoolRegistry {
    /// Creates pools in `Loading`; `wake` is notified on every slot release or state change.
    pub fn new(specs: Vec<PoolSpec>, factory: Arc<dyn EngineFactory>, wake: Arc<Notify>) -> Self {
        let mut pools: Vec<Arc<Pool>> = specs
            .into_iter()
            .map(|s| Pool::new(s, factory.clone(), wake.clone()))
            .collect();
        pools.sort_by(|a, b| a.id().cmp(b.id()));
        Self {
            pools: std::sync::RwLock::new(pools),
            factory,
            wake,
        }
    }

    /// Starts loading every pool; returns when all have finished their first attempt.
    pub async fn load_all(&self) {
        let pools = self.all();
        let mut first = Vec::new();
        for p in pools {
            let (tx, rx) = tokio::sync::oneshot::channel::<()>();
            let pool = p.clone();
            tokio::spawn(async move {
                let watcher = pool.clone();
                let load = tokio::spawn(pool.load());
                // report after the first attempt, keep retrying in the background
                while watcher.state() == crate::PoolState::Loading {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                let _ = tx.send(());
                let _ = load.await;
            });
            first.push(rx);
        }
        for rx in first {
            let _ = rx.await;
        }
    }

    pub fn all(&self) -> Vec<Arc<Pool>> {
        self.pools.read().map(|g| g.clone()).unwrap_or_default()
    }

    pub fn get(&self, id: &str) -> Option<Arc<Pool>> {
        self.all().into_iter().find(|p| p.id() == id)
    }

    /// Adds a pool (e.g. a Kolosal `POST /engines`); false if the id exists.
    pub fn insert(&self, spec: PoolSpec) -> Option<Arc<Pool>> {
        let mut g = self.pools.write().ok()?;
        if g.iter().any(|p| p.id() == spec.id) {
            return None;
        }
        let pool = Pool::new(spec, self.factory.clone(), self.wake.clone());
        g.push(pool.clone());
        g.sort_by(|a, b| a.id().cmp(b.id()));
        Some(pool)
    }

    /// Adds a pool that is Ready with an engine loaded elsewhere (a remote worker's model);
    /// `None` if the id exists.
    pub fn insert_ready(&self, spec: PoolSpec, engine: Arc<dyn Engine>) -> Option<Arc<Pool>> {
        let mut g = self.pools.write().ok()?;
        if g.iter().any(|p| p.id() == spec.id) {
            return None;
        }
        let pool = Pool::with_engine(spec, engine, Arc::new(NothingToLoad), self.wake.clone());
        g.push(pool.clone());
        g.sort_by(|a, b| a.id().cmp(b.id()));
        drop(g);
        self.wake.notify_one();
        Some(pool)
    }

    pub fn remove(&self, id: &str) -> Option<Arc<Pool>> {
        let mut g = self.pools.write().ok()?;
        let i = g.iter().position(|p| p.id() == id)?;
        Some(g.remove(i))
    }

    pub fn wake(&self) -> &Arc<Notify> {
        &self.wake
    }
}
