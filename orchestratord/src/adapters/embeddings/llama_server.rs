//! llama-server's non-OpenAI embedding routes, `POST /embedding` and `POST /embeddings`:
//! `content` (or `input`) as a text, texts or token ids; answered as
//! `[{index, embedding: [[…]]}]` — one vector per input, or one per token when the model's
//! pooling is `none` (those raw, as llama-server gives them); `embd_normalize` 2 (unit
//! length, the default) or -1 (raw).

use axum::extract::State;
use axum::Json;
use contracts::{EmbedItem, EmbedTask, PoolingKind};
use pool_manager::Pooling;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{embed, inputs_named};
use crate::adapters::follow;
use crate::app_state::SharedState;
use crate::auth::Caller;
use crate::error::openai::OpenAiError;
use crate::error::ApiError;
use crate::json_body::JsonBody;

/// `POST /embeddings` (llama-server's shape).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[schema(example = json!({"content": "Hello world"}))]
pub struct EmbeddingRequest {
    /// A text, texts, token ids, or arrays of token ids.
    #[schema(value_type = Object)]
    pub content: Option<serde_json::Value>,
    /// The same as `content` (OpenAI's name).
    #[schema(value_type = Option<Object>)]
    pub input: Option<serde_json::Value>,
    pub model: Option<String>,
    /// 2: unit length (default); -1: as the model gives them.
    pub embd_normalize: Option<i32>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EmbeddingEntry {
    pub index: u32,
    /// One vector, or one per token under pooling `none`.
    pub embedding: Vec<Vec<f32>>,
}

/// The inputs of `v` as llama-server reads them: a string, token ids, or an array of
/// either.
fn items_of(v: &serde_json::Value) -> Result<Vec<EmbedItem>, ApiError> {
    let parsed: Result<crate::adapters::embeddings::openai::EmbeddingInput, _> =
        serde_json::from_value(v.clone());
    match parsed {
        Ok(input) => Ok(input.into_items()),
        Err(_) => Err(ApiError::invalid(
            "content",
            "content is a text, texts, token ids or arrays of token ids",
        )),
    }
}

/// llama-server's embeddings.
#[utoipa::path(
    post, operation_id = "llamaServerEmbeddings", path = "/embeddings", tag = "llama-server",
    request_body = EmbeddingRequest,
    responses(
        (status = 200, description = "Per input: its vector, or its tokens' vectors (pooling none)", body = [EmbeddingEntry]),
        (status = 400, description = "Bad request", body = crate::error::openai::ErrorBody, example = crate::examples::openai_invalid),
        (status = 404, description = "Unknown model", body = crate::error::openai::ErrorBody, example = crate::examples::openai_not_found),
        (status = 429, description = "Queue full", body = crate::error::openai::ErrorBody, example = crate::examples::openai_rate_limited),
    )
)]
pub async fn embeddings(
    State(state): State<SharedState>,
    caller: Caller,
    body: Result<JsonBody<EmbeddingRequest>, ApiError>,
) -> Result<Json<Vec<EmbeddingEntry>>, OpenAiError> {
    let JsonBody(req) = body?;
    let Some(content) = req.content.as_ref().or(req.input.as_ref()) else {
        return Err(ApiError::invalid("content", "content is required").into());
    };
    let input = items_of(content)?;
    let normalize = match req.embd_normalize {
        None | Some(2) => true,
        Some(-1) => false,
        Some(n) => {
            return Err(ApiError::invalid(
                "embd_normalize",
                format!("embd_normalize {n}: 2 (unit length) or -1 (raw) here"),
            )
            .into())
        }
    };
    // per-token vectors come raw, as llama-server gives them
    let per_token = crate::adapters::tokenize::engine_for(&state, req.model.as_deref())
        .ok()
        .and_then(|e| e.descriptor().embedding)
        .is_some_and(|e| e.pooling == Pooling::None);
    let task = EmbedTask {
        input,
        pooling: per_token.then_some(PoolingKind::None),
        normalize: Some(normalize && !per_token),
        ..Default::default()
    };
    let done = embed(&state, &caller, req.model.clone(), task, None)
        .await
        .map_err(|e| follow::renamed(inputs_named(e, "content"), "input", "content"))?;
    Ok(Json(
        done.vectors
            .into_iter()
            .enumerate()
            .map(|(i, embedding)| EmbeddingEntry {
                index: i as u32,
                embedding,
            })
            .collect(),
    ))
}
