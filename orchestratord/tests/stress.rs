//! ORCH-REL-1 (OC-CTRL-2012, OC-CTRL-2029): 500 concurrent tasks with random cancels and
//! disconnects: every task ends exactly once, nothing is lost, no token follows a cancel, and
//! the metrics counters agree with what happened. Its own binary, so the counters are ours.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use serde_json::json;
use support::*;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Action {
    Read,
    Cancel(usize),
    Disconnect(usize),
}

/// A small deterministic generator (no test randomness that cannot be replayed).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_tasks_with_cancels_and_disconnects() {
    let mut cfg = config(vec![pool("p1", 4), pool("p2", 4)]);
    cfg.queue.capacity = 600;
    cfg.timeouts.idle_ms = 10_000;
    // the pool's pace measured on a busy machine may predict minutes for 500 tasks in line;
    // this test is about cancels and disconnects, not about admission's deadline
    cfg.admission.max_queue_wait_ms = 600_000;
    // a disconnect cancels at once here; the grace period has its own tests (sse_resume.rs)
    cfg.stream.disconnect_grace_ms = 0;
    let s = std::sync::Arc::new(start(cfg, Duration::from_millis(1)).await);
    let before = s.metrics().await;
    let mut rng = Lcg(42);
    let mut plans = Vec::new();
    for i in 0..500 {
        let max_tokens = 1 + (rng.next() % 24) as usize;
        let action = match rng.next() % 4 {
            0 => Action::Cancel((rng.next() % 6) as usize),
            1 => Action::Disconnect((rng.next() % 6) as usize),
            _ => Action::Read,
        };
        let priority = if i % 3 == 0 { "batch" } else { "interactive" };
        plans.push((max_tokens, action, priority));
    }
    let mut handles = Vec::new();
    for (max_tokens, action, priority) in plans.clone() {
        let s = s.clone();
        handles.push(tokio::spawn(async move {
            use futures::StreamExt;
            let id = s
                .submit_ok(json!({"prompt": "stress test", "max_tokens": max_tokens, "priority": priority}))
                .await;
            let r = s.open_stream(&id).await;
            let mut body = r.bytes_stream();
            let mut buf = String::new();
            let mut events: Vec<Ev> = Vec::new();
            let mut acted = false;
            while let Some(chunk) = body.next().await {
                buf.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
                events.extend(parse_frames(&mut buf));
                let tokens = events.iter().filter(|e| e.event == "token").count();
                match action {
                    Action::Cancel(k) if !acted && tokens >= k => {
                        assert_eq!(s.cancel(&id).await, 204);
                        // tokens already in flight were appended before the cancel; the exact
                        // check is on the transcript below (nothing after the terminal event)
                        acted = true;
                    }
                    Action::Disconnect(k) if tokens >= k => {
                        return (id, action, None);
                    }
                    _ => {}
                }
            }
            (id, action, Some(events))
        }));
    }
    let mut results = Vec::new();
    for h in handles {
        results.push(h.await.unwrap());
    }
    // disconnected streams cancel their tasks; wait for every task to reach its terminal
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !s.state.tasks.unfinished().is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut lost = 0;
    let mut doubles = 0;
    let mut after_terminal = 0;
    let mut outcomes: HashMap<String, usize> = HashMap::new();
    let mut cancelled_client = 0;
    let mut cancelled_disconnect = 0;
    let mut tokens_total = 0u64;
    for (id, action, events) in &results {
        let rec = s.record(id).await;
        let transcript = rec["transcript"].as_array().unwrap();
        let terminals: Vec<usize> = transcript
            .iter()
            .enumerate()
            .filter(|(_, e)| e["event"] == "end" || e["event"] == "error")
            .map(|(i, _)| i)
            .collect();
        match terminals.len() {
            0 => lost += 1,
            1 => {}
            _ => doubles += 1,
        }
        if let Some(&t) = terminals.first() {
            after_terminal += transcript.len() - 1 - t;
        }
        let tokens = transcript.iter().filter(|e| e["event"] == "token").count() as u64;
        tokens_total += tokens;
        assert_eq!(rec["tokens_out"].as_u64().unwrap(), tokens);
        let term = &rec["terminal"];
        let outcome = if term["event"] == "end" {
            term["finish_reason"].as_str().unwrap().to_string()
        } else {
            "error".to_string()
        };
        if outcome == "cancelled" {
            match action {
                Action::Cancel(_) => cancelled_client += 1,
                Action::Disconnect(_) => cancelled_disconnect += 1,
                Action::Read => panic!("task {id} cancelled without a cancel"),
            }
        }
        *outcomes.entry(outcome).or_default() += 1;
        if let Some(ev) = events {
            assert_well_formed(ev);
            // the stream is the transcript, event for event
            assert_eq!(ev.len(), transcript.len(), "stream and transcript of {id}");
        }
    }
    assert_eq!(
        (lost, doubles, after_terminal),
        (0, 0, 0),
        "lost, doubles, events after terminal"
    );
    assert_eq!(outcomes.get("error"), None, "{outcomes:?}");
    assert!(
        cancelled_client > 50,
        "cancels exercised: {cancelled_client}"
    );
    assert!(
        cancelled_disconnect > 50,
        "disconnects exercised: {cancelled_disconnect}"
    );
    // every slot was given back (runners release just after the terminal event)
    let busy = || {
        s.state
            .pools
            .all()
            .iter()
            .map(|p| p.snapshot().slots_busy)
            .sum::<usize>()
    };
    for _ in 0..100 {
        if busy() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for p in s.state.pools.all() {
        assert_eq!(p.snapshot().slots_busy, 0, "pool {} slots", p.id());
    }
    let after = s.metrics().await;
    let delta = |name: &str| counter(&after, name) - counter(&before, name);
    assert_eq!(
        delta("orchd_tasks_enqueued_total{priority=\"interactive\"}")
            + delta("orchd_tasks_enqueued_total{priority=\"batch\"}"),
        500.0
    );
    assert_eq!(
        delta("orchd_tasks_cancelled_total{reason=\"client\"}"),
        cancelled_client as f64
    );
    assert_eq!(
        delta("orchd_tasks_cancelled_total{reason=\"disconnect\"}"),
        cancelled_disconnect as f64
    );
    assert_eq!(delta("orchd_tokens_out_total"), tokens_total as f64);
    let finished: f64 = ["stop", "length", "cancelled", "error"]
        .iter()
        .map(|o| delta(&format!("orchd_tasks_finished_total{{outcome=\"{o}\"}}")))
        .sum();
    assert_eq!(finished, 500.0);
    eprintln!(
        "500 tasks: outcomes {outcomes:?}, client cancels {cancelled_client}, disconnects {cancelled_disconnect}, tokens {tokens_total}"
    );
}
