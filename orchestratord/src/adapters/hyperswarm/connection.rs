//! One peer connection: `server_info` on connect, then `chat_start` → task → `chat_chunk`* →
//! `chat_end`, `abort`, timeouts, and `BAD_MESSAGE` for whatever cannot be read. Everything a
//! connection writes comes from this one loop, so nothing is sent after a request's `chat_end`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use contracts::{ChatTurn, TaskRequest};
use futures::stream::BoxStream;
use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::StreamMap;
use tokio_util::sync::CancellationToken;

use super::line_reader::{read_lines, Line};
use super::peers::PeerHandle;
use super::protocol::{parse, ChatStart, Incoming, Outgoing, PeerCode, RequestId};
use crate::adapters::follow;
use crate::app_state::SharedState;
use crate::auth::Caller;
use crate::config::HyperswarmConfig;
use crate::lifecycle::deadline::Delivery;
use crate::lifecycle::task::{Task, TaskEvent};
use crate::metrics::CancelReason;

/// The tenant Hyperswarm peers' tasks belong to (they reach the host by its Server ID, not
/// with an API key).
pub const HYPERSWARM_TENANT: &str = "hyperswarm";

/// What every connection of one host shares.
pub struct Host {
    pub state: SharedState,
    pub cfg: HyperswarmConfig,
    pub host_name: String,
    pub shutdown: CancellationToken,
}

impl Host {
    /// The model chats run on.
    pub fn model(&self) -> String {
        self.cfg.model.clone().unwrap_or_else(|| {
            self.state
                .pools
                .all()
                .first()
                .map(|p| p.spec().model_alias.clone())
                .unwrap_or_default()
        })
    }

    /// `ready` while a pool serving the model has a free slot, else `busy`.
    pub fn status(&self) -> &'static str {
        let model = self.model();
        let free = self
            .state
            .pools
            .all()
            .iter()
            .filter(|p| p.serves(&model))
            .any(|p| p.snapshot().slots_free() > 0);
        if free {
            "ready"
        } else {
            "busy"
        }
    }
}

struct Running {
    task: Arc<Task>,
    last_progress: Instant,
}

struct Conn<W> {
    host: Arc<Host>,
    writer: W,
    /// Each running request's subscription: dropping it (the connection went away) cancels
    /// the task.
    events: StreamMap<RequestId, BoxStream<'static, TaskEvent>>,
    running: HashMap<RequestId, Running>,
    last_activity: Instant,
    lines_seen: u64,
    peer: Option<String>,
    place: PeerHandle,
    /// Messages the peer may still send now (refilled at `max_messages_per_second`).
    allowance: f64,
    refilled: Instant,
    /// Messages over the rate so far; past `RATE_STRIKES` the connection is closed.
    strikes: u32,
}

/// Messages over the rate a connection may send before it is closed.
const RATE_STRIKES: u32 = 20;

/// Sends `CONNECT_FAILED` to a connection over the client limit and closes it.
pub async fn refuse<W: AsyncWrite + Unpin>(mut writer: W, max: usize) {
    let msg = Outgoing::error(
        &PeerCode::ConnectFailed,
        &format!("the host serves at most {max} clients at once; try again later"),
        None,
    );
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let _ = writer.write_all(&msg.encode()).await;
        let _ = writer.shutdown().await;
    })
    .await;
}

/// Serves one connection until the peer leaves, the host shuts down, it idles out, or a
/// newcomer takes its place while it is idle.
pub async fn serve<R, W>(host: Arc<Host>, reader: R, writer: W, place: PeerHandle)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin,
{
    let (tx, mut lines) = mpsc::channel::<Line>(8);
    let reading = tokio::spawn(read_lines(reader, host.cfg.max_line_bytes, tx));
    let mut c = Conn {
        writer,
        events: StreamMap::new(),
        running: HashMap::new(),
        last_activity: Instant::now(),
        lines_seen: 0,
        peer: None,
        place,
        allowance: host.cfg.max_messages_per_second.max(1) as f64,
        refilled: Instant::now(),
        strikes: 0,
        host: host.clone(),
    };
    let info = Outgoing::server_info(&host.host_name, &host.model(), host.status());
    let mut open = c.send(&info).await;
    while open {
        let deadline = c.deadline();
        tokio::select! {
            _ = host.shutdown.cancelled() => {
                c.end_all(&PeerCode::HostOffline, "the host is shutting down").await;
                open = false;
            }
            line = lines.recv() => {
                open = match line {
                    Some(l) => c.on_line(l).await,
                    None => false,
                };
            }
            Some((id, ev)) = c.events.next(), if !c.events.is_empty() => {
                open = c.on_event(id, ev).await;
            }
            _ = tokio::time::sleep_until(deadline) => {
                open = c.on_timeout().await;
            }
            _ = c.place.evicted() => {
                let _ = c.send(&Outgoing::error(
                    &PeerCode::ConnectFailed,
                    "the host is full and this connection was idle the longest; reconnect when you need it",
                    None,
                )).await;
                open = false;
            }
        }
        c.place.update(c.running.len());
    }
    reading.abort();
    let _ = c.writer.shutdown().await;
    // dropping `c` cancels whatever still runs (the peer went away)
    tracing::debug!(peer = ?c.peer, "hyperswarm connection closed");
}

impl<W: AsyncWrite + Unpin> Conn<W> {
    fn no_progress(&self) -> Duration {
        Duration::from_millis(self.host.cfg.no_progress_timeout_ms)
    }

    fn deadline(&self) -> Instant {
        if self.running.is_empty() {
            self.last_activity + Duration::from_millis(self.host.cfg.idle_timeout_ms)
        } else {
            let oldest = self
                .running
                .values()
                .map(|r| r.last_progress)
                .min()
                .unwrap_or_else(Instant::now);
            oldest + self.no_progress()
        }
    }

    /// Writes one message; false when the peer is gone or stopped reading for too long.
    async fn send(&mut self, msg: &Outgoing) -> bool {
        let bytes = msg.encode();
        matches!(
            tokio::time::timeout(self.no_progress(), self.writer.write_all(&bytes)).await,
            Ok(Ok(()))
        )
    }

    async fn bad(&mut self, message: &str, id: Option<&RequestId>) -> bool {
        tracing::debug!(peer = ?self.peer, message, "hyperswarm BAD_MESSAGE");
        self.send(&Outgoing::error(&PeerCode::BadMessage, message, id))
            .await
    }

    /// Whether one more message fits the rate (a token bucket of one second's messages).
    fn within_rate(&mut self) -> bool {
        let rate = self.host.cfg.max_messages_per_second.max(1) as f64;
        let now = Instant::now();
        let refill = now.duration_since(self.refilled).as_secs_f64() * rate;
        self.allowance = (self.allowance + refill).min(rate);
        self.refilled = now;
        if self.allowance >= 1.0 {
            self.allowance -= 1.0;
            true
        } else {
            false
        }
    }

    async fn on_line(&mut self, line: Line) -> bool {
        self.last_activity = Instant::now();
        self.lines_seen += 1;
        if !self.within_rate() {
            self.strikes += 1;
            if self.strikes > RATE_STRIKES {
                let _ = self
                    .bad("message rate limit exceeded again and again; closing", None)
                    .await;
                return false;
            }
            let rate = self.host.cfg.max_messages_per_second;
            return self
                .bad(
                    &format!("message rate limit exceeded ({rate} per second): message dropped"),
                    None,
                )
                .await;
        }
        let max_line = self.host.cfg.max_line_bytes;
        let text = match line {
            Line::Text(t) => t,
            Line::TooLong(n) => {
                return self
                    .bad(
                        &format!("line of {n} bytes exceeds the limit of {max_line}"),
                        None,
                    )
                    .await
            }
            Line::NotUtf8 => return self.bad("the line is not valid UTF-8", None).await,
        };
        match parse(&text, self.host.cfg.max_prompt_bytes) {
            Err(r) => self.bad(&r.message, r.request_id.as_ref()).await,
            Ok(Incoming::Peer { public_key }) if self.lines_seen == 1 => {
                // peer-supplied text is logged escaped (Debug), never raw
                if self.place.set_key(&public_key).is_err() {
                    tracing::info!(peer = ?public_key, "hyperswarm peer refused: already connected");
                    let _ = self
                        .send(&Outgoing::error(
                            &PeerCode::ConnectFailed,
                            "this peer already has a connection to the host",
                            None,
                        ))
                        .await;
                    return false;
                }
                tracing::info!(peer = ?public_key, "hyperswarm peer connected");
                self.peer = Some(public_key);
                true
            }
            Ok(Incoming::Peer { .. }) => {
                self.bad("_peer is only valid as the first line", None)
                    .await
            }
            Ok(Incoming::PeerError {
                code,
                message,
                request_id,
            }) => {
                // unknown codes are generic errors: logged with their message
                tracing::warn!(peer = ?self.peer, code = ?code.as_str(), generic = matches!(code, PeerCode::Other(_)), ?message, request_id = ?request_id.map(|r| r.0), "error from peer");
                true
            }
            Ok(Incoming::Abort(id)) => self.abort(id).await,
            Ok(Incoming::ChatStart(id, start)) => self.start(id, start).await,
        }
    }

    async fn start(&mut self, id: RequestId, start: ChatStart) -> bool {
        if self.running.contains_key(&id) {
            return self
                .bad(
                    "a request with this request_id is already running",
                    Some(&id),
                )
                .await;
        }
        let max = self.host.cfg.max_requests_per_connection;
        if self.running.len() >= max {
            return self
                .send(&Outgoing::error(
                    &PeerCode::ModelBusy,
                    &format!("{max} request(s) already running on this connection"),
                    Some(&id),
                ))
                .await;
        }
        let host = self.host.clone();
        let mut messages = Vec::with_capacity(2);
        if !host.cfg.system_prompt.is_empty() {
            messages.push(ChatTurn {
                role: "system".into(),
                content: host.cfg.system_prompt.clone(),
            });
        }
        messages.push(ChatTurn {
            role: "user".into(),
            content: start.prompt,
        });
        let cap = host.state.cfg.admission.max_tokens_out;
        let req = TaskRequest {
            messages: Some(messages),
            model: Some(start.model.unwrap_or_else(|| host.model())),
            max_tokens: Some(start.max_tokens.unwrap_or(host.cfg.max_tokens).min(cap)),
            temperature: start.temperature,
            seed: start.seed,
            ..Default::default()
        };
        let caller = Caller::internal(HYPERSWARM_TENANT, format!("hyperswarm-{}", id.0));
        match follow::admit(&host.state, req, &caller, Delivery::Streamed).await {
            Ok(task) => {
                self.events.insert(
                    id.clone(),
                    follow::subscribe(&host.state, &task).events().boxed(),
                );
                self.running.insert(
                    id,
                    Running {
                        task,
                        last_progress: Instant::now(),
                    },
                );
                true
            }
            Err(e) => {
                let code = PeerCode::from_task_error(e.code());
                self.send(&Outgoing::error(&code, &e.envelope.message, Some(&id)))
                    .await
            }
        }
    }

    async fn abort(&mut self, id: RequestId) -> bool {
        let Some(run) = self.running.remove(&id) else {
            // finished already (or never started): nothing to stop
            tracing::debug!(request_id = ?id.0, "abort for no running request");
            return true;
        };
        self.host.state.cancel_task(&run.task, CancelReason::Client);
        self.events.remove(&id);
        self.send(&Outgoing::end(&id, "abort", None)).await
    }

    async fn on_event(&mut self, id: RequestId, ev: TaskEvent) -> bool {
        let Some(run) = self.running.get_mut(&id) else {
            return true;
        };
        match ev {
            TaskEvent::Started(_) | TaskEvent::Metrics(_) => true,
            TaskEvent::Token(t) => {
                run.last_progress = Instant::now();
                if t.t.is_empty() {
                    return true;
                }
                self.send(&Outgoing::chunk(&id, &t.t)).await
            }
            TaskEvent::End(end) => {
                let prompt = run.task.prompt_tokens_used() as usize;
                self.finish(&id);
                let reason = if end.finish_reason == "cancelled" {
                    "abort"
                } else {
                    "stop"
                };
                let tokens = Some((prompt, end.tokens_out, end.finish_reason == "length"));
                self.send(&Outgoing::end(&id, reason, tokens)).await
            }
            TaskEvent::Error(e) => {
                self.finish(&id);
                let code = PeerCode::from_task_error(e.code);
                self.send(&Outgoing::error(&code, &e.message, Some(&id)))
                    .await
                    && self.send(&Outgoing::end(&id, "error", None)).await
            }
        }
    }

    fn finish(&mut self, id: &RequestId) {
        self.events.remove(id);
        self.running.remove(id);
    }

    async fn on_timeout(&mut self) -> bool {
        let now = Instant::now();
        if self.running.is_empty() {
            if now < self.last_activity + Duration::from_millis(self.host.cfg.idle_timeout_ms) {
                return true;
            }
            let _ = self
                .send(&Outgoing::error(
                    &PeerCode::TimeoutNoResponse,
                    "no message for too long; closing",
                    None,
                ))
                .await;
            return false;
        }
        let limit = self.no_progress();
        let stale: Vec<RequestId> = self
            .running
            .iter()
            .filter(|(_, r)| now >= r.last_progress + limit)
            .map(|(id, _)| id.clone())
            .collect();
        for id in stale {
            if let Some(run) = self.running.remove(&id) {
                self.host.state.cancel_task(&run.task, CancelReason::Client);
                self.events.remove(&id);
                let msg = format!("no token for {} ms", limit.as_millis());
                if !(self
                    .send(&Outgoing::error(
                        &PeerCode::TimeoutNoResponse,
                        &msg,
                        Some(&id),
                    ))
                    .await
                    && self.send(&Outgoing::end(&id, "error", None)).await)
                {
                    return false;
                }
            }
        }
        true
    }

    /// Ends every running request with `code` (host shutdown).
    async fn end_all(&mut self, code: &PeerCode, message: &str) {
        let ids: Vec<RequestId> = self.running.keys().cloned().collect();
        for id in ids {
            if let Some(run) = self.running.remove(&id) {
                self.host.state.cancel_task(&run.task, CancelReason::Client);
                self.events.remove(&id);
                let _ = self.send(&Outgoing::error(code, message, Some(&id))).await;
                let _ = self.send(&Outgoing::end(&id, "error", None)).await;
            }
        }
    }
}
