//! One sequence to run: its prompt (text or chat turns), sampling, limits, the slot it runs in
//! and how whoever ends it early says why.

use std::sync::{Arc, OnceLock};

use contracts::worker::CancelReason;
pub use contracts::PromptPart;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::error::PortError;
use crate::sampling::SamplingParams;
use crate::slots::SlotPermit;

/// One chat turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatTurn {
    pub role: String,
    pub content: String,
}

/// A prompt as the client gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptInput {
    Text(String),
    Chat(Vec<ChatTurn>),
    /// Token ids of the model's vocabulary with text pieces among them (llama-server's mixed
    /// prompt): ids go in as given, a text piece first is tokenized as `Text` is, later ones
    /// as plain text. Only engines that take token ids run it.
    Tokens(Vec<PromptPart>),
}

impl PromptInput {
    /// Whether the prompt names token ids (an engine that takes text cannot run it).
    pub fn has_token_ids(&self) -> bool {
        matches!(self, Self::Tokens(parts) if parts.iter().any(|p| matches!(p, PromptPart::Token(_))))
    }
}

/// What a sequence's text must be (structured output): the engine masks every token that
/// would leave the language, so the text always parses (unless `max_tokens` cuts it short).
/// Any JSON object is the schema `{"type": "object"}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum OutputConstraint {
    /// JSON valid under this JSON Schema (its text).
    JsonSchema(String),
    /// A context-free grammar in llguidance's Lark syntax.
    Grammar(String),
}

impl OutputConstraint {
    /// The request field a client names it with (`json_schema` or `grammar`).
    pub fn field(&self) -> &'static str {
        match self {
            Self::JsonSchema(_) => "json_schema",
            Self::Grammar(_) => "grammar",
        }
    }
}

/// Why a sequence was stopped early, set once by whoever ends the task before `cancel` fires
/// (a remote engine tells its worker; a local engine needs only the token).
#[derive(Debug, Clone, Default)]
pub struct StopCause(Arc<OnceLock<CancelReason>>);

impl StopCause {
    /// Records the cause; the first one set wins.
    pub fn set(&self, reason: CancelReason) {
        let _ = self.0.set(reason);
    }

    /// The cause, or `client_disconnect` when nobody said (a client cancel is the common one).
    pub fn get(&self) -> CancelReason {
        self.0
            .get()
            .cloned()
            .unwrap_or(CancelReason::ClientDisconnect)
    }
}

/// What an engine says about a `Failed` event it sent, set before sending it: a remote
/// backend that refused the input (a 4xx: the client's mistake) notes `InvalidInput`; no note
/// means the engine failed.
#[derive(Debug, Clone, Default)]
pub struct FailureNote(Arc<OnceLock<PortError>>);

impl FailureNote {
    pub fn set(&self, e: PortError) {
        let _ = self.0.set(e);
    }

    pub fn get(&self) -> Option<PortError> {
        self.0.get().cloned()
    }
}

/// One sequence to run.
pub struct EngineJob {
    /// The slot it runs in, from [`crate::Engine::try_acquire`] of the same engine. The
    /// engine gives it back when it has let go of the sequence (after the last event), never
    /// before.
    pub permit: SlotPermit,
    pub prompt: PromptInput,
    /// Text the sequence already produced in an earlier run (a requeued task that had streamed
    /// tokens) or that the client asked to continue: generation goes on after it.
    pub continuation: String,
    /// `Engine::tokenize` of `prompt` + `continuation`, for engines that take token ids.
    pub prompt_tokens: Option<Vec<u32>>,
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    /// The language the text must be in, when constrained.
    pub constraint: Option<OutputConstraint>,
    /// `Some(n)`: every token's log-probability and the `n` likeliest alternatives
    /// (`n` ≤ [`crate::MAX_TOP_LOGPROBS`]); engines without logits report none.
    pub logprobs: Option<usize>,
    pub cancel: CancellationToken,
    pub stop_cause: StopCause,
    /// The request's correlation id (empty when none), passed on to remote backends.
    pub correlation_id: String,
    /// How to read a `Failed` event of this job.
    pub failure: FailureNote,
}

impl EngineJob {
    /// A job in `permit`'s slot that starts from `prompt` with nothing produced yet.
    pub fn new(
        permit: SlotPermit,
        prompt: PromptInput,
        sampling: SamplingParams,
        max_tokens: usize,
    ) -> Self {
        Self {
            permit,
            prompt,
            continuation: String::new(),
            prompt_tokens: None,
            sampling,
            max_tokens,
            stop: Vec::new(),
            constraint: None,
            logprobs: None,
            cancel: CancellationToken::new(),
            stop_cause: StopCause::default(),
            correlation_id: String::new(),
            failure: FailureNote::default(),
        }
    }
}
