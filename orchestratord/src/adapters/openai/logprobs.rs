//! `logprobs` in OpenAI's two shapes: chat's `{content: [{token, logprob, bytes,
//! top_logprobs}]}` and the legacy completions' `{tokens, token_logprobs, top_logprobs,
//! text_offset}`, from the task's token events.

use std::collections::BTreeMap;

use contracts::SseLogprobs;
use serde::Serialize;
use utoipa::ToSchema;

/// A token and its log-probability.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// One token of a chat answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ContentLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    /// The likeliest tokens at this step (`top_logprobs` of them), most likely first.
    pub top_logprobs: Vec<TopLogprob>,
}

/// A chat choice's `logprobs`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({"content": [{"token": " Paris", "logprob": -0.31, "bytes": [32, 80, 97, 114, 105, 115], "top_logprobs": [{"token": " Paris", "logprob": -0.31, "bytes": [32, 80, 97, 114, 105, 115]}]}]}))]
pub struct ChatLogprobs {
    pub content: Vec<ContentLogprob>,
}

/// Chat's `logprobs` of `steps`.
pub fn chat(steps: &[SseLogprobs]) -> ChatLogprobs {
    ChatLogprobs {
        content: steps
            .iter()
            .map(|s| ContentLogprob {
                token: s.token.clone(),
                logprob: s.logprob,
                bytes: s.bytes.clone(),
                top_logprobs: s
                    .top
                    .iter()
                    .map(|t| TopLogprob {
                        token: t.token.clone(),
                        logprob: t.logprob,
                        bytes: t.bytes.clone(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

/// A text completion choice's `logprobs` (the legacy shape).
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({"tokens": [" sunny"], "token_logprobs": [-1.2], "top_logprobs": [{" sunny": -1.2, " warm": -1.6}], "text_offset": [21]}))]
pub struct TextLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    /// One map per token: the likeliest tokens' texts to their log-probabilities.
    pub top_logprobs: Vec<BTreeMap<String, f32>>,
    /// Where each token starts in the answer text (bytes, counted from `offset`).
    pub text_offset: Vec<usize>,
}

/// The completions shape of `steps`, offsets counted from `offset`.
pub fn text(steps: &[SseLogprobs], offset: usize) -> TextLogprobs {
    let mut at = offset;
    let mut out = TextLogprobs {
        tokens: Vec::with_capacity(steps.len()),
        token_logprobs: Vec::with_capacity(steps.len()),
        top_logprobs: Vec::with_capacity(steps.len()),
        text_offset: Vec::with_capacity(steps.len()),
    };
    for s in steps {
        out.tokens.push(s.token.clone());
        out.token_logprobs.push(s.logprob);
        out.top_logprobs
            .push(s.top.iter().map(|t| (t.token.clone(), t.logprob)).collect());
        out.text_offset.push(at);
        at += s.bytes.len();
    }
    out
}
