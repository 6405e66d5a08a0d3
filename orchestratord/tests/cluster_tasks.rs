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

use serde_json::{json, Value};
use support::default_model_path;
use support::nats::NatsCluster;
use support::procs::*;
use support::task_client::*;
use support::Ev;

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
            let seen = lists_pools(base, pools, Duration::from_secs(10)).await;
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

    /// Each replica's log lines that name `id` (what happened to one task).
    fn lines_naming(&self, id: &str) -> String {
        // the id whole: "burst-6" is not in "burst-65"
        let names = |l: &str| {
            l.match_indices(id).any(|(at, _)| {
                !l[at + id.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-')
            })
        };
        let mut out = String::new();
        for i in 0..self.procs.len() {
            out.push_str(&format!("--- r{i}\n"));
            for l in self.log(i).lines().filter(|l| names(l)) {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
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

    /// The replica that took `id` first, once one did.
    async fn runner(&self, id: &str) -> usize {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(i) = self.runner_of(id) {
                return i;
            }
            assert!(
                Instant::now() < until,
                "no replica took {id} first:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Follows `id` on `watcher` until `tokens` tokens came, stops (`SIGSTOP`) `runner`, and
    /// reads the rest on `watcher` while it stays stopped: the whole stream, and how long
    /// after the stop it ended.
    async fn stream_across_a_stopped_runner(
        &self,
        id: &str,
        runner: usize,
        watcher: usize,
        tokens: usize,
    ) -> (Vec<Ev>, Duration) {
        let first = read_stream(&self.bases[watcher], id, None, |e| {
            e.iter().filter(|e| e.event == "token").count() >= tokens
        })
        .await;
        self.procs[runner].as_ref().unwrap().signal("-STOP");
        let stopped_at = Instant::now();
        let last = first.last().unwrap().id.unwrap();
        let rest = tokio::time::timeout(
            Duration::from_secs(120),
            read_stream(&self.bases[watcher], id, Some(last), |_| false),
        )
        .await
        .expect("the task ends while its runner is stopped");
        (
            first.into_iter().chain(rest).collect(),
            stopped_at.elapsed(),
        )
    }

    /// Lets the stopped `runner` run again; it must find another replica's events after its
    /// own and stop its run.
    async fn resume_stopped(&self, runner: usize) {
        self.procs[runner].as_ref().unwrap().signal("-CONT");
        let noticed = eventually(Duration::from_secs(10), || async {
            self.log(runner)
                .contains("another replica appended to the task")
        })
        .await;
        assert!(noticed, "{}", self.logs());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    fn kill(&mut self, i: usize) {
        if let Some(p) = self.procs[i].take() {
            p.signal("-9");
        }
    }
}

/// Task `id`'s record on the replica at `base` once it has ended there (within 5 s), or what
/// it shows then.
/// The pools `base` lists (its own and the cluster's); none when it does not answer.
async fn pools_of(base: &str) -> Vec<Value> {
    let v: Value = match reqwest::get(format!("{base}/v1/pools")).await {
        Ok(r) => r.json().await.unwrap_or_default(),
        Err(_) => return Vec::new(),
    };
    v["pools"].as_array().cloned().unwrap_or_default()
}

async fn ended_record(base: &str, id: &str) -> Value {
    let read = || async {
        reqwest::get(format!("{base}/v1/artifacts/{id}"))
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap_or_default()
    };
    eventually(Duration::from_secs(5), || async {
        read().await["terminal"]["event"] == "end"
    })
    .await;
    read().await
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
    let stored = ended_record(&b[2], &ids[0]).await;
    assert!(
        stored["terminal"]["event"] == "end",
        "no record of the first task on r2: {stored}"
    );
    assert_eq!(stored["tokens_out"], 24, "{stored}");
    // issue 49: where it ran, as the replica running it said
    let ran_on = r.runner_of(&ids[0]).map(|i| format!("r{i}"));
    assert_eq!(
        (
            &stored["pool_id"],
            &stored["engine"],
            stored["replica"].as_str().map(String::from)
        ),
        (&json!("p"), &json!("candle"), ran_on),
        "{stored}"
    );
    assert!(
        stored["model_ref"]
            .as_str()
            .is_some_and(|m| m.ends_with(".gguf")),
        "{stored}"
    );
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
    // a task read first after its end, on a replica that neither admitted nor ran it, is
    // replayed there at once: its record still times it as it ran (the relay's times)
    let late = submit_ok(&b[0], json!({"prompt": COUNT, "max_tokens": 8})).await;
    let on_r0 = read_stream(&b[0], &late, None, |_| false).await;
    assert_eq!(on_r0.last().unwrap().event, "end", "{on_r0:?}");
    let ran = r.runner_of(&late);
    let here = ended_record(&b[0], &late).await;
    for k in (1..3).filter(|k| Some(*k) != ran) {
        assert_eq!(read_stream(&b[k], &late, None, |_| false).await, on_r0);
        let adopted = ended_record(&b[k], &late).await;
        let t = &adopted["timings"];
        let ms = |v: &Value, f: &str| v[f].as_u64().unwrap_or(0);
        assert!(
            ms(t, "ttft_ms") > 0
                && ms(t, "decode_time_ms") > 0
                && ms(t, "total_ms") > ms(t, "ttft_ms"),
            "replayed on r{k}: {adopted}\nfollowed live on r0: {here}"
        );
    }
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
    // issue 49: a cancelled task's record, read on any replica, times what it decoded
    for id in &admitted {
        let stored = ended_record(&b[1], id).await;
        assert!(stored["terminal"]["event"] == "end", "{stored}");
        if stored["tokens_out"].as_u64().unwrap_or(0) > 1 {
            assert!(
                stored["terminal"]["decode_time_ms"].as_u64() > Some(0)
                    && stored["timings"]["decode_time_ms"].as_u64() > Some(0),
                "{stored}"
            );
        }
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

/// CLU-PATH-1: a replica with a free slot runs what it admits itself, at once: tasks admitted
/// one at a time on r1 each run on r1 (taken from the queue by r1, no other replica's look
/// in between), and its clients read the same events with the same ids as another replica's;
/// a cancel on r1 of one running there ends it with one terminal everywhere (the same end, a
/// token in flight at most before it elsewhere), and its slot takes the next task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_a_free_slot_runs_what_it_admits() {
    let r = Replicas::start(3, "").await;
    let b = &r.bases;
    for i in 0..4 {
        let id = submit_ok(
            &b[1],
            json!({"prompt": format!("{COUNT} (run {i})"), "max_tokens": 8, "temperature": 0}),
        )
        .await;
        let here = read_stream(&b[1], &id, None, |_| false).await;
        assert_whole(&here, "admitted and run on r1");
        assert_eq!(here.last().unwrap().event, "end", "{here:?}");
        assert_eq!(r.runner_of(&id), Some(1), "task {i}\n{}", r.logs());
        let elsewhere = read_stream(&b[2], &id, None, |_| false).await;
        assert_eq!(elsewhere, here, "the same events and ids on r2");
    }
    let id = submit_ok(
        &b[1],
        json!({"prompt": COUNT, "max_tokens": 300, "temperature": 0}),
    )
    .await;
    read_stream(&b[1], &id, None, |e| {
        e.iter().filter(|e| e.event == "token").count() >= 3
    })
    .await;
    assert_eq!(r.runner_of(&id), Some(1), "{}", r.logs());
    let c = reqwest::Client::new()
        .post(format!("{}/v1/tasks/{id}/cancel", b[1]))
        .send()
        .await
        .unwrap();
    assert_eq!(c.status(), 204);
    let here = read_stream(&b[1], &id, None, |_| false).await;
    assert_whole(&here, "cancelled where it ran");
    assert_eq!(here.last().unwrap().data["finish_reason"], "cancelled");
    assert!(
        here.iter().filter(|e| e.event == "token").count() < 300,
        "{here:?}"
    );
    // elsewhere, the same events and the same end; a token whose append was in flight when
    // the cancel came may stand before it there (the run had put it on the relay)
    let elsewhere = read_stream(&b[0], &id, None, |_| false).await;
    assert_whole(&elsewhere, "a task cancelled on another replica");
    let (end_here, end_there) = (here.last().unwrap(), elsewhere.last().unwrap());
    assert_eq!(
        (&end_there.event, &end_there.data["finish_reason"]),
        (&end_here.event, &end_here.data["finish_reason"]),
        "{elsewhere:?}\n{here:?}"
    );
    assert!(
        elsewhere.starts_with(&here[..here.len() - 1])
            && (here.len()..=here.len() + 1).contains(&elsewhere.len()),
        "r0: {elsewhere:?}\nr1: {here:?}"
    );
    // the end reaches clients before the engine has let the slot go; once r1 says it is
    // free, the next task admitted there runs there
    let b1 = b[1].clone();
    let freed = eventually(Duration::from_secs(3), || async {
        pools_of(&b1)
            .await
            .iter()
            .any(|p| p["replica"] == "r1" && p["slots_free"] == 1)
    })
    .await;
    assert!(
        freed,
        "r1's slot stays taken after the cancel\n{}",
        r.logs()
    );
    let next = submit_ok(&b[1], json!({"prompt": COUNT, "max_tokens": 4})).await;
    let events = read_stream(&b[1], &next, None, |_| false).await;
    assert_eq!(events.last().unwrap().event, "end", "{events:?}");
    assert_eq!(r.runner_of(&next), Some(1), "{}", r.logs());
    // CLU-PATH-2: a task id sent again to r0, which never saw it and has its slot free: r0's
    // run starts before the stream says the task is there already, and is withdrawn — the
    // same events, nothing run twice, no start counted on r0
    let body = json!({"task_id": "sent-twice", "prompt": COUNT, "max_tokens": 6, "temperature": 0});
    let id = submit_ok(&b[1], body.clone()).await;
    let first = read_stream(&b[1], &id, None, |_| false).await;
    assert_whole(&first, "the first time");
    let started_on_r0 = || async {
        let text = reqwest::get(format!("{}/metrics", b[0]))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        support::counter(&text, "orchd_tasks_started_total{pool=\"p\"}")
    };
    let before = started_on_r0().await;
    let again = submit_ok(&b[0], body).await;
    assert_eq!(again, id);
    let resent = read_stream(&b[0], &id, None, |_| false).await;
    assert_eq!(resent, first, "the resent task's events on r0");
    assert_eq!(r.runner_of(&id), Some(1), "{}", r.logs());
    assert_eq!(
        started_on_r0().await,
        before,
        "r0 counted a start\n{}",
        r.logs()
    );
    let b0 = b[0].clone();
    let free = eventually(Duration::from_secs(3), || async {
        pools_of(&b0)
            .await
            .iter()
            .any(|p| p["replica"] == "r0" && p["slots_free"] == 1)
    })
    .await;
    assert!(free, "r0's slot stays taken\n{}", r.logs());
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
    let runner = r.runner(&id).await;
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
    let runner = r.runner(&id).await;
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
    let runner = r.runner(&id).await;
    let watcher = (runner + 1) % 3;
    let (seen, finished) = r
        .stream_across_a_stopped_runner(&id, runner, watcher, 10)
        .await;
    r.resume_stopped(runner).await;
    let whole = read_stream(&r.bases[(runner + 2) % 3], &id, None, |_| false).await;
    assert_eq!(whole, seen);
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
        pools_of(&b1)
            .await
            .iter()
            .any(|p| p["replica"] == "r0" && p["model_alias"] == "smol" && p["ready"] == true)
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
        pools_of(&b0).await.iter().any(|p| {
            p["replica"] == "r0" && p["slots_free"] == 1 && p["metrics"]["tasks_finished"] == 2
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

    // the worker directory is the cluster's: r1 lists the worker connected to r0, and a drain
    // sent to r1 drains it on r0
    let workers: Value = reqwest::get(format!("{}/v1/workers", r.bases[1]))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let listed = &workers["workers"][0];
    assert_eq!(listed["replica"], "r0", "{workers}");
    assert_eq!(listed["models"], json!(["smol"]), "{workers}");
    let wid = listed["worker_id"].as_str().unwrap().to_string();
    let client = reqwest::Client::new();
    let unknown = client
        .post(format!("{}/v1/workers/w-nobody/drain", r.bases[1]))
        .json(&json!({"deadline_ms": 1000}))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let drained = client
        .post(format!("{}/v1/workers/{wid}/drain", r.bases[1]))
        .json(&json!({"deadline_ms": 5000}))
        .send()
        .await
        .unwrap();
    assert_eq!(drained.status(), 202, "{:?}", drained.text().await);
    let drained: Value = drained.json().await.unwrap();
    assert_eq!(drained["draining"], true, "{drained}");
    assert_eq!(drained["replica"], "r0", "{drained}");
    let on_r0: Value = reqwest::get(format!("{b0}/v1/workers"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let here = on_r0["workers"]
        .as_array()
        .and_then(|a| a.iter().find(|w| w["worker_id"] == wid.as_str()));
    // drained with nothing running: its socket may be closed already
    assert!(
        here.is_none_or(|w| w["draining"] == true),
        "r0 still has the worker undrained: {on_r0}"
    );
}

/// One replica `r{i}` of each of `configs`, on the NATS cluster at `urls`: their processes
/// and base URLs.
async fn replicas_of(urls: &str, configs: &[String]) -> (Vec<Proc>, Vec<String>) {
    let (mut procs, mut bases) = (Vec::new(), Vec::new());
    for (i, cfg) in configs.iter().enumerate() {
        let name = format!("r{i}");
        let env = [
            ("ORCHD_CLUSTER_NATS", urls),
            ("ORCHD_REPLICA_ID", name.as_str()),
        ];
        let (p, base) = server_env(cfg, &env).await;
        procs.push(p);
        bases.push(base);
    }
    (procs, bases)
}

/// The NATS node (index) leading the stream `stream` now, from the nodes' monitoring endpoints.
async fn stream_leader(nats: &NatsCluster, stream: &str) -> Option<usize> {
    for port in &nats.http_ports {
        let url = format!("http://127.0.0.1:{port}/jsz?streams=true&accounts=true");
        // a stopped node does not answer
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        let Ok(r) = client.get(&url).send().await else {
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

/// The name of the stream of the model queue of `base`'s first pool, as the queue spells it
/// (`cluster/subject_token.rs`: hex past [A-Za-z0-9_-]).
async fn model_queue_stream(base: &str) -> String {
    let pools = get_json(&format!("{base}/v1/pools")).await;
    let alias = pools["pools"][0]["model_alias"].as_str().unwrap();
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
    format!("ORCHD_QUEUE_{token}")
}

/// Submits `body` with task id `id` to `base` until it is answered 202 or 429 (a 503 while
/// the cluster elects a leader, or no answer, is tried again); the status, and how many tries
/// it took past the first.
async fn submit_until_answered(base: &str, id: &str, body: &Value) -> (u16, usize) {
    let mut body = body.clone();
    body["task_id"] = json!(id);
    for tries in 0..300 {
        let sent = reqwest::Client::new()
            .post(format!("{base}/v1/tasks"))
            .timeout(Duration::from_secs(5))
            .json(&body)
            .send()
            .await;
        match sent {
            Ok(r) if r.status() == 202 => return (202, tries),
            Ok(r) if r.status() == 429 => {
                eprintln!("{id}: 429 {}", r.text().await.unwrap_or_default());
                return (429, tries);
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    panic!("{id}: never answered");
}

/// CLU-TASK-5: `kill -9` of the NATS node leading the queue's stream in the middle of a burst
/// of admissions through three replicas: every task answered 202 runs to its end (a client
/// retries what was not answered, with the same task id).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_admitted_task_is_lost_when_the_queue_leader_dies() {
    // the burst's line is long: no wait limit refuses its tail (what is tested is loss)
    let cfg = replica_config("[admission]\nmax_queue_wait_ms = 0\n\n")
        .replace("capacity = 1", "capacity = 500");
    let mut r = Replicas::start_with(3, &cfg, 3).await;
    // the model's queue exists once a task went through it
    let first = submit_ok(&r.bases[0], json!({"prompt": "Hi", "max_tokens": 1})).await;
    read_stream(&r.bases[0], &first, None, |_| false).await;
    let stream = model_queue_stream(&r.bases[0]).await;
    let leader = stream_leader(&r.nats, &stream)
        .await
        .unwrap_or_else(|| panic!("no leader of {stream}"));
    let mut burst = tokio::task::JoinSet::new();
    for i in 0..90 {
        let base = r.bases[i % 3].clone();
        burst.spawn(async move {
            let id = format!("burst-{i}");
            let body = json!({"prompt": format!("Say {i}."), "max_tokens": 2});
            let (status, tries) = submit_until_answered(&base, &id, &body).await;
            (status == 202).then_some((base, id, tries))
        });
        if i == 20 {
            r.nats.kill(leader);
        }
    }
    let (mut admitted, mut retried) = (Vec::new(), 0);
    while let Some(out) = burst.join_next().await {
        if let Some((base, id, tries)) = out.unwrap() {
            admitted.push((base, id));
            retried += tries;
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
            "{id}: {:?}\n{}",
            events.last(),
            r.lines_naming(id)
        );
    }
    let untried: usize = (0..3)
        .map(|i| r.log(i).matches("given back untried").count())
        .sum();
    eprintln!(
        "node n{leader} (the queue's leader) killed during 90 admissions: {retried} retried, {untried} given back untried, all 90 ran to their end"
    );
}

/// CLU-TASK-7: the admission leader is the queue stream's Raft leader. `SIGSTOP` of the NATS
/// node leading it past its election timeout: another node leads, admissions through every
/// replica go on (each retried until answered), and the bound still holds — of 12 long tasks
/// exactly the bound is admitted; after `SIGCONT` the old leader only follows, and the bound
/// holds still.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bound_holds_when_the_queue_leader_is_stopped() {
    let r = Replicas::start(3, "").await;
    let first = submit_ok(&r.bases[0], json!({"prompt": "Hi", "max_tokens": 1})).await;
    read_stream(&r.bases[0], &first, None, |_| false).await;
    let stream = model_queue_stream(&r.bases[0]).await;
    let leader = stream_leader(&r.nats, &stream)
        .await
        .unwrap_or_else(|| panic!("no leader of {stream}"));
    r.nats.signal(leader, "-STOP");
    let stopped = Instant::now();
    // long enough to outlast the burst's ~10 s and the checks after it: a task admitted early
    // in the burst ran 400 tokens to its end before them once (its place free, a 202)
    let long = json!({"prompt": COUNT, "max_tokens": 900});
    let mut burst = tokio::task::JoinSet::new();
    for i in 0..12 {
        let (base, long) = (r.bases[i % 3].clone(), long.clone());
        burst.spawn(async move {
            let id = format!("stopped-leader-{i}");
            let (status, tries) = submit_until_answered(&base, &id, &long).await;
            (status, tries, id)
        });
    }
    let (mut admitted, mut refused, mut retried) = (Vec::new(), 0, 0);
    while let Some(out) = burst.join_next().await {
        let (status, tries, id) = out.unwrap();
        retried += tries;
        match status {
            202 => admitted.push(id),
            _ => refused += 1,
        }
    }
    let answered_in = stopped.elapsed();
    // capacity 1 + three slots
    assert_eq!(admitted.len(), 4, "admitted {admitted:?}\n{}", r.logs());
    assert_eq!(refused, 8);
    r.nats.signal(leader, "-CONT");
    let now_leader = stream_leader(&r.nats, &stream).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    for i in 0..3 {
        let (status, _) = submit_until_answered(&r.bases[i], &format!("after-{i}"), &long).await;
        assert_eq!(
            status,
            429,
            "past the bound after the old leader came back\n{}",
            r.logs()
        );
    }
    eprintln!(
        "node n{leader} (the queue's leader) stopped: 12 admissions answered within {answered_in:?} ({retried} retries), 4 admitted; leader now {now_leader:?}"
    );
    for id in &admitted {
        reqwest::Client::new()
            .post(format!("{}/v1/tasks/{id}/cancel", r.bases[0]))
            .send()
            .await
            .unwrap();
    }
}

/// CLU-TASK-6: a task whose runners keep stopping is not taken for ever: past
/// `cluster.max_deliveries` runs (1 here) the replica that takes it next ends it
/// `REPLICA_EXHAUSTED` — the client's stream ends with that error after the tokens already
/// sent, its status says so on every replica, its place in the bound is free again, and the
/// stopped runner, when it comes back, appends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_whose_runners_keep_stopping_ends_replica_exhausted() {
    let cfg = replica_config("").replace(
        "ack_wait_ms = 2000",
        "ack_wait_ms = 2000\nmax_deliveries = 1",
    );
    let r = Replicas::start_with(2, &cfg, 2).await;
    let id = submit_ok(
        &r.bases[0],
        json!({"prompt": COUNT, "max_tokens": 400, "temperature": 0}),
    )
    .await;
    let runner = r.runner(&id).await;
    let watcher = 1 - runner;
    let (whole, ended_after) = r
        .stream_across_a_stopped_runner(&id, runner, watcher, 5)
        .await;
    assert_whole(&whole, "an exhausted task");
    let end = whole.last().unwrap();
    assert_eq!(end.event, "error", "{end:?}\n{}", r.logs());
    assert_eq!(end.data["code"], "REPLICA_EXHAUSTED", "{end:?}");
    assert_eq!(end.data["retriable"], true, "{end:?}");
    assert!(whole.iter().filter(|e| e.event == "token").count() >= 5);
    let status: Value = reqwest::get(format!("{}/v1/tasks/{id}", r.bases[watcher]))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["error_code"], "REPLICA_EXHAUSTED", "{status}");
    // its place is free: the bound (capacity 1 + 2 slots, one of them stopped) admits again
    let admitted = submit(&r.bases[watcher], json!({"prompt": COUNT, "max_tokens": 2})).await;
    assert_eq!(admitted.status(), 202, "{:?}", admitted.text().await);
    r.resume_stopped(runner).await;
    let again = read_stream(&r.bases[runner], &id, None, |_| false).await;
    assert_eq!(again, whole, "the runner that came back appended nothing");
    let status: Value = reqwest::get(format!("{}/v1/tasks/{id}", r.bases[runner]))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(status["error_code"], "REPLICA_EXHAUSTED", "{status}");
    eprintln!(
        "r{runner} stopped: the task ended REPLICA_EXHAUSTED on r{watcher} {ended_after:?} later"
    );
}

/// CLU-ETA-2: a replica answers with the cluster's line, not its own: r0 has no pool at all
/// (its own estimate would be "now"), r1 one slot with three long tasks on it. A task admitted
/// on r0 is told its place among the cluster's waiting tasks and a start seconds away; a task
/// whose deadline the line ahead makes late is refused 429 (`policy_label` `deadline`) and not
/// queued; a full queue's `Retry-After` is when the cluster's first slot frees up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_answers_with_the_clusters_line() {
    let nats = NatsCluster::start(3).await;
    let urls = nats.urls();
    // no longest queue wait: only the task's own deadline limits its wait (on a busy machine
    // the three long tasks alone would pass 30 s)
    let no_wait_limit = "[admission]\nmax_queue_wait_ms = 0\n\n";
    let cluster = format!(
        "[cluster]\nheartbeat_ms = 200\nack_wait_ms = 2000\n\n[queue]\ncapacity = 3\n\n{no_wait_limit}"
    );
    let configs = [
        format!("pools = []\n{cluster}"),
        replica_config(no_wait_limit).replace("[queue]\ncapacity = 1\n", "[queue]\ncapacity = 3\n"),
    ];
    let (procs, bases) = replicas_of(&urls, &configs).await;
    let logs = || -> String { procs.iter().map(|p| p.log_text()).collect() };
    let b0 = bases[0].clone();
    let listed = lists_pools(&b0, 1, Duration::from_secs(10)).await;
    assert!(listed, "r0 does not list r1's pool:\n{}", logs());
    let pools = get_json(&format!("{b0}/v1/pools")).await;
    let model = pools["pools"][0]["model_alias"]
        .as_str()
        .unwrap()
        .to_string();
    // a task through r0 first: r1's pace is confirmed by a real task
    let id = submit_ok(
        &b0,
        json!({"model": model, "prompt": COUNT, "max_tokens": 8}),
    )
    .await;
    read_stream(&b0, &id, None, |_| false).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let long = json!({"model": model, "prompt": COUNT, "max_tokens": 300});
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(submit_ok(&bases[1], long.clone()).await);
    }
    let running = eventually(Duration::from_secs(20), || async {
        let v: Value = reqwest::get(format!("{}/v1/tasks/{}", bases[1], ids[0]))
            .await
            .unwrap()
            .json()
            .await
            .unwrap_or_default();
        v["state"] == "running"
    })
    .await;
    assert!(running, "{}", logs());
    // r1 has announced its busy slot
    tokio::time::sleep(Duration::from_millis(600)).await;

    // a task whose deadline the line makes late: refused, not queued (behind 1 running and 2
    // queued tasks of 300 tokens: 2.4 s on a 2-core AVX-512 machine, more elsewhere)
    let late = submit(
        &b0,
        json!({"task_id": "late-1", "model": model, "prompt": COUNT, "max_tokens": 16, "deadline_ms": 1000}),
    )
    .await;
    assert_eq!(late.status(), 429, "{:?}", late.text().await);
    assert!(late.headers().contains_key("retry-after"));
    let body: Value = late.json().await.unwrap();
    assert_eq!(body["code"], "ADMISSION_REJECT", "{body}");
    assert_eq!(body["policy_label"], "deadline", "{body}");

    // one more without a deadline: its place and start are the cluster's
    let r = submit(&b0, long.clone()).await;
    assert_eq!(r.status(), 202, "{:?}", r.text().await);
    let admitted: Value = r.json().await.unwrap();
    ids.push(admitted["task_id"].as_str().unwrap().to_string());
    assert_eq!(admitted["queue_position"], 2, "{admitted}");
    let predicted = admitted["predicted_start_ms"].as_u64().unwrap();
    assert!(
        predicted >= 1000,
        "r0 predicted its own empty line: {admitted}"
    );
    eprintln!("behind 1 running and 2 queued on r1: r0 predicts a start in {predicted} ms");

    // the bound (3 + 1 slot) is reached: the 429's wait is the first slot's, before the queued
    // tasks start
    let full = submit(&b0, long.clone()).await;
    assert_eq!(full.status(), 429);
    let retry: Value = full.json().await.unwrap();
    let retry_ms = retry["retry_after_ms"].as_u64().unwrap();
    assert!(
        (100..predicted).contains(&retry_ms),
        "retry after {retry_ms} ms, the fourth task starts in {predicted} ms: {retry}"
    );
    // the cluster's figures on the replica that runs nothing: 4 tasks, 2 replicas
    let figures = eventually(Duration::from_secs(5), || async {
        let text = reqwest::get(format!("{b0}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap_or_default();
        support::counter(&text, "orchd_cluster_tasks{priority=\"interactive\"}") == 4.0
            && support::counter(&text, "orchd_cluster_replicas") == 2.0
    })
    .await;
    assert!(figures, "r0's metrics do not show the cluster's tasks");
    let nowhere = reqwest::get(format!("{}/v1/tasks/late-1", bases[1]))
        .await
        .unwrap();
    assert_eq!(nowhere.status(), 404, "the late task was queued");
    for id in &ids {
        reqwest::Client::new()
            .post(format!("{b0}/v1/tasks/{id}/cancel"))
            .send()
            .await
            .unwrap();
    }
}

/// EMB (issue 51) through replicas: an embedding request admitted on a replica with no pool
/// of the model runs on the replica whose pool serves it (all-MiniLM-L6-v2), and its vectors
/// are the ones that replica gives directly, in OpenAI's shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedding_admitted_on_one_replica_runs_on_another() {
    let minilm = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../.cache/models/all-MiniLM-L6-v2.F16.gguf");
    assert!(minilm.exists(), "run ci/minilm_gguf.py first");
    let cluster = "[cluster]\nheartbeat_ms = 200\nack_wait_ms = 2000\n";
    let configs = [
        format!("pools = []\n{cluster}"),
        format!(
            "{cluster}[[pools]]\nid = \"e\"\nmodel = \"{}\"\nalias = \"minilm\"\nslots = 2\nthreads = 1\n",
            minilm.display()
        ),
    ];
    let nats = NatsCluster::start(3).await;
    let urls = nats.urls();
    let (procs, bases) = replicas_of(&urls, &configs).await;
    let logs = || {
        procs
            .iter()
            .enumerate()
            .map(|(i, p)| format!("--- r{i}\n{}", p.log_text()))
            .collect::<String>()
    };
    assert!(
        lists_pools(&bases[0], 1, Duration::from_secs(30)).await,
        "r0 never listed r1's pool:\n{}",
        logs()
    );
    let body = json!({"model": "minilm", "input": ["The sea is calm.", "A quiet ocean at dawn."]});
    let client = reqwest::Client::new();
    let ask = |base: &str| {
        let (client, body, url) = (
            client.clone(),
            body.clone(),
            format!("{base}/v1/embeddings"),
        );
        async move {
            let r = client
                .post(url)
                .json(&body)
                .send()
                .await
                .expect("embeddings");
            let status = r.status().as_u16();
            (status, r.json::<Value>().await.unwrap_or_default())
        }
    };
    let (status, direct) = ask(&bases[1]).await;
    assert_eq!(status, 200, "{direct}");
    let (status, relayed) = ask(&bases[0]).await;
    assert_eq!(status, 200, "through r0: {relayed}\n{}", logs());
    let vectors = |v: &Value| -> Vec<Vec<f64>> {
        v["data"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|d| {
                d["embedding"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_f64)
                    .collect()
            })
            .collect()
    };
    let (a, b) = (vectors(&direct), vectors(&relayed));
    assert_eq!(a.len(), 2, "{direct}");
    assert_eq!(b.len(), 2, "{relayed}");
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.len(), 384);
        let cos: f64 = x.iter().zip(y).map(|(p, q)| p * q).sum();
        assert!(
            cos > 0.9999,
            "the same vector through the cluster: cosine {cos}"
        );
    }
    assert_eq!(
        relayed["usage"]["prompt_tokens"], direct["usage"]["prompt_tokens"],
        "{relayed}"
    );
    // it ran on r1, where the pool is: r0 has none to take it with
    let taken = |i: usize| procs[i].log_text().matches("cluster: task taken").count();
    assert!(taken(1) >= 1, "r1 took no task from the queue:\n{}", logs());
    assert_eq!(taken(0), 0, "{}", logs());
}
