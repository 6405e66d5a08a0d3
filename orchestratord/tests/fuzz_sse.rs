//! Fuzzing (proptest) of the SSE writer (REL-FUZZ-1): a task whose tokens are arbitrary text
//! (newlines, CRs, `data:` look-alikes, NULs, any Unicode) is written by `lifecycle/sse.rs` and
//! parsed back as a browser would: every event once, in order, with its id, and the text
//! exactly as produced. `PROPTEST_CASES` sets the number of cases.

mod support;

use std::sync::Arc;
use std::time::Duration;

use contracts::{Priority, SseStarted};
use orchestratord::lifecycle::sse;
use orchestratord::lifecycle::subscription::{Resume, Subscription};
use orchestratord::lifecycle::task::{NewTask, RunSpec, Task};
use pool_manager::PromptInput;
use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestCaseError, TestRunner};
use serde_json::Value;
use support::*;

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200)
}

fn task(id: usize) -> Arc<Task> {
    Arc::new(Task::new(NewTask {
        id: format!("fz-{id}"),
        owner: "local".into(),
        correlation_id: String::new(),
        priority: Priority::Interactive,
        session_id: None,
        pin: None,
        model: None,
        spec: RunSpec {
            prompt: PromptInput::Text("x".into()),
            continuation: String::new(),
            sampling: Default::default(),
            max_tokens: 64,
            stop: Vec::new(),
            constraint: None,
            logprobs: None,
            embed: None,
        },
        prompt_tokens: 1,
        prompt_ids: None,
        conversation: None,
        embed_ids: None,
        params: Value::Null,
        ctx: 256,
        deadline: None,
        start_by: None,
        start_by_servers: false,
        rank: None,
        predicted_start: std::time::Duration::ZERO,
        last_attempt: false,
        claimant: None,
        quota_ticket: None,
        admitted_ago: std::time::Duration::ZERO,
    }))
}

/// Parses an SSE body the way the spec's parser does: fields per line, a blank line ends an
/// event, `retry:` and comments are not events.
fn parse(body: &str) -> Vec<(Option<String>, String, String)> {
    let mut out = Vec::new();
    let (mut id, mut event, mut data) = (None, String::new(), Vec::<String>::new());
    for line in body.split('\n') {
        if line.is_empty() {
            if !data.is_empty() {
                out.push((id.take(), std::mem::take(&mut event), data.join("\n")));
            }
            data.clear();
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "id" => id = Some(value.to_string()),
            "event" => event = value.to_string(),
            "data" => data.push(value.to_string()),
            _ => {}
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_token_text_survives_the_sse_writer() {
    let s = start(config(vec![pool("p1", 1)]), Duration::ZERO).await;
    let state = s.state.clone();
    let handle = tokio::runtime::Handle::current();
    let mut runner = TestRunner::new(RunnerConfig {
        cases: cases(),
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let n = std::sync::atomic::AtomicUsize::new(0);
    let strategy = prop::collection::vec(
        prop_oneof![
            any::<String>(),
            prop::sample::select(vec![
                "\n",
                "\r\n",
                "\r",
                "data: x",
                "\n\nevent: end\n",
                "\u{0}",
                "id: 9"
            ])
            .prop_map(str::to_string),
        ],
        0..12,
    );
    let result = tokio::task::block_in_place(|| {
        runner.run(&strategy, |texts| {
            let t = task(n.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
            t.push_started(SseStarted {
                tenant_queue_share: None,
                queue_position: 0,
                predicted_start_ms: 0,
                prediction: Default::default(),
            });
            for text in &texts {
                t.push_token(text.clone());
            }
            t.finish("length", None);
            let sub = Subscription::new(&state.lifecycle, t, 0, Resume::Never);
            let body = handle.block_on(async {
                axum::body::to_bytes(sse::response(sub, 0).into_body(), usize::MAX).await
            });
            let body = body.map_err(|e| TestCaseError::fail(e.to_string()))?;
            let events = parse(&String::from_utf8_lossy(&body));
            prop_assert_eq!(events.len(), texts.len() + 2, "started, tokens, end");
            for (i, (id, _, _)) in events.iter().enumerate() {
                let want = i.to_string();
                prop_assert_eq!(id.as_deref(), Some(want.as_str()));
            }
            for (text, (_, event, data)) in texts.iter().zip(&events[1..]) {
                prop_assert_eq!(event.as_str(), "token");
                let v: Value =
                    serde_json::from_str(data).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(v["t"].as_str(), Some(text.as_str()));
            }
            prop_assert_eq!(events.last().map(|e| e.1.as_str()), Some("end"));
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
