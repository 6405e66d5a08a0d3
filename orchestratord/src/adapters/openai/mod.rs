//! OpenAI-compatible chat and text completions (`/v1/chat/completions`, `/v1/completions`,
//! `/v1/models`) on the task spine.

mod chat;
mod completions;
pub mod logprobs;
pub mod response_format;
pub mod responses;
pub mod tools;
pub mod types;
mod unimplemented;

pub use chat::{
    __path_chat_completions, __path_model, __path_models, chat_completions, model, models,
};
pub use completions::{__path_completions, completions};
pub use responses::{__path_responses, responses};

/// `system_fingerprint` of every response.
pub const FINGERPRINT: &str = concat!("orchestratord-", env!("CARGO_PKG_VERSION"));

/// The stream terminator.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// OpenAI's `user` as our session id (budgets, accounting): as is when it is a valid session
/// id (1-128 characters of `A-Z a-z 0-9 - _ . :`), else `user-` and the first 32 hex digits of
/// its SHA-256 (OpenAI's `user` is any string; it is never refused for its spelling).
pub fn session_of(user: Option<&str>) -> Option<String> {
    use sha2::{Digest, Sha256};
    let user = user.filter(|u| !u.is_empty())?;
    if crate::lifecycle::admission::valid_id(user) {
        return Some(user.to_string());
    }
    let digest = Sha256::digest(user.as_bytes());
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    Some(format!("user-{hex}"))
}

#[cfg(test)]
mod tests {
    use super::session_of;

    /// ADP-OAI-4: any `user` maps to a session id admission takes; valid ids stay as they are.
    #[test]
    fn any_user_is_a_session() {
        assert_eq!(session_of(Some("alice-1")).as_deref(), Some("alice-1"));
        assert_eq!(session_of(Some("")), None);
        let odd = session_of(Some("Alice Smith <a@b.c>")).unwrap();
        assert!(odd.starts_with("user-") && odd.len() == 37, "{odd}");
        assert_eq!(session_of(Some("Alice Smith <a@b.c>")).unwrap(), odd);
        assert_ne!(session_of(Some("x".repeat(129).as_str())).unwrap(), odd);
    }
}
