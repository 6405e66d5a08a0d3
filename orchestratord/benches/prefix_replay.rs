//! Cache-aware placement against load-only placement (PLACE-BENCH-1): a multi-turn chat
//! replay — 16 conversations of 6 turns, 8 at a time, each turn resending the whole
//! conversation as chat clients do, after a user's pause of up to 2 s — through one server with two pools of the default model
//! (4 slots each). `cache`: the server as configured by default (PLACE-2/3: prefixes and
//! `prompt_cache_key`); `load`: the same server with `placement.min_cached_tokens` out of reach
//! and no keys sent, so only load places. Paired runs alternate which goes first; medians of
//! TTFT p50 and p90 over the turns after the first, of the prompt tokens served from cache
//! (OpenAI's `cached_tokens` over `prompt_tokens`), and of the wall time. Also: what a
//! prompt's block hash chain costs (16-token blocks). `TOPOLOGY=remote`: one local pool and
//! a remote worker (an `orchestratord worker` process with its own 4-slot pool of the model,
//! `workers.join_local_models`) instead of two local pools (PLACE-6). `TOPOLOGY=replicas`: two
//! replicas on one NATS node, a 4-slot pool each, each conversation's turns sent to them in
//! turn (PLACE-8; needs `ci/install-nats.sh`). `TOPOLOGY=llama-server`: one 4-slot pool of
//! ours against llama-server (`LLAMA_SERVER=<binary>`, 4 slots of 2,048 positions, 2 threads)
//! on the same replay: what each serves from its cache (its `cached_tokens`, llama-server's
//! `timings.cache_n`). `PROMPT_CACHE_MIB`: our pools' host-memory prompt cache.
//!
//! Each side's busiest pool: the turns it was given over the mean per pool (its servers'
//! `orchd_placement_total`). `SHARED_PROMPT=1`: every conversation opens with the same
//! ~600-token system prompt and asks one question of its own (32 conversations, one turn):
//! the shared prefix must not send them all to one pool.
//!
//! In the topologies of two processes (`remote`, `replicas`) each process's pools get one
//! thread (`PROCESS_THREADS`): one core each of the two, as on machines of their own.
//!
//! `cargo bench -p orchestratord --bench prefix_replay` (env `PAIRS`, `CONVERSATIONS`,
//! `TURNS`, `AT_ONCE`, `MAX_TOKENS`, `THINK_MS`, `POOL_EXTRA`: TOML lines for each of our pools); under `cargo test` one conversation of two turns
//! through the cache-aware server as a smoke test.

mod support;

#[allow(dead_code)]
#[path = "../tests/support/procs.rs"]
mod procs;

#[allow(dead_code)]
#[path = "../tests/support/nats.rs"]
mod nats;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use orchd_tools::loadgen::percentile;
use orchd_tools::sse_reader::SseReader;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use support::{env_or, median, wait_ready};

/// One streamed turn: (TTFT ms, the answer, prompt tokens, cached tokens, answer tokens).
async fn turn(
    client: &reqwest::Client,
    (base, model): (&str, &str),
    messages: &[Value],
    key: Option<&str>,
    max_tokens: usize,
) -> (f64, String, u64, u64, u64) {
    let mut body = json!({
        "model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0,
        "stream": true, "stream_options": {"include_usage": true},
    });
    if let Some(k) = key {
        body["prompt_cache_key"] = json!(k);
    }
    let began = Instant::now();
    let r = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .expect("chat");
    if r.status() != 200 {
        let status = r.status();
        panic!("{base}: {status} {}", r.text().await.unwrap_or_default());
    }
    let mut stream = r.bytes_stream();
    let mut frames = SseReader::new(1 << 20);
    let (mut answer, mut ttft, mut usage) = (String::new(), None, None);
    while let Some(chunk) = stream.next().await {
        for frame in frames
            .feed(&chunk.expect("body"))
            .expect("frames within 1 MiB")
        {
            let Ok(v) = serde_json::from_str::<Value>(&frame.data) else {
                continue; // [DONE]
            };
            if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
                ttft.get_or_insert_with(|| began.elapsed().as_secs_f64() * 1e3);
                answer.push_str(t);
            }
            if v["usage"].is_object() {
                usage = Some(v["usage"].clone());
            }
        }
    }
    let usage = usage.expect("a usage frame");
    (
        ttft.unwrap_or_else(|| began.elapsed().as_secs_f64() * 1e3),
        answer,
        usage["prompt_tokens"].as_u64().unwrap_or(0),
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
        usage["completion_tokens"].as_u64().unwrap_or(0),
    )
}

fn opening(k: usize) -> String {
    let mut s = format!(
        "Conversation {k}. You help me keep a travel diary; answer in one short sentence. "
    );
    for i in 0..30 {
        s.push_str(&format!(
            "Day {i} of trip {k}: we walked {} kilometres and ate at place number {}. ",
            (i * 7 + k) % 23 + 1,
            (i * 13 + k * 5) % 97
        ));
    }
    s.push_str("What was the best day?");
    s
}

struct Replay {
    ttft_p50: f64,
    ttft_p90: f64,
    /// Prompt tokens served from cache, of every prompt token.
    hit: f64,
    /// Cached tokens of the turns after the first, of the history they resent (the previous
    /// turn's prompt and answer).
    history_hit: f64,
    wall_s: f64,
    /// Turns placed on the busiest pool over the mean per pool (the two pools of the
    /// topology); `None` where the server does not count placements (llama-server).
    busiest: Option<f64>,
}

#[derive(Clone, Copy)]
struct Shape {
    conversations: usize,
    turns: usize,
    at_once: usize,
    max_tokens: usize,
    /// A user's pause between an answer and the next turn, at most (each one drawn from
    /// 0..think_ms by the conversation and turn): other conversations' turns come meanwhile.
    think_ms: u64,
    /// Every conversation opens with the same long system prompt and asks its own question
    /// (no history of its own to reuse): placement must not send them all to the pool
    /// holding the shared prefix.
    shared_prompt: bool,
}

/// The system prompt every conversation shares in the `shared_prompt` shape (~600 tokens).
fn shared_system() -> String {
    let mut s = String::from("You are the travel desk of a small agency. House rules follow. ");
    for i in 0..40 {
        s.push_str(&format!(
            "Rule {i}: answer politely, mention office number {} and keep it under {} words. ",
            i * 3 + 1,
            20 + i % 5
        ));
    }
    s
}

/// Turns placed so far per pool, over every server of a side (`orchd_placement_total`,
/// summed over reasons; keyed by server and pool).
async fn placements(client: &reqwest::Client, bases: &[String]) -> Option<Vec<(String, f64)>> {
    let mut out: Vec<(String, f64)> = Vec::new();
    for base in bases {
        let text = client
            .get(format!("{base}/metrics"))
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        for line in text
            .lines()
            .filter(|l| l.starts_with("orchd_placement_total{"))
        {
            let pool = line
                .split("pool=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or_default();
            let n: f64 = line
                .rsplit(' ')
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0);
            let key = format!("{base} {pool}");
            match out.iter_mut().find(|(k, _)| *k == key) {
                Some(e) => e.1 += n,
                None => out.push((key, n)),
            }
        }
    }
    Some(out)
}

/// The busiest pool's turns over the mean of `pools` pools, between two readings.
fn busiest(before: &[(String, f64)], after: &[(String, f64)], pools: usize) -> Option<f64> {
    let placed: Vec<f64> = after
        .iter()
        .map(|(k, n)| n - before.iter().find(|(b, _)| b == k).map_or(0.0, |b| b.1))
        .collect();
    let total: f64 = placed.iter().sum();
    let max = placed.iter().copied().fold(0.0, f64::max);
    (total > 0.0).then(|| max / (total / pools as f64))
}

/// Where a replay's turns go: the servers (a conversation's turns each to the next, as a
/// round-robin balancer in front of replicas sends them), the model, whether keys are sent.
#[derive(Clone)]
struct Side {
    bases: Vec<String>,
    model: &'static str,
    keys: bool,
    /// Pools serving the replay (the mean load is over these).
    pools: usize,
}

async fn replay(client: &reqwest::Client, side: &Side, s: Shape, run: usize) -> Replay {
    let gate = Arc::new(Semaphore::new(s.at_once));
    let placed_before = placements(client, &side.bases).await;
    let began = Instant::now();
    let keys = side.keys;
    let handles: Vec<_> = (0..s.conversations)
        .map(|k| {
            let (client, side, gate) = (client.clone(), side.clone(), gate.clone());
            tokio::spawn(async move {
                let _one = gate.acquire_owned().await.expect("gate");
                // a fresh conversation each run: nothing of it cached before
                let key = keys.then(|| format!("run{run}-conv{k}"));
                let mut messages = match s.shared_prompt {
                    true => vec![
                        json!({"role": "system", "content": shared_system()}),
                        json!({"role": "user", "content": format!("Run {run}, traveller {k}: which day trip do you suggest?")}),
                    ],
                    false => vec![
                        json!({"role": "user", "content": format!("Run {run}. {}", opening(k))}),
                    ],
                };
                let mut out = Vec::new();
                for t in 0..s.turns {
                    let base = &side.bases[(k + t) % side.bases.len()];
                    let to = (base.as_str(), side.model);
                    let r = turn(&client, to, &messages, key.as_deref(), s.max_tokens).await;
                    messages.push(json!({"role": "assistant", "content": r.1}));
                    messages
                        .push(json!({"role": "user", "content": format!("And on day {}?", t + 3)}));
                    out.push((t, r.0, r.2, r.3, r.4));
                    if s.think_ms > 0 {
                        let pause = (k as u64 * 7919 + t as u64 * 104_729) % s.think_ms;
                        tokio::time::sleep(Duration::from_millis(pause)).await;
                    }
                }
                out
            })
        })
        .collect();
    let (mut ttfts, mut prompt, mut cached) = (Vec::new(), 0u64, 0u64);
    let (mut resent, mut resent_cached) = (0u64, 0u64);
    for h in handles {
        let mut before = 0;
        for (t, ttft, p, c, answer) in h.await.expect("conversation") {
            if t > 0 || s.shared_prompt {
                ttfts.push(ttft);
                resent += before;
                resent_cached += c.min(before);
            }
            before = p + answer;
            prompt += p;
            cached += c;
        }
    }
    let wall_s = began.elapsed().as_secs_f64();
    let placed_after = placements(client, &side.bases).await;
    Replay {
        busiest: placed_before
            .zip(placed_after)
            .and_then(|(b, a)| busiest(&b, &a, side.pools)),
        ttft_p50: percentile(&mut ttfts, 0.5),
        ttft_p90: percentile(&mut ttfts, 0.9),
        hit: cached as f64 / prompt.max(1) as f64,
        history_hit: resent_cached as f64 / resent.max(1) as f64,
        wall_s,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let model = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !model.exists() {
        eprintln!(
            "prefix_replay bench: {} missing (run ci/fetch-model.sh); skipped",
            model.display()
        );
        return;
    }
    let (pairs, shape) = if full {
        (
            env_or("PAIRS", 3),
            Shape {
                conversations: env_or("CONVERSATIONS", 16),
                turns: env_or("TURNS", 6),
                at_once: env_or("AT_ONCE", 8),
                max_tokens: env_or("MAX_TOKENS", 16),
                think_ms: env_or("THINK_MS", 2000) as u64,
                shared_prompt: false,
            },
        )
    } else {
        (
            1,
            Shape {
                conversations: 1,
                turns: 2,
                at_once: 1,
                max_tokens: 4,
                think_ms: 0,
                shared_prompt: false,
            },
        )
    };
    // SHARED_PROMPT=1: one long system prompt shared by every conversation, one turn each
    let mut shape = shape;
    if full && std::env::var("SHARED_PROMPT").is_ok_and(|v| v == "1") {
        shape.shared_prompt = true;
        shape.turns = 1;
        shape.conversations = env_or("CONVERSATIONS", 32);
    }
    // the chain of a 4,096-token prompt, as placement computes it once per task
    let tokens: Vec<u32> = (0..4096u32)
        .map(|i| i.wrapping_mul(2654435761) % 49152)
        .collect();
    let n = if full { 2000 } else { 10 };
    let t0 = Instant::now();
    let mut blocks = 0;
    for _ in 0..n {
        blocks += std::hint::black_box(pool_manager::prefix_chain(&tokens)).len();
    }
    let chain_us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
    let topology = if full {
        std::env::var("TOPOLOGY").unwrap_or_default()
    } else {
        String::new()
    };
    let (remote, replicas) = (topology == "remote", topology == "replicas");
    let llama = topology == "llama-server";
    const SECRET: &str = "prefix-replay";
    // a server's pools: two local ones, or one and a remote worker, or (a replica) one
    // env PROMPT_CACHE_MIB: each pool's host-memory prompt cache (else the default)
    let mut cache_mib = std::env::var("PROMPT_CACHE_MIB")
        .map(|m| format!("prompt_cache_mib = {m}\n"))
        .unwrap_or_default();
    // env POOL_EXTRA: more TOML for each of our pools (`step_prompt_tokens = 64`, ...)
    if let Ok(extra) = std::env::var("POOL_EXTRA") {
        cache_mib.push_str(&extra.replace("\\n", "\n"));
        cache_mib.push('\n');
    }
    // where each side runs in two processes (a worker, replicas), each gets one of the two
    // cores, as on machines of their own (`PROCESS_THREADS`), not both: two processes each
    // spinning two compute threads on two cores take the cores from each other; the two
    // local pools of one process share its compute threads
    let threads = match remote || replicas {
        true => format!("threads = {}\n", env_or("PROCESS_THREADS", 1)),
        false => String::new(),
    };
    let pools = |extra: &str, alias: &str| {
        let local = format!(
            "[[pools]]\nid = \"a\"\nmodel = \"{m}\"\nalias = \"{alias}\"\nslots = 4\nctx = 2048\n{cache_mib}{threads}",
            m = model.display()
        );
        if remote {
            format!("{extra}[workers]\nsecret = \"{SECRET}\"\njoin_local_models = true\n{local}")
        } else if replicas {
            format!("{extra}[cluster]\nstream_replicas = 1\nheartbeat_ms = 500\n\n{local}")
        } else if llama {
            format!("{extra}{local}")
        } else {
            format!(
                "{extra}{local}{}",
                local.replace("id = \"a\"", "id = \"b\"")
            )
        }
    };
    // the worker of a server, in the remote topology, serving the side's model name (else the
    // server ignores the worker's model: the load-only side ran on its local pool alone)
    let worker_of = |base: &str, alias: &str| {
        remote.then(|| {
            let cfg = procs::worker_config(&model.display().to_string(), 4)
                .replace("1024", "2048")
                .replace("alias = \"smol\"", &format!("alias = \"{alias}\""))
                .replace("threads = 1\n", &threads);
            procs::worker(base, SECRET, "w", &cfg, &[])
        })
    };
    // both sides' replicas on one NATS node, each side its own model name (so its own queue)
    let nats = if replicas {
        Some(nats::NatsCluster::start(1).await)
    } else {
        None
    };
    let urls = nats.as_ref().map(|n| n.urls()).unwrap_or_default();
    let client = reqwest::Client::new();
    let mut procs_kept = Vec::new();
    let side = |name: &str, config: String, model: &'static str, keys: bool| {
        let (client, urls, name) = (client.clone(), urls.clone(), name.to_string());
        let mut kept = Vec::new();
        async move {
            let mut bases = Vec::new();
            let n = if replicas { 2 } else { 1 };
            for i in 0..n {
                let id = format!("{name}{i}");
                let mut env = vec![("RUST_LOG", "warn")];
                if replicas {
                    env.push(("ORCHD_CLUSTER_NATS", urls.as_str()));
                    env.push(("ORCHD_REPLICA_ID", id.as_str()));
                }
                let (p, base) = procs::server_env_answering(&config, &env).await;
                kept.push((p, worker_of(&base, model)));
                bases.push(base);
            }
            for base in &bases {
                wait_ready(&client, base, if llama { 1 } else { 2 }).await;
            }
            let pools = if llama { 1 } else { 2 };
            (
                Side {
                    bases,
                    model,
                    keys,
                    pools,
                },
                kept,
            )
        }
    };
    let (cache, kept) = side("c", pools("", "smol"), "smol", true).await;
    procs_kept.push(kept);
    if !full {
        // the smoke test: one conversation through the cache-aware server, its turns placed
        let r = replay(&client, &cache, shape, 0).await;
        assert!(r.hit > 0.0, "a later turn reused its conversation's prefix");
        assert!(
            r.busiest.is_some(),
            "the server counts where it placed the turns"
        );
        println!(
            "prefix replay smoke: {:.0} % of prompt tokens from cache",
            r.hit * 100.0
        );
        return;
    }
    let (load, _llama_proc) = if llama {
        let binary = std::env::var("LLAMA_SERVER").expect("LLAMA_SERVER: a llama-server binary");
        let (p, base) = llama_server(&binary, &model).await;
        let side = Side {
            bases: vec![base],
            model: "smol",
            keys: false,
            pools: 1,
        };
        (side, Some(p))
    } else {
        let load_only = pools("[placement]\nmin_cached_tokens = 1000000000\n", "smol-l");
        let (load, kept) = side("l", load_only, "smol-l", false).await;
        procs_kept.push(kept);
        (load, None)
    };
    println!(
        "prefix replay: {pairs} pairs x {} conversations of {} turns, {} at once, {} tokens per answer, pauses of 0-{} ms between turns; {}",
        shape.conversations,
        shape.turns,
        shape.at_once,
        shape.max_tokens,
        shape.think_ms,
        if remote {
            "a local pool and a remote worker of 4 slots each"
        } else if replicas {
            "two replicas (one NATS node) of a 4-slot pool each, turns sent to them in turn"
        } else if llama {
            "one 4-slot pool against llama-server -np 4 -c 8192 -t 2 (its prompt cache on)"
        } else {
            "two pools of 4 slots"
        }
    );
    println!(
        "block hash chain of a 4,096-token prompt: {chain_us:.1} us ({} blocks of 16 tokens)",
        blocks / n
    );
    let mut rows: [Vec<Replay>; 2] = [Vec::new(), Vec::new()];
    for pair in 0..pairs {
        for i in if pair % 2 == 0 { [0, 1] } else { [1, 0] } {
            let side = if i == 0 { &cache } else { &load };
            rows[i].push(replay(&client, side, shape, pair).await);
        }
    }
    let names = if llama {
        ["orchestratord", "llama-server"]
    } else {
        ["cache + sessions", "load only"]
    };
    if shape.shared_prompt {
        println!("every conversation opens with the same ~600-token system prompt, one turn each (TTFT over every turn)");
    }
    println!(
        "| placement | TTFT p50 ms (turns 2+) | TTFT p90 ms | prompt tokens from cache | resent history from cache | wall s | busiest pool / mean (turns) |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut meds = Vec::new();
    for (side, name) in names.into_iter().enumerate() {
        let r = &rows[side];
        let m = [
            median(&mut r.iter().map(|x| x.ttft_p50).collect::<Vec<_>>()),
            median(&mut r.iter().map(|x| x.ttft_p90).collect::<Vec<_>>()),
            median(&mut r.iter().map(|x| x.hit).collect::<Vec<_>>()),
            median(&mut r.iter().map(|x| x.history_hit).collect::<Vec<_>>()),
            median(&mut r.iter().map(|x| x.wall_s).collect::<Vec<_>>()),
        ];
        let mut busiest: Vec<f64> = r.iter().filter_map(|x| x.busiest).collect();
        let busiest = match busiest.is_empty() {
            true => "—".to_string(),
            false => format!(
                "{:.2}x (max {:.2}x)",
                median(&mut busiest),
                busiest.iter().copied().fold(0.0, f64::max)
            ),
        };
        println!(
            "| {name} | {:.0} | {:.0} | {:.1} % | {:.1} % | {:.1} | {busiest} |",
            m[0],
            m[1],
            m[2] * 100.0,
            m[3] * 100.0,
            m[4]
        );
        meds.push(m);
    }
    println!(
        "ratios {}/{}: TTFT p50 {:.2}x, p90 {:.2}x, wall {:.2}x",
        names[0],
        names[1],
        meds[0][0] / meds[1][0].max(1e-9),
        meds[0][1] / meds[1][1].max(1e-9),
        meds[0][4] / meds[1][4].max(1e-9)
    );
}

/// llama-server (`LLAMA_SERVER`, a llama.cpp build) on `model` with the slots and context of
/// our one pool: 4 slots of 2,048 positions, 2 threads, its prompt cache on (its default).
async fn llama_server(binary: &str, model: &std::path::Path) -> (procs::Proc, String) {
    let port = procs::free_port();
    let log = procs::scratch("llama-server").join("log");
    let out = std::fs::File::create(&log).expect("log file");
    let child = std::process::Command::new(binary)
        .args(["-m", &model.display().to_string()])
        .args(["-np", "4", "-c", "8192", "-t", "2", "--host", "127.0.0.1"])
        .args(["--port", &port.to_string()])
        .stdout(out.try_clone().expect("log file"))
        .stderr(out)
        .spawn()
        .expect("llama-server starts");
    let base = format!("http://127.0.0.1:{port}");
    let proc = procs::Proc { child, log };
    for _ in 0..600 {
        if reqwest::get(format!("{base}/health"))
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            return (proc, base);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("llama-server never answered /health:\n{}", proc.log_text());
}
