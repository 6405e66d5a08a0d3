//! What can go wrong storing or reading records and artifacts, and its API error.

use contracts::ErrorCode;

use crate::error::ApiError;

#[derive(Debug, thiserror::Error)]
pub enum RecordsError {
    /// The client's artifact is malformed.
    #[error("{message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    /// A parent the artifact names is not stored (for this tenant).
    #[error("parent artifact {0:?} not found")]
    UnknownParent(String),
    #[error("artifact content is {bytes} bytes; the limit is {max}")]
    TooLarge { bytes: usize, max: usize },
    /// `records.enabled` is false.
    #[error("this server keeps no records (records.enabled = false)")]
    Disabled,
    /// The writer has stopped (the server is shutting down).
    #[error("the record store is closed")]
    Closed,
    #[error("record store: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("record store: stored JSON unreadable: {0}")]
    Corrupt(#[from] serde_json::Error),
    #[error("record store: {0}")]
    Io(#[from] std::io::Error),
    #[error("record store: {0}")]
    Schema(String),
    /// The database file was deleted or replaced under the running server: nothing written
    /// now would be kept.
    #[error("record store unavailable: {0}")]
    FileLost(String),
    /// The batch holding the write failed (its cause is logged).
    #[error("record store: write failed: {0}")]
    WriteFailed(String),
}

impl RecordsError {
    pub fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        Self::Invalid {
            field,
            message: message.into(),
        }
    }
}

impl From<RecordsError> for ApiError {
    fn from(e: RecordsError) -> Self {
        match e {
            RecordsError::Invalid { field, message } => ApiError::invalid(field, message),
            RecordsError::UnknownParent(_) => ApiError::invalid("parents", e.to_string()),
            RecordsError::TooLarge { .. } => {
                ApiError::new(ErrorCode::PayloadTooLarge, e.to_string(), false)
                    .with_field("content")
            }
            RecordsError::Disabled => ApiError::conflict(e.to_string()),
            RecordsError::FileLost(_) => {
                ApiError::new(ErrorCode::RecordsUnavailable, e.to_string(), false)
            }
            RecordsError::Closed => {
                ApiError::new(ErrorCode::ShuttingDown, e.to_string(), true).with_retry_after(1000)
            }
            RecordsError::Sqlite(_)
            | RecordsError::Corrupt(_)
            | RecordsError::Io(_)
            | RecordsError::Schema(_)
            | RecordsError::WriteFailed(_) => {
                tracing::error!(error = %e, "record store failed");
                ApiError::internal(e.to_string())
            }
        }
    }
}
