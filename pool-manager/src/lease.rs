//! A slot lease: the right to run one task on a pool's engine, released on drop.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::pool::Pool;
use crate::port::Engine;

/// Held by a running task. Dropping it frees the slot and wakes the dispatcher.
pub struct SlotLease {
    pub(crate) pool: Arc<Pool>,
    /// The engine at lease time: a reload swaps the pool's engine, never this one.
    pub engine: Arc<dyn Engine>,
    /// Fires when a drain deadline passes: the task must end with a retriable error.
    pub drain_deadline: CancellationToken,
}

impl SlotLease {
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        self.engine.unreserve();
        self.pool.release_slot();
    }
}
