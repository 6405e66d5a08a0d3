//! Speculation by prompt lookup (ENG-SPEC-2): decode tokens/s with guessing on against off,
//! on the same engine in alternating rounds (medians), for answers that repeat their prompt
//! (a rewrite, a JSON extraction, a code edit) and for free prose, one stream and `--streams N`
//! at once. Every round checks the greedy outputs are the same both ways. It also prints what
//! bounds the gain: a pass that checks guesses against a pass of one token (from the passes
//! each way took), and how many guesses a pass kept.
//!
//! `cargo bench -p engine-candle --bench speculation [-- --draft 6 --rounds 3 --max 128
//! --streams 1 --threads 2]`; under `cargo test` (no `--bench`) one short round of the first
//! prompt of each workload, its outputs still compared.

use std::time::Instant;

use engine_candle::GenerateRequest;
use engine_candle::{CandleEngine, EngineOptions};
use engine_port::{ChatTurn, SamplingParams, SeqEvent};
use tokio_util::sync::CancellationToken;

const PARAGRAPHS: [&str; 4] = [
    "The old lighthouse keeper climbed the spiral stairs every evening at dusk, lit the great \
     lamp, and watched the ships pass safely through the narrow channel between the rocks.",
    "Our quarterly report shows that revenue grew by twelve percent, driven mostly by new \
     customers in the northern region, while costs stayed flat thanks to cheaper shipping.",
    "To reset the router, unplug it from the wall, wait thirty seconds, plug it back in, and \
     then wait until the green light on the front stops blinking before you connect again.",
    "Maria Lopez, a nurse from Seville, moved to Toronto in 2019 and now works at the General \
     Hospital, where she leads a team of eight on the night shift in the emergency ward.",
];

fn workloads() -> Vec<(&'static str, Vec<String>)> {
    let rewrite = PARAGRAPHS
        .iter()
        .map(|p| format!("Repeat the following text exactly, word for word:\n{p}"))
        .collect();
    let extract = PARAGRAPHS
        .iter()
        .map(|p| {
            format!(
                "Quote every sentence of this text that mentions a place or a number, as a \
                 JSON list of strings:\n{p}"
            )
        })
        .collect();
    let code = [
        "def total(xs):\n    s = 0\n    for x in xs:\n        s = s + x\n    return s\n",
        "def find(items, key):\n    for i, item in enumerate(items):\n        if item == key:\n            return i\n    return -1\n",
    ]
    .iter()
    .map(|c| format!("Add a docstring to this Python function and return the whole function:\n\n{c}"))
    .collect();
    let prose = [
        "Write a short poem about the sea at night.",
        "Tell me a story about a fox who learns to fly.",
        "Describe a busy morning market in a few sentences.",
        "Why is the sky blue? Explain simply.",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    vec![
        ("rewrite", rewrite),
        ("extract", extract),
        ("code edit", code),
        ("free prose", prose),
    ]
}

struct Args {
    full: bool,
    draft: usize,
    rounds: usize,
    max: usize,
    streams: usize,
    threads: usize,
}

fn args() -> Args {
    let v: Vec<String> = std::env::args().collect();
    let full = v.iter().any(|a| a == "--bench");
    let mut a = Args {
        full,
        draft: 6,
        rounds: if full { 3 } else { 1 },
        max: if full { 128 } else { 24 },
        streams: 1,
        threads: 2,
    };
    let mut i = 1;
    while i < v.len() {
        let n = || v.get(i + 1).and_then(|s| s.parse().ok());
        match v[i].as_str() {
            "--draft" => a.draft = n().expect("--draft N"),
            "--rounds" => a.rounds = n().expect("--rounds N"),
            "--max" => a.max = n().expect("--max N"),
            "--streams" => a.streams = n().expect("--streams N"),
            "--threads" => a.threads = n().expect("--threads N"),
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    a
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// One sequence's outcome: its tokens, decode seconds (first token to end), guesses.
struct Seq {
    ids: Vec<u32>,
    decode_s: f64,
    guessed: usize,
    kept: usize,
}

/// Runs `prompts` `streams` at a time; returns every sequence's outcome in order.
fn run(
    e: &CandleEngine,
    prompts: &[Vec<u32>],
    draft: usize,
    max: usize,
    streams: usize,
) -> Vec<Seq> {
    let mut out = Vec::new();
    for group in prompts.chunks(streams) {
        let rxs: Vec<_> = group
            .iter()
            .map(|p| {
                let (tx, rx) = tokio::sync::mpsc::channel(1024);
                e.submit(GenerateRequest {
                    permit: e.try_acquire().expect("a free slot per stream"),
                    prompt_tokens: p.clone(),
                    sampling: SamplingParams {
                        draft_tokens: Some(draft),
                        ..Default::default()
                    },
                    max_tokens: max,
                    stop: vec![],
                    constraint: None,
                    logprobs: None,
                    cancel: CancellationToken::new(),
                    events: tx,
                    failure: Default::default(),
                })
                .expect("submit");
                rx
            })
            .collect();
        for mut rx in rxs {
            let mut ids = Vec::new();
            let mut first = None;
            loop {
                match rx.blocking_recv().expect("a sequence ends with Done") {
                    SeqEvent::Token { id, .. } => {
                        first.get_or_insert_with(Instant::now);
                        ids.extend(id);
                    }
                    SeqEvent::Done(f) => {
                        out.push(Seq {
                            ids,
                            decode_s: first.map_or(0.0, |t| t.elapsed().as_secs_f64()),
                            guessed: f.guessed_tokens,
                            kept: f.guesses_kept,
                        });
                        break;
                    }
                    SeqEvent::Failed(m) => panic!("sequence failed: {m}"),
                }
            }
        }
    }
    out
}

fn main() {
    let a = args();
    engine_candle::configure_process_threads(a.threads, 0);
    let model = std::env::var("ORCHD_TEST_MODEL").unwrap_or_else(|_| {
        format!(
            "{}/../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf",
            env!("CARGO_MANIFEST_DIR")
        )
    });
    let mut opts = EngineOptions {
        model_path: model.clone().into(),
        slots: a.streams.max(1),
        ctx: 1024,
        settings: Default::default(),
    };
    opts.settings.threads = a.threads;
    opts.settings.prompt_cache_bytes = 0;
    let e = CandleEngine::load(opts).expect("model loads");
    println!(
        "speculation by prompt lookup: {model}, {} guesses a pass at most, {} stream(s), {} tokens \
         at most, {} rounds (off/on alternating, medians)",
        a.draft, a.streams, a.max, a.rounds
    );
    println!(
        "| workload | tok/s off | tok/s on | ratio | guesses kept | tokens a pass on | pass on / pass off |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (name, prompts) in workloads() {
        let take = if a.full { prompts.len() } else { 1 };
        let prompts: Vec<Vec<u32>> = prompts[..take]
            .iter()
            .map(|p| {
                let text = e
                    .render_chat(&[ChatTurn {
                        role: "user".into(),
                        content: p.clone(),
                    }])
                    .expect("template renders");
                e.tokenizer().encode(&text).expect("prompt encodes")
            })
            .collect();
        let (mut off_rate, mut on_rate, mut pass_ratio, mut per_pass) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let (mut guessed, mut kept) = (0, 0);
        for round in 0..a.rounds {
            let order = if round % 2 == 0 {
                [0, a.draft]
            } else {
                [a.draft, 0]
            };
            let mut results = Vec::new();
            for d in order {
                results.push((d, run(&e, &prompts, d, a.max, a.streams)));
            }
            results.sort_by_key(|(d, _)| *d);
            let (off, on) = (&results[0].1, &results[1].1);
            for (x, y) in off.iter().zip(on) {
                assert_eq!(x.ids, y.ids, "{name}: greedy output differs with guessing");
            }
            let tokens = |s: &[Seq]| {
                s.iter()
                    .map(|q| q.ids.len().saturating_sub(1))
                    .sum::<usize>()
            };
            let secs = |s: &[Seq]| s.iter().map(|q| q.decode_s).sum::<f64>();
            let (t_off, t_on) = (tokens(off), tokens(on));
            off_rate.push(t_off as f64 / secs(off));
            on_rate.push(t_on as f64 / secs(on));
            // passes after the first token: one a token off; on, a token less for each kept guess
            let g: usize = on.iter().map(|q| q.guessed).sum();
            let k: usize = on.iter().map(|q| q.kept).sum();
            guessed += g;
            kept += k;
            let passes_on = t_on.saturating_sub(k).max(1);
            let pass_off = secs(off) / t_off.max(1) as f64;
            let pass_on = secs(on) / passes_on as f64;
            pass_ratio.push(pass_on / pass_off);
            per_pass.push(t_on as f64 / passes_on as f64);
        }
        let (off, on) = (median(off_rate), median(on_rate));
        println!(
            "| {name} | {off:.1} | {on:.1} | {:.2}x | {kept} of {guessed} ({:.0} %) | {:.2} | {:.2} |",
            on / off,
            100.0 * kept as f64 / guessed.max(1) as f64,
            median(per_pass),
            median(pass_ratio)
        );
    }
}
