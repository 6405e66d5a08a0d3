//! orchestratord: the HTTP server. Admission, the bounded two-class queue, placement onto
//! pools, the dispatcher, SSE streaming, cancel, sessions, artifacts, metrics and the
//! control plane. Adapters (OpenAI, Ollama-style chat, Kolosal, Hyperswarm, workers) sit on
//! the same task lifecycle.

pub mod adapters;
pub mod admission;
pub mod config;
pub mod correlation;
pub mod dispatcher;
pub mod error;
pub mod eta;
pub mod examples;
pub mod json_body;
pub mod loadgen;
pub mod metrics;
pub mod openapi;
pub mod placement;
pub mod process_stats;
pub mod queue;
pub mod remote_workers;
pub mod routes;
pub mod runner;
pub mod server;
pub mod sessions;
pub mod sse;
pub mod state;
pub mod task;
pub mod task_store;
pub mod worker;
