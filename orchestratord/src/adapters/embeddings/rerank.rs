//! Rerank in Cohere's and Jina's shape, as llama-server and vLLM serve it (`POST /rerank`,
//! `/v1/rerank`, and llama-server's `/reranking`, `/v1/reranking`): `query`, `documents`,
//! `top_n`, `return_documents` (llama-server's `return_text` too) ->
//! `results[{index, relevance_score, document?}]`, best first. Each document is scored with
//! the query by a reranker (a model with a classification head, pooling `rank`): one
//! embedding task of query-document pairs.

use axum::extract::State;
use axum::Json;
use contracts::{EmbedItem, EmbedTask};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{embed, inputs_named};
use crate::adapters::follow;
use crate::app_state::SharedState;
use crate::auth::Caller;
use crate::error::openai::OpenAiError;
use crate::error::ApiError;
use crate::json_body::JsonBody;

/// A document: its text, or Cohere's `{"text": …}`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum Document {
    Text(String),
    Object { text: String },
}

impl Document {
    fn text(&self) -> &str {
        match self {
            Self::Text(t) | Self::Object { text: t } => t,
        }
    }
}

/// `POST /v1/rerank`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[schema(example = json!({"model": "bge-reranker", "query": "What is a panda?", "documents": ["hi", "The giant panda is a bear native to China."], "top_n": 1}))]
pub struct RerankRequest {
    pub model: Option<String>,
    pub query: String,
    #[schema(min_items = 1)]
    pub documents: Vec<Document>,
    /// The best this many (default: all).
    pub top_n: Option<usize>,
    /// Each result carries its document (`{"text": …}`).
    pub return_documents: Option<bool>,
    /// llama-server's name for `return_documents`.
    pub return_text: Option<bool>,
    /// Accepted: a document longer than the model takes is always cut to fit, as the
    /// rerankers of Cohere and Jina do (the query is kept whole).
    pub max_chunks_per_doc: Option<u32>,
    pub priority: Option<contracts::Priority>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RerankDocument {
    pub text: String,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RerankResult {
    pub index: u32,
    pub relevance_score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub document: Option<RerankDocument>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RerankUsage {
    pub prompt_tokens: u32,
    pub total_tokens: u32,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RerankResponse {
    pub model: String,
    pub object: &'static str,
    pub usage: RerankUsage,
    pub results: Vec<RerankResult>,
}

/// Rerank: the documents scored against the query, best first.
#[utoipa::path(
    post, operation_id = "rerank", path = "/v1/rerank", tag = "openai",
    request_body = RerankRequest,
    responses(
        (status = 200, description = "The documents by relevance to the query, best first (`top_n` of them)", body = RerankResponse),
        (status = 400, description = "Bad request: no documents, an empty query, a model that does not rank", body = crate::error::openai::ErrorBody, example = crate::examples::openai_invalid),
        (status = 404, description = "Unknown model", body = crate::error::openai::ErrorBody, example = crate::examples::openai_not_found),
        (status = 429, description = "Queue full", body = crate::error::openai::ErrorBody, example = crate::examples::openai_rate_limited),
    )
)]
pub async fn rerank(
    State(state): State<SharedState>,
    caller: Caller,
    body: Result<JsonBody<RerankRequest>, ApiError>,
) -> Result<Json<RerankResponse>, OpenAiError> {
    let JsonBody(req) = body?;
    if req.documents.is_empty() {
        return Err(ApiError::invalid("documents", "documents is empty").into());
    }
    if req.query.is_empty() {
        return Err(ApiError::invalid("query", "the query is empty").into());
    }
    let input = req
        .documents
        .iter()
        .map(|d| EmbedItem::Pair {
            query: req.query.clone(),
            document: d.text().to_string(),
        })
        .collect();
    let task = EmbedTask {
        input,
        truncate: Some(true),
        ..Default::default()
    };
    let done = embed(&state, &caller, req.model.clone(), task, req.priority)
        .await
        .map_err(|e| follow::renamed(inputs_named(e, "documents"), "input", "documents"))?;
    let with_text = req.return_documents.or(req.return_text).unwrap_or(false);
    let mut results: Vec<RerankResult> = done
        .vectors
        .iter()
        .enumerate()
        .map(|(i, v)| RerankResult {
            index: i as u32,
            relevance_score: v
                .first()
                .and_then(|s| s.first())
                .copied()
                .unwrap_or(f32::NAN),
            document: with_text.then(|| RerankDocument {
                text: req.documents[i].text().to_string(),
            }),
        })
        .collect();
    results.sort_by(|a, b| b.relevance_score.total_cmp(&a.relevance_score));
    results.truncate(req.top_n.unwrap_or(usize::MAX).min(results.len()));
    Ok(Json(RerankResponse {
        model: done.model,
        object: "list",
        usage: RerankUsage {
            prompt_tokens: done.prompt_tokens,
            total_tokens: done.prompt_tokens,
        },
        results,
    }))
}
