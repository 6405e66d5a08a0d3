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
    /// Of `prompt_tokens`, those whose keys and values came from a cache (a prefix held in
    /// its row or the prompt cache, or copied from a sequence sharing it): not computed.
    pub cached_tokens: usize,
    /// Tokens emitted as `Token` events.
    pub tokens_out: usize,
    /// Time from submission until the sequence was prefilled (waiting for a row included).
    pub prefill_ms: u64,
    /// Time from the first generated token to the end.
    pub decode_ms: u64,
    /// The stop sequence that ended it (`reason` is `Stop`), when one did rather than the
    /// end-of-sequence token.
    pub stop_sequence: Option<String>,
    /// Tokens guessed ahead by speculation (prompt lookup), and how many of them were kept:
    /// each kept one is a token out without a pass of its own.
    pub guessed_tokens: usize,
    pub guesses_kept: usize,
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
        /// With the job's `logprobs`: the step's log-probabilities.
        logprobs: Option<Box<StepLogprobs>>,
    },
    Done(Finish),
    Failed(String),
}

/// The most alternatives a step reports (OpenAI's limit for `top_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A token and its log-probability.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token's id; None from an engine that takes and gives text (a remote worker's
    /// backend names its tokens by their text).
    pub id: Option<u32>,
    /// The token's bytes (a control token's name).
    pub bytes: Vec<u8>,
    pub logprob: f32,
}

/// A step's log-probabilities, from the distribution the sampler drew from: the model's logits
/// after the repetition, presence and frequency penalties and any output constraint, before
/// temperature and top-k/top-p/min-p (which change how a token is drawn, not the model's
/// belief; greedy decoding has them too).
#[derive(Debug, Clone, PartialEq)]
pub struct StepLogprobs {
    pub chosen: TokenLogprob,
    /// The likeliest tokens, most likely first (as many as the job asked, at most
    /// [`MAX_TOP_LOGPROBS`]).
    pub top: Vec<TokenLogprob>,
}
