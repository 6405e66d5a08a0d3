//! Templating and tokenizing prompts off the async runtime. A prompt is tokenized once, at
//! admission, on tokio's blocking threads with at most `permits` at a time (a 1 MiB prompt
//! takes tens of milliseconds of CPU: on the runtime it would stall every stream); the ids go
//! with the task to the runner, which tokenizes again only when the engine that runs the task
//! has another model than the one that counted it.

use std::sync::Arc;

use pool_manager::{Engine, OutputConstraint, PortError, PromptInput};
use tokio::sync::Semaphore;

/// Prompt token ids and the model whose tokenizer made them.
#[derive(Debug, Clone)]
pub struct PromptIds {
    /// `EngineDescriptor::model_ref` of the engine that tokenized.
    pub model_ref: String,
    pub ids: Arc<Vec<u32>>,
}

/// The bounded set of blocking threads prompts are tokenized on.
pub struct Tokenizers {
    permits: Semaphore,
}

impl Tokenizers {
    /// At most `concurrency` prompts tokenized at once (0 = one per CPU).
    pub fn new(concurrency: usize) -> Self {
        let n = match concurrency {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        Self {
            permits: Semaphore::new(n),
        }
    }

    /// Readies `constraint` on `engine` (compiling a grammar), on the same bounded threads.
    pub async fn prepare_constraint(
        &self,
        engine: Arc<dyn Engine>,
        constraint: &OutputConstraint,
    ) -> Result<(), PortError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| PortError::Dead("the tokenizer pool is closed".into()))?;
        let c = constraint.clone();
        tokio::task::spawn_blocking(move || engine.prepare_constraint(&c))
            .await
            .map_err(|e| PortError::Dead(format!("grammar task failed: {e}")))?
    }

    /// Token ids of `prompt` + `continuation` by `engine` (`None` for engines that take text).
    pub async fn tokenize(
        &self,
        engine: Arc<dyn Engine>,
        prompt: &PromptInput,
        continuation: &str,
    ) -> Result<Option<PromptIds>, PortError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| PortError::Dead("the tokenizer pool is closed".into()))?;
        let (prompt, continuation) = (prompt.clone(), continuation.to_string());
        let model_ref = engine.descriptor().model_ref;
        let ids = tokio::task::spawn_blocking(move || engine.tokenize(&prompt, &continuation))
            .await
            .map_err(|e| PortError::Dead(format!("tokenizer task failed: {e}")))??;
        Ok(ids.map(|ids| PromptIds {
            model_ref,
            ids: Arc::new(ids),
        }))
    }
}
