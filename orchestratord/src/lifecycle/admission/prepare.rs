//! The work a request brings before it is admitted — its prompt templated and tokenized, its
//! grammar compiled — on the request-work threads in its tenant's turn (ISO-1), and what that
//! work shows: the prompt's size against the context, a constraint that cannot be followed.
//! The work counts in the tenant's requests per minute: refused before it when over them, and
//! counted when it shows the client's mistake.

use std::sync::Arc;
use std::time::Instant;

use contracts::ErrorCode;
use pool_manager::{OutputConstraint, Pool, PortError, PromptInput};

use crate::error::ApiError;
use crate::lifecycle::request_work::{PromptIds, Turn, WorkError};
use crate::lifecycle::state::SharedLifecycle;
use crate::lifecycle::task::EmbedIds;

use super::request::{estimated_tokens, Validated};

/// The prompt as the pools will run it.
pub(super) struct Prepared {
    /// Prompt tokens (exact when `ids` is there, else an estimate).
    pub n_prompt: usize,
    pub ids: Option<PromptIds>,
    /// An embedding task's inputs as token ids.
    pub embed_ids: Option<EmbedIds>,
    /// The largest context of the pools' loaded engines (0: none loaded).
    pub ctx: usize,
}

/// Prepares the prompt of `v` for `pools` in `owner`'s turn and checks what the work shows.
pub(super) async fn prepare(
    state: &SharedLifecycle,
    owner: &str,
    pools: &[Arc<Pool>],
    v: &Validated,
) -> Result<Prepared, ApiError> {
    state
        .quotas
        .check_requests(owner, Instant::now())
        .map_err(crate::lifecycle::quota::OverQuota::into_api)?;
    let charged = |e: ApiError| {
        if e.code() == ErrorCode::InvalidParams {
            state.quotas.charge_refused(owner, Instant::now());
        }
        e
    };
    let ctx = pools
        .iter()
        .filter_map(|p| p.engine().map(|e| e.descriptor().ctx_max))
        .max()
        .unwrap_or(0);
    if let Some(spec) = &v.embed {
        let (n_prompt, embed_ids) =
            super::embed::count_inputs(state, Turn::Request(owner), pools, spec)
                .await
                .map_err(charged)?;
        return Ok(Prepared {
            n_prompt,
            ids: None,
            embed_ids,
            ctx,
        });
    }
    if let Some(e) = pools.iter().find_map(|p| p.engine()) {
        let d = e.descriptor();
        if !d.generates {
            return Err(charged(ApiError::invalid(
                "model",
                format!(
                    "{} is an embedding model: it embeds and ranks, it does not generate text",
                    d.model_name
                ),
            )));
        }
    }
    let (n_prompt, ids) = count_prompt(state, Turn::Request(owner), pools, v)
        .await
        .map_err(charged)?;
    if let Some(c) = &v.constraint {
        prepare_constraint(state, Turn::Request(owner), pools, c)
            .await
            .map_err(charged)?;
    }
    let no_logprobs = pools
        .iter()
        .find_map(|p| p.engine())
        .is_some_and(|e| !e.gives_logprobs());
    if v.logprobs.is_some() && no_logprobs {
        return Err(ApiError::invalid(
            "logprobs",
            "this pool's engine does not report log-probabilities",
        ));
    }
    if n_prompt == 0 {
        return Err(charged(ApiError::invalid(
            "prompt",
            "the prompt has no tokens",
        )));
    }
    if ids.is_some() && ctx > 0 && n_prompt + v.max_tokens > ctx {
        return Err(charged(ApiError::invalid(
            "max_tokens",
            format!(
                "prompt of {n_prompt} tokens plus max_tokens {} exceeds the context of {ctx} tokens",
                v.max_tokens
            ),
        )));
    }
    Ok(Prepared {
        n_prompt,
        ids,
        embed_ids: None,
        ctx,
    })
}

/// Prompt tokens, counted by the tokenizer of a pool that would run the task, and whether the
/// count is exact. Engines that take text (remote workers) count on their side; without a
/// local tokenizer the count is an estimate of one token per 4 bytes, for budgets only.
/// The ids come with the count when a local tokenizer made it (exact); they go with the task so
/// the runner does not tokenize again.
pub async fn count_prompt(
    state: &SharedLifecycle,
    turn: Turn<'_>,
    pools: &[Arc<Pool>],
    v: &Validated,
) -> Result<(usize, Option<PromptIds>), ApiError> {
    for engine in pools.iter().filter_map(|p| p.engine()) {
        let counted = state
            .request_work
            .tokenize(turn, engine, &v.prompt, &v.continuation)
            .await
            .map_err(|e| {
                let field = match v.prompt {
                    PromptInput::Chat(_) => "messages",
                    PromptInput::Tokens(_) => "prompt_tokens",
                    PromptInput::Text(_) => "prompt",
                };
                e.into_api(field)
            })?;
        if let Some(ids) = counted {
            return Ok((ids.ids.len(), Some(ids)));
        }
    }
    Ok((estimated_tokens(&v.prompt, &v.continuation), None))
}

/// Compiles the constraint for a loaded engine of the pools that would run the task (engines
/// remember what they compiled: the run then starts from it), so a schema or grammar that does
/// not compile, or pools with no constrained decoding, are refused before the task queues.
/// Without a loaded engine the run compiles it (a failure then ends the task).
pub async fn prepare_constraint(
    state: &SharedLifecycle,
    turn: Turn<'_>,
    pools: &[Arc<Pool>],
    c: &OutputConstraint,
) -> Result<(), ApiError> {
    let Some(engine) = pools.iter().find_map(|p| p.engine()) else {
        return Ok(());
    };
    state
        .request_work
        .prepare_constraint(turn, engine, c)
        .await
        .map_err(|e| match e {
            // whatever the engine says of a constraint is about the client's
            WorkError::Port(PortError::InvalidInput(m) | PortError::Load(m)) => {
                ApiError::invalid(c.field(), m)
            }
            other => other.into_api(c.field()),
        })
}
