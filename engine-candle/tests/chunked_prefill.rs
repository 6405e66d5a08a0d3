//! ENG-CHUNK-1..2: a long prompt goes through in chunks between the decode steps of the
//! running sequences, gives the same tokens as on an idle engine, and can be cancelled
//! between chunks. Its own test binary (own process and engine): the timings compared
//! here are of this engine alone.

mod common;

use std::time::{Duration, Instant};

use common::*;
use engine_candle::CandleEngine;
use engine_port::{FinishReason, SamplingParams, SeqEvent};

/// One test at a time: the cancellation test compares timings of this engine alone.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn engine() -> CandleEngine {
    engine_stepping(engine_candle::DEFAULT_STEP_MS)
}

/// An engine whose passes beside a stream should take `step_ms` (0: exactly
/// `step_prompt_tokens` prompt tokens a pass).
fn engine_stepping(step_ms: u64) -> CandleEngine {
    engine_with(step_ms, engine_candle::DEFAULT_STEP_PROMPT_MS)
}

/// An engine with a step time and, for fixed chunks, a ceiling (ms) on what a pass's prompt
/// tokens add beside a stream.
fn engine_with(step_ms: u64, step_prompt_ms: u64) -> CandleEngine {
    let mut opts = test_options();
    opts.slots = 2;
    opts.ctx = 2048;
    opts.settings.step_ms = step_ms;
    opts.settings.step_prompt_ms = step_prompt_ms;
    CandleEngine::load(opts).expect("default model loads")
}

/// A prompt of about 700 tokens: a long text and a question about it (long enough for ~44
/// fixed chunks beside a stream; CI pays each prefill several times).
fn long_prompt(e: &CandleEngine, tag: &str) -> Vec<u32> {
    let text =
        "The lighthouse keeper climbed the stairs every evening to light the lamp. ".repeat(50);
    let p = chat_tokens(
        e,
        &format!("{tag}\n{text}\nWhat did the keeper do every evening?"),
    );
    assert!(p.len() > 650, "{} prompt tokens", p.len());
    p
}

/// A stream that goes on for a long time (a count).
fn counting(e: &CandleEngine) -> Vec<u32> {
    e.tokenizer()
        .encode("1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,")
        .unwrap()
}

/// Receives the next event, failing the test after a minute.
fn next(rx: &mut tokio::sync::mpsc::Receiver<SeqEvent>) -> SeqEvent {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        match rx.try_recv() {
            Ok(ev) => return ev,
            Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {
                assert!(Instant::now() < until, "no event for a minute");
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("channel closed: {e}"),
        }
    }
}

/// The running `stream`'s tokens until the long prompt (`rx`) gave its first event, and the
/// long prompt's answer to its end (failing the test after five minutes).
fn answer_beside(
    stream: &mut tokio::sync::mpsc::Receiver<SeqEvent>,
    rx: &mut tokio::sync::mpsc::Receiver<SeqEvent>,
) -> (usize, Vec<u32>) {
    let until = Instant::now() + Duration::from_secs(300);
    let mut during = 0;
    let mut ids = Vec::new();
    loop {
        while let Ok(ev) = stream.try_recv() {
            assert!(matches!(ev, SeqEvent::Token { .. }), "{ev:?}");
            if ids.is_empty() {
                during += 1;
            }
        }
        match rx.try_recv() {
            Ok(SeqEvent::Token { id, .. }) => ids.push(id.expect("candle gives every token's id")),
            Ok(SeqEvent::Done(_)) => return (during, ids),
            Ok(SeqEvent::Failed(m)) => panic!("{m}"),
            Err(tokio::sync::mpsc::error::TryRecvError::Empty) => {
                assert!(Instant::now() < until, "no answer in five minutes");
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// ENG-CHUNK-1: while a long prompt goes through, a running stream keeps getting tokens
/// (one per pass: with no step time the prompt takes exactly `step_prompt_tokens` per pass
/// beside it), and the long prompt's answer is token for token what it is on an idle engine,
/// where it goes through in whole chunks.
#[test]
fn a_long_prompt_goes_through_between_the_tokens_of_a_running_stream() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let e = engine_stepping(0);
    let long = long_prompt(&e, "Story one.");
    // on another engine: this one's rows and prompt cache must not hold the prompt
    let alone = {
        let idle = engine();
        greedy(&idle, long.clone(), 8).ids
    };

    let (mut stream, stop_stream) =
        start(&e, counting(&e), SamplingParams::default(), 1000, vec![]);
    for _ in 0..5 {
        assert!(matches!(next(&mut stream), SeqEvent::Token { .. }));
    }
    let (mut rx, _c) = start(&e, long.clone(), SamplingParams::default(), 8, vec![]);
    // the stream's tokens until the long prompt's first token
    let (during, ids) = answer_beside(&mut stream, &mut rx);
    let passes = long.len() / engine_candle::DEFAULT_STEP_PROMPT_TOKENS;
    assert!(
        during >= passes / 2,
        "the stream got {during} tokens while {} prompt tokens went through (≈{passes} passes)",
        long.len()
    );
    assert_eq!(
        ids, alone,
        "chunked beside a stream vs whole on an idle engine"
    );
    stop_stream.cancel();
}

/// ENG-CHUNK-6: with a ceiling on what a pass's prompt tokens may add beside a stream
/// (here 1 ms, less than any prompt token of the default model costs on a CPU) the fixed
/// chunks of 16 shrink to a token or two a pass: the stream gets a token for about every one
/// or two of the prompt's, not every sixteen, and the answer is still the idle engine's.
#[test]
fn a_ceiling_on_the_prompts_time_shrinks_the_chunks_beside_a_stream() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let e = engine_with(0, 1);
    let long = long_prompt(&e, "Story five.");
    let alone = {
        let idle = engine();
        greedy(&idle, long.clone(), 8).ids
    };
    let (mut stream, stop_stream) =
        start(&e, counting(&e), SamplingParams::default(), 2000, vec![]);
    for _ in 0..5 {
        assert!(matches!(next(&mut stream), SeqEvent::Token { .. }));
    }
    let (mut rx, _c) = start(&e, long.clone(), SamplingParams::default(), 8, vec![]);
    let (during, ids) = answer_beside(&mut stream, &mut rx);
    // fixed chunks alone would give about len / 16 passes
    assert!(
        during >= long.len() / 4,
        "the stream got {during} tokens while {} prompt tokens went through",
        long.len()
    );
    assert_eq!(
        ids, alone,
        "one-token chunks beside a stream vs whole on an idle engine"
    );
    stop_stream.cancel();
}

/// ENG-CHUNK-3: with a step time the chunks beside a stream grow while passes stay within
/// it — here a minute, which every pass does, so each chunk doubles the last up to a whole
/// prefill chunk (16, 32, …, 256): the ~700-token prompt goes through in about six passes
/// instead of forty-odd, the stream still gets a token between any two, and the answer is
/// the idle engine's.
#[test]
fn a_step_time_grows_the_chunks_beside_a_stream() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let e = engine_stepping(60_000);
    let long = long_prompt(&e, "Story four.");
    let alone = {
        let idle = engine();
        greedy(&idle, long.clone(), 8).ids
    };
    let (mut stream, stop_stream) =
        start(&e, counting(&e), SamplingParams::default(), 1000, vec![]);
    for _ in 0..3 {
        assert!(matches!(next(&mut stream), SeqEvent::Token { .. }));
    }
    // drain what came meanwhile: counted from here on, the passes beside the prompt
    while stream.try_recv().is_ok() {}
    let (mut rx, _c) = start(&e, long.clone(), SamplingParams::default(), 8, vec![]);
    let (during, ids) = answer_beside(&mut stream, &mut rx);
    let whole_chunks = long.len().div_ceil(256);
    assert!(
        (whole_chunks..=12).contains(&during),
        "the stream got {during} tokens while {} prompt tokens went through",
        long.len()
    );
    assert_eq!(
        ids, alone,
        "grown chunks beside a stream vs whole on an idle engine"
    );
    stop_stream.cancel();
}

/// ENG-CHUNK-2: a long prompt cancelled while it goes through stops at the next pass: its
/// sequence ends `Cancelled` with no token, far sooner than its prompt would have taken, and
/// the stream beside it goes on.
#[test]
fn a_long_prompt_is_cancelled_between_chunks() {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let e = engine();
    // how long the whole prompt takes on this engine, idle
    let long = long_prompt(&e, "Story two.");
    let t0 = Instant::now();
    let _ = greedy(&e, long, 1);
    let whole = t0.elapsed();

    let (mut stream, stop_stream) =
        start(&e, counting(&e), SamplingParams::default(), 1000, vec![]);
    assert!(matches!(next(&mut stream), SeqEvent::Token { .. }));
    let (mut rx, cancel) = start(
        &e,
        long_prompt(&e, "Story three."),
        SamplingParams::default(),
        8,
        vec![],
    );
    // a few passes into the prompt
    for _ in 0..3 {
        assert!(matches!(next(&mut stream), SeqEvent::Token { .. }));
    }
    let cancelled_at = Instant::now();
    cancel.cancel();
    match next(&mut rx) {
        SeqEvent::Done(f) => {
            assert_eq!(f.reason, FinishReason::Cancelled);
            assert_eq!(f.tokens_out, 0);
        }
        ev => panic!("expected the cancellation, got {ev:?}"),
    }
    let took = cancelled_at.elapsed();
    assert!(
        took * 4 < whole,
        "cancelled after {took:?}; the whole prompt takes {whole:?}"
    );
    // the stream beside it goes on
    for _ in 0..3 {
        assert!(matches!(next(&mut stream), SeqEvent::Token { .. }));
    }
    stop_stream.cancel();
}
