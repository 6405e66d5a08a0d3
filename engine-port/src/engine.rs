//! The Engine trait, what an engine says of itself, and the port's failures.

use tokio::sync::{mpsc, oneshot};

use crate::embed::{EmbedInfo, EmbedInput, EmbedJob, Embeddings};
use crate::error::PortError;
use crate::events::SeqEvent;
use crate::job::{EngineJob, OutputConstraint, PromptInput};
use crate::slots::SlotPermit;

/// Events buffered per running sequence between the engine and its consumer.
pub const EVENT_CHANNEL_CAPACITY: usize = 64;

/// What happens to a pool's tasks and engine when the engine is lost (its thread stopped, its
/// worker went away).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLoss {
    /// The engine is this process's: the pool loads it again (with backoff); its running tasks
    /// end with a retriable error.
    Restart,
    /// The engine is a remote worker's: nothing here can bring it back; its running tasks
    /// continue elsewhere (requeued after what they already streamed) and the pool goes with
    /// the worker.
    ContinueElsewhere,
}

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
    /// How its loss is handled.
    pub on_loss: OnLoss,
    /// What the engine read of the model itself; `None` when it sees no weights (a remote
    /// worker's backend).
    pub facts: Option<ModelFacts>,
    /// Whether it generates text (an encoder only embeds).
    pub generates: bool,
    /// What it says of embeddings, when it embeds.
    pub embedding: Option<EmbedInfo>,
}

/// The answer to an embedding job: every input's vectors, or why not.
pub type EmbedReply = oneshot::Receiver<Result<Embeddings, PortError>>;

/// What a model file says of itself (Ollama's `/api/show` and `/api/tags` details).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFacts {
    /// The architecture (`llama`, `gemma3`, …).
    pub architecture: String,
    /// Parameters: the elements of every weight tensor.
    pub parameters: u64,
    /// The weights' quantization (`Q4_1`, `Q4_K_M`, `F16`, …).
    pub quantization: String,
    /// The chat template the model carries (Jinja), when it carries one.
    pub chat_template: Option<String>,
}

/// An engine a pool runs tasks on.
pub trait Engine: Send + Sync + 'static {
    fn descriptor(&self) -> EngineDescriptor;
    /// Token ids of a prompt (the chat template applied to chat turns) followed by
    /// `continuation`, or `None` when the engine takes text and counts tokens itself (a remote
    /// worker forwards an OpenAI-shaped body to its backend; its `Done` says the count).
    fn tokenize(
        &self,
        prompt: &PromptInput,
        continuation: &str,
    ) -> Result<Option<Vec<u32>>, PortError>;
    /// The text of token ids, control tokens left out; `None` when the engine takes text and
    /// has no ids (a remote worker); an id outside the vocabulary is `InvalidInput`.
    fn detokenize(&self, ids: &[u32]) -> Result<Option<String>, PortError> {
        let _ = ids;
        Ok(None)
    }
    /// Checks that the engine can hold a sequence to `constraint` and readies it (compiling a
    /// grammar can take milliseconds: call it off the async runtime). `InvalidInput` when the
    /// constraint cannot be compiled (a bad schema or grammar), or the engine has no
    /// constrained decoding.
    fn prepare_constraint(&self, constraint: &OutputConstraint) -> Result<(), PortError> {
        Err(PortError::InvalidInput(format!(
            "{}: this pool's engine has no constrained decoding",
            constraint.field()
        )))
    }
    /// Whether its `Token` events carry log-probabilities when a job asks (an engine that takes
    /// text — a remote worker — has no logits to give).
    fn gives_logprobs(&self) -> bool {
        false
    }
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
    /// Token ids of an embedding input as the model reads it (an encoder's `[CLS] … [SEP]`),
    /// cut to fit when `truncate`, else an input over the model's length is `InvalidInput`
    /// saying its count; `None` when the engine takes text and counts on its side.
    fn embed_tokens(
        &self,
        input: &EmbedInput,
        truncate: bool,
    ) -> Result<Option<Vec<u32>>, PortError> {
        let _ = (input, truncate);
        Err(PortError::InvalidInput(
            "this pool's model does not embed".into(),
        ))
    }
    /// Embeds a job's inputs in its slot: the answer comes on the returned channel (which
    /// closes without one if the engine dies). The engine batches the inputs of the jobs it
    /// holds together.
    fn embed(&self, job: EmbedJob) -> Result<EmbedReply, PortError> {
        drop(job);
        Err(PortError::InvalidInput(
            "this pool's model does not embed".into(),
        ))
    }
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
    /// Prompt tokens of every sequence it started (of which `prompt_tokens_reused` came from
    /// a cached prefix): their ratio is its hit rate.
    fn prompt_tokens_taken(&self) -> u64 {
        0
    }
    /// Inputs embedded so far and the passes they took, when the engine embeds in passes of
    /// its own (their ratio is its mean batch).
    fn embed_passes(&self) -> Option<(u64, u64)> {
        None
    }
    /// Bytes its host-memory prompt cache holds (an engine without one holds none).
    fn prompt_cache_bytes(&self) -> u64 {
        0
    }
    /// The prefixes its rows and prompt cache hold now, as block hashes (`None`: the engine
    /// does not say, e.g. a backend that keeps its cache to itself). Placement prefers the
    /// pool holding the longest prefix of a task's prompt.
    fn cached_prefixes(&self) -> Option<std::sync::Arc<crate::CachedPrefixes>> {
        None
    }
}
