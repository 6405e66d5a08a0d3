//! What can go wrong for `orchctl`, and the exit code each gives (documented in the README and
//! in `orchctl --help`): scripts branch on these.

/// Exit codes.
pub mod exit {
    /// Done.
    pub const OK: i32 = 0;
    /// Anything not below: a server error (5xx), an answer we could not read, a local file.
    pub const FAILED: i32 = 1;
    /// The server refused: a 4xx answer (bad request, unknown pool, conflict, busy, no key).
    pub const REFUSED: i32 = 2;
    /// A deadline passed before the operation completed.
    pub const DEADLINE: i32 = 3;
    /// The server could not be reached.
    pub const UNREACHABLE: i32 = 4;
    /// The command line was wrong (clap's own usage errors).
    pub const USAGE: i32 = 64;
}

/// One failure of a command.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// A 4xx answer: status, the server's stable `code` and its message.
    #[error("refused ({status} {code}): {message}")]
    Refused {
        status: u16,
        code: String,
        message: String,
    },
    /// A 5xx answer.
    #[error("server error ({status} {code}): {message}")]
    Server {
        status: u16,
        code: String,
        message: String,
    },
    #[error("deadline passed: {0}")]
    Deadline(String),
    /// Nothing to do: what the command acts on is already past it (a cancel of a task that
    /// had ended).
    #[error("{0}")]
    NothingToDo(String),
    #[error("cannot reach {url}: {reason}")]
    Unreachable { url: String, reason: String },
    /// An answer that is not what the API documents, or a task that ended in error.
    #[error("{0}")]
    Failed(String),
}

impl CtlError {
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Refused { .. } | Self::NothingToDo(_) => exit::REFUSED,
            Self::Server { .. } | Self::Failed(_) => exit::FAILED,
            Self::Deadline(_) => exit::DEADLINE,
            Self::Unreachable { .. } => exit::UNREACHABLE,
        }
    }

    /// The `--json` form of the error, printed to stderr.
    pub fn to_json(&self) -> serde_json::Value {
        let (kind, status, code) = match self {
            Self::Refused { status, code, .. } => ("refused", Some(*status), Some(code.as_str())),
            Self::Server { status, code, .. } => {
                ("server_error", Some(*status), Some(code.as_str()))
            }
            Self::Deadline(_) => ("deadline", None, None),
            Self::NothingToDo(_) => ("nothing_to_do", None, None),
            Self::Unreachable { .. } => ("unreachable", None, None),
            Self::Failed(_) => ("failed", None, None),
        };
        serde_json::json!({
            "error": kind, "status": status, "code": code,
            "message": self.to_string(), "exit_code": self.exit_code(),
        })
    }
}
