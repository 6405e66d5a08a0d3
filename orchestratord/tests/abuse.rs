//! Holding under abuse (issue 32's defects, each with the test that failed before its fix):
//! silent and surplus connections, HTTP/2 on the HTTP/1.1 port, trickled bodies — over real
//! sockets, with the scripted engine. The whole attack suite against a real server is
//! `ci/abuse.py`.

mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn addr(s: &TestServer) -> String {
    s.base.trim_start_matches("http://").to_string()
}

/// Reads until the peer closes, at most `within`; `Some(bytes)` when it closed in time.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    match tokio::time::timeout(within, stream.read_to_end(&mut buf)).await {
        Ok(_) => Some(buf),
        Err(_) => None,
    }
}

/// A request on its own connection, answered within `within`: its status line.
async fn health_within(addr: &str, within: Duration) -> Option<String> {
    let mut c = TcpStream::connect(addr).await.ok()?;
    c.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let answer = closed_within(&mut c, within).await?;
    let text = String::from_utf8_lossy(&answer).to_string();
    Some(text.lines().next().unwrap_or_default().to_string())
}

/// SEC-CONN-1: a connection that sends nothing at all is closed after
/// `http.header_read_timeout_ms` counted from the accept, as is a head that never ends and a
/// kept-alive connection that sends no next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_after_the_header_timeout() {
    let mut cfg = config(vec![pool("p1", 1)]);
    cfg.http.header_read_timeout_ms = 500;
    let s = start(cfg, Duration::from_millis(1)).await;
    let addr = addr(&s);
    let started = Instant::now();
    let mut silent = TcpStream::connect(&addr).await.unwrap();
    assert!(
        closed_within(&mut silent, Duration::from_secs(5))
            .await
            .is_some(),
        "a connection that never said a word stayed open"
    );
    assert!(started.elapsed() >= Duration::from_millis(400));
    let mut partial = TcpStream::connect(&addr).await.unwrap();
    partial
        .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    assert!(closed_within(&mut partial, Duration::from_secs(5))
        .await
        .is_some());
    // kept alive after one answer, then silent
    let mut kept = TcpStream::connect(&addr).await.unwrap();
    kept.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let answered = Instant::now();
    let all = closed_within(&mut kept, Duration::from_secs(5)).await;
    let all = all.expect("an idle kept-alive connection stayed open");
    assert!(all.starts_with(b"HTTP/1.1 200"));
    assert!(answered.elapsed() >= Duration::from_millis(400));
}

/// SEC-CONN-2: silent connections filling `http.max_connections` do not lock anyone out:
/// the newcomer takes the place of the idle one that said nothing longest (issue 32: 2,000
/// silent connects made every chat fail). Connections busy with a request keep their place;
/// while every place is busy, the next waits in the backlog until one frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_at_the_cap_give_way_to_requests() {
    let mut cfg = config(vec![pool("p1", 1)]);
    cfg.http.header_read_timeout_ms = 30_000;
    cfg.http.max_connections = 8;
    let s = start(cfg, Duration::from_millis(1)).await;
    let addr = addr(&s);
    let mut silent = Vec::new();
    for _ in 0..40 {
        silent.push(TcpStream::connect(&addr).await.unwrap());
    }
    for i in 0..5 {
        let status = health_within(&addr, Duration::from_secs(3)).await;
        assert_eq!(
            status.as_deref(),
            Some("HTTP/1.1 200 OK"),
            "request {i} beside 40 silent connections"
        );
    }
    drop(silent);
    // a full table of busy connections: streams that hold their request open
    let mut busy = Vec::new();
    for _ in 0..8 {
        let mut c = TcpStream::connect(&addr).await.unwrap();
        let body = json!({"prompt": "x", "max_tokens": 1}).to_string();
        let head = format!(
            "POST /v1/tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
            body.len() + 10,
            body
        );
        // the body is 10 bytes short: the request stays in flight
        c.write_all(head.as_bytes()).await.unwrap();
        busy.push(c);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let waiting = tokio::spawn({
        let addr = addr.clone();
        async move { health_within(&addr, Duration::from_secs(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "served while every place was busy");
    drop(busy.pop());
    let status = waiting.await.unwrap();
    assert_eq!(status.as_deref(), Some("HTTP/1.1 200 OK"));
    let m = s.metrics().await;
    assert!(counter(&m, "orchd_http_connections_evicted_total") >= 32.0);
}

/// SEC-CONN-4: the port speaks HTTP/1.1 only, as documented: an HTTP/2 preface (prior
/// knowledge, h2c) gets no HTTP/2 frames and the connection is closed at once, not held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_prior_knowledge_is_not_served() {
    let mut cfg = config(vec![pool("p1", 1)]);
    cfg.http.header_read_timeout_ms = 30_000;
    let s = start(cfg, Duration::from_millis(1)).await;
    let mut c = TcpStream::connect(addr(&s)).await.unwrap();
    c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    // an empty SETTINGS frame, as a client sends after the preface
    c.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
    let answer = closed_within(&mut c, Duration::from_secs(3))
        .await
        .expect("an HTTP/2 connection was held open");
    // an HTTP/2 server's first bytes are a SETTINGS frame (type 4 at offset 3)
    assert!(
        !(answer.len() >= 9 && answer[3] == 4),
        "answered with HTTP/2 frames: {answer:?}"
    );
}

/// SEC-CONN-3: a body trickled a byte at a time is cut at `http.body_read_timeout_ms` from
/// its head (issue 32: one byte every 5 s kept a connection open past 100 s): 408
/// `REQUEST_TIMEOUT`, and the connection closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_body_is_cut_at_its_deadline() {
    let mut cfg = config(vec![pool("p1", 1)]);
    cfg.http.body_read_timeout_ms = 800;
    let s = start(cfg, Duration::from_millis(1)).await;
    let mut c = TcpStream::connect(addr(&s)).await.unwrap();
    c.write_all(
        b"POST /v1/tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{",
    )
    .await
    .unwrap();
    let started = Instant::now();
    let (mut rd, mut wr) = c.into_split();
    let trickle = tokio::spawn(async move {
        // a byte every 100 ms: each gap well inside any per-read timeout
        for _ in 0..200 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if wr.write_all(b" ").await.is_err() {
                return;
            }
        }
    });
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), rd.read_to_end(&mut answer)).await;
    trickle.abort();
    assert!(read.is_ok(), "the trickled body held the connection");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("REQUEST_TIMEOUT"), "{text}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// POOL-SM-3: a drained pool whose reload fails is rolled back to drained, and says so:
/// health `drained` and not ready, `/readyz` 503, a pinned task refused because the pool is
/// drained; `resume` brings it back (issue 32: it said `ready` while refusing every task as
/// "drained and its deadline passed", and resume answered 409 "already serving").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_reload_of_a_drained_pool_leaves_it_drained() {
    let s = start(config(vec![pool("p1", 2)]), Duration::from_millis(1)).await;
    let r = s
        .post("/v1/pools/p1/drain", &json!({"deadline_ms": 20}))
        .await;
    assert_eq!(r.status(), 202);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let bad = fake_gguf("missing-reload-target");
    let r = s
        .post(
            "/v1/pools/p1/reload",
            &json!({"new_model_ref": bad.display().to_string()}),
        )
        .await;
    assert_eq!(r.status(), 409, "the reload fails and is rolled back");
    let h = s.get_json("/v1/pools/p1/health").await;
    assert_eq!(h["state"], "drained", "{h}");
    assert_eq!(h["ready"], false, "{h}");
    let ready = s.client.get(s.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    let r = s
        .submit(json!({"prompt": "x", "max_tokens": 2, "pool_id": "p1"}))
        .await;
    assert_eq!(r.status(), 503);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["code"], "POOL_UNREADY");
    assert!(v["message"].as_str().unwrap().contains("drained"), "{v}");
    let r = s.post("/v1/pools/p1/resume", &json!({})).await;
    assert_eq!(r.status(), 200, "resume works on a pool that refuses work");
    let h = s.get_json("/v1/pools/p1/health").await;
    assert_eq!(h["state"], "ready");
    let id = s
        .submit_ok(json!({"prompt": "x", "max_tokens": 2, "pool_id": "p1"}))
        .await;
    let events = s.stream_all(&id).await;
    assert_well_formed(&events);
    assert_eq!(events.last().unwrap().event, "end", "{events:?}");
}

/// A task submission with a 1.5 s deadline for its first token, on `client`, optionally
/// counting its tries; the status.
async fn hurried(s: &TestServer, client: &reqwest::Client, retry_header: bool) -> u16 {
    let mut r = client
        .post(s.url("/v1/tasks"))
        .header("X-Request-Deadline-Ms", "1500")
        .json(&json!({"prompt": "x", "max_tokens": 4}));
    if retry_header {
        r = r.header("X-Retry-Count", "0");
    }
    let r = r.send().await.unwrap();
    let status = r.status().as_u16();
    // read to the end: the connection goes back to the client's pool for the next request
    let _ = r.bytes().await;
    status
}

/// [`hurried`] counting its tries, on one kept-alive connection: the status.
async fn hurried_on(c: &mut TcpStream) -> u16 {
    let body = json!({"prompt": "x", "max_tokens": 4}).to_string();
    let req = format!(
        "POST /v1/tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nX-Request-Deadline-Ms: 1500\r\nX-Retry-Count: 0\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    c.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut b = [0u8; 1];
        c.read_exact(&mut b).await.unwrap();
        head.push(b[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    c.read_exact(&mut body).await.unwrap();
    head[9..12].parse().unwrap()
}

/// ORCH-ADM-RETRY-3: kept places cannot become phantom queue (issue 32: two loops retrying
/// 429s with no retry headers kept 64 places, and a polite client was refused 20 of 20 times
/// by a pool with free slots and an empty queue). A client that does not count its tries gets
/// no kept place (its retry could never claim it); one that does holds one place a
/// connection; and kept places never stand ahead of a free slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_places_never_lock_clients_out() {
    let s = start(config(vec![pool("p1", 2)]), Duration::from_millis(40)).await;
    // both slots busy for ~4 s, and a line behind them
    let mut long = Vec::new();
    for _ in 0..4 {
        long.push(s.submit_ok(json!({"prompt": "x", "max_tokens": 100})).await);
    }
    let kept = || s.state.queue.kept_places();
    // a tight loop that never says it retries
    for _ in 0..30 {
        assert_eq!(hurried(&s, &s.client, false).await, 429);
    }
    assert_eq!(kept(), 0, "places kept for a client that cannot claim them");
    // a client that counts its tries, on one kept-alive connection
    let mut one_connection = TcpStream::connect(addr(&s)).await.unwrap();
    for _ in 0..30 {
        assert_eq!(hurried_on(&mut one_connection).await, 429);
    }
    assert_eq!(kept(), 1, "one place a connection");
    // many connections each keep one (bounded in all by the queue's capacity)
    for _ in 0..10 {
        assert_eq!(hurried(&s, &s.client, true).await, 429);
    }
    assert!(kept() >= 5, "{}", kept());
    for id in &long {
        assert_eq!(s.cancel(id).await, 204);
    }
    // the slots are free again while the places are still kept
    let free = support::procs::eventually(Duration::from_secs(5), || async {
        let h = s.get_json("/v1/pools/p1/health").await;
        h["metrics"]["slots_busy"] == 0
    })
    .await;
    assert!(free, "the pool never came free");
    assert!(kept() >= 5, "the places lapsed before the check");
    for i in 0..5 {
        assert_eq!(
            hurried(&s, &s.client, false).await,
            202,
            "polite request {i} refused by an idle pool"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
