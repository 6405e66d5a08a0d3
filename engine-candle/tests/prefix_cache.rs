//! ENG-BATCH-4: a slot's cache row keeps its last prompt, and a new prompt sharing a prefix
//! with it starts after that prefix — with exactly the tokens a fresh prefill gives (greedy
//! and seeded), because attention is independent of how a prompt is chunked.
//! ENG-BATCH-5: a prompt whose row was taken by another prompt is kept in the host-memory
//! prompt cache and starts after its prefix when it comes back, with the same tokens.

mod common;

use common::*;
use engine_candle::{CandleEngine, KvType};
use engine_port::SamplingParams;

#[test]
fn a_cached_prefix_gives_the_same_tokens_as_a_fresh_prefill() {
    let mut opts = test_options();
    opts.slots = 1;
    opts.ctx = 512;
    // the row alone: no host prompt cache
    opts.settings.prompt_cache_bytes = 0;
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

#[test]
fn a_prompt_whose_row_was_taken_comes_back_from_the_prompt_cache() {
    comes_back_from_the_prompt_cache(KvType::F32);
}

/// ENG-KV16-1: the same with keys and values stored as f16 (the prompt cache keeps them as
/// stored: half the bytes a token).
#[test]
fn with_an_f16_cache_a_prompt_comes_back_from_the_prompt_cache() {
    comes_back_from_the_prompt_cache(KvType::F16);
}

fn comes_back_from_the_prompt_cache(kv_type: KvType) {
    let mut opts = test_options();
    opts.slots = 1;
    opts.ctx = 512;
    opts.settings.kv_type = kv_type;
    let e = CandleEngine::load(opts).expect("model loads");
    let per_token = e.info().kv_cache_bytes / (e.info().slots * e.info().ctx);
    let p1 = chat_tokens(&e, "Describe a busy morning market.");
    let p2 = chat_tokens(&e, "What causes the seasons on Earth?");
    let shared = p1.iter().zip(&p2).take_while(|(a, b)| a == b).count();

    let fresh = greedy(&e, p2.clone(), 24);
    assert_eq!(e.prompt_cache_bytes(), 0, "nothing was overwritten yet");
    // p1 takes the only row: p2's keys and values move to the prompt cache first
    let _ = greedy(&e, p1.clone(), 8);
    assert_eq!(e.reused_prompt_tokens(), shared as u64);
    assert_eq!(e.prompt_cache_bytes(), p2.len() * per_token);

    // p2 again: all but its last token come from the prompt cache, same greedy tokens
    let again = greedy(&e, p2.clone(), 24);
    assert_eq!(
        e.reused_prompt_tokens() - shared as u64,
        (p2.len() - 1) as u64
    );
    assert_eq!(again.ids, fresh.ids, "restored prefix, same greedy tokens");
    assert_eq!(
        e.prompt_cache_bytes(),
        (p1.len() + p2.len()) * per_token,
        "p1 was saved when p2 took the row back"
    );

    // seeded sampling after a restore equals seeded sampling after a fresh prefill
    let params = SamplingParams {
        temperature: 0.9,
        seed: 5,
        ..Default::default()
    };
    let (rx, _c) = start(&e, p1.clone(), params.clone(), 16, vec![]);
    let restored = collect(rx).ids;
    let mut opts = test_options();
    opts.slots = 1;
    opts.ctx = 512;
    opts.settings.kv_type = kv_type;
    opts.settings.prompt_cache_bytes = 0;
    let plain = CandleEngine::load(opts).expect("model loads");
    let (rx, _c) = start(&plain, p1.clone(), params, 16, vec![]);
    assert_eq!(restored, collect(rx).ids);
}

#[test]
fn the_prompt_cache_stays_within_its_bytes() {
    let mut opts = test_options();
    opts.slots = 1;
    opts.ctx = 512;
    let probe = CandleEngine::load(opts.clone()).expect("model loads");
    let per_token = probe.info().kv_cache_bytes / (probe.info().slots * probe.info().ctx);
    let prompts: Vec<Vec<u32>> = [
        "Name a red fruit.",
        "Name a green vegetable.",
        "Name a blue flower.",
        "Name a yellow bird.",
    ]
    .iter()
    .map(|q| chat_tokens(&probe, q))
    .collect();
    drop(probe);
    let longest = prompts.iter().map(Vec::len).max().unwrap_or(0);
    // room for two prompts, not three
    opts.settings.prompt_cache_bytes = 2 * longest * per_token + per_token;
    let e = CandleEngine::load(opts).expect("model loads");
    for p in &prompts {
        let _ = greedy(&e, p.clone(), 2);
        assert!(e.prompt_cache_bytes() <= 2 * longest * per_token + per_token);
    }
    // the first prompt was evicted, the third is still there
    let before = e.reused_prompt_tokens();
    let _ = greedy(&e, prompts[2].clone(), 2);
    assert_eq!(
        e.reused_prompt_tokens() - before,
        (prompts[2].len() - 1) as u64
    );
    let before = e.reused_prompt_tokens();
    let _ = greedy(&e, prompts[0].clone(), 2);
    let shared = prompts[0]
        .iter()
        .zip(&prompts[2])
        .take_while(|(a, b)| a == b)
        .count();
    assert_eq!(
        e.reused_prompt_tokens() - before,
        shared as u64,
        "only the shared system prompt is left of it"
    );
}

/// ENG-BATCH-6: n answers to one prompt, sent at once, share its prefill: the first computes
/// it, the others wait for it and copy its keys and values from the running row — with exactly
/// the tokens a fresh prefill gives.
#[test]
fn n_answers_to_one_prompt_share_its_prefill() {
    let mut opts = test_options();
    opts.slots = 4;
    opts.ctx = 1024;
    // rows only: what is shared comes from the running row, not the host prompt cache
    opts.settings.prompt_cache_bytes = 0;
    let e = CandleEngine::load(opts).expect("model loads");
    let long = "Summarize the history of the bicycle, from the draisine to the safety bicycle, \
                and the role of pneumatic tyres. "
        .repeat(4);
    let p = chat_tokens(&e, &long);
    assert!(p.len() > 100, "{}", p.len());
    let other = chat_tokens(&e, "Hello there.");
    // a different prompt first: its row holds nothing of `p`
    let _ = greedy(&e, other.clone(), 2);
    let before = e.reused_prompt_tokens();
    let streams: Vec<_> = (0..4)
        .map(|_| start(&e, p.clone(), SamplingParams::default(), 16, vec![]))
        .collect();
    let outs: Vec<_> = streams
        .into_iter()
        .map(|(rx, _c)| collect(rx).ids)
        .collect();
    let shared = e.reused_prompt_tokens() - before;
    // the three that waited start after all of the prompt but its last token
    let template = p.iter().zip(&other).take_while(|(a, b)| a == b).count() as u64;
    assert!(
        shared >= 3 * (p.len() as u64 - 1),
        "shared {shared} of {} prompt tokens (template prefix {template})",
        p.len()
    );
    for o in &outs {
        assert_eq!(
            o, &outs[0],
            "the same greedy answer from copied keys and values"
        );
    }
    let mut opts = test_options();
    opts.slots = 1;
    opts.ctx = 1024;
    let fresh = CandleEngine::load(opts).expect("model loads");
    assert_eq!(
        greedy(&fresh, p, 16).ids,
        outs[0],
        "as a fresh prefill gives"
    );
}
