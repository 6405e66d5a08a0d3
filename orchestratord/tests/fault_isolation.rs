//! ENG-ISO-1: a kernel panic in one engine (injected with the `fault-injection` feature) does
//! not take the process's other engines down. Its own test binary: the injected panic hits
//! whichever engine of the process runs a kernel next, so no other test may run engines here.

mod support;

use std::sync::Arc;
use std::time::Duration;

use pool_manager::candle::CandleFactory;
use serde_json::json;
use support::*;

async fn health(s: &TestServer, id: &str) -> serde_json::Value {
    s.get_json(&format!("/v1/pools/{id}/health")).await
}

/// POOL-LOAD-1, ENG-ISO-1: a panic inside a compute kernel of one engine (injected) ends that
/// engine's task with a retriable WORKER_RESET; the shared compute pool is not poisoned, so
/// the other pool keeps generating and the failed pool's restart passes its self-test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_panic_in_one_engine_leaves_the_others_working() {
    // every thread of the shared compute pool, so the kernels run on it (one thread runs
    // them inline)
    let mk = |id: &str| {
        let mut p = pool(id, 2);
        p.model = default_model_path();
        p.alias = Some("smollm2".into());
        p.ctx = 512;
        p.threads = 0;
        p
    };
    let mut cfg = config(vec![mk("p1"), mk("p2")]);
    cfg.timeouts.idle_ms = 30_000;
    let s = start_with(cfg, Arc::new(CandleFactory)).await;
    let victim = s
        .submit_ok(json!({"prompt": "Count to one hundred:", "max_tokens": 300, "pool_id": "p1"}))
        .await;
    let mut body = s.open_stream(&victim).await.bytes_stream();
    let mut buf = String::new();
    let mut seen = Vec::new();
    while !seen.iter().any(|e: &Ev| e.event == "token") {
        use futures::StreamExt;
        let chunk = body.next().await.unwrap().unwrap();
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
        seen.extend(parse_frames(&mut buf));
    }
    // only p1 runs now: its next kernel chunk panics
    pool_manager::candle::fault::arm_kernel_panic();
    drop(body);
    let ev = s.stream_all(&victim).await;
    let last = ev.last().unwrap();
    assert_eq!(last.event, "error", "{ev:?}");
    assert_eq!(last.data["code"], "WORKER_RESET", "{last:?}");
    assert_eq!(last.data["retriable"], true);
    // the other engine still generates, with the same shared compute pool
    let id = s
        .submit_ok(json!({"prompt": "Hi", "max_tokens": 8, "pool_id": "p2"}))
        .await;
    let ev = s.stream_all(&id).await;
    assert_well_formed(&ev);
    assert_eq!(ev.last().unwrap().event, "end", "{ev:?}");
    // p1 restarts: its new engine's self-test runs kernels on the same pool
    let mut state = String::new();
    for _ in 0..200 {
        let h = health(&s, "p1").await;
        state = h["state"].as_str().unwrap().to_string();
        if state == "ready" && h["metrics"]["restarts"] == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(state, "ready", "{}", health(&s, "p1").await);
    let id = s
        .submit_ok(json!({"prompt": "Hi", "max_tokens": 4, "pool_id": "p1"}))
        .await;
    assert_eq!(s.stream_all(&id).await.last().unwrap().event, "end");
}
