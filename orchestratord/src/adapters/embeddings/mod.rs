//! Embeddings and rerank in every API's own shape (issue 51): OpenAI's `/v1/embeddings`,
//! Ollama's `/api/embed` and `/api/embeddings`, llama-server's `/embedding(s)`, and rerank in
//! Cohere's and Jina's shape (`/rerank`, `/v1/rerank`, llama-server's `/reranking` too).
//! Each request is one embedding task like any other adapter's — admitted, queued (429 with
//! `Retry-After` when full), counted in the tenant's token quota, placed on a pool serving the
//! model (loaded on demand from the models folder), cancelled when the client leaves,
//! recorded — whose `end` event carries the vectors. The engine batches the inputs of the
//! requests it holds in one pass.

pub mod llama_server;
pub mod ollama;
pub mod openai;
pub mod rerank;

use std::sync::Arc;

use contracts::{EmbedTask, EmbedVectors, Priority, TaskRequest};

use crate::adapters::follow;
use crate::app_state::SharedState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::lifecycle::deadline::Delivery;
use crate::lifecycle::task::Task;

/// An embedding task's answer.
pub struct Embedded {
    pub vectors: EmbedVectors,
    /// The inputs' tokens, as the model read them.
    pub prompt_tokens: u32,
    /// The model to report: what the client named, else what ran it.
    pub model: String,
    pub task: Arc<Task>,
}

/// Admits `embed` for `model` and waits for its vectors; the client leaving cancels it.
pub async fn embed(
    state: &SharedState,
    caller: &Caller,
    model: Option<String>,
    embed: EmbedTask,
    priority: Option<Priority>,
) -> Result<Embedded, ApiError> {
    let req = TaskRequest {
        model: model.clone(),
        embed: Some(embed),
        priority,
        ..Default::default()
    };
    let task = follow::admit(state, req, caller, Delivery::of(false)).await?;
    let (_, end) = follow::collect(follow::subscribe(state, &task)).await?;
    let vectors = end
        .embeddings
        .ok_or_else(|| ApiError::internal("the embedding task ended without its vectors"))?;
    Ok(Embedded {
        prompt_tokens: task.prompt_tokens_used(),
        model: follow::model_name(state, model.as_deref(), &task),
        vectors,
        task,
    })
}

/// Each input's one vector, for the APIs that answer one per input (a model whose pooling is
/// `none` gives one per token: those are `/embeddings`' to give).
pub fn one_each(vectors: EmbedVectors) -> Result<Vec<Vec<f32>>, ApiError> {
    vectors
        .into_iter()
        .enumerate()
        .map(|(i, mut v)| match v.len() {
            1 => Ok(v.remove(0)),
            _ => Err(ApiError::invalid(
                format!("input[{i}]"),
                "this model pools nothing (pooling none: a vector per token); llama-server's /embeddings gives those",
            )),
        })
        .collect()
}

/// A refusal that names an input (`input[3]`) renamed as the API spells its inputs
/// (`documents[3]`, `prompt`).
pub fn inputs_named(mut e: ApiError, api_field: &str) -> ApiError {
    if let Some(f) = e.envelope.field.as_deref() {
        if let Some(rest) = f.strip_prefix("input") {
            e.envelope.field = Some(format!("{api_field}{rest}"));
        }
    }
    e
}
