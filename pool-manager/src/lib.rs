//! pool-manager: pools of engine slots. A pool is one loaded model with N slots; this crate owns
//! the pool lifecycle (load, self-test, drain, reload with rollback), slot leases, health, the
//! one place pools are built ([`PoolRegistry::add`] from a [`PoolSpec`]), and the [`Engine`]
//! port as pools use it (its language is `engine-port`'s; candle is adapted in [`candle`],
//! remote workers and the tests' scripted engines implement it on their side).

pub mod candle;
mod pool;
mod port;
mod registry;
mod spec;
mod state;

pub use pool::{
    LoadFailure, Pool, PoolError, PoolSnapshot, ServiceSample, SlotLease, CIRCUIT_OPEN_AFTER,
};
pub use port::{
    prefix_chain, text_prefix_chain, CachedPrefixes, ChatTurn, EmbedInfo, EmbedInput, EmbedJob,
    EmbedReply, Embeddings, Engine, EngineDescriptor, EngineFactory, EngineJob, FailureNote,
    Finish, FinishReason, ModelFacts, OnLoss, OutputConstraint, Pooling, PortError, PromptInput,
    PromptPart, SamplingParams, SeqEvent, SlotPermit, Slots, StepLogprobs, StopCause, TokenLogprob,
    EVENT_CHANNEL_CAPACITY, MAX_DRAFT_TOKENS, MAX_PUBLISHED_BLOCKS, MAX_TOP_LOGPROBS,
    PREFIX_BLOCK_TOKENS,
};
pub use registry::{AddError, PoolRegistry};
pub use spec::{EngineConfig, PoolSpec};
pub use state::{PoolEvent, PoolState, TransitionError};
