//! ENG-LP-1: the log-probabilities a sequence reports are the log-softmax of the model's
//! logits: at each greedy step the chosen token is the likeliest, the alternatives come most
//! likely first and sum to at most 1, and the gap between the best two matches llama.cpp's
//! top-2 logit margin (the reference fixture, computed from llama.cpp's logits) within the
//! rounding the two engines' kernels differ by.

mod common;

use common::*;
use engine_candle::{CandleEngine, GenerateRequest, WeightFormat};
use engine_port::{SamplingParams, SeqEvent, StepLogprobs};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

#[derive(Deserialize)]
struct Fixture {
    n_tokens: usize,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    top2_margins: Vec<f64>,
}

/// Largest difference allowed between our top-2 gap and llama.cpp's margin, and the typical
/// one: single roundings move a logit by up to ~0.3 (every matmul input re-quantized to 8
/// bits, ENG-REF-1) and a gap has two. Measured (the default weights, 144 steps on llama.cpp's
/// path): median 0.089, max 0.57.
const MAX_GAP_DIFF: f64 = 0.8;
const MEDIAN_GAP_DIFF: f64 = 0.15;

fn steps(e: &CandleEngine, prompt: Vec<u32>, n: usize, top: usize) -> Vec<(u32, StepLogprobs)> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    let permit = loop {
        if let Some(p) = e.try_acquire() {
            break p;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    e.submit(GenerateRequest {
        permit,
        prompt_tokens: prompt,
        sampling: SamplingParams::default(),
        max_tokens: n,
        stop: vec![],
        constraint: None,
        logprobs: Some(top),
        cancel: CancellationToken::new(),
        events: tx,
    })
    .expect("submit");
    let mut out = Vec::new();
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            SeqEvent::Token { id, logprobs, .. } => {
                out.push((
                    id.expect("an id"),
                    *logprobs.expect("logprobs were asked for"),
                ));
            }
            SeqEvent::Done(_) => break,
            SeqEvent::Failed(m) => panic!("{m}"),
        }
    }
    out
}

#[test]
fn logprobs_are_the_log_softmax_and_match_llama_cpp_margins() {
    let mut opts = test_options();
    opts.slots = 1;
    opts.ctx = 512;
    opts.settings.weight_format = WeightFormat::Auto;
    let e = CandleEngine::load(opts).expect("default model loads");
    let f: Fixture = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/llama_cpp_greedy.json"),
        )
        .expect("fixture"),
    )
    .expect("fixture parses");
    let mut diffs = Vec::new();
    for c in &f.cases {
        let got = steps(&e, c.prompt_ids.clone(), f.n_tokens, 5);
        assert!(!got.is_empty());
        let mut on_path = true;
        for (k, (id, lp)) in got.iter().enumerate() {
            // greedy: the chosen token is the likeliest, with the same log-probability
            assert_eq!(lp.chosen.id, *id);
            assert_eq!(lp.top.len(), 5);
            assert_eq!(lp.top[0].id, *id, "step {k}: greedy picked the likeliest");
            assert_eq!(lp.top[0].logprob, lp.chosen.logprob);
            assert!(lp.top.windows(2).all(|w| w[0].logprob >= w[1].logprob));
            assert!(lp.chosen.logprob <= 0.0);
            let mass: f64 = lp.top.iter().map(|t| f64::from(t.logprob).exp()).sum();
            assert!(mass <= 1.0 + 1e-5, "{mass}");
            assert_eq!(lp.chosen.bytes, e.tokenizer().token_bytes(*id));
            // llama.cpp's margin where both engines are on the same path
            on_path &= c.greedy_ids.get(k) == Some(id);
            if on_path {
                let gap = f64::from(lp.top[0].logprob - lp.top[1].logprob);
                diffs.push((gap - c.top2_margins[k]).abs());
            }
        }
    }
    diffs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let median = diffs[diffs.len() / 2];
    let max = diffs[diffs.len() - 1];
    println!(
        "{} steps: |our top-2 gap - llama.cpp's margin| median {median:.4}, max {max:.4}",
        diffs.len()
    );
    assert!(diffs.len() >= 50, "{}", diffs.len());
    assert!(
        median < MEDIAN_GAP_DIFF && max < MAX_GAP_DIFF,
        "median {median}, max {max}"
    );
}
