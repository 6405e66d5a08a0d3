//! orchestratord: the HTTP server. Admission, the bounded two-class queue, placement onto
//! pools, the dispatcher, SSE streaming, cancel, sessions, artifacts, metrics and the
//! control plane. Adapters (OpenAI, Ollama-style chat, Kolosal, Hyperswarm, workers) sit on
//! the same task lifecycle.

/// The process allocator of every binary built on this crate (server, worker, soak, tests).
/// glibc's malloc kept freed memory: a 36-minute soak with a reload every ~12 s grew to 3.0 GB
/// resident while 0.57 GB was in use (`malloc_trim` gave 2 GB back at once); on mimalloc the
/// same soak stayed at 0.94 GB. Built without transparent huge pages (`no_thp`): with them,
/// zeroed KV caches were resident from the start (1.73 GB idle at 8 × 4096 vs 0.26 GB).
/// Figures in ARCHITECTURE.md, "Decisions".
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod adapters;
pub mod auth;
pub mod body_deadline;
pub mod client_addr;
pub mod config;
pub mod correlation;
pub mod error;
pub mod examples;
pub mod json_body;
pub mod lifecycle;
pub mod listener;
pub mod loadgen;
pub mod logging;
pub mod metrics;
pub mod model_paths;
pub mod openapi;
pub mod orchctl;
pub mod patience;
pub mod process_stats;
pub mod records;
pub mod remote_workers;
pub mod routes;
pub mod server;
pub mod sessions;
pub mod soak;
pub mod sse_reader;
pub mod state;
pub mod worker;
