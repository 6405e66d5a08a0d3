//! How the next token is chosen: the port's sampling parameters, checked once at the edge.

/// The most tokens a pass may guess ahead for one sequence (`draft_tokens`).
pub const MAX_DRAFT_TOKENS: usize = 16;

/// How the next token is chosen. Defaults: greedy, no penalties.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// 0 disables top-k.
    pub top_k: usize,
    /// 1.0 disables top-p.
    pub top_p: f32,
    /// 0.0 disables min-p.
    pub min_p: f32,
    /// 1.0 disables the repetition penalty (applied over the engine's recent tokens).
    pub repetition_penalty: f32,
    /// OpenAI-style presence penalty over generated tokens.
    pub presence_penalty: f32,
    /// OpenAI-style frequency penalty over generated tokens.
    pub frequency_penalty: f32,
    pub seed: u64,
    /// Tokens guessed ahead per pass by prompt lookup (speculative decoding without a draft
    /// model; the output is what plain decoding gives): `None` = the pool's setting, 0 = off.
    pub draft_tokens: Option<usize>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
            draft_tokens: None,
        }
    }
}

impl SamplingParams {
    /// Whether every parameter is within its range; the message names the one that is not.
    pub fn validate(&self) -> Result<(), String> {
        let bad = |m: &str| Err(m.to_string());
        if !(self.temperature.is_finite() && (0.0..=100.0).contains(&self.temperature)) {
            return bad("temperature must be within [0, 100]");
        }
        if !(self.top_p.is_finite() && self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p must be within (0, 1]");
        }
        if !(self.min_p.is_finite() && (0.0..=1.0).contains(&self.min_p)) {
            return bad("min_p must be within [0, 1]");
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad("repetition_penalty must be > 0");
        }
        for (v, name) in [
            (self.presence_penalty, "presence_penalty"),
            (self.frequency_penalty, "frequency_penalty"),
        ] {
            if !(v.is_finite() && (-2.0..=2.0).contains(&v)) {
                return Err(format!("{name} must be within [-2, 2]"));
            }
        }
        if self.draft_tokens.is_some_and(|n| n > MAX_DRAFT_TOKENS) {
            return Err(format!(
                "draft_tokens must be within [0, {MAX_DRAFT_TOKENS}]"
            ));
        }
        Ok(())
    }
}
