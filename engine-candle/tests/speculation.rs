//! ENG-SPEC-1: speculation by prompt lookup changes how fast tokens come, never which: greedy
//! and seeded outputs are the same with guessing on and off, alone and beside other
//! sequences; a rewrite of the prompt keeps guesses (fewer passes), and the budget and stop
//! sequences end a sequence where they would without guesses.

mod common;

use common::*;
use engine_candle::CandleEngine;
use engine_port::{FinishReason, SamplingParams};

const REWRITE: &str = "Repeat the following text exactly, word for word, and nothing else:\n\
    The old lighthouse keeper climbed the spiral stairs every evening at dusk, lit the great \
    lamp, and watched the ships pass safely through the narrow channel between the rocks.";
const PROSE: &str = "Write a short poem about the sea at night.";

fn engine(slots: usize, draft_tokens: usize) -> CandleEngine {
    let mut opts = test_options();
    opts.slots = slots;
    opts.ctx = 512;
    opts.settings.draft_tokens = draft_tokens;
    CandleEngine::load(opts).expect("model loads")
}

fn run(e: &CandleEngine, prompt: &[u32], sampling: SamplingParams, max: usize) -> Output {
    let (rx, _c) = start(e, prompt.to_vec(), sampling, max, vec![]);
    collect(rx)
}

fn with_draft(n: Option<usize>, sampling: SamplingParams) -> SamplingParams {
    SamplingParams {
        draft_tokens: n,
        ..sampling
    }
}

#[test]
fn guessing_gives_the_tokens_plain_decoding_gives() {
    let e = engine(4, 0);
    let rewrite = chat_tokens(&e, REWRITE);
    let prose = chat_tokens(&e, PROSE);
    let seeded = SamplingParams {
        temperature: 0.8,
        top_p: 0.95,
        seed: 17,
        ..Default::default()
    };
    for (what, prompt) in [("rewrite", &rewrite), ("prose", &prose)] {
        for sampling in [SamplingParams::default(), seeded.clone()] {
            let plain = run(&e, prompt, sampling.clone(), 64);
            assert_eq!(plain.finish.guessed_tokens, 0, "the pool does not guess");
            let guessed = run(&e, prompt, with_draft(Some(6), sampling.clone()), 64);
            assert_eq!(
                guessed.ids, plain.ids,
                "{what}, temperature {}: the same tokens with guessing",
                sampling.temperature
            );
            assert_eq!(guessed.text, plain.text);
            assert_eq!(guessed.finish.reason, plain.finish.reason);
            assert_eq!(guessed.finish.tokens_out, plain.finish.tokens_out);
            assert!(guessed.finish.guesses_kept <= guessed.finish.guessed_tokens);
        }
    }
    let greedy_rewrite = run(&e, &rewrite, with_draft(Some(6), Default::default()), 64);
    let kept = greedy_rewrite.finish.guesses_kept;
    eprintln!(
        "rewrite: {kept} kept of {} guessed, {} out: {:?}",
        greedy_rewrite.finish.guessed_tokens, greedy_rewrite.finish.tokens_out, greedy_rewrite.text
    );
    assert!(
        kept * 3 >= greedy_rewrite.finish.tokens_out,
        "repeating the prompt, at least a third of the tokens come from kept guesses \
         ({kept} of {} kept, {} guessed)",
        greedy_rewrite.finish.tokens_out,
        greedy_rewrite.finish.guessed_tokens
    );
}

#[test]
fn the_pools_setting_applies_and_a_request_can_turn_it_off() {
    let e = engine(2, 5);
    let rewrite = chat_tokens(&e, REWRITE);
    let by_pool = run(&e, &rewrite, SamplingParams::default(), 48);
    assert!(
        by_pool.finish.guesses_kept > 0,
        "the pool's setting guesses"
    );
    let off = run(&e, &rewrite, with_draft(Some(0), Default::default()), 48);
    assert_eq!(
        off.finish.guessed_tokens, 0,
        "0 in the request turns it off"
    );
    assert_eq!(off.ids, by_pool.ids);
}

#[test]
fn sequences_beside_a_guessing_one_get_their_own_tokens() {
    let e = engine(3, 0);
    let prompts = [
        chat_tokens(&e, REWRITE),
        chat_tokens(&e, PROSE),
        chat_tokens(&e, "List three colours."),
    ];
    let alone: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| run(&e, p, SamplingParams::default(), 48).ids)
        .collect();
    // all three at once, the first and the third guessing
    let started: Vec<_> = prompts
        .iter()
        .enumerate()
        .map(|(k, p)| {
            let n = if k == 1 { None } else { Some(4) };
            start(&e, p.clone(), with_draft(n, Default::default()), 48, vec![])
        })
        .collect();
    for (k, (rx, _c)) in started.into_iter().enumerate() {
        assert_eq!(collect(rx).ids, alone[k], "sequence {k} beside the others");
    }
}

#[test]
fn the_budget_and_stop_sequences_end_a_guessing_sequence_where_they_would() {
    let e = engine(1, 0);
    let rewrite = chat_tokens(&e, REWRITE);
    let full = run(&e, &rewrite, SamplingParams::default(), 40);
    for max in [1, 2, 7, 13] {
        let cut = run(&e, &rewrite, with_draft(Some(8), Default::default()), max);
        assert_eq!(cut.finish.tokens_out, max, "max_tokens {max} with guesses");
        assert_eq!(cut.finish.reason, FinishReason::Length);
        assert_eq!(cut.ids, full.ids[..max].to_vec());
    }
    // a stop sequence inside the repeated text: the same cut with and without guesses
    let stop = vec!["spiral".to_string()];
    let (rx, _c) = start(
        &e,
        rewrite.clone(),
        SamplingParams::default(),
        40,
        stop.clone(),
    );
    let plain = collect(rx);
    let (rx, _c) = start(
        &e,
        rewrite,
        with_draft(Some(8), Default::default()),
        40,
        stop,
    );
    let guessed = collect(rx);
    assert_eq!(guessed.text, plain.text);
    assert_eq!(guessed.finish.reason, plain.finish.reason);
    assert_eq!(guessed.finish.stop_sequence, plain.finish.stop_sequence);
}

/// The same on Gemma 3 (local sliding-window layers, a logit soft-cap, K-quant weights).
#[test]
fn on_gemma_guesses_give_the_tokens_plain_decoding_gives() {
    let mut opts = test_options();
    opts.model_path = gemma_path();
    opts.slots = 1;
    opts.ctx = 512;
    let e = CandleEngine::load(opts).expect("gemma loads");
    let rewrite = chat_tokens(&e, REWRITE);
    let plain = run(&e, &rewrite, SamplingParams::default(), 48);
    let guessed = run(&e, &rewrite, with_draft(Some(6), Default::default()), 48);
    assert_eq!(guessed.ids, plain.ids);
    assert!(
        guessed.finish.guesses_kept > 0,
        "the rewrite keeps guesses on gemma too ({} of {})",
        guessed.finish.guesses_kept,
        guessed.finish.guessed_tokens
    );
}
