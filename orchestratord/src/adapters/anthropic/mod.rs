//! Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`) on the task spine,
//! errors in Anthropic's `{"type": "error", "error": {type, message}}` shape.

mod messages;
mod request;
mod tools;
pub mod types;

pub use messages::{__path_count_tokens, __path_messages, count_tokens, messages};
