//! llama-server's generation settings: its defaults for a completion that names none, and the
//! `generation_settings` / `params` object it reports for a task.

use serde::Serialize;
use utoipa::ToSchema;

use crate::lifecycle::task::RunSpec;

/// llama-server's sampling defaults (`common_params_sampling`), used by `/completion` for what
/// a request leaves out — its users expect its sampler, not this server's greedy default.
pub const TEMPERATURE: f32 = 0.8;
pub const TOP_K: u32 = 40;
pub const TOP_P: f32 = 0.95;
pub const MIN_P: f32 = 0.05;

/// The settings a task runs with, in llama-server's names.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct GenerationSettings {
    pub seed: u64,
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub min_p: f32,
    pub repeat_penalty: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// `-1`: as many as the context allows.
    pub n_predict: i64,
    pub max_tokens: i64,
    pub stop: Vec<String>,
    /// Whether the answer is streamed (absent where the server does not know: `/slots`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    pub n_probs: usize,
}

impl GenerationSettings {
    pub fn of(spec: &RunSpec, stream: Option<bool>) -> Self {
        let s = &spec.sampling;
        let n = spec.max_tokens as i64;
        Self {
            seed: s.seed,
            temperature: s.temperature,
            top_k: s.top_k,
            top_p: s.top_p,
            min_p: s.min_p,
            repeat_penalty: s.repetition_penalty,
            presence_penalty: s.presence_penalty,
            frequency_penalty: s.frequency_penalty,
            n_predict: n,
            max_tokens: n,
            stop: spec.stop.clone(),
            stream,
            n_probs: spec.logprobs.unwrap_or(0),
        }
    }

    /// What a completion that names nothing runs with (`/props`).
    pub fn defaults() -> Self {
        Self {
            // llama-server's "random" seed
            seed: u32::MAX as u64,
            temperature: TEMPERATURE,
            top_k: TOP_K as usize,
            top_p: TOP_P,
            min_p: MIN_P,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            n_predict: -1,
            max_tokens: -1,
            stop: Vec::new(),
            stream: Some(false),
            n_probs: 0,
        }
    }
}
