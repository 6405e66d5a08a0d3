//! ADP-KOL-2, ADP-SEED-2: the Kolosal engine API and the seed-001 chat API with the real default
//! model: add an engine from the default model path, chat to it by its id (OpenAI, NDJSON and
//! SSE), read its status, delete it.

mod support;

use std::sync::Arc;

use serde_json::{json, Value};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn add_chat_status_delete_with_the_real_model() {
    let mut cfg = config(vec![real_pool("default", 1, 512)]);
    cfg.timeouts.idle_ms = 30_000;
    cfg.engines_api.slots = 2;
    let s = start_with(cfg, Arc::new(pool_manager::candle::CandleFactory)).await;

    let r = s
        .post(
            "/engines",
            &json!({"engine_id": "smol", "model_path": default_model_path(), "n_ctx": 1024}),
        )
        .await;
    assert_eq!(r.status(), 201);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["status"], "loaded");
    assert_eq!(v["parameters"]["n_ctx"], 1024);

    let question = json!([
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"}
    ]);
    let r = s
        .post(
            "/v1/chat/completions",
            &json!({"model": "smol", "messages": question, "max_tokens": 24, "temperature": 0}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    let answer = v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(answer.contains("Paris"), "{answer:?}");
    assert_eq!(v["model"], "smol");

    // the seed-001 formats carry the same greedy answer
    let body = json!({"model": "smol", "messages": question, "max_tokens": 24, "temperature": 0, "stream": true});
    let raw = s
        .post("/chat/completions", &body)
        .await
        .text()
        .await
        .unwrap();
    let lines: Vec<Value> = raw
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let text: String = lines
        .iter()
        .map(|l| l["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, answer);
    assert_eq!(lines.last().unwrap()["done"], true);
    let raw = s.post("/chat/sse", &body).await.text().await.unwrap();
    assert!(raw.ends_with("data: [END]\n\n"));
    let text: String = raw
        .split("\n\n")
        .filter_map(|f| f.strip_prefix("data: {"))
        .map(|j| {
            let v: Value = serde_json::from_str(&format!("{{{j}")).unwrap();
            v["message"]["content"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(text, answer);

    let st = s.get_json("/engines/smol/status").await;
    assert_eq!(st["status"], "loaded");
    assert_eq!(st["performance"]["total_requests"], 3);
    assert!(st["performance"]["last_inference_tps"].as_f64().unwrap() > 1.0);
    let mb = st["memory_usage"]["model_size_mb"].as_f64().unwrap();
    assert!((80.0..120.0).contains(&mb), "the 98 MB GGUF: {mb}");
    // SmolLM2-135M: 30 layers × 3 KV heads × 64 dims × K and V × f32 × 1024 ctx × 2 slots
    let kv_mb = 30.0 * 3.0 * 64.0 * 2.0 * 4.0 * 1024.0 * 2.0 / (1024.0 * 1024.0);
    assert_eq!(
        st["memory_usage"]["context_size_mb"].as_f64().unwrap(),
        kv_mb
    );
    let health = s.get_json("/v1/health").await;
    assert_eq!(health["engines"]["loaded"], 2);

    let r = s
        .client
        .delete(s.url("/engines/smol"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = s
        .post(
            "/v1/chat/completions",
            &json!({"model": "smol", "messages": question}),
        )
        .await;
    assert_eq!(r.status(), 404, "the engine's model is gone");
    let health = s.get_json("/v1/health").await;
    assert_eq!(health["engines"]["total"], 1);
}
