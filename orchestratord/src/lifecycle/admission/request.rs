//! Checking a request: its prompt, its limits and sampling, its structured-output constraint,
//! its ids. Nothing here reads the server's state beyond its configured limits.

use contracts::TaskRequest;
use pool_manager::{ChatTurn, OutputConstraint, PromptInput, SamplingParams, MAX_DRAFT_TOKENS};

use crate::error::ApiError;
use crate::lifecycle::state::SharedLifecycle;
use crate::lifecycle::task::{EmbedSpec, RunSpec};

const MAX_ID_LEN: usize = 128;

/// A client-chosen task or session id: 1-128 characters of `A-Z a-z 0-9 - _ . :`, and not
/// `.` or `..` (a path segment of its own: the stream URL in the 202 could not be used).
pub(crate) fn valid_id(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.len() <= MAX_ID_LEN
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
}

/// Lowest `top_p` and `repetition_penalty`: the API takes JSON numbers, the sampler `f32`, and
/// a tinier positive one would round to 0 (or overflow a logit it divides).
pub const SMALLEST_FACTOR: f32 = 1e-6;

fn check_range(
    field: &str,
    v: Option<f32>,
    lo: f32,
    hi: f32,
    lo_open: bool,
) -> Result<(), ApiError> {
    if let Some(x) = v {
        let ok = x.is_finite() && x <= hi && if lo_open { x > lo } else { x >= lo };
        if !ok {
            let lo_br = if lo_open { "(" } else { "[" };
            return Err(ApiError::invalid(
                field,
                format!("{field} must be within {lo_br}{lo}, {hi}]"),
            ));
        }
    }
    Ok(())
}

/// The prompt of a request, checked, and the text to continue (a final assistant turn under
/// `continue_final_message`).
pub fn prompt_of(req: &TaskRequest) -> Result<(PromptInput, String), ApiError> {
    let prompt = prompt_input(req)?;
    if req.continue_final_message != Some(true) {
        return Ok((prompt, String::new()));
    }
    // a final assistant turn is continued; without one, the assistant turn to continue is
    // empty, which is starting a new one; a lone assistant turn has no chat to template and is
    // continued as raw text (as a raw prompt always is)
    match prompt {
        PromptInput::Chat(mut turns) if turns.last().is_some_and(|t| t.role == "assistant") => {
            let last = turns.pop().map(|t| t.content).unwrap_or_default();
            if turns.is_empty() {
                if last.is_empty() {
                    return Err(ApiError::invalid("messages", "nothing to continue"));
                }
                return Ok((PromptInput::Text(last), String::new()));
            }
            Ok((PromptInput::Chat(turns), last))
        }
        other => Ok((other, String::new())),
    }
}

fn prompt_input(req: &TaskRequest) -> Result<PromptInput, ApiError> {
    match (&req.prompt, &req.prompt_tokens, &req.messages) {
        (Some(_), _, Some(_)) | (_, Some(_), Some(_)) => Err(ApiError::invalid(
            "messages",
            "give one of prompt, prompt_tokens or messages",
        )),
        (Some(_), Some(_), None) => Err(ApiError::invalid(
            "prompt_tokens",
            "give one of prompt, prompt_tokens or messages",
        )),
        (None, None, None) => Err(ApiError::invalid(
            "prompt",
            "prompt, prompt_tokens or messages is required",
        )),
        (Some(p), None, None) => {
            if p.is_empty() {
                return Err(ApiError::invalid("prompt", "prompt is empty"));
            }
            Ok(PromptInput::Text(p.clone()))
        }
        (None, Some(parts), None) => {
            if parts.is_empty() {
                return Err(ApiError::invalid("prompt_tokens", "prompt_tokens is empty"));
            }
            Ok(PromptInput::Tokens(parts.clone()))
        }
        (None, None, Some(m)) => {
            if m.is_empty() {
                return Err(ApiError::invalid("messages", "messages is empty"));
            }
            for (i, t) in m.iter().enumerate() {
                if !matches!(t.role.as_str(), "system" | "user" | "assistant") {
                    return Err(ApiError::invalid(
                        format!("messages[{i}].role"),
                        format!("role {:?} is not system, user or assistant", t.role),
                    ));
                }
            }
            Ok(PromptInput::Chat(
                m.iter()
                    .map(|t| ChatTurn {
                        role: t.role.clone(),
                        content: t.content.clone(),
                    })
                    .collect(),
            ))
        }
    }
}

/// The request as recorded: prompt text and message contents replaced by their length.
pub fn redact(req: &TaskRequest) -> serde_json::Value {
    let mut r = req.clone();
    if let Some(p) = &r.prompt {
        r.prompt = Some(format!("[redacted {} chars]", p.chars().count()));
    }
    if let Some(parts) = &r.prompt_tokens {
        let label = format!("[redacted {} parts]", parts.len());
        r.prompt_tokens = Some(vec![contracts::PromptPart::Text(label)]);
    }
    if let Some(m) = &mut r.messages {
        for t in m.iter_mut() {
            t.content = format!("[redacted {} chars]", t.content.chars().count());
        }
    }
    if let Some(e) = &mut r.embed {
        let chars = |t: &str| format!("[redacted {} chars]", t.chars().count());
        for item in e.input.iter_mut() {
            *item = match item {
                contracts::EmbedItem::Text(t) => contracts::EmbedItem::Text(chars(t)),
                contracts::EmbedItem::Tokens(ids) => {
                    contracts::EmbedItem::Text(format!("[redacted {} tokens]", ids.len()))
                }
                contracts::EmbedItem::Pair { query, document } => contracts::EmbedItem::Pair {
                    query: chars(query),
                    document: chars(document),
                },
            };
        }
    }
    serde_json::to_value(r).unwrap_or(serde_json::Value::Null)
}

pub struct Validated {
    /// Empty for an embedding task.
    pub prompt: PromptInput,
    pub continuation: String,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    pub sampling: SamplingParams,
    pub constraint: Option<OutputConstraint>,
    pub logprobs: Option<usize>,
    /// An embedding task's inputs and options.
    pub embed: Option<EmbedSpec>,
}

impl Validated {
    /// The size of what it brings in tokens before any tokenizer ran, for budgets and
    /// predictions only.
    pub fn estimated_tokens(&self) -> usize {
        match &self.embed {
            Some(e) => super::embed::estimated_tokens(e),
            None => estimated_tokens(&self.prompt, &self.continuation),
        }
    }

    /// What the engine runs.
    pub fn into_spec(self) -> RunSpec {
        RunSpec {
            prompt: self.prompt,
            continuation: self.continuation,
            sampling: self.sampling,
            max_tokens: self.max_tokens,
            stop: self.stop,
            constraint: self.constraint,
            logprobs: self.logprobs,
            embed: self.embed,
        }
    }
}

/// `logprobs` and `top_logprobs` as the run's: `Some(n)` when asked for.
fn logprobs_of(req: &TaskRequest) -> Result<Option<usize>, ApiError> {
    let top = req.top_logprobs.unwrap_or(0) as usize;
    if top > pool_manager::MAX_TOP_LOGPROBS {
        return Err(ApiError::invalid(
            "top_logprobs",
            format!("top_logprobs must be 0-{}", pool_manager::MAX_TOP_LOGPROBS),
        ));
    }
    match req.logprobs {
        Some(true) => Ok(Some(top)),
        _ if top > 0 => Err(ApiError::invalid(
            "top_logprobs",
            "top_logprobs needs logprobs: true",
        )),
        _ => Ok(None),
    }
}

/// The longest JSON Schema or grammar a request may give, in bytes of its text.
const MAX_CONSTRAINT_BYTES: usize = 64 * 1024;

/// The request's structured-output constraint: a JSON Schema or a grammar, not both.
fn constraint_of(req: &TaskRequest) -> Result<Option<OutputConstraint>, ApiError> {
    let too_long = |field: &str| {
        ApiError::invalid(
            field,
            format!("{field} is over {MAX_CONSTRAINT_BYTES} bytes"),
        )
    };
    match (&req.json_schema, &req.grammar) {
        (Some(_), Some(_)) => Err(ApiError::invalid(
            "grammar",
            "give json_schema or grammar, not both",
        )),
        (Some(schema), None) => {
            if !(schema.is_object() || schema.is_boolean()) {
                return Err(ApiError::invalid(
                    "json_schema",
                    "json_schema must be a JSON Schema: an object (or true)",
                ));
            }
            let text = schema.to_string();
            if text.len() > MAX_CONSTRAINT_BYTES {
                return Err(too_long("json_schema"));
            }
            Ok(Some(OutputConstraint::JsonSchema(text)))
        }
        (None, Some(grammar)) => {
            if grammar.trim().is_empty() {
                return Err(ApiError::invalid("grammar", "the grammar is empty"));
            }
            if grammar.len() > MAX_CONSTRAINT_BYTES {
                return Err(too_long("grammar"));
            }
            Ok(Some(OutputConstraint::Grammar(grammar.clone())))
        }
        (None, None) => Ok(None),
    }
}

/// Checks a request's ids: each 1-128 characters of `A-Z a-z 0-9 - _ . :`.
fn check_ids(req: &TaskRequest) -> Result<(), ApiError> {
    for (field, id) in [("task_id", &req.task_id), ("session_id", &req.session_id)] {
        if id.as_deref().is_some_and(|id| !valid_id(id)) {
            return Err(ApiError::invalid(
                field,
                format!("{field} must be 1-128 characters of [A-Za-z0-9-_.:], not . or .."),
            ));
        }
    }
    if req
        .prompt_cache_key
        .as_deref()
        .is_some_and(|k| k.is_empty() || k.len() > MAX_CACHE_KEY_BYTES)
    {
        return Err(ApiError::invalid(
            "prompt_cache_key",
            format!("prompt_cache_key must be 1-{MAX_CACHE_KEY_BYTES} bytes"),
        ));
    }
    Ok(())
}

/// The longest `prompt_cache_key` taken.
pub const MAX_CACHE_KEY_BYTES: usize = 256;

pub fn validate(state: &SharedLifecycle, req: &TaskRequest) -> Result<Validated, ApiError> {
    let a = &state.cfg.admission;
    check_ids(req)?;
    if req.deadline_ms == Some(0) {
        return Err(ApiError::invalid(
            "deadline_ms",
            "deadline_ms must be positive",
        ));
    }
    if let Some(e) = &req.embed {
        return Ok(Validated {
            prompt: PromptInput::Text(String::new()),
            continuation: String::new(),
            max_tokens: 0,
            stop: Vec::new(),
            sampling: SamplingParams::default(),
            constraint: None,
            logprobs: None,
            embed: Some(super::embed::validated(req, e)?),
        });
    }
    let (prompt, continuation) = prompt_of(req)?;
    let max_tokens = req.max_tokens.unwrap_or(a.default_max_tokens);
    if max_tokens == 0 || max_tokens > a.max_tokens_out {
        return Err(ApiError::invalid(
            "max_tokens",
            format!("max_tokens must be within [1, {}]", a.max_tokens_out),
        ));
    }
    check_range("temperature", req.temperature, 0.0, 100.0, false)?;
    check_range("top_p", req.top_p, SMALLEST_FACTOR, 1.0, false)?;
    check_range("min_p", req.min_p, 0.0, 1.0, false)?;
    check_range(
        "repetition_penalty",
        req.repetition_penalty,
        SMALLEST_FACTOR,
        10.0,
        false,
    )?;
    check_range("presence_penalty", req.presence_penalty, -2.0, 2.0, false)?;
    check_range("frequency_penalty", req.frequency_penalty, -2.0, 2.0, false)?;
    if req
        .draft_tokens
        .is_some_and(|n| n as usize > MAX_DRAFT_TOKENS)
    {
        return Err(ApiError::invalid(
            "draft_tokens",
            format!("draft_tokens must be within [0, {MAX_DRAFT_TOKENS}]"),
        ));
    }
    let stop = req.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > a.max_stop_sequences {
        return Err(ApiError::invalid(
            "stop",
            format!("at most {} stop sequences", a.max_stop_sequences),
        ));
    }
    if stop
        .iter()
        .any(|s| s.is_empty() || s.chars().count() > a.max_stop_chars)
    {
        return Err(ApiError::invalid(
            "stop",
            format!("stop sequences must be 1-{} characters", a.max_stop_chars),
        ));
    }
    let sampling = SamplingParams {
        temperature: req.temperature.unwrap_or(0.0),
        top_k: req.top_k.unwrap_or(0) as usize,
        top_p: req.top_p.unwrap_or(1.0),
        min_p: req.min_p.unwrap_or(0.0),
        repetition_penalty: req.repetition_penalty.unwrap_or(1.0),
        presence_penalty: req.presence_penalty.unwrap_or(0.0),
        frequency_penalty: req.frequency_penalty.unwrap_or(0.0),
        seed: req.seed.unwrap_or_else(rand_seed),
        draft_tokens: req.draft_tokens.map(|n| n as usize),
    };
    Ok(Validated {
        prompt,
        continuation,
        max_tokens: max_tokens as usize,
        stop,
        sampling,
        constraint: constraint_of(req)?,
        logprobs: logprobs_of(req)?,
        embed: None,
    })
}

/// A seed the server chooses: below 2^53, so JavaScript and jq show it exactly (FC-SEED-1).
fn rand_seed() -> u64 {
    let u = uuid::Uuid::new_v4();
    let b = u.as_bytes();
    u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]) & ((1 << 53) - 1)
}

/// The size of a prompt in tokens before any tokenizer ran: one per 4 bytes, for budgets and
/// predictions only.
pub(super) fn estimated_tokens(prompt: &PromptInput, continuation: &str) -> usize {
    let bytes = match prompt {
        PromptInput::Text(t) => t.len(),
        PromptInput::Chat(turns) => turns.iter().map(|t| t.content.len() + 8).sum(),
        // an id is a token: four bytes' worth
        PromptInput::Tokens(parts) => parts
            .iter()
            .map(|p| match p {
                contracts::PromptPart::Token(_) => 4,
                contracts::PromptPart::Text(t) => t.len(),
            })
            .sum(),
    } + continuation.len();
    bytes.div_ceil(4).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ORCH-ADM-1 (issue 49): ids are path segments of the stream URL: `.` and `..` are
    /// refused, dots inside an id are not.
    #[test]
    fn ids_that_are_path_segments_of_their_own_are_refused() {
        for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(129)] {
            assert!(!valid_id(bad), "{bad:?}");
        }
        for good in ["...", ".a", "a..b", "job-1:2_3", &"x".repeat(128)] {
            assert!(valid_id(good), "{good:?}");
        }
    }
}
