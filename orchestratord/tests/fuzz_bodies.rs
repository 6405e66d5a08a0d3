//! Fuzzing (proptest) of what clients send: the JSON bodies of every adapter (task API, OpenAI
//! chat and completions, seed-001 chat and SSE, Kolosal `POST /engines`) — valid bodies with
//! fields replaced by random JSON, random JSON, and random bytes — over a real socket to the
//! server on the scripted engine; and Hyperswarm lines into the protocol parser. Never a 5xx
//! (but a retriable 503), every refusal a JSON error with a code, every accepted stream runs to
//! its end, and the server still serves afterwards. `PROPTEST_CASES` sets the number of cases
//! (CI: the default below; `ci/fuzz.sh` runs many more).

mod support;

use std::time::Duration;

use orchestratord::adapters::hyperswarm::protocol;
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestCaseError, TestRunner};
use serde_json::{json, Value};
use support::*;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(150)
}

fn runner() -> TestRunner {
    TestRunner::new(RunnerConfig {
        cases: cases(),
        failure_persistence: None,
        ..RunnerConfig::default()
    })
}

/// Any JSON value, nested a few levels.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        prop::sample::select(vec![0i64, -1, 1, 2, 1024, 1 << 20, i64::MAX]).prop_map(Value::from),
        any::<String>().prop_map(Value::from),
        prop::sample::select(vec![
            "",
            "user",
            "system",
            "assistant",
            "tool",
            "scripted-model",
            "p1"
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(any::<String>(), inner.clone(), 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            prop::collection::btree_map(
                prop::sample::select(vec!["role", "content", "model", "prompt", "max_tokens"])
                    .prop_map(str::to_string),
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Each endpoint with a body it accepts and the fields its requests have.
fn endpoints() -> Vec<(&'static str, Value, Vec<&'static str>)> {
    let chat = json!({"model": "scripted-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3});
    vec![
        (
            "/v1/tasks",
            json!({"prompt": "hi", "max_tokens": 3}),
            vec![
                "prompt",
                "messages",
                "max_tokens",
                "temperature",
                "top_p",
                "top_k",
                "min_p",
                "seed",
                "stop",
                "priority",
                "pool_id",
                "model",
                "session_id",
                "task_id",
                "deadline_ms",
                "repetition_penalty",
                "presence_penalty",
                "frequency_penalty",
                "continue_final_message",
            ],
        ),
        (
            "/v1/chat/completions",
            chat.clone(),
            vec![
                "model",
                "messages",
                "max_tokens",
                "max_completion_tokens",
                "stream",
                "stream_options",
                "temperature",
                "top_p",
                "top_k",
                "seed",
                "stop",
                "n",
                "tools",
                "response_format",
                "logprobs",
                "user",
                "continue_final_message",
                "add_generation_prompt",
            ],
        ),
        (
            "/v1/completions",
            json!({"model": "scripted-model", "prompt": "hi", "max_tokens": 3}),
            vec![
                "model",
                "prompt",
                "max_tokens",
                "stream",
                "temperature",
                "top_p",
                "seed",
                "stop",
                "echo",
                "suffix",
                "n",
                "best_of",
                "logprobs",
            ],
        ),
        (
            "/chat/completions",
            chat.clone(),
            vec![
                "model",
                "messages",
                "stream",
                "temperature",
                "top_p",
                "max_tokens",
                "seed",
                "stop",
            ],
        ),
        (
            "/chat/sse",
            chat,
            vec!["model", "messages", "temperature", "max_tokens", "stop"],
        ),
        (
            "/engines",
            json!({"engine_id": "fz", "model_path": "/no/such/file.gguf"}),
            vec![
                "engine_id",
                "model_path",
                "n_ctx",
                "n_gpu_layers",
                "main_gpu_id",
            ],
        ),
    ]
}

/// What one fuzz case sends.
#[derive(Debug, Clone)]
enum Body {
    Json(Value),
    Bytes(Vec<u8>),
}

fn bodies(valid: Value, fields: Vec<&'static str>) -> impl Strategy<Value = Body> {
    let field = prop_oneof![
        prop::sample::select(fields).prop_map(str::to_string),
        any::<String>(),
    ];
    let edits = prop::collection::vec((field, prop::option::of(any_json())), 1..4);
    prop_oneof![
        6 => edits.prop_map(move |edits| {
            let mut v = valid.clone();
            for (k, val) in edits {
                match val {
                    Some(x) => v[k.as_str()] = x,
                    None => {
                        if let Some(o) = v.as_object_mut() {
                            o.remove(&k);
                        }
                    }
                }
            }
            Body::Json(v)
        }),
        2 => any_json().prop_map(Body::Json),
        1 => prop::collection::vec(any::<u8>(), 0..256).prop_map(Body::Bytes),
    ]
}

async fn send(s: &TestServer, path: &str, body: &Body) -> Result<(), TestCaseError> {
    let req = s
        .client
        .post(s.url(path))
        .header("content-type", "application/json");
    let req = match body {
        Body::Json(v) => req.body(v.to_string()),
        Body::Bytes(b) => req.body(b.clone()),
    };
    let r = req
        .send()
        .await
        .map_err(|e| TestCaseError::fail(format!("{path}: no answer: {e}")))?;
    let status = r.status().as_u16();
    let bytes = tokio::time::timeout(Duration::from_secs(30), r.bytes())
        .await
        .map_err(|_| TestCaseError::fail(format!("{path}: the answer never ended")))?
        .map_err(|e| TestCaseError::fail(format!("{path}: answer broke: {e}")))?;
    let text = String::from_utf8_lossy(&bytes);
    if status >= 500 {
        let v: Value = serde_json::from_slice(&bytes).unwrap_or_default();
        let retriable = v["retriable"] == true || v["error"]["code"] == "POOL_UNAVAILABLE";
        prop_assert!(
            status == 503 && retriable,
            "{path} answered {status}: {text}"
        );
    }
    if (400..500).contains(&status) {
        let v: Value = serde_json::from_slice(&bytes)
            .map_err(|_| TestCaseError::fail(format!("{path} {status}: not JSON: {text}")))?;
        let code = v["code"].as_str().or_else(|| v["error"]["code"].as_str());
        prop_assert!(
            code.is_some_and(|c| !c.is_empty()),
            "{path} {status} without a code: {v}"
        );
    }
    Ok(())
}

/// ORCH-ADM-1, ADP-OAI-4, ADP-SEED-3, ADP-KOL-1: no body makes the server fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapter_bodies_never_make_the_server_fail() {
    let mut cfg = config(vec![pool("p1", 4)]);
    cfg.queue.capacity = 64;
    let s = start(cfg, Duration::ZERO).await;
    let handle = tokio::runtime::Handle::current();
    for (path, valid, fields) in endpoints() {
        let mut runner = runner();
        let outcome = tokio::task::block_in_place(|| {
            runner.run(&bodies(valid, fields), |body| {
                handle.block_on(send(&s, path, &body))
            })
        });
        if let Err(e) = outcome {
            panic!("{path}: {e}");
        }
    }
    // the server still serves
    let id = s
        .submit_ok(json!({"prompt": "after the fuzz", "max_tokens": 3}))
        .await;
    assert_eq!(s.stream_all(&id).await.last().unwrap().event, "end");
}

/// HS-PROTO-2: any line is a message or a refusal, never a panic; what the host writes back is
/// always one line of JSON, whatever text it carries.
#[test]
fn hyperswarm_lines_parse_or_are_refused() {
    let line = prop_oneof![
        any::<String>(),
        any_json().prop_map(|v| v.to_string()),
        (any_json(), any_json(), any::<String>()).prop_map(|(id, payload, kind)| {
            let kind = if kind.len() % 3 == 0 {
                "chat_start".to_string()
            } else {
                kind
            };
            json!({"type": kind, "request_id": id, "payload": payload}).to_string()
        }),
    ];
    runner()
        .run(&(line, any::<String>()), |(line, text)| {
            let _ = protocol::parse(&line, 4096);
            let Ok(protocol::Incoming::Abort(id)) =
                protocol::parse(r#"{"type":"abort","request_id":"r","payload":{}}"#, 16)
            else {
                return Err(TestCaseError::fail("an abort line did not parse"));
            };
            for out in [
                protocol::Outgoing::chunk(&id, &text),
                protocol::Outgoing::error(&protocol::PeerCode::BadMessage, &text, Some(&id)),
            ] {
                let bytes = out.encode();
                prop_assert_eq!(bytes.iter().filter(|&&b| b == b'\n').count(), 1);
                let v: Value = serde_json::from_slice(&bytes)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert!(v.is_object());
            }
            Ok(())
        })
        .unwrap();
}
