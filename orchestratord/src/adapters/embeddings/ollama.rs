//! Ollama's `POST /api/embed` (`input` a string or strings, `truncate` default true,
//! `dimensions`, `keep_alive`; `embeddings`, `prompt_eval_count`, durations in ns) and the
//! older `POST /api/embeddings` (`prompt` -> one `embedding`, not normalized, as Ollama gives
//! it). Bodies without a JSON content type are taken, as on every `/api/*` route.

use axum::extract::State;
use axum::Json;
use contracts::{EmbedItem, EmbedTask};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{embed, inputs_named, one_each};
use crate::app_state::SharedState;
use crate::auth::Caller;
use crate::error::ollama::OllamaError;
use crate::error::ApiError;
use crate::json_body::JsonBody;
use crate::models_folder::keep_alive;

/// A text or several.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// `POST /api/embed`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[schema(as = OllamaEmbedRequest, example = json!({"model": "all-MiniLM-L6-v2", "input": ["Why is the sky blue?", "Why is grass green?"]}))]
pub struct EmbedRequest {
    pub model: String,
    /// Absent, `""` or `[]`: nothing to embed, Ollama's call that only applies `keep_alive`
    /// (`0` unloads a model loaded on demand once idle).
    pub input: Option<OneOrMany>,
    /// Cut an input longer than the model takes to fit (default true, as Ollama does; false: a
    /// 400 naming it).
    pub truncate: Option<bool>,
    /// Keep the first this many dimensions (renormalized).
    pub dimensions: Option<u32>,
    /// How long the model stays loaded once idle (a model loaded on demand).
    #[schema(value_type = Option<Object>)]
    pub keep_alive: Option<serde_json::Value>,
    /// Accepted; the options of a generation do not apply to an embedding.
    #[schema(value_type = Option<Object>)]
    pub options: Option<serde_json::Value>,
    pub priority: Option<contracts::Priority>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = OllamaEmbedResponse)]
pub struct EmbedResponse {
    pub model: String,
    pub embeddings: Vec<Vec<f32>>,
    /// Submission to the answer, ns.
    pub total_duration: u64,
    /// Waiting for a slot (and the model's load), ns.
    pub load_duration: u64,
    pub prompt_eval_count: u32,
}

/// `POST /api/embeddings` (Ollama's older route).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[schema(as = OllamaEmbeddingsRequest, example = json!({"model": "all-MiniLM-L6-v2", "prompt": "Why is the sky blue?"}))]
pub struct EmbeddingsRequest {
    pub model: String,
    pub prompt: String,
    #[schema(value_type = Option<Object>)]
    pub keep_alive: Option<serde_json::Value>,
    #[schema(value_type = Option<Object>)]
    pub options: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = OllamaEmbeddingsResponse)]
pub struct EmbeddingsResponse {
    pub embedding: Vec<f32>,
}

fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Applies `keep_alive` to the model once its request was admitted (a model of the folder
/// has its on-demand pool by then).
fn keep(state: &SharedState, model: &str, v: &Option<serde_json::Value>) -> Result<(), ApiError> {
    if let Some(v) = v {
        let k = keep_alive::parse(v).map_err(|why| ApiError::invalid("keep_alive", why))?;
        state.models_folder.set_keep_alive(model, k);
    }
    Ok(())
}

/// Ollama's embeddings.
#[utoipa::path(
    post, operation_id = "ollamaEmbed", path = "/api/embed", tag = "ollama",
    request_body = EmbedRequest,
    responses(
        (status = 200, description = "One unit-length vector per input", body = EmbedResponse),
        (status = 400, description = "Bad request (an empty input, a model that does not embed)", body = crate::error::ollama::ErrorBody, example = json!({"error": "input is empty"})),
        (status = 404, description = "Unknown model", body = crate::error::ollama::ErrorBody, example = json!({"error": "model \"llama3\" not found"})),
        (status = 429, description = "Queue full: retry after `Retry-After`", body = crate::error::ollama::ErrorBody, example = json!({"error": "queue full"})),
    )
)]
pub async fn embed_route(
    State(state): State<SharedState>,
    caller: Caller,
    body: Result<JsonBody<EmbedRequest>, ApiError>,
) -> Result<Json<EmbedResponse>, OllamaError> {
    let JsonBody(req) = body?;
    keep_alive_valid(&req.keep_alive)?;
    let input: Vec<EmbedItem> = match req.input {
        None => Vec::new(),
        Some(OneOrMany::One(t)) if t.is_empty() => Vec::new(),
        Some(OneOrMany::One(t)) => vec![EmbedItem::Text(t)],
        Some(OneOrMany::Many(v)) => v.into_iter().map(EmbedItem::Text).collect(),
    };
    if input.is_empty() {
        return Ok(Json(nothing_to_embed(&state, req.model, &req.keep_alive)?));
    }
    let task = EmbedTask {
        input,
        truncate: Some(req.truncate.unwrap_or(true)),
        dimensions: req.dimensions,
        ..Default::default()
    };
    let done = embed(&state, &caller, Some(req.model.clone()), task, req.priority)
        .await
        .map_err(|e| inputs_named(e, "input"))?;
    keep(&state, &req.model, &req.keep_alive)?;
    let spans = done.task.spans();
    Ok(Json(EmbedResponse {
        model: req.model,
        embeddings: one_each(done.vectors)?,
        total_duration: nanos(spans.total),
        load_duration: nanos(spans.waited),
        prompt_eval_count: done.prompt_tokens,
    }))
}

/// Ollama's older embedding route: one prompt, its raw vector.
#[utoipa::path(
    post, operation_id = "ollamaEmbeddings", path = "/api/embeddings", tag = "ollama",
    request_body = EmbeddingsRequest,
    responses(
        (status = 200, description = "The prompt's vector (not normalized, as Ollama gives it)", body = EmbeddingsResponse),
        (status = 400, description = "Bad request", body = crate::error::ollama::ErrorBody, example = json!({"error": "input is empty"})),
        (status = 404, description = "Unknown model", body = crate::error::ollama::ErrorBody, example = json!({"error": "model \"llama3\" not found"})),
    )
)]
pub async fn embeddings_route(
    State(state): State<SharedState>,
    caller: Caller,
    body: Result<JsonBody<EmbeddingsRequest>, ApiError>,
) -> Result<Json<EmbeddingsResponse>, OllamaError> {
    let JsonBody(req) = body?;
    keep_alive_valid(&req.keep_alive)?;
    let task = EmbedTask {
        input: vec![EmbedItem::Text(req.prompt)],
        normalize: Some(false),
        truncate: Some(true),
        ..Default::default()
    };
    let done = embed(&state, &caller, Some(req.model.clone()), task, None)
        .await
        .map_err(|e| {
            crate::adapters::follow::renamed(inputs_named(e, "prompt"), "prompt[0]", "prompt")
        })?;
    keep(&state, &req.model, &req.keep_alive)?;
    let mut one = one_each(done.vectors)?;
    Ok(Json(EmbeddingsResponse {
        embedding: one.pop().unwrap_or_default(),
    }))
}

/// Ollama's load (and, with `keep_alive: 0`, unload) call: no input, so no task; the model
/// must be served (404 otherwise), and its `keep_alive` applies as after an embedding.
fn nothing_to_embed(
    state: &SharedState,
    model: String,
    keep_alive: &Option<serde_json::Value>,
) -> Result<EmbedResponse, ApiError> {
    if !state.pools.all().iter().any(|p| p.serves(&model)) {
        return Err(ApiError::not_found("model", &model).with_field("model"));
    }
    keep(state, &model, keep_alive)?;
    Ok(EmbedResponse {
        model,
        embeddings: Vec::new(),
        total_duration: 0,
        load_duration: 0,
        prompt_eval_count: 0,
    })
}

/// `keep_alive` checked before the work (a bad one is refused, not found out after).
fn keep_alive_valid(v: &Option<serde_json::Value>) -> Result<(), ApiError> {
    match v {
        Some(v) => keep_alive::parse(v)
            .map(|_| ())
            .map_err(|why| ApiError::invalid("keep_alive", why)),
        None => Ok(()),
    }
}
