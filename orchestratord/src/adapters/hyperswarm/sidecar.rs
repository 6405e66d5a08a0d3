//! Starting and supervising the Node sidecar: restart with exponential backoff, its output
//! forwarded to our logs, stopped on shutdown.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use super::identity::Identity;
use crate::config::SidecarConfig;

/// What the supervisor knows about the running sidecar.
#[derive(Debug, Default)]
pub struct SidecarStatus {
    /// The sidecar said `ready`: the topic is announced on the DHT.
    pub announced: AtomicBool,
    /// Its process id while it runs (0 when not running).
    pub pid: AtomicU32,
    pub restarts: AtomicU64,
}

/// A run longer than this resets the restart backoff.
const HEALTHY_RUN: Duration = Duration::from_secs(60);
const FIRST_BACKOFF: Duration = Duration::from_millis(500);

fn command(cfg: &SidecarConfig, id: &Identity, target: SocketAddr) -> Command {
    let mut cmd = Command::new(&cfg.node);
    cmd.arg(&cfg.script).arg("--target").arg(target.to_string());
    if !cfg.bootstrap.is_empty() {
        cmd.arg("--bootstrap").arg(cfg.bootstrap.join(","));
    }
    if let Some(p) = cfg.dht_port {
        cmd.arg("--port").arg(p.to_string());
    }
    if let Some(h) = &cfg.dht_host {
        cmd.arg("--host").arg(h);
    }
    if cfg.dht_open {
        cmd.arg("--open");
    }
    if cfg.send_peer_line {
        cmd.arg("--peer-line");
    }
    // secrets through the environment, not the command line (visible in `ps`)
    cmd.env("ORCHD_HS_TOPIC", &id.topic)
        .env("ORCHD_HS_SEED", &id.seed)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Forwards each output line of the sidecar to the log (bounded lines) and notes its `ready`.
fn forward_logs(child: &mut Child, status: &Arc<SidecarStatus>) {
    fn pipe<R: tokio::io::AsyncRead + Unpin + Send + 'static>(
        r: R,
        stream: &'static str,
        status: Arc<SidecarStatus>,
    ) {
        tokio::spawn(async move {
            let mut lines = BufReader::new(r).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let line: String = line.chars().take(2000).collect();
                if stream == "stdout" && line.starts_with("{\"event\":\"ready\"") {
                    status.announced.store(true, Ordering::SeqCst);
                }
                tracing::info!(target: "hyperswarm_sidecar", stream, "{line}");
            }
        });
    }
    if let Some(out) = child.stdout.take() {
        pipe(out, "stdout", status.clone());
    }
    if let Some(err) = child.stderr.take() {
        pipe(err, "stderr", status.clone());
    }
}

/// Runs the sidecar until `shutdown`, restarting it whenever it exits.
pub async fn supervise(
    cfg: SidecarConfig,
    id: Identity,
    target: SocketAddr,
    shutdown: CancellationToken,
    status: Arc<SidecarStatus>,
) {
    let cap = Duration::from_millis(cfg.max_restart_backoff_ms.max(1));
    let mut backoff = FIRST_BACKOFF.min(cap);
    loop {
        let restarts = status.restarts.load(Ordering::SeqCst);
        let started = tokio::time::Instant::now();
        match command(&cfg, &id, target).spawn() {
            Ok(mut child) => {
                tracing::info!(pid = ?child.id(), restarts, "hyperswarm sidecar started");
                status.pid.store(child.id().unwrap_or(0), Ordering::SeqCst);
                forward_logs(&mut child, &status);
                tokio::select! {
                    exit = child.wait() => {
                        status.announced.store(false, Ordering::SeqCst);
                        status.pid.store(0, Ordering::SeqCst);
                        tracing::warn!(status = ?exit, "hyperswarm sidecar exited");
                    }
                    _ = shutdown.cancelled() => {
                        let _ = child.start_kill();
                        let _ = tokio::time::timeout(Duration::from_secs(5), child.wait()).await;
                        tracing::info!("hyperswarm sidecar stopped");
                        return;
                    }
                }
            }
            Err(e) => {
                tracing::error!(node = %cfg.node, error = %e, "cannot start the hyperswarm sidecar")
            }
        }
        if started.elapsed() >= HEALTHY_RUN {
            backoff = FIRST_BACKOFF.min(cap);
        }
        status.restarts.fetch_add(1, Ordering::SeqCst);
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.cancelled() => return,
        }
        backoff = (backoff * 2).min(cap);
    }
}
