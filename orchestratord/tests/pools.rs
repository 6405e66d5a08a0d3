//! The control plane with the scripted engine: health, drain/resume, illegal transitions,
//! reload rollback, and a pool that cannot load (last_error, backoff, circuit breaker).
//! Requirement ids in `.specs/pool-manager.md`.

mod support;

use std::time::Duration;

use serde_json::json;
use support::*;

async fn post(s: &TestServer, path: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let r = s.client.post(s.url(path)).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(serde_json::Value::Null))
}

async fn health(s: &TestServer, id: &str) -> (u16, serde_json::Value) {
    let r = s
        .client
        .get(s.url(&format!("/v1/pools/{id}/health")))
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// OC-CTRL-2001, POOL-SM-2, POOL-DRAIN-1: health fields, drain → drained → resume, and
/// refused transitions answer 409 with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_resume_and_refused_transitions() {
    let s = start(config(vec![pool("p1", 2)]), Duration::from_millis(20)).await;
    let (st, h) = health(&s, "p1").await;
    assert_eq!(st, 200);
    for k in [
        "live",
        "ready",
        "draining",
        "state",
        "model_ref",
        "engine",
        "engine_version",
        "slots_total",
        "slots_free",
        "queue_depth",
        "last_error",
        "metrics",
    ] {
        assert!(h.get(k).is_some(), "health lacks {k}: {h}");
    }
    assert_eq!(h["state"], "ready");
    let (st, v) = health(&s, "nope").await;
    assert_eq!((st, v["code"].as_str()), (404, Some("NOT_FOUND")));
    let running = s.submit_ok(json!({"prompt": "x", "max_tokens": 30})).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (st, h) = post(&s, "/v1/pools/p1/drain", json!({"deadline_ms": 5000})).await;
    assert_eq!(st, 202);
    assert_eq!(h["draining"], true);
    assert_eq!(h["ready"], false);
    assert!(h["metrics"]["deadline_remaining_ms"].as_u64().unwrap() > 4000);
    assert_eq!(h["metrics"]["slots_busy"], 1);
    // reload while draining: refused with the reason
    let (st, v) = post(
        &s,
        "/v1/pools/p1/reload",
        json!({"new_model_ref": fake_gguf("other")}),
    )
    .await;
    assert_eq!(st, 409);
    assert!(v["message"].as_str().unwrap().contains("draining"), "{v}");
    let (st, _) = post(&s, "/v1/pools/p1/drain", json!({"deadline_ms": 10})).await;
    assert_eq!(st, 409, "already draining");
    // the running task finishes within the deadline, then the pool is drained
    let ev = s.stream_all(&running).await;
    assert_eq!(ev.last().unwrap().event, "end");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(health(&s, "p1").await.1["state"], "drained");
    let (st, _) = post(&s, "/v1/pools/p1/resume", json!({})).await;
    assert_eq!(st, 200);
    let (st, _) = post(&s, "/v1/pools/p1/resume", json!({})).await;
    assert_eq!(st, 409, "already serving");
    // bad bodies are typed
    let (st, v) = post(&s, "/v1/pools/p1/drain", json!({"deadline": 5})).await;
    assert_eq!((st, v["code"].as_str()), (400, Some("INVALID_PARAMS")));
    // reload rollback with the scripted factory: the old model keeps serving
    let (st, v) = post(
        &s,
        "/v1/pools/p1/reload",
        json!({"new_model_ref": fake_gguf("missing")}),
    )
    .await;
    assert_eq!(st, 409);
    assert!(v["message"].as_str().unwrap().contains("rolled back"));
    assert_eq!(health(&s, "p1").await.1["model_ref"], "/models/p1.gguf");
    let v2 = fake_gguf("v2");
    let (st, v) = post(&s, "/v1/pools/p1/reload", json!({"new_model_ref": v2})).await;
    assert_eq!(st, 200, "{v}");
    let caps: serde_json::Value = s.get_json("/v1/capabilities").await;
    assert_eq!(caps["pools"][0]["model_ref"], v2.display().to_string());
}

/// POOL-LOAD-1: a pool whose model cannot load is Unready with last_error, retries with
/// backoff, and opens its circuit breaker after repeated failures; the server still serves
/// the healthy pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_pool_backs_off_and_opens_its_breaker() {
    let mut bad = pool("bad", 1);
    bad.model = "/models/missing.gguf".into();
    bad.alias = Some("other".into());
    let s = start(config(vec![pool("p1", 1), bad]), Duration::from_millis(5)).await;
    let (_, h) = health(&s, "bad").await;
    assert_eq!(h["state"], "unready");
    assert_eq!(h["ready"], false);
    assert!(h["last_error"].as_str().unwrap().contains("missing"));
    let mut open = false;
    for _ in 0..120 {
        let (_, h) = health(&s, "bad").await;
        if h["metrics"]["circuit_open"] == true {
            open = true;
            assert!(h["metrics"]["consecutive_failures"].as_u64().unwrap() >= 3);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(open, "breaker opened after repeated failures");
    let m = s.metrics().await;
    assert_eq!(counter(&m, "orchd_pool_circuit_open{pool=\"bad\"}"), 1.0);
    // asking for the broken pool's model: 503 POOL_UNAVAILABLE; the good pool serves
    let r = s.submit(json!({"prompt": "x", "model": "other"})).await;
    assert_eq!(r.status(), 503);
    let id = s.submit_ok(json!({"prompt": "x", "max_tokens": 2})).await;
    assert_eq!(s.stream_all(&id).await.last().unwrap().event, "end");
}

/// ORCH-Q-5: a queued task whose model has no pool that will take work again by itself (here
/// the only pool is draining) ends at once with a retriable POOL_UNAVAILABLE instead of
/// waiting forever; the running task still finishes within the drain deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_tasks_do_not_wait_for_a_pool_that_cannot_come_back() {
    let s = start(config(vec![pool("p1", 1)]), Duration::from_millis(20)).await;
    let running = s.submit_ok(json!({"prompt": "go", "max_tokens": 20})).await;
    let queued = s
        .submit_ok(json!({"prompt": "wait", "max_tokens": 5}))
        .await;
    let (st, _) = post(&s, "/v1/pools/p1/drain", json!({"deadline_ms": 10000})).await;
    assert_eq!(st, 202);
    let t0 = std::time::Instant::now();
    let ev = s.stream_all(&queued).await;
    assert_well_formed(&ev);
    let last = ev.last().unwrap();
    assert_eq!(last.data["code"], "POOL_UNAVAILABLE", "{last:?}");
    assert_eq!(last.data["retriable"], true);
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    let ev = s.stream_all(&running).await;
    assert_eq!(ev.last().unwrap().event, "end");
}

/// POOL-LEASE-2: the engine owns the slot. A cancelled task whose engine is slow to let go of
/// the sequence keeps its slot busy until the engine gave it back; the next task waits for
/// it and then runs to its end (no "engine busy" failure, however long the engine takes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_is_free_when_the_engine_lets_go_not_before() {
    let s = start(config(vec![pool("p1", 1)]), Duration::from_millis(5)).await;
    let slow = s
        .submit_ok(json!({"prompt": "[hang] [linger]", "max_tokens": 5}))
        .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(s.cancel(&slow).await, 204);
    let cancelled_at = std::time::Instant::now();
    let next = s
        .submit_ok(json!({"prompt": "after", "max_tokens": 3}))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, h) = health(&s, "p1").await;
    assert_eq!(
        h["metrics"]["slots_busy"], 1,
        "the engine still holds it: {h}"
    );
    assert_eq!(h["slots_free"], 0);
    let status = s.get_json(&format!("/v1/tasks/{next}")).await;
    assert_eq!(status["state"], "queued", "{status}");
    let events = s.stream_all(&next).await;
    assert_eq!(events.last().unwrap().event, "end", "{events:?}");
    assert!(
        cancelled_at.elapsed() >= LINGER,
        "the next task ran only after the engine let go"
    );
    let status = s.get_json(&format!("/v1/tasks/{slow}")).await;
    assert_eq!(status["state"], "cancelled", "{status}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(health(&s, "p1").await.1["metrics"]["slots_busy"], 0);
}

/// POOL-DRAIN-2: an engine that dies while its pool drains restarts the pool drained, not
/// serving: the operator's drain holds until they resume it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_during_a_drain_does_not_undo_the_drain() {
    let s = start(config(vec![pool("p1", 1)]), Duration::from_millis(100)).await;
    let doomed = s
        .submit_ok(json!({"prompt": "[die] going down", "max_tokens": 50}))
        .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (st, _) = post(&s, "/v1/pools/p1/drain", json!({"deadline_ms": 10000})).await;
    assert_eq!(st, 202);
    let ev = s.stream_all(&doomed).await;
    assert_eq!(ev.last().unwrap().data["code"], "WORKER_RESET", "{ev:?}");
    let mut h = health(&s, "p1").await.1;
    for _ in 0..100 {
        if h["metrics"]["restarts"] == 1 && h["state"] != "unready" && h["state"] != "loading" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        h = health(&s, "p1").await.1;
    }
    assert_eq!(h["state"], "drained", "{h}");
    let r = s.submit(json!({"prompt": "x", "pool_id": "p1"})).await;
    assert_eq!(r.status(), 503, "a drained pool takes no work");
    let (st, _) = post(&s, "/v1/pools/p1/resume", json!({})).await;
    assert_eq!(st, 200);
    let id = s
        .submit_ok(json!({"prompt": "back", "max_tokens": 2}))
        .await;
    assert_eq!(s.stream_all(&id).await.last().unwrap().event, "end");
}

/// POOL-LOAD-2: a model that cannot load as its file is (an unsupported architecture) is not
/// retried on a timer (issue 33: every one to two seconds for ever): one attempt, the reason
/// in health with the circuit open; it is tried again when the file changes and when an
/// operator resumes the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_cannot_load_is_retried_only_when_its_file_changes() {
    let file = fake_gguf("unsupported-arch");
    let mut p = pool("u1", 1);
    p.model = file.display().to_string();
    let s = start(config(vec![p]), Duration::from_millis(1)).await;
    let attempts = || async { health(&s, "u1").await.1["metrics"]["consecutive_failures"].clone() };
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (_, h) = health(&s, "u1").await;
    assert_eq!(h["state"], "unready", "{h}");
    assert_eq!(h["metrics"]["circuit_open"], true, "{h}");
    assert_eq!(
        h["metrics"]["consecutive_failures"], 3,
        "one attempt only: {h}"
    );
    let why = h["last_error"].as_str().unwrap_or_default();
    assert!(
        why.contains("unsupported") && why.contains("not retried until"),
        "{h}"
    );
    // the file changes: tried again
    let mut bytes = std::fs::read(&file).unwrap();
    bytes.extend_from_slice(b"more");
    std::fs::write(&file, bytes).unwrap();
    let again =
        support::procs::eventually(Duration::from_secs(6), || async { attempts().await == 4 })
            .await;
    assert!(again, "{}", health(&s, "u1").await.1);
    // an operator's resume: tried again at once
    let (code, _) = post(&s, "/v1/pools/u1/resume", json!({})).await;
    assert_eq!(code, 200);
    let resumed =
        support::procs::eventually(Duration::from_secs(1), || async { attempts().await == 5 })
            .await;
    assert!(resumed, "{}", health(&s, "u1").await.1);
}
