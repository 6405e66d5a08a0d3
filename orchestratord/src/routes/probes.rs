//! Kubernetes probes. `/livez`: the process answers HTTP (no pool state: a pod whose pools are
//! loading or drained on purpose must not be restarted). `/readyz`: it should get traffic — a
//! pool takes work, the server is not shutting down and, in a cluster, the replica reaches
//! its NATS cluster (else 503 `cluster_unavailable`); while the pools load, 503 `loading`
//! with each pool's progress. Both answer from the server's first second (the pools load
//! behind it) and need no key.

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use contracts::{PoolReadiness, Readiness};

use crate::app_state::SharedState;

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
        (status = 503, description = "No pool takes work (loading, or none will), or shutting down", body = Readiness, example = json!({"ready": false, "status": "shutting_down", "pools_ready": 1, "pools": 1, "shutting_down": true, "pool_states": [{"pool_id": "default", "state": "ready"}]})),
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
    // a replica takes traffic only while it reaches its cluster (its queues and relay)
    let cluster_down =
        state.cfg.cluster.enabled() && !state.cluster.get().is_some_and(|c| c.connected());
    let ready = pools_ready > 0 && !shutting_down && !cluster_down;
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let pool_states: Vec<PoolReadiness> = pools
        .iter()
        .map(|p| {
            let progress = state.models_folder.load_progress(p, state.started_at);
            PoolReadiness {
                pool_id: p.id().to_string(),
                state: p.state().as_str().to_string(),
                loading_ms: progress.map(|(spent, _)| spent),
                predicted_load_ms: progress.map(|(_, left)| left),
            }
        })
        .collect();
    let status = if shutting_down {
        "shutting_down"
    } else if cluster_down {
        "cluster_unavailable"
    } else if ready {
        "ready"
    } else if pool_states.iter().any(|p| p.loading_ms.is_some()) {
        "loading"
    } else {
        "unavailable"
    };
    let body = Readiness {
        ready,
        status: status.to_string(),
        pools_ready: pools_ready as u32,
        pools: pools.len() as u32,
        shutting_down,
        pool_states,
    };
    (code, Json(body))
}
