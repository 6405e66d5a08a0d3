//! The public face of the engine: load a GGUF, then submit sequences to its decode thread.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::Arc;
use std::time::Instant;

use candle_core::utils::barrier_pool;
use candle_core::Device;

use crate::chat_template::{ChatTemplate, TemplateSource};
use crate::compute_priority;
use crate::constrained::Constrained;
use crate::cpu_parallel::{pool_threads, with_threads};
use crate::error::{EngineError, Result};
use crate::hparams::{md_str, Hparams};
use crate::kv_type::KvType;
use crate::model::{KvCache, Model};
use crate::scheduler::{Command, GenerateRequest, Scheduler, Shared};
use crate::tokenizer::GgufTokenizer;
use crate::weights::{GgufFile, WeightFormat};
use engine_port::{ChatTurn, OutputConstraint, PromptPart, SlotPermit, Slots};

/// Which device runs the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    #[default]
    Cpu,
    /// CUDA device ordinal; needs the `cuda` cargo feature.
    Cuda(usize),
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        if s == "cpu" {
            return Ok(Self::Cpu);
        }
        if s == "cuda" {
            return Ok(Self::Cuda(0));
        }
        if let Some(n) = s.strip_prefix("cuda:") {
            return n
                .parse()
                .map(Self::Cuda)
                .map_err(|_| format!("bad CUDA ordinal in {s:?}"));
        }
        Err(format!("unknown device {s:?} (cpu | cuda | cuda:N)"))
    }
}

impl std::fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu => write!(f, "cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl DeviceChoice {
    pub fn is_cpu(self) -> bool {
        matches!(self, Self::Cpu)
    }

    /// Whether this build can open CUDA devices (the `cuda` feature).
    pub const fn cuda_built() -> bool {
        cfg!(feature = "cuda")
    }

    /// Opens the device (a CUDA one through candle: its own context stream).
    pub fn open(self) -> Result<Device> {
        match self {
            Self::Cpu => Ok(Device::Cpu),
            Self::Cuda(n) => {
                #[cfg(feature = "cuda")]
                {
                    Device::new_cuda(n)
                        .map_err(|e| EngineError::Device(crate::error::message_of(&e)))
                }
                #[cfg(not(feature = "cuda"))]
                {
                    Err(EngineError::Device(format!(
                        "cuda:{n} requested but this build has no `cuda` feature"
                    )))
                }
            }
        }
    }
}

/// How to load and run a model.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub model_path: PathBuf,
    /// Sequences decoded together (one KV cache row each).
    pub slots: usize,
    /// Tokens per sequence (prompt + output); 0 = the model's trained context, cut to what
    /// `settings.kv_cache_max_bytes` holds for every slot.
    pub ctx: usize,
    pub settings: EngineSettings,
}

/// How the engine stores, computes and schedules, whatever the model: what a pool of this
/// engine is configured with beside its model, slots and context.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineSettings {
    /// The most the key/value cache may take when `ctx` is 0 (0: no cap).
    pub kv_cache_max_bytes: usize,
    /// How keys and values are stored (f16: half the bytes).
    pub kv_type: KvType,
    /// Compute threads this engine uses, at most the process's compute pool (sized once by
    /// [`configure_process_threads`]); 0 = all of the pool.
    pub threads: usize,
    pub device: DeviceChoice,
    pub weight_format: WeightFormat,
    /// Host memory for the keys and values of prompts whose cache rows were reused by
    /// other prompts, so they start after their prefix when they come back (0: off).
    pub prompt_cache_bytes: usize,
    /// Prompt tokens one forward pass takes at least while other sequences decode (an idle
    /// engine takes whole chunks of prompt).
    pub step_prompt_tokens: usize,
    /// How long a pass beside decoding sequences should take: more prompt tokens than
    /// `step_prompt_tokens` go in while the last pass shows they fit (the longest a stream
    /// waits between two tokens while a long prompt arrives); 0 = exactly
    /// `step_prompt_tokens` a pass.
    pub step_ms: u64,
    /// With fixed chunks (`step_ms` 0), the most a pass beside decoding sequences spends on
    /// prompt tokens (ms, over what the decoding tokens alone take; learned from the
    /// passes): fewer prompt tokens than `step_prompt_tokens` go in where they would take
    /// longer (at least one); 0 = no ceiling.
    pub step_prompt_ms: u64,
    /// A chat template (Jinja) used over the model's own: a built-in by name
    /// (`builtin_templates.rs`) or a file, resolved by whoever configures the pool.
    pub chat_template: Option<String>,
    /// Tokens guessed ahead per pass by prompt lookup (n-gram speculation, checked in the same
    /// pass, the output unchanged) for requests that do not say; 0 = off unless a request
    /// asks; at most [`crate::MAX_DRAFT_TOKENS`].
    pub draft_tokens: usize,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            kv_cache_max_bytes: DEFAULT_KV_CACHE_MAX_BYTES,
            kv_type: KvType::F32,
            threads: 0,
            device: DeviceChoice::Cpu,
            weight_format: WeightFormat::Auto,
            prompt_cache_bytes: DEFAULT_PROMPT_CACHE_BYTES,
            step_prompt_tokens: DEFAULT_STEP_PROMPT_TOKENS,
            step_ms: DEFAULT_STEP_MS,
            step_prompt_ms: DEFAULT_STEP_PROMPT_MS,
            chat_template: None,
            draft_tokens: 0,
        }
    }
}

/// Default size of the host-memory prompt cache: 2 GiB, what 16 chat conversations of ~700
/// tokens through one 4-slot pool of the default model need to find their history again
/// (the multi-turn replay beside llama-server: 256 MiB served 78 % of the resent history,
/// 2 GiB 98 %, llama-server's 8 GiB `--cache-ram` 99.9 %). Host memory is taken only as
/// prompts are saved.
pub const DEFAULT_PROMPT_CACHE_BYTES: usize = 2048 << 20;
/// Default cap on the key/value cache when the context is the trained one (`ctx` 0).
pub const DEFAULT_KV_CACHE_MAX_BYTES: usize = 2 << 30;
/// A context cut to fit the key/value cache is a multiple of this.
const CTX_STEP: usize = 256;
/// Default least prompt tokens per pass beside decoding sequences.
pub const DEFAULT_STEP_PROMPT_TOKENS: usize = 16;
/// Default time a pass beside decoding sequences should take: none, exactly
/// `step_prompt_tokens` a pass (on the 2-core reference machine a time of 60–100 ms gave the
/// long prompt a shorter answer beside a stream but let more gaps between the stream's tokens
/// pass 150 ms: every pass then takes about the time, where fixed chunks take it only at the
/// prompt's end; `ENG-CHUNK-3` in `.specs/engine.md`).
pub const DEFAULT_STEP_MS: u64 = 0;
/// Default most time (ms) a pass beside decoding sequences spends on prompt tokens
/// (`ENG-CHUNK-6` in `.specs/engine.md`: at 25 a Gemma 3 stream's longest gap beside a long prompt
/// passed 50 ms in half the rounds on a 2-core AVX2 machine, at 20 in one of six).
pub const DEFAULT_STEP_PROMPT_MS: u64 = 20;

impl EngineOptions {
    pub fn new(model_path: impl Into<PathBuf>) -> Self {
        Self {
            model_path: model_path.into(),
            slots: 4,
            ctx: 0,
            settings: EngineSettings::default(),
        }
    }
}

/// The context per sequence a load of `opts` would serve, read from the GGUF's header alone
/// (what `/v1/models` says of a model before it is loaded).
pub fn served_context(opts: &EngineOptions) -> Result<usize> {
    let file = GgufFile::open(&opts.model_path)?;
    let hp = Hparams::from_metadata(&file.content.metadata)?;
    context_for(&hp, opts)
}

/// Tokens per sequence: `opts.ctx` (at most the trained context), or for 0 the trained context
/// cut (to a multiple of 256 tokens) to what `opts.settings.kv_cache_max_bytes` holds for every slot.
fn context_for(hp: &Hparams, opts: &EngineOptions) -> Result<usize> {
    if opts.ctx > hp.ctx_train {
        return Err(EngineError::InvalidParams(format!(
            "ctx {} exceeds the model's trained context {}",
            opts.ctx, hp.ctx_train
        )));
    }
    if opts.ctx > 0 {
        return Ok(opts.ctx);
    }
    let per_token = KvCache::bytes(hp, opts.slots.max(1), 1, opts.settings.kv_type);
    if opts.settings.kv_cache_max_bytes == 0
        || per_token * hp.ctx_train <= opts.settings.kv_cache_max_bytes
    {
        return Ok(hp.ctx_train);
    }
    let fits = opts.settings.kv_cache_max_bytes / per_token / CTX_STEP * CTX_STEP;
    if fits == 0 {
        return Err(EngineError::InvalidParams(format!(
            "{} slots of {CTX_STEP} tokens need {} MiB of key/value cache, over the {} MiB \
             allowed: fewer slots, a larger kv_cache_mib or an explicit ctx",
            opts.slots,
            (per_token * CTX_STEP) >> 20,
            opts.settings.kv_cache_max_bytes >> 20
        )));
    }
    Ok(fits)
}

/// What was loaded, for capabilities and health.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    pub model_path: PathBuf,
    /// `general.name` from the GGUF, or the file stem.
    pub name: String,
    pub architecture: String,
    pub ctx: usize,
    pub ctx_train: usize,
    pub slots: usize,
    pub vocab: usize,
    pub device: DeviceChoice,
    pub threads: usize,
    pub weight_format: WeightFormat,
    pub template: TemplateSource,
    pub load_ms: u64,
    /// Bytes reserved for the KV cache of all slots.
    pub kv_cache_bytes: usize,
    /// How the KV cache stores keys and values.
    pub kv_type: KvType,
    /// Size of the GGUF file the weights came from.
    pub weights_bytes: u64,
    pub layers: usize,
    /// Parameters: the elements of every tensor in the file.
    pub parameters: u64,
    /// The weights' quantization by llama.cpp's name (`Q4_1`, `Q4_K_M`, …).
    pub quantization: String,
    /// `tokenizer.chat_template` from the GGUF, when it has one.
    pub chat_template: Option<String>,
}

/// Sets `RAYON_NUM_THREADS` and `CANDLE_BARRIER_POOL_SPIN_LIMIT` (each unless already set):
/// the size of the process's compute pool
/// (candle's barrier pool, which every engine's kernels share; 0 = one per logical CPU), and
/// candle stops re-deriving its thread count from `/proc/cpuinfo` on every f32 matmul
/// (measured: decode 88 → 121 tok/s on 2 cores).
///
/// `compute_nice` steps lower every compute thread: the pool's workers now, each engine's
/// decode thread when it starts (see `compute_priority`; 0 leaves them at the process's).
///
/// Call it once at process start, before any other thread exists: changing the environment
/// while other threads read it is not safe.
pub fn configure_process_threads(threads: usize, compute_nice: u8) {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        let n = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    }
    if std::env::var_os("CANDLE_BARRIER_POOL_SPIN_LIMIT").is_none() {
        std::env::set_var(
            "CANDLE_BARRIER_POOL_SPIN_LIMIT",
            COMPUTE_SPIN_LIMIT.to_string(),
        );
    }
    compute_priority::set_compute_nice(compute_nice);
    if compute_nice > 0 {
        // every worker lowers itself; the caller (the pool's last participant) is not one
        let pool = barrier_pool();
        let workers = pool.n_workers();
        pool.execute(|tid| {
            if tid < workers {
                compute_priority::lower_compute_thread();
            }
        });
    }
}

/// Pause instructions a compute worker spins through waiting for the next job before it
/// parks: about 5 ms here (25 ns each). candle's default (25 000, ~0.6 ms) let workers park
/// between the jobs of a decode step; measured with `benches/engine.rs`, 2 threads: decode
/// 120 → 134 tok/s, prompt 301 → 352 tok/s at 400 000.
const COMPUTE_SPIN_LIMIT: u32 = 200_000;

/// Version of this engine, reported in capabilities.
pub const ENGINE_NAME: &str = "candle";
pub const ENGINE_VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "+candle-0.11.1");

/// A loaded model with its decode thread. Cheap to share behind an `Arc`.
pub struct CandleEngine {
    info: ModelInfo,
    embed: engine_port::EmbedInfo,
    tokenizer: Arc<GgufTokenizer>,
    template: ChatTemplate,
    commands: SyncSender<Command>,
    shared: Arc<Shared>,
    slots: Slots,
    grammars: crate::constrained::Grammars,
}

impl CandleEngine {
    /// Loads the model and starts its decode thread.
    pub fn load(opts: EngineOptions) -> Result<Self> {
        let started = Instant::now();
        if opts.slots == 0 {
            return Err(EngineError::InvalidParams(
                "slots must be at least 1".into(),
            ));
        }
        let device = opts.settings.device.open()?;
        let mut file = GgufFile::open(&opts.model_path)?;
        let md = &file.content.metadata;
        let hp = Hparams::from_metadata(md)?;
        let tokenizer = Arc::new(GgufTokenizer::from_metadata(md)?);
        let tok_text = |key: &str| {
            crate::hparams::md_u32(md, key)
                .ok()
                .and_then(|id| tokenizer.token_text(id))
                .unwrap_or_default()
        };
        let (bos, eos) = (
            tok_text("tokenizer.ggml.bos_token_id"),
            tok_text("tokenizer.ggml.eos_token_id"),
        );
        let template = match &opts.settings.chat_template {
            Some(t) => ChatTemplate::configured(t, bos, eos)?,
            None => ChatTemplate::new(
                md_str(md, "tokenizer.chat_template"),
                &hp.architecture,
                bos,
                eos,
            )?,
        };
        let name = md_str(md, "general.name")
            .map(str::to_string)
            .unwrap_or_else(|| file_stem(&opts.model_path));
        let parameters = crate::model_facts::parameters(&file.content);
        let quantization = crate::model_facts::quantization(md, &file.content);
        // the template in use: the configured one over the file's
        let chat_template = opts
            .settings
            .chat_template
            .clone()
            .or_else(|| md_str(md, "tokenizer.chat_template").map(str::to_string));
        let ctx = context_for(&hp, &opts)?;
        // llama-server's --embedding: the GGUF's pooling, mean when it names none
        let embed_pooling =
            crate::hparams::md_u32(md, &format!("{}.pooling_type", hp.architecture))
                .ok()
                .and_then(engine_port::Pooling::from_gguf)
                .filter(|p| *p != engine_port::Pooling::Rank)
                .unwrap_or(engine_port::Pooling::Mean);
        let weights = file.load_weights(&hp, &device, opts.settings.weight_format)?;
        let model = Model::new(hp.clone(), weights, device.clone(), ctx)?;
        let vocab = model.vocab()?;
        // its own pages, given back when the engine goes (`fresh_pages.rs`)
        let cache = crate::fresh_pages::scope(|| {
            KvCache::new(&hp, opts.slots, ctx, opts.settings.kv_type, &device)
        })?;
        // the process's compute pool is sized once (see `configure_process_threads`); an
        // engine uses all of it or fewer threads
        let threads = match opts.settings.threads {
            0 => pool_threads(),
            n => n.min(pool_threads()),
        };
        let shared = Arc::new(Shared {
            reused_tokens: std::sync::atomic::AtomicU64::new(0),
            prompt_tokens: std::sync::atomic::AtomicU64::new(0),
            prompt_cache_bytes: AtomicUsize::new(0),
            alive: AtomicBool::new(true),
            held: Default::default(),
        });
        // candle's rayon-based ops run on the decode thread alone (they are small); the
        // kernels and candle's other ops on the process's spinning compute pool
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .thread_name(|_| "candle-decode".into())
            .build()
            .map_err(|e| EngineError::Device(format!("thread pool: {e}")))?;
        let (tx, rx) = std::sync::mpsc::sync_channel(opts.slots * 2);
        let slots = Slots::new(opts.slots);
        let scheduler = Scheduler::new(
            model,
            cache,
            tokenizer.clone(),
            slots.clone(),
            shared.clone(),
            &opts.settings,
        );
        std::thread::Builder::new()
            .name("candle-decode".into())
            .spawn(move || {
                pool.install(move || {
                    compute_priority::lower_compute_thread();
                    with_threads(threads, move || scheduler.run(rx))
                })
            })
            .map_err(|e| EngineError::Device(format!("cannot start decode thread: {e}")))?;
        let info = ModelInfo {
            model_path: opts.model_path.clone(),
            name,
            architecture: hp.architecture.clone(),
            ctx,
            ctx_train: hp.ctx_train,
            slots: opts.slots,
            vocab,
            device: opts.settings.device,
            threads,
            weight_format: opts.settings.weight_format,
            template: template.source(),
            load_ms: started.elapsed().as_millis() as u64,
            kv_cache_bytes: KvCache::bytes(&hp, opts.slots, ctx, opts.settings.kv_type),
            kv_type: opts.settings.kv_type,
            weights_bytes: std::fs::metadata(&opts.model_path)
                .map(|m| m.len())
                .unwrap_or(0),
            layers: hp.n_layer,
            parameters,
            quantization,
            chat_template,
        };
        tracing::info!(model = %info.name, ctx, slots = opts.slots, threads, kv_cache = opts.settings.kv_type.as_str(), load_ms = info.load_ms, "model loaded");
        Ok(Self {
            embed: engine_port::EmbedInfo {
                dims: hp.n_embd,
                pooling: embed_pooling,
                max_tokens: ctx,
                ranks: false,
            },
            info,
            grammars: crate::constrained::Grammars::new(tokenizer.clone()),
            tokenizer,
            template,
            commands: tx,
            shared,
            slots,
        })
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    pub fn tokenizer(&self) -> &GgufTokenizer {
        &self.tokenizer
    }

    /// Renders chat turns with the model's template.
    pub fn render_chat(&self, messages: &[ChatTurn]) -> Result<String> {
        self.template.render(messages)
    }

    /// Token ids of a chat: the template's markup with its special tokens, the messages'
    /// contents as plain text (a client cannot forge a turn), BOS first when the model wants
    /// it.
    pub fn encode_chat(&self, messages: &[ChatTurn]) -> Result<Vec<u32>> {
        let mut ids: Vec<u32> = self.tokenizer.bos().into_iter().collect();
        for piece in self.chat_pieces(messages)? {
            ids.extend(match &piece {
                crate::chat_template::Piece::Markup(t) => self.tokenizer.encode_markup(t)?,
                crate::chat_template::Piece::Content(t) => self.tokenizer.encode_plain(t)?,
            });
        }
        Ok(ids)
    }

    /// The pieces [`Self::encode_chat`] tokenizes: the template's markup and the contents.
    pub fn chat_pieces(&self, messages: &[ChatTurn]) -> Result<Vec<crate::chat_template::Piece>> {
        self.template.render_pieces(messages)
    }

    /// Token ids of a raw prompt from a client: plain text (special tokens written in it are
    /// characters), BOS first when the model wants it.
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>> {
        let mut ids: Vec<u32> = self.tokenizer.bos().into_iter().collect();
        ids.extend(self.tokenizer.encode_plain(text)?);
        Ok(ids)
    }

    /// Token ids of a prompt given as ids with text pieces among them (llama-server's mixed
    /// prompt): a text piece first is tokenized as [`Self::encode_text`] does (BOS where the
    /// model wants it), a later one as plain text; an id goes in as it is, and must be of the
    /// vocabulary.
    pub fn encode_parts(&self, parts: &[PromptPart]) -> Result<Vec<u32>> {
        let vocab = self.tokenizer.vocab_size();
        let mut ids = Vec::with_capacity(parts.len());
        for (i, part) in parts.iter().enumerate() {
            match part {
                PromptPart::Token(id) if (*id as usize) < vocab => ids.push(*id),
                PromptPart::Token(id) => {
                    return Err(EngineError::BadPrompt(format!(
                        "token id {id} (item {i}) is not in the vocabulary of {vocab} tokens"
                    )))
                }
                PromptPart::Text(t) if i == 0 => ids.extend(self.encode_text(t)?),
                PromptPart::Text(t) => ids.extend(self.tokenizer.encode_plain(t)?),
            }
        }
        Ok(ids)
    }

    /// Whether the decode thread still runs.
    pub fn is_alive(&self) -> bool {
        self.shared.alive.load(Ordering::SeqCst)
    }

    /// Prompt tokens so far whose keys and values came from a cached prefix (a cache row or
    /// the prompt cache) instead of being computed again.
    pub fn reused_prompt_tokens(&self) -> u64 {
        self.shared.reused_tokens.load(Ordering::Relaxed)
    }

    /// Prompt tokens of every sequence given a row so far (the reused ones included).
    pub fn prompt_tokens_taken(&self) -> u64 {
        self.shared.prompt_tokens.load(Ordering::Relaxed)
    }

    /// Bytes the host-memory prompt cache holds now.
    pub fn prompt_cache_bytes(&self) -> usize {
        self.shared.prompt_cache_bytes.load(Ordering::Relaxed)
    }

    /// The prefixes its rows and prompt cache hold, as the decode thread last published them.
    pub fn cached_prefixes(&self) -> Arc<engine_port::CachedPrefixes> {
        self.shared.held.get()
    }

    /// One of the engine's slots for a sequence to [`CandleEngine::submit`], or `None` when
    /// all are taken (each is given back when its sequence leaves its row).
    pub fn try_acquire(&self) -> Option<SlotPermit> {
        self.slots.try_acquire()
    }

    /// The engine's slots: the one count of sequences submitted and not yet let go.
    pub fn slots(&self) -> &Slots {
        &self.slots
    }

    /// Checks that a prompt of `prompt_tokens` can generate `max_tokens` within the context.
    pub fn check_fits(&self, prompt_tokens: usize, max_tokens: usize) -> Result<()> {
        if prompt_tokens == 0 {
            return Err(EngineError::InvalidParams("the prompt is empty".into()));
        }
        if prompt_tokens + max_tokens > self.info.ctx {
            return Err(EngineError::ContextOverflow {
                prompt_tokens,
                max_tokens,
                ctx: self.info.ctx,
            });
        }
        Ok(())
    }

    /// Starts a sequence in the slot of `req.permit`. Events arrive on `req.events`; a refused
    /// request gives its slot back at once.
    /// A sequence's hold to `constraint`, compiled against this model's vocabulary (once:
    /// compiled grammars are remembered). A constraint that does not compile is
    /// `InvalidParams`. Compiling can take milliseconds: not on an async runtime's thread.
    pub fn constrain(&self, constraint: &OutputConstraint) -> Result<Constrained> {
        self.grammars.matcher(constraint)
    }

    /// What this model's embeddings are: its hidden states' width, its GGUF's pooling (mean
    /// when it names none), its context; a decoder has no classification head.
    pub fn embed_info(&self) -> engine_port::EmbedInfo {
        self.embed
    }

    /// Token ids of a text as the model embeds it: as a raw prompt (BOS where the model wants
    /// it), cut to the context when `truncate`, else longer is an error saying how long.
    pub fn encode_for_embedding(&self, text: &str, truncate: bool) -> Result<Vec<u32>> {
        let mut ids = self.encode_text(text)?;
        let max = self.info.ctx;
        if ids.len() > max {
            if !truncate {
                return Err(EngineError::BadPrompt(format!(
                    "{} tokens, over the {max} the model takes",
                    ids.len()
                )));
            }
            ids.truncate(max);
        }
        Ok(ids)
    }

    /// Embeds a request's inputs in the slot of `req.permit` (their chunks go through beside
    /// the decoding sequences); the answer comes on `req.reply`.
    pub fn embed(&self, req: crate::embed_job::EmbedRequest) -> Result<()> {
        if !self.slots.owns(&req.permit) {
            return Err(EngineError::InvalidParams(
                "the slot permit belongs to another engine".into(),
            ));
        }
        if req.pooling == engine_port::Pooling::Rank {
            return Err(EngineError::InvalidParams(
                "this model has no classification head: it does not rank".into(),
            ));
        }
        let (max, vocab) = (self.info.ctx, self.tokenizer.vocab_size());
        for (i, t) in req.inputs.iter().enumerate() {
            if t.is_empty() || t.len() > max {
                return Err(EngineError::BadPrompt(format!(
                    "input {i} has {} tokens: an input has 1 to {max}",
                    t.len()
                )));
            }
            if let Some(bad) = t.iter().find(|&&id| id as usize >= vocab) {
                return Err(EngineError::BadPrompt(format!(
                    "token id {bad} is not in the vocabulary of {vocab} tokens"
                )));
            }
        }
        if !self.is_alive() {
            return Err(EngineError::Stopped);
        }
        self.commands
            .send(Command::Embed(Box::new(req)))
            .map_err(|_| EngineError::Stopped)
    }

    pub fn submit(&self, req: GenerateRequest) -> Result<()> {
        if !self.slots.owns(&req.permit) {
            return Err(EngineError::InvalidParams(
                "the slot permit belongs to another engine".into(),
            ));
        }
        req.sampling
            .validate()
            .map_err(EngineError::InvalidParams)?;
        if req.max_tokens == 0 {
            return Err(EngineError::InvalidParams(
                "max_tokens must be at least 1".into(),
            ));
        }
        self.check_fits(req.prompt_tokens.len(), req.max_tokens)?;
        if !self.is_alive() {
            return Err(EngineError::Stopped);
        }
        self.commands
            .send(Command::Submit(Box::new(req), Instant::now()))
            .map_err(|_| EngineError::Stopped)
    }
}

fn file_stem(p: &Path) -> String {
    p.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
}
