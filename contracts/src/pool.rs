//! Control-plane bodies: pool health, drain, reload.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Counters and gauges of one pool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PoolMetrics {
    pub slots_busy: u32,
    pub tasks_started: u64,
    pub tasks_finished: u64,
    pub reloads_ok: u64,
    pub reloads_failed: u64,
    pub restarts: u64,
    pub model_load_ms: u64,
    /// Smoothed task service time (EWMA), when measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_ms_ewma: Option<u64>,
    /// Load failures in a row (reset by a successful load).
    pub consecutive_failures: u32,
    /// Open after `CIRCUIT_OPEN_AFTER` failures in a row: retries then wait the longest
    /// backoff (30 s) instead of retrying quickly.
    pub circuit_open: bool,
    /// While draining: time left until running tasks are ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline_remaining_ms: Option<u64>,
    /// Tasks the current (or last) drain's deadline ended before they finished (0 when every
    /// running task finished in time).
    #[serde(default)]
    pub drain_cut_off: u32,
    /// Prompt tokens the engine took from its prefix caches (a slot's row or the host-memory
    /// prompt cache) instead of computing.
    #[serde(default)]
    pub prompt_tokens_reused: u64,
    /// Prompt tokens of every sequence the engine started, the reused ones included (their
    /// ratio is the pool's cache hit rate, shown by the console).
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Bytes the engine's host-memory prompt cache holds (bounded by the pool's
    /// `prompt_cache_mib`).
    #[serde(default)]
    pub prompt_cache_bytes: u64,
}

/// `GET /v1/pools/{id}/health`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"pool_id": "default", "live": true, "ready": true, "draining": false, "state": "ready", "model_ref": "SmolLM2-135M-Instruct.Q4_1.gguf", "engine": "candle", "engine_version": "1.0.0+candle-0.11.1", "slots_total": 4, "slots_free": 3, "queue_depth": 0, "last_error": null, "metrics": {"slots_busy": 1, "tasks_started": 10, "tasks_finished": 9, "reloads_ok": 0, "reloads_failed": 0, "restarts": 0, "model_load_ms": 820}}))]
pub struct PoolHealth {
    pub pool_id: String,
    /// `local` (loaded in this process) or `remote` (a connected worker's model).
    pub kind: String,
    pub live: bool,
    pub ready: bool,
    pub draining: bool,
    /// `loading` | `ready` | `draining` | `drained` | `reloading` | `unready`
    pub state: String,
    pub model_ref: String,
    /// The name unpinned tasks ask for its model by (`model`); absent from older replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_alias: Option<String>,
    pub engine: String,
    pub engine_version: String,
    pub slots_total: u32,
    pub slots_free: u32,
    /// Queued tasks this pool could serve.
    pub queue_depth: u32,
    pub last_error: Option<String>,
    pub metrics: PoolMetrics,
    /// Present for a pool loaded on demand from `models.dirs` (MOD-FOLDER-7): when it
    /// unloads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_demand: Option<OnDemand>,
    /// In a cluster (`cluster.nats_urls`): the replica whose pool this is. Another replica's
    /// pool is listed as it last announced itself; drain, reload and health by id act on
    /// this replica's own pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
}

/// How long an on-demand pool stays loaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"model": "gemma-3-270m-q4_k_m", "keep_alive_s": 300, "unloads_in_ms": 254000}))]
pub struct OnDemand {
    /// The model it was loaded for.
    pub model: String,
    /// Seconds it stays loaded once idle (the last request's `keep_alive`, else
    /// `models.keep_alive_s`); absent: until the memory budget needs its room, a drain or an
    /// unload call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_alive_s: Option<u64>,
    /// While it is idle and a keep-alive applies: milliseconds until it unloads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unloads_in_ms: Option<u64>,
}

/// `GET /v1/pools`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PoolList {
    pub pools: Vec<PoolHealth>,
}

/// `POST /v1/pools/{id}/drain`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"deadline_ms": 5000}))]
pub struct DrainRequest {
    /// Running tasks still going after this many ms end with a retriable error.
    pub deadline_ms: u64,
}

/// `POST /v1/pools/{id}/reload`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"new_model_ref": "/models/SmolLM2-135M-Instruct.Q4_1.gguf"}))]
pub struct ReloadRequest {
    /// Path of the GGUF to serve instead.
    pub new_model_ref: String,
}

/// 200 reply of a successful reload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"pool_id": "default", "model_ref": "/models/SmolLM2-135M-Instruct.Q4_1.gguf", "load_ms": 910}))]
pub struct ReloadResponse {
    pub pool_id: String,
    pub model_ref: String,
    pub load_ms: u64,
}

/// `GET /readyz`: whether this server should get traffic (Kubernetes readiness).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"ready": false, "status": "loading", "pools_ready": 0, "pools": 1, "shutting_down": false, "pool_states": [{"pool_id": "default", "state": "loading", "loading_ms": 1200, "predicted_load_ms": 900}]}))]
pub struct Readiness {
    /// At least one pool takes work and the server is not shutting down.
    pub ready: bool,
    /// `ready`; `loading` (no pool takes work yet, one is still loading: requests for it are
    /// admitted and wait, with the load in their predicted start); `unavailable`;
    /// `cluster_unavailable` (a replica that does not reach its NATS cluster); `shutting_down`.
    pub status: String,
    /// Pools that take work now (ready, engine alive).
    pub pools_ready: u32,
    pub pools: u32,
    pub shutting_down: bool,
    /// Each pool's state, with the progress of a load.
    #[serde(default)]
    pub pool_states: Vec<PoolReadiness>,
}

/// One pool in `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PoolReadiness {
    pub pool_id: String,
    pub state: String,
    /// While loading: how long it has been loading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loading_ms: Option<u64>,
    /// While loading: what is left of the predicted load (file size at the load rate last
    /// measured here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_load_ms: Option<u64>,
}
