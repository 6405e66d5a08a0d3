//! ENG-BATCH-1: continuous batching must not change results. Its own test binary (own
//! process and engine), so "alone" really means alone.

mod common;

use common::*;
use engine_port::SamplingParams;

/// ENG-BATCH-1: 8 sequences of different lengths, joining and leaving, decode exactly the
/// tokens each produces alone (greedy).
#[test]
fn continuous_batching_matches_solo_runs() {
    let e = engine();
    let questions = [
        ("What is 2+2?", 12),
        ("Name a fruit.", 30),
        ("Describe the moon in one sentence.", 20),
        ("What colour is the sky?", 40),
        ("Say hello in French.", 8),
        ("Why do birds fly south in winter? Explain briefly.", 36),
        ("Give me a synonym for happy.", 16),
        ("What is the largest planet in the solar system?", 24),
    ];
    let prompts: Vec<(Vec<u32>, usize)> = questions
        .iter()
        .map(|(q, n)| (chat_tokens(e, q), *n))
        .collect();
    let solo: Vec<Vec<u32>> = prompts
        .iter()
        .map(|(p, n)| greedy(e, p.clone(), *n).ids)
        .collect();
    // staggered joins: start half, let them run, then add the rest while they decode
    let mut handles = Vec::new();
    for (i, (p, n)) in prompts.iter().enumerate() {
        let (rx, c) = start(e, p.clone(), SamplingParams::default(), *n, vec![]);
        handles.push((rx, c));
        if i == 3 {
            std::thread::sleep(std::time::Duration::from_millis(150));
        }
    }
    for (i, (rx, _c)) in handles.into_iter().enumerate() {
        let out = collect(rx);
        assert_eq!(out.ids, solo[i], "sequence {i} ({:?})", questions[i].0);
    }
}
