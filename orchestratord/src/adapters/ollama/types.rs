//! Wire types of Ollama's native API (`/api/chat`, `/api/generate`, `/api/tags`, `/api/ps`,
//! `/api/show`, `/api/version`), as its documentation and the `ollama` client spell them.

use std::collections::BTreeMap;

use contracts::StopField;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One message of `/api/chat`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = OllamaMessage)]
pub struct Message {
    /// `system` | `user` | `assistant` | `tool`
    pub role: String,
    #[serde(default)]
    pub content: String,
    /// Images (base64): refused, the models served here read text only.
    pub images: Option<Vec<String>>,
    /// Tool calls of an earlier assistant turn (`[{"function": {"name", "arguments"}}]`).
    pub tool_calls: Option<serde_json::Value>,
    /// A `tool` turn: the function whose result it carries.
    pub tool_name: Option<String>,
    /// An earlier turn's reasoning: accepted and left out of the prompt.
    pub thinking: Option<String>,
}

/// `options`: the sampling and runtime parameters of a request. A parameter not listed is
/// refused by name; the runtime ones (threads, GPU layers, batch, mmap) are accepted and left
/// to the server's configuration, and a sampler parameter this server lacks is accepted at
/// its neutral value only.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = OllamaOptions)]
pub struct Options {
    #[schema(minimum = 0.0, maximum = 100.0)]
    pub temperature: Option<f32>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub min_p: Option<f32>,
    pub seed: Option<i64>,
    /// Tokens to generate at most; -1 (or -2): as many as the context allows.
    pub num_predict: Option<i64>,
    pub stop: Option<StopField>,
    pub repeat_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// The context the request needs: refused when over the model's served context.
    pub num_ctx: Option<i64>,
    // sampler parameters this server has no sampler for: their neutral value only
    pub typical_p: Option<f32>,
    pub mirostat: Option<i64>,
    pub mirostat_tau: Option<f32>,
    pub mirostat_eta: Option<f32>,
    pub tfs_z: Option<f32>,
    pub repeat_last_n: Option<i64>,
    pub penalize_newline: Option<bool>,
    pub num_keep: Option<i64>,
    // runtime parameters, set by the server's configuration
    pub num_batch: Option<i64>,
    pub num_gpu: Option<i64>,
    pub main_gpu: Option<i64>,
    pub num_thread: Option<i64>,
    pub use_mmap: Option<bool>,
    pub use_mlock: Option<bool>,
    pub numa: Option<bool>,
    pub low_vram: Option<bool>,
    pub f16_kv: Option<bool>,
    pub vocab_only: Option<bool>,
    pub logits_all: Option<bool>,
}

/// `POST /api/chat`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = OllamaChatRequest)]
#[schema(example = json!({"model": "SmolLM2-135M-Instruct.Q4_1", "messages": [{"role": "user", "content": "Why is the sky blue?"}], "stream": false, "options": {"temperature": 0, "num_predict": 32}}))]
pub struct ChatRequest {
    pub model: String,
    /// No messages: the model is loaded (here: checked served) and `done_reason` is `load`.
    #[serde(default)]
    pub messages: Vec<Message>,
    /// NDJSON lines unless `false` (the default is `true`).
    pub stream: Option<bool>,
    /// `"json"` or a JSON schema.
    pub format: Option<serde_json::Value>,
    pub options: Option<Options>,
    /// How long a model of the folder stays loaded once idle: seconds or a duration (`"5m"`);
    /// `0` unloads it when idle, negative keeps it loaded (configured pools always stay).
    pub keep_alive: Option<serde_json::Value>,
    /// Functions the model may call (the OpenAI shape): calls come as `message.tool_calls`.
    pub tools: Option<serde_json::Value>,
    /// Thinking: refused when `true` (no model served here thinks).
    pub think: Option<serde_json::Value>,
    /// Each answer token's log-probability (`logprobs` on every line).
    pub logprobs: Option<bool>,
    /// With `logprobs`: the likeliest tokens at each step, 0-20.
    #[schema(minimum = 0, maximum = 20)]
    pub top_logprobs: Option<u32>,
    /// `interactive` | `batch`: the task's class (this server's extension, as vLLM's and
    /// TensorRT-LLM's `priority`); default the tenant's highest allowed.
    pub priority: Option<contracts::Priority>,
}

/// `POST /api/generate`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = OllamaGenerateRequest)]
#[schema(example = json!({"model": "SmolLM2-135M-Instruct.Q4_1", "prompt": "Why is the sky blue?", "stream": false, "options": {"num_predict": 32}}))]
pub struct GenerateRequest {
    pub model: String,
    /// No prompt: the model is loaded (here: checked served) and `done_reason` is `load`.
    #[serde(default)]
    pub prompt: String,
    /// A system prompt (with the chat template; ignored with `raw`).
    pub system: Option<String>,
    /// `true`: the prompt as is, without the chat template.
    #[serde(default)]
    pub raw: bool,
    pub stream: Option<bool>,
    pub format: Option<serde_json::Value>,
    pub options: Option<Options>,
    /// As in `/api/chat`.
    pub keep_alive: Option<serde_json::Value>,
    /// Refused: a custom template (the model's own is applied).
    pub template: Option<String>,
    /// Refused: fill-in-the-middle.
    pub suffix: Option<String>,
    /// Refused: images.
    pub images: Option<Vec<String>>,
    /// Refused: the token context of an earlier answer (deprecated by Ollama).
    pub context: Option<Vec<i64>>,
    pub think: Option<serde_json::Value>,
    /// Each answer token's log-probability (`logprobs` on every line).
    pub logprobs: Option<bool>,
    /// With `logprobs`: the likeliest tokens at each step, 0-20.
    #[schema(minimum = 0, maximum = 20)]
    pub top_logprobs: Option<u32>,
    /// `interactive` | `batch`: the task's class (this server's extension, as vLLM's and
    /// TensorRT-LLM's `priority`); default the tenant's highest allowed.
    pub priority: Option<contracts::Priority>,
}

/// An answer's message.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = OllamaAnswerMessage)]
pub struct AnswerMessage {
    pub role: &'static str,
    pub content: String,
    /// The calls of an answer to a request with `tools` (then `content` is empty).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<super::tools::ToolCall>>,
}

/// The counts and durations (nanoseconds) of the last line of an answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = OllamaStats)]
pub struct Stats {
    /// Submission to the end.
    pub total_duration: u64,
    /// Submission to a slot starting the task (queue wait, a pool loading its model).
    pub load_duration: u64,
    pub prompt_eval_count: u32,
    /// Reading the prompt: placement to the first token.
    pub prompt_eval_duration: u64,
    pub eval_count: u32,
    /// The first token to the end.
    pub eval_duration: u64,
}

/// One line of an `/api/chat` answer (or the whole answer with `stream: false`).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = OllamaChatResponse)]
#[schema(example = json!({"model": "SmolLM2-135M-Instruct.Q4_1", "created_at": "2026-11-25T12:00:00.123456789Z", "message": {"role": "assistant", "content": "The sky is blue because…"}, "done": true, "done_reason": "stop", "total_duration": 612000000, "load_duration": 1200000, "prompt_eval_count": 14, "prompt_eval_duration": 41000000, "eval_count": 32, "eval_duration": 569000000}))]
pub struct ChatLine {
    pub model: String,
    pub created_at: String,
    pub message: AnswerMessage,
    pub done: bool,
    /// On the last line: `stop` | `length` | `cancelled`, or `load` for a request with no
    /// prompt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub done_reason: Option<String>,
    /// With `logprobs`: this line's tokens' log-probabilities.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<Logprob>>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Stats>,
}

/// One line of an `/api/generate` answer (or the whole answer with `stream: false`).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = OllamaGenerateResponse)]
#[schema(example = json!({"model": "SmolLM2-135M-Instruct.Q4_1", "created_at": "2026-11-25T12:00:00.123456789Z", "response": "The sky is blue because…", "done": true, "done_reason": "stop", "total_duration": 612000000, "load_duration": 1200000, "prompt_eval_count": 14, "prompt_eval_duration": 41000000, "eval_count": 32, "eval_duration": 569000000}))]
pub struct GenerateLine {
    pub model: String,
    pub created_at: String,
    pub response: String,
    pub done: bool,
    /// On the last line: `stop` | `length` | `cancelled`, or `load` for a request with no
    /// prompt.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub done_reason: Option<String>,
    /// With `logprobs`: this line's tokens' log-probabilities.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Vec<Logprob>>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Stats>,
}

/// `details` of a model.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = OllamaModelDetails)]
pub struct Details {
    pub parent_model: String,
    /// `gguf`, or `remote` for a worker's model.
    pub format: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub family: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub families: Option<Vec<String>>,
    /// `134.5M`, `1.2B`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameter_size: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quantization_level: Option<String>,
}

/// One model of `/api/tags` (`expires_at`, `size_vram`, `context_length` only in `/api/ps`).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = OllamaModel)]
pub struct ModelEntry {
    pub name: String,
    pub model: String,
    /// The model file's modification time (absent for a worker's model).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modified_at: Option<String>,
    /// Bytes: the file (`/api/tags`); weights and KV cache (`/api/ps`).
    pub size: u64,
    /// `sha256` of the model file, hex (absent for a worker's model).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    pub details: Details,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size_vram: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context_length: Option<usize>,
    /// `/api/ps`: when a model loaded on demand unloads if nothing uses it (RFC 3339); absent
    /// for one that stays loaded (a configured pool, or `keep_alive` < 0).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

/// `GET /api/tags` and `GET /api/ps`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = OllamaModelList)]
pub struct ModelList {
    pub models: Vec<ModelEntry>,
}

/// `POST /api/show`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = OllamaShowRequest)]
pub struct ShowRequest {
    /// The model (older clients send `name`).
    #[serde(alias = "name")]
    pub model: String,
    #[serde(default)]
    pub verbose: bool,
}

/// The answer of `/api/show`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = OllamaShowResponse)]
pub struct ShowResponse {
    /// The model's chat template (Jinja, from its recipe or its GGUF), when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The system prompt its recipe gives a chat that brings none (`/api/create`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// `FROM <model file>` (for a created model: `FROM <the model it was made from>` and its
    /// `SYSTEM`).
    pub modelfile: String,
    /// Its recipe's parameters, then the server's sampling defaults, one `name value` per line.
    pub parameters: String,
    pub details: Details,
    /// GGUF-style keys: `general.architecture`, `general.parameter_count`,
    /// `<arch>.context_length`.
    pub model_info: BTreeMap<String, serde_json::Value>,
    /// `completion` and `tools` (every pool decodes under a JSON Schema, which tools use).
    pub capabilities: Vec<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modified_at: Option<String>,
}

/// `GET /api/version`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = OllamaVersion)]
pub struct Version {
    pub version: String,
}

/// A token's log-probability, and the likeliest tokens at its step (`top_logprobs` of them,
/// most likely first).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = OllamaLogprob)]
pub struct Logprob {
    pub token: String,
    pub logprob: f32,
    pub top_logprobs: Vec<TokenLogprob>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = OllamaTokenLogprob)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
}

impl From<&contracts::SseLogprobs> for Logprob {
    fn from(s: &contracts::SseLogprobs) -> Self {
        Self {
            token: s.token.clone(),
            logprob: s.logprob,
            top_logprobs: s
                .top
                .iter()
                .map(|t| TokenLogprob {
                    token: t.token.clone(),
                    logprob: t.logprob,
                })
                .collect(),
        }
    }
}
