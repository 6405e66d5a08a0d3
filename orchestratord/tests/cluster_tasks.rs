//! CLU-TASK-1..3 (issue 38): tasks through three replicas on a real 3-node NATS JetStream
//! cluster on loopback, each replica a real process serving the real model in a pool of one
//! slot. A task admitted on any replica runs where a slot is free and streams, with the same
//! event ids, from any replica; concurrent admissions on every replica never pass the
//! cluster's bound; a cancel on any replica ends it everywhere; `kill -9` of the replica
//! holding a client's stream → the client resumes on another after its last event id; `kill -9`
//! of the replica running the task → another takes it after `ack_wait` and goes on after the
//! tokens already sent (no number of the count missing or repeated).

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use support::default_model_path;
use support::nats::NatsCluster;
use support::procs::*;
use support::Ev;

const COUNT: &str = "Count from 1 to 1000: 1, 2, 3, 4, 5,";

fn replica_config(extra: &str) -> String {
    format!(
        "[cluster]\nheartbeat_ms = 200\nack_wait_ms = 2000\n\n[queue]\ncapacity = 1\n\n{extra}[[pools]]\nid = \"p\"\nmodel = \"{}\"\nslots = 1\nctx = 1024\nthreads = 1\n",
        default_model_path()
    )
}

struct Replicas {
    nats: NatsCluster,
    procs: Vec<Option<Proc>>,
    bases: Vec<String>,
}

impl Replicas {
    async fn start(n: usize, extra: &str) -> Self {
        Self::start_with(n, &replica_config(extra), n).await
    }

    /// `n` replicas of `config`, once each lists `pools` pools.
    async fn start_with(n: usize, config: &str, pools: usize) -> Self {
        let nats = NatsCluster::start(3).await;
        let urls = nats.urls();
        let (mut procs, mut bases) = (Vec::new(), Vec::new());
        for i in 0..n {
            let name = format!("r{i}");
            let env = [
                ("ORCHD_CLUSTER_NATS", urls.as_str()),
                ("ORCHD_REPLICA_ID", name.as_str()),
            ];
            let (p, base) = server_env(config, &env).await;
            procs.push(Some(p));
            bases.push(base);
        }
        // every replica knows every other's slots (the bound counts them)
        for base in &bases {
            let seen = eventually(Duration::from_secs(10), || async {
                let v: Value = match reqwest::get(format!("{base}/v1/pools")).await {
                    Ok(r) => r.json().await.unwrap_or_default(),
                    Err(_) => return false,
                };
                v["pools"].as_array().map_or(0, |a| a.len()) == pools
            })
            .await;
            assert!(seen, "{base} does not list every replica's pool");
        }
        Self { nats, procs, bases }
    }

    fn log(&self, i: usize) -> String {
        self.procs[i]
            .as_ref()
            .map_or(String::new(), |p| p.log_text())
    }

    fn logs(&self) -> String {
        (0..self.procs.len())
            .map(|i| format!("--- r{i}\n{}", self.log(i)))
            .collect()
    }

    /// The replica that took `id` from the queue first (from its log).
    fn runner_of(&self, id: &str) -> Option<usize> {
        self.taker_of(id, 1)
    }

    /// The replica that took `id` from the queue for the `delivered`th time (from its log).
    fn taker_of(&self, id: &str, delivered: u32) -> Option<usize> {
        let mark = format!("delivered={delivered}");
        (0..self.procs.len()).find(|&i| {
            self.log(i)
                .lines()
                .any(|l| l.contains("cluster: task taken") && l.contains(id) && l.ends_with(&mark))
        })
    }

    fn kill(&mut self, i: usize) {
        if let Some(p) = self.procs[i].take() {
            p.signal("-9");
        }
    }
}

async fn submit(base: &str, body: Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{base}/v1/tasks"))
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn submit_ok(base: &str, body: Value) -> String {
    let r = submit(base, body).await;
    assert_eq!(r.status(), 202, "{:?}", r.text().await);
    r.json::<Value>().await.unwrap()["task_id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Reads `base`'s stream of `id` (after `last_id`) to its end, or until `stop` says so.
async fn read_stream(
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
        events.extend(support::parse_frames(&mut buf));
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

fn text_of(events: &[Ev]) -> String {
    events
        .iter()
        .filter(|e| e.event == "token")
        .map(|e| e.data["t"].as_str().unwrap().to_string())
        .collect()
}

/// The numbers of a count, in order (the model counts "6, 7, 8, …").
fn numbers(text: &str) -> Vec<u64> {
    text.split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect()
}

/// The events' ids are 0, 1, 2, … with no gap or repeat, and exactly one terminal event, last.
fn assert_whole(events: &[Ev], what: &str) {
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

/// CLU-TASK-1: tasks admitted on one replica spread over the replicas' free slots, stream from
/// any replica with the same events and ids, and give the answer one box gives; admissions at
/// once on every replica never pass the cluster's bound; a cancel on any replica ends a task
/// everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_run_on_any_replica_and_stream_from_any() {
    let r = Replicas::start(3, "").await;
    let b = &r.bases;
    // three at once on r0: its one slot takes one, the others' slots the rest
    let mut ids = Vec::new();
    for i in 0..3 {
        ids.push(
            submit_ok(
                &b[0],
                json!({"prompt": format!("{COUNT} (list {i})"), "max_tokens": 24, "temperature": 0}),
            )
            .await,
        );
    }
    let mut texts = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        // followed from another replica than the one it was admitted on, and from that one
        let elsewhere = read_stream(&b[1 + i % 2], id, None, |_| false).await;
        let admitted_on = read_stream(&b[0], id, None, |_| false).await;
        assert_whole(&elsewhere, "followed from another replica");
        assert_eq!(
            elsewhere, admitted_on,
            "the same events and ids on every replica"
        );
        assert_eq!(elsewhere.last().unwrap().event, "end", "{elsewhere:?}");
        texts.push(text_of(&elsewhere));
    }
    // the record, from a replica that neither admitted nor followed the first task
    let rec = eventually(Duration::from_secs(5), || async {
        let v: Value = reqwest::get(format!("{}/v1/artifacts/{}", b[2], ids[0]))
            .await
            .unwrap()
            .json()
            .await
            .unwrap_or_default();
        v["terminal"]["event"] == "end"
    })
    .await;
    let stored: Value = reqwest::get(format!("{}/v1/artifacts/{}", b[2], ids[0]))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(rec, "no record of the first task on r2: {stored}");
    assert_eq!(stored["tokens_out"], 24, "{stored}");
    assert_eq!(
        stored["transcript"].as_array().map(Vec::len),
        Some(read_stream(&b[1], &ids[0], None, |_| false).await.len()),
        "{stored}"
    );
    // a client's own task id, with the `.` and `:` a subject would split on
    let own = "report.2026-11:a";
    submit_ok(
        &b[0],
        json!({"task_id": own, "prompt": COUNT, "max_tokens": 4}),
    )
    .await;
    let events = read_stream(&b[2], own, None, |_| false).await;
    assert_whole(&events, own);
    assert_eq!(events.last().unwrap().event, "end", "{events:?}");
    for line in r
        .logs()
        .lines()
        .filter(|l| l.contains("cluster: task taken"))
    {
        eprintln!("{line}");
    }
    let runners: BTreeSet<usize> = ids.iter().filter_map(|id| r.runner_of(id)).collect();
    assert!(runners.len() >= 2, "all ran on {runners:?}:\n{}", r.logs());
    // greedy: the answer one box gives (each replica has the same model)
    let one_box = support::procs::server(&format!(
        "[[pools]]\nid = \"p\"\nmodel = \"{}\"\nslots = 1\nctx = 1024\nthreads = 1\n",
        default_model_path()
    ))
    .await;
    for (i, text) in texts.iter().enumerate() {
        let id = submit_ok(
            &one_box.1,
            json!({"prompt": format!("{COUNT} (list {i})"), "max_tokens": 24, "temperature": 0}),
        )
        .await;
        let alone = read_stream(&one_box.1, &id, None, |_| false).await;
        assert_eq!(&text_of(&alone), text, "task {i}: cluster vs one box");
    }
    drop(one_box);

    // the bound: capacity 1 + three slots = 4 tasks of a class, queued or running, whatever
    // the replica admitting them (the ended tasks' places are given back right after their
    // last event)
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut burst = tokio::task::JoinSet::new();
    for i in 0..12 {
        let base = b[i % 3].clone();
        burst.spawn(async move {
            let r = submit(&base, json!({"prompt": COUNT, "max_tokens": 400})).await;
            let status = r.status().as_u16();
            let retry = r.headers().contains_key("retry-after");
            let body: Value = r.json().await.unwrap_or_default();
            (status, retry, body["task_id"].as_str().map(String::from))
        });
    }
    let (mut admitted, mut refused) = (Vec::new(), 0);
    while let Some(out) = burst.join_next().await {
        match out.unwrap() {
            (202, _, Some(id)) => admitted.push(id),
            (429, true, _) => refused += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    assert_eq!(admitted.len(), 4, "admitted {admitted:?}\n{}", r.logs());
    assert_eq!(refused, 8);

    // a cancel on r2 ends each everywhere at once, wherever it runs
    let client = reqwest::Client::new();
    for id in &admitted {
        let sent = Instant::now();
        let c = client
            .post(format!("{}/v1/tasks/{id}/cancel", b[2]))
            .send()
            .await
            .unwrap();
        assert_eq!(c.status(), 204);
        for base in &b[..2] {
            let events = read_stream(base, id, None, |_| false).await;
            assert_whole(&events, "a cancelled task");
            assert_eq!(
                events.last().unwrap().data["finish_reason"],
                "cancelled",
                "{id} on {base}: {} events, cancel sent {:?} ago\n{}",
                events.len(),
                sent.elapsed(),
                r.logs()
            );
        }
        eprintln!(
            "cancel of {id} through r2: ended on r0 and r1 within {:?}",
            sent.elapsed()
        );
    }
    // the places are free again once the takers dropped the cancelled tasks still queued
    let free = eventually(Duration::from_secs(5), || async {
        submit(&b[1], json!({"prompt": COUNT, "max_tokens": 4}))
            .await
            .status()
            == 202
    })
    .await;
    assert!(
        free,
        "no place freed after the cancels:
{}",
        r.logs()
    );
}

/// CLU-TASK-2: `kill -9` of the replica a client streams from: the client resumes on another
/// with `Last-Event-ID` and gets every later event once; `kill -9` of the replica running the
/// task: another takes it after `ack_wait` and goes on after the tokens already sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replica_loses_no_token_of_a_stream() {
    let mut r = Replicas::start(3, "").await;
    let body = json!({"prompt": COUNT, "max_tokens": 160, "temperature": 0});

    // the replica holding the stream dies
    let id = submit_ok(&r.bases[0], body.clone()).await;
    let runner = loop {
        if let Some(i) = r.runner_of(&id) {
            break i;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let follower = (runner + 1) % 3;
    let spare = (runner + 2) % 3;
    let first = read_stream(&r.bases[follower], &id, None, |e| {
        e.iter().filter(|e| e.event == "token").count() >= 10
    })
    .await;
    r.kill(follower);
    let last = first.last().unwrap().id.unwrap();
    let rest = read_stream(&r.bases[spare], &id, Some(last), |_| false).await;
    let whole: Vec<Ev> = first.into_iter().chain(rest).collect();
    assert_whole(&whole, "resumed on another replica");
    let count = numbers(&text_of(&whole));
    let want: Vec<u64> = (6..6 + count.len() as u64).collect();
    assert_eq!(count, want, "the count across the resume");
    eprintln!(
        "stream resumed after id {last} on r{spare}: {} events in all",
        whole.len()
    );

    // the replica running the task dies: one of the two left takes it after ack_wait
    let id = submit_ok(&r.bases[spare], body.clone()).await;
    let runner = loop {
        if let Some(i) = r.runner_of(&id) {
            break i;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let left: Vec<usize> = (0..3).filter(|&i| i != follower && i != runner).collect();
    let watcher = left[0];
    let base = r.bases[watcher].clone();
    let (tx, mut rx) = tokio::sync::watch::channel(0usize);
    let id2 = id.clone();
    let reader = tokio::spawn(async move {
        read_stream(&base, &id2, None, move |e| {
            let _ = tx.send(e.iter().filter(|e| e.event == "token").count());
            false
        })
        .await
    });
    tokio::time::timeout(Duration::from_secs(60), rx.wait_for(|n| *n >= 10))
        .await
        .expect("tokens before the kill")
        .unwrap();
    let killed = Instant::now();
    r.kill(runner);
    let events = tokio::time::timeout(Duration::from_secs(120), reader)
        .await
        .expect("the task ends after its runner died")
        .unwrap();
    assert_whole(&events, "after the runner died");
    assert_eq!(events.last().unwrap().event, "end", "{:?}", events.last());
    let tokens = events.iter().filter(|e| e.event == "token").count();
    assert_eq!(tokens, 160, "every token once");
    assert_eq!(events.last().unwrap().data["tokens_out"], 160);
    let count = numbers(&text_of(&events));
    let want: Vec<u64> = (6..6 + count.len() as u64).collect();
    assert_eq!(count, want, "the count across the takeover");
    let taken_again = r.taker_of(&id, 2);
    assert_eq!(taken_again, Some(watcher), "{}", r.logs());
    eprintln!(
        "runner r{runner} killed: r{watcher} finished the task {:?} later",
        killed.elapsed()
    );
}

/// CLU-TASK-3: the replica running a task is stopped (`SIGSTOP`) past `ack_wait`: another takes
/// the task and finishes it; when the stopped one runs again it finds another appending to the
/// task and stops its own run — the stream followed elsewhere has every token once and one end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_runner_that_comes_back_appends_nothing() {
    let r = Replicas::start(3, "").await;
    let id = submit_ok(
        &r.bases[0],
        json!({"prompt": COUNT, "max_tokens": 120, "temperature": 0}),
    )
    .await;
    let runner = loop {
        if let Some(i) = r.runner_of(&id) {
            break i;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let watcher = (runner + 1) % 3;
    let first = read_stream(&r.bases[watcher], &id, None, |e| {
        e.iter().filter(|e| e.event == "token").count() >= 10
    })
    .await;
    let stopped = r.procs[runner].as_ref().unwrap();
    stopped.signal("-STOP");
    let stopped_at = Instant::now();
    let last = first.last().unwrap().id.unwrap();
    let rest = tokio::time::timeout(
        Duration::from_secs(120),
        read_stream(&r.bases[watcher], &id, Some(last), |_| false),
    )
    .await
    .expect("another replica finishes the task");
    let finished = stopped_at.elapsed();
    stopped.signal("-CONT");
    // the one that came back finds another's events after its own, and stops
    let noticed = eventually(Duration::from_secs(10), || async {
        r.log(runner)
            .contains("another replica appended to the task")
    })
    .await;
    assert!(noticed, "{}", r.logs());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let whole = read_stream(&r.bases[(runner + 2) % 3], &id, None, |_| false).await;
    assert_eq!(whole, first.into_iter().chain(rest).collect::<Vec<_>>());
    assert_whole(&whole, "after the runner was stopped and came back");
    assert_eq!(whole.last().unwrap().event, "end");
    assert_eq!(whole.iter().filter(|e| e.event == "token").count(), 120);
    let count = numbers(&text_of(&whole));
    let want: Vec<u64> = (6..6 + count.len() as u64).collect();
    assert_eq!(count, want, "the count across the takeover");
    let taker = r.taker_of(&id, 2);
    assert!(taker.is_some_and(|t| t != runner), "{taker:?}");
    eprintln!(
        "r{runner} stopped: the task finished on r{} {finished:?} later",
        taker.unwrap()
    );
}

/// CLU-TASK-4: a remote worker connected to one replica serves a task admitted on another (its
/// model's queue is the cluster's); a cancel on the admitting replica stops it on the worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_on_one_replica_serves_tasks_admitted_on_another() {
    const SECRET: &str = "cluster-worker-secret-0123456789";
    let cfg = format!(
        "pools = []\n[cluster]\nheartbeat_ms = 200\nack_wait_ms = 2000\n[workers]\nsecret = \"{SECRET}\"\nheartbeat_interval_ms = 200\npong_timeout_ms = 1000\n"
    );
    let r = Replicas::start_with(2, &cfg, 0).await;
    let _w = worker(
        &r.bases[0],
        SECRET,
        "w",
        &worker_config(&default_model_path(), 1),
        &[],
    );
    // r1 learns of the worker's pool on r0 from the directory
    let b1 = r.bases[1].clone();
    let seen = eventually(Duration::from_secs(60), || async {
        let v: Value = match reqwest::get(format!("{b1}/v1/pools")).await {
            Ok(r) => r.json().await.unwrap_or_default(),
            Err(_) => return false,
        };
        v["pools"].as_array().is_some_and(|a| {
            a.iter()
                .any(|p| p["replica"] == "r0" && p["model_alias"] == "smol" && p["ready"] == true)
        })
    })
    .await;
    assert!(seen, "r1 never listed the worker's pool:\n{}", r.logs());
    let id = submit_ok(
        &r.bases[1],
        json!({"model": "smol", "prompt": COUNT, "max_tokens": 24, "temperature": 0}),
    )
    .await;
    let events = read_stream(&r.bases[1], &id, None, |_| false).await;
    assert_whole(&events, "a worker's task followed where it was admitted");
    assert_eq!(events.last().unwrap().event, "end", "{:?}", events.last());
    assert_eq!(events.iter().filter(|e| e.event == "token").count(), 24);
    let count = numbers(&text_of(&events));
    assert_eq!(count, (6..6 + count.len() as u64).collect::<Vec<_>>());
    assert_eq!(r.runner_of(&id), Some(0), "{}", r.logs());

    // a cancel where it was admitted stops it on the worker: its slot is free again
    let id = submit_ok(
        &r.bases[1],
        json!({"model": "smol", "prompt": COUNT, "max_tokens": 400}),
    )
    .await;
    let some = read_stream(&r.bases[1], &id, None, |e| {
        e.iter().filter(|e| e.event == "token").count() >= 5
    })
    .await;
    assert!(some.iter().all(|e| e.event != "end"));
    let c = reqwest::Client::new()
        .post(format!("{}/v1/tasks/{id}/cancel", r.bases[1]))
        .send()
        .await
        .unwrap();
    assert_eq!(c.status(), 204);
    let b0 = r.bases[0].clone();
    let freed = eventually(Duration::from_secs(3), || async {
        let v: Value = match reqwest::get(format!("{b0}/v1/pools")).await {
            Ok(r) => r.json().await.unwrap_or_default(),
            Err(_) => return false,
        };
        v["pools"].as_array().is_some_and(|a| {
            a.iter().any(|p| {
                p["replica"] == "r0" && p["slots_free"] == 1 && p["metrics"]["tasks_finished"] == 2
            })
        })
    })
    .await;
    assert!(
        freed,
        "the worker still runs the cancelled task:\n{}",
        r.logs()
    );
    let ended = read_stream(&r.bases[1], &id, None, |_| false).await;
    assert_eq!(ended.last().unwrap().data["finish_reason"], "cancelled");
}

/// The NATS node (index) leading the stream `stream` now, from the nodes' monitoring endpoints.
async fn stream_leader(nats: &NatsCluster, stream: &str) -> Option<usize> {
    for port in &nats.http_ports {
        let url = format!("http://127.0.0.1:{port}/jsz?streams=true&accounts=true");
        let Ok(r) = reqwest::get(&url).await else {
            continue;
        };
        let v: Value = r.json().await.unwrap_or_default();
        for account in v["account_details"].as_array().into_iter().flatten() {
            for s in account["stream_detail"].as_array().into_iter().flatten() {
                if s["name"] == stream {
                    if let Some(l) = s["cluster"]["leader"].as_str() {
                        return l.trim_start_matches('n').parse().ok();
                    }
                }
            }
        }
    }
    None
}

/// CLU-TASK-5: `kill -9` of the NATS node leading the queue's stream in the middle of a burst
/// of admissions through three replicas: every task answered 202 runs to its end (a client
/// retries what was not answered, with the same task id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_admitted_task_is_lost_when_the_queue_leader_dies() {
    let cfg = replica_config("").replace("capacity = 1", "capacity = 500");
    let mut r = Replicas::start_with(3, &cfg, 3).await;
    // the model's queue exists once a task went through it
    let first = submit_ok(&r.bases[0], json!({"prompt": "Hi", "max_tokens": 1})).await;
    read_stream(&r.bases[0], &first, None, |_| false).await;
    let pools: Value = reqwest::get(format!("{}/v1/pools", r.bases[0]))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let alias = pools["pools"][0]["model_alias"]
        .as_str()
        .unwrap()
        .to_string();
    // the stream's name as the queue spells it (`cluster/task_queue.rs`: hex past [A-Za-z0-9_-])
    let name = format!("model-{alias}");
    let token = if name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        name
    } else {
        let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
        format!("x{hex}")
    };
    let stream = format!("ORCHD_QUEUE_{token}");
    let leader = stream_leader(&r.nats, &stream)
        .await
        .unwrap_or_else(|| panic!("no leader of {stream}"));
    let retried = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut burst = tokio::task::JoinSet::new();
    for i in 0..90 {
        let base = r.bases[i % 3].clone();
        let retried = retried.clone();
        burst.spawn(async move {
            let id = format!("burst-{i}");
            for _ in 0..100 {
                let sent = reqwest::Client::new()
                    .post(format!("{base}/v1/tasks"))
                    .json(&json!({"task_id": id, "prompt": format!("Say {i}."), "max_tokens": 2}))
                    .send()
                    .await;
                match sent.map(|r| r.status().as_u16()) {
                    Ok(202) => return Some((base, id)),
                    Ok(429) => return None,
                    _ => {
                        retried.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            panic!("{id}: never answered");
        });
        if i == 20 {
            r.nats.kill(leader);
        }
    }
    let mut admitted = Vec::new();
    while let Some(out) = burst.join_next().await {
        if let Some(a) = out.unwrap() {
            admitted.push(a);
        }
    }
    assert_eq!(admitted.len(), 90, "refused: {}", 90 - admitted.len());
    for (base, id) in &admitted {
        let events = tokio::time::timeout(
            Duration::from_secs(60),
            read_stream(base, id, None, |_| false),
        )
        .await
        .unwrap_or_else(|_| panic!("{id} never ended:\n{}", r.logs()));
        assert_whole(&events, id);
        assert_eq!(
            events.last().unwrap().event,
            "end",
            "{id}: {:?}",
            events.last()
        );
    }
    eprintln!(
        "node n{leader} (the queue's leader) killed during 90 admissions: {} retried, all 90 ran to their end",
        retried.load(std::sync::atomic::Ordering::Relaxed)
    );
}
