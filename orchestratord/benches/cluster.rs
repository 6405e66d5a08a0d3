//! Three replicas on a 3-node NATS JetStream cluster against the one-box default (CLU-BENCH-1),
//! in the same run, on the same machine: every replica and the one box serve the same model in
//! a pool of the same slots. Reported as ratios cluster / one box:
//! - the path's added latency: streamed OpenAI chats at concurrency 1 through one replica
//!   (the task may run on any of them) — TTFT p50 and inter-token p50;
//! - admission throughput: 16 clients submitting one-token tasks for 2 s, spread over the
//!   replicas — answers (202 or 429) per second;
//! - the overload burst: three times the cluster's bound of chats at once — how many complete,
//!   how many are refused 429, none failing otherwise.
//!
//! Paired runs alternate which side goes first; medians.
//!
//! `cargo bench -p orchestratord --bench cluster` (env `PAIRS`, `REQUESTS`, `MAX_TOKENS`);
//! under `cargo test` it runs one tiny pair as a smoke test. Needs `ci/install-nats.sh`.

mod support;

#[allow(dead_code)]
#[path = "../tests/support/procs.rs"]
mod procs;

#[allow(dead_code)]
#[path = "../tests/support/nats.rs"]
mod nats;

use std::time::{Duration, Instant};

use orchd_tools::loadgen::{run_level, LevelReport, LoadSpec};
use support::{cpu_ms_of, env_or, median};

const SLOTS: usize = 2;
const CAPACITY: usize = 4;

fn pool_config(model: &std::path::Path) -> String {
    format!(
        "[queue]\ncapacity = {CAPACITY}\n\n[[pools]]\nid = \"p\"\nmodel = \"{}\"\nalias = \"smol\"\nslots = {SLOTS}\nctx = 1024\nthreads = 1\n",
        model.display()
    )
}

/// Streamed chats at `concurrency` against each of `bases` at once (the load split evenly).
async fn chats(
    client: &reqwest::Client,
    bases: &[String],
    concurrency: usize,
    requests: usize,
    max_tokens: usize,
) -> Vec<LevelReport> {
    let mut runs = tokio::task::JoinSet::new();
    let n = bases.len();
    for base in bases {
        let spec = LoadSpec {
            base_url: base.clone(),
            model: "smol".into(),
            concurrency: concurrency.div_ceil(n),
            requests: requests.div_ceil(n),
            max_tokens,
            timeout: Duration::from_secs(300),
        };
        let client = client.clone();
        runs.spawn(async move { run_level(&client, &spec).await });
    }
    let mut out = Vec::new();
    while let Some(r) = runs.join_next().await {
        out.push(r.expect("a load run"));
    }
    out
}

/// What the admission run measured.
struct Answered {
    per_s: f64,
    /// Of them, 202s a second: the one-token tasks admitted (and run) — a side that runs its
    /// tasks sooner admits more of them, and spends the CPU they take on them.
    admitted_per_s: f64,
    /// The share that were 429.
    refused: f64,
    /// CPU time of the servers' processes (`servers`) and of the others (`brokers`) per
    /// 1,000 answers, ms.
    servers_cpu_per_k: f64,
    brokers_cpu_per_k: f64,
}

/// Answers per second to one-token task submissions from 16 clients for `secs`, spread over
/// `bases`; the share of them that were 429; the CPU time the processes `servers` and
/// `brokers` spent on them.
async fn admissions(
    client: &reqwest::Client,
    bases: &[String],
    secs: f64,
    servers: &[u32],
    brokers: &[u32],
) -> Answered {
    let cpu_before = (cpu_ms_of(servers), cpu_ms_of(brokers));
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut lanes = tokio::task::JoinSet::new();
    for lane in 0..16 {
        let (client, base) = (client.clone(), bases[lane % bases.len()].clone());
        lanes.spawn(async move {
            let (mut answered, mut refused) = (0u64, 0u64);
            while Instant::now() < until {
                let r = client
                    .post(format!("{base}/v1/tasks"))
                    .json(&serde_json::json!({"prompt": "Hi", "max_tokens": 1}))
                    .send()
                    .await;
                match r.map(|r| r.status().as_u16()) {
                    Ok(202) => answered += 1,
                    Ok(429) => {
                        answered += 1;
                        refused += 1;
                    }
                    Ok(s) => panic!("{base}: an admission answered {s}"),
                    Err(e) => panic!("{base}: {e}"),
                }
            }
            (answered, refused)
        });
    }
    let (mut answered, mut refused) = (0, 0);
    while let Some(r) = lanes.join_next().await {
        let (a, f) = r.expect("a lane");
        answered += a;
        refused += f;
    }
    let per_k =
        |before: f64, pids: &[u32]| (cpu_ms_of(pids) - before) * 1000.0 / answered.max(1) as f64;
    Answered {
        per_s: answered as f64 / secs,
        admitted_per_s: (answered - refused) as f64 / secs,
        refused: refused as f64 / answered.max(1) as f64,
        servers_cpu_per_k: per_k(cpu_before.0, servers),
        brokers_cpu_per_k: per_k(cpu_before.1, brokers),
    }
}

/// Waits until nothing is queued or running on `bases` (the admission runs leave tasks).
async fn settle(client: &reqwest::Client, bases: &[String]) {
    for _ in 0..600 {
        let mut busy = false;
        for base in bases {
            let v: serde_json::Value = match client.get(format!("{base}/v1/pools")).send().await {
                Ok(r) => r.json().await.unwrap_or_default(),
                Err(_) => continue,
            };
            busy |= v["pools"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|p| p["slots_free"] != p["slots_total"]);
        }
        if !busy {
            // and what is still queued in the cluster was taken (the pools look idle a moment
            // between two tasks)
            tokio::time::sleep(Duration::from_millis(300)).await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let model = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let nats_bin =
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache/bin/nats-server");
    if !model.exists() || !nats_bin.exists() {
        eprintln!("cluster bench: the model or nats-server is missing (ci/fetch-model.sh, ci/install-nats.sh); skipped");
        return;
    }
    let (pairs, requests, max_tokens, secs) = if full {
        (
            env_or("PAIRS", 5),
            env_or("REQUESTS", 12),
            env_or("MAX_TOKENS", 32),
            2.0,
        )
    } else {
        (1, 3, 8, 0.5)
    };
    let cluster = nats::NatsCluster::start(3).await;
    let urls = cluster.urls();
    let config = pool_config(&model);
    let mut procs = Vec::new();
    let mut replicas = Vec::new();
    for i in 0..3 {
        let name = format!("r{i}");
        let (p, base) = procs::server_env(
            // the default heartbeat (1 s): its background is what a default cluster pays
            &config,
            &[
                ("ORCHD_CLUSTER_NATS", urls.as_str()),
                ("ORCHD_REPLICA_ID", name.as_str()),
                ("RUST_LOG", "warn"),
            ],
        )
        .await;
        procs.push(p);
        replicas.push(base);
    }
    let (one_proc, one_box) = procs::server_env(&config, &[("RUST_LOG", "warn")]).await;
    let one_box = vec![one_box];
    let client = reqwest::Client::new();
    // every replica lists the three pools (the bound counts their slots)
    for base in &replicas {
        for _ in 0..200 {
            let v: serde_json::Value = match client.get(format!("{base}/v1/pools")).send().await {
                Ok(r) => r.json().await.unwrap_or_default(),
                Err(_) => serde_json::Value::Null,
            };
            if v["pools"].as_array().is_some_and(|a| a.len() == 3) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let first = vec![replicas[0].clone()];
    chats(&client, &one_box, 1, 2, 8).await;
    chats(&client, &first, 1, 2, 8).await;

    println!("3 replicas (3-node NATS JetStream, loopback) vs one box, same machine; pools of {SLOTS} slots, queue capacity {CAPACITY}; {pairs} pairs");
    // the path's added latency at concurrency 1
    let (mut ttft, mut itl, mut ttft_r, mut itl_r) = (vec![], vec![], vec![], vec![]);
    let (mut ob_ttft, mut cl_ttft, mut ob_itl, mut cl_itl) = (vec![], vec![], vec![], vec![]);
    for pair in 0..pairs {
        let (o, c) = if pair % 2 == 0 {
            let o = chats(&client, &one_box, 1, requests, max_tokens).await;
            (o, chats(&client, &first, 1, requests, max_tokens).await)
        } else {
            let c = chats(&client, &first, 1, requests, max_tokens).await;
            (chats(&client, &one_box, 1, requests, max_tokens).await, c)
        };
        let (o, c) = (&o[0], &c[0]);
        assert!(o.errors.is_empty() && c.errors.is_empty(), "{o:?} {c:?}");
        ttft_r.push(c.ttft_p50_ms / o.ttft_p50_ms);
        itl_r.push(c.itl_p50_ms / o.itl_p50_ms.max(1e-9));
        ob_ttft.push(o.ttft_p50_ms);
        cl_ttft.push(c.ttft_p50_ms);
        ob_itl.push(o.itl_p50_ms);
        cl_itl.push(c.itl_p50_ms);
        ttft.push(o.ttft_p50_ms);
        itl.push(o.itl_p50_ms);
    }
    println!("| measure | one box | 3 replicas | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| TTFT p50 ms, 1 stream ({requests} chats of {max_tokens} tokens) | {:.1} | {:.1} | {:.2} |",
        median(&mut ob_ttft),
        median(&mut cl_ttft),
        median(&mut ttft_r)
    );
    println!(
        "| inter-token p50 ms, 1 stream | {:.2} | {:.2} | {:.2} |",
        median(&mut ob_itl),
        median(&mut cl_itl),
        median(&mut itl_r)
    );
    // admission throughput, and the CPU it took
    let one_pid = [one_proc.child.id()];
    let replica_pids: Vec<u32> = procs.iter().map(|p| p.child.id()).collect();
    let nats_pids = cluster.pids();
    let (mut ob_a, mut cl_a, mut ratio_a, mut ob_r, mut cl_r) =
        (vec![], vec![], vec![], vec![], vec![]);
    let (mut ob_cpu, mut cl_cpu, mut cpu_ratio, mut nats_cpu) = (vec![], vec![], vec![], vec![]);
    let (mut ob_in, mut cl_in, mut ratio_in) = (vec![], vec![], vec![]);
    for pair in 0..pairs {
        settle(&client, &one_box).await;
        settle(&client, &replicas).await;
        let one = || admissions(&client, &one_box, secs, &one_pid, &[]);
        let three = || admissions(&client, &replicas, secs, &replica_pids, &nats_pids);
        let (o, c) = if pair % 2 == 0 {
            let o = one().await;
            settle(&client, &one_box).await;
            (o, three().await)
        } else {
            let c = three().await;
            settle(&client, &replicas).await;
            (one().await, c)
        };
        ob_a.push(o.per_s);
        cl_a.push(c.per_s);
        ratio_a.push(c.per_s / o.per_s.max(1e-9));
        ob_in.push(o.admitted_per_s);
        cl_in.push(c.admitted_per_s);
        ratio_in.push(c.admitted_per_s / o.admitted_per_s.max(1e-9));
        ob_r.push(o.refused * 100.0);
        cl_r.push(c.refused * 100.0);
        ob_cpu.push(o.servers_cpu_per_k);
        cl_cpu.push(c.servers_cpu_per_k);
        cpu_ratio.push(c.servers_cpu_per_k / o.servers_cpu_per_k.max(1e-9));
        nats_cpu.push(c.brokers_cpu_per_k);
    }
    println!(
        "| admissions answered/s (16 clients; 429 share one box {:.0}%, cluster {:.0}%) | {:.0} | {:.0} | {:.2} |",
        median(&mut ob_r),
        median(&mut cl_r),
        median(&mut ob_a),
        median(&mut cl_a),
        median(&mut ratio_a)
    );
    println!(
        "| of them 202 (one-token tasks admitted and run) per s | {:.0} | {:.0} | {:.2} |",
        median(&mut ob_in),
        median(&mut cl_in),
        median(&mut ratio_in)
    );
    println!(
        "| CPU ms per 1,000 answers: the server(s), summed (the 3 NATS nodes: {:.0}) | {:.0} | {:.0} | {:.2} |",
        median(&mut nats_cpu),
        median(&mut ob_cpu),
        median(&mut cl_cpu),
        median(&mut cpu_ratio)
    );
    // the overload burst: three times the bound at once
    settle(&client, &one_box).await;
    settle(&client, &replicas).await;
    let bound_one = CAPACITY + SLOTS;
    let bound_cluster = CAPACITY + 3 * SLOTS;
    let burst = |bound: usize| if full { 3 * bound } else { bound + 2 };
    let o = chats(
        &client,
        &one_box,
        burst(bound_one),
        burst(bound_one),
        max_tokens,
    )
    .await;
    let c = chats(
        &client,
        &replicas,
        burst(bound_cluster),
        burst(bound_cluster),
        max_tokens,
    )
    .await;
    let sum = |r: &[LevelReport]| {
        let done: usize = r.iter().map(|l| l.completed).sum();
        let refused: usize = r
            .iter()
            .flat_map(|l| l.errors.iter())
            .filter(|(k, _)| k.contains("429"))
            .map(|(_, n)| n)
            .sum();
        let other: usize = r
            .iter()
            .flat_map(|l| l.errors.iter())
            .filter(|(k, _)| !k.contains("429"))
            .map(|(_, n)| n)
            .sum();
        (done, refused, other)
    };
    let (od, or, oo) = sum(&o);
    let (cd, cr, co) = sum(&c);
    assert_eq!(oo + co, 0, "failures besides 429: {o:?} {c:?}");
    println!(
        "| overload burst: completed / refused 429 (bound {bound_one} vs {bound_cluster}) | {od} / {or} | {cd} / {cr} | {:.2} |",
        cd as f64 / od.max(1) as f64
    );
    drop(one_proc);
    drop(procs);
}
