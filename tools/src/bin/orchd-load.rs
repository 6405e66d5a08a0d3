//! `orchd-load --base-url URL --model M --concurrency 1 4 8 -n 16 --max-tokens 64 [--json F]`:
//! streamed chat load against any OpenAI-compatible server (orchestratord, llama.cpp's server,
//! vLLM), one line per concurrency level; the same request sequence for every server.

use std::time::Duration;

use clap::Parser;
use orchd_tools::loadgen::{run_level, LoadSpec};

#[derive(Debug, Parser)]
#[command(
    name = "orchd-load",
    version,
    about = "Streaming OpenAI-compatible load generator"
)]
struct Args {
    /// Server base URL, e.g. http://127.0.0.1:8080
    #[arg(long)]
    base_url: String,
    /// `model` of each request.
    #[arg(long, default_value = "SmolLM2-135M-Instruct.Q4_1")]
    model: String,
    /// Concurrency levels, run in order.
    #[arg(long, num_args = 1.., default_values_t = [1usize, 4, 8])]
    concurrency: Vec<usize>,
    /// Requests per level.
    #[arg(short = 'n', long, default_value_t = 16)]
    requests: usize,
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Per-request timeout, seconds.
    #[arg(long, default_value_t = 300)]
    timeout_s: u64,
    /// Also write the reports as JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    anyhow::ensure!(a.requests <= 100_000, "-n is at most 100000");
    anyhow::ensure!(
        a.concurrency.iter().all(|c| (1..=1024).contains(c)),
        "concurrency is 1..=1024"
    );
    // a fresh connection per request: servers that close kept-alive connections after a few
    // requests (llama.cpp's cpp-httplib: 5) would otherwise fail the next request sent on one
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()?;
    let mut reports = Vec::new();
    println!("| concurrency | done/sent | errors | tok/s | TTFT p50/p95 ms | ITL p50/p95 ms | e2e p50/p95 ms |");
    println!("|---|---|---|---|---|---|---|");
    for c in &a.concurrency {
        let spec = LoadSpec {
            base_url: a.base_url.trim_end_matches('/').to_string(),
            model: a.model.clone(),
            concurrency: *c,
            requests: a.requests,
            max_tokens: a.max_tokens,
            timeout: Duration::from_secs(a.timeout_s),
        };
        let r = run_level(&client, &spec).await;
        println!(
            "| {} | {}/{} | {:?} | {:.1} | {:.1}/{:.1} | {:.1}/{:.1} | {:.0}/{:.0} |",
            r.concurrency,
            r.completed,
            r.requests,
            r.errors,
            r.tokens_per_s,
            r.ttft_p50_ms,
            r.ttft_p95_ms,
            r.itl_p50_ms,
            r.itl_p95_ms,
            r.e2e_p50_ms,
            r.e2e_p95_ms
        );
        reports.push(r);
    }
    if let Some(path) = a.json {
        std::fs::write(path, serde_json::to_string_pretty(&reports)?)?;
    }
    Ok(())
}
