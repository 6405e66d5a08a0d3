//! The remote path's overhead (WRK-BENCH-1): the same model and pool config served by a server
//! with a local pool, and by a server with no pool through a worker on loopback. Streaming
//! OpenAI chats at concurrency 1 and 4; paired runs alternate which side goes first; medians of
//! aggregate tokens/s and of TTFT p50, and their ratios remote/local.
//!
//! `cargo bench -p orchestratord --bench remote` (env `PAIRS`, `REQUESTS`, `MAX_TOKENS`);
//! under `cargo test` it runs one tiny pair as a smoke test.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use orchd_tools::loadgen::{run_level, LoadSpec};

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn spawn(args: &[String], config: &str) -> Proc {
    let dir = std::env::temp_dir().join(format!(
        "orchd-bench-remote-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let cfg = dir.join("config.toml");
    std::fs::write(&cfg, config).expect("config");
    let log = std::fs::File::create(dir.join("log.txt")).expect("log");
    let child = Command::new(env!("CARGO_BIN_EXE_orchestratord"))
        .arg("--config")
        .arg(&cfg)
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("ORCHD_WORKER_SECRET")
        // each process its own record store, beside its config
        .env("ORCHD_RECORDS_PATH", dir.join("records.sqlite3"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("spawn orchestratord");
    Proc(child)
}

async fn wait_ready(client: &reqwest::Client, base: &str) {
    for _ in 0..1200 {
        if let Ok(r) = client.get(format!("{base}/v1/pools")).send().await {
            if let Ok(v) = r.json::<serde_json::Value>().await {
                if v["pools"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|p| p["ready"] == true))
                {
                    return;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{base} never had a ready pool");
}

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

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return 0.0;
    }
    v[v.len() / 2]
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
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
    let (lp, rp) = (free_port(), free_port());
    let local_base = format!("http://127.0.0.1:{lp}");
    let remote_base = format!("http://127.0.0.1:{rp}");
    let _local = spawn(&["--bind".into(), format!("127.0.0.1:{lp}")], &pool);
    let _server = spawn(
        &["--bind".into(), format!("127.0.0.1:{rp}")],
        &format!("pools = []\n[workers]\nsecret = \"{secret}\"\n"),
    );
    let client = reqwest::Client::new();
    // the worker loads the same pool once the server is up
    for _ in 0..400 {
        if client
            .get(format!("{remote_base}/metrics"))
            .send()
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let _worker = spawn(
        &[
            "worker".into(),
            "--server".into(),
            remote_base.clone(),
            "--secret".into(),
            secret.into(),
            "--name".into(),
            "bench".into(),
        ],
        &pool,
    );
    wait_ready(&client, &local_base).await;
    wait_ready(&client, &remote_base).await;
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
