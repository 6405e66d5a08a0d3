//! `GET /v1/worker/connect`: the secret check, registration, and one worker's frame loop
//! (requests out, chunks in, heartbeat, model updates, drain).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{ConnectInfo, Query};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use contracts::worker::{
    unix_ms, ServerToWorker, WorkerToServer, PROTOCOL_V1, SECRET_HEADER, SUPPORTED_PROTOCOLS,
};
use contracts::ErrorCode;
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio::sync::mpsc;

use super::link::{RequestEvent, WorkerLink};
use super::WorkerHost;
use super::{drain, names, remove_pools, sync_pools};
use crate::auth::limiter as auth;
use crate::error::ApiError;
use crate::held_changes::decode;

/// Close code for a protocol violation (RFC 6455 1002) and for going away (1001).
const CLOSE_PROTOCOL: u16 = 1002;
const CLOSE_AWAY: u16 = 1001;
/// Longest wait to hand one frame to a request's relay before the request is dropped.
const ROUTE_WAIT: Duration = Duration::from_secs(2);

#[derive(Debug, Deserialize)]
pub struct ConnectQuery {
    /// The provider the worker serves for (recorded; routing is by model).
    pub provider: Option<String>,
    /// The secret, for clients that cannot set headers.
    pub worker_secret: Option<String>,
}

/// The WebSocket upgrade for workers: secret checked (constant time, failures limited per
/// address) before anything else.
pub async fn connect(
    state: Arc<dyn WorkerHost>,
    Query(q): Query<ConnectQuery>,
    headers: HeaderMap,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let w = &state.config().workers;
    let Some(secret) = w.active_secret() else {
        return ApiError::new(
            ErrorCode::NotFound,
            "remote workers are not enabled on this server (set [workers] secret or ORCHD_WORKER_SECRET)",
            false,
        )
        .into_response();
    };
    let peer_ip = peer
        .map(|Extension(ConnectInfo(a))| a.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let ip = crate::client_addr::client_ip(peer_ip, &headers, &state.config().http.trusted_proxies);
    let offered = headers
        .get(SECRET_HEADER)
        .and_then(|v| v.to_str().ok())
        .or(q.worker_secret.as_deref())
        .unwrap_or("");
    // counted per client and secret tried: the right secret is never refused for failures
    let attempt = auth::Attempt::new(ip, offered);
    if let Some(wait) = state.workers().limiter.limited_for(&attempt) {
        return ApiError::new(
            ErrorCode::AuthRateLimited,
            "too many failed worker authentications with this secret from this address",
            true,
        )
        .with_retry_after(wait.as_millis().max(1) as u64)
        .into_response();
    }
    if !auth::secret_matches(secret, offered) {
        state.workers().limiter.record_failure(attempt);
        crate::metrics::worker_auth_failed();
        tracing::warn!(peer = %ip, "worker refused: wrong or missing secret");
        return ApiError::new(
            ErrorCode::Unauthorized,
            "wrong or missing worker secret",
            false,
        )
        .into_response();
    }
    if state.is_shutting_down() {
        return ApiError::new(ErrorCode::ShuttingDown, "the server is shutting down", true)
            .with_retry_after(1000)
            .into_response();
    }
    let ws = match ws {
        Ok(ws) => ws,
        Err(e) => {
            return ApiError::invalid(
                "upgrade",
                format!("workers connect with a WebSocket upgrade: {e}"),
            )
            .into_response()
        }
    };
    let max = w.max_frame_bytes;
    ws.max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| serve_worker(state, socket, ip, q.provider))
}

fn close(code: u16, reason: &str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

fn text(msg: &ServerToWorker) -> Message {
    // plain data always serializes
    Message::Text(serde_json::to_string(msg).unwrap_or_default().into())
}

/// The fields of an accepted registration.
struct Registration {
    name: String,
    models: Vec<String>,
    max_concurrent: usize,
    protocol_version: Option<String>,
    load: usize,
    warnings: Vec<String>,
}

/// The models of a `register` or `models_update` that may become pools: names of the
/// documented form (`names.rs`), not a name a local pool answers to (unless
/// `workers.join_local_models`), not repeated, at most
/// `workers.max_models_per_worker`; why each other one is ignored goes to `warnings`.
fn accepted_models(
    state: &dyn WorkerHost,
    models: Vec<String>,
    warnings: &mut Vec<String>,
) -> Vec<String> {
    let limit = state.config().workers.max_models_per_worker;
    let local: Vec<_> = state
        .pools()
        .all()
        .into_iter()
        .filter(|p| p.spec().is_local())
        .collect();
    let mut clean: Vec<String> = Vec::new();
    for m in models {
        // the name as the log shows it: escaped, cut short
        let shown: String = m.escape_debug().take(80).collect();
        if let Some(why) = names::model_name_problem(&m) {
            warnings.push(format!("model \"{shown}\" ignored: {why}"));
        } else if !state.config().workers.join_local_models && local.iter().any(|p| p.serves(&m)) {
            warnings.push(format!(
                "model \"{shown}\" ignored: a model of this server has that name"
            ));
        } else if clean.contains(&m) {
            warnings.push(format!("model \"{shown}\" ignored: repeated"));
        } else if clean.len() >= limit {
            warnings.push(format!(
                "model \"{shown}\" ignored: at most {limit} models per worker"
            ));
        } else {
            clean.push(m);
        }
    }
    clean
}

/// Checks a `register`; `Err` is the close reason.
fn accept(state: &dyn WorkerHost, msg: WorkerToServer) -> Result<Registration, String> {
    let w = &state.config().workers;
    let WorkerToServer::Register {
        worker_name,
        models,
        max_concurrent,
        protocol_version,
        current_load,
    } = msg
    else {
        return Err("the first frame must be register".into());
    };
    if let Some(v) = protocol_version.as_deref() {
        if !SUPPORTED_PROTOCOLS.contains(&v) {
            return Err(format!(
                "unsupported protocol_version {v:?}; this server speaks {}",
                SUPPORTED_PROTOCOLS.join(", ")
            ));
        }
    }
    if max_concurrent == 0 {
        return Err("max_concurrent must be at least 1".into());
    }
    let name = if worker_name.is_empty() {
        "worker".to_string()
    } else {
        worker_name
    };
    if let Some(why) = names::worker_name_problem(&name) {
        return Err(format!("worker_name {name:?} refused: {why}"));
    }
    let mut warnings = Vec::new();
    let clean = accepted_models(state, models, &mut warnings);
    let cap = w.max_concurrent_per_worker;
    if max_concurrent > cap {
        warnings.push(format!("max_concurrent {max_concurrent} clamped to {cap}"));
    }
    Ok(Registration {
        name,
        models: clean,
        max_concurrent: max_concurrent.min(cap) as usize,
        protocol_version,
        load: current_load.unwrap_or(0) as usize,
        warnings,
    })
}

async fn serve_worker(
    state: Arc<dyn WorkerHost>,
    mut socket: WebSocket,
    peer: IpAddr,
    provider: Option<String>,
) {
    let w = &state.config().workers;
    let first =
        tokio::time::timeout(Duration::from_millis(w.register_timeout_ms), socket.next()).await;
    let msg = match first {
        Ok(Some(Ok(Message::Text(t)))) => serde_json::from_str::<WorkerToServer>(&t)
            .map_err(|e| format!("the first frame must be register: {e}")),
        Ok(_) => Err("the first frame must be a register text frame".to_string()),
        Err(_) => Err("no register frame in time".to_string()),
    };
    let reg = match msg.and_then(|m| accept(state.as_ref(), m)) {
        Ok(r) => r,
        Err(why) => {
            tracing::warn!(peer = %peer, reason = %why, "worker registration refused");
            let _ = socket.send(close(CLOSE_PROTOCOL, &why)).await;
            crate::metrics::worker_disconnected("refused");
            return;
        }
    };
    let mut outbound = None;
    let added = state.workers().add(&reg.name, |id| {
        let (link, rx) = WorkerLink::new(
            id,
            reg.name.clone(),
            reg.protocol_version.clone(),
            reg.max_concurrent,
            w.chunk_backlog,
            reg.load,
        );
        outbound = Some(rx);
        Arc::new(link)
    });
    let (Some(link), Some(outbound)) = (added, outbound) else {
        let _ = socket
            .send(close(
                CLOSE_AWAY,
                &format!("too many workers connected ({})", w.max_workers),
            ))
            .await;
        crate::metrics::worker_disconnected("refused");
        return;
    };
    let id = link.id.clone();
    sync_pools(state.as_ref(), &link, &reg.models);
    let ack = ServerToWorker::RegisterAck {
        worker_id: id.clone(),
        models: reg.models.clone(),
        warnings: reg.warnings,
        protocol_version: Some(
            reg.protocol_version
                .clone()
                .unwrap_or_else(|| PROTOCOL_V1.into()),
        ),
        held_prefixes: true,
    };
    tracing::info!(
        worker_id = %id, worker_name = %reg.name, peer = %peer, provider = ?provider,
        models = ?reg.models, max_concurrent = reg.max_concurrent, "worker registered"
    );
    let reason = if socket.send(text(&ack)).await.is_ok() {
        frame_loop(state.as_ref(), &link, socket, outbound).await
    } else {
        "closed"
    };
    // no new placement on its pools, then every relay sees the loss and requeues its task
    link.closed.cancel();
    remove_pools(state.as_ref(), &id);
    link.lose_all();
    state.workers().remove(&id);
    crate::metrics::worker_disconnected(reason);
    tracing::info!(worker_id = %id, reason, "worker disconnected");
    state.wake();
}

async fn frame_loop(
    state: &dyn WorkerHost,
    link: &Arc<WorkerLink>,
    socket: WebSocket,
    mut outbound: mpsc::Receiver<ServerToWorker>,
) -> &'static str {
    let w = &state.config().workers;
    let beat = Duration::from_millis(w.heartbeat_interval_ms);
    let silence = Duration::from_millis(w.pong_timeout_ms);
    let (mut sink, mut stream) = socket.split();
    let mut ping = tokio::time::interval(beat);
    ping.tick().await;
    let refresh_every = Duration::from_millis(w.models_refresh_interval_ms.max(1));
    let mut refresh =
        tokio::time::interval_at(tokio::time::Instant::now() + refresh_every, refresh_every);
    let mut last_heard = Instant::now();
    let mut shutdown_seen = false;
    // a frame the worker does not take in time (stopped, or its buffers full) is a lost worker
    macro_rules! send_or {
        ($msg:expr, $reason:expr) => {
            match tokio::time::timeout(silence, sink.send($msg)).await {
                Ok(Ok(())) => {}
                _ => return $reason,
            }
        };
    }
    loop {
        tokio::select! {
            frame = stream.next() => match frame {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return "closed",
                Some(Ok(Message::Text(t))) => {
                    last_heard = Instant::now();
                    if let Some(reply) = handle_frame(state, link, &t).await {
                        send_or!(text(&reply), "closed");
                    }
                }
                Some(Ok(Message::Binary(_))) => {
                    last_heard = Instant::now();
                    let reply = ServerToWorker::Error {
                        request_id: None,
                        code: "bad_message".into(),
                        message: "binary frames are not part of the protocol".into(),
                    };
                    send_or!(text(&reply), "closed");
                }
                Some(Ok(_)) => last_heard = Instant::now(),
            },
            msg = outbound.recv() => match msg {
                Some(m) => send_or!(text(&m), "heartbeat"),
                None => return "closed",
            },
            _ = ping.tick() => {
                if last_heard.elapsed() > silence {
                    tracing::warn!(worker_id = %link.id, silent_ms = last_heard.elapsed().as_millis() as u64, "worker heartbeat timed out");
                    let _ = tokio::time::timeout(beat, sink.send(close(CLOSE_AWAY, "worker heartbeat timed out"))).await;
                    return "heartbeat";
                }
                send_or!(text(&ServerToWorker::Ping { timestamp_unix_ms: Some(unix_ms()) }), "heartbeat");
            }
            _ = refresh.tick(), if w.models_refresh_interval_ms > 0 => {
                send_or!(text(&ServerToWorker::ModelsRefresh { reason: Some("periodic".into()) }), "heartbeat");
            }
            _ = link.drained.cancelled() => {
                // what is queued (graceful_shutdown, a last cancel) goes out before the close
                while let Ok(m) = outbound.try_recv() {
                    send_or!(text(&m), "drained");
                }
                let _ = tokio::time::timeout(beat, sink.send(close(1000, "drained"))).await;
                return "drained";
            }
            _ = state.shutdown().cancelled(), if !shutdown_seen => {
                shutdown_seen = true;
                drain(state, link, "server_shutdown", Duration::from_millis(state.config().shutdown_grace_ms));
            }
        }
    }
}

/// Handles one text frame; returns a reply for frames that cannot be read.
async fn handle_frame(
    state: &dyn WorkerHost,
    link: &Arc<WorkerLink>,
    text: &str,
) -> Option<ServerToWorker> {
    let msg = match serde_json::from_str::<WorkerToServer>(text) {
        Ok(m) => m,
        Err(e) => {
            tracing::warn!(worker_id = %link.id, error = %e, "unreadable worker frame");
            return Some(ServerToWorker::Error {
                request_id: None,
                code: "bad_message".into(),
                message: format!("unreadable frame: {e}"),
            });
        }
    };
    let (request_id, ev) = match msg {
        WorkerToServer::Pong { current_load, .. } => {
            set_load(state, link, current_load);
            return None;
        }
        WorkerToServer::ModelsUpdate {
            models,
            current_load,
        } => {
            set_load(state, link, current_load);
            let mut ignored = Vec::new();
            let clean = accepted_models(state, models, &mut ignored);
            for why in &ignored {
                tracing::warn!(worker_id = %link.id, %why, "worker model ignored");
            }
            tracing::info!(worker_id = %link.id, models = ?clean, "worker models updated");
            sync_pools(state, link, &clean);
            return None;
        }
        WorkerToServer::HeldPrefixes {
            model,
            seq,
            full,
            added,
            evicted,
        } => {
            let (Some(added), Some(evicted)) = (decode(&added), decode(&evicted)) else {
                return Some(ServerToWorker::Error {
                    request_id: None,
                    code: "bad_message".into(),
                    message: "held_prefixes: added and evicted are base64 of little-endian u64s"
                        .into(),
                });
            };
            link.take_held(&model, seq, full, &added, &evicted);
            return None;
        }
        WorkerToServer::Register { .. } => {
            return Some(ServerToWorker::Error {
                request_id: None,
                code: "bad_message".into(),
                message: "already registered".into(),
            })
        }
        WorkerToServer::Error {
            request_id: None,
            code,
            message,
        } => {
            tracing::warn!(worker_id = %link.id, %code, %message, "worker reported an error");
            return None;
        }
        WorkerToServer::Error {
            request_id: Some(id),
            code,
            message,
        } => (id, RequestEvent::Error { code, message }),
        WorkerToServer::ResponseChunk { request_id, chunk } => {
            (request_id, RequestEvent::Chunk(chunk))
        }
        WorkerToServer::ResponseComplete {
            request_id,
            status_code,
            body,
            token_counts,
            ..
        } => (
            request_id,
            RequestEvent::Complete {
                status_code,
                body,
                token_counts,
            },
        ),
    };
    // frames of a request that already ended (cancelled) are dropped
    if let Some(tx) = link.route(&request_id) {
        if tokio::time::timeout(ROUTE_WAIT, tx.send(ev)).await.is_err() {
            tracing::warn!(worker_id = %link.id, %request_id, "request backlog full: dropped");
            link.close_request(&request_id);
        }
    }
    None
}

fn set_load(state: &dyn WorkerHost, link: &WorkerLink, load: u32) {
    if link.set_reported_load(load as usize) {
        state.wake();
    }
}
