//! A task admitted on another replica of the cluster, built here from its handoff: to run it
//! (its prompt tokenized for the pool whose queue it came from) or to follow it (its events
//! come from the relay). It is checked as admission checks a request, against this replica's
//! limits; it holds no reservation of its own — the admitting replica holds the tenant's quota
//! and session budget and settles them when the task ends.

use std::sync::Arc;
use std::time::Duration;

use contracts::Priority;

use crate::error::ApiError;
use crate::lifecycle::admission::{
    count_inputs, count_prompt, prepare_constraint, redact, validate,
};
use crate::lifecycle::handoff::{unix_ms, Handoff};
use crate::lifecycle::request_work::{PromptIds, Turn};
use crate::lifecycle::state::SharedLifecycle;
use crate::lifecycle::task::{NewTask, Task};

/// What the task is built for.
pub enum Purpose<'a> {
    /// Running it on `pool` (pinned there: the pool's queue is where it was taken from);
    /// `counted`: its prompt's ids as this replica's admission counted them, used when the
    /// pool's engine is the model that counted them (no second tokenization).
    Run {
        pool: &'a str,
        counted: Option<&'a PromptIds>,
    },
    /// Following it while another replica runs it.
    Follow,
}

/// Builds the task of `h` for `purpose`.
pub async fn build(
    state: &SharedLifecycle,
    h: &Handoff,
    purpose: Purpose<'_>,
) -> Result<Arc<Task>, ApiError> {
    let req = &h.request;
    let v = validate(state, req)?;
    let follows = matches!(purpose, Purpose::Follow);
    let (pin, prompt_tokens, prompt_ids, embed_ids, ctx) = match purpose {
        Purpose::Run { pool, counted } => {
            let p = state.pools.get(pool).ok_or_else(|| {
                ApiError::invalid("pool_id", format!("pool {pool:?} is not on this replica"))
            })?;
            let ctx = p.engine().map_or(0, |e| e.descriptor().ctx_max);
            let pools = [p];
            let turn = Turn::Admitted(&h.owner);
            if let Some(spec) = &v.embed {
                // an embedding task: its inputs counted (and checked) by this pool's engine
                let (n, ids) = count_inputs(state, turn, &pools, spec).await?;
                (Some(pool.to_string()), n, None, ids, ctx)
            } else {
                let model_ref = pools[0].engine().map(|e| e.descriptor().model_ref.clone());
                let (n, ids) = match counted.filter(|c| Some(&c.model_ref) == model_ref.as_ref()) {
                    Some(c) => (c.ids.len(), Some(c.clone())),
                    None => count_prompt(state, turn, &pools, &v).await?,
                };
                if let Some(c) = &v.constraint {
                    prepare_constraint(state, turn, &pools, c).await?;
                }
                (Some(pool.to_string()), n, ids, None, ctx)
            }
        }
        Purpose::Follow => (req.pool_id.clone(), h.prompt_tokens as usize, None, None, 0),
    };
    // the deadline counts from the admission, wherever that was
    let waited = Duration::from_millis(unix_ms().saturating_sub(h.admitted_unix_ms));
    let deadline = req
        .deadline_ms
        .map(|d| Duration::from_millis(d).saturating_sub(waited));
    Ok(Arc::new(Task::new(NewTask {
        id: h.task_id.clone(),
        owner: h.owner.clone(),
        correlation_id: h.correlation_id.clone(),
        priority: req.priority.unwrap_or(Priority::Interactive),
        // the session's budget is the admitting replica's to settle
        session_id: None,
        pin,
        model: req.model.clone(),
        spec: v.into_spec(),
        prompt_tokens,
        prompt_ids,
        conversation: req
            .prompt_cache_key
            .as_deref()
            .or(req.session_id.as_deref())
            .map(|k| crate::lifecycle::placement::ConversationKey::of(&h.owner, k)),
        embed_ids,
        params: redact(req),
        ctx,
        deadline,
        start_by: None,
        start_by_servers: false,
        rank: None,
        predicted_start: Duration::ZERO,
        last_attempt: false,
        claimant: None,
        quota_ticket: None,
        // a followed task's record times it from its admission; a run's from when it was
        // taken here (its record is the followers')
        admitted_ago: if follows { waited } else { Duration::ZERO },
    })))
}
