//! The Engine port: what a pool needs from whatever runs its model.

use std::sync::{Arc, OnceLock};

use contracts::worker::CancelReason;
use engine_candle::{ChatMessage, SamplingParams, SeqEvent, SlotPermit};
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

/// Why a sequence was stopped early, set once by whoever ends the task before `cancel` fires
/// (a remote engine tells its worker; a local engine needs only the token).
#[derive(Debug, Clone, Default)]
pub struct StopCause(Arc<OnceLock<CancelReason>>);

impl StopCause {
    /// Records the cause; the first one set wins.
    pub fn set(&self, reason: CancelReason) {
        let _ = self.0.set(reason);
    }

    /// The cause, or `client_disconnect` when nobody said (a client cancel is the common one).
    pub fn get(&self) -> CancelReason {
        self.0
            .get()
            .cloned()
            .unwrap_or(CancelReason::ClientDisconnect)
    }
}

/// What an engine says about a `Failed` event it sent, set before sending it: a remote
/// backend that refused the input (a 4xx: the client's mistake) notes `InvalidInput`; no note
/// means the engine failed.
#[derive(Debug, Clone, Default)]
pub struct FailureNote(Arc<OnceLock<PortError>>);

impl FailureNote {
    pub fn set(&self, e: PortError) {
        let _ = self.0.set(e);
    }

    pub fn get(&self) -> Option<PortError> {
        self.0.get().cloned()
    }
}

/// One sequence to run.
pub struct EngineJob {
    /// The slot it runs in, from [`Engine::try_acquire`] of the same engine. The engine gives
    /// it back when it has let go of the sequence (after the last event), never before.
    pub permit: SlotPermit,
    pub prompt: PromptInput,
    /// Text the sequence already produced in an earlier run (a requeued task that had streamed
    /// tokens) or that the client asked to continue: generation goes on after it.
    pub continuation: String,
    /// `Engine::tokenize` of `prompt` + `continuation`, for engines that take token ids.
    pub prompt_tokens: Option<Vec<u32>>,
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    pub cancel: CancellationToken,
    pub stop_cause: StopCause,
    /// The request's correlation id (empty when none), passed on to remote backends.
    pub correlation_id: String,
    /// How to read a `Failed` event of this job.
    pub failure: FailureNote,
}

impl EngineJob {
    /// A job in `permit`'s slot that starts from `prompt` with nothing produced yet.
    pub fn new(
        permit: SlotPermit,
        prompt: PromptInput,
        sampling: SamplingParams,
        max_tokens: usize,
    ) -> Self {
        Self {
            permit,
            prompt,
            continuation: String::new(),
            prompt_tokens: None,
            sampling,
            max_tokens,
            stop: Vec::new(),
            cancel: CancellationToken::new(),
            stop_cause: StopCause::default(),
            correlation_id: String::new(),
            failure: FailureNote::default(),
        }
    }
}

/// Failures at the engine port.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    /// The input cannot be run by this engine (bad template, bad params, context overflow).
    #[error("{0}")]
    InvalidInput(String),
    /// The engine's worker is gone.
    #[error("engine stopped: {0}")]
    Dead(String),
    /// Loading or self-testing a model failed.
    #[error("load failed: {0}")]
    Load(String),
    /// The model cannot load as its file is (an architecture or tensor type the engine does
    /// not have, a malformed file): trying again changes nothing until the file does.
    #[error("cannot load: {0}")]
    Unloadable(String),
}

/// An engine a pool runs tasks on.
pub trait Engine: Send + Sync + 'static {
    fn descriptor(&self) -> EngineDescriptor;
    /// Token ids of a prompt (the chat template applied to chat turns) followed by
    /// `continuation`, or `None` when the engine takes text and counts tokens itself (a remote
    /// worker forwards an OpenAI-shaped body to its backend).
    fn tokenize(
        &self,
        prompt: &PromptInput,
        continuation: &str,
    ) -> Result<Option<Vec<u32>>, PortError>;
    /// Starts a sequence; events arrive on the returned bounded channel, ending with exactly
    /// one `Done` or `Failed` unless the engine dies (the channel then closes early).
    fn start(&self, job: EngineJob) -> Result<mpsc::Receiver<SeqEvent>, PortError>;
    fn is_alive(&self) -> bool;
    /// One of the engine's slots, or `None` when all are taken (or it takes no new work).
    /// The engine is the one owner of its capacity: a slot is free again exactly when the
    /// engine let go of the sequence that ran in it (a remote worker's slots span all its
    /// models).
    fn try_acquire(&self) -> Option<SlotPermit>;
    /// Slots taken now (permits not yet given back).
    fn slots_in_use(&self) -> usize;
    /// Sequences the engine runs now from every source, when it reports that (a worker's
    /// `current_load`, which counts other servers' requests too); placement prefers less.
    fn current_load(&self) -> Option<usize> {
        None
    }
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
