//! Wire types of OpenAI's Responses API (`POST /v1/responses`), the stateless subset.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

/// One part of an input message: `input_text` (or `output_text` of an earlier answer) is read;
/// any other kind is refused with a 400 naming it.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct InputPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

/// An input message's content: a string or parts.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum InputContent {
    Text(String),
    Parts(Vec<InputPart>),
}

/// One input item: a message (`type` absent or `message`), an earlier answer's call
/// (`function_call`: `call_id`, `name`, `arguments`) or a call's result
/// (`function_call_output`: `call_id`, `output`); other item kinds (reasoning, …) are refused
/// with a 400 naming them.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct InputItem {
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// `user` | `assistant` | `system` | `developer`
    pub role: Option<String>,
    pub content: Option<InputContent>,
    /// A call's id (function_call, function_call_output).
    pub call_id: Option<String>,
    /// The function a function_call called.
    pub name: Option<String>,
    /// A function_call's arguments as JSON text.
    pub arguments: Option<String>,
    /// A function_call_output's result: a string or text parts.
    #[schema(value_type = Option<Object>)]
    pub output: Option<Value>,
}

/// `input`: a string (one user message) or items.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Input {
    Text(String),
    Items(Vec<InputItem>),
}

/// `text.format`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum TextFormat {
    Text,
    JsonObject,
    JsonSchema {
        name: String,
        #[schema(value_type = Object)]
        schema: Value,
        description: Option<String>,
        strict: Option<bool>,
    },
}

/// `text`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TextConfig {
    pub format: Option<TextFormat>,
    /// Accepted: `low` | `medium` | `high` (the model says what it says).
    pub verbosity: Option<String>,
}

/// `POST /v1/responses`. A field not listed is refused by name.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"model": "SmolLM2-135M-Instruct.Q4_1", "instructions": "Answer briefly.", "input": "What is the capital of France?", "max_output_tokens": 32}))]
pub struct ResponsesRequest {
    pub model: Option<String>,
    pub input: Input,
    /// A system message before the input.
    pub instructions: Option<String>,
    #[schema(minimum = 1)]
    pub max_output_tokens: Option<u32>,
    #[schema(minimum = 0.0, maximum = 2.0)]
    pub temperature: Option<f32>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub stream: bool,
    pub text: Option<TextConfig>,
    /// The end user: the session, as chat's `user`.
    pub user: Option<String>,
    pub safety_identifier: Option<String>,
    /// Keeps the conversation on the pool holding its cache while that pool has room
    /// (else `user` does), 1-256 bytes.
    pub prompt_cache_key: Option<String>,
    /// Echoed back.
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// `false` only: responses are not stored (stateless).
    pub store: Option<bool>,
    /// Refused: nothing is stored to continue from.
    pub previous_response_id: Option<String>,
    /// Function tools (`{"type": "function", "name", "description", "parameters"}`): the
    /// model's calls are decoded under their schemas, so each call's arguments validate.
    /// Built-in tools (web search, file search, …) are refused by type.
    #[schema(value_type = Option<Vec<Object>>)]
    pub tools: Option<Value>,
    /// `none` | `auto` | `required` | `{"type": "function", "name": …}`.
    #[schema(value_type = Option<Object>)]
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// Refused: no model served here reasons.
    #[schema(value_type = Option<Object>)]
    pub reasoning: Option<Value>,
    /// `disabled` only.
    pub truncation: Option<String>,
    /// Refused when it asks for anything (no extra output here).
    pub include: Option<Vec<String>>,
    /// Refused when true: answers are not kept to be fetched later.
    pub background: Option<bool>,
    pub service_tier: Option<String>,
    /// `interactive` | `batch`: the task's class (this server's extension, as vLLM's and
    /// TensorRT-LLM's `priority`); default the tenant's highest allowed.
    pub priority: Option<contracts::Priority>,
}

/// A piece of output text.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OutputText {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub text: String,
    pub annotations: Vec<Value>,
}

/// The output message.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OutputMessage {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub id: String,
    /// `in_progress` | `completed` | `incomplete`
    pub status: &'static str,
    pub role: &'static str,
    pub content: Vec<OutputText>,
}

/// A call of one of the request's functions.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FunctionCallItem {
    /// `function_call`
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// `fc_<task>_<i>`
    pub id: String,
    /// `call_<task>_<i>`: send it back as the `call_id` of the `function_call_output`.
    pub call_id: String,
    pub name: String,
    /// JSON text, valid against the function's `parameters` (constrained decoding).
    pub arguments: String,
    /// `in_progress` | `completed` | `incomplete`
    pub status: &'static str,
}

/// An output item: the answer's text, or a call.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(untagged)]
pub enum OutputItem {
    Message(OutputMessage),
    FunctionCall(FunctionCallItem),
}

/// Token counts.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ResponseUsage {
    pub input_tokens: u32,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: u32,
    pub total_tokens: u32,
}

/// What the input's count is made of.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct InputTokensDetails {
    /// Input tokens taken from the cache (a prefix an earlier request left), not computed.
    pub cached_tokens: u32,
}

/// Why a response is incomplete.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct IncompleteDetails {
    /// `max_output_tokens`
    pub reason: &'static str,
}

/// A response: the whole answer, or (`status: in_progress`, no output) a stream's opening.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({"id": "resp_6f1c0d9e", "object": "response", "created_at": 1763780000, "status": "completed", "model": "SmolLM2-135M-Instruct.Q4_1", "output": [{"type": "message", "id": "msg_6f1c0d9e", "status": "completed", "role": "assistant", "content": [{"type": "output_text", "text": "Paris.", "annotations": []}]}], "usage": {"input_tokens": 37, "output_tokens": 3, "total_tokens": 40}, "incomplete_details": null, "error": null}))]
pub struct ResponseObject {
    pub id: String,
    pub object: &'static str,
    pub created_at: u64,
    /// `in_progress` | `completed` | `incomplete`
    pub status: &'static str,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub usage: Option<ResponseUsage>,
    pub incomplete_details: Option<IncompleteDetails>,
    #[schema(value_type = Option<Object>)]
    pub error: Option<Value>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub parallel_tool_calls: bool,
    /// As the request gave it (`auto` by default).
    #[schema(value_type = Object)]
    pub tool_choice: Value,
    /// The request's tools, as given.
    pub tools: Vec<Value>,
    #[schema(value_type = Object)]
    pub text: Value,
    #[schema(value_type = Object)]
    pub metadata: Value,
    pub store: bool,
}
