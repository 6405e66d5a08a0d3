//! `/engines`: pools seen as Kolosal engines — add (load a GGUF as a new pool), list, status,
//! remove (drain, then forget).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use contracts::ErrorCode;
use pool_manager::candle::{self, DeviceChoice};
use pool_manager::{EngineConfig, Pool, PoolSnapshot, PoolSpec, PoolState};
use serde::Deserialize;

use super::types::*;
use crate::app_state::SharedState;
use crate::error::openai::{ErrorBody, OpenAiError};
use crate::error::ApiError;
use crate::json_body::JsonBody;

/// An engine's status word: `loaded` when it serves, `unloaded` when it failed to load, else
/// the pool state.
pub fn status_word(state: PoolState) -> String {
    match state {
        PoolState::Ready => "loaded".into(),
        PoolState::Unready => "unloaded".into(),
        other => other.as_str().into(),
    }
}

const MIB: f64 = 1024.0 * 1024.0;

fn parameters(pool: &Pool, snap: &PoolSnapshot) -> EngineParameters {
    let spec = pool.spec();
    EngineParameters {
        n_ctx: snap.descriptor.as_ref().map_or(spec.ctx, |d| d.ctx_max),
        n_gpu_layers: snap
            .descriptor
            .as_ref()
            .map_or(0, |d| d.layers_on_accelerator),
        main_gpu_id: match &spec.engine {
            EngineConfig::Local(candle::Settings {
                device: DeviceChoice::Cuda(n),
                ..
            }) => *n,
            _ => 0,
        },
    }
}

fn model_path(pool: &Pool, snap: &PoolSnapshot) -> String {
    snap.descriptor
        .as_ref()
        .map_or_else(|| pool.spec().model_ref.clone(), |d| d.model_ref.clone())
}

fn engine_or_404(state: &SharedState, id: &str) -> Result<Arc<Pool>, ApiError> {
    state
        .pools
        .get(id)
        .ok_or_else(|| ApiError::not_found("engine", id))
}

fn check_enabled(state: &SharedState) -> Result<(), ApiError> {
    if state.cfg.engines_api.enabled {
        Ok(())
    } else {
        Err(ApiError::conflict(
            "adding and removing engines is disabled by configuration (engines_api.enabled)",
        ))
    }
}

fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// Load a GGUF as a new engine (a pool with the configured slots): 201 once it is loaded and
/// has passed its self-test.
#[utoipa::path(
    post, operation_id = "addEngine", path = "/engines", tag = "engines",
    request_body = AddEngine,
    responses(
        (status = 201, description = "Loaded and self-tested; chat to it with `model` = `engine_id`", body = EngineCreated),
        (status = 400, description = "Missing file, not a GGUF, unloadable model, or bad parameters", body = ErrorBody, example = crate::examples::openai_bad_model_file),
        (status = 409, description = "The id exists, the engine limit is reached, or the API is disabled", body = ErrorBody, example = crate::examples::openai_conflict),
    )
)]
pub async fn add(
    State(state): State<SharedState>,
    body: Result<JsonBody<AddEngine>, ApiError>,
) -> Result<Response, OpenAiError> {
    let JsonBody(req) = body?;
    check_enabled(&state)?;
    let api = &state.cfg.engines_api;
    if !valid_id(&req.engine_id) {
        return Err(ApiError::invalid(
            "engine_id",
            "engine_id must be 1-64 characters of A-Z a-z 0-9 . _ : -",
        )
        .into());
    }
    let n_ctx = req.n_ctx.unwrap_or(api.default_n_ctx);
    if !(128..=api.max_n_ctx).contains(&n_ctx) {
        return Err(ApiError::invalid(
            "n_ctx",
            format!("n_ctx must be within [128, {}]", api.max_n_ctx),
        )
        .into());
    }
    if state.pools.get(&req.engine_id).is_some() {
        return Err(conflict_id(&req.engine_id).into());
    }
    if state.pools.all().iter().any(|p| p.serves(&req.engine_id)) {
        let mut e = ApiError::conflict(format!(
            "engine id {:?} is already the name or alias of a served model",
            req.engine_id
        ));
        e.envelope.field = Some("engine_id".into());
        return Err(e.into());
    }
    let allowed =
        crate::routes::pools::allowed_model(&state, "model_path", &req.model_path).await?;
    if state.pools.all().len() >= api.max_pools {
        return Err(ApiError::conflict(format!(
            "engine limit reached ({} engines, engines_api.max_pools)",
            api.max_pools
        ))
        .into());
    }
    let gpu = req.n_gpu_layers.unwrap_or(100) > 0 && DeviceChoice::cuda_built();
    let settings = candle::Settings {
        threads: api.threads,
        device: if gpu {
            DeviceChoice::Cuda(req.main_gpu_id.unwrap_or(0))
        } else {
            DeviceChoice::Cpu
        },
        prompt_cache_bytes: api.prompt_cache_mib << 20,
        ..Default::default()
    };
    let spec = PoolSpec::local(
        &req.engine_id,
        &allowed,
        Some(&req.engine_id),
        api.slots,
        n_ctx,
        settings,
    );
    let pool = state
        .pools
        .add(spec)
        .map_err(|_| conflict_id(&req.engine_id))?;
    // a server-owned job: a client that goes away does not leave the engine loading; it is
    // added or removed again, and its status shows which
    let job = {
        let (state, pool, id) = (state.clone(), pool.clone(), req.engine_id.clone());
        tokio::spawn(async move {
            let r = pool.load_once().await;
            if r.is_err() {
                state.pools.remove(&id);
            }
            state.wake.notify_one();
            r
        })
    };
    let loaded = job
        .await
        .map_err(|e| ApiError::internal(format!("the load job failed: {e}")))?;
    if let Err(why) = loaded {
        return Err(
            ApiError::invalid("model_path", format!("cannot load the model: {why}")).into(),
        );
    }
    let snap = pool.snapshot();
    tracing::info!(engine = %req.engine_id, path = %allowed, "engine added");
    Ok((
        StatusCode::CREATED,
        Json(EngineCreated {
            engine_id: req.engine_id,
            status: status_word(snap.state),
            model_path: model_path(&pool, &snap),
            parameters: parameters(&pool, &snap),
        }),
    )
        .into_response())
}

fn conflict_id(id: &str) -> ApiError {
    let mut e = ApiError::conflict(format!("engine {id:?} already exists"));
    e.envelope.field = Some("engine_id".into());
    e
}

/// Every engine (every pool, config ones included).
#[utoipa::path(
    get, operation_id = "listEngines", path = "/engines", tag = "engines",
    responses((status = 200, description = "All engines", body = EngineList))
)]
pub async fn list(State(state): State<SharedState>) -> Json<EngineList> {
    let engines = state
        .pools
        .all()
        .iter()
        .map(|p| {
            let snap = p.snapshot();
            EngineSummary {
                engine_id: snap.id.clone(),
                status: status_word(snap.state),
                model_path: model_path(p, &snap),
            }
        })
        .collect();
    Json(EngineList { engines })
}

/// Parameters, memory use and recent performance of one engine.
#[utoipa::path(
    get, operation_id = "getEngineStatus", path = "/engines/{engine_id}/status", tag = "engines",
    params(("engine_id" = String, Path, description = "Engine (pool) id")),
    responses(
        (status = 200, description = "Status", body = EngineStatus),
        (status = 404, description = "Unknown engine", body = ErrorBody, example = crate::examples::openai_engine_not_found),
    )
)]
pub async fn status(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> Result<Json<EngineStatus>, OpenAiError> {
    let pool = engine_or_404(&state, &id)?;
    let snap = pool.snapshot();
    let (weights, kv) = match &snap.descriptor {
        Some(d) => (d.weights_bytes, d.kv_cache_bytes),
        None => (0, 0),
    };
    Ok(Json(EngineStatus {
        engine_id: snap.id.clone(),
        status: status_word(snap.state),
        model_path: model_path(&pool, &snap),
        parameters: parameters(&pool, &snap),
        memory_usage: MemoryUsage {
            model_size_mb: round1(weights as f64 / MIB),
            context_size_mb: round1(kv as f64 / MIB),
        },
        performance: Performance {
            last_inference_tps: snap.last_tokens_per_s.map(round1),
            total_requests: snap.tasks_started,
        },
        slots: snap.slots_total,
        slots_busy: snap.slots_busy,
        last_error: snap.last_error.clone(),
    }))
}

fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveQuery {
    /// How long running tasks may finish before they end `POOL_UNREADY` (retriable).
    pub deadline_ms: Option<u64>,
}

/// Longest drain deadline a remove may ask for.
const MAX_REMOVE_DEADLINE_MS: u64 = 600_000;

/// Drain the engine (no new tasks; running ones get until the deadline), then remove it. Tasks
/// still queued for it end `POOL_UNREADY` unless another engine serves their model.
#[utoipa::path(
    delete, operation_id = "removeEngine", path = "/engines/{engine_id}", tag = "engines",
    params(
        ("engine_id" = String, Path, description = "Engine (pool) id"),
        ("deadline_ms" = Option<u64>, Query, maximum = 600000, description = "Drain deadline (default from config, at most 600000)"),
    ),
    responses(
        (status = 200, description = "Drained and removed", body = EngineRemoved),
        (status = 400, description = "Bad deadline", body = ErrorBody, example = crate::examples::openai_invalid),
        (status = 404, description = "Unknown engine", body = ErrorBody, example = crate::examples::openai_engine_not_found),
        (status = 409, description = "The API is disabled", body = ErrorBody, example = crate::examples::openai_conflict),
    )
)]
pub async fn remove(
    State(state): State<SharedState>,
    Path(id): Path<String>,
    query: Result<Query<RemoveQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<EngineRemoved>, OpenAiError> {
    let Query(q) = query.map_err(|e| ApiError::invalid("deadline_ms", e.body_text()))?;
    check_enabled(&state)?;
    let deadline_ms = q
        .deadline_ms
        .unwrap_or(state.cfg.engines_api.remove_deadline_ms);
    if deadline_ms > MAX_REMOVE_DEADLINE_MS {
        return Err(ApiError::invalid(
            "deadline_ms",
            format!("deadline_ms must be at most {MAX_REMOVE_DEADLINE_MS}"),
        )
        .into());
    }
    let pool = engine_or_404(&state, &id)?;
    let deadline = Duration::from_millis(deadline_ms);
    // not serving (loading, failed, drained): nothing to drain
    if pool.drain(deadline).is_ok() || pool.state() == PoolState::Draining {
        state.wake.notify_one();
        // running tasks are ended at the deadline; give them a moment to hand back their slots
        let give_up = Instant::now() + deadline + Duration::from_secs(5);
        while pool.state() == PoolState::Draining && Instant::now() < give_up {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    if state.pools.remove(&id).is_none() {
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("engine {id:?} was removed meanwhile"),
            false,
        )
        .into());
    }
    state.wake.notify_one();
    tracing::info!(engine = %id, "engine removed");
    Ok(Json(EngineRemoved {
        engine_id: id,
        status: "removed",
    }))
}
