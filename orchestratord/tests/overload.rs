//! Overload with the scripted engine (exact, known service times): deadline-aware admission
//! from the client's stated timeout, refusals that say when to come back and keep the
//! client's place in line, queued tasks that leave before costing compute, streams that begin
//! with their first token, and start predictions checked against the real starts.

mod support;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::json;
use support::*;

const DEADLINE: &str = "x-request-deadline-ms";

/// The two slow-line tests one at a time: each leaves its clients well under a second between
/// the pace settling and their start budgets ending.
static SLOW_LINE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn submit_with(
    s: &TestServer,
    body: serde_json::Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut rq = s.client.post(s.url("/v1/tasks")).json(&body);
    for (k, v) in headers {
        rq = rq.header(*k, *v);
    }
    rq.send().await.unwrap()
}

fn header_u64(r: &reqwest::Response, name: &str) -> u64 {
    r.headers()[name]
        .to_str()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| panic!("{name} is a whole number"))
}

/// ORCH-ADM-DL-1, ORCH-ADM-DL-2, ORCH-ADM-RETRY-1: with 2 slots busy for 1 s and 2 tasks
/// queued behind them, a client that must be answered within its deadline is refused at once
/// with the wait that would make it fit (`retry-after-ms`, `Retry-After`, `X-Backoff-Ms`);
/// its place in line is kept, so when it comes back (saying it is a retry) it is queued ahead
/// of a newcomer that arrived while it waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_client_learns_when_to_come_back_and_keeps_its_place() {
    let mut cfg = config(vec![pool("p1", 2)]);
    cfg.admission.deadline_margin_ms = 100;
    // the scripted engine runs at the pace it measured: no allowance for a load unseen
    cfg.admission.probe_pace_factor = 1.0;
    let s = start(cfg, Duration::from_millis(20)).await;
    // 50 tokens at 20 ms: a slot is busy 1 s per task. Deadline 2480 ms for the whole task:
    // minus decode (1 s), the first token and the margin, it may wait ~1.3 s for a slot.
    let body = json!({"prompt": "a b", "max_tokens": 50});
    let deadline = [(DEADLINE, "2480")];
    let mut admitted = Vec::new();
    for _ in 0..4 {
        let r = submit_with(&s, body.clone(), &deadline).await;
        assert_eq!(r.status(), 202, "{:?}", r.text().await);
        let v: serde_json::Value = r.json().await.unwrap();
        admitted.push(v["task_id"].as_str().unwrap().to_string());
    }
    let before = s.metrics().await;
    // the fifth would start after ~2 s: refused now, told to come back when it fits (it
    // counts its tries, as the SDKs do: its place can be claimed)
    let refused = submit_with(
        &s,
        body.clone(),
        &[(DEADLINE, "2480"), ("x-stainless-retry-count", "0")],
    )
    .await;
    assert_eq!(refused.status(), 429);
    let wait_ms = header_u64(&refused, "retry-after-ms");
    assert!((250..=2000).contains(&wait_ms), "advised wait {wait_ms} ms");
    assert_eq!(header_u64(&refused, "x-backoff-ms"), wait_ms);
    assert_eq!(header_u64(&refused, "retry-after"), wait_ms.div_ceil(1000));
    let v: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(v["code"], "ADMISSION_REJECT");
    assert_eq!(v["policy_label"], "deadline");
    assert_eq!(v["retriable"], true);
    assert_eq!(v["retry_after_ms"], wait_ms);
    assert_eq!(s.state.queue.kept_places(), 1, "its place is kept");

    // a newcomer with no deadline of its own queues at the back meanwhile
    let newcomer = s.submit_ok(body.clone()).await;
    // the refused client comes back as told (and again, as an SDK would, if still early)
    tokio::time::sleep(Duration::from_millis(wait_ms)).await;
    let mut retry_id = None;
    for attempt in 1..=5 {
        let n = attempt.to_string();
        let r = submit_with(
            &s,
            body.clone(),
            &[(DEADLINE, "2480"), ("x-stainless-retry-count", n.as_str())],
        )
        .await;
        if r.status() == 202 {
            let v: serde_json::Value = r.json().await.unwrap();
            retry_id = Some(v["task_id"].as_str().unwrap().to_string());
            break;
        }
        assert_eq!(r.status(), 429);
        tokio::time::sleep(Duration::from_millis(header_u64(&r, "retry-after-ms"))).await;
    }
    let retry_id = retry_id.expect("the retry was admitted");
    let order: Vec<String> = s
        .state
        .queue
        .in_order()
        .iter()
        .map(|t| t.id.clone())
        .collect();
    let at = |id: &str| order.iter().position(|x| x == id);
    assert!(
        at(&retry_id).unwrap() < at(&newcomer).expect("newcomer still queued"),
        "the retry keeps its place ahead of the newcomer: {order:?}"
    );
    let claimed = "orchd_retry_places_total{outcome=\"claimed\"}";
    assert!(counter(&s.metrics().await, claimed) - counter(&before, claimed) >= 1.0);
    // everything admitted ends well, within its deadline
    for id in admitted.iter().chain([&retry_id, &newcomer]) {
        let evs = s.stream_all(id).await;
        assert_well_formed(&evs);
        assert_eq!(evs.last().unwrap().event, "end", "{id}: {evs:?}");
    }
}

/// ORCH-ADM-RETRY-2: a request the line makes late is refused on its first and second
/// attempts, but on its third — the SDKs' last by default, where a refusal loses the client
/// for good — it is queued (counted); its start budget still ends its wait: the line here is
/// as predicted, so it leaves the queue before any compute with a typed, retriable error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_last_attempt_is_queued_not_refused() {
    let mut cfg = config(vec![pool("p1", 2)]);
    cfg.admission.deadline_margin_ms = 100;
    // the scripted engine runs at the pace it measured: no allowance for a load unseen
    cfg.admission.probe_pace_factor = 1.0;
    let s = start(cfg, Duration::from_millis(20)).await;
    let body = json!({"prompt": "a b", "max_tokens": 50});
    let deadline = [(DEADLINE, "2480")];
    for _ in 0..4 {
        let r = submit_with(&s, body.clone(), &deadline).await;
        assert_eq!(r.status(), 202, "{:?}", r.text().await);
    }
    let before = s.metrics().await;
    for retry in ["0", "1"] {
        let r = submit_with(
            &s,
            body.clone(),
            &[(DEADLINE, "2480"), ("x-stainless-retry-count", retry)],
        )
        .await;
        assert_eq!(r.status(), 429, "attempt with retry count {retry}");
    }
    let last = submit_with(
        &s,
        body.clone(),
        &[(DEADLINE, "2480"), ("x-stainless-retry-count", "2")],
    )
    .await;
    assert_eq!(last.status(), 202, "{:?}", last.text().await);
    let v: serde_json::Value = last.json().await.unwrap();
    let id = v["task_id"].as_str().unwrap().to_string();
    let queued = "orchd_retry_places_total{outcome=\"last_attempt_queued\"}";
    assert_eq!(
        counter(&s.metrics().await, queued) - counter(&before, queued),
        1.0
    );
    let evs = s.stream_all(&id).await;
    assert_well_formed(&evs);
    // the line was as predicted: it left before any compute, typed and retriable
    let end = evs.last().unwrap();
    assert_eq!(end.event, "error", "{evs:?}");
    assert_eq!(end.data["code"], "QUEUE_TIMEOUT", "{evs:?}");
    assert_eq!(end.data["retriable"], true);
    assert!(evs.iter().all(|e| e.event != "token"), "{evs:?}");
}

/// ORCH-ADM-DL-1: a client timeout no answer could meet even on an idle pool is a 422
/// `DEADLINE_UNMET` (retrying cannot help), and a malformed deadline header is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_deadlines_are_422_and_bad_headers_400() {
    let s = start(config(vec![pool("p1", 2)]), Duration::from_millis(20)).await;
    // a real task confirms the load-time pace (ORCH-ADM-DL-8)
    let id = s.submit_ok(json!({"prompt": "a", "max_tokens": 5})).await;
    assert_eq!(s.stream_all(&id).await.last().unwrap().event, "end");
    let r = s
        .client
        .post(s.url("/v1/chat/completions"))
        .header("x-stainless-read-timeout", "0.3")
        .json(&json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "DEADLINE_UNMET");
    // the largest deadlines are no deadline to speak of, not an overflow
    for huge in [json!(u64::MAX), json!(u64::MAX / 2)] {
        let r = s
            .submit(json!({"prompt": "a", "max_tokens": 2, "deadline_ms": huge}))
            .await;
        assert_eq!(r.status(), 202, "{huge}");
    }
    let r = submit_with(
        &s,
        json!({"prompt": "a", "max_tokens": 2}),
        &[(DEADLINE, "18446744073709551615")],
    )
    .await;
    assert_eq!(r.status(), 202);
    let r = submit_with(&s, json!({"prompt": "a"}), &[(DEADLINE, "soon")]).await;
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["field"], DEADLINE);
}

/// ORCH-ADM-DL-3, ORCH-ADM-DL-4: a streamed chat admitted on a prediction that turned out
/// wrong (the task ahead never ends) leaves the queue when it can no longer answer within
/// the client's timeout — before any compute — and, since no token was sent, the client gets
/// a real HTTP error with a wait to come back after (what SDKs retry), not a stream that
/// opens only to fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_stream_that_cannot_start_in_time_gets_a_retriable_http_error() {
    let mut cfg = config(vec![pool("dl3", 1)]);
    cfg.admission.deadline_margin_ms = 100;
    let s = start(cfg, Duration::from_millis(10)).await;
    // predicted to end after 10 tokens (100 ms); it hangs instead
    let hang = s
        .submit_ok(json!({"prompt": "x [hang]", "max_tokens": 10}))
        .await;
    let before = s.metrics().await;
    let started = Instant::now();
    let r = s
        .client
        .post(s.url("/v1/chat/completions"))
        .header("x-stainless-read-timeout", "1.0")
        .header("x-stainless-retry-count", "0")
        .json(&json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": true}))
        .send()
        .await
        .unwrap();
    let waited = started.elapsed();
    assert_eq!(r.status(), 504, "{:?}", r.text().await);
    assert!(
        waited < Duration::from_millis(1000),
        "answered within the client's timeout: {waited:?}"
    );
    assert!(header_u64(&r, "retry-after-ms") >= 1);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "QUEUE_TIMEOUT");
    let after = s.metrics().await;
    // it never took the slot: only the hanging task ever started
    let started = "orchd_tasks_started_total{pool=\"dl3\"}";
    assert_eq!(counter(&after, started), counter(&before, started));
    assert_eq!(
        s.state.queue.kept_places(),
        1,
        "its place is kept for the retry"
    );
    assert_eq!(s.cancel(&hang).await, 204);
}

/// ORCH-ADM-CHEAP-1: a refusal costs no tokenization of the prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_does_not_tokenize_the_prompt() {
    let mut cfg = config(vec![pool("p1", 1)]);
    cfg.queue.capacity = 1;
    let s = start(cfg, Duration::from_millis(10)).await;
    let busy = s
        .submit_ok(json!({"prompt": "x [hang]", "max_tokens": 10}))
        .await;
    let queued = s.submit_ok(json!({"prompt": "y", "max_tokens": 10})).await;
    let calls = TOKENIZE_CALLS.load(Ordering::SeqCst);
    for _ in 0..5 {
        let r = s
            .submit(json!({"prompt": "a long prompt [counted]", "max_tokens": 10}))
            .await;
        assert_eq!(r.status(), 429);
    }
    assert_eq!(TOKENIZE_CALLS.load(Ordering::SeqCst), calls);
    assert_eq!(s.cancel(&queued).await, 204);
    assert_eq!(s.cancel(&busy).await, 204);
}

/// ORCH-ADM-PRED-1: under a load that varies (a trickle, a burst, a steady stream, task sizes
/// from 5 to 40 tokens), admission's predicted wait for a slot is compared with each task's
/// real one; the median error stays small, and every start is in the error histogram.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_predictions_match_the_real_starts() {
    let s = start(config(vec![pool("p1", 2)]), Duration::from_millis(10)).await;
    let sizes = [5u32, 40, 10, 20, 40, 5, 20, 10];
    let mut ids = Vec::new();
    let submit = |i: usize| {
        let body = json!({"prompt": "a b c", "max_tokens": sizes[i % sizes.len()]});
        let s = &s;
        async move {
            let r = s.submit(body).await;
            assert_eq!(r.status(), 202);
            let v: serde_json::Value = r.json().await.unwrap();
            (
                v["task_id"].as_str().unwrap().to_string(),
                v["predicted_start_ms"].as_u64().unwrap(),
            )
        }
    };
    let mut i = 0;
    // a trickle: one every 250 ms
    for _ in 0..6 {
        ids.push(submit(i).await);
        i += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // a burst of 12
    for _ in 0..12 {
        ids.push(submit(i).await);
        i += 1;
    }
    // a steady stream, faster than the pool serves
    for _ in 0..12 {
        ids.push(submit(i).await);
        i += 1;
        tokio::time::sleep(Duration::from_millis(60)).await;
    }
    let mut errors = Vec::new();
    for (id, predicted) in &ids {
        let evs = s.stream_all(id).await;
        assert_eq!(evs.last().unwrap().event, "end");
        let rec = s.record(id).await;
        let actual = rec["timings"]["queued_ms"].as_u64().unwrap();
        errors.push((actual as i64 - *predicted as i64).unsigned_abs());
    }
    errors.sort_unstable();
    let median = errors[errors.len() / 2];
    let p90 = errors[errors.len() * 9 / 10];
    eprintln!(
        "start prediction error over {} tasks: median {median} ms, p90 {p90} ms",
        errors.len()
    );
    assert!(median <= 60, "median error {median} ms: {errors:?}");
    let m = s.metrics().await;
    let count = |dir: &str| {
        counter(
            &m,
            &format!("orchd_start_prediction_error_seconds_count{{direction=\"{dir}\"}}"),
        )
    };
    assert!(count("late") + count("early") >= ids.len() as f64);
}

/// ORCH-ADM-DL-2: a pool measures its pace with every slot busy when its engine loads (the
/// scripted engine: one token per 20 ms whatever the load), and the first task that ends in a
/// full pool replaces that load-time measurement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_measures_a_full_pool_when_it_loads_and_real_tasks_replace_it() {
    let s = start(config(vec![pool("pace", 1)]), Duration::from_millis(20)).await;
    let snap = s.state.pools.get("pace").unwrap().snapshot();
    let full = snap.full_ms_per_token_ewma.expect("measured at load");
    assert!(
        (15.0..60.0).contains(&full),
        "full-pool pace {full} ms/token"
    );
    assert!(snap.full_pace_from_probe_only);
    assert!(snap.prefill_ms_per_token_ewma.is_some());
    let id = s.submit_ok(json!({"prompt": "a b", "max_tokens": 5})).await;
    assert_eq!(s.stream_all(&id).await.last().unwrap().event, "end");
    // the pool takes the task's pace when its lease ends, a moment after the end event went
    // out (CI saw the snapshot read before it)
    let replaced = support::procs::eventually(Duration::from_secs(2), || async {
        !s.state
            .pools
            .get("pace")
            .unwrap()
            .snapshot()
            .full_pace_from_probe_only
    })
    .await;
    assert!(replaced, "a task in the full pool replaced the probe");
    let snap = s.state.pools.get("pace").unwrap().snapshot();
    assert_eq!(snap.used_share_ewma, Some(1.0));
}

/// One client as the SDKs behave: its stated timeout on every attempt, a 429 or 504 waited
/// out as advised and retried (saying so), retry counts `first..first + attempts`. Returns
/// the status of each attempt and whether the stream reached its end.
async fn sdk_like_stream(
    s: &TestServer,
    content: &str,
    first: usize,
    attempts: usize,
) -> (Vec<u16>, bool) {
    let mut statuses = Vec::new();
    for retry in first..first + attempts {
        let n = retry.to_string();
        let r = s
            .client
            .post(s.url("/v1/chat/completions"))
            .header("x-stainless-read-timeout", "4.0")
            .header("x-stainless-retry-count", n.as_str())
            .json(&json!({"messages": [{"role": "user", "content": content}], "max_tokens": 30, "stream": true}))
            .send()
            .await
            .unwrap();
        statuses.push(r.status().as_u16());
        if r.status() == 200 {
            let body = r.text().await.unwrap();
            return (statuses, body.contains("data: [DONE]"));
        }
        let wait = header_u64(&r, "retry-after-ms");
        let v: serde_json::Value = r.json().await.unwrap();
        if statuses.last() == Some(&429) {
            assert_eq!(v["error"]["code"], "ADMISSION_REJECT", "{v}");
        }
        if retry + 1 < first + attempts {
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
    }
    (statuses, false)
}

/// ORCH-ADM-DL-6: the pool measured its pace at load (one token per 20 ms), but under the load
/// that comes every token takes four times as long. A burst admitted on the old pace is not
/// left to wait out its clients' time in line: once the pace is settled (the first tasks ended
/// in a full pool, the next ones show theirs), the tasks that can no longer start in time are
/// sent back at once with a 429 and the wait that fits (never a 504 after the client's time
/// is spent), each keeps its place, and coming back as told every client is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_slower_than_measured_sends_back_what_cannot_start_in_time() {
    let _alone = SLOW_LINE.lock().await;
    let mut cfg = config(vec![pool("dl5", 2)]);
    cfg.admission.deadline_margin_ms = 100;
    // admitted on the measured pace alone (ORCH-ADM-DL-7 off): the re-play is under test
    cfg.admission.probe_pace_factor = 1.0;
    let s = std::sync::Arc::new(start(cfg, Duration::from_millis(20)).await);
    let snap = s.state.pools.get("dl5").unwrap().snapshot();
    assert!(snap.full_pace_from_probe_only);
    // 30 tokens: 0.6 s a task at the measured pace, 2.4 s at the real one. Within a 4 s timeout
    // the two slots start 4 of 8 in time (at 0 and 2.4 s); the measured pace would have
    // started all 8. The pace settles ~0.6 s after the second pair starts, ~0.8 s before the
    // others' start budget ends.
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move { sdk_like_stream(&s, &format!("[slow] hi {i}"), 0, 3).await })
        })
        .collect();
    let mut outcomes = Vec::new();
    for c in clients {
        outcomes.push(c.await.unwrap());
    }
    let first: Vec<u16> = outcomes.iter().map(|(st, _)| st[0]).collect();
    assert!(
        outcomes.iter().all(|(_, done)| *done),
        "every client was served, coming back as told: {outcomes:?}"
    );
    assert!(
        outcomes.iter().flat_map(|(st, _)| st).all(|&st| st != 504),
        "no attempt waited out its client's time in line: {outcomes:?}"
    );
    let sent_back = first.iter().filter(|&&st| st == 429).count();
    assert!(
        sent_back >= 4,
        "the tasks that could not start in time were sent back: {first:?}"
    );
    let m = s.metrics().await;
    assert!(counter(&m, "orchd_queue_shed_total") >= 4.0, "counted");
    // nothing ran twice: one start per client
    assert_eq!(counter(&m, "orchd_tasks_started_total{pool=\"dl5\"}"), 8.0);
}

/// ORCH-ADM-RETRY-2, ORCH-ADM-DL-6: the line of the test above, every client on its last
/// attempt (retry count 2): the re-play sends none of them back (a 429 now would lose the
/// client); those the slow line cannot start in time leave the queue with a 504
/// `QUEUE_TIMEOUT` when their start budget ends, before any compute; the others are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_line_replay_does_not_send_back_a_last_attempt() {
    let _alone = SLOW_LINE.lock().await;
    let mut cfg = config(vec![pool("last", 2)]);
    cfg.admission.deadline_margin_ms = 100;
    // admitted on the measured pace alone (ORCH-ADM-DL-7 off): the re-play is under test
    cfg.admission.probe_pace_factor = 1.0;
    let s = std::sync::Arc::new(start(cfg, Duration::from_millis(20)).await);
    let clients: Vec<_> = (0..8)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(
                async move { sdk_like_stream(&s, &format!("[slow] last {i}"), 2, 1).await },
            )
        })
        .collect();
    let mut outcomes = Vec::new();
    for c in clients {
        outcomes.push(c.await.unwrap());
    }
    assert!(
        outcomes
            .iter()
            .all(|(st, done)| (st[..] == [200] && *done) || st[..] == [504]),
        "served, or left the queue when its start budget ended: {outcomes:?}"
    );
    let late = outcomes.iter().filter(|(st, _)| st[..] == [504]).count();
    assert!(late >= 1, "the line was too slow for some: {outcomes:?}");
    // none was sent back (that would be a 429 above; the shed counter is the process's, shared
    // with the test above); nothing ran for a client that was not served
    assert_eq!(
        counter(
            &s.metrics().await,
            "orchd_tasks_started_total{pool=\"last\"}"
        ) as usize,
        8 - late
    );
}

/// ORCH-ADM-DL-8 (issue 33 defect 2): a pool that loaded while the machine was busy measured
/// a pace twenty times slower than it runs. A deadline that pace says no wait could meet is
/// not refused for good on a pace no real task confirmed: the task runs on the free slot and
/// ends in time; the first real task replaces the load-time pace, so the next such client is
/// admitted at once; only then is a deadline no answer could meet a 422.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pace_measured_on_a_busy_machine_never_refuses_for_good() {
    let s = start(config(vec![pool("busyload", 2)]), Duration::from_millis(5)).await;
    let pool = s.state.pools.all()[0].clone();
    let loaded = pool.snapshot();
    let solo = loaded
        .solo_ms_per_token
        .expect("the self-test measures one sequence");
    assert!(solo > 50.0, "the load saw the busy machine: {loaded:?}");
    assert!(!loaded.pace_confirmed);

    // 64 tokens at the load-time pace: 6.4 s; the engine runs them in 0.3 s
    let body = json!({"prompt": "Once upon a time", "max_tokens": 64, "deadline_ms": 3000});
    let started = Instant::now();
    let id = s.submit_ok(body.clone()).await;
    let evs = s.stream_all(&id).await;
    assert_eq!(evs.last().unwrap().event, "end", "{evs:?}");
    assert!(started.elapsed() < Duration::from_secs(3));

    let after = pool.snapshot();
    assert!(after.pace_confirmed);
    let solo = after.solo_ms_per_token.unwrap();
    assert!(
        solo < 20.0,
        "the real task's pace replaced the load's: {after:?}"
    );
    // the full pool's pace, measured at load only, keeps its ratio to the pace of one
    assert!(after.full_ms_per_token_ewma.unwrap() < 30.0, "{after:?}");
    // one real task was enough: the next client with a deadline is admitted at once
    let id = s.submit_ok(body).await;
    assert_eq!(s.stream_all(&id).await.last().unwrap().event, "end");

    // a confirmed pace that says no wait could answer in time: 422, not retriable
    let r = s
        .submit(json!({"prompt": "a", "max_tokens": 64, "deadline_ms": 100}))
        .await;
    assert_eq!(r.status(), 422);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["code"], "DEADLINE_UNMET");
    assert_eq!(v["retriable"], false);
}

/// ORCH-ADM-DL-8: a whole answer with a deadline is admitted on the pace it will run at, not
/// the pool's mean: with another task running, an engine that slows as its slots fill runs
/// the answer at a full pool's pace, so a deadline that only an idle pool meets is a
/// retriable 429 with a wait (it was admitted and finished late); alone, the same request
/// is served within its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_answer_is_admitted_at_the_pace_it_will_run_at() {
    let mut cfg = config(vec![pool("crowded", 2)]);
    cfg.admission.deadline_margin_ms = 100;
    let s = start(cfg, Duration::from_millis(20)).await;
    // a real task confirms the pace of one sequence (20 ms a token)
    let id = s.submit_ok(json!({"prompt": "a", "max_tokens": 5})).await;
    assert_eq!(s.stream_all(&id).await.last().unwrap().event, "end");

    let chat = |deadline_ms: &'static str| {
        s.client
            .post(s.url("/v1/chat/completions"))
            .header(DEADLINE, deadline_ms)
            .json(&json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 30}))
            .send()
    };
    // another task runs: each token now takes 40 ms
    let long = s.submit_ok(json!({"prompt": "x", "max_tokens": 200})).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let r = chat("1200").await.unwrap();
    assert_eq!(
        r.status(),
        429,
        "30 tokens beside another task take 1.2 s and more"
    );
    assert!(header_u64(&r, "retry-after-ms") >= 500);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "ADMISSION_REJECT", "{v}");

    // alone, it fits: served, and within its deadline
    assert_eq!(s.cancel(&long).await, 204);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let r = chat("1200").await.unwrap();
    let status = r.status();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["completion_tokens"], 30, "{v}");
    assert!(started.elapsed() < Duration::from_millis(1200));
}
