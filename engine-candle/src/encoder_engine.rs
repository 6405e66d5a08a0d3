//! An encoder model (BERT) loaded with its embedding thread. Each job is one request's inputs
//! in one slot; when the thread starts a pass it takes every job waiting, so the inputs of
//! several requests go through the matmuls together (micro-batching across requests), up to
//! [`PASS_TOKENS`] tokens a pass. A cancelled job's inputs not yet run are dropped between
//! passes. The slot is given back before the job's answer is sent.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;
use std::time::Instant;

use engine_port::{EmbedInfo, Pooling, PortError, SlotPermit, Slots};

use crate::bert::{Bert, BertHparams, ENCODER_ARCHITECTURES};
use crate::compute_priority;
use crate::cpu_parallel::{pool_threads, with_threads};
pub use crate::embed_job::EmbedRequest;
use crate::engine::{DeviceChoice, EngineSettings};
use crate::error::{EngineError, Result};
use crate::hparams::{md_str, md_u32};
use crate::pooling::{normalize, pool};
use crate::tokenizer::GgufTokenizer;
use crate::weights::{GgufFile, WeightFormat};

/// The most tokens one pass of the encoder takes (at least one input): enough rows for the
/// matmuls to run at their pace, few enough that a cancel (checked between passes) and the
/// other jobs waiting wait at most one short pass.
pub const PASS_TOKENS: usize = 1024;

/// How to load an encoder.
#[derive(Debug, Clone)]
pub struct EncoderOptions {
    pub model_path: PathBuf,
    /// Requests embedded at once (each a slot).
    pub slots: usize,
    /// Threads, device and weight format (the rest is a decoder's).
    pub settings: EngineSettings,
}

/// What was loaded.
#[derive(Debug, Clone)]
pub struct EncoderInfo {
    pub model_path: PathBuf,
    pub name: String,
    pub architecture: String,
    pub slots: usize,
    pub threads: usize,
    pub device: DeviceChoice,
    pub weight_format: WeightFormat,
    pub layers: usize,
    pub parameters: u64,
    pub quantization: String,
    pub weights_bytes: u64,
    pub load_ms: u64,
    pub embed: EmbedInfo,
}

/// A loaded encoder and its thread. Cheap to share behind an `Arc`.
pub struct EncoderEngine {
    info: EncoderInfo,
    tokenizer: Arc<GgufTokenizer>,
    cls: u32,
    sep: u32,
    jobs: SyncSender<EmbedRequest>,
    slots: Slots,
    alive: Arc<AtomicBool>,
    /// Inputs embedded, and passes run (the batch sizes' sum and count).
    inputs_done: Arc<AtomicU64>,
    passes: Arc<AtomicU64>,
}

/// Whether the GGUF at `path` is an encoder this engine loads (its architecture is one of
/// [`ENCODER_ARCHITECTURES`]: `bert`, `nomic-bert`).
pub fn is_encoder(path: &Path) -> Result<bool> {
    let f = GgufFile::open(path)?;
    let arch = md_str(&f.content.metadata, "general.architecture").unwrap_or("");
    Ok(ENCODER_ARCHITECTURES.contains(&arch))
}

impl EncoderEngine {
    /// Loads the model and starts its thread.
    pub fn load(opts: EncoderOptions) -> Result<Self> {
        let started = Instant::now();
        if opts.slots == 0 {
            return Err(EngineError::InvalidParams(
                "slots must be at least 1".into(),
            ));
        }
        let device = opts.settings.device.open()?;
        let mut file = GgufFile::open(&opts.model_path)?;
        let md = file.content.metadata.clone();
        let hp = BertHparams::from_metadata(&md)?;
        let tokenizer = Arc::new(GgufTokenizer::from_metadata(&md)?);
        // what llama.cpp's converter writes: BOS is [CLS], EOS and the separator [SEP]
        let id = |keys: [&str; 2], name: &str| -> Result<u32> {
            keys.iter()
                .find_map(|k| md_u32(&md, &format!("tokenizer.ggml.{k}_token_id")).ok())
                .or_else(|| tokenizer.id_of(name))
                .ok_or_else(|| {
                    EngineError::BadModel(format!("{}: no {name} token", hp.architecture))
                })
        };
        let cls = id(["bos", "cls"], "[CLS]")?;
        let sep = id(["seperator", "eos"], "[SEP]")?;
        let parameters = crate::model_facts::parameters(&file.content);
        let quantization = crate::model_facts::quantization(&md, &file.content);
        let model = Bert::load(&mut file, hp.clone(), &device, opts.settings.weight_format)?;
        let threads = match opts.settings.threads {
            0 => pool_threads(),
            n => n.min(pool_threads()),
        };
        let embed = EmbedInfo {
            dims: model.n_embd(),
            pooling: hp.pooling,
            max_tokens: hp.ctx_train,
            ranks: model.has_rank_head(),
        };
        let alive = Arc::new(AtomicBool::new(true));
        let (inputs_done, passes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        // the weights' matmuls (own kernels, float ones included: dense_cpu.rs) and candle's
        // elementwise ops run on the process's compute pool; candle's rayon-based ops (the
        // attention's small per-sequence matmuls) on this thread alone, so that no second
        // pool's threads compete with the first one's for the cores
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .thread_name(|_| "candle-embed".into())
            .build()
            .map_err(|e| EngineError::Device(format!("thread pool: {e}")))?;
        let (tx, rx) = std::sync::mpsc::sync_channel(opts.slots * 2);
        let worker = Worker {
            model,
            alive: alive.clone(),
            inputs_done: inputs_done.clone(),
            passes: passes.clone(),
        };
        std::thread::Builder::new()
            .name("candle-embed".into())
            .spawn(move || {
                pool.install(move || {
                    compute_priority::lower_compute_thread();
                    with_threads(threads, move || worker.run(rx))
                })
            })
            .map_err(|e| EngineError::Device(format!("cannot start the embedding thread: {e}")))?;
        let name = md_str(&md, "general.name")
            .map(str::to_string)
            .unwrap_or_else(|| {
                opts.model_path
                    .file_stem()
                    .map_or("model".into(), |s| s.to_string_lossy().into_owned())
            });
        let info = EncoderInfo {
            weights_bytes: std::fs::metadata(&opts.model_path).map_or(0, |m| m.len()),
            model_path: opts.model_path,
            name,
            architecture: hp.architecture.clone(),
            slots: opts.slots,
            threads,
            device: opts.settings.device,
            weight_format: opts.settings.weight_format,
            layers: hp.n_layer,
            parameters,
            quantization,
            load_ms: started.elapsed().as_millis() as u64,
            embed,
        };
        tracing::info!(model = %info.name, slots = opts.slots, threads, dims = embed.dims, pooling = embed.pooling.as_str(), load_ms = info.load_ms, "encoder loaded");
        Ok(Self {
            info,
            tokenizer,
            cls,
            sep,
            jobs: tx,
            slots: Slots::new(opts.slots),
            alive,
            inputs_done,
            passes,
        })
    }

    pub fn info(&self) -> &EncoderInfo {
        &self.info
    }

    pub fn tokenizer(&self) -> &GgufTokenizer {
        &self.tokenizer
    }

    /// Token ids of a text as the model embeds it: `[CLS] pieces [SEP]`, the pieces cut to
    /// fit when `truncate` (else more than the model takes is an error saying how many).
    pub fn encode_text(&self, text: &str, truncate: bool) -> Result<Vec<u32>> {
        let pieces = self.tokenizer.encode_plain(text)?;
        self.framed(&[&pieces], truncate)
    }

    /// A query and a document as a reranker reads them: `[CLS] query [SEP] document [SEP]`
    /// (BERT's pair form, what cross-encoders are trained on); the document is cut first.
    pub fn encode_pair(&self, query: &str, document: &str, truncate: bool) -> Result<Vec<u32>> {
        let q = self.tokenizer.encode_plain(query)?;
        let d = self.tokenizer.encode_plain(document)?;
        self.framed(&[&q, &d], truncate)
    }

    /// `[CLS] a [SEP] (b [SEP])`, the last part cut when over the model's positions.
    fn framed(&self, parts: &[&[u32]], truncate: bool) -> Result<Vec<u32>> {
        let max = self.info.embed.max_tokens;
        let specials = 1 + parts.len();
        let total = specials + parts.iter().map(|p| p.len()).sum::<usize>();
        let mut over = total.saturating_sub(max);
        if over > 0 && !truncate {
            return Err(EngineError::BadPrompt(format!(
                "{total} tokens, over the {max} the model takes"
            )));
        }
        let mut ids = Vec::with_capacity(total.min(max));
        ids.push(self.cls);
        let n = parts.len();
        for (i, p) in parts.iter().enumerate() {
            // the last part gives up tokens first, then the one before
            let keep = if i + 1 == n || over > 0 {
                let cut = over.min(p.len());
                over -= cut;
                p.len() - cut
            } else {
                p.len()
            };
            ids.extend_from_slice(&p[..keep]);
            ids.push(self.sep);
        }
        Ok(ids)
    }

    /// Embeds a request's inputs in the slot of `req.permit`; the answer comes on
    /// `req.reply`. A refused request gives its slot back at once.
    pub fn submit(&self, req: EmbedRequest) -> Result<()> {
        if !self.slots.owns(&req.permit) {
            return Err(EngineError::InvalidParams(
                "the slot permit belongs to another engine".into(),
            ));
        }
        let max = self.info.embed.max_tokens;
        if let Some((i, t)) = req
            .inputs
            .iter()
            .enumerate()
            .find(|(_, t)| t.is_empty() || t.len() > max)
        {
            return Err(EngineError::BadPrompt(format!(
                "input {i} has {} tokens: an input has 1 to {max}",
                t.len()
            )));
        }
        if req.pooling == Pooling::Rank && !self.info.embed.ranks {
            return Err(EngineError::InvalidParams(
                "this model has no classification head: it does not rank".into(),
            ));
        }
        let vocab = self.tokenizer.vocab_size();
        if let Some(bad) = req
            .inputs
            .iter()
            .flatten()
            .find(|&&id| id as usize >= vocab)
        {
            return Err(EngineError::BadPrompt(format!(
                "token id {bad} is not in the vocabulary of {vocab} tokens"
            )));
        }
        if !self.is_alive() {
            return Err(EngineError::Stopped);
        }
        self.jobs.send(req).map_err(|_| EngineError::Stopped)
    }

    pub fn try_acquire(&self) -> Option<SlotPermit> {
        self.slots.try_acquire()
    }

    pub fn slots(&self) -> &Slots {
        &self.slots
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Inputs embedded so far and the passes they took (their ratio: the mean batch).
    pub fn batches(&self) -> (u64, u64) {
        (
            self.inputs_done.load(Ordering::Relaxed),
            self.passes.load(Ordering::Relaxed),
        )
    }
}

/// The embedding thread's side.
struct Worker {
    model: Bert,
    alive: Arc<AtomicBool>,
    inputs_done: Arc<AtomicU64>,
    passes: Arc<AtomicU64>,
}

/// A job being embedded: its inputs' results so far, and why one failed.
struct Held {
    req: EmbedRequest,
    out: Vec<Option<Vec<Vec<f32>>>>,
    failed: Option<String>,
}

impl Worker {
    fn run(self, jobs: Receiver<EmbedRequest>) {
        // the engine is gone when this thread is, whatever ends it
        struct Gone(Arc<AtomicBool>);
        impl Drop for Gone {
            fn drop(&mut self) {
                self.0.store(false, Ordering::SeqCst);
            }
        }
        let _gone = Gone(self.alive.clone());
        while let Ok(first) = jobs.recv() {
            let mut held = vec![hold(first)];
            // every job waiting now shares the passes
            while let Ok(more) = jobs.try_recv() {
                held.push(hold(more));
            }
            self.embed_all(&mut held);
            for h in held {
                let Held { req, out, failed } = h;
                let EmbedRequest {
                    permit,
                    reply,
                    cancel,
                    ..
                } = req;
                // the slot first: a client that reads the answer may send the next at once
                drop(permit);
                let answer = match (out.into_iter().collect::<Option<Vec<_>>>(), failed) {
                    (_, Some(why)) => Err(PortError::Load(format!("the encoder failed: {why}"))),
                    (Some(v), None) if !cancel.is_cancelled() => Ok(v),
                    _ => Err(PortError::Dead("the job was cancelled".into())),
                };
                let _ = reply.send(answer);
            }
        }
    }

    /// Runs every input of `held` in passes of at most [`PASS_TOKENS`] tokens.
    fn embed_all(&self, held: &mut [Held]) {
        let mut todo: Vec<(usize, usize)> = Vec::new();
        for (j, h) in held.iter().enumerate() {
            for i in 0..h.req.inputs.len() {
                todo.push((j, i));
            }
        }
        let mut at = 0;
        while at < todo.len() {
            let mut pass = Vec::new();
            let mut tokens = 0;
            while at < todo.len() {
                let (j, i) = todo[at];
                let n = held[j].req.inputs[i].len();
                if !pass.is_empty() && tokens + n > PASS_TOKENS {
                    break;
                }
                at += 1;
                if held[j].req.cancel.is_cancelled() {
                    continue;
                }
                pass.push((j, i));
                tokens += n;
            }
            if pass.is_empty() {
                continue;
            }
            let seqs: Vec<&[u32]> = pass
                .iter()
                .map(|&(j, i)| held[j].req.inputs[i].as_slice())
                .collect();
            let started = Instant::now();
            let hidden = match self.model.forward(&seqs) {
                Ok(h) => h,
                Err(e) => {
                    tracing::warn!(error = %e, "an encoder pass failed");
                    for &(j, _) in &pass {
                        held[j].failed = Some(e.to_string());
                    }
                    continue;
                }
            };
            tracing::debug!(
                inputs = pass.len(),
                tokens,
                ms = started.elapsed().as_secs_f64() * 1e3,
                "encoder pass"
            );
            self.passes.fetch_add(1, Ordering::Relaxed);
            self.inputs_done
                .fetch_add(pass.len() as u64, Ordering::Relaxed);
            for (&(j, i), h) in pass.iter().zip(hidden) {
                let req = &held[j].req;
                match self.finish(&h, req.pooling, req.normalize) {
                    Ok(v) => held[j].out[i] = Some(v),
                    Err(e) => held[j].failed = Some(e.to_string()),
                }
            }
        }
    }

    /// One input's answer from its hidden states.
    fn finish(&self, hidden: &[f32], pooling: Pooling, unit: bool) -> Result<Vec<Vec<f32>>> {
        let width = self.model.n_embd();
        if pooling == Pooling::Rank {
            let first = &hidden[..width.min(hidden.len())];
            return Ok(vec![self.model.rank(first)?]);
        }
        let mut v = pool(hidden, width, pooling);
        if unit {
            v.iter_mut().for_each(|x| normalize(x));
        }
        Ok(v)
    }
}

fn hold(req: EmbedRequest) -> Held {
    let n = req.inputs.len();
    Held {
        req,
        out: vec![None; n],
        failed: None,
    }
}
