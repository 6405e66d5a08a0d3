//! The remote path's overhead (WRK-BENCH-1): the same model and pool config served by a server
//! with a local pool, and by a server with no pool through a worker on loopback. Streaming
//! OpenAI chats at concurrency 1 and 4; paired runs alternate which side goes first; medians of
//! aggregate tokens/s and of TTFT p50, and their ratios remote/local.
//!
//! `cargo bench -p orchestratord --bench remote` (env `PAIRS`, `REQUESTS`, `MAX_TOKENS`);
//! under `cargo test` it runs one tiny pair as a smoke test.

mod support;

#[allow(dead_code)]
#[path = "../tests/support/procs.rs"]
mod procs;

use std::time::Duration;

use orchd_tools::loadgen::{run_level, LoadSpec};
use support::{env_or, median, wait_ready};

/// `requests` chats at `concurrency`: (aggregate tokens/s, TTFT p50 in ms).
async fn level(
    client: &reqwest::Client,
    base: &str,
    concurrency: usize,
    requests: usize,
    max_tokens: usize,
) -> (f64, f64) {
    let spec = LoadSpec {
        base_url: base.to_string(),
        model: "smol".into(),
        concurrency,
        requests,
        max_tokens,
        timeout: Duration::from_secs(300),
    };
    let r = run_level(client, &spec).await;
    assert!(r.errors.is_empty(), "{base}: {:?}", r.errors);
    (r.tokens_per_s, r.ttft_p50_ms)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let model = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !model.exists() {
        eprintln!(
            "remote bench: {} missing (run ci/fetch-model.sh); skipped",
            model.display()
        );
        return;
    }
    let (pairs, requests, max_tokens) = if full {
        (
            env_or("PAIRS", 5),
            env_or("REQUESTS", 8),
            env_or("MAX_TOKENS", 64),
        )
    } else {
        (1, 2, 8)
    };
    let levels: &[usize] = if full { &[1, 4] } else { &[1] };
    let pool = format!(
        "[[pools]]\nid = \"p\"\nmodel = \"{}\"\nalias = \"smol\"\nslots = 4\nctx = 1024\n",
        model.display()
    );
    let secret = "bench-secret";
    let quiet = [("RUST_LOG", "warn")];
    let (_local, local_base) = procs::server_env_answering(&pool, &quiet).await;
    let (_server, remote_base) = procs::server_env_answering(
        &format!("pools = []\n[workers]\nsecret = \"{secret}\"\n"),
        &quiet,
    )
    .await;
    let client = reqwest::Client::new();
    // the worker loads the same pool once the server is up
    let _worker = procs::worker_env(&remote_base, secret, "bench", &pool, &[], &quiet);
    wait_ready(&client, &local_base, 1).await;
    wait_ready(&client, &remote_base, 1).await;
    // warm both (first requests pay page faults)
    level(&client, &local_base, 1, 2, 8).await;
    level(&client, &remote_base, 1, 2, 8).await;
    println!("remote path overhead: {pairs} pairs x {requests} streamed chats of {max_tokens} tokens, pools of 4 slots");
    println!("| concurrency | local tok/s | remote tok/s | ratio | local TTFT p50 ms | remote TTFT p50 ms | ratio |");
    println!("|---|---|---|---|---|---|---|");
    for &c in levels {
        let (mut lt, mut rt, mut lf, mut rf, mut ratios, mut fratios) =
            (vec![], vec![], vec![], vec![], vec![], vec![]);
        for pair in 0..pairs {
            let (l, r) = if pair % 2 == 0 {
                let l = level(&client, &local_base, c, requests, max_tokens).await;
                (
                    l,
                    level(&client, &remote_base, c, requests, max_tokens).await,
                )
            } else {
                let r = level(&client, &remote_base, c, requests, max_tokens).await;
                (
                    level(&client, &local_base, c, requests, max_tokens).await,
                    r,
                )
            };
            ratios.push(r.0 / l.0);
            fratios.push(r.1 / l.1);
            lt.push(l.0);
            rt.push(r.0);
            lf.push(l.1);
            rf.push(r.1);
        }
        println!(
            "| {c} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} | {:.2} |",
            median(&mut lt),
            median(&mut rt),
            median(&mut ratios),
            median(&mut lf),
            median(&mut rf),
            median(&mut fratios)
        );
    }
}
