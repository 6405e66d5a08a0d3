//! Orchestration overhead, as ratios to a bare axum server measured in the same run.
//!
//! `cargo bench -p orchestratord --bench overhead`
//!
//! - SSE tokens/s: one task of N tokens from an instant scripted engine, read to the end over
//!   loopback, versus a bare axum handler streaming N SSE frames of the same shape.
//! - Admission requests/s: C concurrent clients posting tasks for a fixed time against a small
//!   queue (so most answers are 429s), versus a bare handler that parses the same JSON and
//!   answers 202. Medians of several rounds.
//! - Refusals/s of a big prompt (256 KiB): the same, with every answer a 429 — a refusal
//!   parses the body (bounded by `admission.max_body_bytes`) but never tokenizes the prompt.

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::response::sse::{Event, Sse};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use serde_json::json;

const TOKENS: usize = 2000;
const ROUNDS: usize = 7;
const CLIENTS: usize = 16;
const ADMIT_SECS: f64 = 2.0;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

async fn bare_server() -> String {
    async fn stream() -> Sse<impl futures::Stream<Item = Result<Event, std::convert::Infallible>>> {
        let s = futures::stream::iter(0..TOKENS).map(|i| {
            Ok(Event::default()
                .event("token")
                .data(format!("{{\"t\":\"tok{i} \",\"i\":{i}}}")))
        });
        Sse::new(s)
    }
    async fn submit(
        Json(v): Json<serde_json::Value>,
    ) -> (axum::http::StatusCode, Json<serde_json::Value>) {
        let id = uuid::Uuid::new_v4().to_string();
        (
            axum::http::StatusCode::ACCEPTED,
            Json(
                json!({"task_id": id, "queue_position": 0, "predicted_start_ms": 0, "backoff_ms": 0, "echo": v["max_tokens"]}),
            ),
        )
    }
    let app = Router::new()
        .route("/stream", get(stream))
        .route("/v1/tasks", post(submit));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    base
}

async fn read_tokens(client: &reqwest::Client, url: &str) -> usize {
    let r = client.get(url).send().await.unwrap();
    let mut body = r.bytes_stream();
    let mut n = 0;
    let mut tail = Vec::new();
    while let Some(c) = body.next().await {
        let c = c.unwrap();
        tail.extend_from_slice(&c);
        n += tail.windows(12).filter(|w| w == b"event: token").count();
        let keep = tail.len().saturating_sub(11);
        tail.drain(..keep);
    }
    n
}

async fn admission_rate(
    client: &reqwest::Client,
    url: String,
    body: serde_json::Value,
) -> (f64, f64) {
    let done = Arc::new(AtomicU64::new(0));
    let rejected = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs_f64(ADMIT_SECS);
    let mut hs = Vec::new();
    for _ in 0..CLIENTS {
        let (c, u, d, r) = (client.clone(), url.clone(), done.clone(), rejected.clone());
        let body = body.clone();
        hs.push(tokio::spawn(async move {
            while Instant::now() < until {
                let resp = c.post(&u).json(&body).send().await.unwrap();
                if resp.status() == 429 {
                    r.fetch_add(1, Ordering::Relaxed);
                }
                let _ = resp.bytes().await;
                d.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for h in hs {
        h.await.unwrap();
    }
    let n = done.load(Ordering::Relaxed) as f64;
    (
        n / ADMIT_SECS,
        rejected.load(Ordering::Relaxed) as f64 / n.max(1.0),
    )
}

/// Posts `body` against the bare server and `orch_url` in turns (3 rounds) and prints the
/// medians, their ratio and the share of 429s.
async fn compare_admission(
    client: &reqwest::Client,
    bare: &str,
    orch_url: &str,
    body: &serde_json::Value,
    what: &str,
) {
    let (mut bare_rps, mut orch_rps, mut reject_share) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        let (b, _) = admission_rate(client, format!("{bare}/v1/tasks"), body.clone()).await;
        bare_rps.push(b);
        let (r, rej) = admission_rate(client, orch_url.to_string(), body.clone()).await;
        orch_rps.push(r);
        reject_share.push(rej);
    }
    let (b, o) = (median(bare_rps), median(orch_rps));
    println!("{what} ({CLIENTS} clients, {ADMIT_SECS} s, median of 3):");
    println!("  bare axum 202   {b:>10.0}");
    println!(
        "  orchestratord   {o:>10.0}   ratio {:.2}   (429 share {:.0}%)",
        o / b,
        100.0 * median(reject_share)
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let bare = bare_server().await;
    let mut pool = support::pool("p1", 4);
    // the scripted engine's whole context: long streams
    pool.ctx = 8192;
    let mut cfg = support::config(vec![pool]);
    cfg.queue.capacity = 8;
    cfg.admission.max_tokens_out = TOKENS as u32;
    cfg.stream.metrics_interval_ms = 1000;
    let orch = support::start_with(
        cfg,
        Arc::new(support::ScriptedFactory {
            delay: Duration::ZERO,
            ctx: 8192,
        }),
    )
    .await;
    let client = reqwest::Client::new();

    // SSE throughput
    let mut bare_tps = Vec::new();
    let mut orch_tps = Vec::new();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let n = read_tokens(&client, &format!("{bare}/stream")).await;
        assert_eq!(n, TOKENS);
        bare_tps.push(n as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        let id = orch
            .submit_ok(json!({"prompt": "bench", "max_tokens": TOKENS}))
            .await;
        let n = read_tokens(&client, &orch.url(&format!("/v1/tasks/{id}/stream"))).await;
        assert_eq!(n, TOKENS);
        orch_tps.push(n as f64 / t.elapsed().as_secs_f64());
    }
    let (b, o) = (median(bare_tps), median(orch_tps));
    println!(
        "SSE tokens/s (median of {ROUNDS}, {TOKENS} tokens, admission+queue+engine+SSE included):"
    );
    println!("  bare axum SSE   {b:>10.0}");
    println!("  orchestratord   {o:>10.0}   ratio {:.2}", o / b);

    // admission rate (with a slow engine so the small queue fills and most answers are 429)
    let mut cfg = support::config(vec![support::pool("p1", 2)]);
    cfg.queue.capacity = 8;
    let slow = support::start(cfg, Duration::from_millis(50)).await;
    let small = json!({"prompt": "hello there", "max_tokens": 4});
    compare_admission(
        &client,
        &bare,
        &slow.url("/v1/tasks"),
        &small,
        "Admission requests/s",
    )
    .await;

    // refusals of a big prompt: the queue is full, every answer is a 429
    let mut cfg = support::config(vec![support::pool("p1", 1)]);
    cfg.queue.capacity = 1;
    let full = support::start(cfg, Duration::from_millis(50)).await;
    let hang = full
        .submit_ok(json!({"prompt": "x [hang]", "max_tokens": 4}))
        .await;
    let waiting = full
        .submit_ok(json!({"prompt": "y", "max_tokens": 4}))
        .await;
    let big = json!({"prompt": "word ".repeat(256 * 1024 / 5), "max_tokens": 4});
    compare_admission(
        &client,
        &bare,
        &full.url("/v1/tasks"),
        &big,
        "Refusals/s of a 256 KiB prompt",
    )
    .await;
    full.cancel(&waiting).await;
    full.cancel(&hang).await;
}
