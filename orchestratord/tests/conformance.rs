//! CONF-1 (issue 38): one suite, two implementations. The same scenarios, with the same
//! assertions, run on the one-box default (one process, the embedded queue and SQLite
//! records) and on replicas on NATS JetStream (two replicas on a NATS node; a client
//! submits to one and follows, cancels and reads records on the other). Both deployments
//! have the same capacity — two slots of the real model and a queue of one per class — so
//! every answer a client sees must be the same: the stream's events and ids, the bound and its
//! 429, cancel of a queued and of a running task, `Last-Event-ID` resume, deadlines, typed
//! errors for bad input, status and records.

mod support;

use std::time::Duration;

use serde_json::{json, Value};
use support::default_model_path;
use support::nats::NatsCluster;
use support::procs::*;
use support::task_client::*;
use support::Ev;

/// A deployment a client talks to: where it submits, and where it follows.
struct Deployment {
    name: &'static str,
    _nats: Option<NatsCluster>,
    procs: Vec<Proc>,
    /// Where tasks are submitted.
    entry: String,
    /// Where they are followed, cancelled and read (another replica in the cluster).
    other: String,
}

fn pool(slots: usize) -> String {
    format!(
        "[queue]\ncapacity = 1\n\n[[pools]]\nid = \"p\"\nmodel = \"{}\"\nslots = {slots}\nctx = 512\nthreads = 1\n",
        default_model_path()
    )
}

impl Deployment {
    /// One process, one pool of two slots.
    async fn one_box() -> Self {
        let (p, base) = server(&pool(2)).await;
        Self {
            name: "one box",
            _nats: None,
            procs: vec![p],
            entry: base.clone(),
            other: base,
        }
    }

    /// Two replicas of one slot each on a NATS node.
    async fn replicas() -> Self {
        let nats = NatsCluster::start(1).await;
        let urls = nats.urls();
        let cfg = format!(
            "[cluster]\nheartbeat_ms = 200\nack_wait_ms = 2000\nstream_replicas = 1\n\n{}",
            pool(1)
        );
        let (mut procs, mut bases) = (Vec::new(), Vec::new());
        for name in ["r0", "r1"] {
            let env = [
                ("ORCHD_CLUSTER_NATS", urls.as_str()),
                ("ORCHD_REPLICA_ID", name),
            ];
            let (p, base) = server_env(&cfg, &env).await;
            procs.push(p);
            bases.push(base);
        }
        for base in &bases {
            let both = lists_pools(base, 2, Duration::from_secs(10)).await;
            assert!(both, "{base} does not list both replicas' pools");
        }
        Self {
            name: "replicas",
            _nats: Some(nats),
            procs,
            entry: bases[0].clone(),
            other: bases[1].clone(),
        }
    }

    fn logs(&self) -> String {
        self.procs.iter().map(|p| p.log_text()).collect()
    }

    /// Waits until nothing runs or waits (a cancelled task's slot is given back a moment after
    /// its last event).
    async fn idle(&self) {
        let bases = [self.entry.clone(), self.other.clone()];
        let idle = eventually(Duration::from_secs(30), || async {
            let mut all = true;
            for base in &bases {
                let v: Value = match reqwest::get(format!("{base}/v1/pools")).await {
                    Ok(r) => r.json().await.unwrap_or_default(),
                    Err(_) => return false,
                };
                all &= v["pools"].as_array().is_some_and(|a| {
                    a.iter()
                        .all(|p| p["metrics"]["slots_busy"] == 0 && p["queue_depth"] == 0)
                });
            }
            all
        })
        .await;
        assert!(idle, "{}: not idle\n{}", self.name, self.logs());
    }
}

async fn status_of(base: &str, id: &str) -> Value {
    reqwest::get(format!("{base}/v1/tasks/{id}"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The whole suite on `d`; returns the greedy answer of its first scenario.
async fn conformance(d: &Deployment) -> String {
    let text = a_task_streams_from_anywhere(d).await;
    a_stream_resumes_after_its_last_event_id(d).await;
    d.idle().await;
    the_bound_holds_and_cancel_ends_queued_and_running(d).await;
    d.idle().await;
    an_unmeetable_deadline_is_refused(d).await;
    bad_input_gets_the_same_typed_errors(d).await;
    text
}

/// Started, tokens, end; ids 0.. with no gap; the count goes on; status and record agree.
async fn a_task_streams_from_anywhere(d: &Deployment) -> String {
    let id = submit_ok(
        &d.entry,
        json!({"prompt": COUNT, "max_tokens": 24, "temperature": 0}),
    )
    .await;
    let events = read_stream(&d.other, &id, None, |_| false).await;
    assert_whole(&events, d.name);
    assert_eq!(events[0].event, "started", "{}: {events:?}", d.name);
    assert_eq!(events[0].data["queue_position"], 0, "{}", d.name);
    let end = events.last().unwrap();
    assert_eq!(end.event, "end", "{}: {end:?}", d.name);
    assert_eq!(end.data["tokens_out"], 24, "{}: {end:?}", d.name);
    assert_eq!(
        events.iter().filter(|e| e.event == "token").count(),
        24,
        "{}",
        d.name
    );
    let text = text_of(&events);
    let count = numbers(&text);
    assert_eq!(
        count,
        (6..6 + count.len() as u64).collect::<Vec<_>>(),
        "{}: {text:?}",
        d.name
    );
    // the same stream again where it was submitted
    let again = read_stream(&d.entry, &id, None, |_| false).await;
    assert_eq!(again, events, "{}: the stream read twice", d.name);
    let status = status_of(&d.other, &id).await;
    assert_eq!(status["state"], "completed", "{}: {status}", d.name);
    let record = eventually(Duration::from_secs(5), || async {
        let v: Value = reqwest::get(format!("{}/v1/artifacts/{id}", d.other))
            .await
            .unwrap()
            .json()
            .await
            .unwrap_or_default();
        v["terminal"]["event"] == "end"
            && v["tokens_out"] == 24
            && v["transcript"].as_array().map(Vec::len) == Some(events.len())
    })
    .await;
    assert!(record, "{}: no whole record of {id}", d.name);
    text
}

/// A client that lost its connection after some events gets the rest, once each.
async fn a_stream_resumes_after_its_last_event_id(d: &Deployment) {
    let id = submit_ok(
        &d.entry,
        json!({"prompt": COUNT, "max_tokens": 40, "temperature": 0}),
    )
    .await;
    let first = read_stream(&d.other, &id, None, |e| {
        e.iter().filter(|e| e.event == "token").count() >= 8
    })
    .await;
    let last = first.last().unwrap().id.unwrap();
    let rest = read_stream(&d.entry, &id, Some(last), |_| false).await;
    assert_eq!(rest[0].id, Some(last + 1), "{}", d.name);
    let whole: Vec<Ev> = first.into_iter().chain(rest).collect();
    assert_whole(&whole, d.name);
    assert_eq!(whole.last().unwrap().data["tokens_out"], 40, "{}", d.name);
}

/// Two slots and a queue of one: three long tasks are admitted, the fourth is refused 429 with
/// `Retry-After` and a typed body; a cancel ends the queued one before it ever starts and the
/// running ones at once; then there is room again.
async fn the_bound_holds_and_cancel_ends_queued_and_running(d: &Deployment) {
    let long = json!({"prompt": COUNT, "max_tokens": 400});
    let mut ids = Vec::new();
    for i in 0..3 {
        let r = submit(&d.entry, long.clone()).await;
        assert_eq!(r.status(), 202, "{}", d.name);
        let v: Value = r.json().await.unwrap();
        ids.push(v["task_id"].as_str().unwrap().to_string());
        if i == 2 {
            // behind two running tasks: first in line, told when it should start
            assert_eq!(v["queue_position"], 0, "{}: {v}", d.name);
            assert!(
                v["predicted_start_ms"].as_u64().unwrap() > 0,
                "{}: {v}",
                d.name
            );
        }
    }
    let refused = submit(&d.entry, long.clone()).await;
    assert_eq!(refused.status(), 429, "{}", d.name);
    let retry: u64 = refused
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{}: a 429 without Retry-After", d.name));
    assert!(retry >= 1, "{}", d.name);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "ADMISSION_REJECT", "{}: {body}", d.name);
    assert_eq!(body["retriable"], true, "{}: {body}", d.name);
    // two run, one waits
    let running = eventually(Duration::from_secs(20), || async {
        let mut states = Vec::new();
        for id in &ids {
            states.push(status_of(&d.other, id).await["state"].clone());
        }
        states.iter().filter(|s| **s == "running").count() == 2
            && states.iter().filter(|s| **s == "queued").count() == 1
    })
    .await;
    assert!(running, "{}: not two running and one queued", d.name);
    let mut queued = None;
    for id in &ids {
        if status_of(&d.other, id).await["state"] == "queued" {
            queued = Some(id.clone());
        }
    }
    let queued = queued.unwrap();
    let client = reqwest::Client::new();
    let cancel = |id: String| {
        let (client, base) = (client.clone(), d.other.clone());
        async move {
            client
                .post(format!("{base}/v1/tasks/{id}/cancel"))
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    // every cancel is sent before any stream is read: a running task of 400 tokens ends by
    // itself within seconds on a fast machine, and reading streams between the cancels (through
    // the relay, on replicas) can take that long on a busy one
    assert_eq!(cancel(queued.clone()).await, 204, "{}", d.name);
    let running: Vec<String> = ids.iter().filter(|i| **i != queued).cloned().collect();
    for id in &running {
        assert_eq!(cancel(id.clone()).await, 204, "{}", d.name);
    }
    let events = read_stream(&d.entry, &queued, None, |_| false).await;
    assert_whole(&events, d.name);
    assert!(
        events.iter().all(|e| e.event != "token"),
        "{}: the queued task ran: {events:?}",
        d.name
    );
    assert_eq!(
        events.last().unwrap().data["finish_reason"],
        "cancelled",
        "{}",
        d.name
    );
    for id in &running {
        let events = read_stream(&d.entry, id, None, |_| false).await;
        assert_whole(&events, d.name);
        assert_eq!(
            events.last().unwrap().data["finish_reason"],
            "cancelled",
            "{}",
            d.name
        );
        assert_eq!(status_of(&d.other, id).await["state"], "cancelled");
    }
    // cancelling again, or a task nobody has, is told apart
    assert_eq!(cancel("no-such-task".into()).await, 404, "{}", d.name);
    let room = eventually(Duration::from_secs(10), || async {
        submit(&d.entry, json!({"prompt": COUNT, "max_tokens": 2}))
            .await
            .status()
            == 202
    })
    .await;
    assert!(room, "{}: no room after the cancels\n{}", d.name, d.logs());
}

/// A deadline the deployment cannot meet — sooner than the tasks ahead of it leave a slot
/// free — is refused at admission (422 `DEADLINE_UNMET`), not taken and missed.
async fn an_unmeetable_deadline_is_refused(d: &Deployment) {
    d.idle().await;
    let long = json!({"prompt": COUNT, "max_tokens": 400, "temperature": 0});
    let mut ids = Vec::new();
    for _ in 0..2 {
        ids.push(submit_ok(&d.entry, long.clone()).await);
    }
    // both slots busy for seconds: a task that must end within 300 ms cannot
    let busy = eventually(Duration::from_secs(20), || async {
        let mut n = 0;
        for id in &ids {
            n += usize::from(status_of(&d.other, id).await["state"] == "running");
        }
        n == 2
    })
    .await;
    assert!(busy, "{}", d.name);
    let late = submit(
        &d.entry,
        json!({"prompt": COUNT, "max_tokens": 200, "deadline_ms": 300}),
    )
    .await;
    let status = late.status().as_u16();
    let body: Value = late.json().await.unwrap_or_default();
    assert_eq!(
        (status, body["code"].as_str()),
        (422, Some("DEADLINE_UNMET")),
        "{}: {body}",
        d.name
    );
    for id in &ids {
        reqwest::Client::new()
            .post(format!("{}/v1/tasks/{id}/cancel", d.other))
            .send()
            .await
            .unwrap();
    }
    d.idle().await;
}

/// Client mistakes: the same status and code on either deployment.
async fn bad_input_gets_the_same_typed_errors(d: &Deployment) {
    let cases = [
        (
            json!({"prompt": COUNT, "max_tokens": 0}),
            400,
            "INVALID_PARAMS",
        ),
        (json!({"max_tokens": 4}), 400, "INVALID_PARAMS"),
        (
            json!({"prompt": COUNT, "max_tokens": 4, "pool": "nowhere"}),
            400,
            "INVALID_PARAMS",
        ),
        (
            json!({"prompt": COUNT, "max_tokens": 4, "model": "no-such-model"}),
            404,
            "NOT_FOUND",
        ),
        // past the pool's context (512)
        (
            json!({"prompt": COUNT.repeat(60), "max_tokens": 4}),
            400,
            "INVALID_PARAMS",
        ),
        (
            json!({"prompt": COUNT, "max_tokens": 4, "task_id": "bad id with spaces"}),
            400,
            "INVALID_PARAMS",
        ),
    ];
    for (body, status, code) in cases {
        let r = submit(&d.entry, body.clone()).await;
        let got = r.status().as_u16();
        let v: Value = r.json().await.unwrap_or_default();
        assert_eq!(
            (got, v["code"].as_str()),
            (status, Some(code)),
            "{}: {body} → {v}",
            d.name
        );
    }
    // a task id is an idempotency key (ORCH-ADM-3): sent again, wherever, it is the same
    // task, not run twice
    let id = "conformance-dup";
    let body = json!({"task_id": id, "prompt": COUNT, "max_tokens": 2});
    submit_ok(&d.entry, body.clone()).await;
    let ran = read_stream(&d.other, id, None, |_| false).await;
    assert_whole(&ran, d.name);
    for base in [&d.entry, &d.other] {
        let again = submit(base, body.clone()).await;
        assert_eq!(again.status(), 202, "{}: resent to {base}", d.name);
        let v: Value = again.json().await.unwrap();
        assert_eq!(v["task_id"], id, "{}: {v}", d.name);
        let events = read_stream(base, id, None, |_| false).await;
        assert_eq!(events, ran, "{}: the resent task ran again", d.name);
    }
    for path in ["", "/stream"] {
        let r = reqwest::get(format!("{}/v1/tasks/no-such-task{path}", d.other))
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{}: {path}", d.name);
        let v: Value = r.json().await.unwrap_or_default();
        assert_eq!(v["code"], "NOT_FOUND", "{}: {path}", d.name);
    }
}

/// CONF-1: the suite on one box, then on replicas; the greedy answers are the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_box_and_replicas_pass_the_same_suite() {
    let one_box = Deployment::one_box().await;
    let alone = conformance(&one_box).await;
    drop(one_box);
    let replicas = Deployment::replicas().await;
    let cluster = conformance(&replicas).await;
    assert_eq!(alone, cluster, "the greedy answer, one box vs replicas");
}
