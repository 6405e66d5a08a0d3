//! `GET /props` and `GET /slots`: a pool as llama-server describes itself — its slots, their
//! context, its model and template, and what each slot runs now.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::Json;
use pool_manager::Pool;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::settings::GenerationSettings;
use crate::app_state::SharedState;
use crate::auth::{Caller, Scope};
use crate::error::openai::OpenAiError;
use crate::error::ApiError;

/// Which pool (llama-server's router mode names a model in `?model=`).
#[derive(Debug, Deserialize, IntoParams)]
pub struct ModelQuery {
    /// The model (alias, name or pool id); the first pool when absent.
    pub model: Option<String>,
}

fn pool_of(state: &SharedState, model: Option<&str>) -> Result<Arc<Pool>, ApiError> {
    let pools = state.pools.all();
    let found = match model {
        Some(m) => {
            let serving: Vec<&Arc<Pool>> = pools.iter().filter(|p| p.serves(m)).collect();
            // the one that is loaded, if any
            serving
                .iter()
                .find(|p| p.engine().is_some())
                .or_else(|| serving.first())
                .map(|p| (*p).clone())
        }
        None => pools.first().cloned(),
    };
    found.ok_or_else(|| ApiError::not_found("model", model.unwrap_or("")).with_field("model"))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DefaultSettings {
    pub params: GenerationSettings,
    /// Context per slot.
    pub n_ctx: usize,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Modalities {
    pub vision: bool,
    pub video: bool,
    pub audio: bool,
}

/// llama-server's `/props`.
#[derive(Debug, Serialize, ToSchema)]
pub struct PropsResponse {
    pub default_generation_settings: DefaultSettings,
    pub total_slots: usize,
    pub model_alias: String,
    pub model_path: String,
    /// The weights' quantization (`Q4_1`, …); null until the model is loaded.
    pub model_ftype: Option<String>,
    pub modalities: Modalities,
    pub endpoint_slots: bool,
    pub endpoint_props: bool,
    pub endpoint_metrics: bool,
    /// The chat template in use (the pool's configured one, or the model's); null until the
    /// model is loaded.
    pub chat_template: Option<String>,
    pub build_info: String,
}

/// A pool's properties, as llama-server gives its own.
#[utoipa::path(
    get, operation_id = "llamaServerProps", path = "/props", tag = "llama-server",
    params(ModelQuery),
    responses(
        (status = 200, description = "The pool's slots, context, model and template, and the sampler defaults of `/completion`", body = PropsResponse),
        (status = 404, description = "No pool serves the model", body = crate::error::openai::ErrorBody, example = crate::examples::openai_not_found),
    )
)]
pub async fn props(
    State(state): State<SharedState>,
    Query(q): Query<ModelQuery>,
) -> Result<Json<PropsResponse>, OpenAiError> {
    let pool = pool_of(&state, q.model.as_deref())?;
    let spec = pool.spec();
    let facts = pool.engine().and_then(|e| e.descriptor().facts);
    let (template, ftype) = match facts {
        Some(f) => (f.chat_template, Some(f.quantization)),
        None => (None, None),
    };
    Ok(Json(PropsResponse {
        default_generation_settings: DefaultSettings {
            params: GenerationSettings::defaults(),
            n_ctx: pool.served_context(),
        },
        total_slots: spec.slots,
        model_alias: spec.model_alias.clone(),
        model_path: spec.model_ref.clone(),
        model_ftype: ftype,
        modalities: Modalities {
            vision: false,
            video: false,
            audio: false,
        },
        endpoint_slots: true,
        // `POST /props` (changing settings at run time) is not served
        endpoint_props: false,
        endpoint_metrics: true,
        chat_template: template,
        build_info: format!("orchestratord {}", env!("CARGO_PKG_VERSION")),
    }))
}

/// How far a slot's task got.
#[derive(Debug, Serialize, ToSchema)]
pub struct NextToken {
    pub has_next_token: bool,
    pub has_new_line: bool,
    /// Tokens it may still produce.
    pub n_remain: i64,
    pub n_decoded: u32,
}

/// A slot: idle, or the task it runs (its id only to its own tenant and admins).
#[derive(Debug, Serialize, ToSchema)]
pub struct Slot {
    /// The slot's place among the pool's running tasks, by start (slots are counted here,
    /// not numbered).
    pub id: usize,
    pub n_ctx: usize,
    pub speculative: bool,
    pub is_processing: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id_task: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n_prompt_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub params: Option<GenerationSettings>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_token: Option<Vec<NextToken>>,
}

/// The pool's slots and what each runs now.
#[utoipa::path(
    get, operation_id = "llamaServerSlots", path = "/slots", tag = "llama-server",
    params(ModelQuery),
    responses(
        (status = 200, description = "Every slot of the pool: the busy ones first, each with its task's prompt size, settings and progress", body = [Slot]),
        (status = 404, description = "No pool serves the model", body = crate::error::openai::ErrorBody, example = crate::examples::openai_not_found),
    )
)]
pub async fn slots(
    State(state): State<SharedState>,
    caller: Caller,
    Query(q): Query<ModelQuery>,
) -> Result<Json<Vec<Slot>>, OpenAiError> {
    let pool = pool_of(&state, q.model.as_deref())?;
    let n_ctx = pool.served_context();
    let total = pool.spec().slots;
    let admin = caller.principal.scope == Scope::Admin;
    let running = state.running.tasks_on(pool.id());
    let mut out: Vec<Slot> = running
        .iter()
        .take(total)
        .enumerate()
        .map(|(id, t)| {
            let (decoded, newline) = {
                let g = t.lock();
                let newline = g.events.iter().any(
                    |e| matches!(e, crate::lifecycle::task::TaskEvent::Token(t) if t.t.contains('\n')),
                );
                (g.tokens_out, newline)
            };
            let mine = admin || t.owner == caller.tenant();
            Slot {
                id,
                n_ctx,
                speculative: false,
                is_processing: true,
                id_task: mine.then(|| t.id.clone()),
                n_prompt_tokens: Some(t.prompt_tokens_used()),
                params: Some(GenerationSettings::of(&t.spec, None)),
                next_token: Some(vec![NextToken {
                    has_next_token: true,
                    has_new_line: newline,
                    n_remain: t.spec.max_tokens as i64 - decoded as i64,
                    n_decoded: decoded,
                }]),
            }
        })
        .collect();
    for id in out.len()..total {
        out.push(Slot {
            id,
            n_ctx,
            speculative: false,
            is_processing: false,
            id_task: None,
            n_prompt_tokens: None,
            params: None,
            next_token: None,
        });
    }
    Ok(Json(out))
}
