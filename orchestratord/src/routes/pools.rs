//! Control plane: `/v1/pools`, health, drain, resume, reload.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use contracts::{
    DrainRequest, ErrorEnvelope, PoolHealth, PoolList, PoolMetrics, ReloadRequest, ReloadResponse,
};
use pool_manager::{Pool, PoolError, PoolState};

use crate::app_state::SharedState;
use crate::error::ApiError;
use crate::examples;
use crate::json_body::JsonBody;

/// A pool of this process, as `/v1/pools` lists it (and the cluster's directory announces it).
pub(crate) fn health_of(state: &SharedState, pool: &Arc<Pool>) -> PoolHealth {
    let s = pool.snapshot();
    let d = s.descriptor.clone();
    let queue_depth = state.queued_for(pool);
    PoolHealth {
        pool_id: s.id.clone(),
        kind: pool.spec().kind().to_string(),
        live: s.engine_alive,
        ready: s.accepts_work && s.engine_alive,
        draining: matches!(s.state, PoolState::Draining),
        state: s.state.as_str().to_string(),
        model_ref: d
            .as_ref()
            .map(|d| d.model_ref.clone())
            .unwrap_or_else(|| pool.spec().model_ref.clone()),
        model_alias: Some(pool.spec().model_alias.clone()),
        engine: d.as_ref().map(|d| d.engine.clone()).unwrap_or_default(),
        engine_version: d
            .as_ref()
            .map(|d| d.engine_version.clone())
            .unwrap_or_default(),
        slots_total: s.slots_total as u32,
        slots_free: s.slots_free() as u32,
        queue_depth: queue_depth as u32,
        last_error: s.last_error.clone(),
        metrics: PoolMetrics {
            slots_busy: s.slots_busy as u32,
            tasks_started: s.tasks_started,
            tasks_finished: s.tasks_finished,
            reloads_ok: s.reloads_ok,
            reloads_failed: s.reloads_failed,
            restarts: s.restarts,
            model_load_ms: s.model_load_ms,
            service_ms_ewma: s.service_ms_ewma.map(|v| v.round() as u64),
            consecutive_failures: s.consecutive_failures,
            circuit_open: s.circuit_open(),
            deadline_remaining_ms: s.drain_deadline_remaining_ms,
            drain_cut_off: s.drain_cut_off,
            prompt_tokens_reused: s.prompt_tokens_reused,
            prompt_tokens: s.prompt_tokens_taken,
            prompt_cache_bytes: s.prompt_cache_bytes,
        },
        on_demand: state.models_folder.on_demand(pool),
        replica: state.cluster.get().map(|c| c.replica().to_string()),
    }
}

fn pool_or_404(state: &SharedState, id: &str) -> Result<Arc<Pool>, ApiError> {
    state
        .pools
        .get(id)
        .ok_or_else(|| ApiError::not_found("pool", id))
}

/// All pools with their health.
#[utoipa::path(
    get, operation_id = "listPools", path = "/v1/pools", tag = "control",
    responses((status = 200, description = "Every pool's health (in a cluster, every live replica's pools)", body = PoolList))
)]
pub async fn list(State(state): State<SharedState>) -> Json<PoolList> {
    let mut pools: Vec<PoolHealth> = state
        .pools
        .all()
        .iter()
        .map(|p| health_of(&state, p))
        .collect();
    // in a cluster, then every other live replica's, as each last announced them
    if let Some(c) = state.cluster.get() {
        pools.extend(c.directory().others());
    }
    Json(PoolList { pools })
}

/// One pool's liveness, readiness, drain state and metrics.
#[utoipa::path(
    get, operation_id = "getPoolHealth", path = "/v1/pools/{id}/health", tag = "control",
    params(("id" = String, Path, description = "Pool id")),
    responses(
        (status = 200, description = "Health", body = PoolHealth),
        (status = 404, description = "Unknown pool", body = ErrorEnvelope, example = examples::not_found),
    )
)]
pub async fn health(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Json<PoolHealth>, ApiError> {
    let pool = pool_or_404(&state, &id)?;
    Ok(Json(health_of(&state, &pool)))
}

fn conflict(e: PoolError, pool: &str) -> ApiError {
    ApiError::conflict(e.to_string()).with_pool(pool)
}

/// Start draining: readiness flips at once, running tasks get until the deadline.
#[utoipa::path(
    post, operation_id = "drainPool", path = "/v1/pools/{id}/drain", tag = "control",
    params(("id" = String, Path, description = "Pool id")),
    request_body(content = DrainRequest, example = json!({"deadline_ms": 5000})),
    responses(
        (status = 202, description = "Draining; poll health until state is drained", body = PoolHealth),
        (status = 400, description = "Bad body", body = ErrorEnvelope, example = examples::invalid_params),
        (status = 404, description = "Unknown pool", body = ErrorEnvelope, example = examples::not_found),
        (status = 409, description = "Not allowed in the pool's state", body = ErrorEnvelope, example = examples::conflict),
    )
)]
pub async fn drain(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<DrainRequest>,
) -> Result<Response, ApiError> {
    let pool = pool_or_404(&state, &id)?;
    let deadline = Duration::from_millis(req.deadline_ms);
    pool.drain(deadline).map_err(|e| conflict(e, &id))?;
    // a remote pool's worker is drained whole: graceful_shutdown, closed once idle
    if let Some(link) = pool.spec().worker_id().and_then(|w| state.workers.get(w)) {
        crate::remote_workers::drain(state.as_ref(), &link, "drain requested", deadline);
    }
    state.wake.notify_one();
    Ok((StatusCode::ACCEPTED, Json(health_of(&state, &pool))).into_response())
}

/// Bring a pool that refuses work back into service: a draining or drained one at once; one
/// reloading from drained serves on its old model meanwhile; one loading or restarting serves
/// once its model is up (and retries its load now).
#[utoipa::path(
    post, operation_id = "resumePool", path = "/v1/pools/{id}/resume", tag = "control",
    params(("id" = String, Path, description = "Pool id")),
    responses(
        (status = 200, description = "Serving again, or will once its model is up", body = PoolHealth),
        (status = 404, description = "Unknown pool", body = ErrorEnvelope, example = examples::not_found),
        (status = 409, description = "The pool is already serving", body = ErrorEnvelope, example = examples::conflict),
    )
)]
pub async fn resume(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Json<PoolHealth>, ApiError> {
    let pool = pool_or_404(&state, &id)?;
    pool.resume().map_err(|e| conflict(e, &id))?;
    state.wake.notify_one();
    Ok(Json(health_of(&state, &pool)))
}

/// Load a new model beside the old one, self-test it, switch atomically; roll back on failure.
#[utoipa::path(
    post, operation_id = "reloadPool", path = "/v1/pools/{id}/reload", tag = "control",
    params(("id" = String, Path, description = "Pool id")),
    request_body(content = ReloadRequest, example = json!({"new_model_ref": ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"})),
    responses(
        (status = 200, description = "Switched to the new model", body = ReloadResponse),
        (status = 400, description = "Bad body", body = ErrorEnvelope, example = examples::invalid_params),
        (status = 404, description = "Unknown pool", body = ErrorEnvelope, example = examples::not_found),
        (status = 409, description = "Rolled back (the old model keeps serving) or not allowed now", body = ErrorEnvelope, example = examples::reload_rollback),
    )
)]
pub async fn reload(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<ReloadRequest>,
) -> Result<Json<ReloadResponse>, ApiError> {
    let pool = pool_or_404(&state, &id)?;
    if !pool.spec().is_local() {
        return Err(ApiError::conflict(
            "a remote pool is reloaded on its worker; this server loads nothing for it",
        )
        .with_pool(&id));
    }
    let model_ref = allowed_model(&state, "new_model_ref", &req.new_model_ref).await?;
    // a server-owned job: a client that goes away does not leave the pool reloading; the
    // outcome shows in the pool's health either way
    let job = {
        let (state, pool, model_ref) = (state.clone(), pool.clone(), model_ref.clone());
        tokio::spawn(async move {
            let r = pool.reload(&model_ref).await;
            state.wake.notify_one();
            r
        })
    };
    let load_ms = job
        .await
        .map_err(|e| ApiError::internal(format!("the reload job failed: {e}")))?
        .map_err(|e| conflict(e, &id))?;
    Ok(Json(ReloadResponse {
        pool_id: id,
        model_ref,
        load_ms,
    }))
}

/// The canonical path of the model file `requested` when it is allowed (see
/// `model_paths.rs`), else a 400 naming `field` that says only why in general terms.
pub async fn allowed_model(
    state: &SharedState,
    field: &str,
    requested: &str,
) -> Result<String, ApiError> {
    let (st, requested_owned) = (state.clone(), requested.to_string());
    let checked = tokio::task::spawn_blocking(move || st.model_dirs.check(&requested_owned))
        .await
        .map_err(|e| ApiError::internal(format!("the path check failed: {e}")))?;
    match checked {
        Ok(p) => Ok(p.to_string_lossy().into_owned()),
        // a path outside the model directories is a policy refusal, not a malformed request
        Err(
            why @ (crate::model_paths::ModelPathError::NotAllowed
            | crate::model_paths::ModelPathError::Outside { .. }),
        ) => Err(ApiError::new(
            contracts::ErrorCode::Forbidden,
            format!("{field}: {why}"),
            false,
        )
        .with_field(field)),
        Err(why) => Err(ApiError::invalid(field, format!("{field}: {why}"))),
    }
}
