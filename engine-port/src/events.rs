//! What a running sequence reports: its tokens, then how it ended.

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// End-of-sequence token or a stop sequence.
    Stop,
    /// `max_tokens` reached (or the context filled up).
    Length,
    /// The cancellation token fired or the receiver went away.
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Cancelled => "cancelled",
        }
    }
}

/// Timings and counts of a finished sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    /// Tokens emitted as `Token` events.
    pub tokens_out: usize,
    /// Time from submission until the sequence was prefilled (waiting for a row included).
    pub prefill_ms: u64,
    /// Time from the first generated token to the end.
    pub decode_ms: u64,
    /// The stop sequence that ended it (`reason` is `Stop`), when one did rather than the
    /// end-of-sequence token.
    pub stop_sequence: Option<String>,
}

/// What a running sequence reports, in order: `Token`* then one `Done` or `Failed`.
#[derive(Debug, Clone, PartialEq)]
pub enum SeqEvent {
    /// One generated token and the text it completed (may be empty while a UTF-8 character or
    /// a possible stop sequence is incomplete). `id` is the token's id in the model's
    /// vocabulary when the engine has one to give (a remote worker streams text only).
    Token {
        text: String,
        index: usize,
        id: Option<u32>,
    },
    Done(Finish),
    Failed(String),
}
