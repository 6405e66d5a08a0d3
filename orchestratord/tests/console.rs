//! FC-CON-1 (issue 37): the console at `/` in a real browser (headless Chromium over the
//! DevTools protocol) against a server on the real model: the page loads with no error of its
//! own, asks for a key, shows the default pool to an admin key, streams a chat, stops one, shows
//! a 429's advised wait and the recent tasks' outcomes, and hides the admin panels from a data
//! key; the chat keeps its conversation (and a system prompt), the model list starts with the
//! server's default, the pools table fits at 1280 px and the charts show the last minutes as
//! soon as the page opens (FC-CON-2, issue 49). A screenshot is kept in
//! `target/test-artifacts/console.png` for review.

mod support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use support::browser::Browser;
use support::*;

const ADMIN: &str = "console-admin-key-0123456789";
const DATA: &str = "console-data-key-0123456789";

/// Waits until `condition` (a JavaScript expression) is true in the page; returns what
/// `report` (another expression) says then, or panics with it.
async fn until(b: &mut Browser, condition: &str, report: &str, what: &str) -> Value {
    for _ in 0..600 {
        if b.eval(&format!("Promise.resolve({condition})")).await == json!(true) {
            return b.eval(&format!("Promise.resolve({report})")).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = b.eval(&format!("Promise.resolve({report})")).await;
    panic!("{what}: not seen in 60 s; the page shows {seen}");
}

async fn use_key(b: &mut Browser, key: &str) {
    b.eval(&format!(
        "Promise.resolve((() => {{ document.getElementById('key').value = '{key}'; document.getElementById('key-form').requestSubmit(); return true; }})())"
    ))
    .await;
}

async fn chat(b: &mut Browser, prompt: &str, max_tokens: u32) {
    b.eval(&format!(
        "Promise.resolve((() => {{ document.getElementById('prompt').value = {}; document.getElementById('max-tokens').value = '{max_tokens}'; document.getElementById('send').click(); return true; }})())",
        json!(prompt)
    ))
    .await;
}

const STATUS: &str = "document.getElementById('chat-status').textContent";
const ANSWER: &str = "document.getElementById('answer').textContent";
const CONVERSATION: &str = "document.getElementById('conversation').innerText";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_the_pools_streams_a_chat_stops_it_and_shows_a_refusal() {
    let mut cfg = config(vec![real_pool("default", 2, 1024)]);
    cfg.queue.capacity = 1;
    cfg.admission.max_queue_wait_ms = 600_000;
    cfg.timeouts.idle_ms = 60_000;
    cfg.auth.keys = vec![format!("ops:admin:{ADMIN}"), format!("web:data:{DATA}")];
    let s = Arc::new(start_with(cfg, Arc::new(pool_manager::candle::CandleFactory)).await);
    let mut b = Browser::launch().await;
    b.goto(&format!("{}/", s.base)).await;
    until(
        &mut b,
        "document.body.dataset.ready === 'true'",
        "document.body.innerText",
        "the page starting",
    )
    .await;
    let notice = b
        .eval("Promise.resolve(document.getElementById('notice').textContent)")
        .await;
    assert_eq!(notice, "This server needs an API key.");

    // an admin key: the pools panel shows the default pool, its slots and context
    use_key(&mut b, ADMIN).await;
    let row = until(
        &mut b,
        "document.querySelector('#pools tbody tr') !== null",
        "document.querySelector('#pools tbody tr').innerText",
        "the default pool",
    )
    .await;
    let row = row.as_str().unwrap().to_string();
    assert!(
        row.starts_with("default")
            && row.contains("ready")
            && row.contains("/2")
            && row.contains("1024"),
        "{row}"
    );

    // a chat streams to its end
    chat(&mut b, "What is the capital of France?", 24).await;
    let done = until(
        &mut b,
        &format!("{STATUS}.startsWith('Done:')"),
        STATUS,
        "the chat's end",
    )
    .await;
    // issue 52: the pools table shows each pool's cache hit rate (prompt tokens from cache)
    until(
        &mut b,
        "/\\d+ %$/.test(document.querySelector('#pools tbody tr').innerText.trim())",
        "document.querySelector('#pools tbody tr').innerText",
        "the pool's cache hit rate",
    )
    .await;
    // issue 49: the answer joins the conversation shown above the prompt; the model list
    // starts with the server's own choice
    let talk = b.eval(&format!("Promise.resolve({CONVERSATION})")).await;
    let talk = talk.as_str().unwrap().to_string();
    assert!(
        talk.starts_with("You: What is the capital of France?")
            && talk.contains("\nModel: ")
            && talk.len() > "You: What is the capital of France?\nModel: ".len(),
        "{done}: {talk}"
    );
    let model = b
        .eval("Promise.resolve([document.getElementById('model').options[0].value, document.getElementById('model').value])")
        .await;
    assert_eq!(model, json!(["", ""]));
    // the next turn sends the system prompt and the whole conversation
    b.eval(
        "Promise.resolve((() => { window.sent = []; const f = window.fetch; window.fetch = (u, o) => { if (o && o.method === 'POST' && String(u).endsWith('/v1/tasks')) window.sent.push(JSON.parse(o.body)); return f(u, o); }; document.getElementById('system').value = 'You tell stories.'; return true; })())",
    )
    .await;

    // a long one, stopped once it streams
    chat(
        &mut b,
        "Write a long story about a dragon named Ember who guards a library.",
        600,
    )
    .await;
    until(
        &mut b,
        &format!("{ANSWER}.length > 20"),
        ANSWER,
        "the long chat streaming",
    )
    .await;
    let roles = b
        .eval("Promise.resolve(window.sent[0].messages.map((m) => m.role))")
        .await;
    assert_eq!(roles, json!(["system", "user", "assistant", "user"]));
    b.eval("Promise.resolve((() => { document.getElementById('stop').click(); return true; })())")
        .await;
    let stopped = until(
        &mut b,
        &format!("{STATUS}.startsWith('Done:')"),
        STATUS,
        "the stop",
    )
    .await;
    assert!(stopped.as_str().unwrap().contains("cancelled"), "{stopped}");

    // the server full (2 slots busy, 1 queued): the console shows the refusal and its wait.
    // The stream ends on the page a moment before the stopped task gives back its slot, so
    // wait for both slots to be free before filling them.
    for _ in 0..200 {
        let busy = s
            .state
            .pools
            .get("default")
            .map(|p| p.snapshot().slots_busy);
        if s.state.queue.is_empty() && s.state.running.is_empty() && busy == Some(0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let client = reqwest::Client::new();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let r = client
            .post(s.url("/v1/tasks"))
            .bearer_auth(ADMIN)
            .json(&json!({"prompt": "Count from one to one thousand:", "max_tokens": 800}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202);
        ids.push(
            r.json::<Value>().await.unwrap()["task_id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    for _ in 0..100 {
        if s.state.queue.len() == 1 && s.state.running.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    chat(&mut b, "Hello", 8).await;
    let refused = until(
        &mut b,
        &format!("{STATUS}.startsWith('Refused')"),
        STATUS,
        "the 429",
    )
    .await;
    let refused = refused.as_str().unwrap().to_string();
    assert!(
        refused.contains("429") && refused.contains("come back in"),
        "{refused}"
    );
    // the queue panel counts the waiting task
    until(
        &mut b,
        "document.getElementById('queue-classes').textContent.startsWith('interactive 1')",
        "document.getElementById('queue-classes').textContent",
        "the queued task",
    )
    .await;
    // the recent tasks show the stopped chat's outcome (from its task record)
    until(
        &mut b,
        "document.getElementById('tasks').innerText.includes('cancelled')",
        "document.getElementById('tasks').innerText",
        "the recent tasks",
    )
    .await;
    b.call(
        "Emulation.setDeviceMetricsOverride",
        json!({"width": 1280, "height": 1500, "deviceScaleFactor": 1, "mobile": false}),
    )
    .await;
    let png = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(b.screenshot_base64().await)
            .expect("base64")
    };
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("console.png"), &png).unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    // issue 49: at 1280 px the pools table fits its panel (no scrollbar)
    let fits = b
        .eval("Promise.resolve((() => { const p = document.getElementById('pools-panel'); return [p.scrollWidth, p.clientWidth]; })())")
        .await;
    assert!(fits[0].as_u64() <= fits[1].as_u64(), "{fits}");
    // issue 49: opened again, the charts show the last minutes at once (the server's notes)
    b.goto(&format!("{}/", s.base)).await;
    let points = until(
        &mut b,
        "document.body.dataset.ready === 'true'",
        "(document.querySelector('#tps polyline')?.getAttribute('points') || '').split(' ').filter((p) => p).length",
        "the page opened again",
    )
    .await;
    assert!(points.as_u64().unwrap() >= 2, "{points}");
    for id in &ids {
        client
            .post(s.url(&format!("/v1/tasks/{id}/cancel")))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
    }

    // a data key: the admin panels are hidden, the chat stays
    use_key(&mut b, DATA).await;
    let hidden = until(
        &mut b,
        "document.getElementById('pools-panel').classList.contains('hidden')",
        "document.getElementById('who').textContent",
        "the admin panels hidden",
    )
    .await;
    assert_eq!(hidden, "data key");
    let errors = b.errors();
    assert!(errors.is_empty(), "the page reported errors: {errors:#?}");
}
