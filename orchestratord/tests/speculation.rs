//! ENG-SPEC-3: speculation through the server — a pool's `draft_tokens` setting, a request's
//! `draft_tokens` (task API, OpenAI) or llama-server's `speculative.n_max` turn it on or off;
//! the answer is the one plain decoding gives; `/metrics` counts the guesses and those kept;
//! an out-of-range value is a typed 400 naming the field, and a pool's is a config error.

mod support;

use serde_json::json;
use support::*;

const REWRITE: &str = "Repeat the following text exactly, word for word, and nothing else:\n\
    The old lighthouse keeper climbed the spiral stairs every evening at dusk, lit the great \
    lamp, and watched the ships pass safely through the narrow channel between the rocks.";

async fn chat(s: &TestServer, draft: Option<u32>) -> String {
    let mut body = json!({
        "messages": [{"role": "user", "content": REWRITE}],
        "max_tokens": 48,
        "temperature": 0,
    });
    if let Some(n) = draft {
        body["draft_tokens"] = json!(n);
    }
    let r = s.post("/v1/chat/completions", &body).await;
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.expect("json");
    v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guesses_change_how_fast_not_what_and_are_counted() {
    let s = real_model_server(None).await;
    let guessed = |m: &str| counter(m, "orchd_pool_guessed_tokens_total{pool=\"default\"}");
    let kept = |m: &str| counter(m, "orchd_pool_guessed_tokens_kept_total{pool=\"default\"}");

    let plain = chat(&s, None).await;
    let m = s.metrics().await;
    assert_eq!(guessed(&m), 0.0, "the pool's setting is off: no guesses");
    let with = chat(&s, Some(6)).await;
    assert_eq!(with, plain, "the same answer with guesses");
    assert!(plain.contains("lighthouse keeper"), "{plain}");
    let m = s.metrics().await;
    let (g, k) = (guessed(&m), kept(&m));
    assert!(g > 0.0 && k > 0.0 && k <= g, "guessed {g}, kept {k}");

    // llama-server's field
    let completion = |n: Option<u32>| {
        let mut body = json!({"prompt": "1, 2, 3, 4, 1, 2, 3, 4, 1, 2,", "n_predict": 12,
                              "temperature": 0});
        if let Some(n) = n {
            body["speculative.n_max"] = json!(n);
        }
        body
    };
    let r = s.post("/completion", &completion(None)).await;
    let off: serde_json::Value = r.json().await.expect("json");
    let r = s.post("/completion", &completion(Some(4))).await;
    let on: serde_json::Value = r.json().await.expect("json");
    assert_eq!(on["content"], off["content"]);
    assert!(guessed(&s.metrics().await) > g, "speculative.n_max guessed");

    // out of range: the field and its bounds
    let r = s
        .submit(json!({"prompt": "Hi", "max_tokens": 4, "draft_tokens": 17}))
        .await;
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.expect("json");
    let text = v.to_string();
    assert!(
        text.contains("draft_tokens") && text.contains("16"),
        "{text}"
    );
}

#[test]
fn a_pools_draft_tokens_beyond_the_limit_is_a_config_error() {
    let mut p = real_pool("default", 1, 512);
    p.draft_tokens = 17;
    let err = config(vec![p]).validate().expect_err("refused");
    assert!(err.to_string().contains("draft_tokens"), "{err}");
    let mut ok = real_pool("default", 1, 512);
    ok.draft_tokens = 16;
    config(vec![ok]).validate().expect("16 is allowed");
}
