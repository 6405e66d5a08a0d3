//! The candle engine behind the Engine port: its adapter and factory, and what the server
//! configures and sets up for it (its settings, the process's compute threads, the allocator
//! its key/value caches want). The server names these through this module only.

use std::sync::Arc;

use engine_candle::{
    CandleEngine, EmbedRequest, EncoderEngine, EncoderOptions, EngineError, EngineOptions,
    GenerateRequest,
};
use engine_port::{
    EmbedInput, EmbedJob, EmbedReply, ModelFacts, OnLoss, OutputConstraint, SeqEvent, SlotPermit,
};
use tokio::sync::mpsc;

use crate::port::{
    Engine, EngineDescriptor, EngineFactory, EngineJob, PortError, PromptInput,
    EVENT_CHANNEL_CAPACITY,
};
use crate::spec::{EngineConfig, PoolSpec};

/// Test builds only: the next compute kernel panics (`arm_kernel_panic`).
#[cfg(feature = "fault-injection")]
pub use engine_candle::fault;
pub use engine_candle::fresh_pages::FreshPages;
pub use engine_candle::model_facts::{inspect, FileFacts};
pub use engine_candle::{
    builtin_template, builtin_template_names, configure_process_threads, lower_current_thread,
    DeviceChoice, EngineSettings as Settings, KvType, WeightFormat, DEFAULT_KV_CACHE_MAX_BYTES,
    DEFAULT_PROMPT_CACHE_BYTES, DEFAULT_STEP_MS, DEFAULT_STEP_PROMPT_MS,
    DEFAULT_STEP_PROMPT_TOKENS, ENCODER_ARCHITECTURES, MAX_NICE,
};

/// A loaded candle model seen through the port.
pub struct CandlePortEngine {
    inner: CandleEngine,
    model_ref: String,
}

fn map_err(e: EngineError) -> PortError {
    match e {
        EngineError::Stopped => PortError::Dead(e.to_string()),
        EngineError::ContextOverflow { .. }
        | EngineError::InvalidParams(_)
        | EngineError::Constraint(_)
        | EngineError::ChatTemplate(_)
        | EngineError::BadPrompt(_)
        | EngineError::Tokenizer(_) => PortError::InvalidInput(e.to_string()),
        other => PortError::Load(other.to_string()),
    }
}

impl CandlePortEngine {
    pub fn new(inner: CandleEngine, model_ref: String) -> Self {
        Self { inner, model_ref }
    }

    pub fn engine(&self) -> &CandleEngine {
        &self.inner
    }
}

impl Engine for CandlePortEngine {
    fn descriptor(&self) -> EngineDescriptor {
        let info = self.inner.info();
        EngineDescriptor {
            engine: engine_candle::ENGINE_NAME.to_string(),
            engine_version: engine_candle::ENGINE_VERSION.to_string(),
            model_ref: self.model_ref.clone(),
            model_name: info.name.clone(),
            ctx_max: info.ctx,
            slots: info.slots,
            weights_bytes: info.weights_bytes,
            kv_cache_bytes: info.kv_cache_bytes as u64,
            layers: info.layers,
            layers_on_accelerator: if info.device.is_cpu() { 0 } else { info.layers },
            on_loss: OnLoss::Restart,
            facts: Some(ModelFacts {
                architecture: info.architecture.clone(),
                parameters: info.parameters,
                quantization: info.quantization.clone(),
                chat_template: info.chat_template.clone(),
            }),
            generates: true,
            embedding: Some(self.inner.embed_info()),
        }
    }

    fn tokenize(
        &self,
        prompt: &PromptInput,
        continuation: &str,
    ) -> Result<Option<Vec<u32>>, PortError> {
        // client text is never parsed for special tokens: only the chat template's markup
        // makes control tokens (a prompt cannot forge a turn)
        let mut ids = match prompt {
            PromptInput::Text(t) => {
                let mut text = t.clone();
                text.push_str(continuation);
                return self.inner.encode_text(&text).map(Some).map_err(map_err);
            }
            PromptInput::Chat(turns) => self.inner.encode_chat(turns).map_err(map_err)?,
            PromptInput::Tokens(parts) => self.inner.encode_parts(parts).map_err(map_err)?,
        };
        if !continuation.is_empty() {
            ids.extend(
                self.inner
                    .tokenizer()
                    .encode_plain(continuation)
                    .map_err(map_err)?,
            );
        }
        Ok(Some(ids))
    }

    fn detokenize(&self, ids: &[u32]) -> Result<Option<String>, PortError> {
        let tokenizer = self.inner.tokenizer();
        let vocab = tokenizer.vocab_size();
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(PortError::InvalidInput(format!(
                "token id {bad} is not in the vocabulary of {vocab} tokens"
            )));
        }
        Ok(Some(tokenizer.decode(ids)))
    }

    fn gives_logprobs(&self) -> bool {
        true
    }

    fn prepare_constraint(&self, constraint: &OutputConstraint) -> Result<(), PortError> {
        self.inner
            .constrain(constraint)
            .map(|_| ())
            .map_err(map_err)
    }

    fn start(&self, job: EngineJob) -> Result<mpsc::Receiver<SeqEvent>, PortError> {
        let prompt_tokens = match job.prompt_tokens {
            Some(t) => t,
            None => self
                .tokenize(&job.prompt, &job.continuation)?
                .unwrap_or_default(),
        };
        let constraint = match &job.constraint {
            None => None,
            Some(c) => {
                let mut held = self.inner.constrain(c).map_err(map_err)?;
                // text already produced (or given to continue) is the grammar's start
                if !job.continuation.is_empty() {
                    let ids = self
                        .inner
                        .tokenizer()
                        .encode_plain(&job.continuation)
                        .map_err(map_err)?;
                    held.consume_all(&ids).map_err(|why| {
                        PortError::InvalidInput(format!(
                            "{}: the text to continue does not fit it ({why})",
                            c.field()
                        ))
                    })?;
                }
                Some(held)
            }
        };
        let (tx, rx) = mpsc::channel(EVENT_CHANNEL_CAPACITY);
        self.inner
            .submit(GenerateRequest {
                permit: job.permit,
                prompt_tokens,
                sampling: job.sampling,
                max_tokens: job.max_tokens,
                stop: job.stop,
                constraint,
                logprobs: job.logprobs,
                cancel: job.cancel,
                events: tx,
                failure: job.failure,
            })
            .map_err(map_err)?;
        Ok(rx)
    }

    /// llama-server's `--embedding` on a decoder: a text as a raw prompt (BOS where the model
    /// wants one), token ids as given; pairs are a reranker's.
    fn embed_tokens(
        &self,
        input: &EmbedInput,
        truncate: bool,
    ) -> Result<Option<Vec<u32>>, PortError> {
        match input {
            EmbedInput::Text(t) => self
                .inner
                .encode_for_embedding(t, truncate)
                .map(Some)
                .map_err(map_err),
            EmbedInput::Tokens(ids) => {
                let max = self.inner.info().ctx;
                if ids.len() > max && !truncate {
                    return Err(PortError::InvalidInput(format!(
                        "{} tokens, over the {max} the model takes",
                        ids.len()
                    )));
                }
                Ok(Some(ids[..ids.len().min(max)].to_vec()))
            }
            EmbedInput::Pair { .. } => Err(PortError::InvalidInput(format!(
                "{} has no classification head: it embeds, it does not rank",
                self.inner.info().name
            ))),
        }
    }

    fn embed(&self, mut job: EmbedJob) -> Result<EmbedReply, PortError> {
        let inputs = job_tokens(job.tokens.take(), &job.inputs, |i| {
            self.embed_tokens(i, false)
        })?;
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.inner
            .embed(EmbedRequest {
                permit: job.permit,
                inputs,
                pooling: job.pooling.unwrap_or(self.inner.embed_info().pooling),
                normalize: job.normalize,
                cancel: job.cancel,
                reply,
            })
            .map_err(map_err)?;
        Ok(answer)
    }

    fn is_alive(&self) -> bool {
        self.inner.is_alive()
    }

    fn try_acquire(&self) -> Option<SlotPermit> {
        self.inner.try_acquire()
    }

    fn slots_in_use(&self) -> usize {
        self.inner.slots().in_use()
    }

    fn prompt_tokens_reused(&self) -> u64 {
        self.inner.reused_prompt_tokens()
    }

    fn prompt_tokens_taken(&self) -> u64 {
        self.inner.prompt_tokens_taken()
    }

    fn prompt_cache_bytes(&self) -> u64 {
        self.inner.prompt_cache_bytes() as u64
    }

    fn cached_prefixes(&self) -> Option<Arc<engine_port::CachedPrefixes>> {
        Some(self.inner.cached_prefixes())
    }
}

/// A loaded encoder (BERT) seen through the port: it embeds and ranks, it does not generate.
pub struct EncoderPortEngine {
    inner: EncoderEngine,
    model_ref: String,
}

impl EncoderPortEngine {
    pub fn engine(&self) -> &EncoderEngine {
        &self.inner
    }
}

impl Engine for EncoderPortEngine {
    fn descriptor(&self) -> EngineDescriptor {
        let info = self.inner.info();
        EngineDescriptor {
            engine: engine_candle::ENGINE_NAME.to_string(),
            engine_version: engine_candle::ENGINE_VERSION.to_string(),
            model_ref: self.model_ref.clone(),
            model_name: info.name.clone(),
            ctx_max: info.embed.max_tokens,
            slots: info.slots,
            weights_bytes: info.weights_bytes,
            kv_cache_bytes: 0,
            layers: info.layers,
            layers_on_accelerator: if info.device.is_cpu() { 0 } else { info.layers },
            on_loss: OnLoss::Restart,
            facts: Some(ModelFacts {
                architecture: info.architecture.clone(),
                parameters: info.parameters,
                quantization: info.quantization.clone(),
                chat_template: None,
            }),
            generates: false,
            embedding: Some(info.embed),
        }
    }

    /// An encoder does not generate: a generation prompt is refused where it is counted.
    fn tokenize(&self, _: &PromptInput, _: &str) -> Result<Option<Vec<u32>>, PortError> {
        Err(not_generating(&self.inner))
    }

    fn detokenize(&self, ids: &[u32]) -> Result<Option<String>, PortError> {
        let tokenizer = self.inner.tokenizer();
        let vocab = tokenizer.vocab_size();
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(PortError::InvalidInput(format!(
                "token id {bad} is not in the vocabulary of {vocab} tokens"
            )));
        }
        Ok(Some(tokenizer.decode(ids)))
    }

    fn start(&self, job: EngineJob) -> Result<mpsc::Receiver<SeqEvent>, PortError> {
        drop(job);
        Err(not_generating(&self.inner))
    }

    fn embed_tokens(
        &self,
        input: &EmbedInput,
        truncate: bool,
    ) -> Result<Option<Vec<u32>>, PortError> {
        let ids = match input {
            EmbedInput::Text(t) => self.inner.encode_text(t, truncate),
            EmbedInput::Pair { query, document } => {
                self.inner.encode_pair(query, document, truncate)
            }
            EmbedInput::Tokens(ids) => {
                let max = self.inner.info().embed.max_tokens;
                if ids.len() > max && !truncate {
                    return Err(PortError::InvalidInput(format!(
                        "{} tokens, over the {max} the model takes",
                        ids.len()
                    )));
                }
                Ok(ids[..ids.len().min(max)].to_vec())
            }
        };
        ids.map(Some).map_err(map_err)
    }

    fn embed(&self, mut job: EmbedJob) -> Result<EmbedReply, PortError> {
        let inputs = job_tokens(job.tokens.take(), &job.inputs, |i| {
            self.embed_tokens(i, false)
        })?;
        let pooling = job.pooling.unwrap_or(self.inner.info().embed.pooling);
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.inner
            .submit(EmbedRequest {
                permit: job.permit,
                inputs,
                pooling,
                normalize: job.normalize,
                cancel: job.cancel,
                reply,
            })
            .map_err(map_err)?;
        Ok(answer)
    }

    fn is_alive(&self) -> bool {
        self.inner.is_alive()
    }

    fn try_acquire(&self) -> Option<SlotPermit> {
        self.inner.try_acquire()
    }

    fn slots_in_use(&self) -> usize {
        self.inner.slots().in_use()
    }

    fn embed_passes(&self) -> Option<(u64, u64)> {
        Some(self.inner.batches())
    }
}

fn not_generating(e: &EncoderEngine) -> PortError {
    PortError::InvalidInput(format!(
        "{} is an embedding model: it embeds and ranks, it does not generate text",
        e.info().name
    ))
}

/// Whether a chat template (Jinja) compiles and renders a conversation.
pub fn check_template(template: &str) -> Result<(), String> {
    engine_candle::ChatTemplate::check(template)
}

/// Loads GGUF models with candle.
#[derive(Debug, Default, Clone, Copy)]
pub struct CandleFactory;

/// The engine options of a load of `model_ref` for `spec`.
fn options(spec: &PoolSpec, model_ref: &str, settings: &Settings) -> EngineOptions {
    let mut opts = EngineOptions::new(model_ref);
    opts.slots = spec.slots;
    opts.ctx = spec.ctx;
    opts.settings = settings.clone();
    opts
}

impl EngineFactory for CandleFactory {
    fn served_context(&self, spec: &PoolSpec, model_ref: &str) -> Option<usize> {
        let EngineConfig::Local(settings) = &spec.engine else {
            return None;
        };
        engine_candle::served_context(&options(spec, model_ref, settings)).ok()
    }

    fn load(&self, spec: &PoolSpec, model_ref: &str) -> Result<Arc<dyn Engine>, PortError> {
        let EngineConfig::Local(settings) = &spec.engine else {
            return Err(PortError::Load(format!(
                "pool {} is served by a remote worker; load models on the worker",
                spec.id
            )));
        };
        // the file as it is: loading it again gives the same answer
        let load_error = |e: EngineError| match e {
            EngineError::Unsupported(_)
            | EngineError::BadModel(_)
            | EngineError::ModelFile { .. } => PortError::Unloadable(e.to_string()),
            other => PortError::Load(other.to_string()),
        };
        if engine_candle::is_encoder(std::path::Path::new(model_ref)).map_err(load_error)? {
            let engine = EncoderEngine::load(EncoderOptions {
                model_path: model_ref.into(),
                slots: spec.slots,
                settings: settings.clone(),
            })
            .map_err(load_error)?;
            return Ok(Arc::new(EncoderPortEngine {
                inner: engine,
                model_ref: model_ref.to_string(),
            }));
        }
        let engine = CandleEngine::load(options(spec, model_ref, settings)).map_err(load_error)?;
        let info = engine.info();
        if spec.ctx == 0 && info.ctx < info.ctx_train {
            // FC-CTX-1: said at start, not found out from a refused prompt
            tracing::warn!(
                pool = %spec.id,
                slots = spec.slots,
                ctx = info.ctx,
                ctx_train = info.ctx_train,
                kv_cache_mib = settings.kv_cache_max_bytes >> 20,
                "{} slots of {} tokens each: the key/value cache budget ({} MiB) does not hold the model's trained context of {} for every slot; set ctx, fewer slots or a larger kv_cache_mib",
                spec.slots,
                info.ctx,
                settings.kv_cache_max_bytes >> 20,
                info.ctx_train
            );
        }
        Ok(Arc::new(CandlePortEngine::new(
            engine,
            model_ref.to_string(),
        )))
    }
}

/// A job's inputs as token ids: those admission counted, else each input tokenized by `count`.
fn job_tokens(
    tokens: Option<Vec<Vec<u32>>>,
    inputs: &[EmbedInput],
    count: impl Fn(&EmbedInput) -> Result<Option<Vec<u32>>, PortError>,
) -> Result<Vec<Vec<u32>>, PortError> {
    match tokens {
        Some(t) => Ok(t),
        None => inputs
            .iter()
            .map(|i| count(i).map(Option::unwrap_or_default))
            .collect(),
    }
}
