//! orchestratord: the HTTP server. Admission, the bounded two-class queue, placement onto
//! pools, the dispatcher, SSE streaming, cancel, sessions, artifacts, metrics and the
//! control plane. Adapters (OpenAI, Ollama-style chat, Kolosal, Hyperswarm, workers) sit on
//! the same task lifecycle.

pub mod adapters;
pub mod allocator;
pub mod app_state;
pub mod auth;
pub mod body_deadline;
pub mod client_addr;
pub mod cluster;
pub mod config;
pub mod console_history;
pub mod correlation;
pub mod error;
pub mod examples;
pub mod held_changes;
pub mod json_body;
pub mod lifecycle;
pub mod listener;
pub mod logging;
pub mod metrics;
pub mod model_digest;
pub mod model_paths;
pub mod models_folder;
pub mod openapi;
pub mod patience;
pub mod process_stats;
pub mod records;
pub mod remote_workers;
pub mod routes;
pub mod serve_flags;
pub mod server;
pub mod sessions;
pub mod terminal_chat;
pub mod worker;
