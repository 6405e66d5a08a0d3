//! Sessions: a client's running budget of tokens and time across tasks.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `GET /v1/sessions/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"session_id": "s-42", "ttl_ms_remaining": 540000, "turns": 3, "tokens_used": 412, "token_budget": 20000, "tokens_remaining": 19588, "time_used_ms": 5120, "time_budget_ms": 600000, "time_remaining_ms": 594880}))]
pub struct SessionInfo {
    pub session_id: String,
    /// Time until the session expires unless used again.
    pub ttl_ms_remaining: u64,
    /// Tasks admitted in this session.
    pub turns: u32,
    /// Prompt plus generated tokens charged so far (reserved for running tasks).
    pub tokens_used: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_budget: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_remaining: Option<u64>,
    /// Decode wall time charged so far.
    pub time_used_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_budget_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_remaining_ms: Option<u64>,
}
