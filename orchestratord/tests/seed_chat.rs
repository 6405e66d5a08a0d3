//! ADP-SEED-1: the seed-001 chat API (Ollama's shape) over a real socket with the scripted
//! engine, asserting on raw bytes: JSON answer, NDJSON line framing with `done: true` last,
//! SSE `\n\n` framing with `data: [END]` last, errors as `event: error` / an error line, and
//! refusals before the stream.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::*;

async fn post(s: &TestServer, path: &str, body: Value) -> reqwest::Response {
    s.post(path, &body).await
}

fn ask(stream: bool, max_tokens: u32) -> Value {
    json!({
        "model": "scripted-model",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}],
        "stream": stream,
        "temperature": 0.7,
        "max_tokens": max_tokens,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regular_invocation_is_one_json_object() {
    let s = start(config(vec![pool("p1", 2)]), Duration::from_millis(2)).await;
    let r = post(&s, "/chat/completions", ask(false, 3)).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    let v: Value = r.json().await.unwrap();
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["model"], "scripted-model");
    assert!(v["created"].as_u64().unwrap() > 1_700_000_000);
    assert_eq!(v["message"]["role"], "assistant");
    assert_eq!(v["message"]["content"], "tok0 tok1 tok2 ");
    assert_eq!(v["done"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_streaming_is_one_object_per_line_with_done_last() {
    let s = start(config(vec![pool("p1", 2)]), Duration::from_millis(2)).await;
    let r = post(&s, "/chat/completions", ask(true, 4)).await;
    assert_eq!(r.status(), 200);
    let h = r.headers().clone();
    assert_eq!(h["content-type"], "application/json");
    assert_eq!(h["transfer-encoding"], "chunked");
    assert_eq!(h["cache-control"], "no-cache");
    assert_eq!(h["connection"], "keep-alive");
    let raw = r.text().await.unwrap();
    assert!(raw.ends_with('\n'), "{raw:?}");
    assert!(!raw.contains("\n\n"), "NDJSON has no blank lines: {raw:?}");
    let lines: Vec<Value> = raw
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert_eq!(lines.len(), 5, "{raw}");
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["index"], i, "{raw}");
        assert_eq!(l["message"]["role"], "assistant");
        assert_eq!(l["done"], i == lines.len() - 1, "{raw}");
    }
    let text: String = lines
        .iter()
        .map(|l| l["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, "tok0 tok1 tok2 tok3 ");
    assert_eq!(lines.last().unwrap()["finish_reason"], "length");
}

/// ADP-SEED-1: a client whose `Accept` names `application/x-ndjson` gets the same lines under
/// that type; a plain answer stays `application/json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_streaming_answers_ndjson_type_when_accepted() {
    let s = start(config(vec![pool("p1", 2)]), Duration::from_millis(2)).await;
    let send = |stream: bool| {
        s.client
            .post(s.url("/chat/completions"))
            .header("accept", "application/json, application/x-ndjson")
            .json(&ask(stream, 2))
            .send()
    };
    let r = send(true).await.unwrap();
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    let raw = r.text().await.unwrap();
    let lines: Vec<Value> = raw
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{raw}");
    assert_eq!(lines[2]["done"], true);
    let r = send(false).await.unwrap();
    assert_eq!(r.headers()["content-type"], "application/json");
    assert_eq!(r.json::<Value>().await.unwrap()["done"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_streaming_ends_with_end_marker() {
    let s = start(config(vec![pool("p1", 2)]), Duration::from_millis(2)).await;
    // `stream` is ignored on /chat/sse: always streamed
    let r = post(&s, "/chat/sse", ask(false, 3)).await;
    assert_eq!(r.status(), 200);
    let h = r.headers().clone();
    assert_eq!(h["content-type"], "text/event-stream");
    assert_eq!(h["cache-control"], "no-cache");
    assert_eq!(h["connection"], "keep-alive");
    let raw = r.text().await.unwrap();
    assert!(raw.ends_with("data: [END]\n\n"), "{raw:?}");
    let frames: Vec<&str> = raw.strip_suffix("\n\n").unwrap().split("\n\n").collect();
    assert_eq!(*frames.last().unwrap(), "data: [END]");
    assert_eq!(frames.iter().filter(|f| **f == "data: [END]").count(), 1);
    let chunks: Vec<Value> = frames[..frames.len() - 1]
        .iter()
        .map(|f| {
            assert!(f.starts_with("data: ") && !f[6..].contains('\n'), "{f:?}");
            serde_json::from_str(&f[6..]).unwrap()
        })
        .collect();
    let text: String = chunks
        .iter()
        .map(|c| c["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, "tok0 tok1 tok2 ");
    assert!(chunks[..chunks.len() - 1]
        .iter()
        .all(|c| c["done"] == false));
    assert_eq!(chunks.last().unwrap()["done"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_after_the_stream_began_are_framed_as_the_seed_says() {
    let s = start(config(vec![pool("p1", 2)]), Duration::from_millis(2)).await;
    let failing = json!({"model": "scripted-model", "messages": [{"role": "user", "content": "go [fail]"}], "max_tokens": 50});
    let r = post(&s, "/chat/sse", failing.clone()).await;
    assert_eq!(r.status(), 200);
    let raw = r.text().await.unwrap();
    let frames: Vec<&str> = raw.strip_suffix("\n\n").unwrap().split("\n\n").collect();
    assert_eq!(*frames.last().unwrap(), "data: [END]", "{raw}");
    let err = frames[frames.len() - 2];
    let body = err
        .strip_prefix("event: error\ndata: ")
        .unwrap_or_else(|| panic!("{err:?}"));
    let v: Value = serde_json::from_str(body).unwrap();
    assert!(v["message"].is_string() && v["type"] == "server_error" && v["code"].is_string());
    // the tokens before the failure came as normal chunks
    assert!(frames[0].starts_with("data: {"));

    let mut ndjson = failing;
    ndjson["stream"] = json!(true);
    let raw = post(&s, "/chat/completions", ndjson)
        .await
        .text()
        .await
        .unwrap();
    let last: Value = serde_json::from_str(raw.lines().last().unwrap()).unwrap();
    assert_eq!(last["done"], true, "{raw}");
    assert!(last["error"]["message"].is_string(), "{raw}");
    assert!(last["error"]["code"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_come_before_any_stream_byte() {
    let mut cfg = config(vec![pool("p1", 1)]);
    cfg.queue.capacity = 1;
    let s = start(cfg, Duration::from_millis(50)).await;
    let r = post(&s, "/chat/completions", json!({"messages": []})).await;
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "model", "{v}");
    let r = post(
        &s,
        "/chat/sse",
        json!({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(r.status(), 404);
    let _a = s.submit_ok(json!({"prompt": "x", "max_tokens": 50})).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _b = s.submit_ok(json!({"prompt": "x", "max_tokens": 50})).await;
    for path in ["/chat/completions", "/chat/sse"] {
        let r = post(&s, path, ask(true, 5)).await;
        assert_eq!(r.status(), 429, "{path}");
        assert!(r.headers().contains_key("retry-after"));
        assert_eq!(r.headers()["content-type"], "application/json");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "ADMISSION_REJECT");
    }
}

/// ADP-SEED-3: every field of the request is honoured or refused by name: the seed's fields and
/// our additions run; anything else (Ollama's `options`, OpenAI's `tools`, …) is a 400 naming
/// it, on both endpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_are_refused_by_name() {
    let s = start(config(vec![pool("p1", 2)]), Duration::from_millis(1)).await;
    let full = json!({
        "model": "scripted-model",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        "stream": false, "temperature": 0.7, "top_p": 0.9, "max_tokens": 3, "seed": 7,
        "stop": ["zzz"],
    });
    let r = post(&s, "/chat/completions", full.clone()).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    for field in ["options", "tools", "format", "keep_alive", "top_k"] {
        for path in ["/chat/completions", "/chat/sse"] {
            let mut body = full.clone();
            body[field] = json!(1);
            let r = post(&s, path, body).await;
            assert_eq!(r.status(), 400, "{path} {field}");
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["param"], field, "{path}: {v}");
        }
    }
}
