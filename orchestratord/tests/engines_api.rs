//! ADP-KOL-1, ADP-KOL-3: the Kolosal engine API with the scripted engine: add/list/status/remove as pools,
//! validation, chat addressed to an engine by id, queued work for a removed engine failing
//! typed, and `/v1/health` (+ `/health`, `/status`).

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::*;

async fn add(s: &TestServer, body: Value) -> reqwest::Response {
    s.post("/engines", &body).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_are_pools_added_listed_and_removed() {
    let s = start(config(vec![pool("p1", 1)]), Duration::from_millis(2)).await;
    let model = fake_gguf("add");
    let r = add(
        &s,
        json!({"engine_id": "e1", "model_path": model, "n_ctx": 512, "n_gpu_layers": 0}),
    )
    .await;
    assert_eq!(r.status(), 201);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["engine_id"], "e1");
    assert_eq!(v["status"], "loaded");
    assert_eq!(v["model_path"], model.display().to_string());
    assert_eq!(v["parameters"]["n_gpu_layers"], 0);

    // the same engine through the control plane: it is a pool
    let pools = s.get_json("/v1/pools").await;
    assert!(pools["pools"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["pool_id"] == "e1" && p["ready"] == true));
    let list = s.get_json("/engines").await;
    let ids: Vec<&str> = list["engines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["engine_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["e1", "p1"]);

    // chat to it by its id as the model
    let r = s
        .client
        .post(s.url("/v1/chat/completions"))
        .json(&json!({"model": "e1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let st = s.get_json("/engines/e1/status").await;
    assert_eq!(st["status"], "loaded");
    assert_eq!(st["performance"]["total_requests"], 1);
    assert!(st["performance"]["last_inference_tps"].as_f64().unwrap() > 0.0);
    assert_eq!(st["memory_usage"]["model_size_mb"], 1.0);
    assert_eq!(st["slots"], 4);

    // a task queued for e1 only (slots busy) when e1 goes away fails typed, not forever
    let busy: Vec<String> = futures::future::join_all(
        (0..4).map(|_| s.submit_ok(json!({"model": "e1", "prompt": "x", "max_tokens": 200}))),
    )
    .await;
    let queued = s
        .submit_ok(json!({"model": "e1", "prompt": "y", "max_tokens": 2}))
        .await;
    let r = s
        .client
        .delete(s.url("/engines/e1?deadline_ms=100"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v, json!({"engine_id": "e1", "status": "removed"}));
    let ev = s.stream_all(&queued).await;
    let last = ev.last().unwrap();
    assert_eq!(last.event, "error");
    // no pool serving e1 will take work again (ORCH-Q-5)
    assert_eq!(last.data["code"], "POOL_UNAVAILABLE");
    assert_eq!(last.data["retriable"], true);
    for id in &busy {
        let last = s.stream_all(id).await.pop().unwrap();
        assert_eq!(
            last.data["code"], "POOL_UNREADY",
            "running tasks end at the drain deadline"
        );
    }
    let r = s
        .client
        .get(s.url("/engines/e1/status"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "not_found_error");
    let r = s.client.delete(s.url("/engines/e1")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    // the id is free again
    let r = add(&s, json!({"engine_id": "e1", "model_path": model})).await;
    assert_eq!(r.status(), 201);
    let _ = std::fs::remove_file(model);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_engine_requests_are_typed() {
    let mut cfg = config(vec![pool("p1", 1)]);
    cfg.engines_api.max_pools = 2;
    let s = start(cfg, Duration::from_millis(2)).await;
    let model = fake_gguf("bad");
    let not_gguf = std::env::temp_dir().join(format!("orchd-{}-text.gguf", std::process::id()));
    std::fs::write(&not_gguf, b"hello, not a model").unwrap();
    let unloadable =
        std::env::temp_dir().join(format!("orchd-{}-missing.gguf", std::process::id()));
    std::fs::write(&unloadable, b"GGUF but the factory refuses it").unwrap();
    for (body, status, param) in [
        (json!({"model_path": model}), 400, "engine_id"),
        (json!({"engine_id": "x"}), 400, "model_path"),
        (
            json!({"engine_id": "has space", "model_path": model}),
            400,
            "engine_id",
        ),
        (
            // outside the model directories: a policy refusal (SEC-MODEL-1)
            json!({"engine_id": "x", "model_path": "/nonexistent/m.gguf"}),
            403,
            "model_path",
        ),
        (
            // a directory, not a file
            json!({"engine_id": "x", "model_path": std::env::temp_dir()}),
            403,
            "model_path",
        ),
        (
            json!({"engine_id": "x", "model_path": not_gguf}),
            400,
            "model_path",
        ),
        (
            json!({"engine_id": "x", "model_path": unloadable}),
            400,
            "model_path",
        ),
        (
            json!({"engine_id": "x", "model_path": model, "n_ctx": 10}),
            400,
            "n_ctx",
        ),
        (
            json!({"engine_id": "x", "model_path": model, "bogus": 1}),
            400,
            "bogus",
        ),
        (
            json!({"engine_id": "p1", "model_path": model}),
            409,
            "engine_id",
        ),
    ] {
        let r = add(&s, body.clone()).await;
        assert_eq!(r.status(), status, "{body}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["param"], param, "{body}: {v}");
        assert!(!v["error"]["message"].as_str().unwrap().is_empty());
    }
    // the failed load left nothing behind
    assert!(s.state.pools.get("x").is_none());
    assert_eq!(
        add(&s, json!({"engine_id": "x", "model_path": model}))
            .await
            .status(),
        201
    );
    // the limit of 2 pools is reached
    let r = add(&s, json!({"engine_id": "y", "model_path": model})).await;
    assert_eq!(r.status(), 409);
    let r = s
        .client
        .delete(s.url("/engines/x?deadline_ms=abc"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    for f in [model, not_gguf, unloadable] {
        let _ = std::fs::remove_file(f);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_counts_engines_on_all_three_paths() {
    let mut bad = pool("p2", 1);
    bad.model = "/models/missing.gguf".into();
    let s = start(config(vec![pool("p1", 1), bad]), Duration::from_millis(2)).await;
    for path in ["/v1/health", "/health", "/status"] {
        let r = s.client.get(s.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["status"], "degraded", "{path}: {v}");
        assert_eq!(
            v["engines"],
            json!({"loaded": 1, "unloaded": 1, "total": 2})
        );
        assert_eq!(v["version"], contracts::API_VERSION);
        assert!(v["timestamp"].as_u64().unwrap() > 1_700_000_000);
        assert!(v["system"]["uptime_seconds"].is_u64());
        if cfg!(target_os = "linux") {
            assert!(v["system"]["memory_usage_mb"].as_f64().unwrap() > 1.0);
            assert!(v["system"]["cpu_usage_percent"].as_f64().unwrap() >= 0.0);
        }
        let summary = v["engines_summary"].as_array().unwrap();
        assert_eq!(summary[0], json!({"engine_id": "p1", "status": "loaded"}));
        assert_eq!(summary[1], json!({"engine_id": "p2", "status": "unloaded"}));
    }
    // with no engine serving, health says so with a 503
    let r = s
        .client
        .delete(s.url("/engines/p1?deadline_ms=0"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = s.client.get(s.url("/v1/health")).send().await.unwrap();
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["status"], "unhealthy");
}
