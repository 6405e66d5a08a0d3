//! `orchestratord worker`: a machine that connects out to an orchestrator over WebSocket
//! (seed 002), registers its models, and serves the orchestrator's queue. It reconnects with
//! backoff and jitter and survives the server restarting; `graceful_shutdown` finishes its
//! requests and exits.

mod backend;
mod held;
mod session;

use std::sync::Arc;
use std::time::Duration;

use contracts::worker::{PROTOCOL_BRIDGE_V1, PROTOCOL_V1};
use rand::Rng;

pub use backend::Backend;
pub use session::connect_url;

use crate::config::Config;
use pool_manager::EngineFactory;

/// First and largest wait between connection attempts.
const RETRY_BASE: Duration = Duration::from_millis(500);
const RETRY_CAP: Duration = Duration::from_secs(30);

pub struct WorkerOptions {
    /// The orchestrator: `http://host:port`, `ws://host:port`, or the full connect URL.
    pub server: String,
    pub secret: String,
    pub name: String,
    pub provider: Option<String>,
    /// Requests at once; default: the pools' slots, or 4 for a URL backend.
    pub max_concurrent: Option<u32>,
    pub max_frame_bytes: usize,
}

/// Where requests go.
pub enum BackendChoice {
    /// Load the pools of this config in process (the candle engine).
    Local(Box<Config>, Arc<dyn EngineFactory>),
    /// Forward to an OpenAI-compatible server; announce `models` (empty: its `/v1/models`);
    /// send `api_key` as its bearer token when it wants one.
    Url {
        url: String,
        models: Vec<String>,
        api_key: Option<String>,
    },
}

/// Builds the backend (loading local pools first).
pub async fn backend(choice: BackendChoice) -> anyhow::Result<Arc<Backend>> {
    Ok(Arc::new(match choice {
        BackendChoice::Local(cfg, factory) => {
            let mut cfg = *cfg;
            // the server keeps the records of the tasks it sends here
            cfg.records.enabled = false;
            let state = crate::server::build_state(cfg, factory)?;
            crate::server::start_background(&state).await;
            let router = crate::server::router(state.clone());
            Backend::Local { state, router }
        }
        BackendChoice::Url {
            url,
            models,
            api_key,
        } => {
            let mut headers = reqwest::header::HeaderMap::new();
            if let Some(key) = api_key {
                let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {key}"))
                    .map_err(|_| {
                        anyhow::anyhow!("the backend API key is not a valid header value")
                    })?;
                v.set_sensitive(true);
                headers.insert(reqwest::header::AUTHORIZATION, v);
            }
            Backend::Http {
                client: reqwest::Client::builder()
                    .default_headers(headers)
                    .build()?,
                base: url.trim_end_matches('/').to_string(),
                models,
            }
        }
    }))
}

fn backoff(attempt: u32) -> Duration {
    let exp = RETRY_BASE.saturating_mul(1u32 << attempt.min(8));
    exp.min(RETRY_CAP)
        .mul_f64(rand::rng().random_range(0.5..1.0))
}

/// Serves until drained by the server (`Ok`) or `stop` resolves. Registers with the seed's
/// protocol version "1"; a server that refuses it is asked again at once with
/// "2026-04-bridge-v1" (what modelrelay's server accepts), which is kept from then on.
pub async fn run(
    opts: WorkerOptions,
    backend: Arc<Backend>,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    tokio::pin!(stop);
    let mut attempt: u32 = 0;
    let mut version = PROTOCOL_V1;
    // said once in words, then only counted: retrying will not fix a wrong secret
    let mut secret_refusals: u64 = 0;
    loop {
        let outcome = tokio::select! {
            o = session::run_once(&opts, &backend, version) => o,
            _ = &mut stop => return Ok(()),
        };
        if let (Err(session::SessionError::Refused(why)), PROTOCOL_V1) = (&outcome, version) {
            tracing::info!(reason = %why, "registration refused with protocol 1; trying {PROTOCOL_BRIDGE_V1}");
            version = PROTOCOL_BRIDGE_V1;
            continue;
        }
        match outcome {
            Ok(session::SessionEnd::Drained) => {
                tracing::info!("drained by the server: exiting");
                return Ok(());
            }
            Ok(session::SessionEnd::Lost(why, registered)) => {
                tracing::warn!(reason = %why, "connection to the server lost");
                if registered {
                    // its secret was taken: a later refusal is news again
                    attempt = 0;
                    secret_refusals = 0;
                } else {
                    attempt = attempt.saturating_add(1);
                }
            }
            Err(session::SessionError::SecretRefused) => {
                secret_refusals += 1;
                if secret_refusals == 1 {
                    tracing::error!(
                        "the server refused the worker secret: check --secret-file, ORCHD_WORKER_SECRET or --secret against the server's [workers] secret; retrying every {} s",
                        RETRY_CAP.as_secs()
                    );
                } else {
                    tracing::debug!(refusals = secret_refusals, "worker secret refused again");
                }
                // the longest backoff at once
                attempt = u32::MAX;
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not serve the server");
                attempt = attempt.saturating_add(1);
            }
        }
        let wait = backoff(attempt);
        if secret_refusals == 0 {
            tracing::info!(wait_ms = wait.as_millis() as u64, "reconnecting");
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = &mut stop => return Ok(()),
        }
    }
}
