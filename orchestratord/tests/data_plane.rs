//! The task spine over a real socket with the scripted engine: admission, backpressure,
//! priorities, pinning, streaming, cancel, replay, correlation ids, metrics.
//! Requirement ids are in `.specs/orchestratord.md`.

mod support;

use std::time::Duration;

use serde_json::json;
use support::*;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// OC-CTRL-2010, ORCH-ADM-1: bad input is a typed 4xx naming the field, never a 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_rejects_bad_input_with_typed_errors() {
    let mut cfg = config(vec![pool("p1", 1)]);
    cfg.admission.max_body_bytes = 4096;
    let s = start(cfg, ms(5)).await;
    let post_raw = |body: Vec<u8>| {
        s.client
            .post(s.url("/v1/tasks"))
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    let cases: Vec<(Vec<u8>, u16, &str, Option<&str>)> = vec![
        (b"{not json".to_vec(), 400, "INVALID_PARAMS", Some("body")),
        (
            br#"{"prompt": "hi", "max_tokens": "ten"}"#.to_vec(),
            400,
            "INVALID_PARAMS",
            Some("max_tokens"),
        ),
        (
            br#"{"prompt": "hi", "colour": 1}"#.to_vec(),
            400,
            "INVALID_PARAMS",
            Some("colour"),
        ),
        (
            b"{\"prompt\": \"\xff\xfe\"}".to_vec(),
            400,
            "INVALID_PARAMS",
            Some("body"),
        ),
        (
            br#"{"max_tokens": 5}"#.to_vec(),
            400,
            "INVALID_PARAMS",
            Some("prompt"),
        ),
        (
            br#"{"prompt": "a", "messages": [{"role": "user", "content": "b"}]}"#.to_vec(),
            400,
            "INVALID_PARAMS",
            Some("messages"),
        ),
        (
            br#"{"prompt": "a", "max_tokens": 0}"#.to_vec(),
            400,
            "INVALID_PARAMS",
            Some("max_tokens"),
        ),
        (
            br#"{"prompt": "a", "temperature": -1}"#.to_vec(),
            400,
            "INVALID_PARAMS",
            Some("temperature"),
        ),
        // a positive top_p that f32 rounds to 0, and one below the documented 1e-6
        (
            br#"{"prompt": "a", "top_p": 5e-324}"#.to_vec(),
            400,
            "INVALID_PARAMS",
            Some("top_p"),
        ),
        (
            br#"{"prompt": "a", "repetition_penalty": 1e-7}"#.to_vec(),
            400,
            "INVALID_PARAMS",
            Some("repetition_penalty"),
        ),
        (
            br#"{"prompt": "a", "stop": [""]}"#.to_vec(),
            400,
            "INVALID_PARAMS",
            Some("stop"),
        ),
        (
            br#"{"prompt": "a", "max_tokens": 2.5}"#.to_vec(),
            400,
            "INVALID_PARAMS",
            Some("max_tokens"),
        ),
        (
            br#"{"messages": [{"role": "wizard", "content": "b"}]}"#.to_vec(),
            400,
            "INVALID_PARAMS",
            Some("messages[0].role"),
        ),
        (
            br#"{"prompt": "a", "model": "nope"}"#.to_vec(),
            404,
            "NOT_FOUND",
            Some("model"),
        ),
        // context: 256 tokens; 3 prompt words + 300 > 256
        (
            br#"{"prompt": "one two three", "max_tokens": 300}"#.to_vec(),
            400,
            "INVALID_PARAMS",
            Some("max_tokens"),
        ),
        (vec![b' '; 8192], 413, "PAYLOAD_TOO_LARGE", None),
        (br#"[1, 2]"#.to_vec(), 400, "INVALID_PARAMS", None),
    ];
    for (body, status, code, field) in cases {
        let shown = String::from_utf8_lossy(&body[..body.len().min(60)]).to_string();
        let r = post_raw(body).await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{shown}");
        assert!(r.headers().contains_key("x-correlation-id"));
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["code"], code, "{shown}: {v}");
        assert_eq!(v["retriable"], false, "{shown}");
        if let Some(f) = field {
            assert_eq!(v["field"], f, "{shown}: {v}");
        }
    }
    // the edges themselves are taken: top_p and repetition_penalty 1e-6, a stop sequence of
    // 128 four-byte characters (the limit counts characters), max_tokens written 2.0
    let edges = json!({"prompt": "a", "top_p": 1e-6, "repetition_penalty": 1e-6,
        "stop": ["😀".repeat(128)], "max_tokens": 2.0});
    let r = s.post("/v1/tasks", &edges).await;
    assert_eq!(r.status(), 202, "{}", r.text().await.unwrap());
    // the server still serves after all that
    let id = s
        .submit_ok(json!({"prompt": "still fine", "max_tokens": 2}))
        .await;
    assert_well_formed(&s.stream_all(&id).await);
}

/// OC-CTRL-2068, ORCH-ADM-2: session budgets and infeasible deadlines are refused at admission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_and_deadlines_are_enforced_at_admission() {
    let mut cfg = config(vec![pool("p1", 1)]);
    cfg.sessions.token_budget = Some(20);
    let s = start(cfg, ms(20)).await;
    let id = s
        .submit_ok(json!({"prompt": "a b c", "max_tokens": 10, "session_id": "s1"}))
        .await;
    let r = s
        .submit(json!({"prompt": "a b c", "max_tokens": 10, "session_id": "s1"}))
        .await;
    assert_eq!(r.status(), 429);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["code"], "BUDGET_EXCEEDED");
    let info: serde_json::Value = s.get_json("/v1/sessions/s1").await;
    assert_eq!(info["turns"], 1);
    assert_eq!(info["tokens_used"], 13);
    assert_eq!(info["tokens_remaining"], 7);
    assert_well_formed(&s.stream_all(&id).await);
    // a deadline shorter than the measured decode time of 10 tokens (20 ms each) is refused
    let r = s
        .submit(json!({"prompt": "a", "max_tokens": 50, "deadline_ms": 5}))
        .await;
    assert_eq!(r.status(), 422);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["code"], "DEADLINE_UNMET");
    // sessions can be deleted, then are gone
    let d = s
        .client
        .delete(s.url("/v1/sessions/s1"))
        .send()
        .await
        .unwrap();
    assert_eq!(d.status(), 204);
    let g = s.client.get(s.url("/v1/sessions/s1")).send().await.unwrap();
    assert_eq!(g.status(), 404);
}

/// OC-CTRL-2011, ORCH-Q-1: a full queue answers 429 with Retry-After, X-Backoff-Ms and the
/// advisory body; a burst never overshoots the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_queue_rejects_with_backoff_headers() {
    let mut cfg = config(vec![pool("p1", 1)]);
    cfg.queue.capacity = 3;
    // this is the capacity refusal: the line's predicted wait must not refuse first
    cfg.admission.max_queue_wait_ms = 600_000;
    // 5 s a task: no task ends while the burst is answered, even on a slow machine
    let s = start(cfg, ms(250)).await;
    let mut admitted = 0;
    let mut rejected = Vec::new();
    let burst: Vec<_> = (0..12)
        .map(|_| s.submit(json!({"prompt": "x", "max_tokens": 20})))
        .collect();
    for r in futures::future::join_all(burst).await {
        match r.status().as_u16() {
            202 => admitted += 1,
            429 => rejected.push(r),
            other => panic!("unexpected {other}"),
        }
    }
    // 1 running + 3 queued at most; the rest refused
    assert!(admitted <= 4, "admitted {admitted}");
    assert!(s.state.queue.len() <= 3);
    assert!(!rejected.is_empty());
    let r = rejected.pop().unwrap();
    let retry: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    let backoff: u64 = r.headers()["x-backoff-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(r.headers().contains_key("x-correlation-id"));
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["code"], "ADMISSION_REJECT");
    assert_eq!(v["policy_label"], "reject");
    assert_eq!(v["retriable"], true);
    assert_eq!(v["retry_after_ms"], backoff);
    assert!(backoff > 0);
}

/// ORCH-Q-1: with several idle slots, a burst fills the slots and then the queue's bound, no
/// more: the idle slots are counted when each task is queued, not when its admission began
/// (a count taken before tokenizing lets the burst overshoot by the slots taken meanwhile).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_on_idle_slots_stops_at_slots_plus_capacity() {
    let mut cfg = config(vec![pool("p1", 4)]);
    cfg.queue.capacity = 3;
    cfg.admission.max_queue_wait_ms = 600_000;
    // 5 s a task: none ends while the burst is answered
    let s = start(cfg, ms(250)).await;
    let burst: Vec<_> = (0..40)
        .map(|i| {
            s.submit(
                json!({"prompt": format!("burst {i} {}", "word ".repeat(40)), "max_tokens": 20}),
            )
        })
        .collect();
    let mut admitted = 0;
    for r in futures::future::join_all(burst).await {
        match r.status().as_u16() {
            202 => admitted += 1,
            429 => {}
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(admitted, 7, "4 slots + 3 queued");
    assert!(s.state.queue.len() <= 3, "{}", s.state.queue.len());
}

/// ORCH-Q-2: under drop-lru the newest task is admitted and the oldest queued batch task ends
/// with a retriable QUEUE_FULL_DROP_LRU error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_lru_evicts_the_oldest_batch_task() {
    let mut cfg = config(vec![pool("p1", 1)]);
    cfg.queue.capacity = 2;
    cfg.queue.policy = orchestratord::config::FullPolicy::DropLru;
    let s = start(cfg, ms(50)).await;
    let running = s.submit_ok(json!({"prompt": "x", "max_tokens": 10})).await;
    tokio::time::sleep(ms(100)).await;
    let old = s
        .submit_ok(json!({"prompt": "x", "max_tokens": 2, "priority": "batch"}))
        .await;
    let young = s
        .submit_ok(json!({"prompt": "x", "max_tokens": 2, "priority": "batch"}))
        .await;
    let newest = s.submit_ok(json!({"prompt": "x", "max_tokens": 2})).await;
    let ev = s.stream_all(&old).await;
    assert_well_formed(&ev);
    let last = ev.last().unwrap();
    assert_eq!(last.event, "error");
    assert_eq!(last.data["code"], "QUEUE_FULL_DROP_LRU");
    assert_eq!(last.data["retriable"], true);
    assert!(!ev.iter().any(|e| e.event == "token"));
    for id in [running, young, newest] {
        let ev = s.stream_all(&id).await;
        assert_well_formed(&ev);
        assert_eq!(ev.last().unwrap().event, "end");
    }
}

/// ORCH-Q-3: interactive tasks leave the queue before batch tasks queued earlier.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interactive_overtakes_batch() {
    let s = start(config(vec![pool("p1", 1)]), ms(20)).await;
    let blocker = s.submit_ok(json!({"prompt": "x", "max_tokens": 10})).await;
    tokio::time::sleep(ms(50)).await;
    let b1 = s
        .submit_ok(json!({"prompt": "x", "max_tokens": 3, "priority": "batch"}))
        .await;
    let b2 = s
        .submit_ok(json!({"prompt": "x", "max_tokens": 3, "priority": "batch"}))
        .await;
    let r = s.submit(json!({"prompt": "x", "max_tokens": 3})).await;
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["queue_position"], 0, "interactive goes to the head: {v}");
    let i1 = v["task_id"].as_str().unwrap().to_string();
    // watch all streams at once; with one slot, start order is first-token order
    let watch = |id: String| {
        let s = &s;
        async move {
            let r = s.open_stream(&id).await;
            let ev = read_events(r).await;
            ev.iter()
                .find(|(e, _)| e.event == "token")
                .map(|(_, t)| *t)
                .unwrap()
        }
    };
    let (tb, t1, t2, ti) = tokio::join!(
        watch(blocker.clone()),
        watch(b1.clone()),
        watch(b2.clone()),
        watch(i1.clone())
    );
    assert!(tb < ti, "the running task was first");
    assert!(ti < t1, "interactive started before the earlier batch task");
    assert!(t1 < t2, "batch tasks in FIFO order");
}

/// OC-CTRL-2013/2014, ORCH-PIN-1: a pin routes only to its pool; unknown pool, disabled
/// pinning and a pool that is not Ready fail typed, with no fallback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pin_routes_only_to_its_pool_and_fails_typed() {
    let s = start(config(vec![pool("p1", 2), pool("p2", 2)]), ms(5)).await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(
            s.submit_ok(json!({"prompt": "x", "max_tokens": 3, "pool_id": "p2"}))
                .await,
        );
    }
    for id in &ids {
        assert_well_formed(&s.stream_all(id).await);
        assert_eq!(s.record(id).await["pool_id"], "p2");
    }
    // seed 003 OC-CTRL-2014: an unknown pool is a deterministic INVALID_PARAMS (issue 33: it
    // was 404 NOT_FOUND)
    let r = s.submit(json!({"prompt": "x", "pool_id": "p9"})).await;
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(
        (v["code"].as_str(), v["field"].as_str()),
        (Some("INVALID_PARAMS"), Some("pool_id"))
    );
    // drain p2: pins to it now fail 503 POOL_UNREADY, never placed on p1
    let d = s
        .client
        .post(s.url("/v1/pools/p2/drain"))
        .json(&json!({"deadline_ms": 1000}))
        .send()
        .await
        .unwrap();
    assert_eq!(d.status(), 202);
    let r = s.submit(json!({"prompt": "x", "pool_id": "p2"})).await;
    assert_eq!(r.status(), 503);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["code"], "POOL_UNREADY");
    assert_eq!(v["pool_id"], "p2");
    // pinning disabled by policy
    let mut cfg = config(vec![pool("p1", 1)]);
    cfg.admission.pinning_enabled = false;
    let s2 = start(cfg, ms(5)).await;
    let r = s2.submit(json!({"prompt": "x", "pool_id": "p1"})).await;
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["field"], "pool_id");
}

/// OC-CTRL-2020/2021/2022/2027, ORCH-SSE-1/2: event order, headers, and a late subscriber
/// gets the same events from the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_order_headers_and_late_replay() {
    let s = start(config(vec![pool("p1", 1)]), ms(30)).await;
    let id = s
        .submit_ok(json!({"prompt": "hello there", "max_tokens": 8}))
        .await;
    let r = s
        .client
        .get(s.url(&format!("/v1/tasks/{id}/stream")))
        .header("x-correlation-id", "corr-stream-1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    assert_eq!(r.headers()["cache-control"], "no-cache");
    assert_eq!(r.headers()["x-accel-buffering"], "no");
    assert_eq!(r.headers()["x-correlation-id"], "corr-stream-1");
    let first: Vec<Ev> = read_events(r).await.into_iter().map(|(e, _)| e).collect();
    assert_well_formed(&first);
    assert_eq!(first.iter().filter(|e| e.event == "token").count(), 8);
    assert!(
        first.iter().any(|e| e.event == "metrics"),
        "metrics frames interleaved"
    );
    let m = first.iter().find(|e| e.event == "metrics").unwrap();
    assert!(m.data["queue_depth"].is_u64());
    assert!(m.data["on_time_probability"].is_f64());
    let end = first.last().unwrap();
    assert_eq!(end.data["finish_reason"], "length");
    assert_eq!(end.data["tokens_out"], 8);
    assert_eq!(end.data["decode_time_ms"], end.data["decode_ms"]);
    let late = s.stream_all(&id).await;
    assert_eq!(first, late, "late subscriber replays the same transcript");
    let rec = s.record(&id).await;
    assert_eq!(rec["params"]["prompt"], "[redacted 11 chars]");
    assert_eq!(rec["transcript"].as_array().unwrap().len(), first.len());
    assert_eq!(rec["terminal"]["event"], "end");
}

/// OC-CTRL-2012, ORCH-CAN-1: cancel of a queued and of a running task; 404 for unknown ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_queued_and_running_tasks() {
    let s = start(config(vec![pool("p1", 1)]), ms(20)).await;
    let running = s.submit_ok(json!({"prompt": "x", "max_tokens": 200})).await;
    let queued = s.submit_ok(json!({"prompt": "x", "max_tokens": 200})).await;
    tokio::time::sleep(ms(120)).await;
    assert_eq!(s.cancel(&queued).await, 204);
    assert_eq!(s.cancel(&running).await, 204);
    for id in [&running, &queued] {
        let ev = s.stream_all(id).await;
        assert_well_formed(&ev);
        assert_eq!(ev.last().unwrap().data["finish_reason"], "cancelled");
    }
    let q = s.stream_all(&queued).await;
    assert!(!q.iter().any(|e| e.event == "token"));
    assert_eq!(s.cancel("no-such-task").await, 404);
    // idempotent: cancelling again is fine
    assert_eq!(s.cancel(&running).await, 204);
    // the slot is free again
    let id = s.submit_ok(json!({"prompt": "x", "max_tokens": 2})).await;
    assert_eq!(s.stream_all(&id).await.last().unwrap().event, "end");
}

/// ORCH-TMO-1, ORCH-ENG-1: a task that makes no progress ends with DECODE_TIMEOUT; an engine
/// failure ends the task with an error and other tasks keep running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_and_engine_failures_end_tasks_typed() {
    let mut cfg = config(vec![pool("p1", 2)]);
    cfg.timeouts.idle_ms = 200;
    let s = start(cfg, ms(10)).await;
    let hang = s
        .submit_ok(json!({"prompt": "[hang] x", "max_tokens": 5}))
        .await;
    let fail = s
        .submit_ok(json!({"prompt": "[fail] x", "max_tokens": 5}))
        .await;
    let ev = s.stream_all(&hang).await;
    assert_well_formed(&ev);
    assert_eq!(ev.last().unwrap().data["code"], "DECODE_TIMEOUT");
    let ev = s.stream_all(&fail).await;
    assert_well_formed(&ev);
    assert_eq!(ev.last().unwrap().event, "error");
    assert_eq!(ev.iter().filter(|e| e.event == "token").count(), 2);
    let ok = s.submit_ok(json!({"prompt": "x", "max_tokens": 3})).await;
    assert_eq!(s.stream_all(&ok).await.last().unwrap().event, "end");
}

/// ORCH-SSE-3, OC-CTRL-2052: correlation ids are echoed or generated on every non-204 response.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn correlation_id_on_every_response() {
    let s = start(config(vec![pool("p1", 1)]), ms(5)).await;
    for path in [
        "/v1/capabilities",
        "/v1/pools",
        "/v1/tasks/nope",
        "/metrics",
        "/openapi.json",
        "/nowhere",
    ] {
        let r = s.client.get(s.url(path)).send().await.unwrap();
        let id = r.headers()["x-correlation-id"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(
            uuid::Uuid::parse_str(&id).is_ok(),
            "{path}: generated UUID, got {id}"
        );
        let r = s
            .client
            .get(s.url(path))
            .header("x-correlation-id", "abc-123")
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["x-correlation-id"], "abc-123", "{path}");
    }
    let r = s.client.get(s.url("/nowhere")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["code"], "NOT_FOUND");
    let caps: serde_json::Value = s.get_json("/v1/capabilities").await;
    assert_eq!(caps["api_version"], contracts::API_VERSION);
    assert_eq!(caps["pools"][0]["engine"], "scripted");
    assert_eq!(caps["pools"][0]["slots"], 1);
    let doc: serde_json::Value = s.get_json("/openapi.json").await;
    assert_eq!(doc["info"]["version"], contracts::API_VERSION);
    assert!(doc["paths"]["/v1/tasks"].is_object());
    assert!(doc["paths"]["/v1/pools/{id}/drain"].is_object());
}

/// The idempotency key: resubmitting a task_id returns the same task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_task_id_returns_the_existing_task() {
    let s = start(config(vec![pool("p1", 1)]), ms(5)).await;
    let a = s
        .submit_ok(json!({"prompt": "x", "max_tokens": 3, "task_id": "job-1"}))
        .await;
    let b = s
        .submit_ok(json!({"prompt": "x", "max_tokens": 3, "task_id": "job-1"}))
        .await;
    assert_eq!(a, "job-1");
    assert_eq!(a, b);
    assert_well_formed(&s.stream_all(&a).await);
    let st: serde_json::Value = s.get_json("/v1/tasks/job-1").await;
    assert_eq!(st["state"], "completed");
}

/// ORCH-SHUT-1: on shutdown nothing new is admitted (503 SHUTTING_DOWN, retriable) and tasks
/// still running after the grace period end with a retriable error, not silently.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_admission_then_ends_running_tasks() {
    let mut cfg = config(vec![pool("p1", 1)]);
    cfg.shutdown_grace_ms = 400;
    let mut s = start(cfg, ms(20)).await;
    let long = s.submit_ok(json!({"prompt": "x", "max_tokens": 200})).await;
    let r = s.open_stream(&long).await;
    let reader = tokio::spawn(read_events(r));
    tokio::time::sleep(ms(100)).await;
    s.begin_shutdown();
    tokio::time::sleep(ms(50)).await;
    let r = s.submit(json!({"prompt": "x", "max_tokens": 2})).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["code"], "SHUTTING_DOWN");
    assert_eq!(v["retriable"], true);
    let ev: Vec<Ev> = reader.await.unwrap().into_iter().map(|(e, _)| e).collect();
    assert_well_formed(&ev);
    let last = ev.last().unwrap();
    assert_eq!(last.event, "error");
    assert_eq!(last.data["code"], "SHUTTING_DOWN");
    assert_eq!(last.data["retriable"], true);
}
