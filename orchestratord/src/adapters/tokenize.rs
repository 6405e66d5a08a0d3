//! `POST /tokenize` and `POST /detokenize`, as llama.cpp's server and vLLM expose them: the
//! token ids a model runs for a text or a chat (its template applied), and the text of ids.
//! Both servers' field names are read (`content` / `prompt`, `add_special` /
//! `add_special_tokens`) and both are answered (`content` and `prompt`). Tokenizing runs on
//! the bounded tokenizer threads (`lifecycle/tokenize.rs`), never on the async runtime.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use contracts::ErrorCode;
use pool_manager::{ChatTurn, Engine, Pool, PromptInput};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::adapters::openai::types::{chat_turns, Message};
use crate::app_state::SharedState;
use crate::auth::Caller;
use crate::error::openai::OpenAiError;
use crate::error::ApiError;
use crate::json_body::JsonBody;
use crate::lifecycle::quota::OverQuota;
use crate::lifecycle::request_work::Turn;

/// Most ids one `/detokenize` takes.
pub const MAX_DETOKENIZE_IDS: usize = 1 << 17;

/// `POST /tokenize`: one of `content` (llama.cpp), `prompt` (vLLM) or `messages`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"content": "What is the capital of France?", "with_pieces": true}))]
pub struct TokenizeRequest {
    /// The model (alias, name or pool id); the first pool's when absent.
    pub model: Option<String>,
    /// Text, tokenized as a prompt is (llama.cpp's name).
    pub content: Option<String>,
    /// The same (vLLM's name).
    pub prompt: Option<String>,
    /// Chat turns, rendered with the model's chat template as a chat request is (ending
    /// where the assistant's answer begins).
    pub messages: Option<Vec<Message>>,
    /// Whether the model's special start token comes first when it wants one (llama.cpp's
    /// name; default true, as a prompt is run).
    pub add_special: Option<bool>,
    /// The same (vLLM's name).
    pub add_special_tokens: Option<bool>,
    /// Answer each token with its text: `[{"id", "piece"}]`.
    #[serde(default)]
    pub with_pieces: bool,
}

/// A token and the text it stands for (empty for control tokens; pieces of one character
/// split over several tokens are not valid UTF-8 alone and are shown with replacements).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Piece {
    pub id: u32,
    pub piece: String,
}

/// The ids (or ids with pieces), how many, and the model's context.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(untagged)]
pub enum Tokens {
    Ids(Vec<u32>),
    Pieces(Vec<Piece>),
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({"tokens": [1, 1780, 314, 260, 3575, 282, 4649, 47], "count": 8, "max_model_len": 8192}))]
pub struct TokenizeResponse {
    pub tokens: Tokens,
    pub count: usize,
    /// The context of the pool that tokenized (vLLM's name).
    pub max_model_len: usize,
}

/// `POST /detokenize`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"tokens": [1780, 314, 260, 3575, 282, 4649, 47]}))]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    #[schema(max_items = 131072)]
    pub tokens: Vec<u32>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(example = json!({"content": "What is the capital of France?", "prompt": "What is the capital of France?"}))]
pub struct DetokenizeResponse {
    /// The text (llama.cpp's name); control tokens left out.
    pub content: String,
    /// The same (vLLM's name).
    pub prompt: String,
}

/// A loaded engine of a pool serving `model` (the first pool's when `None`), preferring one
/// that has token ids to give (a local model over a remote worker's).
pub fn engine_for(state: &SharedState, model: Option<&str>) -> Result<Arc<dyn Engine>, ApiError> {
    let pools: Vec<Arc<Pool>> = state.pools.all();
    let serving: Vec<&Arc<Pool>> = match model {
        Some(m) => pools.iter().filter(|p| p.serves(m)).collect(),
        None => pools.first().into_iter().collect(),
    };
    if serving.is_empty() {
        let name = model.unwrap_or("");
        return Err(ApiError::new(
            ErrorCode::NotFound,
            format!("no pool serves model {name:?}"),
            false,
        )
        .with_field("model"));
    }
    let mut loaded: Vec<Arc<dyn Engine>> = serving.iter().filter_map(|p| p.engine()).collect();
    loaded.sort_by_key(|e| e.descriptor().on_loss != pool_manager::OnLoss::Restart);
    loaded.into_iter().next().ok_or_else(|| {
        ApiError::new(
            ErrorCode::PoolUnavailable,
            "no pool serving the model has it loaded",
            true,
        )
        .with_retry_after(1000)
    })
}

fn no_ids() -> ApiError {
    ApiError::invalid(
        "model",
        "the model is served by a remote worker, which takes text: there are no token ids to give",
    )
}

/// Token ids of a text or a chat, as the model runs them.
#[utoipa::path(
    post, operation_id = "tokenize", path = "/tokenize", tag = "tokenize",
    request_body = TokenizeRequest,
    responses(
        (status = 200, description = "The token ids (with `with_pieces`, each with its text)", body = TokenizeResponse),
        (status = 400, description = "Not exactly one of `content`, `prompt`, `messages`; a bad chat; a model that takes text", body = crate::error::openai::ErrorBody, example = crate::examples::openai_invalid),
        (status = 404, description = "No pool serves the model", body = crate::error::openai::ErrorBody, example = crate::examples::openai_not_found),
        (status = 503, description = "No pool serving the model has it loaded", body = crate::error::openai::ErrorBody, example = crate::examples::openai_unready),
    )
)]
pub async fn tokenize(
    State(state): State<SharedState>,
    caller: Caller,
    body: Result<JsonBody<TokenizeRequest>, ApiError>,
) -> Result<Json<TokenizeResponse>, OpenAiError> {
    // a malformed body is answered in this route's shape too
    let JsonBody(req) = body?;
    let (field, prompt) = match (&req.content, &req.prompt, &req.messages) {
        (Some(t), None, None) => ("content", PromptInput::Text(t.clone())),
        (None, Some(t), None) => ("prompt", PromptInput::Text(t.clone())),
        (None, None, Some(m)) => (
            "messages",
            PromptInput::Chat(
                chat_turns(m)?
                    .into_iter()
                    .map(|t| ChatTurn {
                        role: t.role,
                        content: t.content,
                    })
                    .collect(),
            ),
        ),
        _ => {
            return Err(ApiError::invalid(
                "content",
                "give exactly one of content, prompt or messages",
            )
            .into())
        }
    };
    let engine = engine_for(&state, req.model.as_deref())?;
    let ctx = engine.descriptor().ctx_max;
    let tenant = caller.tenant();
    state
        .quotas
        .count_request(tenant, std::time::Instant::now())
        .map_err(OverQuota::into_api)?;
    let special = req.add_special.or(req.add_special_tokens).unwrap_or(true);
    let with_pieces = req.with_pieces;
    let (count, tokens) = state
        .request_work
        .run(Turn::Request(tenant), move || {
            tokens_of(engine.as_ref(), &prompt, field, special, with_pieces)
        })
        .await
        .map_err(|e| e.into_api(field))??;
    Ok(Json(TokenizeResponse {
        tokens,
        count,
        max_model_len: ctx,
    }))
}

/// The ids of `prompt` (without the model's start token unless `special`), and with their
/// pieces when asked: the work of `/tokenize`, on a request-work thread.
fn tokens_of(
    engine: &dyn Engine,
    prompt: &PromptInput,
    field: &str,
    special: bool,
    with_pieces: bool,
) -> Result<(usize, Tokens), ApiError> {
    let mut ids = engine
        .tokenize(prompt, "")
        .map_err(|e| ApiError::invalid(field, e.to_string()))?
        .ok_or_else(no_ids)?;
    if !special {
        // the start token the model adds to every prompt, when it wants one
        let bos = engine
            .tokenize(&PromptInput::Text(String::new()), "")
            .ok()
            .flatten()
            .unwrap_or_default();
        if !bos.is_empty() && ids.starts_with(&bos) {
            ids.drain(..bos.len());
        }
    }
    let count = ids.len();
    if !with_pieces {
        return Ok((count, Tokens::Ids(ids)));
    }
    let mut pieces = Vec::with_capacity(ids.len());
    for id in ids {
        let piece = engine
            .detokenize(&[id])
            .map_err(|e| ApiError::invalid("tokens", e.to_string()))?
            .unwrap_or_default();
        pieces.push(Piece { id, piece });
    }
    Ok((count, Tokens::Pieces(pieces)))
}

/// The text of token ids (control tokens left out).
#[utoipa::path(
    post, operation_id = "detokenize", path = "/detokenize", tag = "tokenize",
    request_body = DetokenizeRequest,
    responses(
        (status = 200, description = "The text", body = DetokenizeResponse),
        (status = 400, description = "An id outside the vocabulary; too many ids; a model that takes text", body = crate::error::openai::ErrorBody, example = crate::examples::openai_invalid),
        (status = 404, description = "No pool serves the model", body = crate::error::openai::ErrorBody, example = crate::examples::openai_not_found),
        (status = 503, description = "No pool serving the model has it loaded", body = crate::error::openai::ErrorBody, example = crate::examples::openai_unready),
    )
)]
pub async fn detokenize(
    State(state): State<SharedState>,
    caller: Caller,
    body: Result<JsonBody<DetokenizeRequest>, ApiError>,
) -> Result<Json<DetokenizeResponse>, OpenAiError> {
    let JsonBody(req) = body?;
    if req.tokens.len() > MAX_DETOKENIZE_IDS {
        return Err(ApiError::invalid(
            "tokens",
            format!("at most {MAX_DETOKENIZE_IDS} ids at once"),
        )
        .into());
    }
    let engine = engine_for(&state, req.model.as_deref())?;
    let tenant = caller.tenant();
    state
        .quotas
        .count_request(tenant, std::time::Instant::now())
        .map_err(OverQuota::into_api)?;
    let ids = req.tokens;
    let text = state
        .request_work
        .run(Turn::Request(tenant), move || engine.detokenize(&ids))
        .await
        .map_err(|e| e.into_api("tokens"))?
        .map_err(|e| ApiError::invalid("tokens", e.to_string()))?
        .ok_or_else(no_ids)?;
    Ok(Json(DetokenizeResponse {
        content: text.clone(),
        prompt: text,
    }))
}
