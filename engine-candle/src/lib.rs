//! engine-candle: GGUF inference of llama-family models on candle, with continuous batching.
//!
//! Pure library: no HTTP, no queues. It speaks the Engine port's language (`engine-port`) for
//! what crosses per sequence and per token: slots, sampling, chat turns, events. Load a model with [`CandleEngine::load`], then
//! [`CandleEngine::submit`] sequences; each streams [`SeqEvent`]s through its own bounded channel.

mod act_quant;
mod attention;
mod bert;
mod builtin_templates;
mod chat_template;
mod compute_priority;
mod constrained;
mod contention;
mod cpu_parallel;
mod cpu_quant;
mod cpu_tensor;
mod dense_cpu;
mod embed_job;
mod embed_rows;
mod encoder_attention;
mod encoder_engine;
mod engine;
mod error;
pub mod fresh_pages;
mod geglu;
mod held_prefixes;
mod hparams;
#[cfg(test)]
mod kquant_parity;
mod kquant_rows;
mod kv_type;
mod layer_norm;
mod model;
pub mod model_facts;
mod ngram_draft;
mod pass_cost;
mod pooling;
mod prompt_cache;
mod q4_1_cpu;
mod q4_k_cpu;
mod q5_0_cpu;
mod q5_k_cpu;
mod q6_k_cpu;
mod q8_0_cpu;
mod result_rows;
mod rms_norm;
mod rotary;
mod sampling;
mod scaled_tiles;
mod scheduler;
mod spm_vocab;
mod step_budget;
mod swiglu;
mod text_stream;
mod tokenizer;
mod weights;

pub use bert::{BertHparams, EncoderKind, ENCODER_ARCHITECTURES};
pub use builtin_templates::{builtin as builtin_template, builtin_names as builtin_template_names};
pub use chat_template::{ChatTemplate, Piece, TemplateSource, CHATML_FALLBACK, GEMMA_FALLBACK};
pub use compute_priority::{lower_current_thread, MAX_NICE};
pub use constrained::{Constrained, ConstraintFailure};
pub use cpu_parallel::fault;
pub use encoder_engine::{
    is_encoder, EmbedRequest, EncoderEngine, EncoderInfo, EncoderOptions, PASS_TOKENS,
};
pub use engine::{
    configure_process_threads, served_context, CandleEngine, DeviceChoice, EngineOptions,
    EngineSettings, ModelInfo, DEFAULT_KV_CACHE_MAX_BYTES, DEFAULT_PROMPT_CACHE_BYTES,
    DEFAULT_STEP_MS, DEFAULT_STEP_PROMPT_MS, DEFAULT_STEP_PROMPT_TOKENS, ENGINE_NAME,
    ENGINE_VERSION,
};
pub use error::{EngineError, Result};
pub use hparams::{Activation, Hparams, RopeStyle, SlidingWindow};
pub use kv_type::KvType;
pub use ngram_draft::MAX_DRAFT_TOKENS;
pub use sampling::{argmax, Sampler, REPEAT_WINDOW};
pub use scheduler::GenerateRequest;
pub use text_stream::{Pushed, TextStream};
pub use tokenizer::GgufTokenizer;
pub use weights::WeightFormat;
