//! What remote workers need of the server, given to them when a worker connects (the server's
//! state implements it): its config, its pools and worker registry, the dispatcher's wake-up
//! and the shutdown signal. Through it, and only it, workers reach the rest of the server.

use pool_manager::PoolRegistry;
use tokio_util::sync::CancellationToken;

use super::WorkerRegistry;
use crate::config::Config;

pub trait WorkerHost: Send + Sync + 'static {
    fn config(&self) -> &Config;
    fn pools(&self) -> &PoolRegistry;
    fn workers(&self) -> &WorkerRegistry;
    /// Wakes the dispatcher: a pool came or went, a worker's load changed.
    fn wake(&self);
    /// Cancelled when the server shuts down.
    fn shutdown(&self) -> &CancellationToken;
    fn is_shutting_down(&self) -> bool;
}
