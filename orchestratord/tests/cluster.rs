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
    let mut p = bind("lonely");
    let status = tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        while started.elapsed() < Duration::from_secs(20) {
            if let Some(s) = p.child.try_wait().unwrap() {
                return (Some(s), p.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        (None, p.log_text())
    })
    .await
    .unwrap();
    let (status, log) = status;
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
