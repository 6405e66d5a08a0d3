//! The engine on one device, in the shapes llama.cpp's own benchmarks report, so the two can
//! be set side by side in one run (`ci/gpu/on-device.sh` runs both on a GPU):
//! - decode tokens/s with N sequences decoding together (`llama-batched-bench` S_TG: 128-token
//!   prompts, 128 generated each; counted from the last sequence's first token to the end);
//! - prompt tokens/s of one fresh prompt of each length (`llama-bench` pp512/pp2048) and its
//!   time to first token.
//!
//! `cargo bench -p engine-candle --bench device_sweep -- [--device cpu|cuda:0]
//! [--concurrency 1,8,32,64] [--prompts 512,2048] [--decode 128] [--rounds 3] [--threads N]`
//! Model: `ORCHD_TEST_MODEL`, else the default one. Prints one line per figure and a JSON
//! object per figure (`{"bench": ...}`) for the run's report. With no arguments at all (as
//! `cargo test --all-targets` runs it) it is a smoke run at small sizes.

use std::time::Instant;

use engine_candle::{CandleEngine, DeviceChoice, EngineOptions, GenerateRequest};
use engine_port::{SamplingParams, SeqEvent};
use tokio_util::sync::CancellationToken;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// When each token of one sequence arrived (seconds from the batch's start).
struct Run {
    times: Vec<f64>,
}

impl Run {
    fn first_s(&self) -> f64 {
        self.times.first().copied().unwrap_or(f64::NAN)
    }
}

/// Starts every prompt at once (greedy, `max_tokens` each) and waits for all.
fn run(e: &CandleEngine, prompts: &[Vec<u32>], max_tokens: usize) -> Vec<Run> {
    let t0 = Instant::now();
    let mut rxs = Vec::new();
    for p in prompts {
        let (tx, rx) = tokio::sync::mpsc::channel(max_tokens + 8);
        e.submit(GenerateRequest {
            permit: e.try_acquire().expect("a free slot per prompt"),
            prompt_tokens: p.clone(),
            sampling: SamplingParams::default(),
            max_tokens,
            stop: vec![],
            constraint: None,
            logprobs: None,
            cancel: CancellationToken::new(),
            events: tx,
            failure: Default::default(),
        })
        .expect("submit");
        rxs.push(rx);
    }
    // one reader per sequence, so each token is timed when it is sent, not when its turn comes
    let readers: Vec<_> = rxs
        .into_iter()
        .map(|mut rx| {
            std::thread::spawn(move || {
                let mut times = Vec::with_capacity(max_tokens);
                while let Some(ev) = rx.blocking_recv() {
                    match ev {
                        SeqEvent::Token { .. } => times.push(t0.elapsed().as_secs_f64()),
                        SeqEvent::Done(_) => break,
                        SeqEvent::Failed(m) => panic!("sequence failed: {m}"),
                    }
                }
                Run { times }
            })
        })
        .collect();
    readers
        .into_iter()
        .map(|r| r.join().expect("a reader"))
        .collect()
}

fn list(arg: Option<String>, default: &[usize]) -> Vec<usize> {
    arg.map(|v| v.split(',').map(|n| n.parse().expect("a number")).collect())
        .unwrap_or_else(|| default.to_vec())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let device: DeviceChoice = arg("--device")
        .map(|d| d.parse().expect("--device cpu | cuda:N"))
        .unwrap_or(DeviceChoice::Cpu);
    // candle's plain dequantizing CUDA matmuls instead of MMVQ/MMQ (a GPU day's comparison)
    #[cfg(feature = "cuda")]
    if args.iter().any(|a| a == "--dmmv") {
        candle_core::quantized::cuda::set_force_dmmv(true);
    }
    let threads: usize = arg("--threads").map_or(0, |v| v.parse().expect("threads"));
    engine_candle::configure_process_threads(threads, 0);
    // run with no arguments at all (`cargo test --all-targets` runs benches so): a smoke run
    // of every step at sizes the CPU finishes in seconds
    let smoke = args.len() == 1;
    let concurrency = list(
        arg("--concurrency"),
        if smoke { &[1, 2] } else { &[1, 8, 32, 64] },
    );
    let prompt_lens = list(arg("--prompts"), if smoke { &[64] } else { &[512, 2048] });
    let decode: usize =
        arg("--decode").map_or(if smoke { 8 } else { 128 }, |v| v.parse().expect("decode"));
    let rounds: usize =
        arg("--rounds").map_or(if smoke { 1 } else { 3 }, |v| v.parse().expect("rounds"));
    let model = std::env::var("ORCHD_TEST_MODEL").unwrap_or_else(|_| {
        format!(
            "{}/../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf",
            env!("CARGO_MANIFEST_DIR")
        )
    });
    let load = |slots: usize, ctx: usize| {
        let mut opts = EngineOptions::new(&model);
        opts.slots = slots;
        opts.ctx = ctx;
        opts.settings.device = device;
        opts.settings.threads = threads;
        let t0 = Instant::now();
        let e = CandleEngine::load(opts).expect("model loads");
        (e, t0.elapsed().as_secs_f64())
    };
    let report = |what: &str, value: f64, unit: &str, extra: &str| {
        println!("{what}: {value:.1} {unit}{extra}");
        println!(
            "{}",
            serde_json::json!({"bench": what, "device": device.to_string(), "value": value,
                "unit": unit})
        );
    };
    let text = "The history of the bicycle begins in the early nineteenth century. ".repeat(400);

    // prompt throughput and time to first token: one fresh prompt at a time
    let longest = prompt_lens.iter().copied().max().unwrap_or(0);
    if longest > 0 {
        let (e, load_s) = load(1, longest + 64);
        println!("# {device}: engine for prompts loaded in {load_s:.2} s");
        let body = e.tokenizer().encode(&text).expect("encodes");
        let prompt = |len: usize, round: usize| {
            // a different first token each round: nothing of it is in the cache row
            let mut p = e
                .tokenizer()
                .encode(&format!("Part {len}.{round}."))
                .expect("encodes");
            let need = len.saturating_sub(p.len());
            p.extend(body.iter().cycle().take(need));
            p
        };
        let _ = run(&e, &[prompt(longest.min(128), 999)], 2); // warm-up (kernels load)
        for &len in &prompt_lens {
            let mut ttft = Vec::new();
            for round in 0..rounds {
                ttft.push(run(&e, &[prompt(len, round)], 1)[0].first_s());
            }
            let t = median(ttft);
            report(
                &format!("prompt {len} tokens"),
                len as f64 / t,
                "tok/s",
                &format!(
                    " (time to first token {:.1} ms, median of {rounds})",
                    t * 1e3
                ),
            );
        }
    }

    // decode throughput with N sequences together
    let most = concurrency.iter().copied().max().unwrap_or(0);
    if most > 0 {
        let (e, load_s) = load(most, 128 + decode + 64);
        println!("# {device}: engine for {most} sequences loaded in {load_s:.2} s");
        let body = e.tokenizer().encode(&text).expect("encodes");
        let prompts = |n: usize, round: usize| -> Vec<Vec<u32>> {
            (0..n)
                .map(|i| {
                    let mut p = e
                        .tokenizer()
                        .encode(&format!("Part {n}.{round}.{i}."))
                        .expect("encodes");
                    let need = 128usize.saturating_sub(p.len());
                    p.extend(body.iter().skip(i).cycle().take(need));
                    p
                })
                .collect()
        };
        let _ = run(&e, &prompts(most.min(8), 999), 4); // warm-up
        for &n in &concurrency {
            let mut tps = Vec::new();
            let mut whole = Vec::new();
            for round in 0..rounds {
                let runs = run(&e, &prompts(n, round), decode);
                // from the last sequence's first token (every prompt in) to the last token
                let start = runs.iter().map(Run::first_s).fold(0.0, f64::max);
                let all = runs.iter().flat_map(|r| r.times.iter().copied());
                let end = all.clone().fold(0.0, f64::max);
                let after = all.clone().filter(|&t| t > start).count();
                tps.push(after as f64 / (end - start));
                whole.push(all.count() as f64 / end);
            }
            report(
                &format!("decode {n} sequences"),
                median(tps),
                "tok/s",
                &format!(
                    " ({decode} tokens each after 128-token prompts; {:.1} tok/s counting prefill, medians of {rounds})",
                    median(whole)
                ),
            );
        }
    }
}
