//! Wire types of Anthropic's Messages API (`/v1/messages`, `/v1/messages/count_tokens`), as
//! its reference and the `anthropic` SDK spell them.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A content block of a message or of `system`: `text`; `tool_use` (`id`, `name`, `input`) in
/// assistant turns and `tool_result` (`tool_use_id`, `content`, `is_error`) in user turns. The
/// other kinds are refused with a 400 naming the block.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[schema(as = AnthropicContentBlock)]
pub struct Block {
    /// `text` (others: `image`, `document`, `tool_use`, `tool_result`, `thinking`, …).
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    /// Prompt caching hints: accepted (this server keeps its own prompt cache).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub cache_control: Option<serde_json::Value>,
    /// Every other key of the block (an image's `source`, a tool call's `input`, …).
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub rest: serde_json::Map<String, serde_json::Value>,
}

/// A string, or an array of content blocks.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
#[schema(as = AnthropicContent)]
pub enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

/// One turn.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AnthropicMessage)]
pub struct Message {
    /// `user` | `assistant`; a final `assistant` turn is continued (prefill).
    pub role: String,
    pub content: Content,
}

/// `metadata`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AnthropicMetadata)]
pub struct Metadata {
    /// The end user: this server's session (budgets, accounting).
    pub user_id: Option<String>,
}

/// `POST /v1/messages`. A field not listed is refused by name.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AnthropicMessagesRequest)]
#[schema(example = json!({"model": "SmolLM2-135M-Instruct.Q4_1", "max_tokens": 64, "system": "You are a helpful assistant.", "messages": [{"role": "user", "content": "What is the capital of France?"}]}))]
pub struct MessagesRequest {
    pub model: String,
    #[schema(min_items = 1)]
    pub messages: Vec<Message>,
    /// Required, as in Anthropic's API.
    #[schema(minimum = 1)]
    pub max_tokens: Option<u32>,
    pub system: Option<Content>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub temperature: Option<f32>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub stop_sequences: Option<Vec<String>>,
    #[serde(default)]
    pub stream: bool,
    pub metadata: Option<Metadata>,
    /// `auto` | `standard_only`: accepted (one tier here).
    pub service_tier: Option<String>,
    /// `interactive` | `batch`: the task's class (this server's extension, as vLLM's and
    /// TensorRT-LLM's `priority`); default the tenant's highest allowed.
    pub priority: Option<contracts::Priority>,
    /// Custom tools (`name`, `description`, `input_schema`); the model's calls are decoded
    /// under their schemas, so each `tool_use` input validates. Server tools (web search,
    /// bash, …) are refused by type.
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<serde_json::Value>,
    /// `{"type": "auto" | "any" | "tool" (+ `name`) | "none", "disable_parallel_tool_use"}`.
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<serde_json::Value>,
    /// `{"type": "disabled"}` only: no model served here thinks.
    #[schema(value_type = Option<Object>)]
    pub thinking: Option<serde_json::Value>,
    /// Top-level prompt caching: accepted (this server keeps its own prompt cache).
    #[schema(value_type = Option<Object>)]
    pub cache_control: Option<serde_json::Value>,
    /// `format`: structured output (`{"type": "json_schema", "schema": {…}}`); `effort` is
    /// accepted (one effort here).
    #[schema(value_type = Option<Object>)]
    pub output_config: Option<serde_json::Value>,
    /// `standard` (or null) only: this server has one speed.
    pub speed: Option<String>,
    /// Accepted: one place serves here.
    pub inference_geo: Option<String>,
    /// Accepted: account routing that has no meaning here.
    pub user_profile_id: Option<String>,
    pub workspace_id: Option<String>,
    /// Refused when set: no code-execution containers here.
    #[schema(value_type = Option<Object>)]
    pub container: Option<serde_json::Value>,
    /// Refused when set: no prompt-cache diagnostics here.
    #[schema(value_type = Option<Object>)]
    pub diagnostics: Option<serde_json::Value>,
}

/// `POST /v1/messages/count_tokens`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = AnthropicCountTokensRequest)]
#[schema(example = json!({"model": "SmolLM2-135M-Instruct.Q4_1", "messages": [{"role": "user", "content": "What is the capital of France?"}]}))]
pub struct CountRequest {
    pub model: String,
    #[schema(min_items = 1)]
    pub messages: Vec<Message>,
    pub system: Option<Content>,
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<serde_json::Value>,
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<serde_json::Value>,
    #[schema(value_type = Option<Object>)]
    pub thinking: Option<serde_json::Value>,
}

/// The answer of `count_tokens`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = AnthropicTokenCount, example = json!({"input_tokens": 37}))]
pub struct TokenCount {
    pub input_tokens: u32,
}

/// A block of an answer: text, or a call of one of the request's tools.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[schema(as = AnthropicContentBlockOut)]
pub enum ContentBlock {
    Text {
        text: String,
    },
    /// A call: `input` is valid against the tool's `input_schema` (constrained decoding).
    ToolUse {
        /// `toolu_<task>_<i>`: send it back as the `tool_use_id` of the `tool_result`.
        id: String,
        name: String,
        #[schema(value_type = Object)]
        input: serde_json::Value,
    },
}

/// Token counts.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = AnthropicUsage)]
pub struct Usage {
    /// Input tokens computed for this request (those after the cached prefix).
    pub input_tokens: u32,
    pub output_tokens: u32,
    /// Input tokens read from the cache (a prefix an earlier request left). Caching here is
    /// automatic: `cache_control` marks are accepted and nothing is written on their account.
    pub cache_read_input_tokens: u32,
    pub cache_creation_input_tokens: u32,
}

impl Usage {
    /// A task's input as Anthropic splits it: computed, and read from the cache.
    pub fn of(task: &crate::lifecycle::task::Task, output_tokens: u32) -> Self {
        let cached = task.prompt_tokens_cached();
        Self {
            input_tokens: task.prompt_tokens_used().saturating_sub(cached),
            output_tokens,
            cache_read_input_tokens: cached,
            cache_creation_input_tokens: 0,
        }
    }
}

/// A message: the whole answer, or the opening of a stream (`content` empty).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = AnthropicMessageResponse)]
#[schema(example = json!({"id": "msg_6f1c0d9e", "type": "message", "role": "assistant", "model": "SmolLM2-135M-Instruct.Q4_1", "content": [{"type": "text", "text": "The capital of France is Paris."}], "stop_reason": "end_turn", "stop_sequence": null, "usage": {"input_tokens": 37, "output_tokens": 8}}))]
pub struct MessageResponse {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub role: &'static str,
    pub model: String,
    pub content: Vec<ContentBlock>,
    /// `end_turn` | `max_tokens` | `stop_sequence` | `tool_use` (`cancelled` when the task
    /// was cancelled); null while streaming.
    pub stop_reason: Option<String>,
    pub stop_sequence: Option<String>,
    pub usage: Usage,
}
