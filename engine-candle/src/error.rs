//! The one error type of the engine boundary.

/// Everything that can go wrong inside the engine library.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cannot read model file {path}: {source}")]
    ModelFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid GGUF model: {0}")]
    BadModel(String),
    #[error("unsupported model: {0}")]
    Unsupported(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    ChatTemplate(String),
    #[error("prompt of {prompt_tokens} tokens plus max_tokens {max_tokens} exceeds the context of {ctx} tokens")]
    ContextOverflow {
        prompt_tokens: usize,
        max_tokens: usize,
        ctx: usize,
    },
    #[error("invalid sampling parameters: {0}")]
    InvalidParams(String),
    #[error("the engine's decode thread has stopped")]
    Stopped,
    #[error("device: {0}")]
    Device(String),
    #[error("compute: {0}")]
    Compute(#[from] candle_core::Error),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;
