//! The whole path with the real default model (candle engine): HTTP → admission (real
//! tokenizer) → queue → pool → continuous batching → SSE.

mod support;

use std::sync::Arc;

use serde_json::json;
use support::*;

async fn real_server() -> TestServer {
    let mut cfg = config(vec![real_pool("default", 4, 1024)]);
    cfg.timeouts.idle_ms = 30_000;
    start_with(cfg, Arc::new(pool_manager::candle::CandleFactory)).await
}

fn text_of(events: &[Ev]) -> String {
    events
        .iter()
        .filter(|e| e.event == "token")
        .map(|e| e.data["t"].as_str().unwrap().to_string())
        .collect()
}

/// ORCH-REAL-1: a chat question answered by the real model, streamed over SSE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_model_answers_over_sse() {
    let s = real_server().await;
    let caps: serde_json::Value = s.get_json("/v1/capabilities").await;
    assert_eq!(caps["pools"][0]["engine"], "candle");
    assert_eq!(caps["pools"][0]["ctx_max"], 1024);
    let id = s
        .submit_ok(json!({
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is the capital of France?"}
            ],
            "max_tokens": 32
        }))
        .await;
    let ev = s.stream_all(&id).await;
    assert_well_formed(&ev);
    let text = text_of(&ev);
    assert!(text.contains("Paris"), "answer: {text:?}");
    let end = ev.last().unwrap();
    assert_eq!(end.data["finish_reason"], "stop");
    let rec = s.record(&id).await;
    assert!(rec["prompt_tokens"].as_u64().unwrap() > 10);
    assert_eq!(rec["engine"], "candle");
    // the same seed and params give the same text
    let sampled = |seed: u64| json!({"prompt": "The ocean is", "max_tokens": 16, "temperature": 0.9, "seed": seed});
    let a = s.submit_ok(sampled(5)).await;
    let b = s.submit_ok(sampled(5)).await;
    let (ea, eb) = (s.stream_all(&a).await, s.stream_all(&b).await);
    assert_eq!(text_of(&ea), text_of(&eb));
    assert!(!text_of(&ea).is_empty());
    // ENG-BATCH-4: run again now that a slot holds this prompt: the prefix comes from the
    // cache (counted in health and metrics) and the text is the same
    let before = s.get_json("/v1/pools/default/health").await["metrics"]["prompt_tokens_reused"]
        .as_u64()
        .unwrap();
    let c = s.submit_ok(sampled(5)).await;
    assert_eq!(text_of(&s.stream_all(&c).await), text_of(&ea));
    let after = s.get_json("/v1/pools/default/health").await["metrics"]["prompt_tokens_reused"]
        .as_u64()
        .unwrap();
    assert!(after > before, "reused {before} -> {after}");
    assert!(s
        .metrics()
        .await
        .contains("orchd_pool_prompt_tokens_reused_total{pool=\"default\"}"));
    assert!(s
        .metrics()
        .await
        .contains("orchd_pool_prompt_cache_bytes{pool=\"default\"}"));
}

/// ORCH-ADM-TOK-1 (issue 50): a raw prompt given as token ids (`prompt_tokens`, text pieces
/// allowed among them) runs those ids: the same answer as its text, exact counts; an id
/// outside the vocabulary, an empty list, and two prompts at once are 400s naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_of_token_ids_runs_those_ids() {
    let s = real_server().await;
    let tok = s
        .post("/tokenize", &json!({"content": "The capital of France is"}))
        .await
        .json::<serde_json::Value>()
        .await
        .unwrap();
    let ids = tok["tokens"].clone();
    let n = ids.as_array().unwrap().len();
    let greedy = |prompt: serde_json::Value| {
        let mut body = json!({"max_tokens": 8, "temperature": 0});
        body.as_object_mut()
            .unwrap()
            .extend(prompt.as_object().unwrap().clone());
        body
    };
    let by_text = s
        .submit_ok(greedy(json!({"prompt": "The capital of France is"})))
        .await;
    let by_ids = s.submit_ok(greedy(json!({"prompt_tokens": ids}))).await;
    let (et, ei) = (s.stream_all(&by_text).await, s.stream_all(&by_ids).await);
    assert_eq!(text_of(&ei), text_of(&et));
    assert!(!text_of(&ei).is_empty());
    let rec = s.record(&by_ids).await;
    assert_eq!(rec["prompt_tokens"], n, "{rec}");
    // the record keeps no prompt: the ids are redacted as text is
    assert!(!rec.to_string().contains(&ids.to_string()), "{rec}");
    for (body, field) in [
        (json!({"prompt_tokens": [1, 99_999_999]}), "prompt_tokens"),
        (json!({"prompt_tokens": []}), "prompt_tokens"),
        (
            json!({"prompt_tokens": [1], "prompt": "x"}),
            "prompt_tokens",
        ),
        (json!({"prompt_tokens": [1.5]}), "prompt_tokens"),
    ] {
        let r = s.submit(body.clone()).await;
        assert_eq!(r.status(), 400, "{body}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert!(
            v["field"].as_str().unwrap_or("").starts_with(field)
                || v["message"].as_str().unwrap_or("").contains(field),
            "{body}: {v}"
        );
    }
}

/// ORCH-REAL-2: cancel mid-generation on the real engine; the slot comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_model_cancel_mid_generation() {
    use futures::StreamExt;
    let s = real_server().await;
    let id = s
        .submit_ok(
            json!({"prompt": "Count from one to one thousand: one, two,", "max_tokens": 500}),
        )
        .await;
    let r = s.open_stream(&id).await;
    let mut body = r.bytes_stream();
    let mut buf = String::new();
    let mut events = Vec::new();
    let mut cancelled = false;
    while let Some(c) = body.next().await {
        buf.push_str(std::str::from_utf8(&c.unwrap()).unwrap());
        events.extend(parse_frames(&mut buf));
        if !cancelled && events.iter().filter(|e| e.event == "token").count() >= 3 {
            assert_eq!(s.cancel(&id).await, 204);
            cancelled = true;
        }
    }
    assert_well_formed(&events);
    let end = events.last().unwrap();
    assert_eq!(end.data["finish_reason"], "cancelled");
    assert!(end.data["tokens_out"].as_u64().unwrap() < 500);
    // the prompt is counted by the real tokenizer: 1000 tokens of prompt + 100 > ctx 1024
    let long = "word ".repeat(1000);
    let r = s.submit(json!({"prompt": long, "max_tokens": 100})).await;
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["field"], "max_tokens");
    // all 4 slots free again: 4 tasks run at once
    let ids: Vec<String> = futures::future::join_all(
        (0..4).map(|_| s.submit_ok(json!({"prompt": "Hello", "max_tokens": 4}))),
    )
    .await;
    for id in ids {
        assert_eq!(s.stream_all(&id).await.last().unwrap().event, "end");
    }
    // a runner gives its lease back just after the terminal event went out
    let mut h = serde_json::Value::Null;
    for _ in 0..50 {
        h = s.get_json("/v1/pools/default/health").await;
        if h["slots_free"] == 4 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(h["slots_free"], 4, "{h}");
    assert_eq!(h["ready"], true);
}

/// ADP-OAI-4 (`continue_final_message`), real model: without a final assistant turn the
/// assistant turn to continue is empty, so the answer is the one a plain chat gets; a lone
/// assistant turn is continued as raw text, as the same prompt is; an empty one is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn continue_final_message_without_an_assistant_turn() {
    let s = real_server().await;
    let greedy = |body: serde_json::Value| {
        let s = &s;
        async move {
            let id = s.submit_ok(body).await;
            let ev = s.stream_all(&id).await;
            assert_well_formed(&ev);
            text_of(&ev)
        }
    };
    let user = json!([{"role": "user", "content": "Name a colour."}]);
    let plain = greedy(json!({"messages": user, "max_tokens": 8})).await;
    let continued =
        greedy(json!({"messages": user, "max_tokens": 8, "continue_final_message": true})).await;
    assert!(!plain.is_empty());
    assert_eq!(continued, plain);

    let lone = json!([{"role": "assistant", "content": "The capital of France is"}]);
    let as_text =
        greedy(json!({"messages": lone, "max_tokens": 6, "continue_final_message": true})).await;
    let raw = greedy(json!({"prompt": "The capital of France is", "max_tokens": 6})).await;
    assert_eq!(as_text, raw);

    let empty = json!([{"role": "assistant", "content": ""}]);
    let r = s
        .submit(json!({"messages": empty, "continue_final_message": true}))
        .await;
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["field"], "messages");
}

/// ORCH-TMO-2: the wait for the first token counts the prompt — a long prompt whose prefill
/// takes longer than `timeouts.idle_ms` is answered, not ended as a stuck engine
/// (`DECODE_TIMEOUT`); between tokens the idle limit is unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_prompt_is_not_taken_for_a_stuck_engine() {
    let mut cfg = config(vec![real_pool("default", 2, 2048)]);
    cfg.timeouts.idle_ms = 1_000;
    let s = start_with(cfg, Arc::new(pool_manager::candle::CandleFactory)).await;
    // ~1,400 tokens: several seconds of prefill on two cores, far beyond the idle limit
    let long = "The keeper lit the lamp every evening at dusk. ".repeat(120);
    let t0 = std::time::Instant::now();
    let id = s
        .submit_ok(json!({"prompt": format!("{long}\nWhat did the keeper do?"), "max_tokens": 4}))
        .await;
    let events = s.stream_all(&id).await;
    let took = t0.elapsed();
    assert_well_formed(&events);
    let end = events.last().unwrap();
    assert_eq!(end.event, "end", "{end:?} after {took:?}");
    assert!(
        took > std::time::Duration::from_millis(1_000),
        "the prompt took {took:?}: not longer than the idle limit, the test proves nothing"
    );
}

/// ENG-CTX-1, ORCH-ADM-1: the default pool config leaves the context to the model: SmolLM2's
/// trained 8192 tokens per slot (4 slots fit the default 2 GiB of key/value cache), and
/// admission checks against that limit, not the old 2048.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_context_is_the_trained_one_and_admission_knows_it() {
    let mut p = real_pool("default", 4, 0);
    p.kv_cache_mib = orchestratord::config::Config::default().pools[0].kv_cache_mib;
    assert_eq!(
        orchestratord::config::Config::default().pools[0].ctx,
        0,
        "the default config leaves the context to the model"
    );
    let mut cfg = config(vec![p]);
    cfg.timeouts.idle_ms = 30_000;
    let s = start_with(cfg, Arc::new(pool_manager::candle::CandleFactory)).await;
    let caps: serde_json::Value = s.get_json("/v1/capabilities").await;
    assert_eq!(caps["pools"][0]["ctx_max"], 8192);
    // ~2,700 prompt tokens + 16: over the old 2048, within 8192
    let words = "the sea is wide and ".repeat(540);
    let id = s
        .submit_ok(json!({"prompt": words, "max_tokens": 16}))
        .await;
    let rec = s.record(&id).await;
    assert!(rec["prompt_tokens"].as_u64().unwrap() > 2048, "{rec}");
    assert_eq!(s.cancel(&id).await, 204);
    // over 8192: refused at admission, naming the real limit
    let r = s
        .submit(json!({"prompt": "the sea is wide and ".repeat(1700), "max_tokens": 16}))
        .await;
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(
        v["message"].as_str().unwrap().contains("context of 8192"),
        "{v}"
    );
}
