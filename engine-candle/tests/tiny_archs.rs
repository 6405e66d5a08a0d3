//! ENG-ARCH-2 (issue 35): the architectures with no real test model here, on tiny random-weight
//! GGUFs written by `ci/tiny_models.py` with the `gguf` package (two layers, a real tokenizer:
//! `ci/test.sh` writes them, the same bytes on every machine), against llama.cpp's greedy
//! decisions on the same files (fixture `llama_cpp_tiny.json`, same script): `llama` with
//! Llama 3.1's RoPE frequency factors and grouped-query attention, `qwen3` with per-head q/k
//! norms and heads wider than the embedding's share.

mod common;

use std::path::PathBuf;

use common::*;
use engine_candle::{CandleEngine, EngineOptions};
use serde::Deserialize;
use sha2::{Digest, Sha256};

#[derive(Deserialize)]
struct Tiny {
    models: Vec<TinyModel>,
}

#[derive(Deserialize)]
struct TinyModel {
    file: String,
    sha256: String,
    n_tokens: usize,
    cases: Vec<Case>,
}

fn tiny_dir() -> PathBuf {
    std::env::var("ORCHD_TEST_TINY")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache/models/tiny"))
}

/// A different choice where llama.cpp's top-2 margin is below this is put down to rounding.
/// Random weights give near ties far more often than a trained model: the fixture's smallest
/// margins are ~0.01.
const NEAR_TIE: f64 = 0.1;
const MAX_DISAGREEMENT_MARGIN: f64 = 0.5;

#[test]
fn tiny_models_of_each_architecture_decide_as_llama_cpp() {
    let tiny: Tiny =
        serde_json::from_str(include_str!("fixtures/llama_cpp_tiny.json")).expect("fixture parses");
    for m in tiny.models {
        let path = tiny_dir().join(&m.file);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (ci/tiny_models.py write writes it)",
                path.display()
            )
        });
        assert_eq!(
            hex(&Sha256::digest(&bytes)),
            m.sha256,
            "{} is not the file the fixture was made from",
            m.file
        );
        let mut opts = EngineOptions::new(&path);
        opts.settings.device = test_device();
        opts.slots = 2;
        opts.ctx = 256;
        let e = CandleEngine::load(opts).unwrap_or_else(|err| panic!("{}: {err}", m.file));
        let f = Fixture {
            n_tokens: m.n_tokens,
            cases: m.cases,
        };
        for c in &f.cases {
            assert_eq!(
                e.encode_text(&c.prompt).unwrap(),
                c.prompt_ids,
                "{}",
                m.file
            );
        }
        teacher_forced(&e, &f, NEAR_TIE, MAX_DISAGREEMENT_MARGIN).assert_agrees(0.9, &m.file);
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
