//! The Engine port: what a pool needs from whatever runs its model.

use std::sync::Arc;

use engine_candle::{ChatMessage, SamplingParams, SeqEvent};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::pool::PoolSpec;

/// Events buffered per running sequence between the engine and its consumer.
pub const EVENT_CHANNEL_CAPACITY: usize = 64;

/// Identity and limits of a loaded engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineDescriptor {
    pub engine: String,
    pub engine_version: String,
    /// What was loaded (the model path for candle).
    pub model_ref: String,
    /// Name of the model (GGUF `general.name` or the file stem).
    pub model_name: String,
    pub ctx_max: usize,
    pub slots: usize,
    /// Size of the model weights as loaded (the file size for GGUF).
    pub weights_bytes: u64,
    /// Bytes reserved for the KV cache of all slots.
    pub kv_cache_bytes: u64,
    /// Transformer layers, and how many of them run on an accelerator.
    pub layers: usize,
    pub layers_on_accelerator: usize,
}

/// A prompt as the client gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptInput {
    Text(String),
    Chat(Vec<ChatMessage>),
}

/// One sequence to run.
pub struct EngineJob {
    pub prompt_tokens: Vec<u32>,
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    pub cancel: CancellationToken,
}

/// Failures at the engine port.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    /// The input cannot be run by this engine (bad template, bad params, context overflow).
    #[error("{0}")]
    InvalidInput(String),
    /// All slots busy (the lease accounting should prevent this).
    #[error("engine busy")]
    Busy,
    /// The engine's worker is gone.
    #[error("engine stopped: {0}")]
    Dead(String),
    /// Loading or self-testing a model failed.
    #[error("load failed: {0}")]
    Load(String),
}

/// An engine a pool runs tasks on.
pub trait Engine: Send + Sync + 'static {
    fn descriptor(&self) -> EngineDescriptor;
    /// Token ids of a prompt, with the chat template applied to chat turns.
    fn tokenize(&self, prompt: &PromptInput) -> Result<Vec<u32>, PortError>;
    /// Starts a sequence; events arrive on the returned bounded channel, ending with exactly
    /// one `Done` or `Failed` unless the engine dies (the channel then closes early).
    fn start(&self, job: EngineJob) -> Result<mpsc::Receiver<SeqEvent>, PortError>;
    fn is_alive(&self) -> bool;
    /// Prompt tokens whose keys and values came from a cached prefix instead of being computed
    /// (an engine without a prefix cache reuses none).
    fn prompt_tokens_reused(&self) -> u64 {
        0
    }
    /// Bytes its host-memory prompt cache holds (an engine without one holds none).
    fn prompt_cache_bytes(&self) -> u64 {
        0
    }
}

/// Loads engines for pools (candle in production, scripted engines in tests).
pub trait EngineFactory: Send + Sync + 'static {
    /// Loads `model_ref` for `spec`. Runs on a blocking thread.
    fn load(&self, spec: &PoolSpec, model_ref: &str) -> Result<Arc<dyn Engine>, PortError>;
}
