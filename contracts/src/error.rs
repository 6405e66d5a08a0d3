//! The error envelope and its stable codes.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Stable error codes. Clients branch on these, never on messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// Queue full under the `reject` policy (429).
    AdmissionReject,
    /// The task was evicted from a full queue under the `drop-lru` policy (stream error).
    QueueFullDropLru,
    /// The request is malformed or names something that does not exist (400).
    InvalidParams,
    /// The pinned pool exists but is not Ready (503), or was drained under the task.
    PoolUnready,
    /// No pool can serve the requested model right now (503).
    PoolUnavailable,
    /// Every replica that could serve the task has failed (503).
    ReplicaExhausted,
    /// The task made no progress in time, or ran past its wall-clock limit.
    DecodeTimeout,
    /// The engine running the task died; retry elsewhere.
    WorkerReset,
    /// A bug or an unexpected failure on our side (500).
    Internal,
    /// The task's deadline cannot be met (422 at admission, stream error later).
    DeadlineUnmet,
    /// No such task, session, pool or artifact (404).
    NotFound,
    /// The session's token or time budget does not cover the task (429).
    BudgetExceeded,
    /// The request body is larger than the configured limit (413).
    PayloadTooLarge,
    /// The server is shutting down and admits nothing new (503).
    ShuttingDown,
    /// A control-plane action conflicts with the pool's state (409).
    Conflict,
    /// Missing or wrong bearer token (401).
    Unauthorized,
    /// No worker took the task within the queue timeout (504).
    QueueTimeout,
    /// The key is valid but its scope does not cover the route (403).
    Forbidden,
    /// A request body that is not `application/json` (415).
    UnsupportedMediaType,
    /// Too many failed authentication attempts from this address; wait (429).
    AuthRateLimited,
    /// The request body did not arrive within `http.body_read_timeout_ms` (408).
    RequestTimeout,
    /// The record store cannot keep what was posted now (its file is gone); nothing was
    /// stored (503).
    RecordsUnavailable,
    /// In a cluster: the NATS cluster did not carry the request to the other replicas (a
    /// cancel of a task another replica runs); nothing was done (503, retriable).
    ClusterUnavailable,
    /// A model hub a pull named did not answer as a hub does, or sent a file whose digest
    /// differs from the one it gave; nothing was kept (502).
    HubUnavailable,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AdmissionReject => "ADMISSION_REJECT",
            Self::QueueFullDropLru => "QUEUE_FULL_DROP_LRU",
            Self::InvalidParams => "INVALID_PARAMS",
            Self::PoolUnready => "POOL_UNREADY",
            Self::PoolUnavailable => "POOL_UNAVAILABLE",
            Self::ReplicaExhausted => "REPLICA_EXHAUSTED",
            Self::DecodeTimeout => "DECODE_TIMEOUT",
            Self::WorkerReset => "WORKER_RESET",
            Self::Internal => "INTERNAL",
            Self::DeadlineUnmet => "DEADLINE_UNMET",
            Self::NotFound => "NOT_FOUND",
            Self::BudgetExceeded => "BUDGET_EXCEEDED",
            Self::PayloadTooLarge => "PAYLOAD_TOO_LARGE",
            Self::ShuttingDown => "SHUTTING_DOWN",
            Self::Conflict => "CONFLICT",
            Self::Unauthorized => "UNAUTHORIZED",
            Self::QueueTimeout => "QUEUE_TIMEOUT",
            Self::Forbidden => "FORBIDDEN",
            Self::UnsupportedMediaType => "UNSUPPORTED_MEDIA_TYPE",
            Self::AuthRateLimited => "AUTH_RATE_LIMITED",
            Self::RequestTimeout => "REQUEST_TIMEOUT",
            Self::RecordsUnavailable => "RECORDS_UNAVAILABLE",
            Self::ClusterUnavailable => "CLUSTER_UNAVAILABLE",
            Self::HubUnavailable => "HUB_UNAVAILABLE",
        }
    }

    /// All codes, for metrics label pre-registration and docs.
    pub const ALL: [ErrorCode; 24] = [
        Self::AdmissionReject,
        Self::QueueFullDropLru,
        Self::InvalidParams,
        Self::PoolUnready,
        Self::PoolUnavailable,
        Self::ReplicaExhausted,
        Self::DecodeTimeout,
        Self::WorkerReset,
        Self::Internal,
        Self::DeadlineUnmet,
        Self::NotFound,
        Self::BudgetExceeded,
        Self::PayloadTooLarge,
        Self::ShuttingDown,
        Self::Conflict,
        Self::Unauthorized,
        Self::QueueTimeout,
        Self::Forbidden,
        Self::UnsupportedMediaType,
        Self::AuthRateLimited,
        Self::RequestTimeout,
        Self::RecordsUnavailable,
        Self::ClusterUnavailable,
        Self::HubUnavailable,
    ];
}

/// The body of every non-2xx response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"code": "ADMISSION_REJECT", "message": "queue full (capacity 64)", "retriable": true, "retry_after_ms": 1800, "policy_label": "reject"}))]
pub struct ErrorEnvelope {
    pub code: ErrorCode,
    pub message: String,
    pub retriable: bool,
    /// Advisory wait before retrying, for backpressure and transient errors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// The full-queue policy that produced a 429 (`reject` or `drop-lru`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_label: Option<String>,
    /// The request field at fault, for INVALID_PARAMS.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
}

impl ErrorEnvelope {
    pub fn new(code: ErrorCode, message: impl Into<String>, retriable: bool) -> Self {
        Self {
            code,
            message: message.into(),
            retriable,
            retry_after_ms: None,
            policy_label: None,
            field: None,
            pool_id: None,
            engine: None,
        }
    }
}
