//! `GET /v1/health` (also `/health` and `/status`): engines loaded/unloaded, uptime, memory —
//! or, for `/health` and `/v1/health` where `http.health_shape` says so, llama-server's answer.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use contracts::API_VERSION;

use super::engines::status_word;
use super::types::*;
use crate::app_state::SharedState;
use crate::process_stats;

/// Server health in Kolosal's shape: 200 while at least one engine serves, else 503.
#[utoipa::path(
    get, operation_id = "getHealth", path = "/v1/health", tag = "engines",
    responses(
        (status = 200, description = "`healthy` (every engine loaded) or `degraded` (some)", body = Health),
        (status = 503, description = "`unhealthy`: no engine serves, or the server is shutting down", body = Health, example = json!({"status": "unhealthy", "timestamp": 1763780000, "version": "1.0.0", "engines": {"loaded": 0, "unloaded": 1, "total": 1}, "system": {"uptime_seconds": 12, "memory_usage_mb": 120.0, "cpu_usage_percent": 40.1}, "engines_summary": [{"engine_id": "default", "status": "unloaded"}]})),
    )
)]
pub async fn health(State(state): State<SharedState>) -> Response {
    if state.cfg.http.health_shape == Some(crate::config::HealthShape::LlamaServer) {
        return crate::adapters::llama_server::health::answer(&state);
    }
    kolosal_health(&state)
}

/// `GET /status`: Kolosal's shape always.
pub async fn server_status(State(state): State<SharedState>) -> Response {
    kolosal_health(&state)
}

fn kolosal_health(state: &SharedState) -> Response {
    let pools = state.pools.all();
    let summary: Vec<EngineBrief> = pools
        .iter()
        .map(|p| EngineBrief {
            engine_id: p.id().to_string(),
            status: status_word(p.state()),
        })
        .collect();
    let loaded = pools.iter().filter(|p| p.accepts_work()).count();
    let total = pools.len();
    let status = if loaded == 0 || state.is_shutting_down() {
        "unhealthy"
    } else if loaded < total {
        "degraded"
    } else {
        "healthy"
    };
    let uptime = state.started_at.elapsed();
    let body = Health {
        status,
        timestamp: crate::adapters::follow::unix_now(),
        version: API_VERSION,
        engines: EngineCounts {
            loaded,
            unloaded: total - loaded,
            total,
        },
        system: SystemInfo {
            uptime_seconds: uptime.as_secs(),
            memory_usage_mb: process_stats::resident_bytes()
                .map(|b| (b as f64 / (1024.0 * 1024.0) * 10.0).round() / 10.0),
            cpu_usage_percent: process_stats::cpu_percent_since_start(uptime)
                .map(|p| (p * 10.0).round() / 10.0),
        },
        engines_summary: summary,
    };
    let code = if status == "unhealthy" {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (code, Json(body)).into_response()
}
