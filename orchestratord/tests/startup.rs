//! FC-START-1, FC-VER-1, FC-SEED-1 (issue 37). The server answers from its first second while its pools load
//! behind it — `/livez` 200, `/readyz` 503 `loading` with each pool's progress — and a task
//! sent meanwhile is admitted with the load in its predicted start and answered once the pool
//! serves; a task pinned to the loading pool is told when to come back; a context cut to fit
//! the key/value budget is said at start (FC-CTX-1). A real process on the real model, with
//! 32 slots (the self-test of every slot makes the load take seconds).

mod support;

use serde_json::{json, Value};
use support::default_model_path;
use support::procs::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_answers_while_its_pools_load() {
    // no ctx: the key/value budget decides it, which the log says (FC-CTX-1)
    let cfg = format!(
        "[[pools]]\nid = \"p\"\nmodel = \"{}\"\nslots = 32\nthreads = 1\n",
        default_model_path()
    );
    let (p, base) = server_env_answering(&cfg, &[]).await;
    let client = reqwest::Client::new();
    let live = client.get(format!("{base}/livez")).send().await.unwrap();
    assert_eq!(live.status(), 200);
    let r = client.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 503, "{}", p.log_text());
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["status"], "loading", "{v}");
    assert_eq!(v["pool_states"][0]["pool_id"], "p");
    assert_eq!(v["pool_states"][0]["state"], "loading");
    assert!(v["pool_states"][0]["loading_ms"].is_u64(), "{v}");
    assert!(v["pool_states"][0]["predicted_load_ms"].as_u64().unwrap() >= 1);

    // a task for its model is admitted and waits for the load
    let r = client
        .post(format!("{base}/v1/tasks"))
        .json(&json!({"prompt": "The capital of France is", "max_tokens": 4}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202, "{:?}", r.text().await);
    let admitted: Value = r.json().await.unwrap();
    assert!(
        admitted["predicted_start_ms"].as_u64().unwrap() >= 1,
        "the load is in the prediction: {admitted}"
    );
    // one pinned to the loading pool is told when to come back
    let r = client
        .post(format!("{base}/v1/tasks"))
        .json(&json!({"prompt": "Hi", "max_tokens": 4, "pool_id": "p"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["code"], "POOL_UNREADY");

    let id = admitted["task_id"].as_str().unwrap();
    let stream = client
        .get(format!("{base}/v1/tasks/{id}/stream"))
        .send()
        .await
        .unwrap();
    let events = support::read_events(stream).await;
    let (last, _) = events.last().unwrap();
    assert_eq!(last.event, "end", "{events:?}");
    assert!(events.iter().any(|(e, _)| e.event == "token"));

    let r = client.get(format!("{base}/readyz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["status"], "ready", "{v}");
    let log = p.log_text();
    assert!(
        log.contains("32 slots of ")
            && log.contains("does not hold the model's trained context of 8192"),
        "{log}"
    );
}

/// FC-VER-1: one version everywhere — the binary's `--version`, `/health`, Ollama's
/// `/api/version`, the capabilities' `api_version`, the OpenAPI document's `info.version` and
/// the OpenAI `system_fingerprint`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_version_everywhere() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_orchestratord"))
        .arg("--version")
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let version = printed
        .strip_prefix("orchestratord ")
        .unwrap_or_else(|| panic!("{printed}"))
        .to_string();
    let cfg = format!(
        "[[pools]]\nid = \"p\"\nmodel = \"{}\"\nslots = 1\nctx = 256\nthreads = 1\n",
        default_model_path()
    );
    let (_p, base) = server_env(&cfg, &[]).await;
    let client = reqwest::Client::new();
    let get = |path: &'static str| {
        let url = format!("{base}{path}");
        async move { get_json(&url).await }
    };
    assert_eq!(get("/health").await["version"], version.as_str());
    assert_eq!(get("/api/version").await["version"], version.as_str());
    assert_eq!(
        get("/v1/capabilities").await["api_version"],
        version.as_str()
    );
    assert_eq!(
        get("/openapi.json").await["info"]["version"],
        version.as_str()
    );
    let chat = post_json(
        &format!("{base}/v1/chat/completions"),
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}),
    )
    .await;
    assert_eq!(
        chat["system_fingerprint"],
        format!("orchestratord-{version}").as_str()
    );
    // FC-SEED-1: seeds the server picks are exact in JavaScript
    for _ in 0..8 {
        let r = post_json(
            &format!("{base}/v1/tasks"),
            &json!({"prompt": "Hi", "max_tokens": 1}),
        )
        .await;
        let id = r["task_id"].as_str().unwrap();
        let stream = client
            .get(format!("{base}/v1/tasks/{id}/stream"))
            .send()
            .await
            .unwrap();
        support::read_events(stream).await;
        let record = get_json(&format!("{base}/v1/tasks/{id}")).await;
        let seed = record["record"]["seed"]
            .as_u64()
            .unwrap_or_else(|| panic!("{record}"));
        assert!(seed < 1 << 53, "{seed}");
    }
}

/// FC-MODEL-1: with no model configured, a server started outside the repository's root (the
/// tests run in the crate's folder) finds the default model above its binary and serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_model_is_found_from_any_folder() {
    assert!(
        !std::path::Path::new(orchestratord::config::DEFAULT_MODEL_PATH).exists(),
        "this test runs where the cache is not"
    );
    let (p, base) = server_env("", &[]).await;
    let v = get_json(&format!("{base}/readyz")).await;
    assert_eq!(v["status"], "ready", "{v} {}", p.log_text());
}
