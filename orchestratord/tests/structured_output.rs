//! ADP-SO-1..3: structured output through the real default model (`ci/structured_output_check.py`):
//! 24 JSON Schemas through `response_format` (the official `openai` SDK), every answer
//! validated with the `jsonschema` package (100 %); Ollama's `format`, Anthropic's
//! `output_config.format`, `json_schema` / `grammar` on the task API; streamed answers; what
//! does not compile refused with a 400 naming the field. `ci/test.sh` installs the packages
//! into `.cache/pydeps`.

mod support;

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_schema_is_answered_with_json_that_validates() {
    let s = real_model_server(None).await;
    let stdout = run_sdk_script(
        "structured_output_check.py",
        &["--base-url".into(), s.url("").into()],
    )
    .await;
    assert!(stdout.contains("all structured output checks passed"));
}

/// A pool whose engine has no constrained decoding (here the scripted engine) refuses a schema
/// before the task queues, naming the field as each API spells it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_without_constrained_decoding_refuses_by_name() {
    let s = start(
        config(vec![pool("p1", 1)]),
        std::time::Duration::from_millis(1),
    )
    .await;
    let schema = serde_json::json!({"type": "object"});
    let r = s
        .client
        .post(s.url("/v1/tasks"))
        .json(&serde_json::json!({"prompt": "hi", "json_schema": schema}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["field"], "json_schema", "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("no constrained decoding"),
        "{v}"
    );
    let r = s
        .client
        .post(s.url("/api/chat"))
        .json(
            &serde_json::json!({"model": "scripted-model", "stream": false, "format": "json",
            "messages": [{"role": "user", "content": "hi"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert!(v["error"].as_str().unwrap().starts_with("format"), "{v}");
    // nothing was queued
    let metrics = s.metrics().await;
    let enqueued: f64 = metrics
        .lines()
        .filter(|l| l.starts_with(contracts::metric_names::TASKS_ENQUEUED))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(enqueued, 0.0, "{metrics}");
}
