//! CLU-DIR-1, CLU-START-1 (issue 38, the first part): replicas on a real 3-node NATS JetStream
//! cluster on loopback (`nats-server` 2.15.1, `ci/install-nats.sh`), each a real process on the
//! real model. Every replica's `/v1/pools` lists every live replica's pools; a replica killed
//! with `kill -9` drops out within three heartbeats; the directory outlives a NATS node's
//! `kill -9`; a replica whose cluster does not answer does not start.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;
use support::default_model_path;
use support::nats::NatsCluster;
use support::procs::*;

fn replica_config(pool: &str) -> String {
    format!(
        "[cluster]\nheartbeat_ms = 200\n\n[[pools]]\nid = \"{pool}\"\nmodel = \"{}\"\nslots = 1\nctx = 512\nthreads = 1\n",
        default_model_path()
    )
}

/// How the process `p` exited within `limit` (None: still running), and its log.
async fn exit_within(mut p: Proc, limit: Duration) -> (Option<std::process::ExitStatus>, String) {
    tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        while started.elapsed() < limit {
            if let Some(s) = p.child.try_wait().unwrap() {
                return (Some(s), p.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        (None, p.log_text())
    })
    .await
    .unwrap()
}

/// `(replica, pool id)` of every pool a replica lists.
async fn listed(base: &str) -> BTreeSet<(String, String)> {
    let v: Value = match reqwest::get(format!("{base}/v1/pools")).await {
        Ok(r) => r.json().await.unwrap_or_default(),
        Err(_) => return BTreeSet::new(),
    };
    v["pools"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                p["replica"].as_str().unwrap_or("-").to_string(),
                p["pool_id"].as_str().unwrap_or("-").to_string(),
            )
        })
        .collect()
}

fn set(items: &[(&str, &str)]) -> BTreeSet<(String, String)> {
    items
        .iter()
        .map(|(r, p)| (r.to_string(), p.to_string()))
        .collect()
}

async fn until_listed(base: &str, want: &BTreeSet<(String, String)>, limit: Duration) -> bool {
    eventually(limit, || async { &listed(base).await == want }).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_lists_every_live_replicas_pools() {
    let mut nats = NatsCluster::start(3).await;
    let urls = nats.urls();
    let mut replicas = Vec::new();
    for (name, pool) in [("a", "pa"), ("b", "pb"), ("c", "pc")] {
        let env = [
            ("ORCHD_CLUSTER_NATS", urls.as_str()),
            ("ORCHD_REPLICA_ID", name),
        ];
        replicas.push(server_env(&replica_config(pool), &env).await);
    }
    let all = set(&[("a", "pa"), ("b", "pb"), ("c", "pc")]);
    for (p, base) in &replicas {
        assert!(
            until_listed(base, &all, Duration::from_secs(10)).await,
            "{base} lists {:?}: {}",
            listed(base).await,
            p.log_text()
        );
    }
    // another replica's pool comes with its health as that replica announced it
    let v: Value = reqwest::get(format!("{}/v1/pools", replicas[0].1))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let pb = v["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pool_id"] == "pb")
        .unwrap();
    assert_eq!(pb["replica"], "b");
    assert_eq!(pb["slots_total"], 1);
    assert_eq!(pb["state"], "ready", "{pb}");

    // kill -9 of replica c: out of the others' lists within three heartbeats (and a margin)
    let (c, _) = replicas.pop().unwrap();
    c.signal("-9");
    drop(c);
    let two = set(&[("a", "pa"), ("b", "pb")]);
    for (p, base) in &replicas {
        assert!(
            until_listed(base, &two, Duration::from_secs(3)).await,
            "{base} still lists {:?}: {}",
            listed(base).await,
            p.log_text()
        );
    }

    // kill -9 of a NATS node (the directory's bucket has three copies): a replica that joins
    // afterwards through the two left is seen by the others, and they by it
    nats.kill(0);
    let env = [
        ("ORCHD_CLUSTER_NATS", urls.as_str()),
        ("ORCHD_REPLICA_ID", "d"),
    ];
    let d = server_env(&replica_config("pd"), &env).await;
    replicas.push(d);
    let three = set(&[("a", "pa"), ("b", "pb"), ("d", "pd")]);
    for (p, base) in &replicas {
        assert!(
            until_listed(base, &three, Duration::from_secs(15)).await,
            "{base} lists {:?} after a NATS node died: {}\n{}",
            listed(base).await,
            p.log_text(),
            nats.log(1)
        );
    }

    // CLU-START-1: a replica that no longer reaches any NATS node is not ready (no traffic
    // for it from a load balancer) until it does
    for (_, base) in &replicas {
        let r = reqwest::get(format!("{base}/readyz")).await.unwrap();
        assert_eq!(r.status(), 200);
    }
    nats.kill(1);
    nats.kill(2);
    for (p, base) in &replicas {
        let down = eventually(Duration::from_secs(10), || async {
            let v: Value = match reqwest::get(format!("{base}/readyz")).await {
                Ok(r) => r.json().await.unwrap_or_default(),
                Err(_) => return false,
            };
            v["ready"] == false && v["status"] == "cluster_unavailable"
        })
        .await;
        assert!(
            down,
            "{base} still ready without its cluster: {}",
            p.log_text()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_cluster_does_not_answer_does_not_start() {
    let dead = format!("nats://127.0.0.1:{}", free_port());
    let cfg = format!(
        "[cluster]\nnats_urls = [\"{dead}\"]\nreplica_id = \"lonely\"\nconnect_timeout_ms = 1500\n\n[[pools]]\nid = \"p\"\nmodel = \"{}\"\nslots = 1\nctx = 512\nthreads = 1\n",
        default_model_path()
    );
    let bind = |tag: &str| {
        spawn_env(
            tag,
            &["--bind".into(), format!("127.0.0.1:{}", free_port())],
            &cfg,
            &[],
        )
    };
    let (status, log) = exit_within(bind("lonely"), Duration::from_secs(20)).await;
    let status = status.unwrap_or_else(|| panic!("still running: {log}"));
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("cannot reach the NATS cluster") && log.contains(&dead),
        "{log}"
    );

    // a replica id a KV key cannot hold is a config error before anything starts
    let bad = cfg.replace("replica_id = \"lonely\"", "replica_id = \"a.b c\"");
    let mut p = spawn_env(
        "badid",
        &["--bind".into(), format!("127.0.0.1:{}", free_port())],
        &bad,
        &[],
    );
    let s = p.child.wait().unwrap();
    assert!(!s.success());
    assert!(
        p.log_text().contains("cluster.replica_id"),
        "{}",
        p.log_text()
    );
}

/// CLU-START-1 (issue 49): one NATS node on its own with the default three copies of each
/// stream: the replica exits at once saying why and how to fix it (it used to wait out
/// `connect_timeout_ms` and say it could not reach the cluster it had reached); with
/// `ORCHD_CLUSTER_STREAM_REPLICAS=1` it joins and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_nats_node_is_named_as_the_reason_and_one_copy_serves() {
    let nats = NatsCluster::start(1).await;
    let urls = nats.urls();
    let cfg = replica_config("lone");
    let p = spawn_env(
        "lone",
        &["--bind".into(), format!("127.0.0.1:{}", free_port())],
        &cfg,
        &[
            ("ORCHD_CLUSTER_NATS", urls.as_str()),
            ("ORCHD_REPLICA_ID", "lone"),
        ],
    );
    let (status, log) = exit_within(p, Duration::from_secs(10)).await;
    let status = status.unwrap_or_else(|| panic!("still running after 10 s: {log}"));
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("runs alone") && log.contains("ORCHD_CLUSTER_STREAM_REPLICAS=1"),
        "{log}"
    );
    assert!(!log.contains("cannot reach"), "{log}");
    let env = [
        ("ORCHD_CLUSTER_NATS", urls.as_str()),
        ("ORCHD_REPLICA_ID", "lone"),
        ("ORCHD_CLUSTER_STREAM_REPLICAS", "1"),
    ];
    let (_p, base) = server_env(&replica_config("lone"), &env).await;
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/chat/completions"))
        .json(
            &serde_json::json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

/// CLU-CANCEL-1: a cancel sent to a replica that does not hold the task reaches the one that
/// runs it: 204, and the task's stream there ends `cancelled` within moments; an id no replica
/// holds is 404 on every replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_on_any_replica_stops_the_task_where_it_runs() {
    let nats = NatsCluster::start(3).await;
    let urls = nats.urls();
    let mut replicas = Vec::new();
    for (name, pool) in [("a", "pa"), ("b", "pb")] {
        let env = [
            ("ORCHD_CLUSTER_NATS", urls.as_str()),
            ("ORCHD_REPLICA_ID", name),
        ];
        replicas.push(server_env(&replica_config(pool), &env).await);
    }
    let (a, b) = (&replicas[0].1, &replicas[1].1);
    let client = reqwest::Client::new();
    let r = client
        .post(format!("{a}/v1/tasks"))
        .json(&serde_json::json!({"prompt": "Count from 1 to 1000: 1, 2, 3, 4, 5,", "max_tokens": 400}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202, "{:?}", r.text().await);
    let id = r.json::<Value>().await.unwrap()["task_id"]
        .as_str()
        .unwrap()
        .to_string();
    let stream = client
        .get(format!("{a}/v1/tasks/{id}/stream"))
        .send()
        .await
        .unwrap();
    // read a's stream, saying when the first tokens have come
    let (first_tokens, mut generating) = tokio::sync::watch::channel(false);
    let reader = tokio::spawn(async move {
        use futures::StreamExt;
        let mut body = stream.bytes_stream();
        let (mut buf, mut events) = (String::new(), Vec::new());
        while let Some(chunk) = body.next().await {
            buf.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
            let now = std::time::Instant::now();
            events.extend(
                support::parse_frames(&mut buf)
                    .into_iter()
                    .map(|e| (e, now)),
            );
            if events.iter().filter(|(e, _)| e.event == "token").count() >= 5 {
                let _ = first_tokens.send(true);
            }
        }
        events
    });
    tokio::time::timeout(Duration::from_secs(30), generating.wait_for(|g| *g))
        .await
        .expect("tokens from a within 30 s")
        .unwrap();
    // b did not admit it, and knows it (from the cluster's relay): running
    let on_b: Value = reqwest::get(format!("{b}/v1/tasks/{id}"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(on_b["state"], "running", "{on_b}");
    let sent = std::time::Instant::now();
    let r = client
        .post(format!("{b}/v1/tasks/{id}/cancel"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204, "{:?}", r.text().await);
    let answered = sent.elapsed();
    let events = reader.await.unwrap();
    let (last, at) = events.last().unwrap();
    assert_eq!(last.data["finish_reason"], "cancelled", "{last:?}");
    let ended = at.duration_since(sent);
    let tokens = events.iter().filter(|(e, _)| e.event == "token").count();
    eprintln!(
        "cancel through b: answered in {answered:?}, a's stream ended {ended:?} after it was sent ({tokens} tokens)"
    );
    assert!(tokens < 400, "the task ran to its end: {tokens} tokens");
    assert!(ended < Duration::from_secs(2), "{ended:?}");
    // nobody's task: 404 from either replica
    for base in [a, b] {
        let r = client
            .post(format!("{base}/v1/tasks/no-such-task/cancel"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
    }
    // ids no task can have (too long for a task id, a subject's wildcard): 404 on every route,
    // never a cluster error
    let long = "a".repeat(3000);
    for bad in [long.as_str(), "a*b", "a%3Eb"] {
        for base in [a, b] {
            let status = client
                .get(format!("{base}/v1/tasks/{bad}"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16();
            let stream = client
                .get(format!("{base}/v1/tasks/{bad}/stream"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16();
            let cancel = client
                .post(format!("{base}/v1/tasks/{bad}/cancel"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16();
            assert_eq!(
                (status, stream, cancel),
                (404, 404, 404),
                "{}",
                &bad[..bad.len().min(20)]
            );
        }
    }
}
