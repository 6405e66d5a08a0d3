//! The SSE writer: replays a task's transcript from the start, then follows it live, and ends
//! right after the terminal event. Events are serialized straight into one reusable buffer per
//! stream (no per-token allocation here), all pending events in one chunk.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, Response, StatusCode};
use bytes::{BufMut, BytesMut};
use futures::Stream;
use tokio::sync::watch;

use crate::lifecycle::task::Task;
use crate::metrics::CancelReason;
use crate::state::SharedState;

/// Cancels the task if the client goes away before the terminal event.
struct DisconnectGuard {
    state: SharedState,
    task: Arc<Task>,
    cancel_on_disconnect: bool,
    done: bool,
}

impl Drop for DisconnectGuard {
    fn drop(&mut self) {
        if !self.done && self.cancel_on_disconnect && !self.task.is_terminal() {
            self.state.cancel_task(&self.task, CancelReason::Disconnect);
        }
    }
}

struct StreamState {
    guard: DisconnectGuard,
    changes: watch::Receiver<u64>,
    cursor: usize,
    buf: BytesMut,
    keepalive: Option<Duration>,
}

/// Appends events `cursor..` as SSE frames. Returns true once the terminal event is written.
fn write_pending(s: &mut StreamState) -> bool {
    let task = s.guard.task.clone();
    let g = task.lock();
    let end = g.events.len();
    for ev in &g.events[s.cursor..end] {
        s.buf.put_slice(b"event: ");
        s.buf.put_slice(ev.name().as_bytes());
        s.buf.put_slice(b"\ndata: ");
        // writing JSON into BytesMut cannot fail
        let _ = ev.write_json((&mut s.buf).writer());
        s.buf.put_slice(b"\n\n");
    }
    s.cursor = end;
    g.is_terminal() && end == g.events.len()
}

fn event_stream(s: StreamState) -> impl Stream<Item = Result<Bytes, std::io::Error>> {
    futures::stream::unfold(Some(s), |st| async move {
        let mut s = st?;
        loop {
            let finished = write_pending(&mut s);
            if !s.buf.is_empty() {
                let chunk = s.buf.split().freeze();
                if finished {
                    s.guard.done = true;
                    // the stream ends after this chunk
                    return Some((Ok(chunk), None));
                }
                return Some((Ok(chunk), Some(s)));
            }
            if finished {
                s.guard.done = true;
                return None;
            }
            let wait = s.changes.changed();
            let changed = match s.keepalive {
                Some(k) => tokio::time::timeout(k, wait).await.ok(),
                None => Some(wait.await),
            };
            match changed {
                // keep-alive: an SSE comment line, ignored by parsers
                None => return Some((Ok(Bytes::from_static(b": keep-alive\n\n")), Some(s))),
                Some(Err(_)) => {
                    // the task was dropped from the store; finish with what we have
                    s.guard.done = true;
                    return None;
                }
                Some(Ok(())) => {}
            }
        }
    })
}

/// The streaming response for `task` (headers set for proxies and caches).
pub fn response(state: SharedState, task: Arc<Task>) -> Response<Body> {
    let cfg = &state.cfg.stream;
    let keepalive = (cfg.keepalive_ms > 0).then(|| Duration::from_millis(cfg.keepalive_ms));
    let s = StreamState {
        changes: task.subscribe(),
        guard: DisconnectGuard {
            cancel_on_disconnect: cfg.cancel_on_disconnect,
            state: state.clone(),
            task,
            done: false,
        },
        cursor: 0,
        buf: BytesMut::with_capacity(4096),
        keepalive,
    };
    event_stream_response(Body::from_stream(event_stream(s)))
}

/// A 200 `text/event-stream` response with the headers proxies and caches need.
pub fn event_stream_response(body: Body) -> Response<Body> {
    let mut resp = Response::new(body);
    *resp.status_mut() = StatusCode::OK;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}
