//! What an admitted task holds from its tenant's quotas and its session's budget: reserved at
//! admission (its prompt and `max_tokens`), given back whole when the admission fails after
//! all, settled to what was served when the task ends (`quota.rs`, `sessions.rs`).

use contracts::{ErrorCode, Priority, TaskRequest};

use crate::error::ApiError;
use crate::lifecycle::quota::{InFlight, Ticket};
use crate::lifecycle::state::SharedLifecycle;

/// A task's reservation while its admission goes on.
pub(super) struct Reservation {
    /// Its tokens in the tenant's per-minute window (`None`: no per-minute quota).
    pub ticket: Option<Ticket>,
    /// Its session and the tokens reserved in its budget.
    session: Option<(String, u64)>,
}

impl Reservation {
    /// The admission failed after all: everything goes back.
    pub(super) fn refund(&self, state: &SharedLifecycle, owner: &str) {
        if let Some(t) = self.ticket {
            state.quotas.release(owner, t);
        }
        if let Some((sid, tokens)) = &self.session {
            state.sessions.settle(owner, sid, *tokens, 0);
        }
    }
}

/// Reserves `tokens` (prompt and `max_tokens`) of `priority` for `owner` in its quotas and the
/// request's session: 429 with the wait after which it would pass, 400 naming the field when
/// it never could (`retry_after_ms`: when a task of the tenant's is predicted to end, for the
/// at-once quotas).
pub(super) fn reserve(
    state: &SharedLifecycle,
    owner: &str,
    req: &TaskRequest,
    priority: Priority,
    tokens: u64,
    retry_after_ms: u64,
) -> Result<Reservation, ApiError> {
    let in_flight = || InFlight {
        unfinished: state.tasks.unfinished_of(owner),
        queued: state
            .queue
            .by_tenant()
            .iter()
            .find(|(t, _)| t == owner)
            .map_or(0, |(_, n)| *n),
    };
    let ticket = state
        .quotas
        .admit(
            owner,
            priority,
            tokens,
            in_flight,
            retry_after_ms,
            std::time::Instant::now(),
        )
        .map_err(|e| e.into_api())?;
    let held = Reservation {
        ticket,
        session: None,
    };
    let Some(sid) = &req.session_id else {
        return Ok(held);
    };
    if let Err(e) = state.sessions.reserve(owner, sid, tokens) {
        held.refund(state, owner);
        return Err(ApiError::new(
            ErrorCode::BudgetExceeded,
            e.to_string(),
            false,
        ));
    }
    Ok(Reservation {
        session: Some((sid.clone(), tokens)),
        ..held
    })
}
