//! Streams that survive their readers (ORCH-SSE-4, ORCH-CAN-2): event ids, resuming with
//! `Last-Event-ID`, and a disconnect that cancels only when the task's last reader stayed away
//! for the grace period. The scripted engine paces the tokens; `browser_eventsource.rs` does
//! the same with a real browser.

mod support;

use std::time::Duration;

use futures::StreamExt;
use serde_json::json;
use support::*;

/// Reads `r` until `stop` says so (or the stream ends); returns the events and the raw text.
async fn read_until(
    r: reqwest::Response,
    mut stop: impl FnMut(&[Ev]) -> bool,
) -> (Vec<Ev>, String) {
    let mut body = r.bytes_stream();
    let mut buf = String::new();
    let mut raw = String::new();
    let mut events = Vec::new();
    while let Some(chunk) = body.next().await {
        let text = String::from_utf8(chunk.unwrap().to_vec()).unwrap();
        raw.push_str(&text);
        buf.push_str(&text);
        events.extend(parse_frames(&mut buf));
        if stop(&events) {
            break;
        }
    }
    (events, raw)
}

async fn open_after(s: &TestServer, id: &str, last: &str) -> reqwest::Response {
    s.client
        .get(s.url(&format!("/v1/tasks/{id}/stream")))
        .header("last-event-id", last)
        .send()
        .await
        .unwrap()
}

async fn state_of(s: &TestServer, id: &str) -> String {
    s.get_json(&format!("/v1/tasks/{id}")).await["state"]
        .as_str()
        .unwrap()
        .to_string()
}

fn tokens(events: &[Ev]) -> usize {
    events.iter().filter(|e| e.event == "token").count()
}

/// ORCH-SSE-4: every event has its id (its position: 0 is `started`), the stream opens with
/// `retry:`, and a reader cut off mid-stream that reconnects with `Last-Event-ID` gets the
/// rest: nothing repeated, nothing missing, and the task was not cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_resumes_after_the_last_event_seen() {
    let s = start(config(vec![pool("p1", 2)]), Duration::from_millis(20)).await;
    let id = s
        .submit_ok(json!({"prompt": "resume me", "max_tokens": 12}))
        .await;
    let (first, raw) = read_until(s.open_stream(&id).await, |ev| tokens(ev) >= 4).await;
    assert!(raw.starts_with("retry: 1000\n\n"), "{raw:?}");
    for (i, ev) in first.iter().enumerate() {
        assert_eq!(ev.id, Some(i), "ids are positions: {first:?}");
    }
    let last = first.last().unwrap().id.unwrap();
    // the reader is gone; come back at once with the last id seen
    let (rest, _) = read_until(open_after(&s, &id, &last.to_string()).await, |_| false).await;
    assert_eq!(rest.first().unwrap().id, Some(last + 1), "{rest:?}");
    let mut all = first.clone();
    all.extend(rest);
    assert_well_formed(&all);
    let transcript = s.record(&id).await["transcript"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(
        all.len(),
        transcript.len(),
        "nothing repeated, nothing missing"
    );
    for (ev, t) in all.iter().zip(&transcript) {
        assert_eq!(
            (ev.event.as_str(), &ev.data),
            (t["event"].as_str().unwrap(), &t["data"])
        );
    }
    assert_eq!(all.last().unwrap().event, "end");
    assert_eq!(all.last().unwrap().data["finish_reason"], "length");
    // the terminal event was seen: nothing more will come, and the answer says so
    let done = open_after(&s, &id, &all.last().unwrap().id.unwrap().to_string()).await;
    assert_eq!(done.status(), 204);
    // ids that are not event ids are refused by name; one this task never sent conflicts
    for (bad, status, code) in [
        ("abc", 400, "INVALID_PARAMS"),
        ("-1", 400, "INVALID_PARAMS"),
        ("9999", 409, "CONFLICT"),
    ] {
        let r = open_after(&s, &id, bad).await;
        assert_eq!(r.status(), status, "{bad}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["code"], code);
        assert_eq!(v["field"], "last-event-id");
    }
}

/// ORCH-CAN-2: a monitor that reads someone else's running task and leaves does not end it;
/// the owner's stream runs to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitor_leaving_does_not_cancel_the_owners_task() {
    let mut cfg = config(vec![pool("p1", 2)]);
    cfg.stream.disconnect_grace_ms = 0;
    let s = start(cfg, Duration::from_millis(10)).await;
    let id = s
        .submit_ok(json!({"prompt": "watched", "max_tokens": 30}))
        .await;
    let owner = s.open_stream(&id).await;
    let (seen, _) = read_until(s.open_stream(&id).await, |ev| tokens(ev) >= 2).await;
    assert!(tokens(&seen) >= 2);
    // the monitor's connection is closed now (its response was dropped)
    let (events, _) = read_until(owner, |_| false).await;
    assert_eq!(events.last().unwrap().event, "end", "{events:?}");
    assert_eq!(events.last().unwrap().data["finish_reason"], "length");
}

/// ORCH-CAN-2: when the last reader leaves, the task runs on for the grace period (a reader
/// may come back) and is cancelled once it passed with nobody back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_reader_gone_for_the_grace_period_cancels() {
    let mut cfg = config(vec![pool("p1", 2)]);
    cfg.stream.disconnect_grace_ms = 600;
    let s = start(cfg, Duration::from_millis(20)).await;
    let id = s
        .submit_ok(json!({"prompt": "[hang] abandoned", "max_tokens": 30}))
        .await;
    let (_, _) = read_until(s.open_stream(&id).await, |ev| !ev.is_empty()).await;
    let left = std::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        state_of(&s, &id).await,
        "running",
        "within the grace period"
    );
    let mut waited = 0;
    while state_of(&s, &id).await != "cancelled" && waited < 100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        waited += 1;
    }
    assert_eq!(state_of(&s, &id).await, "cancelled");
    assert!(
        left.elapsed() >= Duration::from_millis(600),
        "not before the grace period"
    );
    let m = s.metrics().await;
    assert_eq!(
        counter(&m, "orchd_tasks_cancelled_total{reason=\"disconnect\"}"),
        1.0
    );
}
