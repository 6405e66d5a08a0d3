//! The Hyperswarm chat host (seed 000): peers reach us through the Node sidecar, which pipes
//! each Hyperswarm connection byte for byte to a local NDJSON listener served here on the task
//! spine. Busy semantics come from the queue: a `chat_start` is a task like any other.

mod connection;
mod identity;
mod line_reader;
mod peers;
pub mod protocol;
mod sidecar;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::net::TcpListener;

pub use connection::Host;
pub use identity::Identity;
pub use sidecar::SidecarStatus;

use crate::app_state::SharedState;

/// The running host: where it listens and what it tells `/v1/capabilities`.
#[derive(Debug, Clone)]
pub struct HostInfo {
    pub server_id: String,
    pub listen: SocketAddr,
    /// Present when orchestratord runs the sidecar.
    pub sidecar: Option<Arc<SidecarStatus>>,
}

impl HostInfo {
    /// The host's entry in `/v1/capabilities`.
    pub fn capability(&self) -> contracts::HyperswarmCapability {
        let sidecar = self.sidecar.as_deref();
        contracts::HyperswarmCapability {
            server_id: self.server_id.clone(),
            sidecar: sidecar.is_some(),
            announced: sidecar.is_some_and(|s| s.announced.load(Ordering::SeqCst)),
            sidecar_restarts: sidecar.map_or(0, |s| s.restarts.load(Ordering::SeqCst)),
        }
    }
}

/// Starts the listener (and the sidecar when configured); returns at once.
pub async fn start(state: &SharedState) -> anyhow::Result<HostInfo> {
    let cfg = state.cfg.hyperswarm.clone();
    let id = Identity::load_or_create(Path::new(&cfg.identity_path))?;
    let listener = TcpListener::bind(&cfg.listen).await?;
    let listen = listener.local_addr()?;
    let host_name = cfg.host_name.clone().unwrap_or_else(machine_name);
    let status = Arc::new(SidecarStatus::default());
    let info = HostInfo {
        server_id: id.server_id(),
        listen,
        sidecar: cfg.sidecar.enabled.then(|| status.clone()),
    };
    tracing::info!(server_id = %info.server_id, %listen, "hyperswarm host listening");
    let report = info.clone();
    let _ = state.hyperswarm.set(Box::new(move || report.capability()));
    let host = Arc::new(Host {
        state: state.clone(),
        cfg: cfg.clone(),
        host_name,
        shutdown: state.shutdown.clone(),
    });
    tokio::spawn(accept_loop(host, listener));
    if cfg.sidecar.enabled {
        tokio::spawn(sidecar::supervise(
            cfg.sidecar.clone(),
            id,
            listen,
            state.shutdown.clone(),
            status,
        ));
    }
    Ok(info)
}

fn machine_name() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "orchestratord".into())
}

/// A connection idle this long may be evicted for a newcomer when the host is full.
const MIN_IDLE_TO_EVICT: std::time::Duration = std::time::Duration::from_secs(1);

/// Serves a listener with the host protocol (the sidecar's target; tests use it directly).
/// At most `max_clients` connections: when full, the connection idle the longest makes room
/// (it is told why and closed); when every one has a request running, the newcomer is
/// refused.
pub async fn accept_loop(host: Arc<Host>, listener: TcpListener) {
    let max = host.cfg.max_clients;
    let peers = peers::Peers::new(max, MIN_IDLE_TO_EVICT);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = host.shutdown.cancelled() => return,
        };
        let (stream, addr) = match accepted {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "hyperswarm accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let place = peers.admit();
        let host = host.clone();
        tokio::spawn(async move {
            let (r, w) = stream.into_split();
            let Some(place) = place else {
                tracing::info!(%addr, max, "hyperswarm client refused: every connection is busy");
                connection::refuse(w, max).await;
                return;
            };
            connection::serve(host, r, w, place).await;
        });
    }
}
