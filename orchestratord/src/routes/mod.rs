//! Every HTTP route of the server, one module per resource.

pub mod artifacts;
pub mod capabilities;
pub mod console;
pub mod meta;
pub mod pools;
pub mod probes;
pub mod sessions;
pub mod tasks;
pub mod tenants;
pub mod workers;
