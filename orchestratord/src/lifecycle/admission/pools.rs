//! Which pools a task may run on: the pinned one, or those serving its model — a model of the
//! folder no pool serves starts loading here, and the task then waits for its load.

use std::sync::Arc;

use contracts::{ErrorCode, TaskRequest};
use pool_manager::Pool;

use crate::error::ApiError;
use crate::lifecycle::state::SharedLifecycle;

/// The pools a task may run on.
pub(super) struct Resolved {
    pub(super) pools: Vec<Arc<Pool>>,
    /// The predicted wait for their load when every one of them is still loading (`pools` is
    /// empty then: the task waits in the queue for them).
    pub(super) load_wait_ms: u64,
    /// The model asked for, or the default pool's (unpinned tasks).
    pub(super) model: Option<String>,
}

/// Picks the pools a task may run on: the pinned one, or those serving the model.
fn resolve_pools(state: &SharedLifecycle, req: &TaskRequest) -> Result<Resolved, ApiError> {
    let all = state.pools.all();
    if let Some(pin) = &req.pool_id {
        if !state.cfg.admission.pinning_enabled {
            return Err(ApiError::invalid(
                "pool_id",
                "pinning to a pool is disabled by policy",
            ));
        }
        // seed 003 OC-CTRL-2014: a deterministic INVALID_PARAMS for an unknown pool
        let Some(pool) = all.into_iter().find(|p| p.id() == pin) else {
            if elsewhere(state, Some(pin), "") {
                // another replica's pool: the task waits in its queue for it
                return Ok(Resolved {
                    pools: Vec::new(),
                    load_wait_ms: 0,
                    model: req.model.clone(),
                });
            }
            return Err(ApiError::invalid(
                "pool_id",
                format!("pool_id {pin:?} names no pool of this server"),
            ));
        };
        if let Some(m) = &req.model {
            if !pool.serves(m) {
                return Err(ApiError::invalid(
                    "model",
                    format!("pool {pin:?} does not serve model {m:?}"),
                )
                .with_pool(pin));
            }
        }
        if !pool.accepts_work() {
            // a pool still loading says when it is predicted to serve
            let retry = state
                .models_port
                .load_wait_ms(std::slice::from_ref(&pool), state.started_at)
                .max(1000);
            return Err(ApiError::new(
                ErrorCode::PoolUnready,
                format!("pool {pin:?} is {}", pool.state().as_str()),
                true,
            )
            .with_pool(pin)
            .with_retry_after(retry));
        }
        return Ok(Resolved {
            pools: vec![pool],
            load_wait_ms: 0,
            model: req.model.clone(),
        });
    }
    // an embedding task naming no model: the first pool whose model embeds (an encoder
    // before a decoder), else the default pool's
    let embedding_pool = || {
        let embeds = |p: &&Arc<Pool>| {
            p.engine()
                .is_some_and(|e| e.descriptor().embedding.is_some())
        };
        let encoder = |p: &&Arc<Pool>| p.engine().is_some_and(|e| !e.descriptor().generates);
        all.iter()
            .filter(embeds)
            .find(encoder)
            .or_else(|| all.iter().find(embeds))
            .map(|p| p.spec().model_alias.clone())
    };
    let chosen = match (&req.model, req.embed.is_some()) {
        (Some(m), _) => Some(m.clone()),
        (None, true) => embedding_pool(),
        (None, false) => None,
    };
    let model = match chosen {
        Some(m) => m,
        None => state
            .cfg
            .pools
            .first()
            .and_then(|p| state.pools.get(&p.id))
            .or_else(|| all.first().cloned())
            .map(|p| p.spec().model_alias.clone())
            .ok_or_else(|| ApiError::new(ErrorCode::PoolUnavailable, "no pools", true))?,
    };
    let serving: Vec<Arc<Pool>> = all.into_iter().filter(|p| p.serves(&model)).collect();
    // remote workers here, or any pool of another replica, serve it: the task waits for one
    let from_workers = state.workers_port.knows_model(&model) || elsewhere(state, None, &model);
    if serving.is_empty() {
        if from_workers {
            // a model remote workers serve: the task waits for one (queue timeout)
            return Ok(Resolved {
                pools: Vec::new(),
                load_wait_ms: 0,
                model: Some(model),
            });
        }
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("no pool serves model {model:?}"),
            false,
        )
        .with_field("model"));
    }
    // a pool loading (a configured one at start-up, a model of the folder on demand): the
    // task waits in the queue for it, the load in its predicted start
    let loading = serving
        .iter()
        .any(|p| p.state() == pool_manager::PoolState::Loading);
    let load_wait = state.models_port.load_wait_ms(&serving, state.started_at);
    let ready: Vec<Arc<Pool>> = serving.into_iter().filter(|p| p.accepts_work()).collect();
    if ready.is_empty() && loading {
        return Ok(Resolved {
            pools: Vec::new(),
            load_wait_ms: load_wait,
            model: Some(model),
        });
    }
    if ready.is_empty() && !from_workers {
        return Err(ApiError::new(
            ErrorCode::PoolUnavailable,
            format!("no pool serving {model:?} is ready"),
            true,
        )
        .with_retry_after(1000));
    }
    Ok(Resolved {
        pools: ready,
        load_wait_ms: 0,
        model: Some(model),
    })
}

/// Whether, in a cluster, another replica has a pool that takes tasks pinned to `pin`, or
/// else of `model`.
fn elsewhere(state: &SharedLifecycle, pin: Option<&str>, model: &str) -> bool {
    state
        .cluster_tasks
        .get()
        .is_some_and(|path| path.serves_elsewhere(pin, model))
}

/// The largest context of `pools`, as their loaded engines or their specs say (`None` when
/// no pool says).
pub(super) fn context_of(pools: &[Arc<Pool>]) -> Option<usize> {
    pools
        .iter()
        .filter_map(|p| {
            p.engine()
                .map(|e| e.descriptor().ctx_max)
                .or(Some(p.spec().ctx))
                .filter(|c| *c > 0)
        })
        .max()
}

/// Resolves the pools of `req`: a model of the folder no pool serves starts loading (the
/// task waits for it, as for a configured pool still loading at start-up), unless the
/// client's deadline comes before the load is predicted to end (503 with that wait).
pub(super) async fn resolve(
    state: &SharedLifecycle,
    req: &TaskRequest,
) -> Result<Resolved, ApiError> {
    let folder_wait_ms = match req.model.as_deref().filter(|_| req.pool_id.is_none()) {
        Some(model) => state.models_port.ensure(model).await?,
        None => 0,
    };
    let mut resolved = resolve_pools(state, req)?;
    resolved.load_wait_ms = resolved.load_wait_ms.max(folder_wait_ms);
    let load_wait_ms = resolved.load_wait_ms;
    if req.deadline_ms.is_some_and(|d| d < load_wait_ms) {
        return Err(ApiError::new(
            ErrorCode::PoolUnavailable,
            format!("the model is loading: about {load_wait_ms} ms, past the task's deadline"),
            true,
        )
        .with_retry_after(load_wait_ms));
    }
    Ok(resolved)
}

/// In a cluster: whether another replica's pool that could run the task confirmed its pace
/// on a real task (what refuses a limit for good, as this replica's own pools would).
pub(super) fn confirmed_elsewhere(
    state: &SharedLifecycle,
    req: &TaskRequest,
    r: &Resolved,
) -> bool {
    state.cluster_tasks.get().is_some_and(|path| {
        let model = r.model.as_deref().unwrap_or("");
        path.pace_confirmed_elsewhere(req.pool_id.as_deref(), model)
    })
}
