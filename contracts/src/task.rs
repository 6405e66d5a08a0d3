//! Task submission, admission and the per-task record.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::ErrorCode;
use crate::sse::{SseEnd, SseError};

/// Scheduling class: `interactive` tasks always leave the queue before `batch` tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    #[default]
    Interactive,
    Batch,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Interactive => "interactive",
            Self::Batch => "batch",
        }
    }
}

/// One chat turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChatTurn {
    /// `system` | `user` | `assistant`
    #[schema(pattern = "^(system|user|assistant)$")]
    pub role: String,
    pub content: String,
}

/// A stop sequence or a list of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }
}

/// One piece of a prompt given as tokens: a token id, or text tokenized in its place
/// (llama-server's mixed prompt, `[12, 34, " and", 56]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum PromptPart {
    Token(u32),
    Text(String),
}

/// A generation task: exactly one of `prompt`, `prompt_tokens` or `messages` is required, the
/// rest is optional. Or an embedding task: `embed` alone with `model` (and the scheduling
/// fields: ids, priority, pin, deadline).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"prompt": "Write a haiku about the sea.", "max_tokens": 32, "priority": "interactive", "seed": 7, "session_id": "s-42"}))]
pub struct TaskRequest {
    /// Raw prompt text, tokenized as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1)]
    pub prompt: Option<String>,
    /// A raw prompt as token ids of the model's vocabulary, text pieces allowed among them
    /// (`[1, 2, " and", 3]`). A text piece first is tokenized as `prompt` is (with the model's
    /// BOS where it adds one), a later one as plain text; ids go in as they are (control
    /// tokens included: a client giving ids means them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_items = 1)]
    pub prompt_tokens: Option<Vec<PromptPart>>,
    /// An embedding task: inputs to embed (or pairs to score) instead of text to generate;
    /// its `end` event carries the vectors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embed: Option<crate::embed::EmbedTask>,
    /// Chat turns, rendered with the model's own chat template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_items = 1)]
    pub messages: Option<Vec<ChatTurn>>,
    /// Tokens to generate at most (default from config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub max_tokens: Option<u32>,
    /// Model to run; defaults to the default pool's model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Client idempotency key: resubmitting an existing id returns that task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    pub task_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    pub session_id: Option<String>,
    /// Keeps a conversation on the pool that holds its cache while that pool has room
    /// (OpenAI's field of the same name); without it `session_id` does. 1-256 bytes, scoped to
    /// the tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 256)]
    pub prompt_cache_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    /// Sampling seed; a random one is chosen and recorded when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// 0 = greedy (default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0.0, maximum = 100.0)]
    pub temperature: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1e-6, maximum = 1.0)]
    pub top_p: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0.0, maximum = 1.0)]
    pub min_p: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopField>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1e-6, maximum = 10.0)]
    pub repetition_penalty: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub presence_penalty: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = -2.0, maximum = 2.0)]
    pub frequency_penalty: Option<f32>,
    /// Tokens guessed ahead per pass by prompt lookup (n-gram speculation: the output is what
    /// plain decoding gives; faster where the answer repeats the prompt): 0 = off; absent =
    /// the pool's `draft_tokens`. A constrained (`json_schema`/`grammar`) task does not guess.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 16)]
    pub draft_tokens: Option<u32>,
    /// Pin override: run on this pool only, never elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_id: Option<String>,
    /// The task must finish within this many ms of submission; infeasible ones are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub deadline_ms: Option<u64>,
    /// Output packaging hint (`text` | `json` | `edits`); unknown values are ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_mode: Option<String>,
    /// With `messages` ending in an `assistant` turn: continue that turn (its text is the start
    /// of the answer) instead of answering after it. vLLM's parameter of the same name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continue_final_message: Option<bool>,
    /// Structured output: the answer is JSON valid under this JSON Schema (`{"type":
    /// "object"}` for any object). Decoding is constrained token by token, so it always parses
    /// unless `max_tokens` cuts it short (`finish_reason: length`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub json_schema: Option<serde_json::Value>,
    /// Structured output: the answer is in the language of this context-free grammar
    /// (llguidance's Lark syntax, e.g. `start: "yes" | "no"`). Not with `json_schema`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grammar: Option<String>,
    /// Each token's log-probability in its `token` event (`logprobs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<bool>,
    /// With `logprobs`: the likeliest tokens at each step, 0-20.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 20)]
    pub top_logprobs: Option<u32>,
}

/// Where to read a task's events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StreamLinks {
    /// Path of the SSE stream.
    pub sse: String,
}

/// What a predicted start stands on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Prediction {
    /// The pace real tasks showed, or the pool's own measurement with every slot busy.
    #[default]
    Measured,
    /// One sequence's pace alone, before any measurement of a full pool (just after a load):
    /// admission does not refuse on it.
    Estimated,
}

/// 202 reply of `POST /v1/tasks`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"task_id": "6f1c0d9e-2b7a-4c1e-9a43-1f0d7f2b9c11", "queue_position": 0, "predicted_start_ms": 0, "prediction": "measured", "backoff_ms": 0, "streams": {"sse": "/v1/tasks/6f1c0d9e-2b7a-4c1e-9a43-1f0d7f2b9c11/stream"}}))]
pub struct AdmissionResponse {
    pub task_id: String,
    pub queue_position: u32,
    pub predicted_start_ms: u64,
    /// Whether `predicted_start_ms` comes from a measured pace or is an estimate.
    #[serde(default)]
    pub prediction: Prediction,
    /// Advisory pause before submitting more work (0 when the queue is short).
    pub backoff_ms: u64,
    pub streams: StreamLinks,
}

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum TaskState {
    Queued,
    Running,
    Completed,
    Cancelled,
    Failed,
}

/// How a task ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "event", rename_all = "lowercase")]
pub enum TerminalEvent {
    End(SseEnd),
    Error(SseError),
}

/// One event of the transcript, as streamed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TranscriptEvent {
    /// `started` | `token` | `metrics` | `end` | `error`
    pub event: String,
    #[schema(value_type = Object)]
    pub data: serde_json::Value,
}

/// Timings of a task, in ms.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TaskTimings {
    /// Submission to the start of decoding on a slot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queued_ms: Option<u64>,
    /// Submission to the first token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<u64>,
    /// First token to the end.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode_time_ms: Option<u64>,
    /// Submission to the terminal event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_ms: Option<u64>,
}

/// Why a task's pool was chosen (`orchd_placement_total{reason}` counts the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PlacementReason {
    /// The task named its pool (`pool_id`).
    Pinned,
    /// Its conversation (`prompt_cache_key`, `user`, `session_id`) ran there before, and the
    /// pool had room.
    Affinity,
    /// The pool held the longest cached prefix of its prompt.
    Cache,
    /// The least loaded pool: no cache counted.
    Load,
}

impl PlacementReason {
    pub const ALL: [PlacementReason; 4] = [
        PlacementReason::Pinned,
        PlacementReason::Affinity,
        PlacementReason::Cache,
        PlacementReason::Load,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PlacementReason::Pinned => "pinned",
            PlacementReason::Affinity => "affinity",
            PlacementReason::Cache => "cache",
            PlacementReason::Load => "load",
        }
    }
}

/// The placement decision of a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PlacementNote {
    pub reason: PlacementReason,
    /// Prompt tokens the chosen pool held from a cached prefix when it was chosen, as its
    /// published block hashes told (a multiple of the 16-token block).
    pub held_tokens: u32,
}

/// The per-task record (artifact): params with the prompt redacted, placement, timings,
/// terminal event and transcript. Every admitted task leaves one, failed ones too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TaskRecord {
    pub task_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    pub correlation_id: String,
    pub priority: Priority,
    /// The request with `prompt` and message contents replaced by `[redacted N chars]`.
    #[schema(value_type = Object)]
    pub params: serde_json::Value,
    pub seed: u64,
    pub max_tokens: u32,
    pub prompt_tokens: u32,
    pub tokens_out: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_ref: Option<String>,
    /// In a cluster: the replica that ran it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// Why this replica chose the pool it ran on (absent: not placed here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<PlacementNote>,
    pub ctx: u32,
    pub timings: TaskTimings,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub terminal: Option<TerminalEvent>,
    pub transcript: Vec<TranscriptEvent>,
}

/// `GET /v1/tasks/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TaskStatus {
    pub task_id: String,
    pub state: TaskState,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<ErrorCode>,
    pub record: TaskRecord,
}
