//! The accept loop (HTTP/1.1): at most `http.max_connections` connections served at once (the rest wait
//! in the listen backlog), a request head must arrive within `http.header_read_timeout_ms`,
//! and a response write that stalls for `http.write_stall_timeout_ms` (a reader that stopped
//! reading its SSE stream) closes the connection. On shutdown every connection is asked to
//! finish its request and close; what is still open `margin` later is dropped.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio_io_timeout::TimeoutStream;
use tower::ServiceExt;

use crate::config::HttpConfig;

/// Serves `app` on `listener` until `stop` resolves; then waits for the open connections to
/// close, at most `margin`.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    http: &HttpConfig,
    stop: impl std::future::Future<Output = ()>,
    margin: Duration,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(http.max_connections.max(1)));
    // HTTP/1.1 only: detecting an HTTP/2 preface would read the first bytes with no timeout,
    // so a connection that never sends anything would hold its place forever (clients speak
    // HTTP/2 to a TLS-terminating proxy, not to this port)
    let mut builder = Builder::new(TokioExecutor::new()).http1_only();
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(http.header_read_timeout_ms.max(1)));
    let write_stall = Duration::from_millis(http.write_stall_timeout_ms.max(1));
    let (closing_tx, closing) = watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(stop);
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = &mut stop => break,
        };
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
        let mut stream = TimeoutStream::new(stream);
        stream.set_write_timeout(Some(write_stall));
        let svc =
            app.clone()
                .map_request(move |mut req: axum::http::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(ConnectInfo::<SocketAddr>(peer));
                    req
                });
        let builder = builder.clone();
        let mut closing = closing.clone();
        connections.spawn(async move {
            let io = TokioIo::new(Box::pin(stream));
            let conn = builder.serve_connection_with_upgrades(io, TowerToHyperService::new(svc));
            tokio::pin!(conn);
            let asked_to_close = tokio::select! {
                _ = conn.as_mut() => false,
                r = closing.wait_for(|c| *c) => r.is_ok(),
            };
            if asked_to_close {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
            drop(permit);
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
