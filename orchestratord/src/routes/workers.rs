//! Control plane for remote workers: list, drain, ask for a model refresh.

use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use contracts::worker::{ServerToWorker, WorkerInfo, WorkerList};
use contracts::{DrainRequest, ErrorEnvelope};

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
use crate::lifecycle::state::SharedState;

fn info(link: &WorkerLink) -> WorkerInfo {
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
    }
}

/// The connected workers.
#[utoipa::path(
    get, operation_id = "listWorkers", path = "/v1/workers", tag = "control",
    responses((status = 200, description = "Every registered worker", body = WorkerList))
)]
pub async fn list(State(state): State<SharedState>) -> Json<WorkerList> {
    Json(WorkerList {
        workers: state.workers.list().iter().map(|l| info(l)).collect(),
    })
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
    )
)]
pub async fn drain(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<DrainRequest>,
) -> Result<(StatusCode, Json<WorkerInfo>), ApiError> {
    let link = state
        .workers
        .get(&id)
        .ok_or_else(|| ApiError::not_found("worker", &id))?;
    crate::remote_workers::drain(
        state.as_ref(),
        &link,
        "drain requested",
        Duration::from_millis(req.deadline_ms),
    );
    state.wake.notify_one();
    Ok((StatusCode::ACCEPTED, Json(info(&link))))
}

/// Ask a worker to report its models again (`models_refresh`).
#[utoipa::path(
    post, operation_id = "refreshWorkerModels", path = "/v1/workers/{id}/models_refresh", tag = "control",
    params(("id" = String, Path, description = "Worker id")),
    responses(
        (status = 202, description = "Asked; its `models_update` updates its pools", body = WorkerInfo),
        (status = 404, description = "Unknown worker", body = ErrorEnvelope, example = examples::not_found),
    )
)]
pub async fn refresh(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<WorkerInfo>), ApiError> {
    let link = state
        .workers
        .get(&id)
        .ok_or_else(|| ApiError::not_found("worker", &id))?;
    link.send(ServerToWorker::ModelsRefresh {
        reason: Some("requested".into()),
    });
    Ok((StatusCode::ACCEPTED, Json(info(&link))))
}
