//! ORCH-ADM-7: a prompt is templated and tokenized once per task, at admission, off the async
//! runtime; the runner takes admission's ids.

mod support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use support::*;

/// Each task's prompt is tokenized once (admission), not again when it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_prompt_is_tokenized_once() {
    let s = start(config(vec![pool("p1", 2)]), Duration::from_millis(1)).await;
    let before = TOKENIZE_CALLS.load(Ordering::SeqCst);
    for i in 0..5 {
        let id = s
            .submit_ok(json!({"prompt": format!("[counted] prompt number {i}"), "max_tokens": 3}))
            .await;
        assert_eq!(s.stream_all(&id).await.last().unwrap().event, "end");
    }
    let r = s
        .post(
            "/v1/chat/completions",
            &json!({"model": "scripted-model", "messages": [{"role": "user", "content": "[counted] hi"}], "max_tokens": 2}),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert_eq!(TOKENIZE_CALLS.load(Ordering::SeqCst) - before, 6);
}

/// A prompt that takes long to tokenize does not stall the other streams: tokenizing runs on
/// blocking threads, not on the runtime (here the runtime has one thread, so a tokenizer on it
/// would freeze every stream for the whole time).
#[tokio::test(flavor = "current_thread")]
async fn a_slow_tokenize_does_not_freeze_running_streams() {
    let s = start(config(vec![pool("p1", 2)]), Duration::from_millis(10)).await;
    let id = s
        .submit_ok(json!({"prompt": "steady", "max_tokens": 80}))
        .await;
    let r = s.open_stream(&id).await;
    let mut body = r.bytes_stream();
    // wait for the stream to flow
    body.next().await.unwrap().unwrap();
    let slow = {
        let client = s.client.clone();
        let url = s.url("/v1/tasks");
        tokio::spawn(async move {
            client
                .post(url)
                .json(&json!({"prompt": "[slowtok] a huge prompt", "max_tokens": 1}))
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    let started = Instant::now();
    let mut last = Instant::now();
    let mut worst = Duration::ZERO;
    while started.elapsed() < SLOW_TOKENIZE + Duration::from_millis(100) {
        let Some(chunk) = body.next().await else {
            break;
        };
        chunk.unwrap();
        worst = worst.max(last.elapsed());
        last = Instant::now();
    }
    assert_eq!(slow.await.unwrap(), 202);
    assert!(
        worst < SLOW_TOKENIZE / 2,
        "the stream stalled {worst:?} while a prompt was tokenized"
    );
}
