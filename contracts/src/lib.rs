//! Wire types of orchestratord: requests, responses, SSE payloads, the error envelope and its
//! stable codes. Serde for the wire, utoipa for the generated OpenAPI documents.

pub mod artifact;
pub mod capabilities;
pub mod embed;
pub mod error;
pub mod metric_names;
pub mod pool;
pub mod session;
pub mod sse;
pub mod task;
pub mod tenant;
pub mod worker;

/// The one version (FC-VER-1): the workspace's, so the binaries' `--version`, `/health`,
/// `/api/version`, the OpenAPI documents' `info.version`, `Capabilities.api_version` and the
/// OpenAI `system_fingerprint` all say the same.
pub const API_VERSION: &str = env!("CARGO_PKG_VERSION");

pub use artifact::{
    Artifact, ArtifactList, ArtifactMeta, ArtifactQuery, ArtifactRequest, StoredArtifact,
};
pub use capabilities::{Capabilities, HyperswarmCapability, PoolCapability, QueueCapability};
pub use embed::{EmbedItem, EmbedTask, EmbedVectors, PoolingKind};
pub use error::{ErrorCode, ErrorEnvelope};
pub use pool::{
    DrainRequest, OnDemand, PoolHealth, PoolList, PoolMetrics, PoolReadiness, Readiness,
    ReloadRequest, ReloadResponse,
};
pub use session::SessionInfo;
pub use sse::{
    SseEnd, SseError, SseEvent, SseLogprobs, SseMetrics, SseStarted, SseToken, SseTokenLogprob,
};
pub use task::{
    AdmissionResponse, ChatTurn, PlacementNote, PlacementReason, Prediction, Priority, PromptPart,
    StopField, StreamLinks, TaskRecord, TaskRequest, TaskState, TaskStatus, TaskTimings,
    TerminalEvent, TranscriptEvent,
};
pub use tenant::{TenantList, TenantStatus};
