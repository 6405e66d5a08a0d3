//! What can go wrong at the port.

/// Failures at the engine port.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    /// The input cannot be run by this engine (bad template, bad params, context overflow).
    #[error("{0}")]
    InvalidInput(String),
    /// The input was refused for one request field (a remote backend's 400 naming it): the
    /// task's field name.
    #[error("{field}: {message}")]
    Refused { field: String, message: String },
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
