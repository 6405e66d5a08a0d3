//! OpenAI-compatible chat completions (`/v1/chat/completions`, `/v1/models`) on the task spine.

mod chat;
mod error;
mod types;

pub use chat::{chat_completions, models};
pub use error::OpenAiError;
