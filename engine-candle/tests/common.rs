//! Shared helpers for the real-model engine tests.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use engine_candle::{CandleEngine, DeviceChoice, EngineOptions, GenerateRequest};
use engine_port::{ChatTurn, Finish, SamplingParams, SeqEvent, StepLogprobs};
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

/// The default model: `ORCHD_TEST_MODEL`, else the cache that `ci/fetch-model.sh` fills.
pub fn model_path() -> PathBuf {
    if let Ok(p) = std::env::var("ORCHD_TEST_MODEL") {
        return PathBuf::from(p);
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        p.exists(),
        "default model missing at {}: run ci/fetch-model.sh first",
        p.display()
    );
    p
}

/// The device the engine tests run on: `ORCHD_TEST_DEVICE` (`cpu`, `cuda:0`), else the CPU.
/// `ci/gpu/on-device.sh` runs these same tests on a GPU with it.
pub fn test_device() -> DeviceChoice {
    std::env::var("ORCHD_TEST_DEVICE")
        .map(|d| d.parse().expect("ORCHD_TEST_DEVICE: cpu | cuda | cuda:N"))
        .unwrap_or(DeviceChoice::Cpu)
}

/// Options for the default model on the test device. `ORCHD_TEST_CUDA_DMMV` makes candle's
/// CUDA quantized matmuls take their plain dequantizing kernels instead of MMVQ/MMQ (to tell
/// a kernel's fault from ours on a GPU day).
pub fn test_options() -> EngineOptions {
    #[cfg(feature = "cuda")]
    if std::env::var_os("ORCHD_TEST_CUDA_DMMV").is_some() {
        candle_core::quantized::cuda::set_force_dmmv(true);
    }
    let mut opts = EngineOptions::new(model_path());
    opts.settings.device = test_device();
    opts
}

pub fn engine() -> &'static CandleEngine {
    static ENGINE: OnceLock<CandleEngine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        let mut opts = test_options();
        opts.slots = 8;
        opts.ctx = 1024;
        if let Ok(f) = std::env::var("ORCHD_TEST_WEIGHT_FORMAT") {
            opts.settings.weight_format = f.parse().expect("weight format");
        }
        CandleEngine::load(opts).expect("default model loads")
    })
}

pub struct Output {
    pub ids: Vec<u32>,
    pub text: String,
    pub finish: Finish,
}

pub fn start(
    e: &CandleEngine,
    prompt_tokens: Vec<u32>,
    sampling: SamplingParams,
    max_tokens: usize,
    stop: Vec<String>,
) -> (tokio::sync::mpsc::Receiver<SeqEvent>, CancellationToken) {
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let cancel = CancellationToken::new();
    loop {
        // other tests share the engine: wait for a slot
        let Some(permit) = e.try_acquire() else {
            std::thread::sleep(std::time::Duration::from_millis(5));
            continue;
        };
        let req = GenerateRequest {
            permit,
            prompt_tokens: prompt_tokens.clone(),
            sampling: sampling.clone(),
            max_tokens,
            stop: stop.clone(),
            constraint: None,
            logprobs: None,
            cancel: cancel.clone(),
            events: tx.clone(),
        };
        match e.submit(req) {
            Ok(()) => return (rx, cancel),
            Err(err) => panic!("submit failed: {err}"),
        }
    }
}

pub fn collect(mut rx: tokio::sync::mpsc::Receiver<SeqEvent>) -> Output {
    let mut ids = Vec::new();
    let mut text = String::new();
    while let Some(ev) = rx.blocking_recv() {
        match ev {
            SeqEvent::Token {
                id, text: t, index, ..
            } => {
                assert_eq!(index, ids.len(), "token indices are consecutive");
                ids.push(id.expect("candle gives every token's id"));
                text.push_str(&t);
            }
            SeqEvent::Done(finish) => {
                assert!(rx.blocking_recv().is_none(), "nothing after Done");
                return Output { ids, text, finish };
            }
            SeqEvent::Failed(m) => panic!("sequence failed: {m}"),
        }
    }
    panic!("event stream closed without Done");
}

pub fn chat_tokens(e: &CandleEngine, user: &str) -> Vec<u32> {
    let prompt = e
        .render_chat(&[ChatTurn {
            role: "user".into(),
            content: user.into(),
        }])
        .expect("template renders");
    e.tokenizer().encode(&prompt).expect("prompt encodes")
}

pub fn greedy(e: &CandleEngine, tokens: Vec<u32>, max_tokens: usize) -> Output {
    let (rx, _c) = start(e, tokens, SamplingParams::default(), max_tokens, vec![]);
    collect(rx)
}

/// The llama.cpp reference fixture (`ci/llama_reference.py`): greedy continuations of the
/// fixture prompts with llama.cpp's top-2 margins.
#[derive(Deserialize)]
pub struct Fixture {
    pub n_tokens: usize,
    pub cases: Vec<Case>,
}

#[derive(Deserialize)]
pub struct Case {
    pub user_text: String,
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    pub greedy_ids: Vec<u32>,
    pub top2_margins: Vec<f64>,
    pub second_ids: Vec<u32>,
}

pub fn fixture() -> Fixture {
    serde_json::from_str(include_str!("fixtures/llama_cpp_greedy.json")).expect("fixture parses")
}

/// Greedy steps with the `top` likeliest log-probabilities at each.
pub fn greedy_logprobs(
    e: &CandleEngine,
    prompt: Vec<u32>,
    n: usize,
    top: usize,
) -> Vec<(u32, StepLogprobs)> {
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
