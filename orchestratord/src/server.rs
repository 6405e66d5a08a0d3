//! Building the router and the shared state, and serving with graceful shutdown.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use contracts::ErrorCode;
use pool_manager::{EngineFactory, PoolRegistry};
use tokio::net::TcpListener;
use tokio::sync::Notify;

use crate::app_state::{AppState, SharedState};
use crate::config::{Config, ConfigError};
use crate::lifecycle::queue::TaskQueue;
use crate::lifecycle::state::Lifecycle;
use crate::lifecycle::task_store::TaskStore;
use crate::routes;
use crate::sessions::SessionStore;

/// Creates the state; pools start in `Loading`.
pub fn build_state(
    cfg: Config,
    factory: Arc<dyn EngineFactory>,
) -> Result<SharedState, ConfigError> {
    let auth = Arc::new(crate::auth::Auth::load(&cfg.auth, &cfg.http)?);
    crate::auth::check_exposure(&cfg.bind, &auth, cfg.auth.insecure_no_auth)?;
    let wake = Arc::new(Notify::new());
    let records = crate::records::Records::open(&cfg.records)
        .map_err(|e| ConfigError::Invalid(format!("records.path {:?}: {e}", cfg.records.path)))?;
    let pools = PoolRegistry::new(factory, wake.clone());
    for spec in cfg.pool_specs()? {
        pools
            .add(spec)
            .map_err(|e| ConfigError::Invalid(format!("pools: {e}")))?;
    }
    // tenants' weights and quotas: the config's, with the key file's options over them
    let mut tenants = cfg.queue.tenants.clone();
    tenants.extend(
        auth.keys
            .tenant_options()
            .iter()
            .map(|(t, o)| (t.clone(), o.clone())),
    );
    let key_tenants = auth.keys.tenants();
    let parts = crate::app_state::Parts {
        workers: Arc::new(crate::remote_workers::WorkerRegistry::new(&cfg.workers)),
        auth,
        model_dirs: model_dirs(&cfg),
        models_folder: Arc::new(crate::models_folder::ModelsFolder::new(
            &cfg.models,
            model_dirs(&cfg),
        )),
    };
    let state = AppState::new(parts, |workers_port, models_port| Lifecycle {
        queue: TaskQueue::with_fair_share(
            cfg.queue.capacity,
            cfg.queue.policy,
            crate::lifecycle::fair_share::FairShare::new(
                cfg.queue.fairness,
                &tenants,
                &key_tenants,
            ),
        ),
        quotas: crate::lifecycle::quota::Quotas::new(tenants.into_iter().collect()),
        tasks: TaskStore::new(
            Duration::from_millis(cfg.stream.transcript_ttl_ms),
            cfg.stream.max_retained_tasks,
        ),
        sessions: SessionStore::new(cfg.sessions.clone()),
        placement_sessions: crate::lifecycle::placement::PlacementSessions::new(
            cfg.placement.sessions,
            Duration::from_millis(cfg.placement.session_idle_ms),
        ),
        placement_sent: crate::lifecycle::placement::SentPrefixes::new(
            cfg.placement.sent_blocks,
            Duration::from_millis(cfg.placement.sent_idle_ms),
        ),
        running: Default::default(),
        pools,
        wake,
        metrics: crate::metrics::install(Duration::from_millis(cfg.metrics.idle_timeout_ms)),
        shutting_down: AtomicBool::new(false),
        shutdown: tokio_util::sync::CancellationToken::new(),
        request_work: crate::lifecycle::request_work::RequestWork::new(
            crate::lifecycle::request_work::Limits::of(
                &cfg.admission,
                cfg.queue.capacity + cfg.pools.iter().map(|p| p.slots).sum::<usize>(),
            ),
        ),
        records,
        cluster_tasks: std::sync::OnceLock::new(),
        admitting: Default::default(),
        workers_port,
        models_port,
        started_at: Instant::now(),
        cfg,
    });
    state.queue.fair().publish_initial();
    Ok(state)
}

/// The model cache, the directories of the configured pools' models, and `models.dirs`.
fn model_dirs(cfg: &Config) -> crate::model_paths::ModelDirs {
    use std::path::Path;
    let cache = Path::new(crate::config::DEFAULT_MODEL_PATH)
        .parent()
        .map(Path::to_path_buf);
    let pools = cfg
        .pools
        .iter()
        .filter_map(|p| Path::new(&p.model).parent().map(Path::to_path_buf));
    let dirs: Vec<std::path::PathBuf> = cache
        .into_iter()
        .chain(pools)
        .chain(cfg.models.dirs.iter().map(std::path::PathBuf::from))
        .collect();
    crate::model_paths::ModelDirs::new(dirs)
}

/// The console's page and what it reads (none with `http.console = false`, llama-server's
/// `--no-webui`).
fn console_routes(on: bool) -> Router<SharedState> {
    if !on {
        return Router::new();
    }
    Router::new()
        .route("/", get(routes::console::index))
        .route("/console/console.js", get(routes::console::script))
        .route("/console/console.css", get(routes::console::style))
        .route("/console/history", get(routes::console::history::history))
}

/// Every route, with the correlation-id layer and the body limit.
pub fn router(state: SharedState) -> Router {
    let limit = state.cfg.admission.max_body_bytes;
    Router::new()
        .route("/v1/tasks", post(routes::tasks::submit))
        .route("/v1/tasks/{id}", get(routes::tasks::status))
        .route("/v1/tasks/{id}/stream", get(routes::tasks::stream))
        .route("/v1/tasks/{id}/cancel", post(routes::tasks::cancel))
        .route(
            "/v1/sessions/{id}",
            get(routes::sessions::get).delete(routes::sessions::delete),
        )
        .route(
            "/v1/artifacts",
            get(routes::artifacts::list).post(routes::artifacts::put),
        )
        .route("/v1/artifacts/{id}", get(routes::artifacts::get))
        .route("/v1/capabilities", get(routes::capabilities::get))
        .route("/v1/pools", get(routes::pools::list))
        .route("/v1/pools/{id}/health", get(routes::pools::health))
        .route("/v1/pools/{id}/drain", post(routes::pools::drain))
        .route("/v1/pools/{id}/resume", post(routes::pools::resume))
        .route("/v1/pools/{id}/reload", post(routes::pools::reload))
        .route(
            contracts::worker::CONNECT_PATH,
            get(routes::workers::connect),
        )
        .route("/v1/workers", get(routes::workers::list))
        .route("/v1/tenants", get(routes::tenants::list))
        .route("/v1/workers/{id}/drain", post(routes::workers::drain))
        .route(
            "/v1/workers/{id}/models_refresh",
            post(routes::workers::refresh),
        )
        .route(
            "/v1/chat/completions",
            post(crate::adapters::openai::chat_completions),
        )
        .route(
            "/v1/completions",
            post(crate::adapters::openai::completions),
        )
        .route(
            "/v1/embeddings",
            post(crate::adapters::embeddings::openai::embeddings),
        )
        .route(
            "/embeddings",
            post(crate::adapters::embeddings::llama_server::embeddings),
        )
        .route(
            "/embedding",
            post(crate::adapters::embeddings::llama_server::embeddings),
        )
        .route(
            "/v1/rerank",
            post(crate::adapters::embeddings::rerank::rerank),
        )
        .route("/rerank", post(crate::adapters::embeddings::rerank::rerank))
        .route(
            "/v1/reranking",
            post(crate::adapters::embeddings::rerank::rerank),
        )
        .route(
            "/reranking",
            post(crate::adapters::embeddings::rerank::rerank),
        )
        .route("/v1/models", get(crate::adapters::openai::models))
        .route("/v1/models/{model}", get(crate::adapters::openai::model))
        .route(
            "/completion",
            post(crate::adapters::llama_server::completion),
        )
        .route("/props", get(crate::adapters::llama_server::props))
        .route("/slots", get(crate::adapters::llama_server::slots))
        .route("/tokenize", post(crate::adapters::tokenize::tokenize))
        .route("/detokenize", post(crate::adapters::tokenize::detokenize))
        .route(
            "/chat/completions",
            post(crate::adapters::seed_chat::completions),
        )
        .route("/chat/sse", post(crate::adapters::seed_chat::sse))
        .route("/v1/responses", post(crate::adapters::openai::responses))
        .route("/v1/messages", post(crate::adapters::anthropic::messages))
        .route(
            "/v1/messages/count_tokens",
            post(crate::adapters::anthropic::count_tokens),
        )
        .route("/api/chat", post(crate::adapters::ollama::chat))
        .route("/api/generate", post(crate::adapters::ollama::generate))
        .route(
            "/api/embed",
            post(crate::adapters::embeddings::ollama::embed_route),
        )
        .route(
            "/api/embeddings",
            post(crate::adapters::embeddings::ollama::embeddings_route),
        )
        .route("/api/tags", get(crate::adapters::ollama::tags))
        .route("/api/ps", get(crate::adapters::ollama::ps))
        .route("/api/show", post(crate::adapters::ollama::show))
        .route("/api/pull", post(crate::adapters::ollama::pull))
        .route("/api/copy", post(crate::adapters::ollama::copy))
        .route("/api/create", post(crate::adapters::ollama::create))
        .route(
            "/api/delete",
            axum::routing::delete(crate::adapters::ollama::delete),
        )
        .route("/api/version", get(crate::adapters::ollama::version))
        .route(
            "/engines",
            get(crate::adapters::kolosal::list).post(crate::adapters::kolosal::add),
        )
        .route(
            "/engines/{engine_id}",
            axum::routing::delete(crate::adapters::kolosal::remove),
        )
        .route(
            "/engines/{engine_id}/status",
            get(crate::adapters::kolosal::status),
        )
        .route("/v1/health", get(crate::adapters::kolosal::health))
        .route("/health", get(crate::adapters::kolosal::health))
        .route("/status", get(crate::adapters::kolosal::server_status))
        .merge(console_routes(state.cfg.http.console))
        .route("/livez", get(routes::probes::livez))
        .route("/readyz", get(routes::probes::readyz))
        .route("/metrics", get(routes::meta::metrics))
        .route("/openapi.json", get(routes::meta::openapi_json))
        .route_layer(axum::middleware::from_fn(crate::correlation::mark_route))
        .fallback(routes::meta::not_found)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn_with_state(
            Duration::from_millis(state.cfg.http.body_read_timeout_ms.max(1)),
            crate::body_deadline::limit,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.auth.clone(),
            crate::auth::middleware,
        ))
        .layer(axum::middleware::from_fn(crate::correlation::middleware))
        .layer(tower::util::option_layer(cors(
            &state.cfg.http.cors_allowed_origins,
        )))
        .with_state(state)
}

/// CORS for the configured origins (none: no CORS headers, browsers keep their same-origin
/// rule), with `Authorization`, `Content-Type`, `X-Correlation-Id` and `Last-Event-ID`
/// allowed and the correlation and backoff headers exposed.
fn cors(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
    use axum::http::{header, HeaderName, HeaderValue, Method};
    let origins: Vec<HeaderValue> = origins
        .iter()
        .filter_map(|o| HeaderValue::from_str(o).ok())
        .collect();
    if origins.is_empty() {
        return None;
    }
    let layer = tower_http::cors::CorsLayer::new()
        .allow_origin(origins)
        .allow_methods([Method::GET, Method::POST, Method::DELETE])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            HeaderName::from_static(crate::correlation::HEADER),
            HeaderName::from_static("last-event-id"),
            HeaderName::from_static("x-api-key"),
        ])
        .expose_headers([
            HeaderName::from_static(crate::correlation::HEADER),
            header::RETRY_AFTER,
            HeaderName::from_static("x-backoff-ms"),
        ]);
    Some(layer)
}

/// What runs beside the HTTP server once [`start_background`] returns.
#[derive(Debug, Default)]
pub struct Background {
    /// What the Hyperswarm host publishes, when it is enabled and started.
    pub hyperswarm: Option<crate::adapters::hyperswarm::HostInfo>,
}

/// Loads the pools (first attempt), starts the dispatcher and, when enabled, the Hyperswarm
/// host (a failure to start it is logged and leaves `hyperswarm` empty).
pub async fn start_background(state: &SharedState) -> Background {
    start_loops(state);
    state.pools.load_all().await;
    start_hyperswarm(state).await
}

/// The background loops: the dispatcher, the metrics' upkeep, the model folder's.
pub fn start_loops(state: &SharedState) {
    tokio::spawn(crate::lifecycle::dispatcher::run(state.lifecycle.clone()));
    tokio::spawn(state.lifecycle.clone().metrics_upkeep_loop());
    state.console_history.clone().spawn(state.shutdown.clone());
    state
        .models_folder
        .clone()
        .spawn_upkeep(state.lifecycle.clone());
}

/// In a cluster (`cluster.nats_urls`): connects (the start fails if the cluster does not
/// answer in time), then follows the pool directory and announces this replica's pools every
/// heartbeat until shutdown, when it withdraws them.
pub async fn start_cluster(state: &SharedState) -> Result<(), crate::cluster::ClusterError> {
    if !state.cfg.cluster.enabled() {
        return Ok(());
    }
    let cluster = Arc::new(crate::cluster::Cluster::connect(&state.cfg.cluster).await?);
    let _ = state.cluster.set(cluster.clone());
    // the relay's and records' streams: a cluster just started may still be electing their
    // leaders (a JetStream request then times out), tried again within `connect_timeout_ms`
    let until = tokio::time::Instant::now()
        + std::time::Duration::from_millis(state.cfg.cluster.connect_timeout_ms);
    let path = loop {
        match crate::cluster::task_path::TaskPath::open(cluster.clone(), &state.lifecycle).await {
            Ok(path) => break Arc::new(path),
            Err(e) if tokio::time::Instant::now() < until => {
                tracing::info!(error = %e, "cluster: the task path's streams not ready yet");
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            }
            Err(e) => return Err(e),
        }
    };
    let _ = state.cluster_tasks.set(Arc::new(path.clone()));
    path.spawn_takers(&state.lifecycle);
    let directory = cluster.directory().clone();
    let stop = state.shutdown.clone();
    tokio::spawn(async move { directory.follow(stop).await });
    // what every replica's pools hold (PLACE-8): this one's out, the others' in
    let (c, st) = (cluster.clone(), state.clone());
    tokio::spawn(async move {
        c.publish_held(st.lifecycle.clone(), st.shutdown.clone())
            .await
    });
    let (c, stop) = (cluster.clone(), state.shutdown.clone());
    tokio::spawn(async move {
        if let Err(e) = c.follow_held(stop).await {
            tracing::error!(error = %e, "cluster: cannot follow what the other replicas hold");
        }
    });
    // the others' cancels of tasks this replica holds
    let (st, c, taker) = (state.clone(), cluster.clone(), path.clone());
    tokio::spawn(async move {
        // the task where it runs (taken from the cluster's queue), or as this replica follows it
        let cancel = |id: &str, ask: &crate::cluster::cancel::CancelAsk| {
            let running = taker
                .running_task(id)
                .filter(|t| ask.sees_all || t.owner == ask.tenant);
            match running.or_else(|| st.tasks.get(&ask.tenant, id, ask.sees_all)) {
                Some(task) => st.cancel_task(&task, crate::metrics::CancelReason::Client),
                None => false,
            }
        };
        if let Err(e) = c.serve_cancels(cancel, st.shutdown.clone()).await {
            tracing::error!(error = %e, "cluster: cannot take the other replicas' cancels");
        }
    });
    let (c, st) = (cluster.clone(), state.clone());
    tokio::spawn(async move {
        // the other replicas' drains and refreshes of the workers connected here
        let apply = |id: &str, action: &crate::cluster::worker_control::WorkerAction| {
            let link = st.workers.get(id)?;
            Some(crate::routes::workers::apply(&st, &link, action))
        };
        if let Err(e) = c.serve_worker_controls(apply, st.shutdown.clone()).await {
            tracing::error!(error = %e, "cluster: cannot take the other replicas' worker requests");
        }
    });
    let st = state.clone();
    tokio::spawn(async move {
        let directory = cluster.directory();
        let mut tick = tokio::time::interval(directory.heartbeat());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tokio::select! {
                _ = st.shutdown.cancelled() => break,
                _ = tick.tick() => {}
            }
            let now = crate::cluster::pool_directory::Announcement {
                pools: st
                    .pools
                    .all()
                    .iter()
                    .map(|p| crate::routes::pools::health_of(&st, p))
                    .collect(),
                workers: st
                    .workers
                    .list()
                    .iter()
                    .map(|l| crate::routes::workers::info(&st, l))
                    .collect(),
                lines: crate::lifecycle::deadline::forecasts(&st.lifecycle, &st.pools.all())
                    .into_iter()
                    .collect(),
            };
            match directory.announce(&now).await {
                Ok(()) if failing => {
                    failing = false;
                    tracing::info!("cluster: announcing this replica's pools again");
                }
                Ok(()) => {}
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(error = %e, "cluster: cannot announce this replica's pools");
                }
                Err(_) => {}
            }
        }
        if let Err(e) = directory.withdraw().await {
            tracing::warn!(error = %e, "cluster: could not withdraw this replica's pools");
        }
    });
    Ok(())
}

/// The Hyperswarm host, when enabled.
pub async fn start_hyperswarm(state: &SharedState) -> Background {
    let mut bg = Background::default();
    if state.cfg.hyperswarm.enabled {
        match crate::adapters::hyperswarm::start(state).await {
            Ok(info) => bg.hyperswarm = Some(info),
            Err(e) => tracing::error!(error = %e, "hyperswarm host did not start"),
        }
    }
    bg
}

/// Connections still open this long after the shutdown's grace period are dropped.
pub const SHUTDOWN_MARGIN: Duration = Duration::from_secs(2);

/// Serves until `shutdown` resolves, then stops admitting, lets running tasks finish for the
/// grace period, ends whatever is left with a retriable error, and closes the connections
/// (those still open [`SHUTDOWN_MARGIN`] later, such as a reader that never reads, are
/// dropped), then writes the queued task records.
pub async fn serve(
    state: SharedState,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(state.clone());
    let grace = Duration::from_millis(state.cfg.shutdown_grace_ms);
    let st = state.clone();
    let signal = async move {
        shutdown.await;
        st.shutting_down.store(true, Ordering::SeqCst);
        st.shutdown.cancel();
        tracing::info!("shutting down: admitting nothing new");
        st.workers.drain_all(st.as_ref(), "server_shutdown", grace);
        // tasks another replica runs go on there: their streams here just close (a client
        // resumes on another replica after its last event id)
        let here = || {
            let mut t = st.tasks.unfinished();
            t.retain(|t| !t.is_relayed());
            t
        };
        let until = Instant::now() + grace;
        while Instant::now() < until && !here().is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for t in here() {
            st.fail_task(
                &t,
                ErrorCode::ShuttingDown,
                "the server shut down",
                true,
                Some(1000),
            );
        }
    };
    let served =
        crate::listener::serve(listener, app, &state.cfg.http, signal, SHUTDOWN_MARGIN).await;
    // every task has ended by now: write their records before the process exits
    state.records.close().await;
    served
}
