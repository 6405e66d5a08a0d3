//! The model folder (`models.dirs`): every GGUF there is listed, loaded or not
//! (`catalog.rs`), and with `models.on_demand` a request that names one no pool serves loads
//! it into a pool of its own — the request and those that follow wait in the queue meanwhile,
//! none lost. An on-demand pool is unloaded when it has been idle for `models.keep_alive_s`,
//! or when a load needs its memory under `models.memory_budget_mib` (least recently used idle
//! pool first). Configured pools are never unloaded (they are the pinned-resident ones).

mod catalog;
mod derive;
pub mod keep_alive;
pub mod pull;
pub mod recipe;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use catalog::{Catalog, Entry, Version as FileVersion, MAX_FILES};
use contracts::{ErrorCode, TaskRequest};
pub use derive::Creation;
use pool_manager::{candle, Pool, PoolSpec, PoolState};

use crate::config::ModelsConfig;
use crate::error::ApiError;
use crate::lifecycle::state::SharedLifecycle;
use crate::metrics;

/// How long a failed load is remembered: requests for that model meanwhile get its error at
/// once instead of loading it again (no retry loop).
const FAILED_FOR: Duration = Duration::from_secs(60);
/// The upkeep's period (idle unloads, the resident-bytes gauge).
const UPKEEP_EVERY: Duration = Duration::from_secs(1);

/// Load speed assumed before any load was timed here (file bytes a millisecond: 100 MB/s).
const DEFAULT_LOAD_BYTES_PER_MS: f64 = 100_000.0;

/// A file version and the context its recipe asks for (`num_ctx`).
type ServedKey = (FileVersion, Option<usize>);

/// An on-demand pool.
struct Owned {
    model: String,
    last_used: Instant,
    /// What it was expected to hold before its engine said (file size + KV budget).
    estimate: u64,
    /// Its file's size and when its load began (for the predicted wait).
    file_bytes: u64,
    loading_since: Instant,
    /// The last request's `keep_alive`, over `models.keep_alive_s` (MOD-FOLDER-6).
    keep_alive: Option<keep_alive::KeepAlive>,
}

pub struct ModelsFolder {
    cfg: ModelsConfig,
    /// Where a model may be loaded from: every file of the folder is checked against these
    /// before it loads (SEC-MODEL-1).
    allowed: crate::model_paths::ModelDirs,
    pub catalog: Catalog,
    /// On-demand pools by pool id. Held across no await.
    owned: Mutex<HashMap<String, Owned>>,
    failed: Mutex<HashMap<String, (Instant, String)>>,
    /// Held while one request makes room for a model and adds its pool (across no await):
    /// concurrent first requests for a model find the pool the first one added, instead of
    /// making room for a second copy (issue 49: 1-3 of 10 were refused as over the budget).
    starting: Mutex<()>,
    /// What a load of each file version would serve with a recipe's `num_ctx`
    /// ([`Self::served_context`]).
    served: Mutex<HashMap<ServedKey, Option<usize>>>,
    /// File bytes a millisecond of the last load timed here.
    load_rate: Mutex<Option<f64>>,
    /// Held by the pull or delete under way: one at a time (two pulls of one file would
    /// write one partial file).
    pub changing: tokio::sync::Mutex<()>,
}

/// The pool id of an on-demand model: `auto-` and its name, other characters as `-`.
pub fn pool_id(model: &str) -> String {
    let clean: String = model
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .take(96)
        .collect();
    format!("auto-{clean}")
}

/// `why` with the file's path said as its name only: a client is never told where the server
/// keeps its files (SEC-MODEL-1).
fn without_path(why: &str, path: &std::path::Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut out = why.replace(&path.display().to_string(), &name);
    if let Ok(c) = std::fs::canonicalize(path) {
        out = out.replace(&c.display().to_string(), &name);
    }
    out
}

/// What is left of a load predicted to take `predicted_ms` that has run `spent_ms`: the rest
/// of the prediction, and once past it — the machine is slower than the last load showed —
/// half as long again as it has taken so far, at least a second (never "1 ms" for minutes:
/// ISO-7).
/// The pools serving `model` now.
fn pools_serving(state: &SharedLifecycle, model: &str) -> Vec<Arc<Pool>> {
    state
        .pools
        .all()
        .into_iter()
        .filter(|p| p.serves(model))
        .collect()
}

fn time_left(predicted_ms: u64, spent_ms: u64) -> u64 {
    if spent_ms < predicted_ms {
        predicted_ms - spent_ms
    } else {
        (spent_ms / 2).max(1000)
    }
}

impl ModelsFolder {
    pub fn new(cfg: &ModelsConfig, allowed: crate::model_paths::ModelDirs) -> Self {
        Self {
            catalog: Catalog::new(&cfg.dirs, allowed.clone()),
            allowed,
            cfg: cfg.clone(),
            owned: Mutex::new(HashMap::new()),
            failed: Mutex::new(HashMap::new()),
            starting: Mutex::new(()),
            served: Mutex::new(HashMap::new()),
            load_rate: Mutex::new(None),
            changing: tokio::sync::Mutex::new(()),
        }
    }

    /// Where a pull writes: the first folder, within `models.disk_budget_mib`.
    pub fn puller(&self) -> Result<pull::Puller, ApiError> {
        let Some(dir) = self.catalog.first_dir() else {
            return Err(ApiError::invalid(
                "model",
                "no model folder to pull into: set models.dirs (or --models-dir)",
            ));
        };
        let budget = (self.cfg.disk_budget_mib > 0).then_some(self.cfg.disk_budget_mib << 20);
        pull::Puller::new(dir.to_path_buf(), budget).map_err(pull::PullError::into_api)
    }

    /// Removes the folder's model `name`: its on-demand pool unloaded first; a model a
    /// configured pool serves is refused (it is the operator's), as is a name not listed.
    pub fn delete(&self, state: &SharedLifecycle, name: &str) -> Result<(), ApiError> {
        let Some(entry) = self.catalog.find(name) else {
            return Err(ApiError::not_found("model", name).with_field("model"));
        };
        for pool in state.pools.all() {
            if Path::new(&pool.spec().model_ref) != entry.path {
                continue;
            }
            if !self.owns(pool.id()) {
                return Err(ApiError::conflict(format!(
                    "model {name:?} is served by the configured pool {}: take it out of the configuration first",
                    pool.id()
                )));
            }
            self.unload(state, &pool, "deleted");
        }
        std::fs::remove_file(&entry.path).map_err(|e| {
            ApiError::internal(format!("cannot remove {}: {e}", entry.path.display()))
        })?;
        if let Err(e) = recipe::remove(&entry.path) {
            tracing::warn!(model = name, error = %e, "a deleted model's recipe was left");
        }
        self.catalog.refresh();
        tracing::info!(model = name, path = %entry.path.display(), "model deleted");
        Ok(())
    }

    /// How long loading `bytes` of model file is expected to take, from the last load timed.
    fn load_ms(&self, bytes: u64) -> u64 {
        let rate = self
            .load_rate
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .unwrap_or(DEFAULT_LOAD_BYTES_PER_MS);
        (bytes as f64 / rate.max(1.0)).ceil() as u64
    }

    /// What is left of the predicted load of the pools of `serving` that are loading (0 when
    /// one is ready, or none loads).
    pub fn load_wait_ms(&self, serving: &[Arc<Pool>], started: Instant) -> u64 {
        if serving.iter().any(|p| p.state() == PoolState::Ready) {
            return 0;
        }
        serving
            .iter()
            .filter_map(|p| self.load_progress(p, started))
            .map(|(_, left)| left)
            .min()
            .unwrap_or(0)
    }

    /// A loading pool's (time spent loading, predicted time left), in ms: an on-demand pool's
    /// from when its load began, a configured one's from `started` (configured pools load at
    /// the server's start); its model file's size at the load rate last measured here.
    pub fn load_progress(&self, pool: &Pool, started: Instant) -> Option<(u64, u64)> {
        if pool.state() != PoolState::Loading {
            return None;
        }
        let (since, bytes) = match self.owned().get(pool.id()) {
            Some(o) => (o.loading_since, o.file_bytes),
            None => (
                started,
                std::fs::metadata(&pool.spec().model_ref).map_or(0, |m| m.len()),
            ),
        };
        let spent = since.elapsed().as_millis() as u64;
        Some((spent, time_left(self.load_ms(bytes), spent)))
    }

    /// A request for `model` said how long it stays loaded once idle: its on-demand pools keep
    /// that until another request says otherwise (configured pools stay loaded). False when no
    /// on-demand pool serves it.
    pub fn set_keep_alive(&self, model: &str, k: keep_alive::KeepAlive) -> bool {
        let mut any = false;
        for o in self.owned().values_mut().filter(|o| o.model == model) {
            o.keep_alive = Some(k);
            o.last_used = Instant::now();
            any = true;
        }
        any
    }

    fn owned(&self) -> std::sync::MutexGuard<'_, HashMap<String, Owned>> {
        self.owned.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When an on-demand pool unloads (`None` for any other pool).
    pub fn on_demand(&self, pool: &Pool) -> Option<contracts::OnDemand> {
        let owned = self.owned();
        let o = owned.get(pool.id())?;
        let keep = match o.keep_alive {
            Some(keep_alive::KeepAlive::Forever) => None,
            Some(keep_alive::KeepAlive::For(d)) => Some(d),
            None if self.cfg.keep_alive_s > 0 => Some(Duration::from_secs(self.cfg.keep_alive_s)),
            None => None,
        };
        let idle = pool.slots_busy() == 0 && pool.state() == PoolState::Ready;
        Some(contracts::OnDemand {
            model: o.model.clone(),
            keep_alive_s: keep.map(|d| d.as_secs()),
            unloads_in_ms: keep
                .filter(|_| idle)
                .map(|d| d.saturating_sub(o.last_used.elapsed()).as_millis() as u64),
        })
    }

    /// Whether `pool_id` is an on-demand pool.
    pub fn owns(&self, pool_id: &str) -> bool {
        self.owned().contains_key(pool_id)
    }

    /// The folder's models (none unless `on_demand`: a model that is listed can be asked
    /// for), blocking reads off the runtime.
    pub async fn entries(self: &Arc<Self>, state: &SharedLifecycle) -> Vec<Entry> {
        if !self.cfg.on_demand {
            return Vec::new();
        }
        let (s, me) = (state.clone(), self.clone());
        tokio::task::spawn_blocking(move || {
            let mut list = me.catalog.entries();
            for e in list.iter_mut().filter(|e| e.facts.is_ok()) {
                e.served_ctx = me.served_context(&s, e);
            }
            list
        })
        .await
        .unwrap_or_default()
    }

    /// The context per sequence a load of `e` would serve (blocking: its header, read once
    /// a version of the file).
    fn served_context(&self, state: &SharedLifecycle, e: &Entry) -> Option<usize> {
        let num_ctx = e.recipe().and_then(|r| r.parameters.num_ctx);
        let version = ((e.path.clone(), e.bytes, e.modified), num_ctx);
        let mut served = self.served.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ctx) = served.get(&version) {
            return *ctx;
        }
        let ctx = state.pools.served_context(&self.spec_for(e));
        if served.len() >= MAX_FILES {
            served.clear();
        }
        served.insert(version, ctx);
        ctx
    }

    /// The pool that serves the folder's model `e` on demand: the folder's settings, its
    /// recipe's template and context over them.
    fn spec_for(&self, e: &Entry) -> PoolSpec {
        let recipe = e.recipe();
        let settings = candle::Settings {
            kv_cache_max_bytes: (self.cfg.kv_cache_mib << 20) as usize,
            chat_template: recipe.and_then(|r| r.template.clone()),
            ..Default::default()
        };
        PoolSpec::local(
            &pool_id(&e.name),
            &e.path.display().to_string(),
            Some(&e.name),
            self.cfg.slots.max(1),
            recipe
                .and_then(|r| r.parameters.num_ctx)
                .unwrap_or(self.cfg.ctx),
            settings,
        )
    }

    /// The folder's model clients call `model` (by its name or the hub name it was pulled
    /// as), unless a configured pool serves that name (the operator's model: no recipe).
    pub async fn folder_entry(
        self: &Arc<Self>,
        state: &SharedLifecycle,
        model: &str,
    ) -> Option<Entry> {
        let me = self;
        if !me.cfg.on_demand || me.catalog.is_empty() {
            return None;
        }
        let configured = state
            .pools
            .all()
            .iter()
            .any(|p| p.serves(model) && !me.owns(p.id()));
        if configured {
            return None;
        }
        let me = self.clone();
        let model = model.to_string();
        tokio::task::spawn_blocking(move || me.catalog.find(&model))
            .await
            .ok()
            .flatten()
    }

    /// Gives `req` the recipe of the folder's model it names: the model's own name for a hub
    /// name it was pulled as, and the recipe's defaults where the request says nothing.
    pub async fn apply_recipe(self: &Arc<Self>, state: &SharedLifecycle, req: &mut TaskRequest) {
        if req.pool_id.is_some() {
            return;
        }
        let Some(model) = req.model.as_deref() else {
            return;
        };
        let Some(entry) = self.folder_entry(state, model).await else {
            return;
        };
        req.model = Some(entry.name.clone());
        if let Some(recipe) = entry.recipe() {
            recipe.apply(req);
        }
    }

    /// Makes sure a request for `model` has a pool to wait for: when no pool serves it and the
    /// folder has it, an on-demand pool starts loading (room made under the budget first).
    /// Returns the predicted wait for its load (0: a pool serving it is ready, or none is
    /// ours). Errors: the model failed to load a moment ago (400 naming `model`, its reason);
    /// the budget cannot make room because the other models are busy (503, retriable).
    pub async fn ensure(
        self: &Arc<Self>,
        state: &SharedLifecycle,
        model: &str,
    ) -> Result<u64, ApiError> {
        let me = self;
        if !me.cfg.on_demand || me.catalog.is_empty() {
            return Ok(0);
        }
        let serving = pools_serving(state, model);
        if !serving.is_empty() {
            let mut owned = me.owned();
            for p in &serving {
                if let Some(o) = owned.get_mut(p.id()) {
                    o.last_used = Instant::now();
                }
            }
            drop(owned);
            return Ok(me.load_wait_ms(&serving, state.started_at));
        }
        if let Some((at, why)) = me
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(model)
            .cloned()
        {
            if at.elapsed() < FAILED_FOR {
                return Err(ApiError::invalid(
                    "model",
                    format!("model {model:?} cannot be loaded: {why}"),
                ));
            }
        }
        let folder = self.clone();
        let name = model.to_string();
        let Some(entry) = tokio::task::spawn_blocking(move || folder.catalog.find(&name))
            .await
            .ok()
            .flatten()
        else {
            return Ok(0);
        };
        // the one check of every file that becomes a model (SEC-MODEL-1): inside the model
        // folders once links are resolved, a regular file, a GGUF
        if let Err(e) = me.allowed.check(&entry.path.display().to_string()) {
            tracing::warn!(model, path = %entry.path.display(), error = %e, "a model of the folder refused");
            return Err(ApiError::invalid(
                "model",
                format!("model {model:?} cannot be loaded: {e}"),
            ));
        }
        if let Some(Err(why)) = &entry.recipe {
            tracing::warn!(model, path = %entry.path.display(), error = %why, "a model's recipe cannot be read");
            return Err(ApiError::invalid(
                "model",
                format!("model {model:?} cannot be loaded: {why}"),
            ));
        }
        if let Err(why) = &entry.facts {
            tracing::warn!(model, path = %entry.path.display(), error = %why, "a model of the folder cannot be read");
            return Err(ApiError::invalid(
                "model",
                format!(
                    "model {model:?} cannot be loaded: {}",
                    without_path(why, &entry.path)
                ),
            ));
        }
        let estimate = entry.bytes + (me.cfg.kv_cache_mib << 20);
        let starting = me.starting.lock().unwrap_or_else(|p| p.into_inner());
        // another request for it started its pool while this one read the folder: that load
        // is the one to wait for
        let serving = pools_serving(state, model);
        if !serving.is_empty() {
            return Ok(me.load_wait_ms(&serving, state.started_at));
        }
        me.make_room(state, estimate, model)?;
        let id = pool_id(&entry.name);
        let spec = me.spec_for(&entry);
        let pool = match state.pools.add(spec) {
            Ok(p) => p,
            // another request for it got here first
            Err(_) => return Ok(me.load_ms(entry.bytes)),
        };
        me.owned().insert(
            id.clone(),
            Owned {
                model: model.to_string(),
                last_used: Instant::now(),
                estimate,
                file_bytes: entry.bytes,
                loading_since: Instant::now(),
                keep_alive: None,
            },
        );
        drop(starting);
        let wait = me.load_ms(entry.bytes);
        let file_bytes = entry.bytes;
        tracing::info!(model, pool = %id, path = %entry.path.display(), "loading a model of the folder on demand");
        let (s, folder) = (state.clone(), self.clone());
        let (model, path) = (model.to_string(), entry.path.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            match pool.load_once().await {
                Ok(()) => {
                    let ms = started.elapsed().as_millis().max(1) as f64;
                    *folder.load_rate.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(file_bytes as f64 / ms);
                    metrics::model_loaded(&model, "ok");
                    tracing::info!(
                        model,
                        ms = started.elapsed().as_millis() as u64,
                        "model loaded on demand"
                    );
                }
                Err(why) => {
                    metrics::model_loaded(&model, "failed");
                    tracing::warn!(model, %why, "a model of the folder failed to load");
                    folder
                        .failed
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(
                            model,
                            (Instant::now(), without_path(&why.to_string(), &path)),
                        );
                    // its waiting tasks end: no pool serves the model any more
                    s.pools.remove(&id);
                    folder.owned().remove(&id);
                }
            }
            s.wake.notify_one();
        });
        Ok(wait)
    }

    /// What an on-demand pool holds: its engine's weights and KV cache, or the estimate while
    /// it loads.
    fn resident(pool: &Pool, estimate: u64) -> u64 {
        match pool.engine() {
            Some(e) => {
                let d = e.descriptor();
                d.weights_bytes + d.kv_cache_bytes
            }
            None => estimate,
        }
    }

    /// What the pools of this process that are not on demand hold (configured pools and
    /// engines added over the API): they count in the budget and are pinned resident — the
    /// budget never unloads them. A pool still loading counts its model file.
    fn pinned_bytes(pools: &[Arc<Pool>], owned: &HashMap<String, Owned>) -> u64 {
        pools
            .iter()
            .filter(|p| p.spec().is_local() && !owned.contains_key(p.id()))
            .map(|p| {
                let file = || std::fs::metadata(&p.spec().model_ref).map_or(0, |m| m.len());
                match p.engine() {
                    Some(_) => Self::resident(p, 0),
                    None => file(),
                }
            })
            .sum()
    }

    /// Unloads idle on-demand pools, least recently used first, until `need` more bytes fit
    /// the budget beside the pinned pools.
    fn make_room(
        &self,
        state: &SharedLifecycle,
        need: u64,
        for_model: &str,
    ) -> Result<(), ApiError> {
        let budget = self.cfg.memory_budget_mib << 20;
        if budget == 0 {
            return Ok(());
        }
        if need > budget {
            return Err(ApiError::invalid(
                "model",
                format!(
                    "model {for_model:?} needs about {} MiB, more than models.memory_budget_mib ({} MiB)",
                    need >> 20,
                    budget >> 20
                ),
            ));
        }
        loop {
            let pools = state.pools.all();
            let (used, pinned, victim) = {
                let owned = self.owned();
                let pinned = Self::pinned_bytes(&pools, &owned);
                let mut used = pinned;
                let mut victim: Option<(Instant, Arc<Pool>)> = None;
                for p in &pools {
                    let Some(o) = owned.get(p.id()) else { continue };
                    used += Self::resident(p, o.estimate);
                    let idle = p.state() == PoolState::Ready && p.slots_busy() == 0;
                    if idle
                        && o.model != for_model
                        && victim.as_ref().is_none_or(|(t, _)| o.last_used < *t)
                    {
                        victim = Some((o.last_used, p.clone()));
                    }
                }
                (used, pinned, victim)
            };
            if pinned + need > budget {
                return Err(ApiError::invalid(
                    "model",
                    format!(
                        "model {for_model:?} needs about {} MiB; the configured pools, which stay loaded, hold {} of the {} MiB of models.memory_budget_mib",
                        need >> 20,
                        pinned >> 20,
                        budget >> 20
                    ),
                ));
            }
            if used + need <= budget {
                return Ok(());
            }
            let Some((_, pool)) = victim else {
                return Err(ApiError::new(
                    ErrorCode::PoolUnavailable,
                    format!(
                        "loading {for_model:?} needs about {} MiB; the models busy now hold {} of the {} MiB budget",
                        need >> 20,
                        used >> 20,
                        budget >> 20
                    ),
                    true,
                )
                .with_retry_after(1000));
            };
            self.unload(state, &pool, "budget");
        }
    }

    /// Stops an idle on-demand pool taking work and removes it (its engine is dropped with it).
    fn unload(&self, state: &SharedLifecycle, pool: &Arc<Pool>, reason: &'static str) {
        let _ = pool.drain(Duration::ZERO);
        state.pools.remove(pool.id());
        if let Some(o) = self.owned().remove(pool.id()) {
            metrics::model_unloaded(&o.model, reason);
            tracing::info!(model = %o.model, pool = %pool.id(), reason, "model unloaded");
        }
        state.wake.notify_one();
    }

    /// Every second until shutdown: on-demand pools in use count as used now; idle ones past
    /// `keep_alive_s`, and those an operator drained, are unloaded; the resident-bytes gauge
    /// is refreshed.
    pub fn spawn_upkeep(self: Arc<Self>, state: SharedLifecycle) {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(UPKEEP_EVERY);
            loop {
                tokio::select! {
                    _ = state.shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                self.upkeep(&state);
                for e in self.entries(&state).await {
                    metrics::model_listed(&e.name);
                }
            }
        });
    }

    fn upkeep(&self, state: &SharedLifecycle) {
        let pools = state.pools.all();
        let keep_alive = Duration::from_secs(self.cfg.keep_alive_s);
        let mut idle = Vec::new();
        let mut drained = Vec::new();
        let mut resident = 0u64;
        {
            let mut owned = self.owned();
            // pools removed by other means (the engines API) are forgotten
            owned.retain(|id, _| pools.iter().any(|p| p.id() == id));
            for p in &pools {
                let Some(o) = owned.get_mut(p.id()) else {
                    continue;
                };
                resident += Self::resident(p, o.estimate);
                if p.state() == PoolState::Drained {
                    // an operator drained it: it is unloaded, and the next request loads it
                    drained.push(p.clone());
                } else if p.slots_busy() > 0 {
                    o.last_used = Instant::now();
                } else if p.state() == PoolState::Ready {
                    let expired = match o.keep_alive {
                        Some(keep_alive::KeepAlive::Forever) => false,
                        Some(keep_alive::KeepAlive::For(d)) => o.last_used.elapsed() >= d,
                        // the config's 0 means no idle unloading
                        None => self.cfg.keep_alive_s > 0 && o.last_used.elapsed() >= keep_alive,
                    };
                    if expired {
                        idle.push(p.clone());
                    }
                }
            }
        }
        for p in idle {
            self.unload(state, &p, "idle");
        }
        for p in drained {
            self.unload(state, &p, "drained");
        }
        metrics::models_resident(resident);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ISO-7: a load past its prediction is said to need half its time so far again, never
    /// a millisecond.
    #[test]
    fn a_late_load_is_not_predicted_to_end_at_once() {
        assert_eq!(time_left(2000, 500), 1500);
        assert_eq!(time_left(2000, 2000), 1000);
        assert_eq!(time_left(2000, 40_000), 20_000);
    }
}
