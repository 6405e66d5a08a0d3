//! The accept loop. HTTP/1.1 only (hyper's HTTP/1 server, no protocol detection: reading a
//! preface to tell HTTP/2 apart would wait for bytes with no deadline). Bounds:
//! - a request head must arrive within `http.header_read_timeout_ms` of the accept, or of the
//!   end of the previous response on a kept-alive connection: a connection that says nothing
//!   is closed after it;
//! - at most `http.max_connections` connections are open; at the cap, an idle one (no request
//!   in flight; one that has sent nothing first, the longest idle first) gives its place to
//!   the newcomer, and only when every connection is busy with a request do new ones wait in
//!   the listen backlog (`connections.rs`);
//! - a request head larger than [`MAX_HEAD_BYTES`] is answered 431;
//! - a response write that stalls for `http.write_stall_timeout_ms` (a reader that stopped
//!   reading its SSE stream) closes the connection.
//!
//! On shutdown every connection is asked to finish its request and close; what is still open
//! `margin` later is dropped.

mod connections;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::{Frame, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_io_timeout::TimeoutStream;
use tokio_util::io::InspectReader;
use tower::ServiceExt;

use crate::config::HttpConfig;
pub use connections::Connections;
use connections::InFlight;

/// The largest request head read (hyper's buffer; its default is ~400 KB): a larger one is
/// answered 431 and the connection closed. Proxies allow 8–64 KB.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Serves `app` on `listener` until `stop` resolves; then waits for the open connections to
/// close, at most `margin`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    http: &HttpConfig,
    stop: impl std::future::Future<Output = ()>,
    margin: Duration,
) -> std::io::Result<()> {
    let table = Connections::new(http.max_connections);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .max_buf_size(MAX_HEAD_BYTES)
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(http.header_read_timeout_ms.max(1)));
    let write_stall = Duration::from_millis(http.write_stall_timeout_ms.max(1));
    let (closing_tx, closing) = watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = table.room() => {}
            _ = &mut stop => break,
        }
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(a) => a,
                Err(e) => {
                    // out of descriptors and the like: wait a moment, do not spin
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut stop => break,
        };
        let _ = stream.set_nodelay(true);
        let place = tokio::select! {
            p = table.admit() => p,
            _ = &mut stop => break,
        };
        let conn = place.conn().clone();
        let mut stream = TimeoutStream::new(stream);
        stream.set_write_timeout(Some(write_stall));
        let heard = conn.clone();
        let stream = InspectReader::new(stream, move |bytes: &[u8]| {
            if !bytes.is_empty() {
                heard.heard();
            }
        });
        let app = app.clone();
        let place = Arc::new(place);
        let on_request = place.clone();
        let svc = tower::service_fn(move |mut req: axum::http::Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(ConnectInfo::<SocketAddr>(peer));
            let in_flight = on_request.request();
            let app = app.clone();
            async move {
                let res = app.oneshot(req.map(Body::new)).await?;
                Ok::<_, Infallible>(res.map(|body| {
                    Body::new(Held {
                        body,
                        _in_flight: in_flight,
                    })
                }))
            }
        });
        let builder = builder.clone();
        let mut closing = closing.clone();
        connections.spawn(async move {
            let io = TokioIo::new(Box::pin(stream));
            let served = builder
                .serve_connection(io, hyper_util::service::TowerToHyperService::new(svc))
                .with_upgrades();
            tokio::pin!(served);
            tokio::select! {
                _ = served.as_mut() => {}
                asked = async { closing.wait_for(|c| *c).await.is_ok() } => {
                    if asked {
                        served.as_mut().graceful_shutdown();
                        let _ = served.await;
                    }
                }
                _ = conn.evicted().cancelled() => {
                    // its place went to a newcomer: an idle connection just closes; one whose
                    // request came in meanwhile finishes it first
                    if conn.is_busy() {
                        served.as_mut().graceful_shutdown();
                        let _ = served.await;
                    }
                }
            }
            drop(place);
        });
        // forget finished connections as we go (bounded by max_connections anyway)
        while connections.try_join_next().is_some() {}
    }
    drop(listener);
    let _ = closing_tx.send(true);
    let all_closed = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(margin, all_closed).await.is_err() {
        tracing::warn!(
            open = connections.len(),
            "connections still open after the shutdown margin: dropped"
        );
        connections.abort_all();
    }
    Ok(())
}

/// A response body that keeps its request in flight (the connection busy) until it ends.
struct Held {
    body: Body,
    _in_flight: InFlight,
}

impl hyper::body::Body for Held {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
