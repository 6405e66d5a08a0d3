//! Embedding tasks at admission (issue 51): a request's `embed` checked into what the runner
//! embeds, and its inputs tokenized by a pool's engine — on the request-work threads in the
//! tenant's turn, each counted, one longer than the model takes refused naming it (unless
//! truncation is asked). Nothing caps the inputs of a request but the body limit and the
//! tenant's token quota.

use std::sync::Arc;

use contracts::{EmbedItem, EmbedTask, PoolingKind, TaskRequest};
use pool_manager::{EmbedInput, Pool, Pooling, PortError};

use crate::error::ApiError;
use crate::lifecycle::request_work::{Turn, WorkError};
use crate::lifecycle::state::SharedLifecycle;
use crate::lifecycle::task::{EmbedIds, EmbedSpec};

fn pooling_of(k: PoolingKind) -> Pooling {
    match k {
        PoolingKind::None => Pooling::None,
        PoolingKind::Mean => Pooling::Mean,
        PoolingKind::Cls => Pooling::Cls,
        PoolingKind::Last => Pooling::Last,
        PoolingKind::Rank => Pooling::Rank,
    }
}

/// Fields of a generation task an embedding task has no use for: set, they are refused.
fn generation_fields(req: &TaskRequest) -> Option<&'static str> {
    [
        ("prompt", req.prompt.is_some()),
        ("prompt_tokens", req.prompt_tokens.is_some()),
        ("messages", req.messages.is_some()),
        ("max_tokens", req.max_tokens.is_some()),
        ("temperature", req.temperature.is_some()),
        ("top_p", req.top_p.is_some()),
        ("top_k", req.top_k.is_some()),
        ("min_p", req.min_p.is_some()),
        ("stop", req.stop.is_some()),
        ("repetition_penalty", req.repetition_penalty.is_some()),
        ("presence_penalty", req.presence_penalty.is_some()),
        ("frequency_penalty", req.frequency_penalty.is_some()),
        ("json_schema", req.json_schema.is_some()),
        ("grammar", req.grammar.is_some()),
        ("logprobs", req.logprobs.is_some()),
        ("top_logprobs", req.top_logprobs.is_some()),
        (
            "continue_final_message",
            req.continue_final_message.is_some(),
        ),
        ("seed", req.seed.is_some()),
    ]
    .into_iter()
    .find_map(|(name, set)| set.then_some(name))
}

/// The embedding task of `req` checked: its inputs, pooling and options.
pub(super) fn validated(req: &TaskRequest, e: &EmbedTask) -> Result<EmbedSpec, ApiError> {
    if let Some(field) = generation_fields(req) {
        return Err(ApiError::invalid(
            field,
            format!("{field} is not for an embedding task (embed)"),
        ));
    }
    if e.input.is_empty() {
        return Err(ApiError::invalid("input", "input is empty"));
    }
    let mut pairs = 0;
    let inputs = e
        .input
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            EmbedItem::Text(t) if t.is_empty() => Err(ApiError::invalid(
                format!("input[{i}]"),
                "an input is a non-empty text",
            )),
            EmbedItem::Text(t) => Ok(EmbedInput::Text(t.clone())),
            EmbedItem::Tokens(ids) if ids.is_empty() => Err(ApiError::invalid(
                format!("input[{i}]"),
                "an input of token ids has at least one",
            )),
            EmbedItem::Tokens(ids) => Ok(EmbedInput::Tokens(ids.clone())),
            EmbedItem::Pair { query, .. } if query.is_empty() => Err(ApiError::invalid(
                format!("input[{i}].query"),
                "the query is empty",
            )),
            EmbedItem::Pair { query, document } => {
                pairs += 1;
                Ok(EmbedInput::Pair {
                    query: query.clone(),
                    document: document.clone(),
                })
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut pooling = e.pooling.map(pooling_of);
    if pairs > 0 {
        match pooling {
            None => pooling = Some(Pooling::Rank),
            Some(Pooling::Rank) => {}
            Some(other) => {
                return Err(ApiError::invalid(
                    "pooling",
                    format!(
                        "query-document pairs are scored (pooling rank), not pooled {}",
                        other.as_str()
                    ),
                ))
            }
        }
    }
    if e.dimensions == Some(0) {
        return Err(ApiError::invalid(
            "dimensions",
            "dimensions must be at least 1",
        ));
    }
    Ok(EmbedSpec {
        inputs,
        pooling,
        normalize: e.normalize.unwrap_or(true),
        truncate: e.truncate.unwrap_or(false),
        dimensions: e.dimensions.map(|d| d as usize),
    })
}

/// The inputs' size in tokens before any tokenizer ran: one per 4 bytes (the model's own
/// markers count two), for budgets and predictions only.
pub(super) fn estimated_tokens(spec: &EmbedSpec) -> usize {
    spec.inputs
        .iter()
        .map(|i| i.bytes().div_ceil(4) + 2)
        .sum::<usize>()
        .max(1)
}

/// The inputs counted by a loaded engine of `pools` (exact), with their ids when it made
/// them; checked against what the engine embeds. Without a loaded engine (a model loading on
/// demand) the count is an estimate and the runner tokenizes.
pub async fn count_inputs(
    state: &SharedLifecycle,
    turn: Turn<'_>,
    pools: &[Arc<Pool>],
    spec: &EmbedSpec,
) -> Result<(usize, Option<EmbedIds>), ApiError> {
    let Some(engine) = pools.iter().find_map(|p| p.engine()) else {
        return Ok((estimated_tokens(spec), None));
    };
    let desc = engine.descriptor();
    let Some(info) = desc.embedding else {
        return Err(ApiError::invalid(
            "model",
            format!("{} does not embed", desc.model_name),
        ));
    };
    if spec.pooling == Some(Pooling::Rank) && !info.ranks {
        return Err(ApiError::invalid(
            "model",
            format!(
                "{} has no classification head: it embeds, it does not rank",
                desc.model_name
            ),
        ));
    }
    // a width of 0 is one the engine does not know (a remote worker's backend checks)
    if let Some(d) = spec.dimensions.filter(|&d| info.dims > 0 && d > info.dims) {
        return Err(ApiError::invalid(
            "dimensions",
            format!("{d} dimensions; the model's vectors have {}", info.dims),
        ));
    }
    let (inputs, truncate) = (spec.inputs.clone(), spec.truncate);
    let e = engine.clone();
    let counted = state
        .request_work
        .run(turn, move || {
            inputs
                .iter()
                .enumerate()
                .map(|(i, input)| e.embed_tokens(input, truncate).map_err(|err| (i, err)))
                .collect::<Result<Vec<_>, _>>()
        })
        .await
        .map_err(|e: WorkError| e.into_api("input"))?;
    let ids = match counted {
        Ok(ids) => ids,
        Err((i, PortError::InvalidInput(why))) => {
            let hint = if truncate {
                ""
            } else {
                " (truncate: true cuts it to fit)"
            };
            return Err(ApiError::invalid(
                format!("input[{i}]"),
                format!("input {i}: {why}{hint}"),
            ));
        }
        Err((i, other)) => return Err(WorkError::Port(other).into_api(&format!("input[{i}]"))),
    };
    // what the answer will hold: a vector per input, or per token under pooling none
    let tokens_of = |ids: &[Option<Vec<u32>>]| -> usize {
        ids.iter().map(|i| i.as_ref().map_or(0, Vec::len)).sum()
    };
    let vectors = match spec.pooling {
        Some(Pooling::None) => tokens_of(&ids).max(spec.inputs.len()),
        _ => spec.inputs.len(),
    };
    let limit = state.cfg.admission.max_embedding_output_mib << 20;
    if vectors.saturating_mul(info.dims).saturating_mul(4) > limit {
        return Err(ApiError::invalid(
            "input",
            format!(
                "{vectors} vectors of {} dimensions are over the {} MiB an answer may hold: send fewer inputs a request",
                info.dims,
                state.cfg.admission.max_embedding_output_mib
            ),
        ));
    }
    // an engine that takes text (a remote worker) counts on its side: an estimate here
    match ids.into_iter().collect::<Option<Vec<_>>>() {
        Some(ids) => Ok((
            ids.iter().map(Vec::len).sum(),
            Some(EmbedIds {
                model_ref: desc.model_ref,
                ids: Arc::new(ids),
            }),
        )),
        None => Ok((estimated_tokens(spec), None)),
    }
}
