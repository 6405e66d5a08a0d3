//! The state the routes share: the lifecycle's ([`Lifecycle`]) and, beside it, the parts above
//! the lifecycle — remote workers, the models folder, the cluster link, keys, the console's
//! history. The composition root: `server.rs` builds it, and only it names every part. The
//! lifecycle reaches the parts above it through its ports, which this module implements
//! (`FolderPort`; the worker registry is its own); the routes and adapters read the
//! lifecycle's fields through `Deref`.

use std::ops::Deref;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use contracts::{ErrorCode, TaskRequest};
use futures::future::BoxFuture;
use pool_manager::{Pool, PoolRegistry};

use crate::config::Config;
use crate::error::ApiError;
use crate::lifecycle::ports::{ModelsPort, WorkersPort};
use crate::lifecycle::state::{Lifecycle, SharedLifecycle};
use crate::models_folder::ModelsFolder;
use crate::remote_workers::WorkerRegistry;

pub struct AppState {
    /// The pools, the queue, the tasks: what every step of a task reads and changes.
    pub lifecycle: SharedLifecycle,
    /// What the Hyperswarm host reports to `/v1/capabilities`, set by the host once it runs.
    pub hyperswarm: OnceLock<CapabilityReport<contracts::HyperswarmCapability>>,
    /// Connected remote workers.
    pub workers: Arc<WorkerRegistry>,
    /// API keys and the failed-attempt limiter.
    pub auth: Arc<crate::auth::Auth>,
    /// Where models may be loaded from (`POST /engines`, reloads).
    pub model_dirs: crate::model_paths::ModelDirs,
    /// The model folder: its models listed, loaded on demand, unloaded when idle.
    pub models_folder: Arc<ModelsFolder>,
    /// SHA-256 of model files, remembered per file version (Ollama's `digest`).
    pub model_digests: crate::model_digest::ModelDigests,
    /// This replica's link to its cluster (`cluster.nats_urls`), set once connected at start.
    pub cluster: OnceLock<Arc<crate::cluster::Cluster>>,
    /// The console's last minutes (throughput, time to first token).
    pub console_history: Arc<crate::console_history::History>,
}

pub type SharedState = Arc<AppState>;

/// How a background adapter reports its live status without core state knowing its types.
pub type CapabilityReport<T> = Box<dyn Fn() -> T + Send + Sync>;

/// The parts above the lifecycle that [`AppState::new`] takes, built by `server.rs`.
pub struct Parts {
    pub workers: Arc<WorkerRegistry>,
    pub auth: Arc<crate::auth::Auth>,
    pub model_dirs: crate::model_paths::ModelDirs,
    pub models_folder: Arc<ModelsFolder>,
}

impl AppState {
    /// The state, its lifecycle built by `lifecycle` with the ports to the parts above it.
    pub fn new(
        parts: Parts,
        lifecycle: impl FnOnce(Arc<dyn WorkersPort>, Arc<dyn ModelsPort>) -> Lifecycle,
    ) -> SharedState {
        let workers: Arc<dyn WorkersPort> = parts.workers.clone();
        let folder = parts.models_folder.clone();
        let core = Arc::new_cyclic(|me: &Weak<Lifecycle>| {
            let models: Arc<dyn ModelsPort> = Arc::new(FolderPort {
                folder,
                lifecycle: me.clone(),
            });
            lifecycle(workers, models)
        });
        Arc::new(AppState {
            lifecycle: core,
            hyperswarm: OnceLock::new(),
            workers: parts.workers,
            auth: parts.auth,
            model_dirs: parts.model_dirs,
            models_folder: parts.models_folder,
            model_digests: Default::default(),
            cluster: OnceLock::new(),
            console_history: Default::default(),
        })
    }
}

impl Deref for AppState {
    type Target = Lifecycle;

    fn deref(&self) -> &Lifecycle {
        &self.lifecycle
    }
}

impl WorkersPort for WorkerRegistry {
    fn knows_model(&self, model: &str) -> bool {
        WorkerRegistry::knows_model(self, model)
    }

    fn queue_timeout_for(
        &self,
        pools: &PoolRegistry,
        pin: Option<&str>,
        model: Option<&str>,
    ) -> Option<Duration> {
        WorkerRegistry::queue_timeout_for(self, pools, pin, model)
    }
}

/// The models folder's port: the folder, and the lifecycle it loads models into, held weakly
/// (the lifecycle holds this port).
struct FolderPort {
    folder: Arc<ModelsFolder>,
    lifecycle: Weak<Lifecycle>,
}

impl FolderPort {
    fn lifecycle(&self) -> Result<SharedLifecycle, ApiError> {
        self.lifecycle.upgrade().ok_or_else(|| {
            ApiError::new(ErrorCode::ShuttingDown, "the server is shutting down", true)
        })
    }
}

impl ModelsPort for FolderPort {
    fn ensure<'a>(&'a self, model: &'a str) -> BoxFuture<'a, Result<u64, ApiError>> {
        Box::pin(async move { self.folder.ensure(&self.lifecycle()?, model).await })
    }

    fn apply_recipe<'a>(&'a self, req: &'a mut TaskRequest) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Ok(lifecycle) = self.lifecycle() {
                self.folder.apply_recipe(&lifecycle, req).await;
            }
        })
    }

    fn load_wait_ms(&self, serving: &[Arc<Pool>], started: Instant) -> u64 {
        self.folder.load_wait_ms(serving, started)
    }
}

/// Remote workers reach the server through this (given to each when it connects).
impl crate::remote_workers::WorkerHost for AppState {
    fn config(&self) -> &Config {
        &self.cfg
    }

    fn pools(&self) -> &PoolRegistry {
        &self.pools
    }

    fn workers(&self) -> &WorkerRegistry {
        &self.workers
    }

    fn wake(&self) {
        self.wake.notify_one();
    }

    fn shutdown(&self) -> &tokio_util::sync::CancellationToken {
        &self.shutdown
    }

    fn is_shutting_down(&self) -> bool {
        Lifecycle::is_shutting_down(self)
    }
}
