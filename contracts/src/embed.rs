//! Embedding tasks on the task API (`embed` in a task request) and what their `end` event
//! carries: every adapter's embedding and rerank requests become one of these.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One input: a text, token ids of the model's vocabulary, or a query and a document scored
/// together (reranking).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum EmbedItem {
    Text(String),
    Tokens(Vec<u32>),
    Pair { query: String, document: String },
}

/// How a sequence's last hidden states become its vector (llama.cpp's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PoolingKind {
    /// One vector per token.
    None,
    Mean,
    /// The first token's.
    Cls,
    /// The last token's.
    Last,
    /// Relevance scores through the model's classification head (rerankers).
    Rank,
}

/// An embedding task: its inputs and how their vectors are made. Not with `prompt`,
/// `prompt_tokens` or `messages`; `max_tokens` and sampling do not apply.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"input": ["The sea is calm.", "A quiet ocean."]}))]
pub struct EmbedTask {
    /// At least one; as many as the body limit and the tenant's token quota allow.
    #[schema(min_items = 1)]
    pub input: Vec<EmbedItem>,
    /// Default: the model's own (its GGUF's `pooling_type`; mean when it names none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pooling: Option<PoolingKind>,
    /// Unit-length vectors (default true; scores are never scaled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normalize: Option<bool>,
    /// An input longer than the model takes is cut to fit (default false: a 400 naming the
    /// input and its token count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncate: Option<bool>,
    /// Keep the first this many dimensions of each vector (renormalized when normalizing):
    /// Matryoshka-trained models keep their meaning so; at most the model's width.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1)]
    pub dimensions: Option<u32>,
}

/// Per input: its vector (one), its tokens' vectors (pooling `none`), or its relevance
/// scores (pooling `rank`).
pub type EmbedVectors = Vec<Vec<Vec<f32>>>;
