//! CACHE-API-1: what the cache held, per request, in every API's own field, read by the
//! official clients on the real default model (`ci/cached_tokens_check.py`: openai's chat,
//! completions and Responses `cached_tokens`, anthropic's `cache_read_input_tokens`,
//! llama-server's `timings.cache_n`). CACHE-API-2:
//! the task API's `end` event says it too, and `/metrics` counts each pool's prompt tokens
//! and the cached part of them (its hit rate).

mod support;

use serde_json::json;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_api_says_what_the_cache_held() {
    let s = real_model_server(None).await;
    let stdout = run_sdk_script(
        "cached_tokens_check.py",
        &["--base-url".into(), s.url("").into()],
    )
    .await;
    assert!(
        stdout.contains("all cached-token checks passed"),
        "{stdout}"
    );

    // the task API: the same prompt twice, the second time from the cache but its last token
    let prompt = "A list of rivers of Europe, longest first: the Volga, the Danube, the Ural,";
    let mut cached = Vec::new();
    for _ in 0..2 {
        let id = s
            .submit_ok(json!({"prompt": prompt, "max_tokens": 4, "temperature": 0}))
            .await;
        let events = s.stream_all(&id).await;
        let end = events.iter().find(|e| e.event == "end").expect("an end");
        cached.push(end.data["cached_tokens"].as_u64().expect("cached_tokens"));
    }
    assert!(cached[0] < 10, "a new prompt: {cached:?}");
    assert!(cached[1] >= 15, "the same prompt again: {cached:?}");

    let m = s.metrics().await;
    let all = counter(&m, "orchd_pool_prompt_tokens_total{pool=\"default\"}");
    let hit = counter(
        &m,
        "orchd_pool_prompt_tokens_cached_total{pool=\"default\"}",
    );
    assert!(
        hit > 0.0 && hit < all,
        "cached {hit} of {all} prompt tokens"
    );
}
