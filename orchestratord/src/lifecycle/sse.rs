//! The SSE writer of the task API: a [`Subscription`] written as `text/event-stream`. Each
//! event carries its `id:` (its position in the task), so a client that reconnects with
//! `Last-Event-ID` resumes right after it; the first chunk says `retry:` so browsers come back
//! within the disconnect grace period. Events are serialized straight into one reusable
//! buffer per stream (no per-token allocation here), all pending events in one chunk.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, Response, StatusCode};
use bytes::{BufMut, BytesMut};
use futures::Stream;

use super::subscription::Subscription;

/// How soon a browser's `EventSource` should reconnect after losing the stream.
pub const RECONNECT_MS: u64 = 1000;

struct Writer {
    sub: Subscription,
    buf: BytesMut,
    keepalive: Option<Duration>,
}

/// Appends the unread events as SSE frames. Returns true once the terminal event is written.
fn write_pending(w: &mut Writer) -> bool {
    let buf = &mut w.buf;
    w.sub.read_pending(|id, ev| {
        buf.put_slice(b"id: ");
        buf.put_slice(id.to_string().as_bytes());
        buf.put_slice(b"\nevent: ");
        buf.put_slice(ev.name().as_bytes());
        buf.put_slice(b"\ndata: ");
        // writing JSON into BytesMut cannot fail
        let _ = ev.write_json(buf.writer());
        buf.put_slice(b"\n\n");
    })
}

fn event_stream(w: Writer) -> impl Stream<Item = Result<Bytes, std::io::Error>> {
    futures::stream::unfold(Some(w), |st| async move {
        let mut w = st?;
        loop {
            let finished = write_pending(&mut w);
            if !w.buf.is_empty() {
                let chunk = w.buf.split().freeze();
                // after the terminal event the stream ends with this chunk
                return Some((Ok(chunk), (!finished).then_some(w)));
            }
            if finished {
                return None;
            }
            if !w.sub.wait(w.keepalive).await {
                // keep-alive: an SSE comment line, ignored by parsers
                return Some((Ok(Bytes::from_static(b": keep-alive\n\n")), Some(w)));
            }
        }
    })
}

/// The streaming response of `sub` (headers set for proxies and caches).
pub fn response(sub: Subscription, keepalive_ms: u64) -> Response<Body> {
    let mut buf = BytesMut::with_capacity(4096);
    buf.put_slice(format!("retry: {RECONNECT_MS}\n\n").as_bytes());
    let w = Writer {
        sub,
        buf,
        keepalive: (keepalive_ms > 0).then(|| Duration::from_millis(keepalive_ms)),
    };
    event_stream_response(Body::from_stream(event_stream(w)))
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
