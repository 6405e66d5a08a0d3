//! ADP-OAI-2: `/v1/completions` over a real socket with the scripted engine: string and array
//! prompts (one task each, choices by index), interleaved streaming, `echo`, all-or-none
//! admission, refusals, and a failure after the stream began.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::*;

async fn complete(s: &TestServer, body: Value) -> reqwest::Response {
    s.post("/v1/completions", &body).await
}

/// The JSON of every `data:` frame before `[DONE]`, asserting SSE framing and `[DONE]` last.
fn data_frames(raw: &str) -> Vec<Value> {
    assert!(raw.ends_with("\n\n"), "{raw:?}");
    let frames: Vec<&str> = raw.split("\n\n").filter(|f| !f.is_empty()).collect();
    assert!(frames.iter().all(|f| f.starts_with("data: ")), "{raw}");
    assert_eq!(*frames.last().unwrap(), "data: [DONE]");
    assert_eq!(frames.iter().filter(|f| **f == "data: [DONE]").count(), 1);
    frames[..frames.len() - 1]
        .iter()
        .map(|f| serde_json::from_str(&f[6..]).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn string_and_array_prompts_answer_choices_by_index() {
    let s = start(config(vec![pool("p1", 4)]), Duration::from_millis(2)).await;
    let r = complete(
        &s,
        json!({"model": "scripted-model", "prompt": "one two", "max_tokens": 3}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert_eq!(v["choices"].as_array().unwrap().len(), 1);
    assert_eq!(v["choices"][0]["text"], "tok0 tok1 tok2 ");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], 2);
    assert_eq!(v["usage"]["completion_tokens"], 3);

    // OpenAI's default max_tokens for completions is 16
    let v: Value = complete(&s, json!({"prompt": "x"}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 16);

    let r = complete(
        &s,
        json!({"prompt": ["a", "b c", "d e f"], "max_tokens": 2}),
    )
    .await;
    let v: Value = r.json().await.unwrap();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], "tok0 tok1 ");
    }
    // usage sums the prompts: 1 + 2 + 3 prompt tokens, 3 × 2 completion tokens
    assert_eq!(v["usage"]["prompt_tokens"], 6);
    assert_eq!(v["usage"]["completion_tokens"], 6);
    assert_eq!(v["usage"]["total_tokens"], 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn array_prompts_stream_interleaved_with_their_index() {
    let s = start(config(vec![pool("p1", 4)]), Duration::from_millis(3)).await;
    let r = complete(
        &s,
        json!({"prompt": ["a", "b"], "max_tokens": 4, "stream": true, "stream_options": {"include_usage": true}}),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let frames = data_frames(&r.text().await.unwrap());
    let usage = frames.last().unwrap();
    assert_eq!(usage["choices"].as_array().unwrap().len(), 0);
    assert_eq!(usage["usage"]["completion_tokens"], 8);
    for idx in 0..2 {
        let mine: Vec<&Value> = frames
            .iter()
            .filter(|f| f["choices"].as_array().unwrap().len() == 1)
            .filter(|f| f["choices"][0]["index"] == idx)
            .collect();
        let text: String = mine
            .iter()
            .map(|f| f["choices"][0]["text"].as_str().unwrap())
            .collect();
        assert_eq!(text, "tok0 tok1 tok2 tok3 ");
        // finish_reason only on the last frame of each choice
        let last = mine.last().unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        assert!(mine[..mine.len() - 1]
            .iter()
            .all(|f| f["choices"][0]["finish_reason"].is_null()));
        assert!(mine.iter().all(|f| f["object"] == "text_completion"));
    }
}

/// ADP-OAI-2: `echo` puts each prompt before its completion, answered whole or streamed as
/// the choice's first frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_starts_each_choice_with_its_prompt() {
    let s = start(config(vec![pool("p1", 4)]), Duration::from_millis(2)).await;
    let body = json!({"prompt": ["one two", "three"], "max_tokens": 2, "echo": true});
    let v: Value = complete(&s, body.clone()).await.json().await.unwrap();
    assert_eq!(v["choices"][0]["text"], "one twotok0 tok1 ");
    assert_eq!(v["choices"][1]["text"], "threetok0 tok1 ");
    // the echoed prompt is not completion usage
    assert_eq!(v["usage"]["completion_tokens"], 4);

    let mut streamed = body;
    streamed["stream"] = json!(true);
    let r = complete(&s, streamed).await;
    let frames = data_frames(&r.text().await.unwrap());
    for (idx, prompt) in [(0, "one two"), (1, "three")] {
        let mine: Vec<&str> = frames
            .iter()
            .filter(|f| f["choices"][0]["index"] == idx)
            .map(|f| f["choices"][0]["text"].as_str().unwrap())
            .collect();
        assert_eq!(mine[0], prompt, "{frames:?}");
        assert_eq!(mine.concat(), format!("{prompt}tok0 tok1 "));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_are_openai_shaped_and_admission_is_all_or_none() {
    let mut cfg = config(vec![pool("p1", 1)]);
    cfg.queue.capacity = 2;
    cfg.admission.max_prompts_per_request = 3;
    let s = start(cfg, Duration::from_millis(20)).await;
    for (body, param) in [
        (json!({"prompt": ["a", "b", "c", "d"]}), "prompt"),
        (json!({"prompt": []}), "prompt"),
        (json!({"prompt": [1, 2, 3], "echo": true}), "echo"),
        (json!({"prompt": "a", "n": 2}), "n"),
        (json!({"prompt": "a", "best_of": 3}), "best_of"),
        (json!({"prompt": "a", "logprobs": 2}), "logprobs"),
        (json!({"prompt": "a", "max_tokens": 0}), "max_tokens"),
    ] {
        let r = complete(&s, body.clone()).await;
        assert_eq!(r.status(), 400, "{body}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error", "{body}");
        assert_eq!(v["error"]["param"], param, "{body}: {v}");
    }
    let r = complete(&s, json!({"model": "nope", "prompt": "a"})).await;
    assert_eq!(r.status(), 404);

    // one slot + a queue of 2: three prompts cannot all be admitted now (one runs, two wait,
    // the third is refused) — so none is, and nothing is left behind
    let _busy = s.submit_ok(json!({"prompt": "x", "max_tokens": 40})).await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    let client_cancels = || async {
        counter(
            &s.metrics().await,
            "orchd_tasks_cancelled_total{reason=\"client\"}",
        )
    };
    let before = client_cancels().await;
    let r = complete(&s, json!({"prompt": ["a", "b", "c"], "max_tokens": 2})).await;
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert_eq!(
        s.state.queue.len(),
        0,
        "the admitted prompts were withdrawn"
    );
    // metrics are process-wide: compare deltas
    assert_eq!(client_cancels().await - before, 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failure_mid_stream_is_an_error_frame_then_done_and_cancels_the_siblings() {
    let s = start(config(vec![pool("p1", 4)]), Duration::from_millis(5)).await;
    let disconnects = || async {
        counter(
            &s.metrics().await,
            "orchd_tasks_cancelled_total{reason=\"disconnect\"}",
        )
    };
    let before = disconnects().await;
    let r = complete(
        &s,
        json!({"prompt": ["fine", "breaks [fail]"], "max_tokens": 200, "stream": true}),
    )
    .await;
    assert_eq!(r.status(), 200);
    let frames = data_frames(&r.text().await.unwrap());
    let err = frames.last().unwrap();
    assert_eq!(err["error"]["type"], "server_error", "{err}");
    assert!(err["error"]["code"].is_string());
    // the healthy sibling was cancelled rather than left running
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(disconnects().await - before, 1.0);
    assert_eq!(s.state.pools.get("p1").unwrap().snapshot().slots_busy, 0);
}
