//! pool-manager: pools of engine slots. A pool is one loaded model with N slots; this crate owns
//! the pool lifecycle (load, self-test, drain, reload with rollback), slot leases, health, and
//! the [`Engine`] port every engine implements (candle here; scripted engines in tests).

mod candle_engine;
mod lease;
mod pool;
mod port;
mod registry;
mod state;

pub use candle_engine::{CandleFactory, CandlePortEngine};
pub use lease::SlotLease;
pub use pool::{
    Pool, PoolError, PoolKind, PoolSnapshot, PoolSpec, ServiceSample, CIRCUIT_OPEN_AFTER,
};
pub use port::{
    Engine, EngineDescriptor, EngineFactory, EngineJob, FailureNote, PortError, PromptInput,
    StopCause, EVENT_CHANNEL_CAPACITY,
};
pub use registry::PoolRegistry;
pub use state::{PoolEvent, PoolState, TransitionError};

/// Types of the engine library that cross the port unchanged.
pub use engine_candle::{
    ChatMessage, DeviceChoice, Finish, FinishReason, KvType, SamplingParams, SeqEvent, SlotPermit,
    Slots, WeightFormat,
};
