//! Ollama's native API (`/api/chat`, `/api/generate`, `/api/tags`, `/api/ps`, `/api/show`,
//! `/api/version`) on the task spine, errors in Ollama's `{"error": "…"}` shape.

mod answer;
mod models;
mod request;
mod tools;
pub mod types;

pub use answer::{__path_chat, __path_generate, chat, generate};
pub use models::{__path_ps, __path_show, __path_tags, __path_version, ps, show, tags, version};
