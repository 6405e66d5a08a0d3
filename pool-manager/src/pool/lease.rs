//! A slot lease: the right to run one task on a pool's engine. It wraps the engine's
//! [`SlotPermit`]; the slot is given back when the engine lets go of the sequence (or when the
//! lease is dropped before the permit went to the engine).

use std::sync::Arc;

use engine_port::SlotPermit;
use tokio_util::sync::CancellationToken;

use super::Pool;
use crate::port::Engine;

/// Held by a running task.
pub struct SlotLease {
    pub(crate) pool: Arc<Pool>,
    /// The engine at lease time: a reload swaps the pool's engine, never this one.
    pub engine: Arc<dyn Engine>,
    /// Fires when a drain deadline passes: the task must end with a retriable error.
    pub drain_deadline: CancellationToken,
    pub(crate) permit: Option<SlotPermit>,
}

impl SlotLease {
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The engine slot, for the job that runs in it (`None` once taken).
    pub fn take_permit(&mut self) -> Option<SlotPermit> {
        self.permit.take()
    }
}
