//! The seed-001 chat API (Ollama's response shape): `POST /chat/completions` with JSON or
//! NDJSON answers, and `POST /chat/sse`.

mod chat;
pub mod types;

pub use chat::{__path_completions, __path_sse, completions, sse};
