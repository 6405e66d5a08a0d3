//! ADP-OAI-1: the OpenAI chat-completions adapter over a real socket with the scripted engine:
//! response shapes, streaming framing, errors in OpenAI's shape, backpressure before the stream.

mod support;

use std::time::Duration;

use serde_json::json;
use support::*;

async fn chat(s: &TestServer, body: serde_json::Value) -> reqwest::Response {
    s.post("/v1/chat/completions", &body).await
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
    let r = chat(&s, json!({"messages": msgs(), "n": 0})).await;
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

/// ADP-OAI-1, ADP-OAI-2, ADP-SEED-1: a client that goes away cancels its task, on every adapter
/// endpoint, streamed or not; the slot comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_going_away_cancels_its_task_on_every_adapter() {
    let s = start(config(vec![pool("p1", 1)]), Duration::from_millis(5)).await;
    let disconnects = || async {
        counter(
            &s.metrics().await,
            "orchd_tasks_cancelled_total{reason=\"disconnect\"}",
        )
    };
    let chat = json!({"model": "scripted-model", "messages": msgs(), "max_tokens": 200});
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let text = json!({"prompt": ["a", "b"], "max_tokens": 200, "stream": true});
    let cases = [
        ("/v1/chat/completions", streamed.clone(), 1.0),
        ("/v1/completions", text, 2.0),
        ("/chat/completions", streamed.clone(), 1.0),
        ("/chat/sse", chat.clone(), 1.0),
    ];
    for (path, body, tasks) in cases {
        let before = disconnects().await;
        let mut r = s.client.post(s.url(path)).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        // first bytes arrived: the task runs; now hang up
        assert!(r.chunk().await.unwrap().is_some());
        drop(r);
        let mut waited = 0;
        while disconnects().await - before < tasks && waited < 100 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            waited += 1;
        }
        assert_eq!(disconnects().await - before, tasks, "{path}");
    }
    // not streamed: the client gives up waiting
    let before = disconnects().await;
    let quick = reqwest::Client::builder()
        .timeout(Duration::from_millis(150))
        .build()
        .unwrap();
    for path in ["/v1/chat/completions", "/chat/completions"] {
        let err = quick.post(s.url(path)).json(&chat).send().await;
        assert!(err.is_err(), "{path} should still be running");
    }
    let mut waited = 0;
    while disconnects().await - before < 2.0 && waited < 100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += 1;
    }
    assert_eq!(disconnects().await - before, 2.0);
    let mut waited = 0;
    while s.state.pools.get("p1").unwrap().snapshot().slots_busy > 0 && waited < 100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += 1;
    }
    assert_eq!(s.state.pools.get("p1").unwrap().snapshot().slots_busy, 0);
}

/// ADP-OAI-4: every field of OpenAI's chat-completions request (as its API reference lists
/// them) is honoured or refused with a 400 naming it: a client asking for JSON output, tools
/// or log-probabilities never gets a 200 as if it had not asked. Neutral values pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_openai_chat_field_is_honoured_or_refused_by_name() {
    let s = start(config(vec![pool("p1", 2)]), Duration::from_millis(1)).await;
    // (field, a value that asks for something, honoured?)
    let fields = [
        ("audio", json!({"voice": "alloy", "format": "wav"}), false),
        ("frequency_penalty", json!(0.5), true),
        ("function_call", json!("auto"), false),
        ("functions", json!([{"name": "f", "parameters": {}}]), false),
        ("logit_bias", json!({"50256": -100}), false),
        ("logprobs", json!(true), false),
        ("max_completion_tokens", json!(3), true),
        ("max_tokens", json!(3), true),
        ("metadata", json!({"k": "v"}), true),
        ("modalities", json!(["text", "audio"]), false),
        ("n", json!(2), true),
        ("parallel_tool_calls", json!(true), true),
        (
            "prediction",
            json!({"type": "content", "content": "x"}),
            false,
        ),
        ("presence_penalty", json!(0.5), true),
        ("prompt_cache_key", json!("k"), true),
        ("reasoning_effort", json!("low"), false),
        ("response_format", json!({"type": "json_object"}), false),
        ("safety_identifier", json!("u1"), true),
        ("seed", json!(7), true),
        ("service_tier", json!("auto"), true),
        ("stop", json!(["\n"]), true),
        ("store", json!(true), false),
        ("stream", json!(false), true),
        ("stream_options", json!({"include_usage": true}), true),
        ("temperature", json!(0.7), true),
        ("tool_choice", json!("auto"), false),
        (
            "tools",
            json!([{"type": "function", "function": {"name": "f"}}]),
            false,
        ),
        ("top_logprobs", json!(3), false),
        ("top_p", json!(0.9), true),
        ("user", json!("u1"), true),
        ("verbosity", json!("high"), false),
        ("web_search_options", json!({}), false),
    ];
    for (field, value, honoured) in fields {
        let mut body = json!({"model": "scripted-model", "messages": msgs(), "max_tokens": 3});
        body[field] = value;
        let r = chat(&s, body).await;
        let status = r.status().as_u16();
        let v: serde_json::Value = r.json().await.unwrap();
        if honoured {
            assert_eq!(status, 200, "{field}: {v}");
        } else {
            assert_eq!(status, 400, "{field} was not refused: {v}");
            assert_eq!(v["error"]["param"], field, "{v}");
            assert_eq!(v["error"]["code"], "INVALID_PARAMS");
        }
    }
    for (field, neutral) in [
        ("response_format", json!({"type": "text"})),
        ("tools", json!([])),
        ("tool_choice", json!("none")),
        ("logprobs", json!(false)),
        ("modalities", json!(["text"])),
        ("store", json!(false)),
    ] {
        let mut body = json!({"model": "scripted-model", "messages": msgs(), "max_tokens": 2});
        body[field] = neutral;
        assert_eq!(chat(&s, body).await.status(), 200, "{field}");
    }
}

/// The in-repo load generator (`orchd-load`, `orchd_tools::loadgen`) against a live server:
/// every request completes with its tokens counted (from `usage`), refusals are counted by
/// kind, never as completions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_generator_counts_tokens_and_errors() {
    use orchd_tools::loadgen::{run_level, LoadSpec};
    let s = start(config(vec![pool("p1", 2)]), Duration::from_millis(1)).await;
    let mut spec = LoadSpec {
        base_url: s.base.clone(),
        model: "scripted-model".into(),
        concurrency: 2,
        requests: 6,
        max_tokens: 5,
        timeout: Duration::from_secs(30),
    };
    let r = run_level(&s.client, &spec).await;
    assert_eq!((r.completed, r.output_tokens), (6, 30), "{r:?}");
    assert!(
        r.errors.is_empty() && r.tokens_per_s > 0.0 && r.ttft_p50_ms > 0.0,
        "{r:?}"
    );
    assert!(
        r.ttft_p50_ms <= r.ttft_p95_ms && r.itl_p50_ms <= r.itl_p95_ms,
        "{r:?}"
    );
    spec.model = "no-such-model".into();
    let r = run_level(&s.client, &spec).await;
    assert_eq!(r.completed, 0);
    assert_eq!(r.errors.get("http 404"), Some(&6), "{r:?}");
}

/// ADP-OAI-5: content as an array of text parts is the same prompt as the string (the
/// scripted engine counts its words: the same prompt tokens); a non-text part is a 400 naming
/// it; `/v1/models/{model}` gives the context length and owner, by alias or pool id, the
/// smallest context of two pools serving it; an unknown model is a 404 in OpenAI's shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn content_parts_and_one_model_by_name() {
    let mut small = pool("p2", 1);
    small.ctx = 128;
    let s = start(config(vec![pool("p1", 2), small]), Duration::from_millis(1)).await;
    let usage = |v: &serde_json::Value| v["usage"]["prompt_tokens"].clone();
    let plain: serde_json::Value = chat(
        &s,
        json!({"messages": [{"role": "user", "content": "one two\nthree"}], "max_tokens": 2}),
    )
    .await
    .json()
    .await
    .unwrap();
    let parts = json!([{"type": "text", "text": "one two"}, {"type": "text", "text": "three"}]);
    let r = chat(
        &s,
        json!({"messages": [{"role": "user", "content": parts}], "max_tokens": 2}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(usage(&v), usage(&plain), "{v}");

    let image = json!([{"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": {"url": "data:,"}}]);
    let r = chat(
        &s,
        json!({"messages": [{"role": "system", "content": "hi"}, {"role": "user", "content": image}]}),
    )
    .await;
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "messages[1].content[1]", "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("image_url"));

    for name in ["scripted-model", "p1"] {
        let m = s.get_json(&format!("/v1/models/{name}")).await;
        assert_eq!(m["id"], name);
        assert_eq!(m["owned_by"], "orchestratord");
        assert_eq!(
            m["max_model_len"],
            if name == "p1" { 256 } else { 128 },
            "{m}"
        );
    }
    let listed = s.get_json("/v1/models").await;
    assert_eq!(listed["data"][0]["max_model_len"], 128, "{listed}");
    let r = s
        .client
        .get(s.url("/v1/models/no-such-model"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "not_found_error", "{v}");
}
