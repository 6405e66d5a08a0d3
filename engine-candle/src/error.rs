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
    /// A prompt the client gave that the model cannot take (a token id outside its vocabulary).
    #[error("{0}")]
    BadPrompt(String),
    #[error("prompt of {prompt_tokens} tokens plus max_tokens {max_tokens} exceeds the context of {ctx} tokens")]
    ContextOverflow {
        prompt_tokens: usize,
        max_tokens: usize,
        ctx: usize,
    },
    #[error("invalid sampling parameters: {0}")]
    InvalidParams(String),
    /// A structured-output constraint that cannot be compiled (the field, then why).
    #[error("{0}")]
    Constraint(String),
    #[error("the engine's decode thread has stopped")]
    Stopped,
    #[error("device: {0}")]
    Device(String),
    #[error("compute: {0}")]
    Compute(String),
}

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// A candle error carries a backtrace when `RUST_BACKTRACE` is set (its `bt()`), and its text
/// shows it: kilobytes of frames and source paths in a reload's 409 and in pool health. The
/// engine keeps candle's message only (`message_of`).
impl From<candle_core::Error> for EngineError {
    fn from(e: candle_core::Error) -> Self {
        Self::Compute(message_of(&e))
    }
}

/// A candle error's text without the backtraces it may carry.
pub fn message_of(e: &candle_core::Error) -> String {
    use candle_core::Error as E;
    match e {
        E::WithBacktrace { inner, .. } => message_of(inner),
        E::Context { inner, context } => format!("{context}: {}", message_of(inner)),
        E::WithPath { inner, path } => format!("{}: {}", path.display(), message_of(inner)),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ENG-ERR-1: an engine error never carries a backtrace, whatever candle captured.
    #[test]
    fn candle_backtraces_are_left_out() {
        let bt = candle_core::Error::WithBacktrace {
            inner: Box::new(candle_core::Error::Msg("bad magic".into())),
            backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
        };
        let wrapped = bt.with_path("/m/x.gguf").context("loading");
        assert!(wrapped.to_string().lines().count() > 3, "candle shows it");
        let e = EngineError::from(wrapped);
        assert_eq!(e.to_string(), "compute: loading: /m/x.gguf: bad magic");
    }
}
