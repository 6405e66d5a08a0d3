//! OpenAI-compatible chat and text completions (`/v1/chat/completions`, `/v1/completions`,
//! `/v1/models`) on the task spine.

mod chat;
mod completions;
pub mod types;
mod unimplemented;

pub use chat::{__path_chat_completions, __path_models, chat_completions, models};
pub use completions::{__path_completions, completions};

/// `system_fingerprint` of every response.
pub const FINGERPRINT: &str = concat!("orchestratord-", env!("CARGO_PKG_VERSION"));

/// The stream terminator.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// OpenAI's `user` as our session id (budgets, accounting) when it is 1..=128 bytes.
fn session_of(user: Option<&str>) -> Option<String> {
    user.filter(|u| !u.is_empty() && u.len() <= 128)
        .map(str::to_string)
}
