//! All pools of the server, by id, and the one place a pool is built.

use std::sync::Arc;

use tokio::sync::Notify;

use crate::pool::Pool;
use crate::port::{Engine, EngineFactory, PortError};
use crate::spec::{EngineConfig, PoolSpec};

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

/// Why a pool was not added.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddError {
    #[error("a pool with id {0:?} exists")]
    IdTaken(String),
}

/// The pools, in id order (placement breaks ties by id).
pub struct PoolRegistry {
    pools: std::sync::RwLock<Vec<Arc<Pool>>>,
    factory: Arc<dyn EngineFactory>,
    wake: Arc<Notify>,
}

impl PoolRegistry {
    /// An empty registry whose local pools `factory` loads; `wake` is notified on every slot
    /// release or state change.
    pub fn new(factory: Arc<dyn EngineFactory>, wake: Arc<Notify>) -> Self {
        Self {
            pools: std::sync::RwLock::new(Vec::new()),
            factory,
            wake,
        }
    }

    /// Builds the pool `spec` describes and adds it: a local pool in `Loading` (call
    /// [`Pool::load`] or [`Pool::load_once`]; [`PoolRegistry::load_all`] loads every one), a
    /// remote pool `Ready` with its worker's engine. The one way pools are made.
    /// The context per sequence a local pool of `spec` would serve once loaded, when its
    /// model's file tells (blocking: a header read).
    pub fn served_context(&self, spec: &PoolSpec) -> Option<usize> {
        self.factory.served_context(spec, &spec.model_ref)
    }

    pub fn add(&self, spec: PoolSpec) -> Result<Arc<Pool>, AddError> {
        let mut g = self.pools.write().unwrap_or_else(|p| p.into_inner());
        if g.iter().any(|p| p.id() == spec.id) {
            return Err(AddError::IdTaken(spec.id));
        }
        let pool = match &spec.engine {
            EngineConfig::Local(_) => Pool::new(spec, self.factory.clone(), self.wake.clone()),
            EngineConfig::Remote { engine, .. } => {
                let engine = engine.clone();
                Pool::with_engine(spec, engine, Arc::new(NothingToLoad), self.wake.clone())
            }
        };
        g.push(pool.clone());
        g.sort_by(|a, b| a.id().cmp(b.id()));
        drop(g);
        self.wake.notify_one();
        Ok(pool)
    }

    /// Starts loading every pool; returns when all have finished their first attempt.
    pub async fn load_all(&self) {
        let pools = self.all();
        let mut first = Vec::new();
        for p in pools.into_iter().filter(|p| p.spec().is_local()) {
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

    pub fn remove(&self, id: &str) -> Option<Arc<Pool>> {
        let mut g = self.pools.write().ok()?;
        let i = g.iter().position(|p| p.id() == id)?;
        Some(g.remove(i))
    }

    pub fn wake(&self) -> &Arc<Notify> {
        &self.wake
    }
}
