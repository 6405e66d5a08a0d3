//! Payloads of the five SSE events of `GET /v1/tasks/{id}/stream`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::ErrorCode;

/// One event of a `text/event-stream` response, as an SSE reader parses it: the schema of the
/// items of every streamed response in the OpenAPI documents. `data` carries the payload as
/// JSON text (each operation names its shape) or the stream's end marker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"event": "token", "id": "3", "data": "{\"i\":0,\"t\":\"Hello\"}"}))]
pub struct SseEvent {
    /// The event type; a reader takes an absent one as `message`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    pub data: String,
    /// The event id, for `Last-Event-ID` on a reconnect (where the stream can resume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Reconnection delay the server asks for, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<u64>,
}

/// First event of every stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"queue_position": 2, "predicted_start_ms": 840, "prediction": "measured", "tenant_queue_share": 32.0}))]
pub struct SseStarted {
    /// Tasks ahead of this one when it was admitted (in the fair order across tenants).
    pub queue_position: u32,
    /// Predicted wait until a slot starts it, from the measured service rate.
    pub predicted_start_ms: u64,
    /// Whether `predicted_start_ms` comes from a measured pace or is an estimate.
    #[serde(default)]
    pub prediction: crate::task::Prediction,
    /// Under fair share: the queue places its tenant was entitled to at admission (the
    /// capacity times its weight over the weights of the tenants waiting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_queue_share: Option<f64>,
}

/// One generated token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"t": " Paris", "i": 5}))]
pub struct SseToken {
    /// Text the token completed (may be empty while a character is incomplete).
    pub t: String,
    /// Zero-based index of the token.
    pub i: u32,
    /// With `logprobs`: the token's log-probability and the likeliest alternatives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<SseLogprobs>,
}

/// A token and its log-probability (natural log).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"token": " Paris", "logprob": -0.31, "bytes": [32, 80, 97, 114, 105, 115]}))]
pub struct SseTokenLogprob {
    /// The token's text (its bytes as UTF-8, a broken character replaced).
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// A step's log-probabilities: of the sampler's distribution (the model's logits after
/// penalties and any output constraint, before temperature and top-k/top-p/min-p).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"token": " Paris", "logprob": -0.31, "bytes": [32, 80, 97, 114, 105, 115], "top": [{"token": " Paris", "logprob": -0.31, "bytes": [32, 80, 97, 114, 105, 115]}, {"token": " the", "logprob": -1.9, "bytes": [32, 116, 104, 101]}]}))]
pub struct SseLogprobs {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    /// The likeliest tokens, most likely first (`top_logprobs` of them).
    pub top: Vec<SseTokenLogprob>,
}

/// Scheduling signals, at most once per configured interval. Additive only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"queue_depth": 3, "on_time_probability": 0.97, "tokens_out": 12, "tokens_budget_remaining": 3900, "time_budget_remaining_ms": 58000}))]
pub struct SseMetrics {
    pub queue_depth: u32,
    /// Estimated probability the task finishes by its deadline (1.0 without a deadline).
    pub on_time_probability: f64,
    pub tokens_out: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_budget_remaining: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_budget_remaining_ms: Option<u64>,
}

/// Successful terminal event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"tokens_out": 24, "decode_time_ms": 410, "decode_ms": 410, "finish_reason": "stop"}))]
pub struct SseEnd {
    pub tokens_out: u32,
    pub decode_time_ms: u64,
    /// Deprecated: the same as `decode_time_ms`, the name of the draft spec. Still sent in
    /// every 1.x version; removed in 2.0.0 — read `decode_time_ms` (FC-END-1).
    #[schema(deprecated)]
    pub decode_ms: u64,
    /// `stop` | `length` | `cancelled`
    pub finish_reason: String,
    /// With `stop`: the stop sequence that ended the answer (absent when the model ended it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_sequence: Option<String>,
    /// Prompt tokens the engine took from its cache rather than computing them (a prefix an
    /// earlier request left: the previous turns of a conversation, a shared system prompt).
    #[serde(default)]
    pub cached_tokens: u32,
    /// An embedding task's result, per input: its vector, its tokens' vectors (pooling
    /// `none`) or its scores (pooling `rank`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embeddings: Option<crate::embed::EmbedVectors>,
    /// An embedding task's input tokens as the engine that ran it counted them (its `usage`
    /// wherever it is followed: another replica may have admitted it on an estimate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u32>,
}

/// Failing terminal event; nothing follows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"code": "QUEUE_FULL_DROP_LRU", "message": "evicted from a full queue by a newer task", "retriable": true, "retry_after_ms": 1200}))]
pub struct SseError {
    pub code: ErrorCode,
    pub message: String,
    pub retriable: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// The request field at fault, when one is (a backend that refused it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}
