//! What a worker's engines hold, said to its server (PLACE-6): per model it serves, the union
//! of its own pools' held prefixes (`engine_port::prefix`), as changes looked at every
//! [`HELD_EVERY`] — the whole set first and every [`FULL_EVERY`] — in `held_prefixes` frames,
//! only to a server whose `register_ack` asked for them. A URL backend's cache is out of sight:
//! such a worker says nothing, and the server counts what it sent there instead.

use std::time::Duration;

use contracts::worker::WorkerToServer;

use super::backend::Backend;
use crate::held_changes::{encode, Publisher};

/// How often the worker looks whether what its engines hold changed.
pub const HELD_EVERY: Duration = Duration::from_millis(50);
/// How often each model's whole set goes out again (the socket loses nothing; this bounds
/// how long a server that mislaid a frame counts nothing there).
const FULL_EVERY: Duration = Duration::from_secs(30);

/// The worker's side of one connection: what it said so far.
#[derive(Default)]
pub struct HeldReport {
    publisher: Publisher,
}

impl HeldReport {
    /// The frames that say what changed since the last call (none for a URL backend).
    pub fn frames(&mut self, backend: &Backend) -> Vec<WorkerToServer> {
        let Some(now) = backend.held_by_model() else {
            return Vec::new();
        };
        self.publisher
            .changes(now, false, FULL_EVERY)
            .into_iter()
            .map(|c| WorkerToServer::HeldPrefixes {
                model: c.key,
                seq: c.seq,
                // a model no longer served: its set is empty from now on
                full: c.full || c.gone,
                added: encode(&c.added),
                evicted: encode(&c.evicted),
            })
            .collect()
    }
}
