//! Wire types of the seed-001 chat API (Ollama's response shape).

use contracts::StopField;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::adapters::openai::types::Message;

/// `POST /chat/completions` and `POST /chat/sse` (where `stream` is ignored: always streamed).
/// A field not listed here is refused by name (400), never silently ignored.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = SeedChatRequest)]
#[schema(example = json!({"model": "SmolLM2-135M-Instruct.Q4_1", "messages": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hello, how are you?"}], "stream": true, "temperature": 0.7}))]
pub struct ChatRequest {
    /// Model alias, model name or pool id.
    pub model: String,
    #[schema(min_items = 1)]
    pub messages: Vec<Message>,
    #[serde(default)]
    pub stream: bool,
    #[schema(minimum = 0.0, maximum = 100.0)]
    pub temperature: Option<f32>,
    #[schema(minimum = 1e-6, maximum = 1.0)]
    pub top_p: Option<f32>,
    /// Tokens to generate at most (server default when absent).
    #[schema(minimum = 1)]
    pub max_tokens: Option<u32>,
    pub seed: Option<u64>,
    pub stop: Option<StopField>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChatMessage {
    pub role: &'static str,
    pub content: String,
}

impl ChatMessage {
    pub fn assistant(content: String) -> Self {
        Self {
            role: "assistant",
            content,
        }
    }
}

/// The non-streaming answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = SeedChatResponse)]
#[schema(example = json!({"id": "cmpl-6f1c0d9e", "model": "SmolLM2-135M-Instruct.Q4_1", "created": 1763780000, "message": {"role": "assistant", "content": "I'm doing well, thank you!"}, "done": true, "finish_reason": "stop"}))]
pub struct ChatResponse {
    pub id: String,
    pub model: String,
    pub created: u64,
    pub message: ChatMessage,
    pub done: bool,
    /// `stop` | `length` | `cancelled` (an addition to the seed's shape).
    pub finish_reason: String,
}

/// One streamed chunk: an NDJSON line, or the JSON of one SSE `data:` event.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({"message": {"role": "assistant", "content": "I'm "}, "done": false, "index": 0}))]
pub struct ChatChunk {
    pub message: ChatMessage,
    pub done: bool,
    /// Zero-based number of the chunk in its stream.
    pub index: u32,
    /// On the `done: true` chunk only: `stop` | `length` | `cancelled`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
}

/// The error object of the seed's streams (`message` is a string here).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({"message": "the engine of pool \"default\" stopped", "type": "server_error", "code": "WORKER_RESET"}))]
pub struct StreamError {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub code: contracts::ErrorCode,
}

/// The NDJSON error line: `{"error": {…}, "done": true}`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NdjsonError {
    pub error: StreamError,
    pub done: bool,
}
