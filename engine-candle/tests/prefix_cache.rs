//! ENG-BATCH-4: a slot's cache row keeps its last prompt, and a new prompt sharing a prefix
//! with it starts after that prefix — with exactly the tokens a fresh prefill gives (greedy
//! and seeded), because attention is independent of how a prompt is chunked.

mod common;

use common::*;
use engine_candle::{CandleEngine, EngineOptions, SamplingParams};

#[test]
fn a_cached_prefix_gives_the_same_tokens_as_a_fresh_prefill() {
    let mut opts = EngineOptions::new(model_path());
    opts.slots = 1;
    opts.ctx = 512;
    let e = CandleEngine::load(opts).expect("model loads");
    let p2 = chat_tokens(&e, "What causes the seasons on Earth?");
    let p1 = chat_tokens(&e, "Describe a busy morning market.");
    let shared = p1.iter().zip(&p2).take_while(|(a, b)| a == b).count();
    assert!(
        shared > 10,
        "the template's system prompt is shared ({shared} tokens)"
    );

    let fresh = greedy(&e, p2.clone(), 24);
    assert_eq!(e.reused_prompt_tokens(), 0, "an empty row holds nothing");
    let _ = greedy(&e, p1.clone(), 8);
    let after_p1 = e.reused_prompt_tokens();
    assert_eq!(
        after_p1, shared as u64,
        "p1 starts after the prefix p2 left"
    );
    let again = greedy(&e, p2.clone(), 24);
    assert_eq!(e.reused_prompt_tokens() - after_p1, shared as u64);
    assert_eq!(again.ids, fresh.ids, "reused prefix, same greedy tokens");

    // the same prompt again: everything but its last token comes from the row
    let before = e.reused_prompt_tokens();
    let third = greedy(&e, p2.clone(), 24);
    assert_eq!(e.reused_prompt_tokens() - before, (p2.len() - 1) as u64);
    assert_eq!(third.ids, fresh.ids);

    // seeded sampling is reproducible whatever the row held
    let sampled = |e: &CandleEngine| {
        let params = SamplingParams {
            temperature: 0.9,
            seed: 11,
            ..Default::default()
        };
        let (rx, _c) = start(e, p1.clone(), params, 16, vec![]);
        collect(rx).ids
    };
    let with_p2_cached = sampled(&e);
    let with_p1_cached = sampled(&e);
    assert_eq!(with_p2_cached, with_p1_cached);
}
