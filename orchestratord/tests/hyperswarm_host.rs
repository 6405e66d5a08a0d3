//! HS-PROTO-4..: the Hyperswarm host protocol (seed 000) over a plain loopback socket with the
//! scripted engine (no sidecar): every message and error path, busy semantics, client limit,
//! timeouts, disconnects, and a stable Server ID.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::*;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

struct Peer {
    lines: tokio::io::Lines<BufReader<OwnedReadHalf>>,
    w: OwnedWriteHalf,
}

impl Peer {
    async fn connect(s: &TestServer) -> Peer {
        let addr = s.background.hyperswarm.as_ref().expect("host runs").listen;
        let (r, w) = TcpStream::connect(addr).await.unwrap().into_split();
        Peer {
            lines: BufReader::new(r).lines(),
            w,
        }
    }

    async fn send(&mut self, line: &str) {
        self.w.write_all(line.as_bytes()).await.unwrap();
        self.w.write_all(b"\n").await.unwrap();
    }

    async fn send_json(&mut self, v: Value) {
        self.send(&v.to_string()).await;
    }

    /// The next message, or None when the host closed the connection.
    async fn next(&mut self) -> Option<Value> {
        let line = tokio::time::timeout(Duration::from_secs(10), self.lines.next_line())
            .await
            .expect("a message within 10 s")
            .ok()??;
        Some(serde_json::from_str(&line).unwrap())
    }

    async fn expect(&mut self) -> Value {
        self.next().await.expect("connection open")
    }

    /// Messages of one request until its chat_end (inclusive).
    async fn until_end(&mut self, id: &str) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            let m = self.expect().await;
            assert_eq!(m["request_id"], id, "{m}");
            let end = m["type"] == "chat_end";
            out.push(m);
            if end {
                return out;
            }
        }
    }
}

fn hs_config(slots: usize) -> orchestratord::config::Config {
    let mut cfg = config(vec![pool("p1", slots)]);
    cfg.hyperswarm.enabled = true;
    cfg.hyperswarm.sidecar.enabled = false;
    cfg.hyperswarm.host_name = Some("test-host".into());
    cfg.hyperswarm.max_tokens = 5;
    cfg.hyperswarm.identity_path = std::env::temp_dir()
        .join(format!(
            "orchd-hs-{}-{}.json",
            std::process::id(),
            rand_suffix()
        ))
        .display()
        .to_string();
    cfg
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::SeqCst)
}

fn start_msg(id: &str, prompt: &str) -> Value {
    json!({"type": "chat_start", "request_id": id, "payload": {"prompt": prompt}})
}

/// HS-PROTO-4: server_info, a full lifecycle with one request_id, abort with nothing after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_and_abort() {
    let s = start(hs_config(2), Duration::from_millis(5)).await;
    let mut p = Peer::connect(&s).await;
    p.send(r#"{"type":"_peer","payload":{"public_key":"ab12"}}"#)
        .await;
    let info = p.expect().await;
    assert_eq!(info["type"], "server_info");
    assert_eq!(
        info["payload"],
        json!({"host_name": "test-host", "model": "scripted-model", "status": "ready"})
    );
    p.send_json(start_msg("r1", "hello there")).await;
    let msgs = p.until_end("r1").await;
    let (end, chunks) = msgs.split_last().unwrap();
    assert_eq!(chunks.len(), 5);
    assert!(chunks.iter().all(|m| m["type"] == "chat_chunk"));
    let text: String = chunks
        .iter()
        .map(|m| m["payload"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "tok0 tok1 tok2 tok3 tok4 ");
    assert_eq!(end["payload"]["finish_reason"], "stop");
    assert_eq!(end["payload"]["length"], true);
    assert_eq!(end["payload"]["usage"]["completion_tokens"], 5);

    // numeric ids are echoed as numbers; abort mid-stream ends with chat_end abort
    p.send_json(json!({"type": "chat_start", "request_id": 42, "payload": {"prompt": "go", "max_tokens": 200}}))
        .await;
    let first = p.expect().await;
    assert_eq!(first["type"], "chat_chunk");
    assert_eq!(first["request_id"], 42);
    p.send_json(json!({"type": "abort", "request_id": 42, "payload": {}}))
        .await;
    let mut last = p.expect().await;
    while last["type"] == "chat_chunk" {
        last = p.expect().await;
    }
    assert_eq!(last["type"], "chat_end");
    assert_eq!(last["payload"]["finish_reason"], "abort");
    // nothing more for 42: the next message is the answer to a new request
    p.send_json(start_msg("r3", "x")).await;
    let m = p.expect().await;
    assert_eq!(m["request_id"], "r3", "{m}");
    p.until_end("r3").await;
    // an abort for nothing running is ignored
    p.send_json(json!({"type": "abort", "request_id": "nope"}))
        .await;
    p.send_json(start_msg("r4", "x")).await;
    assert_eq!(p.expect().await["request_id"], "r4");
}

/// HS-PROTO-5: BAD_MESSAGE for every unreadable line, and the connection keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_do_not_break_the_connection() {
    let s = start(hs_config(2), Duration::from_millis(1)).await;
    let mut p = Peer::connect(&s).await;
    p.expect().await;
    let cases: Vec<(String, Option<&str>)> = vec![
        ("this is not json".into(), None),
        (
            r#"{"payload":{"prompt":"x"},"request_id":"a"}"#.into(),
            Some("a"),
        ),
        (
            r#"{"type":"dance","request_id":"b","payload":{}}"#.into(),
            Some("b"),
        ),
        (start_msg("c", &"é".repeat(4200)).to_string(), Some("c")),
        (
            r#"{"type":"chat_start","request_id":"d","payload":{}}"#.into(),
            Some("d"),
        ),
        (
            r#"{"type":"chat_start","payload":{"prompt":"x"}}"#.into(),
            None,
        ),
        (
            r#"{"type":"_peer","payload":{"public_key":"late"}}"#.into(),
            None,
        ),
        (
            format!(
                r#"{{"type":"chat_start","request_id":"e","payload":{{"prompt":"{}"}}}}"#,
                "y".repeat(100 * 1024)
            ),
            None,
        ),
    ];
    for (line, id) in cases {
        p.send(&line).await;
        let m = p.expect().await;
        assert_eq!(m["type"], "error", "{m}");
        assert_eq!(m["payload"]["code"], "BAD_MESSAGE", "{m}");
        assert!(!m["payload"]["message"].as_str().unwrap().is_empty());
        assert_eq!(m["request_id"].as_str(), id, "{m}");
    }
    p.w.write_all(b"\xff\xfe\n").await.unwrap();
    assert_eq!(p.expect().await["payload"]["code"], "BAD_MESSAGE");
    // an error from the peer with a code we do not know is logged, nothing answered
    p.send(r#"{"type":"error","payload":{"code":"SOMETHING_NEW","message":"hm"}}"#)
        .await;
    p.send_json(start_msg("ok", "fine")).await;
    let msgs = p.until_end("ok").await;
    assert_eq!(msgs.last().unwrap()["payload"]["finish_reason"], "stop");
}

/// HS-PROTO-6: MODEL_BUSY for a second request on one connection and for a full queue;
/// server_info says busy when no slot is free; unknown model; engine failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_and_failures_are_typed() {
    let mut cfg = hs_config(1);
    cfg.queue.capacity = 1;
    let s = start(cfg, Duration::from_millis(20)).await;
    let mut a = Peer::connect(&s).await;
    a.expect().await;
    a.send_json(json!({"type": "chat_start", "request_id": "long", "payload": {"prompt": "x", "max_tokens": 100}}))
        .await;
    assert_eq!(a.expect().await["type"], "chat_chunk");
    a.send_json(start_msg("second", "y")).await;
    let mut m = a.expect().await;
    while m["type"] == "chat_chunk" {
        m = a.expect().await;
    }
    assert_eq!(m["request_id"], "second");
    assert_eq!(m["payload"]["code"], "MODEL_BUSY");
    // the only slot is busy: a new peer sees "busy"; one queued task fills the queue
    let mut b = Peer::connect(&s).await;
    let info = b.expect().await;
    assert_eq!(info["payload"]["status"], "busy");
    let _queued = s.submit_ok(json!({"prompt": "q", "max_tokens": 3})).await;
    b.send_json(start_msg("full", "z")).await;
    let m = b.expect().await;
    assert_eq!(m["payload"]["code"], "MODEL_BUSY", "{m}");
    assert!(m["payload"]["message"]
        .as_str()
        .unwrap()
        .contains("queue full"));
    b.send_json(json!({"type": "chat_start", "request_id": "m", "payload": {"prompt": "z", "model": "gpt-9"}}))
        .await;
    let m = b.expect().await;
    assert_eq!(m["payload"]["code"], "OLLAMA_MODEL_NOT_AVAILABLE", "{m}");
    a.send_json(json!({"type": "abort", "request_id": "long"}))
        .await;
    drop(a);
    // an engine failure mid-stream: error GENERATION_FAILED then chat_end error
    tokio::time::sleep(Duration::from_millis(300)).await;
    b.send_json(json!({"type": "chat_start", "request_id": "f", "payload": {"prompt": "boom [fail]", "max_tokens": 50}}))
        .await;
    let msgs = b.until_end("f").await;
    let err = &msgs[msgs.len() - 2];
    assert_eq!(err["type"], "error");
    assert_eq!(err["payload"]["code"], "GENERATION_FAILED");
    assert_eq!(msgs.last().unwrap()["payload"]["finish_reason"], "error");
}

/// HS-PROTO-7, SEC-HS-1: when the host is full a newcomer takes the place of the idlest
/// connection (told CONNECT_FAILED and closed); when every connection is busy the newcomer is
/// refused; a disconnect cancels the peer's task; no progress → TIMEOUT_NO_RESPONSE; idle
/// connections are closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_disconnects_and_timeouts() {
    let mut cfg = hs_config(2);
    cfg.hyperswarm.max_clients = 2;
    cfg.hyperswarm.no_progress_timeout_ms = 300;
    cfg.hyperswarm.idle_timeout_ms = 1500;
    cfg.timeouts.idle_ms = 10_000;
    let s = start(cfg, Duration::from_millis(10)).await;
    let mut a = Peer::connect(&s).await;
    a.expect().await;
    let mut b = Peer::connect(&s).await;
    b.expect().await;
    b.send_json(json!({"type": "chat_start", "request_id": "d", "payload": {"prompt": "x", "max_tokens": 200}}))
        .await;
    assert_eq!(b.expect().await["type"], "chat_chunk");
    // full: the newcomer takes idle a's place (idle a second or more), never busy b's
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut c = Peer::connect(&s).await;
    assert_eq!(c.expect().await["type"], "server_info");
    let evicted = a.expect().await;
    assert_eq!(evicted["payload"]["code"], "CONNECT_FAILED");
    assert!(a.next().await.is_none(), "the evicted connection is closed");
    // every connection busy: refused
    c.send_json(json!({"type": "chat_start", "request_id": "e", "payload": {"prompt": "x", "max_tokens": 200}}))
        .await;
    assert_eq!(c.expect().await["type"], "chat_chunk");
    let mut x = Peer::connect(&s).await;
    let refused = x.expect().await;
    assert_eq!(refused["type"], "error");
    assert_eq!(refused["payload"]["code"], "CONNECT_FAILED");
    assert!(x.next().await.is_none(), "refused connection is closed");
    c.send_json(json!({"type": "abort", "request_id": "e"}))
        .await;
    loop {
        let m = c.expect().await;
        if m["type"] == "chat_end" {
            break;
        }
    }

    // a disconnect cancels the running task and frees the slot
    let disconnects = || async {
        counter(
            &s.metrics().await,
            "orchd_tasks_cancelled_total{reason=\"disconnect\"}",
        )
    };
    let before = disconnects().await;
    b.send_json(json!({"type": "chat_start", "request_id": "d", "payload": {"prompt": "x", "max_tokens": 200}}))
        .await;
    assert_eq!(b.expect().await["type"], "chat_chunk");
    drop(b);
    let mut waited = 0;
    while disconnects().await - before < 1.0 && waited < 100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += 1;
    }
    assert_eq!(disconnects().await - before, 1.0);
    // the freed client place is usable again
    let mut d = Peer::connect(&s).await;
    assert_eq!(d.expect().await["type"], "server_info");

    // a request that makes no progress ends TIMEOUT_NO_RESPONSE, then chat_end error
    c.send_json(start_msg("h", "stuck [hang]")).await;
    let msgs = c.until_end("h").await;
    assert_eq!(msgs[0]["payload"]["code"], "TIMEOUT_NO_RESPONSE");
    assert_eq!(msgs[1]["payload"]["finish_reason"], "error");
    // an idle connection is told and closed
    let m = d.expect().await;
    assert_eq!(m["payload"]["code"], "TIMEOUT_NO_RESPONSE");
    assert!(d.next().await.is_none());
}

/// SEC-HS-1: one connection per remote public key (the sidecar's `_peer` line); a peer that
/// floods messages past the rate gets BAD_MESSAGE for the excess, then is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_per_peer_key_and_a_message_rate() {
    let mut cfg = hs_config(1);
    cfg.hyperswarm.max_clients = 4;
    cfg.hyperswarm.max_messages_per_second = 5;
    let s = start(cfg, Duration::from_millis(1)).await;
    let peer_line = json!({"type": "_peer", "payload": {"public_key": "ab12cd"}});
    let mut a = Peer::connect(&s).await;
    a.expect().await;
    a.send_json(peer_line.clone()).await;
    let mut b = Peer::connect(&s).await;
    b.expect().await;
    b.send_json(peer_line.clone()).await;
    let m = b.expect().await;
    assert_eq!(m["payload"]["code"], "CONNECT_FAILED", "{m}");
    assert!(b.next().await.is_none());
    // a keeps its connection; another key is welcome
    let mut c = Peer::connect(&s).await;
    c.expect().await;
    c.send_json(json!({"type": "_peer", "payload": {"public_key": "ef34"}}))
        .await;
    // a flood: a burst of 5 passes (aborts of nothing answer nothing), the rest is refused
    for i in 0..40 {
        a.send_json(json!({"type": "abort", "request_id": format!("n{i}")}))
            .await;
    }
    let mut refused = 0;
    while let Some(m) = a.next().await {
        assert_eq!(m["payload"]["code"], "BAD_MESSAGE", "{m}");
        refused += 1;
    }
    assert!(refused > 20, "refused {refused}, then closed");
    // the well-behaved peer is unaffected
    c.send_json(start_msg("ok", "hello")).await;
    let msgs = c.until_end("ok").await;
    assert_eq!(msgs.last().unwrap()["type"], "chat_end");
}

/// HS-ID-2: the Server ID is in capabilities and stays the same across restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_id_is_stable_across_restarts() {
    let cfg = hs_config(1);
    let path = cfg.hyperswarm.identity_path.clone();
    let first = {
        let s = start(cfg.clone(), Duration::from_millis(1)).await;
        let caps = s.get_json("/v1/capabilities").await;
        assert_eq!(caps["hyperswarm"]["sidecar"], false);
        caps["hyperswarm"]["server_id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let s = start(cfg, Duration::from_millis(1)).await;
    let caps = s.get_json("/v1/capabilities").await;
    assert_eq!(caps["hyperswarm"]["server_id"], first);
    let _ = std::fs::remove_file(path);
}
