//! ORCH-SSE-4, ORCH-CAN-2 with a real browser: headless Chromium (Debian's
//! `chromium-headless-shell`, installed by `ci/install-debs.sh`) opens an `EventSource` on a
//! task's stream through a TCP proxy that cuts the first stream connection mid-stream. The
//! browser reconnects by itself with `Last-Event-ID`; the page must see every event exactly
//! once, in order, ending with `end` (the task was not cancelled by the cut).
//!
//! The test drives the browser over the DevTools protocol (a WebSocket) and runs the page's
//! script on the server's own origin, so no CORS is involved.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use support::browser::Browser;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the proxy saw of the stream requests.
#[derive(Default)]
struct Seen {
    stream_requests: Vec<String>,
}

/// Forwards every connection to `upstream`. The connection that carries the first request
/// for a task stream (browsers reuse connections, so any of them may) is cut `cut_after`
/// after that request: the browser sees a network error mid-stream.
async fn proxy(upstream: String, cut_after: Duration, seen: Arc<Mutex<Seen>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let streams = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((client, _)) = listener.accept().await else {
                return;
            };
            let upstream = upstream.clone();
            let (seen, streams) = (seen.clone(), streams.clone());
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    return;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let cut = tokio_util::sync::CancellationToken::new();
                let up = {
                    let cut = cut.clone();
                    async move {
                        let mut buf = vec![0u8; 16384];
                        loop {
                            let n = match cr.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            let text = String::from_utf8_lossy(&buf[..n]).to_string();
                            if text.starts_with("GET /v1/tasks/") && text.contains("/stream") {
                                seen.lock().unwrap().stream_requests.push(text);
                                if streams.fetch_add(1, Ordering::SeqCst) == 0 {
                                    let cut = cut.clone();
                                    tokio::spawn(async move {
                                        tokio::time::sleep(cut_after).await;
                                        cut.cancel();
                                    });
                                }
                            }
                            if sw.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                };
                let down = tokio::io::copy(&mut sr, &mut cw);
                // dropping both sockets resets the browser's connection mid-stream
                tokio::select! {
                    _ = cut.cancelled() => {}
                    _ = futures::future::join(up, down) => {}
                }
            });
        }
    });
    addr
}

/// The page's side: an `EventSource` on the task's stream that records every event with its
/// `lastEventId` and resolves at the terminal event (or after 30 s).
fn follow_script(task_id: &str) -> String {
    format!(
        r#"new Promise((resolve) => {{
  const seen = [];
  let errors = 0;
  const es = new EventSource('/v1/tasks/{task_id}/stream');
  const done = (why) => {{ es.close(); resolve({{ seen, errors, why }}); }};
  for (const name of ['started', 'token', 'metrics', 'end', 'error']) {{
    es.addEventListener(name, (e) => {{
      seen.push({{ id: e.lastEventId, event: name, data: JSON.parse(e.data) }});
      if (name === 'end' || name === 'error') done('terminal');
    }});
  }}
  es.onerror = () => {{ errors += 1; }};
  setTimeout(() => done('timeout'), 30000);
}})"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eventsource_cut_off_mid_stream_resumes_without_loss_or_duplicates() {
    let s = start(config(vec![pool("p1", 2)]), Duration::from_millis(40)).await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let upstream = s.base.trim_start_matches("http://").to_string();
    let front = proxy(upstream, Duration::from_millis(500), seen.clone()).await;
    let mut browser = Browser::launch().await;
    browser.goto(&format!("http://{front}/v1/models")).await;
    let max_tokens = 40;
    let id = s
        .submit_ok(json!({"prompt": "a browser follows this", "max_tokens": max_tokens}))
        .await;
    let got = browser.eval(&follow_script(&id)).await;
    assert_eq!(got["why"], "terminal", "{got}");
    assert!(
        got["errors"].as_u64().unwrap() >= 1,
        "the cut was seen: {got}"
    );
    let events = got["seen"].as_array().unwrap();
    // every event once, in order: ids are 0, 1, 2, … with no gap and no repeat
    for (i, ev) in events.iter().enumerate() {
        assert_eq!(ev["id"], i.to_string(), "event {i} of {events:?}");
    }
    let tokens: Vec<&Value> = events.iter().filter(|e| e["event"] == "token").collect();
    assert_eq!(tokens.len(), max_tokens);
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!(t["data"]["i"], i, "token order");
    }
    let last = events.last().unwrap();
    assert_eq!(
        (
            last["event"].as_str(),
            last["data"]["finish_reason"].as_str()
        ),
        (Some("end"), Some("length"))
    );
    // the browser came back on its own, saying where it was
    let requests = seen.lock().unwrap().stream_requests.clone();
    assert!(requests.len() >= 2, "{requests:?}");
    assert!(
        requests[1].to_ascii_lowercase().contains("last-event-id:"),
        "the reconnect carried Last-Event-ID: {}",
        requests[1]
    );
    assert_eq!(
        s.record(&id).await["transcript"].as_array().unwrap().len(),
        events.len()
    );
}
