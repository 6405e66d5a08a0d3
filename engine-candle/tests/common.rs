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
            failure: Default::default(),
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
    /// llama.cpp's 8 best tokens at each step and their logits' gaps below the best (absent
    /// from the tiny models' fixture, where only the runner-up is known).
    #[serde(default)]
    pub top_ids: Vec<Vec<u32>>,
    #[serde(default)]
    pub top_gaps: Vec<Vec<f64>>,
}

impl Case {
    /// How far below its best llama.cpp scored `token` at step `k`, where the fixture knows.
    pub fn gap(&self, k: usize, token: u32) -> Option<f64> {
        if let (Some(ids), Some(gaps)) = (self.top_ids.get(k), self.top_gaps.get(k)) {
            return ids.iter().position(|t| *t == token).map(|i| gaps[i]);
        }
        (self.second_ids.get(k) == Some(&token)).then(|| self.top2_margins[k])
    }
}

pub fn fixture() -> Fixture {
    serde_json::from_str(include_str!("fixtures/llama_cpp_greedy.json")).expect("fixture parses")
}

/// The second real model, Gemma 3 270M Q4_K_M: `ORCHD_TEST_GEMMA`, else the cache that
/// `ci/fetch-gemma.sh` fills.
pub fn gemma_path() -> PathBuf {
    if let Ok(p) = std::env::var("ORCHD_TEST_GEMMA") {
        return PathBuf::from(p);
    }
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache/models/gemma-3-270m-q4_k_m.gguf");
    assert!(
        p.exists(),
        "Gemma 3 model missing at {}: run ci/fetch-gemma.sh first",
        p.display()
    );
    p
}

/// A free-running comparison with llama.cpp: each prompt's greedy continuation, to its first
/// difference.
pub struct FreeRunning {
    /// Prompts whose every fixture token matches.
    pub exact: usize,
    /// First differences where we took a token llama.cpp itself scored close to its best.
    pub flips: Vec<String>,
    pub unexplained: Vec<String>,
}

/// Runs every fixture prompt greedily; a first difference is explained when llama.cpp scored
/// the token we chose less than `max_margin` below its best (a near-tie, where another CPU's
/// rounding may pick any of the close tokens).
pub fn free_running(e: &CandleEngine, f: &Fixture, max_margin: f64) -> FreeRunning {
    let mut exact = 0;
    let mut flips = Vec::new();
    let mut unexplained = Vec::new();
    for c in &f.cases {
        let out = greedy(e, c.prompt_ids.clone(), f.n_tokens);
        // the engine does not emit the end-of-sequence token; llama.cpp's list may end with it
        let want: Vec<u32> = c
            .greedy_ids
            .iter()
            .copied()
            .filter(|t| !e.tokenizer().is_stop(*t))
            .collect();
        // where one side stopped and the other went on, the first difference is there: we
        // chose a stop token (its gap: the closest stop token in llama.cpp's list) or
        // llama.cpp did (our token's gap in its list)
        let first = want.iter().zip(&out.ids).position(|(a, b)| a != b);
        let k = first.unwrap_or(want.len().min(out.ids.len()));
        match first {
            None if out.ids.len() == want.len() => exact += 1,
            None if out.ids.len() < want.len() => {
                let gap = c.top_ids.get(k).and_then(|ids| {
                    ids.iter()
                        .zip(&c.top_gaps[k])
                        .filter(|(t, _)| e.tokenizer().is_stop(**t))
                        .map(|(_, g)| *g)
                        .reduce(f64::min)
                        .or_else(|| {
                            let second = *c.second_ids.get(k)?;
                            e.tokenizer().is_stop(second).then(|| c.top2_margins[k])
                        })
                });
                let line = format!(
                    "{:?}: token {k}: llama.cpp {} (margin {:.4}), ours a stop token (llama.cpp's gap {})",
                    c.user_text,
                    want[k],
                    c.top2_margins[k],
                    gap.map_or("not in its top 8".to_string(), |g| format!("{g:.4}"))
                );
                if gap.is_some_and(|g| g < max_margin) {
                    flips.push(line);
                } else {
                    unexplained.push(line);
                }
            }
            _ => {
                let gap = c.gap(k, out.ids[k]);
                let line = format!(
                    "{:?}: token {k}: llama.cpp {} (margin {:.4} over {}), ours {} (llama.cpp's gap {})",
                    c.user_text,
                    want.get(k).map_or("a stop token".to_string(), |t| t.to_string()),
                    c.top2_margins[k],
                    c.second_ids[k],
                    out.ids[k],
                    gap.map_or("not in its top 8".to_string(), |g| format!("{g:.4}"))
                );
                if gap.is_some_and(|g| g < max_margin) {
                    flips.push(line);
                } else {
                    unexplained.push(line);
                }
            }
        }
    }
    eprintln!(
        "exact: {exact}/{}; near-tie flips:\n{}",
        f.cases.len(),
        flips.join("\n")
    );
    FreeRunning {
        exact,
        flips,
        unexplained,
    }
}

pub struct TeacherForced {
    pub positions: usize,
    pub agree: usize,
    pub unexplained: Vec<String>,
}

impl TeacherForced {
    /// No disagreement at a clear margin, and at least `min_agreement` of the positions agree.
    pub fn assert_agrees(&self, min_agreement: f64, what: &str) {
        assert!(
            self.unexplained.is_empty(),
            "{what}: disagreements at a clear margin:\n{}",
            self.unexplained.join("\n")
        );
        assert!(
            self.agree as f64 >= min_agreement * self.positions as f64,
            "{what}: only {} of {} positions agree",
            self.agree,
            self.positions
        );
    }
}

impl FreeRunning {
    /// Every first difference explained, and at least `min_exact` prompts equal throughout.
    pub fn assert_matches(&self, min_exact: usize, what: &str) {
        assert!(
            self.unexplained.is_empty(),
            "{what}: unexplained divergences:\n{}",
            self.unexplained.join("\n")
        );
        assert!(
            self.exact >= min_exact,
            "{what}: only {} prompts match llama.cpp exactly",
            self.exact
        );
    }
}

/// Teacher-forced: with llama.cpp's own tokens as context, at every fixture position we pick
/// llama.cpp's token, or differ where its margin was below `near_tie` (a flip) or
/// `max_margin` (a close call); anything else is unexplained.
pub fn teacher_forced(
    e: &CandleEngine,
    f: &Fixture,
    near_tie: f64,
    max_margin: f64,
) -> TeacherForced {
    let mut positions = 0;
    let mut flips = Vec::new();
    let mut close = Vec::new();
    let mut unexplained = Vec::new();
    for c in &f.cases {
        for k in 0..c.greedy_ids.len() {
            let mut ctx = c.prompt_ids.clone();
            ctx.extend_from_slice(&c.greedy_ids[..k]);
            let out = greedy(e, ctx, 1);
            let ours = out.ids.first().copied().unwrap_or_else(|| {
                // the engine stopped: it chose an end-of-sequence token
                e.tokenizer().stop_ids()[0]
            });
            let want = c.greedy_ids[k];
            positions += 1;
            if ours == want || (e.tokenizer().is_stop(ours) && e.tokenizer().is_stop(want)) {
                continue;
            }
            let line = format!(
                "{:?} @{k}: llama.cpp {want} (margin {:.4} over {}), ours {ours}",
                c.user_text, c.top2_margins[k], c.second_ids[k]
            );
            if c.top2_margins[k] < near_tie {
                flips.push(line);
            } else if c.top2_margins[k] < max_margin {
                close.push(line);
            } else {
                unexplained.push(line);
            }
        }
    }
    let agree = positions - flips.len() - close.len() - unexplained.len();
    eprintln!(
        "{:?} cache: {agree}/{positions} positions agree; near ties (<{near_tie}):\n{}\nclose calls (<{max_margin}):\n{}",
        e.info().kv_type,
        flips.join("\n"),
        close.join("\n")
    );
    TeacherForced {
        positions,
        agree,
        unexplained,
    }
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
        failure: Default::default(),
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
