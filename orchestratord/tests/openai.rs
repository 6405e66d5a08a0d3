//! ADP-OAI-1: the OpenAI chat-completions adapter over a real socket with the scripted engine:
//! response shapes, streaming framing, errors in OpenAI's shape, backpressure before the stream.

mod support;

use std::time::Duration;

use serde_json::json;
use support::*;

async fn chat(s: &TestServer, body: serde_json::Value) -> reqwest::Response {
    s.client
        .post(s.url("/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap()
}

fn msgs() -> serde_json::Value {
    json!([{"role": "user", "content": "Say something"}])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streaming_and_streaming_shapes() {
    let s = start(config(vec![pool("p1", 2)]), Duration::from_millis(2)).await;
    let models = s.get_json("/v1/models").await;
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "scripted-model");
    let r = chat(
        &s,
        json!({"model": "scripted-model", "messages": msgs(), "max_tokens": 5, "logprobs": false}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "tok0 tok1 tok2 tok3 tok4 "
    );
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(
        v["usage"]["total_tokens"].as_u64().unwrap(),
        v["usage"]["prompt_tokens"].as_u64().unwrap() + 5
    );
    let r = chat(
        &s,
        json!({"messages": msgs(), "max_tokens": 3, "stream": true, "stream_options": {"include_usage": true}}),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let raw = r.text().await.unwrap();
    let frames: Vec<&str> = raw.split("\n\n").filter(|f| !f.is_empty()).collect();
    assert!(frames.iter().all(|f| f.starts_with("data: ")), "{raw}");
    assert_eq!(*frames.last().unwrap(), "data: [DONE]");
    let chunks: Vec<serde_json::Value> = frames[..frames.len() - 1]
        .iter()
        .map(|f| serde_json::from_str(&f[6..]).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "tok0 tok1 tok2 ");
    let fin = &chunks[chunks.len() - 2];
    assert_eq!(fin["choices"][0]["finish_reason"], "length");
    let usage = &chunks[chunks.len() - 1];
    assert_eq!(usage["usage"]["completion_tokens"], 3);
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_openai_shaped_and_full_queue_is_429_before_the_stream() {
    let mut cfg = config(vec![pool("p1", 1)]);
    cfg.queue.capacity = 1;
    let s = start(cfg, Duration::from_millis(50)).await;
    let r = chat(&s, json!({"messages": msgs(), "n": 2})).await;
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["param"], "n");
    let r = chat(&s, json!({"messages": "nope"})).await;
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "messages");
    let r = chat(&s, json!({"model": "gpt-9", "messages": msgs()})).await;
    assert_eq!(r.status(), 404);
    // fill the slot and the queue, then the next streaming request is refused up front
    let _a = s.submit_ok(json!({"prompt": "x", "max_tokens": 50})).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _b = s.submit_ok(json!({"prompt": "x", "max_tokens": 50})).await;
    let r = chat(&s, json!({"messages": msgs(), "stream": true})).await;
    assert_eq!(r.status(), 429);
    assert!(
        r.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert_eq!(v["error"]["code"], "ADMISSION_REJECT");
}
