//! ADP-TOK-1: `/tokenize` and `/detokenize` on the real model: text round-trips through ids;
//! pieces spell the text; a chat counts exactly the prompt tokens a chat request is charged;
//! llama.cpp's and vLLM's field names both work; bad input is a typed 400 naming the field.

mod support;

use std::sync::Arc;

use serde_json::{json, Value};
use support::*;

async fn post(s: &TestServer, path: &str, body: Value) -> (u16, Value) {
    let r = s.post(path, &body).await;
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_and_detokenize_with_the_real_model() {
    let cfg = config(vec![real_pool("default", 1, 1024)]);
    let s = start_with(cfg, Arc::new(pool_manager::candle::CandleFactory)).await;
    let text = "What is the capital of France? Ünïcödé and 日本語 too.";

    let (st, v) = post(
        &s,
        "/tokenize",
        json!({"content": text, "add_special": false}),
    )
    .await;
    assert_eq!(st, 200, "{v}");
    let ids: Vec<u64> = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(v["count"], ids.len());
    assert!(ids.len() > 10, "{v}");
    assert_eq!(v["max_model_len"], 1024);
    // vLLM's names give the same ids
    let (_, same) = post(
        &s,
        "/tokenize",
        json!({"prompt": text, "add_special_tokens": false}),
    )
    .await;
    assert_eq!(same["tokens"], v["tokens"]);
    // the ids' text is the text; both servers' field names are answered
    let (st, d) = post(&s, "/detokenize", json!({"tokens": ids})).await;
    assert_eq!(st, 200, "{d}");
    assert_eq!(d["content"], text);
    assert_eq!(d["prompt"], text);
    // each id with its piece; the pieces of whole characters spell the text
    let (_, p) = post(
        &s,
        "/tokenize",
        json!({"content": "Hello world, hello model.", "with_pieces": true, "add_special": false}),
    )
    .await;
    let spelled: String = p["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["piece"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(spelled, "Hello world, hello model.", "{p}");

    // a chat counts what a chat request is charged for its prompt
    let messages = json!([{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Name a colour."}]);
    let (_, t) = post(&s, "/tokenize", json!({"messages": messages})).await;
    let r = s
        .post(
            "/v1/chat/completions",
            &json!({"messages": messages, "max_tokens": 1}),
        )
        .await;
    let chat: Value = r.json().await.unwrap();
    assert_eq!(t["count"], chat["usage"]["prompt_tokens"], "{t} {chat}");

    // typed refusals
    let (st, e) = post(&s, "/tokenize", json!({"content": "a", "prompt": "b"})).await;
    assert_eq!(
        (st, e["error"]["param"].clone()),
        (400, json!("content")),
        "{e}"
    );
    let (st, e) = post(&s, "/detokenize", json!({"tokens": [1, 4_000_000]})).await;
    assert_eq!(
        (st, e["error"]["param"].clone()),
        (400, json!("tokens")),
        "{e}"
    );
    assert!(e["error"]["message"].as_str().unwrap().contains("4000000"));
    let (st, e) = post(&s, "/tokenize", json!({"model": "nope", "content": "a"})).await;
    assert_eq!(
        (st, e["error"]["param"].clone()),
        (404, json!("model")),
        "{e}"
    );
    let (st, e) = post(&s, "/tokenize", json!({"content": "a", "extra": 1})).await;
    assert_eq!(st, 400, "unknown fields are refused");
    assert_eq!(
        e["error"]["code"], "INVALID_PARAMS",
        "OpenAI-shaped like the route: {e}"
    );
    let (st, e) = post(&s, "/tokenize", json!({"messages": []})).await;
    assert_eq!(
        (st, e["error"]["param"].clone()),
        (400, json!("messages")),
        "{e}"
    );
    let (st, e) = post(&s, "/detokenize", json!({"tokens": [-1]})).await;
    assert_eq!(
        (st, e["error"]["param"].clone()),
        (400, json!("tokens[0]")),
        "{e}"
    );
}
