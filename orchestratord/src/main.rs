//! `orchestratord [--config PATH] [--bind ADDR]`

use std::path::PathBuf;
use std::sync::Arc;

use clap::Parser;
use orchestratord::config::Config;
use orchestratord::server;
use pool_manager::CandleFactory;

#[derive(Debug, Parser)]
#[command(name = "orchestratord", version, about = "LLM serving orchestrator")]
struct Args {
    /// TOML config file (defaults serve one pool of the default model).
    #[arg(long, env = "ORCHD_CONFIG")]
    config: Option<PathBuf>,
    /// Listen address, e.g. 127.0.0.1:8080 (overrides the config).
    #[arg(long, env = "ORCHD_BIND")]
    bind: Option<String>,
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
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut cfg = Config::load(args.config.as_deref())?;
    if let Some(b) = args.bind {
        cfg.bind = b;
    }
    // before any thread exists (see engine_candle::configure_process_threads)
    let threads = cfg.pools.iter().map(|p| p.threads).max().unwrap_or(0);
    engine_candle::configure_process_threads(threads);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(cfg))
}

async fn run(cfg: Config) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let bind = cfg.bind.clone();
    let state = server::build_state(cfg, Arc::new(CandleFactory))?;
    let listener = tokio::net::TcpListener::bind(&bind).await?;
    tracing::info!(addr = %listener.local_addr()?, "listening");
    server::start_background(&state).await;
    if state.cfg.hyperswarm.enabled {
        match state.hyperswarm.get() {
            Some(h) => tracing::info!(server_id = %h.server_id, "share this Server ID with peers"),
            None => anyhow::bail!("hyperswarm is enabled but its host did not start (see the log)"),
        }
    }
    for p in state.pools.all() {
        let s = p.snapshot();
        tracing::info!(pool = %s.id, state = s.state.as_str(), error = ?s.last_error, "pool");
    }
    server::serve(state, listener, shutdown_signal()).await?;
    Ok(())
}
