//! One connection of a worker to its server: register, then answer pings, run requests, obey
//! cancels, report models, and drain on `graceful_shutdown`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use contracts::worker::{ServerToWorker, TokenCounts, WorkerToServer, CONNECT_PATH, SECRET_HEADER};
use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use super::backend::{Backend, Utf8Chunks};
use super::held::{HeldReport, HELD_EVERY};
use super::WorkerOptions;
use crate::remote_workers::openai_wire::{read_object, StreamItem, StreamReader};

/// Longest wait for `register_ack`.
const ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest non-streamed backend body relayed.
const MAX_BODY_BYTES: usize = 8 << 20;
/// How often the worker checks whether its models changed.
const MODEL_CHECK: Duration = Duration::from_secs(5);

/// Why a connection could not be served.
#[derive(Debug)]
pub enum SessionError {
    /// The server closed the socket instead of acknowledging `register` (its reason).
    Refused(String),
    /// The server answered the connect with 401: the secret is not the one it expects.
    SecretRefused,
    Other(String),
}

impl From<String> for SessionError {
    fn from(s: String) -> Self {
        Self::Other(s)
    }
}

impl std::fmt::Display for SessionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Refused(why) => write!(f, "the server refused the registration: {why}"),
            Self::SecretRefused => f.write_str("the server refused the worker secret"),
            Self::Other(why) => f.write_str(why),
        }
    }
}

/// How a connection ended.
pub enum SessionEnd {
    /// Drained on the server's `graceful_shutdown`: the worker exits.
    Drained,
    /// The socket was lost after registering; `true`: it had registered (reset the backoff).
    Lost(String, bool),
}

/// The server URL as a WebSocket URL of the connect path.
pub fn connect_url(server: &str, provider: Option<&str>) -> String {
    let s = server.trim_end_matches('/');
    let s = if let Some(rest) = s.strip_prefix("http://") {
        format!("ws://{rest}")
    } else if let Some(rest) = s.strip_prefix("https://") {
        format!("wss://{rest}")
    } else {
        s.to_string()
    };
    let mut url = if s.ends_with(CONNECT_PATH) {
        s
    } else {
        format!("{s}{CONNECT_PATH}")
    };
    if let Some(p) = provider {
        url.push_str("?provider=");
        url.push_str(&p.replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_"));
    }
    url
}

/// Connects, registers with `protocol_version`, and serves until the socket ends.
pub async fn run_once(
    opts: &WorkerOptions,
    backend: &Arc<Backend>,
    protocol_version: &str,
) -> Result<SessionEnd, SessionError> {
    let url = connect_url(&opts.server, opts.provider.as_deref());
    let mut req = url
        .as_str()
        .into_client_request()
        .map_err(|e| format!("bad server URL {url}: {e}"))?;
    req.headers_mut().insert(
        SECRET_HEADER,
        opts.secret
            .parse()
            .map_err(|_| "the secret is not a valid header value".to_string())?,
    );
    let config = WebSocketConfig::default()
        .max_message_size(Some(opts.max_frame_bytes))
        .max_frame_size(Some(opts.max_frame_bytes));
    let (ws, _) = tokio_tungstenite::connect_async_with_config(req, Some(config), false)
        .await
        .map_err(|e| match e {
            tokio_tungstenite::tungstenite::Error::Http(r) if r.status() == 401 => {
                SessionError::SecretRefused
            }
            e => SessionError::Other(format!("connect {url}: {e}")),
        })?;
    let (mut sink, mut stream) = ws.split();
    let max_concurrent = opts
        .max_concurrent
        .unwrap_or_else(|| backend.default_max_concurrent());
    let mut models = backend.models().await;
    let register = WorkerToServer::Register {
        worker_name: opts.name.clone(),
        models: models.clone(),
        max_concurrent,
        protocol_version: Some(protocol_version.into()),
        current_load: Some(0),
    };
    sink.send(text(&register))
        .await
        .map_err(|e| format!("register: {e}"))?;
    let ack = tokio::time::timeout(ACK_TIMEOUT, stream.next())
        .await
        .map_err(|_| "no register_ack in time".to_string())?;
    let says_held = match ack {
        Some(Ok(Message::Text(t))) => match serde_json::from_str::<ServerToWorker>(&t) {
            Ok(ServerToWorker::RegisterAck {
                worker_id,
                models,
                warnings,
                held_prefixes,
                ..
            }) => {
                tracing::info!(%worker_id, ?models, "registered with the server");
                for w in warnings {
                    tracing::warn!(warning = %w, "server warning");
                }
                held_prefixes
            }
            other => return Err(format!("expected register_ack, got {other:?}").into()),
        },
        Some(Ok(Message::Close(f))) => {
            return Err(SessionError::Refused(
                f.map(|f| f.reason.to_string()).unwrap_or_default(),
            ))
        }
        other => return Err(format!("expected register_ack, got {other:?}").into()),
    };
    // what the engines hold, to a server that reads it
    let mut held = HeldReport::default();
    let mut held_tick = tokio::time::interval(HELD_EVERY);
    held_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (out_tx, mut out_rx) = mpsc::channel::<WorkerToServer>(256);
    let (done_tx, mut done_rx) = mpsc::channel::<String>(1024);
    let mut running: HashMap<String, CancellationToken> = HashMap::new();
    let mut draining = false;
    let mut check = tokio::time::interval(MODEL_CHECK);
    check.tick().await;
    loop {
        tokio::select! {
            frame = stream.next() => {
                let t = match frame {
                    Some(Ok(Message::Text(t))) => t,
                    Some(Ok(Message::Close(_))) | None if draining => return Ok(SessionEnd::Drained),
                    Some(Ok(Message::Close(f))) => {
                        let why = f.map(|f| f.reason.to_string()).unwrap_or_default();
                        return Ok(SessionEnd::Lost(format!("the server closed the socket: {why}"), true));
                    }
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => return Ok(SessionEnd::Lost(e.to_string(), true)),
                    None => return Ok(SessionEnd::Lost("the socket ended".into(), true)),
                };
                let msg = match serde_json::from_str::<ServerToWorker>(&t) {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::warn!(error = %e, "unreadable server frame");
                        let reply = WorkerToServer::Error { request_id: None, code: "bad_message".into(), message: e.to_string() };
                        send(&mut sink, &reply).await?;
                        continue;
                    }
                };
                match msg {
                    ServerToWorker::Ping { timestamp_unix_ms } => {
                        let pong = WorkerToServer::Pong { current_load: running.len() as u32, timestamp_unix_ms };
                        send(&mut sink, &pong).await?;
                    }
                    ServerToWorker::Request { request_id, endpoint_path, body, headers, is_streaming, .. } => {
                        if draining || running.len() >= max_concurrent as usize || running.contains_key(&request_id) {
                            let reply = WorkerToServer::Error {
                                request_id: Some(request_id),
                                code: if draining { "draining" } else { "busy" }.into(),
                                message: "the worker takes no more requests now".into(),
                            };
                            send(&mut sink, &reply).await?;
                            continue;
                        }
                        let cancel = CancellationToken::new();
                        running.insert(request_id.clone(), cancel.clone());
                        let job = Job { request_id, path: endpoint_path, body, headers, streaming: is_streaming };
                        tokio::spawn(run_request(backend.clone(), job, out_tx.clone(), cancel, done_tx.clone()));
                    }
                    ServerToWorker::Cancel { request_id, reason } => {
                        if let Some(c) = running.remove(&request_id) {
                            tracing::info!(%request_id, reason = reason.as_str(), "request cancelled by the server");
                            c.cancel();
                        }
                    }
                    ServerToWorker::GracefulShutdown { reason, drain_timeout_secs } => {
                        tracing::info!(?reason, ?drain_timeout_secs, in_flight = running.len(), "draining");
                        draining = true;
                        if running.is_empty() {
                            let _ = sink.close().await;
                            return Ok(SessionEnd::Drained);
                        }
                    }
                    ServerToWorker::ModelsRefresh { .. } => {
                        models = backend.models().await;
                        let up = WorkerToServer::ModelsUpdate { models: models.clone(), current_load: running.len() as u32 };
                        send(&mut sink, &up).await?;
                    }
                    ServerToWorker::RegisterAck { .. } => {}
                    ServerToWorker::Error { code, message, .. } => {
                        tracing::warn!(%code, %message, "the server could not read a frame of ours");
                    }
                }
            }
            Some(msg) = out_rx.recv() => send(&mut sink, &msg).await?,
            Some(id) = done_rx.recv() => {
                running.remove(&id);
                if draining && running.is_empty() {
                    // the server closes once it saw the last response; wait for that
                    continue;
                }
            }
            _ = held_tick.tick(), if says_held => {
                for frame in held.frames(backend) {
                    send(&mut sink, &frame).await?;
                }
            }
            _ = check.tick() => {
                let now = backend.models().await;
                if now != models {
                    models = now;
                    let up = WorkerToServer::ModelsUpdate { models: models.clone(), current_load: running.len() as u32 };
                    send(&mut sink, &up).await?;
                }
            }
        }
    }
}

fn text(msg: &WorkerToServer) -> Message {
    Message::Text(serde_json::to_string(msg).unwrap_or_default().into())
}

async fn send<S>(sink: &mut S, msg: &WorkerToServer) -> Result<(), String>
where
    S: futures::Sink<Message> + Unpin,
    S::Error: std::fmt::Display,
{
    sink.send(text(msg)).await.map_err(|e| e.to_string())
}

struct Job {
    request_id: String,
    path: String,
    body: String,
    headers: std::collections::BTreeMap<String, String>,
    streaming: bool,
}

/// Runs one request on the backend, relaying its body; a cancel drops the backend's stream,
/// which stops its work (the in-process engine within a decode step).
async fn run_request(
    backend: Arc<Backend>,
    job: Job,
    out: mpsc::Sender<WorkerToServer>,
    cancel: CancellationToken,
    done: mpsc::Sender<String>,
) {
    let id = job.request_id.clone();
    tokio::select! {
        _ = cancel.cancelled() => {}
        _ = relay(&backend, job, &out) => {}
    }
    let _ = done.send(id).await;
}

async fn relay(backend: &Backend, job: Job, out: &mpsc::Sender<WorkerToServer>) {
    let complete = |status_code: u16, ct: Option<String>, body, token_counts| {
        let mut headers = std::collections::BTreeMap::new();
        if let Some(ct) = ct {
            headers.insert("content-type".to_string(), ct);
        }
        WorkerToServer::ResponseComplete {
            request_id: job.request_id.clone(),
            status_code,
            headers,
            body,
            token_counts,
        }
    };
    let resp = match backend
        .send(&job.path, job.body.clone(), &job.headers)
        .await
    {
        Ok(r) => r,
        Err(e) => {
            let body =
                serde_json::json!({"error": {"message": format!("backend unreachable: {e}")}});
            let _ = out
                .send(complete(502, None, Some(body.to_string()), None))
                .await;
            return;
        }
    };
    let mut body = resp.body;
    let mut utf8 = Utf8Chunks::default();
    let mut usage: Option<TokenCounts> = None;
    if job.streaming && resp.status == 200 {
        let mut reader = StreamReader::default();
        while let Some(piece) = body.next().await {
            let bytes = match piece {
                Ok(b) => b,
                Err(e) => {
                    let msg = serde_json::json!({"error": {"message": format!("backend stream broke: {e}")}});
                    let _ = out
                        .send(complete(502, None, Some(msg.to_string()), usage))
                        .await;
                    return;
                }
            };
            let chunk = utf8.push(&bytes);
            if chunk.is_empty() {
                continue;
            }
            for item in reader.feed(&chunk) {
                if let StreamItem::Usage(u) = item {
                    usage = Some(u);
                }
            }
            let msg = WorkerToServer::ResponseChunk {
                request_id: job.request_id.clone(),
                chunk,
            };
            if out.send(msg).await.is_err() {
                return;
            }
        }
        let _ = out
            .send(complete(200, resp.content_type, None, usage))
            .await;
        return;
    }
    let mut all = Vec::new();
    while let Some(piece) = body.next().await {
        match piece {
            Ok(b) if all.len() + b.len() <= MAX_BODY_BYTES => all.extend_from_slice(&b),
            Ok(_) => break,
            Err(_) => break,
        }
    }
    let text = utf8.push(&all) + &utf8.finish();
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) {
        let mut items = Vec::new();
        read_object(&v, &mut items);
        usage = items.into_iter().find_map(|i| match i {
            StreamItem::Usage(u) => Some(u),
            _ => None,
        });
    }
    let _ = out
        .send(complete(resp.status, resp.content_type, Some(text), usage))
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls() {
        assert_eq!(
            connect_url("http://127.0.0.1:8080", None),
            "ws://127.0.0.1:8080/v1/worker/connect"
        );
        assert_eq!(
            connect_url("wss://relay.example/v1/worker/connect", Some("local")),
            "wss://relay.example/v1/worker/connect?provider=local"
        );
    }
}
