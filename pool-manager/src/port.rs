//! The Engine port as pools use it: the port's language (`engine-port`) and the factory that
//! loads a local pool's engine.

use std::sync::Arc;

pub use engine_port::{
    prefix_chain, text_prefix_chain, CachedPrefixes, ChatTurn, EmbedInfo, EmbedInput, EmbedJob,
    EmbedReply, Embeddings, Engine, EngineDescriptor, EngineJob, FailureNote, Finish, FinishReason,
    ModelFacts, OnLoss, OutputConstraint, Pooling, PortError, PromptInput, PromptPart,
    SamplingParams, SeqEvent, SlotPermit, Slots, StepLogprobs, StopCause, TokenLogprob,
    EVENT_CHANNEL_CAPACITY, MAX_DRAFT_TOKENS, MAX_PUBLISHED_BLOCKS, MAX_TOP_LOGPROBS,
    PREFIX_BLOCK_TOKENS,
};

use crate::spec::PoolSpec;

/// Loads engines for local pools (candle in production, scripted engines in tests).
pub trait EngineFactory: Send + Sync + 'static {
    /// Loads `model_ref` for `spec`. Runs on a blocking thread.
    fn load(&self, spec: &PoolSpec, model_ref: &str) -> Result<Arc<dyn Engine>, PortError>;

    /// The context per sequence a load of `model_ref` for `spec` would serve, when it can be
    /// told without loading (a file's header). Blocking: file reads.
    fn served_context(&self, _spec: &PoolSpec, _model_ref: &str) -> Option<usize> {
        None
    }
}
