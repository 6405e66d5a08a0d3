//! Control plane for remote workers: list, drain, ask for a model refresh.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use contracts::worker::{ServerToWorker, WorkerInfo, WorkerList};
use contracts::{DrainRequest, ErrorCode, ErrorEnvelope};

use crate::cluster::worker_control::WorkerAction;
use crate::error::ApiError;
use crate::examples;
use crate::json_body::JsonBody;
use crate::remote_workers::{pool_id, WorkerLink};

/// `GET /v1/worker/connect`: a worker's WebSocket (`remote_workers::connect`), given the
/// server as its host.
pub async fn connect(
    State(state): State<SharedState>,
    q: axum::extract::Query<crate::remote_workers::ConnectQuery>,
    headers: axum::http::HeaderMap,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    ws: Result<
        axum::extract::ws::WebSocketUpgrade,
        axum::extract::ws::rejection::WebSocketUpgradeRejection,
    >,
) -> axum::response::Response {
    crate::remote_workers::connect(state, q, headers, peer, ws).await
}
use crate::app_state::{AppState, SharedState};

/// A worker connected here, as `/v1/workers` lists it.
pub fn info(state: &AppState, link: &WorkerLink) -> WorkerInfo {
    let models = link.models();
    WorkerInfo {
        worker_id: link.id.clone(),
        worker_name: link.name.clone(),
        protocol_version: link.protocol_version.clone(),
        pools: models.iter().map(|m| pool_id(&link.id, m)).collect(),
        models,
        max_concurrent: link.max_concurrent as u32,
        in_flight: link.in_flight() as u32,
        current_load: link.load() as u32,
        draining: link.is_draining(),
        replica: state.cluster.get().map(|c| c.replica().to_string()),
    }
}

/// Applies `action` to a worker connected here (asked here, or by another replica).
pub fn apply(state: &AppState, link: &WorkerLink, action: &WorkerAction) -> WorkerInfo {
    match action {
        WorkerAction::Drain { deadline_ms } => {
            crate::remote_workers::drain(
                state,
                link,
                "drain requested",
                Duration::from_millis(*deadline_ms),
            );
            state.wake.notify_one();
        }
        WorkerAction::ModelsRefresh => {
            link.send(ServerToWorker::ModelsRefresh {
                reason: Some("requested".into()),
            });
        }
    }
    info(state, link)
}

/// Applies `action` to worker `id`, here or (in a cluster) where it is connected.
async fn act(state: &AppState, id: &str, action: WorkerAction) -> Result<WorkerInfo, ApiError> {
    if let Some(link) = state.workers.get(id) {
        return Ok(apply(state, &link, &action));
    }
    let not_found = || ApiError::not_found("worker", id);
    let Some(cluster) = state.cluster.get() else {
        return Err(not_found());
    };
    // only a worker the directory lists is asked for
    let listed = cluster
        .directory()
        .other_workers()
        .iter()
        .any(|w| w.worker_id == id);
    if !listed {
        return Err(not_found());
    }
    match cluster.control_worker(id, &action).await {
        Ok(Some(info)) => Ok(info),
        Ok(None) => Err(not_found()),
        Err(e) => Err(ApiError::new(
            ErrorCode::ClusterUnavailable,
            format!("the request could not reach the worker's replica: {e}"),
            true,
        )
        .with_retry_after(1000)),
    }
}

/// The connected workers (in a cluster, every live replica's).
#[utoipa::path(
    get, operation_id = "listWorkers", path = "/v1/workers", tag = "control",
    responses((status = 200, description = "Every registered worker (in a cluster, every live replica's)", body = WorkerList))
)]
pub async fn list(State(state): State<SharedState>) -> Json<WorkerList> {
    let mut workers: Vec<WorkerInfo> = state
        .workers
        .list()
        .iter()
        .map(|l| info(&state, l))
        .collect();
    if let Some(c) = state.cluster.get() {
        workers.extend(c.directory().other_workers());
    }
    Json(WorkerList { workers })
}

/// Drain a worker: `graceful_shutdown`, no new work, its socket closes once its requests end.
#[utoipa::path(
    post, operation_id = "drainWorker", path = "/v1/workers/{id}/drain", tag = "control",
    params(("id" = String, Path, description = "Worker id")),
    request_body(content = DrainRequest, example = json!({"deadline_ms": 30000})),
    responses(
        (status = 202, description = "Draining", body = WorkerInfo),
        (status = 400, description = "Bad body", body = ErrorEnvelope, example = examples::invalid_params),
        (status = 404, description = "Unknown worker", body = ErrorEnvelope, example = examples::not_found),
        (status = 503, description = "In a cluster: the replica holding the worker could not be reached", body = ErrorEnvelope, example = examples::cluster_unavailable),
    )
)]
pub async fn drain(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<DrainRequest>,
) -> Result<(StatusCode, Json<WorkerInfo>), ApiError> {
    let action = WorkerAction::Drain {
        deadline_ms: req.deadline_ms,
    };
    Ok((StatusCode::ACCEPTED, Json(act(&state, &id, action).await?)))
}

/// Ask a worker to report its models again (`models_refresh`).
#[utoipa::path(
    post, operation_id = "refreshWorkerModels", path = "/v1/workers/{id}/models_refresh", tag = "control",
    params(("id" = String, Path, description = "Worker id")),
    responses(
        (status = 202, description = "Asked; its `models_update` updates its pools", body = WorkerInfo),
        (status = 404, description = "Unknown worker", body = ErrorEnvelope, example = examples::not_found),
        (status = 503, description = "In a cluster: the replica holding the worker could not be reached", body = ErrorEnvelope, example = examples::cluster_unavailable),
    )
)]
pub async fn refresh(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<WorkerInfo>), ApiError> {
    let action = WorkerAction::ModelsRefresh;
    Ok((StatusCode::ACCEPTED, Json(act(&state, &id, action).await?)))
}
