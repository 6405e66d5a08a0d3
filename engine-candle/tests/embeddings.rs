//! ENG-EMB-1..5 (issue 51): embeddings against llama.cpp on the same GGUF files
//! (`fixtures/llama_cpp_embeddings.json`, recorded with llama-cpp-python 0.3.36 by
//! `ci/embed_reference.py`): all-MiniLM-L6-v2 converted by `ci/minilm_gguf.py` in F32, F16,
//! Q8_0 and Q4_0, pooling mean, cls and none, and a tiny random-weight nomic-bert — the same
//! token ids, cosine ≥ 0.999 — and a reranker's scores (the tiny random-weight one) in
//! llama.cpp's order and within 1e-3; a vector never depends on what else shared its pass (32
//! inputs of mixed lengths).

use std::path::PathBuf;

use engine_candle::{EmbedRequest, EncoderEngine, EncoderOptions, EngineSettings, PASS_TOKENS};
use engine_port::{Embeddings, Pooling};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    texts: Vec<TextCase>,
    rerank: RerankCase,
}

#[derive(Deserialize)]
struct TextCase {
    model: String,
    sha256: String,
    poolings: std::collections::BTreeMap<String, Vec<Row>>,
}

#[derive(Deserialize)]
struct Row {
    text: String,
    ids: Vec<u32>,
    vectors: Vec<Vec<f32>>,
}

#[derive(Deserialize)]
struct RerankCase {
    model: String,
    pairs: Vec<Pair>,
}

#[derive(Deserialize)]
struct Pair {
    query: String,
    document: String,
    ids: Vec<u32>,
    score: f32,
}

fn fixture() -> Fixture {
    let p =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama_cpp_embeddings.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// A model of `.cache/models` (`ci/minilm_gguf.py`, `ci/fetch-model.sh`), checked to be the
/// file the reference was recorded on.
fn model(name: &str, sha256: Option<&str>) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../.cache/models")
        .join(name);
    assert!(p.exists(), "{} missing: run ci/minilm_gguf.py", p.display());
    if let Some(want) = sha256 {
        use sha2::Digest;
        let got = format!("{:x}", sha2::Sha256::digest(std::fs::read(&p).unwrap()));
        assert_eq!(
            got, want,
            "{name} is not the file the reference was recorded on"
        );
    }
    p
}

fn encoder(path: PathBuf, slots: usize) -> EncoderEngine {
    EncoderEngine::load(EncoderOptions {
        model_path: path,
        slots,
        settings: EngineSettings::default(),
    })
    .expect("the encoder loads")
}

fn pooling(name: &str) -> Pooling {
    name.parse().unwrap()
}

/// `inputs` embedded in one job.
fn embed(
    e: &EncoderEngine,
    inputs: Vec<Vec<u32>>,
    pooling: Pooling,
    normalize: bool,
) -> Embeddings {
    let permit = e.try_acquire().expect("a free slot");
    one_job(permit, inputs, pooling, normalize, |r| e.submit(r))
}

/// The answer to one job of `inputs`, handed over by `submit`.
fn one_job<E: std::fmt::Debug>(
    permit: engine_port::SlotPermit,
    inputs: Vec<Vec<u32>>,
    pooling: Pooling,
    normalize: bool,
    submit: impl FnOnce(EmbedRequest) -> Result<(), E>,
) -> Embeddings {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let (reply, rx) = tokio::sync::oneshot::channel();
        submit(EmbedRequest {
            permit,
            inputs,
            pooling,
            normalize,
            cancel: Default::default(),
            reply,
        })
        .unwrap();
        rx.await.unwrap().unwrap()
    })
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let n = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

/// ENG-EMB-1: every encoder case of the fixture — the tokenizer gives llama.cpp's ids, and
/// each vector (each token's under pooling none) is within cosine 0.999 of llama.cpp's.
#[test]
fn encoder_vectors_match_llama_cpp_per_weight_format_and_pooling() {
    let f = fixture();
    let mut checked = 0;
    for case in f.texts.iter().filter(|c| c.model.starts_with("all-MiniLM")) {
        let e = encoder(model(&case.model, Some(&case.sha256)), 2);
        for (p, rows) in &case.poolings {
            let inputs: Vec<Vec<u32>> = rows
                .iter()
                .map(|r| {
                    let ids = e.encode_text(&r.text, false).unwrap();
                    assert_eq!(ids, r.ids, "{} tokens of {:?}", case.model, r.text);
                    ids
                })
                .collect();
            let got = embed(&e, inputs, pooling(p), false);
            for (r, g) in rows.iter().zip(&got) {
                assert_eq!(g.len(), r.vectors.len(), "{} {p} {:?}", case.model, r.text);
                for (a, b) in g.iter().zip(&r.vectors) {
                    let c = cosine(a, b);
                    assert!(c >= 0.999, "{} {p} {:?}: cosine {c}", case.model, r.text);
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 50, "{checked} vectors");
}

/// ENG-EMB-3: the reranker's scores, from its own pair form, in llama.cpp's order and within
/// 1e-3 of its values.
#[test]
fn reranker_scores_match_llama_cpp() {
    let f = fixture();
    let e = encoder(model(&f.rerank.model, None), 2);
    let inputs: Vec<Vec<u32>> = f
        .rerank
        .pairs
        .iter()
        .map(|p| {
            let ids = e.encode_pair(&p.query, &p.document, false).unwrap();
            assert_eq!(ids, p.ids, "{:?} / {:?}", p.query, p.document);
            ids
        })
        .collect();
    let got = embed(&e, inputs, Pooling::Rank, false);
    let ours: Vec<f32> = got.iter().map(|v| v[0][0]).collect();
    let theirs: Vec<f32> = f.rerank.pairs.iter().map(|p| p.score).collect();
    for (a, b) in ours.iter().zip(&theirs) {
        assert!((a - b).abs() < 1e-3, "{ours:?} vs {theirs:?}");
    }
    let order = |s: &[f32]| {
        let mut i: Vec<usize> = (0..s.len()).collect();
        i.sort_by(|&a, &b| s[b].total_cmp(&s[a]));
        i
    };
    assert_eq!(order(&ours), order(&theirs));
}

/// ENG-EMB-4: each input alone and inside a batch of 32 of mixed lengths (3 to 250 tokens)
/// gives the same vector, cosine ≥ 0.9999, and together they share passes.
#[test]
fn a_vector_does_not_depend_on_its_batch() {
    // the quantized kernels, and the float weights' gemm (a pass of a few tokens and one of a
    // thousand run down the same kernel)
    for file in ["all-MiniLM-L6-v2.Q8_0.gguf", "all-MiniLM-L6-v2.F16.gguf"] {
        batch_invariance(file);
    }
}

fn batch_invariance(file: &str) {
    let e = encoder(model(file, None), 2);
    let texts: Vec<String> = (0..32)
        .map(|i| {
            let words = 1 + (i * 37) % 180;
            (0..words)
                .map(|w| ["sea", "stone", "light", "river", "quiet", "north"][(w + i) % 6])
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let ids: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| e.encode_text(t, false).unwrap())
        .collect();
    let lens: Vec<usize> = ids.iter().map(Vec::len).collect();
    assert!(
        lens.iter().min() < Some(&5) && lens.iter().max() > Some(&150),
        "{lens:?}"
    );
    let together = embed(&e, ids.clone(), Pooling::Mean, true);
    for (i, one) in ids.into_iter().enumerate() {
        let alone = embed(&e, vec![one], Pooling::Mean, true);
        let c = cosine(&alone[0][0], &together[i][0]);
        assert!(
            c >= 0.9999,
            "{file}: input {i} ({} tokens): cosine {c}",
            lens[i]
        );
    }
    // The 32 inputs alone took 32 passes; together they fill passes of up to PASS_TOKENS
    // tokens in order, so two passes in a row always hold more than PASS_TOKENS tokens.
    let (inputs, passes) = e.batches();
    let total: usize = lens.iter().sum();
    let together = passes.saturating_sub(32);
    assert!(
        inputs >= 64 && together >= 1 && together <= (2 * total).div_ceil(PASS_TOKENS) as u64,
        "{file}: {inputs} inputs in {passes} passes ({total} tokens together)"
    );
}

/// `inputs` embedded by a decoder in one job.
fn embed_decoder(
    e: &engine_candle::CandleEngine,
    inputs: Vec<Vec<u32>>,
    pooling: Pooling,
    normalize: bool,
) -> Embeddings {
    let permit = e.try_acquire().expect("a free slot");
    one_job(permit, inputs, pooling, normalize, |r| e.embed(r))
}

fn decoder(slots: usize) -> engine_candle::CandleEngine {
    let mut opts =
        engine_candle::EngineOptions::new(model("SmolLM2-135M-Instruct.Q4_1.gguf", None));
    opts.slots = slots;
    opts.ctx = 1024;
    engine_candle::CandleEngine::load(opts).expect("the default model loads")
}

/// ENG-EMB-5: a decoder embeds as llama-server's `--embedding` does — its last hidden states
/// (after the final norm) pooled, mean and last — each vector within cosine 0.999 of
/// llama.cpp's on the same ids; the inputs of one job run in rows it borrows while slots are
/// free, each as it would alone.
#[test]
fn decoder_vectors_match_llama_cpp_and_do_not_depend_on_the_batch() {
    let f = fixture();
    let case = f
        .texts
        .iter()
        .find(|c| c.model.starts_with("SmolLM2"))
        .expect("the decoder's case");
    model(&case.model, Some(&case.sha256));
    let e = decoder(4);
    for (p, rows) in &case.poolings {
        let inputs: Vec<Vec<u32>> = rows
            .iter()
            .map(|r| {
                let ids = e.encode_for_embedding(&r.text, false).unwrap();
                assert_eq!(ids, r.ids, "tokens of {:?}", r.text);
                ids
            })
            .collect();
        let together = embed_decoder(&e, inputs.clone(), pooling(p), false);
        for ((r, g), ids) in rows.iter().zip(&together).zip(inputs) {
            let c = cosine(&g[0], &r.vectors[0]);
            assert!(c >= 0.999, "{p} {:?}: cosine {c}", r.text);
            let alone = embed_decoder(&e, vec![ids], pooling(p), false);
            let same = cosine(&alone[0][0], &g[0]);
            assert!(same >= 0.9999, "{p} {:?}: alone vs together {same}", r.text);
        }
    }
    // every slot free again: the borrowed ones were given back
    assert_eq!(e.slots().in_use(), 0);
}

/// ENG-EMB-1, ENG-EMB-4: a `nomic-bert` encoder (the tiny random-weight one of
/// `ci/minilm_gguf.py`: rotary positions, fused attn_qkv, SwiGLU) gives llama.cpp's vectors —
/// the long text's 240-odd positions turn by their angles as llama.cpp's NeoX rotation does —
/// and each vector is the same alone and in the batch.
#[test]
fn nomic_bert_vectors_match_llama_cpp_and_do_not_depend_on_the_batch() {
    let f = fixture();
    let case = f
        .texts
        .iter()
        .find(|c| c.model == "tiny-nomic-bert.gguf")
        .expect("the nomic-bert case");
    let e = encoder(model(&case.model, Some(&case.sha256)), 2);
    let rows = &case.poolings["mean"];
    let inputs: Vec<Vec<u32>> = rows
        .iter()
        .map(|r| {
            let ids = e.encode_text(&r.text, false).unwrap();
            assert_eq!(ids, r.ids, "tokens of {:?}", r.text);
            ids
        })
        .collect();
    assert!(inputs.iter().any(|i| i.len() > 200), "a long input");
    let together = embed(&e, inputs.clone(), Pooling::Mean, false);
    for ((r, g), ids) in rows.iter().zip(&together).zip(inputs) {
        let c = cosine(&g[0], &r.vectors[0]);
        assert!(c >= 0.999, "{:?}: cosine {c}", r.text);
        let alone = embed(&e, vec![ids], Pooling::Mean, false);
        let same = cosine(&alone[0][0], &g[0]);
        assert!(same >= 0.9999, "{:?}: alone vs together {same}", r.text);
    }
}
