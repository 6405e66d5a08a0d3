//! Wire types of the Kolosal engine-management and health API.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /engines`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"engine_id": "smol", "model_path": ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf", "n_ctx": 2048, "n_gpu_layers": 0}))]
pub struct AddEngine {
    /// 1–64 characters of `A-Z a-z 0-9 . _ : -`; also the `model` name clients send.
    #[schema(pattern = "^[A-Za-z0-9._:-]{1,64}$")]
    pub engine_id: String,
    /// A GGUF file on the server's disk.
    pub model_path: String,
    /// Context per slot (default 4096, at least 128, at most the configured limit and the model's trained context).
    #[schema(minimum = 128)]
    pub n_ctx: Option<usize>,
    /// Layers to offload: any value above 0 runs the whole model on `main_gpu_id` in a build
    /// with the `cuda` feature; CPU builds run on the CPU and report 0.
    pub n_gpu_layers: Option<usize>,
    pub main_gpu_id: Option<usize>,
}

/// What an engine runs with (as it actually runs).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EngineParameters {
    pub n_ctx: usize,
    pub n_gpu_layers: usize,
    pub main_gpu_id: usize,
}

/// `201` of `POST /engines`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({"engine_id": "smol", "status": "loaded", "model_path": ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf", "parameters": {"n_ctx": 2048, "n_gpu_layers": 0, "main_gpu_id": 0}}))]
pub struct EngineCreated {
    pub engine_id: String,
    pub status: String,
    pub model_path: String,
    pub parameters: EngineParameters,
}

/// One row of `GET /engines`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EngineSummary {
    pub engine_id: String,
    /// `loaded` | `loading` | `unloaded` | `draining` | `drained` | `reloading`
    pub status: String,
    pub model_path: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({"engines": [{"engine_id": "default", "status": "loaded", "model_path": ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"}]}))]
pub struct EngineList {
    pub engines: Vec<EngineSummary>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MemoryUsage {
    /// Size of the model file.
    pub model_size_mb: f64,
    /// KV cache reserved for all slots.
    pub context_size_mb: f64,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Performance {
    /// Tokens per second of the last finished request (placement to end, prefill included).
    pub last_inference_tps: Option<f64>,
    /// Requests placed on this engine.
    pub total_requests: u64,
}

/// `GET /engines/{id}/status`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({"engine_id": "smol", "status": "loaded", "model_path": ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf", "parameters": {"n_ctx": 2048, "n_gpu_layers": 0, "main_gpu_id": 0}, "memory_usage": {"model_size_mb": 94.1, "context_size_mb": 180.0}, "performance": {"last_inference_tps": 118.5, "total_requests": 3}, "slots": 4, "slots_busy": 1, "last_error": null}))]
pub struct EngineStatus {
    pub engine_id: String,
    pub status: String,
    pub model_path: String,
    pub parameters: EngineParameters,
    pub memory_usage: MemoryUsage,
    pub performance: Performance,
    pub slots: usize,
    pub slots_busy: usize,
    pub last_error: Option<String>,
}

/// `DELETE /engines/{id}`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({"engine_id": "smol", "status": "removed"}))]
pub struct EngineRemoved {
    pub engine_id: String,
    pub status: &'static str,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EngineCounts {
    pub loaded: usize,
    pub unloaded: usize,
    pub total: usize,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SystemInfo {
    pub uptime_seconds: u64,
    /// Resident memory of this process (Linux; null elsewhere).
    pub memory_usage_mb: Option<f64>,
    /// CPU time of this process since start over wall time, as a percentage of all cores
    /// (Linux; null elsewhere).
    pub cpu_usage_percent: Option<f64>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EngineBrief {
    pub engine_id: String,
    pub status: String,
}

/// `GET /v1/health`, `/health`, `/status`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({"status": "healthy", "timestamp": 1763780000, "version": "1.0.0", "engines": {"loaded": 1, "unloaded": 0, "total": 1}, "system": {"uptime_seconds": 3600, "memory_usage_mb": 262.4, "cpu_usage_percent": 15.2}, "engines_summary": [{"engine_id": "default", "status": "loaded"}]}))]
pub struct Health {
    /// `healthy` (every engine loaded), `degraded` (some), `unhealthy` (none, or shutting down).
    pub status: &'static str,
    pub timestamp: u64,
    pub version: &'static str,
    pub engines: EngineCounts,
    pub system: SystemInfo,
    pub engines_summary: Vec<EngineBrief>,
}
