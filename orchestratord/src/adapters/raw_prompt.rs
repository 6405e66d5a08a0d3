//! A raw prompt as the completion APIs give it (OpenAI's `/v1/completions`, llama-server's
//! `/completion`): text, or token ids with text pieces among them. Either becomes the task's
//! `prompt` or `prompt_tokens`.

use contracts::{PromptPart, TaskRequest};

/// One raw prompt of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawPrompt {
    Text(String),
    /// Token ids, text pieces among them.
    Parts(Vec<PromptPart>),
}

impl RawPrompt {
    /// A prompt of token ids alone.
    pub fn ids(ids: &[u32]) -> Self {
        Self::Parts(ids.iter().copied().map(PromptPart::Token).collect())
    }

    /// `task` with this prompt.
    pub fn into_task(self, task: TaskRequest) -> TaskRequest {
        match self {
            Self::Text(t) => TaskRequest {
                prompt: Some(t),
                ..task
            },
            Self::Parts(p) => TaskRequest {
                prompt_tokens: Some(p),
                ..task
            },
        }
    }
}
