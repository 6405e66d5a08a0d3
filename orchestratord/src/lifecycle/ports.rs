//! What the lifecycle asks of the parts above it. Remote workers (`remote_workers/`) and the
//! models folder (`models_folder/`) sit above the lifecycle — they add pools, load models and
//! run tasks through it — so the lifecycle names only these traits, never their types; the
//! composition root (`app_state.rs`) hands it the implementations when it builds the state;
//! one that needs the lifecycle back holds it weakly (the lifecycle holds the port).
//! The cluster's port is [`super::cluster_port`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use contracts::TaskRequest;
use futures::future::BoxFuture;
use pool_manager::{Pool, PoolRegistry};

use crate::error::ApiError;

/// What admission, placement and the dispatcher ask of remote workers.
pub trait WorkersPort: Send + Sync {
    /// Whether a remote worker serves (or served, and may connect again for) `model`: a task
    /// of it waits for one rather than failing for want of a pool.
    fn knows_model(&self, model: &str) -> bool;

    /// How long a task pinned to `pin`, or else of `model`, may wait for a worker's slot when
    /// only remote workers serve it (`None`: no limit of theirs applies).
    fn queue_timeout_for(
        &self,
        pools: &PoolRegistry,
        pin: Option<&str>,
        model: Option<&str>,
    ) -> Option<Duration>;
}

/// What admission asks of the models folder.
pub trait ModelsPort: Send + Sync {
    /// Makes sure a request for `model` has a pool to wait for: when no pool serves it and
    /// the folder has it, one starts loading. `Ok`: the predicted wait for that load, in ms
    /// (0: a pool serving it is ready, or the folder does not have it).
    fn ensure<'a>(&'a self, model: &'a str) -> BoxFuture<'a, Result<u64, ApiError>>;

    /// Gives `req` the recipe of the folder's model it names: the model's own name for a hub
    /// name it was pulled as, and the recipe's defaults where the request says nothing.
    fn apply_recipe<'a>(&'a self, req: &'a mut TaskRequest) -> BoxFuture<'a, ()>;

    /// What is left, in ms, of the predicted load of the pools of `serving` that are loading
    /// (0 when one is ready, or none loads; `started`: when the server started).
    fn load_wait_ms(&self, serving: &[Arc<Pool>], started: Instant) -> u64;
}
