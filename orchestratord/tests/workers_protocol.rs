//! Remote workers, protocol edges (WRK-*): a server on a real socket and workers that speak
//! seed 002 frame by frame over real WebSockets, so each edge (refusals, loads, losses,
//! cancels, timeouts, drains) happens exactly when the test says.

mod support;

use std::time::Duration;

use contracts::worker::{CancelReason, ServerToWorker, WorkerToServer};
use serde_json::json;
use support::fake_worker::{connect, FakeWorker, Next};
use support::{config, start, TestServer};

const SECRET: &str = "test-secret";

async fn server(tune: impl FnOnce(&mut orchestratord::config::Config)) -> TestServer {
    let mut c = config(vec![]);
    c.workers.secret = Some(SECRET.into());
    tune(&mut c);
    start(c, Duration::from_millis(5)).await
}

async fn worker(s: &TestServer, name: &str, models: &[&str], max: u32) -> FakeWorker {
    let mut w = connect(&s.base, SECRET).await.expect("accepted");
    w.register(name, models, max).await;
    w
}

fn chat(model: &str, stream: bool) -> serde_json::Value {
    json!({"model": model, "stream": stream, "max_tokens": 16,
           "messages": [{"role": "user", "content": "Say hello"}]})
}

/// Sends a chat in the background (the worker answers it meanwhile).
fn spawn_chat(
    s: &TestServer,
    model: &str,
    stream: bool,
) -> tokio::task::JoinHandle<reqwest::Result<reqwest::Response>> {
    let req = s
        .client
        .post(s.url("/v1/chat/completions"))
        .json(&chat(model, stream));
    tokio::spawn(req.send())
}

async fn pools_of_kind(s: &TestServer, kind: &str) -> Vec<String> {
    let v = s.get_json("/v1/pools").await;
    v["pools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["kind"] == kind)
        .map(|p| p["pool_id"].as_str().unwrap().to_string())
        .collect()
}

/// WRK-AUTH-1, WRK-AUTH-2: a wrong or missing secret is 401 before any upgrade, failures are
/// counted per address and secret tried: a wrong secret repeated past the limit is answered
/// 429, while the right secret from the same address still connects (issue 32: it was 429
/// too). The secret may come in the `worker_secret` query parameter.
#[tokio::test]
async fn wrong_secret_is_refused_and_limited() {
    let s = server(|c| c.workers.max_auth_failures_per_minute = 3).await;
    let mut by_query = support::fake_worker::connect_as(&s.base, SECRET, true)
        .await
        .expect("accepted with the query parameter");
    by_query.register("q", &["m"], 1).await;
    drop(by_query);
    for bad in ["nope", ""] {
        assert_eq!(connect(&s.base, bad).await.err(), Some(401));
    }
    for _ in 0..3 {
        assert_eq!(connect(&s.base, "test-secre").await.err(), Some(401));
    }
    assert_eq!(connect(&s.base, "test-secre").await.err(), Some(429));
    let m = s.metrics().await;
    assert_eq!(
        support::counter(&m, "orchd_worker_auth_failures_total"),
        5.0
    );
    assert!(s.get_json("/v1/workers").await["workers"]
        .as_array()
        .unwrap()
        .is_empty());
    let mut ok = connect(&s.base, SECRET)
        .await
        .expect("the right secret is never refused for others' failures");
    ok.register("w", &["m"], 1).await;
}

/// WRK-REG-1: an unknown protocol_version is refused with a close frame saying why; "1" and
/// the modelrelay daemon's "2026-04-bridge-v1" are accepted, and so is none.
#[tokio::test]
async fn protocol_versions() {
    let s = server(|_| {}).await;
    let mut w = connect(&s.base, SECRET).await.unwrap();
    w.send(&WorkerToServer::Register {
        worker_name: "future".into(),
        models: vec!["m".into()],
        max_concurrent: 1,
        protocol_version: Some("9".into()),
        current_load: None,
    })
    .await;
    match w.next(Duration::from_secs(5)).await {
        Next::Closed(Some(reason)) => assert!(reason.contains("protocol_version"), "{reason}"),
        other => panic!("expected a close frame, got {other:?}"),
    }
    for v in [Some("2026-04-bridge-v1"), None] {
        let mut w = connect(&s.base, SECRET).await.unwrap();
        w.send(&WorkerToServer::Register {
            worker_name: "ok".into(),
            models: vec!["m".into()],
            max_concurrent: 1,
            protocol_version: v.map(str::to_string),
            current_load: None,
        })
        .await;
        assert!(matches!(
            w.next(Duration::from_secs(5)).await,
            Next::Msg(ServerToWorker::RegisterAck { .. })
        ));
    }
}

/// WRK-BOUND-1, WRK-POOL-1: workers are bounded (one more is closed with the reason), and
/// workers of one name get distinct ids.
#[tokio::test]
async fn worker_count_is_bounded_and_names_share_no_id() {
    let s = server(|c| c.workers.max_workers = 2).await;
    let _a = worker(&s, "same", &["m"], 1).await;
    let _b = worker(&s, "same", &["m"], 1).await;
    let ids: Vec<String> = s.get_json("/v1/workers").await["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["worker_id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, vec!["w-same", "w-same-2"]);
    let mut c = connect(&s.base, SECRET).await.unwrap();
    c.send(&WorkerToServer::Register {
        worker_name: "third".into(),
        models: vec!["m".into()],
        max_concurrent: 1,
        protocol_version: None,
        current_load: None,
    })
    .await;
    match c.next(Duration::from_secs(5)).await {
        Next::Closed(Some(reason)) => assert!(reason.contains("too many workers"), "{reason}"),
        other => panic!("expected a close, got {other:?}"),
    }
}

/// WRK-PROTO-3: a frame that does not parse is answered with `error` and the connection
/// goes on serving; unknown fields are ignored.
#[tokio::test]
async fn unreadable_frames_get_an_error_and_the_worker_keeps_serving() {
    let s = server(|_| {}).await;
    let mut w = worker(&s, "w", &["m1"], 2).await;
    w.send_raw("this is not json").await;
    match w.next(Duration::from_secs(5)).await {
        Next::Msg(ServerToWorker::Error { code, .. }) => assert_eq!(code, "bad_message"),
        other => panic!("expected error, got {other:?}"),
    }
    w.send_raw(r#"{"type":"pong","current_load":0,"gpu_temp":71}"#)
        .await;
    w.send_raw(r#"{"type":"teleport"}"#).await;
    assert!(matches!(
        w.next(Duration::from_secs(5)).await,
        Next::Msg(ServerToWorker::Error { .. })
    ));
    let client = s.client.clone();
    let url = s.url("/v1/chat/completions");
    let call = tokio::spawn(async move { client.post(url).json(&chat("m1", false)).send().await });
    let (id, _, _, _) = w.request().await;
    w.answer(&id, &["Hi", "!"]).await;
    let r = call.await.unwrap().unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "Hi!");
}

/// WRK-POOL-1, WRK-HDR-1, WRK-ENG-1: a registered model is a `remote` pool; a chat runs on it
/// as an OpenAI body; the client's credentials and cookies never reach the worker, the
/// correlation id does; usage comes from the worker's token_counts.
#[tokio::test]
async fn remote_pool_serves_a_chat_without_the_clients_credentials() {
    let s = server(|_| {}).await;
    let mut w = worker(&s, "gpu-box-1", &["m1"], 2).await;
    let pools = pools_of_kind(&s, "remote").await;
    assert_eq!(pools.len(), 1);
    assert!(pools[0].ends_with(":m1"), "{pools:?}");
    let caps = s.get_json("/v1/capabilities").await;
    assert_eq!(caps["pools"][0]["kind"], "remote");
    let req = s
        .client
        .post(s.url("/v1/chat/completions"))
        .header("authorization", "Bearer sk-client-secret")
        .header("x-api-key", "client-key")
        .header("cookie", "session=abc")
        .header("x-correlation-id", "corr-42")
        .header("connection", "keep-alive")
        .json(&chat("m1", false));
    let call = tokio::spawn(req.send());
    let (id, path, body, headers) = w.request().await;
    assert_eq!(path, "/v1/chat/completions");
    assert_eq!(body["model"], "m1");
    assert_eq!(body["messages"][0]["content"], "Say hello");
    assert_eq!(body["max_tokens"], 16);
    for h in headers.keys() {
        let h = h.to_ascii_lowercase();
        assert!(
            !["authorization", "x-api-key", "cookie", "connection"].contains(&h.as_str()),
            "{h} forwarded: {headers:?}"
        );
    }
    assert_eq!(
        headers.get("x-correlation-id").map(String::as_str),
        Some("corr-42")
    );
    w.answer(&id, &["Hel", "lo"]).await;
    let v: serde_json::Value = call.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "Hello");
    assert_eq!(v["usage"]["prompt_tokens"], 11);
    assert_eq!(v["usage"]["completion_tokens"], 2);
    // a pin to the remote pool runs there, like any pin
    let id = s
        .submit_ok(json!({"pool_id": pools[0], "prompt": "Once", "max_tokens": 4}))
        .await;
    let (rid, path, body, _) = w.request().await;
    assert_eq!(path, "/v1/completions");
    assert_eq!(body["prompt"], "Once");
    w.answer(&rid, &[" upon"]).await;
    let ev = s.stream_all(&id).await;
    support::assert_well_formed(&ev);
    assert_eq!(s.record(&id).await["pool_id"], pools[0].as_str());
}

/// WRK-ENG-4: a backend's 4xx (it refused the input) is the client's 400 INVALID_PARAMS with
/// the backend's reason; a 5xx is a retriable server error.
#[tokio::test]
async fn backend_refusals_keep_their_class() {
    let s = server(|_| {}).await;
    let mut w = worker(&s, "w", &["m"], 1).await;
    for (status, want_status, want_code) in [(400, 400, "INVALID_PARAMS"), (503, 500, "INTERNAL")] {
        let call = spawn_chat(&s, "m", false);
        let (rid, ..) = w.request().await;
        w.send(&WorkerToServer::ResponseComplete {
            request_id: rid,
            status_code: status,
            headers: Default::default(),
            body: Some(r#"{"error":{"message":"the prompt is longer than the context"}}"#.into()),
            token_counts: None,
        })
        .await;
        let r = call.await.unwrap().unwrap();
        assert_eq!(r.status(), want_status);
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], want_code);
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("longer than the context"),
            "{v}"
        );
    }
}

/// ADP-LP-4: logprobs go to the backend (`logprobs`, `top_logprobs`); a backend that answers
/// without them is the client's 400 naming `logprobs`, not text without the values asked.
#[tokio::test]
async fn a_backend_ignoring_logprobs_is_a_400_naming_them() {
    let s = server(|_| {}).await;
    let mut w = worker(&s, "w", &["m"], 1).await;
    let mut body = chat("m", false);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(2);
    let call = tokio::spawn(
        s.client
            .post(s.url("/v1/chat/completions"))
            .json(&body)
            .send(),
    );
    let (id, _, sent, _) = w.request().await;
    assert_eq!(
        (sent["logprobs"].clone(), sent["top_logprobs"].clone()),
        (json!(true), json!(2))
    );
    w.answer(&id, &["Hel", "lo"]).await;
    let r = call.await.unwrap().unwrap();
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "logprobs", "{v}");
}

/// WRK-PLACE-1: placement reads `current_load`: a worker reporting itself full gets nothing
/// while another has room.
#[tokio::test]
async fn reported_load_steers_placement() {
    let s = server(|_| {}).await;
    let mut full = connect(&s.base, SECRET).await.unwrap();
    full.load = 4;
    full.register("full", &["m"], 4).await;
    let mut idle = worker(&s, "idle", &["m"], 4).await;
    let mut calls = Vec::new();
    for _ in 0..3 {
        let req = s
            .client
            .post(s.url("/v1/chat/completions"))
            .json(&chat("m", false));
        calls.push(tokio::spawn(req.send()));
    }
    for _ in 0..3 {
        let (id, ..) = idle.request().await;
        idle.answer(&id, &["ok"]).await;
    }
    assert!(matches!(
        full.next(Duration::from_millis(300)).await,
        Next::Quiet
    ));
    for c in calls {
        assert_eq!(c.await.unwrap().unwrap().status(), 200);
    }
}

/// WRK-PLACE-1: a load report that counted our own request does not hold the slot once that
/// request ended (reports come with pongs, seconds apart).
#[tokio::test]
async fn a_stale_load_report_does_not_hold_a_free_slot() {
    let s = server(|_| {}).await;
    let mut w = worker(&s, "one-slot", &["m"], 1).await;
    let first = spawn_chat(&s, "m", false);
    let second = spawn_chat(&s, "m", false);
    let (rid, ..) = w.request().await;
    w.send(&WorkerToServer::Pong {
        current_load: 1,
        timestamp_unix_ms: None,
    })
    .await;
    w.answer(&rid, &["one"]).await;
    let t0 = std::time::Instant::now();
    let (rid, ..) = w.request().await;
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    w.answer(&rid, &["two"]).await;
    assert_eq!(first.await.unwrap().unwrap().status(), 200);
    assert_eq!(second.await.unwrap().unwrap().status(), 200);
}

/// WRK-PLACE-2: a report sent after our request ended that still counts it (the worker had
/// not let go of it yet) does not leave the one-slot worker looking full: the next request
/// goes to it at once, not after the next report.
#[tokio::test]
async fn a_report_lagging_behind_a_request_that_ended_does_not_fill_the_worker() {
    let s = server(|_| {}).await;
    let mut w = worker(&s, "one-slot", &["m"], 1).await;
    let first = spawn_chat(&s, "m", false);
    let (rid, ..) = w.request().await;
    w.answer(&rid, &["one"]).await;
    assert_eq!(first.await.unwrap().unwrap().status(), 200);
    w.send(&WorkerToServer::Pong {
        current_load: 1,
        timestamp_unix_ms: None,
    })
    .await;
    // the report reached the server before the next request does
    tokio::time::sleep(Duration::from_millis(50)).await;
    let second = spawn_chat(&s, "m", false);
    match w.next(Duration::from_millis(400)).await {
        Next::Msg(ServerToWorker::Request { request_id, .. }) => {
            w.answer(&request_id, &["two"]).await
        }
        other => panic!("the worker looked full after its lagging report: {other:?}"),
    }
    assert_eq!(second.await.unwrap().unwrap().status(), 200);
}

/// WRK-REQ-3: after 3 requeues the next loss ends the task REPLICA_EXHAUSTED (503, cancel
/// reason requeue_exhausted), keeping its place in line each time.
#[tokio::test]
async fn requeue_exhaustion_is_503() {
    let s = server(|_| {}).await;
    let req = s
        .client
        .post(s.url("/v1/chat/completions"))
        .json(&chat("m", false));
    // the model is known once a worker registered it; between workers the task waits
    let mut first = Some(worker(&s, "w0", &["m"], 1).await);
    let call = tokio::spawn(req.send());
    for i in 0..4 {
        let mut w = match first.take() {
            Some(w) => w,
            None => worker(&s, &format!("w{i}"), &["m"], 1).await,
        };
        let _ = w.request().await;
        w.crash();
    }
    let r = call.await.unwrap().unwrap();
    assert_eq!(r.status(), 503);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "REPLICA_EXHAUSTED");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("requeue_exhausted"),
        "{v}"
    );
}

/// WRK-CANCEL-1: a client that goes away sends `cancel client_disconnect` to the worker.
#[tokio::test]
async fn client_disconnect_cancels_on_the_worker() {
    let s = server(|_| {}).await;
    let mut w = worker(&s, "w", &["m"], 1).await;
    let req = s
        .client
        .post(s.url("/v1/chat/completions"))
        .json(&chat("m", true));
    let call = tokio::spawn(async move {
        let r = req.send().await.unwrap();
        let mut body = r.bytes_stream();
        use futures::StreamExt;
        let _ = body.next().await; // the role chunk, then the client leaves
    });
    let (rid, ..) = w.request().await;
    let chunk = json!({"choices": [{"index": 0, "delta": {"content": "x"}}]});
    w.send(&WorkerToServer::ResponseChunk {
        request_id: rid.clone(),
        chunk: format!("data: {chunk}\n\n"),
    })
    .await;
    call.await.unwrap();
    match w.next(Duration::from_secs(5)).await {
        Next::Msg(ServerToWorker::Cancel { request_id, reason }) => {
            assert_eq!(request_id, rid);
            assert_eq!(reason, CancelReason::ClientDisconnect);
        }
        other => panic!("expected cancel, got {other:?}"),
    }
}

/// WRK-TIME-1: a request past the request timeout: `cancel timeout` to the worker, 504
/// DECODE_TIMEOUT to the client.
#[tokio::test]
async fn request_timeout_cancels_with_reason_timeout() {
    let s = server(|c| {
        c.workers.request_timeout_ms = 300;
        c.timeouts.idle_ms = 10_000;
    })
    .await;
    let mut w = worker(&s, "slow", &["m"], 1).await;
    let call = spawn_chat(&s, "m", false);
    let (rid, ..) = w.request().await;
    match w.next(Duration::from_secs(5)).await {
        Next::Msg(ServerToWorker::Cancel { request_id, reason }) => {
            assert_eq!(request_id, rid);
            assert_eq!(reason, CancelReason::Timeout);
        }
        other => panic!("expected cancel, got {other:?}"),
    }
    let r = call.await.unwrap().unwrap();
    assert_eq!(r.status(), 504);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "DECODE_TIMEOUT");
}

/// WRK-TIME-2, WRK-MODEL-1: a model workers serve but none is connected queues and times out
/// with 504 QUEUE_TIMEOUT (no worker ever saw it); a model nobody serves is 404.
#[tokio::test]
async fn queue_timeout_and_unknown_model() {
    let s = server(|c| {
        c.workers.queue_timeout_ms = 300;
        c.workers.models = vec!["ghost".into()];
    })
    .await;
    let t0 = std::time::Instant::now();
    let r = s.post("/v1/chat/completions", &chat("ghost", false)).await;
    assert_eq!(r.status(), 504);
    assert!(t0.elapsed() >= Duration::from_millis(300));
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "QUEUE_TIMEOUT");
    let r = s.post("/v1/chat/completions", &chat("nope", false)).await;
    assert_eq!(r.status(), 404);
    let r = s
        .post(
            "/v1/tasks",
            &json!({"model": "ghost", "prompt": "hi", "max_tokens": 2}),
        )
        .await;
    assert_eq!(r.status(), 202);
}

/// WRK-DRAIN-1: draining a remote pool sends `graceful_shutdown`, gives the worker nothing
/// new, and closes its socket only after its request in flight ended.
#[tokio::test]
async fn drain_closes_the_worker_after_its_request() {
    let s = server(|_| {}).await;
    let mut w = worker(&s, "w", &["m"], 2).await;
    let pool = pools_of_kind(&s, "remote").await.remove(0);
    let call = spawn_chat(&s, "m", false);
    let (rid, ..) = w.request().await;
    let r = s
        .post(
            &format!("/v1/pools/{pool}/drain"),
            &json!({"deadline_ms": 10000}),
        )
        .await;
    assert_eq!(r.status(), 202);
    match w.next(Duration::from_secs(5)).await {
        Next::Msg(ServerToWorker::GracefulShutdown {
            drain_timeout_secs, ..
        }) => {
            assert_eq!(drain_timeout_secs, Some(10))
        }
        other => panic!("expected graceful_shutdown, got {other:?}"),
    }
    // a new task does not go to it, and the socket stays open while the request runs
    let late = s
        .post(
            "/v1/tasks",
            &json!({"model": "m", "prompt": "hi", "max_tokens": 2}),
        )
        .await;
    assert_eq!(late.status(), 202);
    assert!(matches!(
        w.next(Duration::from_millis(400)).await,
        Next::Quiet
    ));
    w.answer(&rid, &["done"]).await;
    let v: serde_json::Value = call.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "done");
    match w.next(Duration::from_secs(5)).await {
        Next::Closed(reason) => assert_eq!(reason.as_deref(), Some("drained")),
        other => panic!("expected close, got {other:?}"),
    }
    assert!(pools_of_kind(&s, "remote").await.is_empty());
}

/// WRK-DRAIN-1, WRK-OFF-1: server shutdown drains every worker (`graceful_shutdown`,
/// reason `server_shutdown`); without a secret the route does not exist.
#[tokio::test]
async fn shutdown_drains_workers_and_no_secret_means_no_workers() {
    let mut s = server(|_| {}).await;
    let mut w = worker(&s, "w", &["m"], 1).await;
    s.begin_shutdown();
    match w.next(Duration::from_secs(5)).await {
        Next::Msg(ServerToWorker::GracefulShutdown { reason, .. }) => {
            assert_eq!(reason.as_deref(), Some("server_shutdown"))
        }
        other => panic!("expected graceful_shutdown, got {other:?}"),
    }
    // a plain request (no WebSocket upgrade) with the right secret: a typed 400, not text
    let on = server(|_| {}).await;
    let r = on
        .client
        .get(on.url("/v1/worker/connect"))
        .header("x-worker-secret", SECRET)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["code"], "INVALID_PARAMS");
    assert_eq!(v["field"], "upgrade");
    let off = start(
        config(vec![support::pool("p", 1)]),
        Duration::from_millis(5),
    )
    .await;
    assert_eq!(connect(&off.base, "").await.err(), Some(404));
}

/// WRK-HB-1: a worker that stops answering is closed with "worker heartbeat timed out" and its
/// pools go away.
#[tokio::test]
async fn silent_worker_is_closed_by_heartbeat() {
    let s = server(|c| {
        c.workers.heartbeat_interval_ms = 100;
        c.workers.pong_timeout_ms = 300;
    })
    .await;
    let mut w = worker(&s, "mute", &["m"], 1).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(pools_of_kind(&s, "remote").await.is_empty());
    // the pings it never read, then the close frame with the reason
    loop {
        match w.next(Duration::from_secs(2)).await {
            Next::Closed(reason) => {
                assert_eq!(reason.as_deref(), Some("worker heartbeat timed out"));
                break;
            }
            Next::Msg(_) => continue,
            Next::Quiet => panic!("no close frame"),
        }
    }
    let m = s.metrics().await;
    assert_eq!(
        support::counter(&m, "orchd_worker_disconnects_total{reason=\"heartbeat\"}"),
        1.0
    );
}

/// WRK-MODEL-2: `models_update` adds and removes the worker's pools at once; the server asks
/// with `models_refresh` on demand.
#[tokio::test]
async fn models_update_changes_the_pools() {
    let s = server(|c| c.workers.models_refresh_interval_ms = 200).await;
    let mut w = worker(&s, "w", &["m1"], 1).await;
    let workers = s.get_json("/v1/workers").await;
    let wid = workers["workers"][0]["worker_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(wid, "w-w");
    match w.next(Duration::from_secs(5)).await {
        Next::Msg(ServerToWorker::ModelsRefresh { reason }) => {
            assert_eq!(reason.as_deref(), Some("periodic"))
        }
        other => panic!("expected a periodic models_refresh, got {other:?}"),
    }
    let r = s
        .post(&format!("/v1/workers/{wid}/models_refresh"), &json!({}))
        .await;
    assert_eq!(r.status(), 202);
    let mut asked = false;
    for _ in 0..5 {
        if let Next::Msg(ServerToWorker::ModelsRefresh { reason }) =
            w.next(Duration::from_secs(5)).await
        {
            if reason.as_deref() == Some("requested") {
                asked = true;
                break;
            }
        }
    }
    assert!(asked, "no requested models_refresh");
    w.send(&WorkerToServer::ModelsUpdate {
        models: vec!["m2".into(), "m3".into()],
        current_load: 0,
    })
    .await;
    let mut pools = Vec::new();
    for _ in 0..100 {
        pools = pools_of_kind(&s, "remote").await;
        if pools.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pools.sort();
    assert_eq!(pools, vec![format!("{wid}:m2"), format!("{wid}:m3")]);
    let models = s.get_json("/v1/models").await;
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"m2") && !ids.contains(&"m1"), "{ids:?}");
}

/// WRK-NAME-1: worker and model names outside the documented set are refused (issue 32: NUL,
/// U+202E, newlines, `../../etc/passwd` and a local model's alias were listed verbatim in every
/// tenant's `/v1/models`): a bad worker name closes the registration with the reason; bad
/// model names, and names a local pool answers to, are ignored with a warning, at
/// registration and in `models_update`.
#[tokio::test]
async fn names_outside_the_documented_set_are_refused() {
    let s = server(|c| c.pools = vec![support::pool("loc", 1)]).await;
    let mut w = connect(&s.base, SECRET).await.unwrap();
    w.send(&WorkerToServer::Register {
        worker_name: "../../etc/passwd".into(),
        models: vec!["m".into()],
        max_concurrent: 1,
        protocol_version: None,
        current_load: None,
    })
    .await;
    match w.next(Duration::from_secs(5)).await {
        Next::Closed(Some(reason)) => assert!(reason.contains("worker_name"), "{reason}"),
        other => panic!("expected a close frame, got {other:?}"),
    }
    let bad = [
        "bad\u{0}nul",
        "\u{202e}evil",
        "line\nbreak",
        "../../etc/passwd",
        "scripted-model",
        "loc",
    ];
    let mut models = vec!["ok-model"];
    models.extend(bad);
    let mut w = connect(&s.base, SECRET).await.unwrap();
    match w.register("good-worker", &models, 1).await {
        ServerToWorker::RegisterAck {
            models, warnings, ..
        } => {
            assert_eq!(models, vec!["ok-model".to_string()]);
            assert_eq!(warnings.len(), bad.len(), "{warnings:?}");
        }
        other => panic!("{other:?}"),
    }
    w.send(&WorkerToServer::ModelsUpdate {
        models: vec!["ok-model".into(), "two\u{202e}".into(), "also-ok".into()],
        current_load: 0,
    })
    .await;
    let listed = support::procs::eventually(Duration::from_secs(5), || async {
        let v = s.get_json("/v1/models").await;
        let mut ids: Vec<String> = v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids == ["also-ok", "ok-model", "scripted-model"]
    })
    .await;
    assert!(listed, "{}", s.get_json("/v1/models").await);
}
