//! Engine speed on the default model: single-stream prompt and decode tokens/s (and the share
//! of the machine's read bandwidth the decode uses: the GGUF's bytes a token over the
//! bandwidth its threads measure), and aggregate
//! decode tokens/s with 1, 4 and 8 concurrent sequences (continuous batching), and with 8 drawing
//! tokens (temperature 1, with and without top-p) against greedy in the same rounds.
//! `--constrained`: the per-token cost of constrained decoding (a JSON Schema through
//! llguidance) against unconstrained decoding of the same prompts, 1 and 8 streams, paired
//! rounds.
//!
//! `cargo bench -p engine-candle --bench engine [-- --threads N --format auto|as-stored|q8_0
//! --kv f32|f16] [--prompts 512,1024] [--draw] [--constrained]`
//! `ci/bench-engine.sh` runs it beside llama.cpp on the same GGUF and thread count.

use std::time::Instant;

use engine_candle::{CandleEngine, EngineOptions, GenerateRequest, WeightFormat};
use engine_port::{OutputConstraint, SamplingParams, SeqEvent};
use tokio_util::sync::CancellationToken;

const ROUNDS: usize = 5;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

struct Run {
    first_token_s: f64,
    tokens: usize,
    end_s: f64,
}

/// Starts `prompts.len()` sequences at once and waits for all.
fn run_batch(e: &CandleEngine, prompts: &[Vec<u32>], max_tokens: usize) -> (Vec<Run>, f64) {
    run_sampled(e, prompts, max_tokens, SamplingParams::default(), None)
}

/// As [`run_batch`], every sequence drawing with `sampling`.
fn run_sampled(
    e: &CandleEngine,
    prompts: &[Vec<u32>],
    max_tokens: usize,
    sampling: SamplingParams,
    constraint: Option<&OutputConstraint>,
) -> (Vec<Run>, f64) {
    let t0 = Instant::now();
    let mut rxs = Vec::new();
    for p in prompts {
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        e.submit(GenerateRequest {
            permit: e.try_acquire().expect("a free slot per prompt"),
            prompt_tokens: p.clone(),
            sampling: sampling.clone(),
            max_tokens,
            stop: vec![],
            constraint: constraint.map(|c| e.constrain(c).expect("the schema compiles")),
            logprobs: None,
            cancel: CancellationToken::new(),
            events: tx,
            failure: Default::default(),
        })
        .expect("submit");
        rxs.push(rx);
    }
    let mut runs = Vec::new();
    for mut rx in rxs {
        let mut first = None;
        let mut n = 0;
        while let Some(ev) = rx.blocking_recv() {
            match ev {
                SeqEvent::Token { .. } => {
                    n += 1;
                    first.get_or_insert(t0.elapsed().as_secs_f64());
                }
                SeqEvent::Done(_) => break,
                SeqEvent::Failed(m) => panic!("{m}"),
            }
        }
        runs.push(Run {
            first_token_s: first.unwrap_or(0.0),
            tokens: n,
            end_s: t0.elapsed().as_secs_f64(),
        });
    }
    let wall = t0.elapsed().as_secs_f64();
    (runs, wall)
}

/// One draw alone over a vocabulary of `vocab` logits (spread like a small chat model's: a
/// few within a couple of nats of the top, most 10–20 below), against greedy's argmax.
fn draw_cost(vocab: usize) {
    let logits: Vec<f32> = (0..vocab)
        .map(|i| {
            let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            -20.0 + 20.0 * (h as f32 / (1u64 << 24) as f32).powi(8)
        })
        .collect();
    let us = |params: SamplingParams| {
        let mut s = engine_candle::Sampler::new(params);
        let mut v = Vec::new();
        for _ in 0..ROUNDS {
            let t0 = Instant::now();
            for _ in 0..200 {
                std::hint::black_box(s.sample(&mut logits.clone(), &[]));
            }
            v.push(t0.elapsed().as_secs_f64() * 1e6 / 200.0);
        }
        median(v)
    };
    let drawn = |top_p| SamplingParams {
        temperature: 1.0,
        top_p,
        ..Default::default()
    };
    println!(
        "one token chosen over {vocab} logits (copy included): greedy {:.0} us, temperature 1 {:.0} us, top_p 0.95 {:.0} us (medians of {ROUNDS})",
        us(SamplingParams::default()),
        us(drawn(1.0)),
        us(drawn(0.95))
    );
}

/// Decode seconds per token of a batch: from its first token to its last, over the tokens
/// after each sequence's first.
fn per_token_s(runs: &[Run]) -> f64 {
    let first = runs
        .iter()
        .map(|r| r.first_token_s)
        .fold(f64::MAX, f64::min);
    let last = runs.iter().map(|r| r.end_s).fold(0.0, f64::max);
    let tokens: usize = runs.iter().map(|r| r.tokens.saturating_sub(1)).sum();
    (last - first) / tokens.max(1) as f64
}

/// Constrained decoding's cost per token against unconstrained, same prompts, same lengths:
/// a schema of 40 three-digit numbers keeps every constrained sequence going for the whole
/// budget. Paired rounds, 1 and 8 streams; medians.
fn constrained_cost(e: &CandleEngine) {
    let schema = serde_json::json!({"type": "object", "properties": {"readings": {
        "type": "array", "minItems": 40, "maxItems": 40,
        "items": {"type": "integer", "minimum": 100, "maximum": 999}}},
        "required": ["readings"], "additionalProperties": false});
    let c = OutputConstraint::JsonSchema(schema.to_string());
    let t0 = Instant::now();
    e.constrain(&c).expect("the schema compiles");
    let first_compile = t0.elapsed().as_secs_f64() * 1e3;
    let t0 = Instant::now();
    e.constrain(&c).expect("the schema compiles");
    let cached = t0.elapsed().as_secs_f64() * 1e3;
    println!(
        "grammar: first compile (vocabulary walk included) {first_compile:.1} ms, again (remembered) {cached:.2} ms"
    );
    // the mask alone, step by step along an answer the schema allows
    let nums: Vec<String> = (0..40).map(|i| (100 + 17 * i).to_string()).collect();
    let answer = format!("{{\"readings\":[{}]}}", nums.join(","));
    let ids = e.tokenizer().encode_plain(&answer).unwrap();
    let mut held = e.constrain(&c).expect("the schema compiles");
    let mut logits = vec![0.0f32; e.info().vocab];
    let mut us = Vec::new();
    for &id in &ids {
        logits.iter_mut().for_each(|l| *l = 0.0);
        let t0 = Instant::now();
        held.mask(&mut logits).expect("a mask");
        us.push(t0.elapsed().as_secs_f64() * 1e6);
        held.consume(id).expect("the answer fits the schema");
    }
    println!(
        "mask of one step over {} logits: median {:.0} us, max {:.0} us ({} steps)",
        logits.len(),
        median(us.clone()),
        us.iter().cloned().fold(0.0, f64::max),
        us.len()
    );
    let prompt = e
        .tokenizer()
        .encode("The history of the bicycle begins in the early nineteenth century. Readings:")
        .unwrap();
    for n in [1usize, 8] {
        let prompts = vec![prompt.clone(); n];
        let (mut plain, mut held, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let (a, _) = run_sampled(e, &prompts, 64, SamplingParams::default(), None);
            let (b, _) = run_sampled(e, &prompts, 64, SamplingParams::default(), Some(&c));
            let (pa, pb) = (per_token_s(&a), per_token_s(&b));
            let all = |r: &[Run]| r.iter().all(|r| r.tokens == 64);
            assert!(all(&a) && all(&b), "every sequence runs its 64 tokens");
            plain.push(pa * 1e3);
            held.push(pb * 1e3);
            ratio.push(pb / pa);
        }
        println!(
            "{n} stream(s), 64 tokens: unconstrained {:.2} ms/token, constrained {:.2} ms/token, ratio {:.3} (medians of {ROUNDS} paired rounds)",
            median(plain),
            median(held),
            median(ratio)
        );
    }
}

/// Prompt tokens/s of fresh prompts (nothing cached) of each length: medians of `ROUNDS`.
fn prefill_sweep(e: &CandleEngine, lens: &[usize]) {
    let text = "The history of the bicycle begins in the early nineteenth century. ".repeat(400);
    let body = e.tokenizer().encode(&text).unwrap();
    for &len in lens {
        let mut tps = Vec::new();
        for round in 0..ROUNDS {
            let mut p = e
                .tokenizer()
                .encode(&format!("Part {len}.{round}."))
                .unwrap();
            let need = len.saturating_sub(p.len());
            p.extend(body.iter().cycle().take(need));
            let (runs, _) = run_batch(e, std::slice::from_ref(&p), 1);
            tps.push(p.len() as f64 / runs[0].first_token_s);
        }
        println!(
            "prefill {len} tokens: {:.1} tok/s (median of {ROUNDS})",
            median(tps)
        );
    }
}

/// Bytes per second `threads` threads read from memory: each sums its share of a 1 GiB buffer
/// (16 lanes of accumulators, so the sum is bound by the reads); best of three.
fn read_bandwidth(threads: usize) -> f64 {
    let buf = vec![1.0f32; (1 << 30) / 4];
    let share = buf.len().div_ceil(threads.max(1));
    (0..3)
        .map(|_| {
            let t0 = Instant::now();
            let total: f32 = std::thread::scope(|s| {
                let parts: Vec<_> = buf
                    .chunks(share)
                    .map(|part| {
                        s.spawn(move || {
                            let mut acc = [0f32; 16];
                            for block in part.as_chunks::<16>().0 {
                                for (a, x) in acc.iter_mut().zip(block) {
                                    *a += x;
                                }
                            }
                            acc.iter().sum::<f32>()
                        })
                    })
                    .collect();
                parts.into_iter().map(|p| p.join().unwrap()).sum()
            });
            std::hint::black_box(total);
            buf.len() as f64 * 4.0 / t0.elapsed().as_secs_f64()
        })
        .fold(0.0, f64::max)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let threads: usize = arg("--threads").map(|v| v.parse().unwrap()).unwrap_or(2);
    engine_candle::configure_process_threads(threads, 0);
    let format: WeightFormat = arg("--format")
        .map(|v| v.parse().unwrap())
        .unwrap_or_default();
    let model = std::env::var("ORCHD_TEST_MODEL").unwrap_or_else(|_| {
        format!(
            "{}/../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf",
            env!("CARGO_MANIFEST_DIR")
        )
    });
    // `--prompts 512,1024,2048`: only the prefill sweep (fresh prompts of those lengths)
    let sweep: Option<Vec<usize>> =
        arg("--prompts").map(|v| v.split(',').map(|n| n.parse().unwrap()).collect());
    let mut opts = EngineOptions::new(&model);
    opts.slots = 8;
    opts.ctx = 2048;
    if let Some(lens) = &sweep {
        opts.slots = 2;
        opts.ctx = lens.iter().max().copied().unwrap_or(0).max(2048) + 8;
    }
    opts.settings.threads = threads;
    opts.settings.weight_format = format;
    opts.settings.kv_type = arg("--kv").map(|v| v.parse().unwrap()).unwrap_or_default();
    let e = CandleEngine::load(opts).expect("model loads");
    let tok = |s: &str| e.tokenizer().encode(s).unwrap();
    // a 128-token prompt
    let mut long =
        tok(&"The history of the bicycle begins in the early nineteenth century. ".repeat(12));
    long.truncate(128);
    let _ = run_batch(&e, std::slice::from_ref(&long), 4); // warm-up
                                                           // `--draw`: only the cost of choosing a token
    if args.iter().any(|a| a == "--draw") {
        draw_cost(e.info().vocab);
        return;
    }
    if args.iter().any(|a| a == "--constrained") {
        constrained_cost(&e);
        return;
    }
    if let Some(lens) = sweep {
        prefill_sweep(&e, &lens);
        return;
    }

    let mut prompt_tps = Vec::new();
    let mut decode_tps = Vec::new();
    for round in 0..ROUNDS {
        // a different first token each round: nothing of it is in any cache row
        let mut fresh = tok(&format!("Part {round}."));
        fresh.extend_from_slice(&long[..long.len() - fresh.len()]);
        let (runs, _) = run_batch(&e, std::slice::from_ref(&fresh), 1);
        prompt_tps.push(fresh.len() as f64 / runs[0].first_token_s);
        let short = tok("Once upon a time");
        let (runs, _) = run_batch(&e, &[short], 128);
        let r = &runs[0];
        decode_tps.push((r.tokens - 1) as f64 / (r.end_s - r.first_token_s));
    }
    println!(
        "engine-candle {:?}, {threads} threads, {}",
        format,
        model.rsplit('/').next().unwrap_or("")
    );
    let decode = median(decode_tps.clone());
    println!("single stream: prompt {:.1} tok/s (128-token prompt), decode {:.1} tok/s (128 tokens), medians of {ROUNDS}",
        median(prompt_tps), decode);
    // what decoding one token must read at least (the GGUF's tensors: every weight once, the
    // tied embedding as the output), against what the machine's memory gives these threads
    let per_token = e.info().weights_bytes as f64;
    let bandwidth = read_bandwidth(threads);
    println!(
        "memory: read bandwidth {:.1} GB/s ({threads} threads, 1 GiB, best of 3); decode reads at least {:.1} MB a token: {:.1} GB/s, {:.0} % of it",
        bandwidth / 1e9,
        per_token / 1e6,
        decode * per_token / 1e9,
        100.0 * decode * per_token / bandwidth
    );
    let questions = [
        "Write a short story about a lighthouse keeper.",
        "Explain how a refrigerator works.",
        "Describe a busy morning market.",
        "Give me a recipe for vegetable soup.",
        "Explain the water cycle to a child.",
        "Write a letter about your last vacation.",
        "What causes the seasons on Earth?",
        "Tell me about the history of the bicycle.",
    ];
    let chat = |n: usize, round: usize| -> Vec<Vec<u32>> {
        // new user turns every round (numbered first): only the chat template's system
        // prompt is shared with what the cache rows hold, as between real users
        questions[..n]
            .iter()
            .map(|q| {
                let p = e
                    .render_chat(&[engine_port::ChatTurn {
                        role: "user".into(),
                        content: format!("{} {q}", n * 10 + round),
                    }])
                    .unwrap();
                tok(&p)
            })
            .collect()
    };
    for n in [1usize, 4, 8] {
        let mut agg = Vec::new();
        for round in 0..3 {
            let (runs, wall) = run_batch(&e, &chat(n, round), 64);
            let total: usize = runs.iter().map(|r| r.tokens).sum();
            agg.push(total as f64 / wall);
        }
        println!("aggregate decode, {n} concurrent x 64 tokens: {:.1} tok/s (wall clock incl. prefill, median of 3)", median(agg));
    }
    // drawn, not greedy: what an OpenAI client gets by default (temperature 1, top_p 1), and
    // a nucleus; each round paired with a greedy one, reported as the ratio
    for (name, top_p) in [
        ("temperature 1", 1.0f32),
        ("temperature 1, top_p 0.95", 0.95),
    ] {
        let mut ratios = Vec::new();
        for round in 0..3 {
            // fresh prompts for each run (no prefix cache), greedy first every other round
            let tps = |k: usize, s: SamplingParams| {
                let (runs, wall) = run_sampled(&e, &chat(8, 100 + 2 * round + k), 64, s, None);
                runs.iter().map(|r| r.tokens).sum::<usize>() as f64 / wall
            };
            let drawing = SamplingParams {
                temperature: 1.0,
                top_p,
                seed: round as u64,
                ..Default::default()
            };
            let (greedy, drawn) = match round % 2 {
                0 => (tps(0, SamplingParams::default()), tps(1, drawing)),
                _ => {
                    let drawn = tps(0, drawing);
                    (tps(1, SamplingParams::default()), drawn)
                }
            };
            ratios.push(drawn / greedy);
        }
        println!(
            "aggregate decode, 8 concurrent x 64 tokens, {name}: {:.2}x greedy's tok/s (median of 3 paired rounds)",
            median(ratios)
        );
    }
    draw_cost(e.info().vocab);
    println!(
        "KV cache: {} MiB for 8 slots x 2048 ctx ({}); prompt tokens reused from cached prefixes: {}",
        e.info().kv_cache_bytes / (1 << 20),
        e.info().kv_type.as_str(),
        e.reused_prompt_tokens()
    );
}
