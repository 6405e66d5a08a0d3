//! `GET /v1/capabilities`: what the live pools can do.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One pool's capabilities.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PoolCapability {
    pub pool_id: String,
    /// `local` or `remote`.
    pub kind: String,
    pub engine: String,
    pub engine_version: String,
    pub model_ref: String,
    pub ctx_max: u32,
    pub max_tokens_out: u32,
    pub slots: u32,
    pub state: String,
    pub supported_workloads: Vec<String>,
}

/// The server's discovery document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"api_version": "1.0.0", "pools": [{"pool_id": "default", "kind": "local", "engine": "candle", "engine_version": "1.0.0+candle-0.11.1", "model_ref": "SmolLM2-135M-Instruct.Q4_1.gguf", "ctx_max": 2048, "max_tokens_out": 1024, "slots": 4, "state": "ready", "supported_workloads": ["completion", "chat"]}], "queue": {"capacity": 64, "policy": "reject"}, "features": ["sse", "cancel", "pin_override", "sessions", "budgets", "artifacts", "deadlines"]}))]
pub struct Capabilities {
    pub api_version: String,
    pub pools: Vec<PoolCapability>,
    pub queue: QueueCapability,
    pub features: Vec<String>,
    /// Present while the Hyperswarm chat host runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hyperswarm: Option<HyperswarmCapability>,
}

/// How peers reach this server over Hyperswarm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct HyperswarmCapability {
    /// Base58 of the 32-byte topic; stable across restarts.
    pub server_id: String,
    /// Whether orchestratord runs the transport sidecar itself.
    pub sidecar: bool,
    /// The sidecar has announced the topic on the DHT (peers can find the host).
    pub announced: bool,
    /// Times the sidecar was restarted after exiting.
    pub sidecar_restarts: u64,
}

/// Admission limits clients can plan with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct QueueCapability {
    pub capacity: u32,
    /// `reject` | `drop-lru`
    pub policy: String,
}
