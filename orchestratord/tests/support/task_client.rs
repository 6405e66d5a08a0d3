//! A client of the task API for the tests that run the same scenarios on one box and on
//! replicas: submit, follow a stream (resuming after an event id), and what a whole stream
//! looks like.

use futures::StreamExt;
use serde_json::Value;

use super::Ev;

/// A prompt the model continues with "6, 7, 8, …" (greedy).
pub const COUNT: &str = "Count from 1 to 1000: 1, 2, 3, 4, 5,";

pub async fn submit(base: &str, body: Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}/v1/tasks"))
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// Submits and expects the task admitted. A replica whose NATS cluster could not place the
/// write for a moment (a peer of a loaded machine missed its heartbeats: "no suitable peers for
/// placement") answers 503 `CLUSTER_UNAVAILABLE`, retriable, with `retry_after_ms`: as a client
/// is told to, that is tried again after the wait it names, up to five times.
pub async fn submit_ok(base: &str, body: Value) -> String {
    for attempt in 1.. {
        let r = submit(base, body.clone()).await;
        let status = r.status();
        let v: Value = r.json().await.unwrap_or_default();
        let unplaced =
            status == 503 && v["code"] == "CLUSTER_UNAVAILABLE" && v["retriable"] == true;
        if unplaced && attempt < 5 {
            eprintln!("submit: {v} (attempt {attempt}): trying again as it says");
            let wait = v["retry_after_ms"].as_u64().unwrap_or(1000);
            tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
            continue;
        }
        assert_eq!(status, 202, "{v}");
        return v["task_id"].as_str().unwrap().to_string();
    }
    unreachable!("the loop returns or panics")
}

/// Reads `base`'s stream of `id` (after `last_id`) to its end, or until `stop` says so.
pub async fn read_stream(
    base: &str,
    id: &str,
    last_id: Option<usize>,
    mut stop: impl FnMut(&[Ev]) -> bool,
) -> Vec<Ev> {
    let mut req = reqwest::Client::new().get(format!("{base}/v1/tasks/{id}/stream"));
    if let Some(l) = last_id {
        req = req.header("Last-Event-ID", l.to_string());
    }
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let mut body = r.bytes_stream();
    let (mut buf, mut events) = (String::new(), Vec::new());
    while let Some(Ok(chunk)) = body.next().await {
        buf.push_str(std::str::from_utf8(&chunk).unwrap());
        events.extend(super::parse_frames(&mut buf));
        if events
            .iter()
            .any(|e| e.event == "end" || e.event == "error")
            || stop(&events)
        {
            break;
        }
    }
    events
}

pub fn text_of(events: &[Ev]) -> String {
    events
        .iter()
        .filter(|e| e.event == "token")
        .map(|e| e.data["t"].as_str().unwrap().to_string())
        .collect()
}

/// The numbers of a count, in order (the model counts "6, 7, 8, …").
pub fn numbers(text: &str) -> Vec<u64> {
    text.split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect()
}

/// The events' ids are 0, 1, 2, … with no gap or repeat, and exactly one terminal event, last.
pub fn assert_whole(events: &[Ev], what: &str) {
    let ids: Vec<usize> = events.iter().map(|e| e.id.unwrap()).collect();
    let want: Vec<usize> = (0..events.len()).collect();
    assert_eq!(ids, want, "{what}: event ids");
    let ends = events
        .iter()
        .filter(|e| e.event == "end" || e.event == "error")
        .count();
    assert_eq!(ends, 1, "{what}: terminal events");
    assert!(matches!(
        events.last().unwrap().event.as_str(),
        "end" | "error"
    ));
}
