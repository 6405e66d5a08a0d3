//! engine-port: the language a pool and its engines speak. A pool hands an engine an
//! [`EngineJob`] (prompt as text or [`ChatTurn`]s, [`SamplingParams`], limits, the
//! [`SlotPermit`] it runs in) and reads [`SeqEvent`]s back; an engine says what it is and how
//! its loss is handled in its [`EngineDescriptor`]. The candle engine, remote workers and the
//! tests' scripted engine all implement [`Engine`]; nothing here knows any of them.

mod embed;
mod engine;
mod error;
mod events;
mod job;
mod prefix;
mod sampling;
mod slots;

pub use embed::{EmbedInfo, EmbedInput, EmbedJob, Embeddings, Pooling};
pub use engine::{
    EmbedReply, Engine, EngineDescriptor, ModelFacts, OnLoss, EVENT_CHANNEL_CAPACITY,
};
pub use error::PortError;
pub use events::{Finish, FinishReason, SeqEvent, StepLogprobs, TokenLogprob, MAX_TOP_LOGPROBS};
pub use job::{
    ChatTurn, EngineJob, FailureNote, OutputConstraint, PromptInput, PromptPart, StopCause,
};
pub use prefix::{
    prefix_chain, text_prefix_chain, CachedPrefixes, CHAIN_SEED, MAX_PUBLISHED_BLOCKS,
    PREFIX_BLOCK_TOKENS, TEXT_BLOCK_BYTES, TEXT_CHAIN_SEED,
};
pub use sampling::{SamplingParams, MAX_DRAFT_TOKENS};
pub use slots::{SlotPermit, Slots};
