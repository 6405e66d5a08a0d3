//! The OpenAI wire types this adapter reads and writes.

use contracts::StopField;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One message. Unknown fields are ignored, as OpenAI clients send many.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct Message {
    /// `system` | `user` | `assistant` | `tool`
    #[schema(pattern = "^(system|user|assistant|tool)$")]
    pub role: String,
    /// Null or absent only on an assistant turn with `tool_calls`.
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant turn's calls (the model reads them as the answer it gave).
    pub tool_calls: Option<Vec<super::tools::ToolCallIn>>,
    /// A `tool` turn: the id of the call it answers.
    pub tool_call_id: Option<String>,
}

/// A message's content: a string, or an array of parts (what LangChain and Open WebUI send).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One part of a message's content. Text parts are read (several are joined with a newline,
/// as vLLM does); other kinds (`image_url`, `input_audio`, `file`) are refused with a 400
/// naming the part: the models served here read text only.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ContentPart {
    /// `text`
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    pub text: Option<String>,
}

/// The chat turns of `messages`, their contents as text (see [`Content::text`]).
pub fn chat_turns(
    messages: &[Message],
) -> Result<Vec<contracts::ChatTurn>, crate::error::ApiError> {
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let text = match &m.content {
                Some(c) => c.text(i)?,
                None => String::new(),
            };
            let calls = m.tool_calls.as_deref().filter(|c| !c.is_empty());
            Ok(match (m.role.as_str(), calls) {
                ("assistant", Some(calls)) => contracts::ChatTurn {
                    role: m.role.clone(),
                    content: super::tools::history_calls(i, calls)?,
                },
                // a tool's result reaches the model as a user turn (any chat template has one)
                ("tool", _) => contracts::ChatTurn {
                    role: "user".into(),
                    content: crate::adapters::tool_calls::history_result(
                        m.tool_call_id.as_deref(),
                        &text,
                        false,
                    ),
                },
                _ if m.content.is_none() => {
                    return Err(crate::error::ApiError::invalid(
                        format!("messages[{i}].content"),
                        "a message needs its content (null only beside tool_calls)",
                    ))
                }
                _ => contracts::ChatTurn {
                    role: m.role.clone(),
                    content: text,
                },
            })
        })
        .collect()
}

impl Content {
    /// The text of message `index`'s content, or a 400 naming the part that is not text.
    pub fn text(&self, index: usize) -> Result<String, crate::error::ApiError> {
        let parts = match self {
            Self::Text(t) => return Ok(t.clone()),
            Self::Parts(parts) => parts,
        };
        let mut texts = Vec::with_capacity(parts.len());
        for (j, part) in parts.iter().enumerate() {
            let field = format!("messages[{index}].content[{j}]");
            match (part.kind.as_str(), &part.text) {
                ("text", Some(t)) => texts.push(t.as_str()),
                ("text", None) => {
                    return Err(crate::error::ApiError::invalid(
                        field,
                        "a text part needs its `text`",
                    ))
                }
                (kind, _) => {
                    // the kind as the client sent it, cut short
                    let shown: String = kind.escape_debug().take(40).collect();
                    return Err(crate::error::ApiError::invalid(
                        field,
                        format!(
                            "content parts of type \"{shown}\" are not supported: the models served here read text only"
                        ),
                    ));
                }
            }
        }
        Ok(texts.join("\n"))
    }
}

#[derive(Debug, Clone, Deserialize, Default, ToSchema)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` (and empty `choices`) before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[schema(example = json!({"model": "SmolLM2-135M-Instruct.Q4_1", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 32, "temperature": 0, "stream": false}))]
pub struct ChatRequest {
    /// Model alias, model name or pool id; defaults to the first pool's model.
    pub model: Option<String>,
    /// Rendered with the model's own chat template.
    #[schema(min_items = 1)]
    pub messages: Vec<Message>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    #[schema(minimum = 0.0, maximum = 100.0)]
    pub temperature: Option<f32>,
    #[schema(minimum = 1e-6, maximum = 1.0)]
    pub top_p: Option<f32>,
    #[schema(minimum = 1)]
    pub max_tokens: Option<u32>,
    /// Wins over `max_tokens` when both are given.
    #[schema(minimum = 1)]
    pub max_completion_tokens: Option<u32>,
    pub seed: Option<u64>,
    pub stop: Option<StopField>,
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub presence_penalty: Option<f32>,
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub frequency_penalty: Option<f32>,
    /// Choices to generate for the prompt (its prefill shared), at most
    /// `admission.max_prompts_per_request`; with `seed`, choice `i` draws with `seed + i`.
    #[schema(minimum = 1, maximum = 16)]
    pub n: Option<u32>,
    /// Used as the session id (budgets, accounting) when 1..=128 bytes.
    pub user: Option<String>,
    /// Keeps the conversation on the pool holding its cache while that pool has room (else
    /// `user` does), 1-256 bytes.
    pub prompt_cache_key: Option<String>,
    /// Sampling extensions (llama.cpp's and vLLM's names): 0 disables top-k.
    pub top_k: Option<u32>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub min_p: Option<f32>,
    #[schema(minimum = 1e-6, maximum = 10.0)]
    pub repetition_penalty: Option<f32>,
    /// Tokens guessed ahead per pass by prompt lookup (n-gram speculation, the output
    /// unchanged): 0 = off; absent = the pool's setting.
    #[schema(minimum = 0, maximum = 16)]
    pub draft_tokens: Option<u32>,
    /// Continue the final assistant turn instead of answering after it (vLLM's parameter).
    pub continue_final_message: Option<bool>,
    /// With `continue_final_message`: false (the only value honoured then); otherwise true.
    pub add_generation_prompt: Option<bool>,
    /// Each token's log-probability in the answer (`choices[].logprobs.content`).
    pub logprobs: Option<bool>,
    /// With `logprobs`: the likeliest tokens at each step, 0-20.
    #[schema(minimum = 0, maximum = 20)]
    pub top_logprobs: Option<u32>,
    /// Structured output: JSON (any object, or valid under a schema), by constrained decoding.
    pub response_format: Option<super::response_format::ResponseFormat>,
    /// Functions the model may call; each call's arguments are decoded under the function's
    /// `parameters` schema, so they always parse and validate.
    #[schema(max_items = 128)]
    pub tools: Option<Vec<super::tools::ToolDef>>,
    /// `auto` (the default with tools), `none`, `required`, or a named function.
    pub tool_choice: Option<super::tools::ToolChoiceField>,
    /// More than one call in an answer (default true).
    pub parallel_tool_calls: Option<bool>,
    /// `interactive` | `batch`: the task's class (this server's extension, as vLLM's and
    /// TensorRT-LLM's `priority`); default the tenant's highest allowed.
    pub priority: Option<contracts::Priority>,
    /// Fields of OpenAI's API not implemented here: refused unless neutral.
    #[serde(flatten)]
    pub unimplemented: super::unimplemented::Unimplemented,
}

/// A prompt: one string or several (each its own task, answered as its own choice), or token
/// ids (one prompt, or several as arrays of ids), as OpenAI's API takes them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    One(String),
    Many(Vec<String>),
    Tokens(Vec<u32>),
    ManyTokens(Vec<Vec<u32>>),
}

/// Written by hand: the derive cannot bound the strings of an untagged enum's variants, and an
/// empty prompt (or prompt array) is refused.
impl utoipa::PartialSchema for PromptField {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Type};
        let text = || {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
        };
        let ids = || {
            let id = ObjectBuilder::new()
                .schema_type(Type::Integer)
                .minimum(Some(0))
                .maximum(Some(u32::MAX));
            ArrayBuilder::new().items(id).min_items(Some(1))
        };
        // the lists of prompts are items 1 and 3 (their length is bounded in `openapi.rs`)
        OneOfBuilder::new()
            .item(text())
            .item(ArrayBuilder::new().items(text()).min_items(Some(1)))
            .item(ids())
            .item(ArrayBuilder::new().items(ids()).min_items(Some(1)))
            .description(Some(
                "One prompt, or several (each its own task and choice), as text or as token ids of the model's vocabulary; none may be empty.",
            ))
            .into()
    }
}

impl ToSchema for PromptField {}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[schema(example = json!({"model": "SmolLM2-135M-Instruct.Q4_1", "prompt": ["The weather today is", "In breaking news,"], "max_tokens": 16, "temperature": 0}))]
pub struct CompletionRequest {
    pub model: Option<String>,
    pub prompt: PromptField,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    #[schema(minimum = 0.0, maximum = 100.0)]
    pub temperature: Option<f32>,
    #[schema(minimum = 1e-6, maximum = 1.0)]
    pub top_p: Option<f32>,
    /// Default 16, as OpenAI's.
    #[schema(minimum = 1)]
    pub max_tokens: Option<u32>,
    pub seed: Option<u64>,
    pub stop: Option<StopField>,
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub presence_penalty: Option<f32>,
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub frequency_penalty: Option<f32>,
    /// Only 1 is supported.
    #[schema(minimum = 1, maximum = 1)]
    pub n: Option<u32>,
    /// Only 1 is supported.
    #[schema(minimum = 1, maximum = 1)]
    pub best_of: Option<u32>,
    /// Each choice's text starts with its prompt (streamed as the choice's first frame).
    #[serde(default)]
    pub echo: bool,
    /// `interactive` | `batch`: the task's class (this server's extension, as vLLM's and
    /// TensorRT-LLM's `priority`); default the tenant's highest allowed.
    pub priority: Option<contracts::Priority>,
    pub user: Option<String>,
    /// Keeps the conversation on the pool holding its cache while that pool has room (else
    /// `user` does), 1-256 bytes.
    pub prompt_cache_key: Option<String>,
    /// Sampling extensions (llama.cpp's and vLLM's names): 0 disables top-k.
    pub top_k: Option<u32>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub min_p: Option<f32>,
    #[schema(minimum = 1e-6, maximum = 10.0)]
    pub repetition_penalty: Option<f32>,
    /// Tokens guessed ahead per pass by prompt lookup (n-gram speculation, the output
    /// unchanged): 0 = off; absent = the pool's setting.
    #[schema(minimum = 0, maximum = 16)]
    pub draft_tokens: Option<u32>,
    /// Each token's log-probability and this many likeliest tokens at each step (0-20).
    #[schema(minimum = 0, maximum = 20)]
    pub logprobs: Option<u32>,
    /// Structured output: JSON (any object, or valid under a schema), by constrained decoding.
    pub response_format: Option<super::response_format::ResponseFormat>,
    /// Fields of OpenAI's API not implemented here: refused unless neutral.
    #[serde(flatten)]
    pub unimplemented: super::unimplemented::Unimplemented,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// What the prompt's count is made of.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
pub struct PromptTokensDetails {
    /// Prompt tokens taken from the cache (a prefix an earlier request left), not computed.
    pub cached_tokens: u32,
}

impl Usage {
    pub fn new(prompt_tokens: u32, completion_tokens: u32) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens: 0 },
        }
    }

    /// A finished task's usage: its prompt as the engine counted it, the part of it that
    /// came from the cache, and `completion_tokens`.
    pub fn of(task: &crate::lifecycle::task::Task, completion_tokens: u32) -> Self {
        let mut u = Self::new(task.prompt_tokens_used(), completion_tokens);
        u.prompt_tokens_details.cached_tokens = task.prompt_tokens_cached();
        u
    }
}

impl std::ops::Add for Usage {
    type Output = Usage;

    fn add(self, other: Usage) -> Usage {
        let mut u = Usage::new(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
        );
        u.prompt_tokens_details.cached_tokens =
            self.prompt_tokens_details.cached_tokens + other.prompt_tokens_details.cached_tokens;
        u
    }
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AssistantMessage {
    pub role: &'static str,
    /// Null when the answer is tool calls.
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<super::tools::ToolCallOut>>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Choice {
    pub index: u32,
    pub message: AssistantMessage,
    /// `stop` | `length` | `tool_calls` | `cancelled`
    pub finish_reason: String,
    /// vLLM's: the stop sequence that ended the answer, when one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// With `logprobs: true`: each token's log-probability (null otherwise).
    pub logprobs: Option<super::logprobs::ChatLogprobs>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({"id": "chatcmpl-6f1c0d9e", "object": "chat.completion", "created": 1763780000, "model": "SmolLM2-135M-Instruct.Q4_1", "system_fingerprint": "orchestratord-1.0.0", "choices": [{"index": 0, "message": {"role": "assistant", "content": "The capital of France is Paris."}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 37, "completion_tokens": 8, "total_tokens": 45}}))]
pub struct ChatResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<Choice>,
    pub usage: Usage,
}

#[derive(Debug, Clone, Serialize, Default, ToSchema)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<super::tools::ToolCallDelta>>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    pub finish_reason: Option<String>,
    /// vLLM's: the stop sequence that ended the answer (on the last chunk), when one did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// With `logprobs: true`: the log-probabilities of this chunk's token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<super::logprobs::ChatLogprobs>,
}

/// One `data:` frame of a streamed chat completion.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({"id": "chatcmpl-6f1c0d9e", "object": "chat.completion.chunk", "created": 1763780000, "model": "SmolLM2-135M-Instruct.Q4_1", "system_fingerprint": "orchestratord-1.0.0", "choices": [{"index": 0, "delta": {"content": " Paris"}, "finish_reason": null}]}))]
pub struct Chunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TextChoice {
    pub index: u32,
    pub text: String,
    /// `stop` | `length` | `cancelled`; null in streamed chunks before the last.
    pub finish_reason: Option<String>,
    /// With `logprobs`: its tokens' log-probabilities (null otherwise).
    pub logprobs: Option<super::logprobs::TextLogprobs>,
}

/// A text completion, or (with `object` `text_completion` too) one streamed frame of it.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({"id": "cmpl-6f1c0d9e", "object": "text_completion", "created": 1763780000, "model": "SmolLM2-135M-Instruct.Q4_1", "system_fingerprint": "orchestratord-1.0.0", "choices": [{"index": 0, "text": " sunny and warm.", "finish_reason": "stop"}, {"index": 1, "text": " the city council", "finish_reason": "length"}], "usage": {"prompt_tokens": 9, "completion_tokens": 20, "total_tokens": 29}}))]
pub struct CompletionResponse {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub system_fingerprint: String,
    pub choices: Vec<TextChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// A model a pool serves, or a model of the model folder (`models.dirs`) loaded on demand.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({"id": "SmolLM2-135M-Instruct.Q4_1", "object": "model", "created": 0, "owned_by": "orchestratord", "max_model_len": 8192, "loaded": true}))]
pub struct Model {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    /// `orchestratord` for a model of this server, `worker:<worker id>` for a remote worker's.
    pub owned_by: String,
    /// Tokens of context a request may use, prompt and output together (vLLM's name); the
    /// smallest over the pools that serve the model (a folder model not loaded: its trained
    /// context).
    pub max_model_len: usize,
    /// A pool serving it has it in memory (a folder model not loaded: a request loads it).
    pub loaded: bool,
    /// Of a folder model: `general.architecture` of its file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    /// Of a folder model: its quantization (`Q4_K_M`, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantization: Option<String>,
    /// Of a folder model: its file's size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({"object": "list", "data": [{"id": "SmolLM2-135M-Instruct.Q4_1", "object": "model", "created": 0, "owned_by": "orchestratord", "max_model_len": 8192}]}))]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<Model>,
}
