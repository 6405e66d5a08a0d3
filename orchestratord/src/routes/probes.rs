//! Kubernetes probes. `/livez`: the process answers HTTP (no pool state: a pod whose pools are
//! loading or drained on purpose must not be restarted). `/readyz`: it should get traffic — a
//! pool takes work and the server is not shutting down. Both need no key.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use contracts::Readiness;

use crate::lifecycle::state::SharedState;

/// Liveness: 200 while the server answers.
#[utoipa::path(
    get, operation_id = "getLiveness", path = "/livez", tag = "control",
    responses((status = 200, description = "The process serves HTTP", body = String, example = json!("ok")))
)]
pub async fn livez() -> &'static str {
    "ok"
}

/// Readiness: 200 when a pool takes work and the server is not shutting down, else 503.
#[utoipa::path(
    get, operation_id = "getReadiness", path = "/readyz", tag = "control",
    responses(
        (status = 200, description = "Ready for traffic", body = Readiness),
        (status = 503, description = "No pool takes work, or shutting down", body = Readiness, example = json!({"ready": false, "pools_ready": 0, "pools": 1, "shutting_down": true})),
    )
)]
pub async fn readyz(State(state): State<SharedState>) -> (StatusCode, Json<Readiness>) {
    let pools = state.pools.all();
    let pools_ready = pools
        .iter()
        .filter(|p| {
            let s = p.snapshot();
            s.accepts_work && s.engine_alive
        })
        .count();
    let shutting_down = state.is_shutting_down();
    let ready = pools_ready > 0 && !shutting_down;
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = Readiness {
        ready,
        pools_ready: pools_ready as u32,
        pools: pools.len() as u32,
        shutting_down,
    };
    (code, Json(body))
}
