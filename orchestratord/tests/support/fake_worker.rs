//! A worker that speaks the seed-002 protocol frame by frame as the test says: a real
//! WebSocket client for orchestration edge cases (drops, loads, cancels) that a real backend
//! cannot be told to produce on cue.

use std::time::Duration;

use contracts::worker::{ServerToWorker, WorkerToServer, SECRET_HEADER};
use futures::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

pub struct FakeWorker {
    ws: Ws,
    /// `current_load` this worker answers pings with.
    pub load: u32,
}

/// Connects to `base` (`http://host:port`) with `secret` in the header; the HTTP status on
/// refusal.
pub async fn connect(base: &str, secret: &str) -> Result<FakeWorker, u16> {
    connect_as(base, secret, false).await
}

/// Connects with the secret in the header, or in the `worker_secret` query parameter.
pub async fn connect_as(base: &str, secret: &str, in_query: bool) -> Result<FakeWorker, u16> {
    let mut url = format!(
        "{}/v1/worker/connect?provider=test",
        base.replace("http://", "ws://")
    );
    if in_query {
        url.push_str(&format!("&worker_secret={secret}"));
    }
    let mut req = url.into_client_request().unwrap();
    if !in_query {
        req.headers_mut()
            .insert(SECRET_HEADER, secret.parse().unwrap());
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((ws, _)) => Ok(FakeWorker { ws, load: 0 }),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err(r.status().as_u16()),
        Err(e) => panic!("connect: {e}"),
    }
}

/// What the server sent next, or how the socket ended.
#[derive(Debug)]
pub enum Next {
    Msg(ServerToWorker),
    Closed(Option<String>),
    Quiet,
}

impl FakeWorker {
    pub async fn send(&mut self, msg: &WorkerToServer) {
        let t = serde_json::to_string(msg).unwrap();
        self.ws.send(Message::Text(t.into())).await.unwrap();
    }

    pub async fn send_raw(&mut self, text: &str) {
        self.ws.send(Message::Text(text.into())).await.unwrap();
    }

    /// Registers and returns the ack.
    pub async fn register(
        &mut self,
        name: &str,
        models: &[&str],
        max_concurrent: u32,
    ) -> ServerToWorker {
        self.send(&WorkerToServer::Register {
            worker_name: name.into(),
            models: models.iter().map(|m| m.to_string()).collect(),
            max_concurrent,
            protocol_version: Some("1".into()),
            current_load: Some(self.load),
        })
        .await;
        match self.next(Duration::from_secs(5)).await {
            Next::Msg(m @ ServerToWorker::RegisterAck { .. }) => m,
            other => panic!("expected register_ack, got {other:?}"),
        }
    }

    /// The next frame other than a ping (pings are answered with `load`).
    pub async fn next(&mut self, wait: Duration) -> Next {
        let until = tokio::time::Instant::now() + wait;
        loop {
            let frame = match tokio::time::timeout_at(until, self.ws.next()).await {
                Err(_) => return Next::Quiet,
                Ok(f) => f,
            };
            match frame {
                Some(Ok(Message::Text(t))) => {
                    let m: ServerToWorker = serde_json::from_str(&t).unwrap();
                    if let ServerToWorker::Ping { timestamp_unix_ms } = m {
                        let pong = WorkerToServer::Pong {
                            current_load: self.load,
                            timestamp_unix_ms,
                        };
                        let t = serde_json::to_string(&pong).unwrap();
                        // the server may have closed already; the close frame follows
                        let _ = self.ws.send(Message::Text(t.into())).await;
                        continue;
                    }
                    return Next::Msg(m);
                }
                Some(Ok(Message::Close(f))) => {
                    return Next::Closed(f.map(|f| f.reason.to_string()))
                }
                Some(Ok(_)) => continue,
                Some(Err(_)) | None => return Next::Closed(None),
            }
        }
    }

    /// The next `request` (panics on anything else but pings).
    pub async fn request(
        &mut self,
    ) -> (
        String,
        String,
        serde_json::Value,
        std::collections::BTreeMap<String, String>,
    ) {
        match self.next(Duration::from_secs(10)).await {
            Next::Msg(ServerToWorker::Request {
                request_id,
                endpoint_path,
                body,
                headers,
                ..
            }) => (
                request_id,
                endpoint_path,
                serde_json::from_str(&body).unwrap(),
                headers,
            ),
            other => panic!("expected a request, got {other:?}"),
        }
    }

    /// Streams `pieces` as OpenAI chat chunks, then completes the request.
    pub async fn answer(&mut self, request_id: &str, pieces: &[&str]) {
        for p in pieces {
            let chunk = serde_json::json!({"choices": [{"index": 0, "delta": {"content": p}}]});
            self.send(&WorkerToServer::ResponseChunk {
                request_id: request_id.into(),
                chunk: format!("data: {chunk}\n\n"),
            })
            .await;
        }
        let last =
            serde_json::json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
        self.send(&WorkerToServer::ResponseChunk {
            request_id: request_id.into(),
            chunk: format!("data: {last}\n\ndata: [DONE]\n\n"),
        })
        .await;
        self.send(&WorkerToServer::ResponseComplete {
            request_id: request_id.into(),
            status_code: 200,
            headers: Default::default(),
            body: None,
            token_counts: Some(contracts::worker::TokenCounts {
                prompt_tokens: 11,
                completion_tokens: pieces.len() as u64,
                total_tokens: 11 + pieces.len() as u64,
                cached_tokens: 0,
            }),
        })
        .await;
    }

    /// Drops the TCP connection without a close frame (a crash).
    pub fn crash(self) {
        drop(self.ws);
    }
}
