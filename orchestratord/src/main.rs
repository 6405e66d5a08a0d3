//! `orchestratord [--config PATH] [--bind ADDR]` serves (llama-server's flags too:
//! `serve_flags.rs`); `orchestratord worker --server URL`
//! serves another orchestrator's queue as a remote worker.

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use orchestratord::config::Config;
use orchestratord::logging::{self, LogFormat};
use orchestratord::serve_flags::{expand_llama_server_flags, ServeFlags};
use orchestratord::server;
use orchestratord::worker::{self, BackendChoice, WorkerOptions};
use pool_manager::candle::CandleFactory;

#[derive(Debug, Parser)]
#[command(name = "orchestratord", version, about = "LLM serving orchestrator")]
struct Args {
    /// TOML config file (defaults serve one pool of the default model).
    #[arg(long, env = "ORCHD_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Listen address, e.g. 127.0.0.1:8080 (overrides the config). A worker listens only when
    /// given one (its own pools' API: health, metrics, tasks).
    #[arg(long, env = "ORCHD_BIND", global = true)]
    bind: Option<String>,
    /// Serve a non-loopback address without API keys (anyone who reaches the port controls
    /// the server). Keys come from ORCHD_API_KEYS, auth.key_file or --api-key[-file].
    #[arg(long)]
    insecure_no_auth: bool,
    #[command(flatten)]
    serve: ServeFlags,
    /// Log lines as text (colour only on a terminal) or one JSON object per line.
    #[arg(
        long,
        value_enum,
        env = "ORCHD_LOG_FORMAT",
        default_value = "text",
        global = true
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Connect out to an orchestrator and serve its queue (its models become remote pools
    /// there). Serves the pools of --config with the built-in engine, or forwards to an
    /// OpenAI-compatible server with --backend-url.
    Worker(WorkerArgs),
    /// Chat with MODEL in the terminal, as `ollama run` does: through the server answering at
    /// --bind, or one started here (MODEL a GGUF path, a served name, or hf.co/OWNER/REPO:QUANT,
    /// pulled first). With PROMPT: one answer, then exit. Keys: env ORCHD_API_KEY.
    Run(RunArgs),
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// A GGUF file, a model the server serves, or hf.co/OWNER/REPO[:QUANT].
    model: String,
    /// One question: its answer is printed and the command ends.
    prompt: Vec<String>,
}

#[derive(Debug, clap::Args)]
struct WorkerArgs {
    /// The orchestrator, e.g. http://10.0.0.5:8080 (or ws://…, or the full connect URL).
    #[arg(long, env = "ORCHD_SERVER")]
    server: String,
    /// The worker secret the orchestrator expects (prefer --secret-file or the environment: a
    /// flag shows in the process list).
    #[arg(long, env = "ORCHD_WORKER_SECRET", hide_env_values = true)]
    secret: Option<String>,
    /// A file whose first non-empty line is the worker secret.
    #[arg(
        long,
        env = "ORCHD_WORKER_SECRET_FILE",
        conflicts_with = "secret",
        required_unless_present = "secret"
    )]
    secret_file: Option<std::path::PathBuf>,
    /// Name shown by the orchestrator (default: the host name).
    #[arg(long)]
    name: Option<String>,
    /// Provider to register under (`?provider=`).
    #[arg(long)]
    provider: Option<String>,
    /// Requests at once (default: the pools' slots, or 4 with --backend-url).
    #[arg(long)]
    max_concurrent: Option<u32>,
    /// Forward to this OpenAI-compatible server instead of loading models here (its API key,
    /// if it wants one, from env ORCHD_BACKEND_API_KEY).
    #[arg(long)]
    backend_url: Option<String>,
    /// Models to announce with --backend-url (comma-separated; default: its /v1/models).
    #[arg(long, value_delimiter = ',')]
    models: Vec<String>,
    /// Largest WebSocket message accepted from the server.
    #[arg(long, default_value_t = 4 << 20)]
    max_frame_bytes: usize,
}

/// The worker secret: given, or the first non-empty line of its file.
fn worker_secret(given: Option<String>, file: Option<&std::path::Path>) -> anyhow::Result<String> {
    if let Some(s) = given.filter(|s| !s.trim().is_empty()) {
        return Ok(s.trim().to_string());
    }
    let Some(path) = file else {
        anyhow::bail!("no worker secret: give --secret-file, ORCHD_WORKER_SECRET or --secret");
    };
    let text = std::fs::read_to_string(path).map_err(|e| {
        anyhow::anyhow!("cannot read the worker secret file {}: {e}", path.display())
    })?;
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(str::to_string)
        .ok_or_else(|| anyhow::anyhow!("the worker secret file {} is empty", path.display()))
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    // a second interrupt does not wait for the grace period
    tokio::spawn(async {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("second interrupt: exiting now");
            std::process::exit(130);
        }
    });
}

/// A failure to start (a config error, an address in use) is one line: its message and
/// causes, never a stack backtrace, whatever `RUST_BACKTRACE` says (issue 49).
fn main() -> std::process::ExitCode {
    match serve() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn serve() -> anyhow::Result<()> {
    let mut args = Args::parse_from(expand_llama_server_flags(std::env::args_os()));
    match &args.command {
        Some(Command::Run(_)) => logging::init_quiet(),
        _ => logging::init(args.log_format),
    }
    let mut cfg = Config::load(args.config.as_deref())?;
    if let Some(b) = &args.bind {
        cfg.bind = b.clone();
    }
    std::mem::take(&mut args.serve).apply(&mut cfg)?;
    if let Some(Command::Run(r)) = &args.command {
        if std::path::Path::new(&r.model).is_file() {
            if cfg.pools.is_empty() {
                cfg.pools
                    .push(orchestratord::config::PoolConfig::new("default", &r.model));
            }
            cfg.apply_first_pool(orchestratord::config::FirstPool {
                model: Some(r.model.clone()),
                ..Default::default()
            })?;
        }
    }
    let worker_backend =
        matches!(&args.command, Some(Command::Worker(w)) if w.backend_url.is_some());
    let run_pulls = matches!(&args.command, Some(Command::Run(r)) if r.model.starts_with("hf.co/"));
    if !worker_backend && !run_pulls {
        cfg.locate_default_model(std::env::current_exe().ok().as_deref())?;
    }
    if args.insecure_no_auth {
        cfg.auth.insecure_no_auth = true;
    }
    // before any thread exists (see pool_manager::candle::configure_process_threads)
    let threads = cfg.pools.iter().map(|p| p.threads).max().unwrap_or(0);
    pool_manager::candle::configure_process_threads(threads, cfg.compute_nice);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match args.command {
        None => rt.block_on(run(cfg)),
        Some(Command::Worker(w)) => rt.block_on(run_worker(cfg, w, args.bind)),
        Some(Command::Run(r)) => rt.block_on(run_chat(cfg, r)),
    }
}

/// The key a worker sends to its `--backend-url` server as a bearer token.
const BACKEND_KEY_ENV: &str = "ORCHD_BACKEND_API_KEY";

async fn run_worker(cfg: Config, w: WorkerArgs, bind: Option<String>) -> anyhow::Result<()> {
    if bind.is_some() && w.backend_url.is_some() {
        anyhow::bail!("--bind serves the worker's own pools; with --backend-url it has none");
    }
    if let Some(addr) = &bind {
        // the worker's own API has the server's routes: the same rule for exposing it
        let auth = orchestratord::auth::Auth::load(&cfg.auth, &cfg.http)?;
        orchestratord::auth::check_exposure(addr, &auth, cfg.auth.insecure_no_auth)?;
    }
    let choice = match w.backend_url {
        Some(url) => BackendChoice::Url {
            url,
            models: w.models,
            // the backend's key, from the environment only (never a flag: `ps` shows those)
            api_key: std::env::var(BACKEND_KEY_ENV)
                .ok()
                .filter(|k| !k.is_empty()),
        },
        None => BackendChoice::Local(Box::new(cfg), Arc::new(CandleFactory)),
    };
    let backend = worker::backend(choice).await?;
    if let (Some(addr), worker::Backend::Local { router, .. }) = (bind, backend.as_ref()) {
        let listener = tokio::net::TcpListener::bind(&addr).await?;
        tracing::info!(addr = %listener.local_addr()?, "worker's local API listening");
        let router = router.clone();
        tokio::spawn(async move { axum::serve(listener, router).await });
    }
    let name = w.name.unwrap_or_else(|| {
        std::fs::read_to_string("/etc/hostname")
            .map(|s| s.trim().to_string())
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "worker".into())
    });
    let opts = WorkerOptions {
        server: w.server,
        secret: worker_secret(w.secret, w.secret_file.as_deref())?,
        name,
        provider: w.provider,
        max_concurrent: w.max_concurrent,
        max_frame_bytes: w.max_frame_bytes,
    };
    worker::run(opts, backend, shutdown_signal()).await
}

/// `orchestratord run`: the conversation with the server at the configured address, or with
/// one started here for it (stopped when the conversation ends).
async fn run_chat(mut cfg: Config, r: RunArgs) -> anyhow::Result<()> {
    use orchestratord::terminal_chat::{answers, TerminalChat};
    let key = std::env::var("ORCHD_API_KEY")
        .ok()
        .filter(|k| !k.is_empty());
    let base = format!("http://{}", cfg.bind.replace("0.0.0.0", "127.0.0.1"));
    let prompt = (!r.prompt.is_empty()).then(|| r.prompt.join(" "));
    let path = std::path::Path::new(&r.model);
    let mut model = match path.is_file() {
        true => cfg
            .pools
            .first()
            .map(|p| p.spec().map(|s| s.model_alias))
            .transpose()?
            .unwrap_or_else(|| r.model.clone()),
        false => r.model.clone(),
    };
    let mut server = None;
    if !answers(&base).await {
        if model.starts_with("hf.co/") {
            // pulled into the model cache, then served as the first pool
            let mut chat = TerminalChat::new(&base, None, &model);
            let pulled = chat
                .pull_locally(std::path::Path::new(".cache/models"))
                .await?;
            cfg.apply_first_pool(orchestratord::config::FirstPool {
                model: Some(pulled.display().to_string()),
                ..Default::default()
            })?;
            model = pulled
                .file_stem()
                .map_or_else(|| model.clone(), |s| s.to_string_lossy().into_owned());
        }
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let bind = cfg.bind.clone();
        let state = server::build_state(cfg, Arc::new(CandleFactory))?;
        let listener = tokio::net::TcpListener::bind(&bind).await?;
        server::start_loops(&state);
        let loading = state.clone();
        let loaded = tokio::spawn(async move { loading.pools.load_all().await });
        let serving = tokio::spawn(server::serve(state, listener, async move {
            let _ = stopped.await;
        }));
        let _ = loaded.await;
        server = Some((stop, serving));
    }
    let mut chat = TerminalChat::new(&base, key, &model);
    chat.pull_if_named().await?;
    let outcome = match prompt {
        Some(p) => chat.once(&p).await,
        None => chat.converse().await,
    };
    if let Some((stop, serving)) = server {
        let _ = stop.send(());
        let _ = serving.await;
    }
    outcome
}

async fn run(cfg: Config) -> anyhow::Result<()> {
    let bind = cfg.bind.clone();
    let state = server::build_state(cfg, Arc::new(CandleFactory))?;
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    tracing::info!(addr = %listener.local_addr()?, "listening");
    // the server answers from its first second (`/livez`, `/readyz` "loading", tasks admitted
    // with the load in their predicted start); the pools load behind it
    server::start_loops(&state);
    server::start_cluster(&state).await?;
    let loading = state.clone();
    tokio::spawn(async move {
        loading.pools.load_all().await;
        for p in loading.pools.all() {
            let s = p.snapshot();
            tracing::info!(pool = %s.id, state = s.state.as_str(), error = ?s.last_error, "pool");
        }
    });
    let bg = server::start_hyperswarm(&state).await;
    if state.cfg.hyperswarm.enabled {
        match &bg.hyperswarm {
            Some(h) => tracing::info!(server_id = %h.server_id, "share this Server ID with peers"),
            None => anyhow::bail!("hyperswarm is enabled but its host did not start (see the log)"),
        }
    }
    if state.workers.enabled() {
        tracing::info!(
            path = contracts::worker::CONNECT_PATH,
            "remote workers may connect"
        );
    }
    server::serve(state, listener, shutdown_signal()).await?;
    Ok(())
}
