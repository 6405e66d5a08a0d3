//! OpenAI's `POST /v1/embeddings`: `input` as a string, strings, token ids or arrays of them;
//! `encoding_format` float or base64 (little-endian f32, what the official SDKs ask for by
//! default and decode); `dimensions`; `usage.prompt_tokens`.

use axum::extract::State;
use axum::Json;
use base64::Engine as _;
use contracts::{EmbedItem, EmbedTask};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{embed, inputs_named, one_each};
use crate::app_state::SharedState;
use crate::auth::Caller;
use crate::error::openai::OpenAiError;
use crate::error::ApiError;
use crate::json_body::JsonBody;

/// `input`: one text, several, token ids, or several arrays of token ids.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum EmbeddingInput {
    One(String),
    Many(Vec<String>),
    Tokens(Vec<u32>),
    ManyTokens(Vec<Vec<u32>>),
}

impl EmbeddingInput {
    pub fn into_items(self) -> Vec<EmbedItem> {
        match self {
            Self::One(t) => vec![EmbedItem::Text(t)],
            Self::Many(v) => v.into_iter().map(EmbedItem::Text).collect(),
            Self::Tokens(ids) => vec![EmbedItem::Tokens(ids)],
            Self::ManyTokens(v) => v.into_iter().map(EmbedItem::Tokens).collect(),
        }
    }
}

/// `POST /v1/embeddings`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"model": "all-MiniLM-L6-v2", "input": ["The sea is calm.", "A quiet ocean."]}))]
pub struct EmbeddingsRequest {
    pub input: EmbeddingInput,
    /// The model (alias, name or pool id); the first pool whose model embeds when absent.
    pub model: Option<String>,
    /// `float` (default) or `base64`.
    pub encoding_format: Option<String>,
    /// Keep the first this many dimensions (renormalized).
    pub dimensions: Option<u32>,
    /// Accepted (OpenAI's end-user id).
    pub user: Option<String>,
    pub priority: Option<contracts::Priority>,
}

/// A vector: floats, or their little-endian f32 bytes in base64.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(untagged)]
pub enum Vector {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Embedding {
    pub object: &'static str,
    pub index: u32,
    pub embedding: Vector,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EmbeddingUsage {
    pub prompt_tokens: u32,
    pub total_tokens: u32,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EmbeddingsResponse {
    pub object: &'static str,
    pub data: Vec<Embedding>,
    pub model: String,
    pub usage: EmbeddingUsage,
}

/// `v`'s floats as OpenAI's base64 encoding gives them.
pub fn base64_of(v: &[f32]) -> String {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// OpenAI's embeddings.
#[utoipa::path(
    post, operation_id = "openaiEmbeddings", path = "/v1/embeddings", tag = "openai",
    request_body = EmbeddingsRequest,
    responses(
        (status = 200, description = "One vector per input, by index (unit length)", body = EmbeddingsResponse),
        (status = 400, description = "Bad request: an empty input, an input longer than the model takes (named, with its token count), a model that does not embed, more dimensions than it has", body = crate::error::openai::ErrorBody, example = crate::examples::openai_invalid),
        (status = 404, description = "Unknown model", body = crate::error::openai::ErrorBody, example = crate::examples::openai_not_found),
        (status = 429, description = "Queue full: retry after `retry-after-ms` (also `Retry-After` seconds)", body = crate::error::openai::ErrorBody, example = crate::examples::openai_rate_limited),
        (status = 503, description = "No pool for the model is ready", body = crate::error::openai::ErrorBody, example = crate::examples::openai_unready),
    )
)]
pub async fn embeddings(
    State(state): State<SharedState>,
    caller: Caller,
    body: Result<JsonBody<EmbeddingsRequest>, ApiError>,
) -> Result<Json<EmbeddingsResponse>, OpenAiError> {
    let JsonBody(req) = body?;
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("encoding_format {other:?}: float or base64"),
            )
            .into())
        }
    };
    let task = EmbedTask {
        input: req.input.into_items(),
        dimensions: req.dimensions,
        ..Default::default()
    };
    let done = embed(&state, &caller, req.model.clone(), task, req.priority)
        .await
        .map_err(|e| inputs_named(e, "input"))?;
    let data = one_each(done.vectors)?
        .into_iter()
        .enumerate()
        .map(|(i, v)| Embedding {
            object: "embedding",
            index: i as u32,
            embedding: if base64 {
                Vector::Base64(base64_of(&v))
            } else {
                Vector::Float(v)
            },
        })
        .collect();
    Ok(Json(EmbeddingsResponse {
        object: "list",
        data,
        model: done.model,
        usage: EmbeddingUsage {
            prompt_tokens: done.prompt_tokens,
            total_tokens: done.prompt_tokens,
        },
    }))
}
