//! What a pool is made from: what every pool has (id, model, alias, slots, context) and one
//! engine configuration. Config, the Kolosal engines API, remote workers and tests all
//! describe their pools this way and add them through `PoolRegistry::add`, the one builder.

use std::path::Path;
use std::sync::Arc;

// the engine's own crates, not the modules here that use specs (no module cycle)
use engine_candle::EngineSettings as CandleSettings;
use engine_port::Engine;

/// How a pool gets its engine.
#[derive(Clone)]
pub enum EngineConfig {
    /// Loaded in this process by the server's engine factory (candle; the tests' scripted
    /// engines ignore the settings).
    Local(CandleSettings),
    /// Served by a connected remote worker, whose engine the pool is given when it is built:
    /// nothing is loaded here.
    Remote {
        worker_id: String,
        engine: Arc<dyn Engine>,
    },
}

impl std::fmt::Debug for EngineConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Local(s) => f.debug_tuple("Local").field(s).finish(),
            Self::Remote { worker_id, .. } => f
                .debug_struct("Remote")
                .field("worker_id", worker_id)
                .finish_non_exhaustive(),
        }
    }
}

/// How to build a pool.
#[derive(Debug, Clone)]
pub struct PoolSpec {
    pub id: String,
    /// Model path (a local engine) or another engine's reference.
    pub model_ref: String,
    /// Name clients use in `model`.
    pub model_alias: String,
    pub slots: usize,
    /// Tokens per slot; 0 = the model's trained context, as far as the engine's key/value
    /// cache cap holds it for every slot.
    pub ctx: usize,
    pub engine: EngineConfig,
}

impl PoolSpec {
    /// A pool whose model this process loads, named by its file stem unless `alias` says.
    pub fn local(
        id: &str,
        model_path: &str,
        alias: Option<&str>,
        slots: usize,
        ctx: usize,
        settings: CandleSettings,
    ) -> Self {
        let alias = alias.map(str::to_string).unwrap_or_else(|| {
            Path::new(model_path)
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| id.to_string())
        });
        Self {
            id: id.to_string(),
            model_ref: model_path.to_string(),
            model_alias: alias,
            slots,
            ctx,
            engine: EngineConfig::Local(settings),
        }
    }

    /// A pool served by worker `worker_id`'s `engine`.
    pub fn remote(
        id: String,
        model_ref: String,
        model_alias: String,
        worker_id: String,
        engine: Arc<dyn Engine>,
    ) -> Self {
        let d = engine.descriptor();
        Self {
            id,
            model_ref,
            model_alias,
            slots: d.slots,
            ctx: d.ctx_max,
            engine: EngineConfig::Remote { worker_id, engine },
        }
    }

    /// `local` or `remote`, as health and capabilities say it.
    pub fn kind(&self) -> &'static str {
        match self.engine {
            EngineConfig::Local(_) => "local",
            EngineConfig::Remote { .. } => "remote",
        }
    }

    pub fn is_local(&self) -> bool {
        matches!(self.engine, EngineConfig::Local(_))
    }

    /// The worker that serves a remote pool.
    pub fn worker_id(&self) -> Option<&str> {
        match &self.engine {
            EngineConfig::Remote { worker_id, .. } => Some(worker_id),
            EngineConfig::Local(_) => None,
        }
    }
}
