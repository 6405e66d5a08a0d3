//! `GET /v1/tenants` (admin): the fair share's view of each tenant — weight, tasks queued and
//! running, its share of the queue, the service it received, its quotas.

use axum::extract::State;
use axum::Json;
use contracts::{TenantList, TenantStatus};

use crate::app_state::SharedState;

/// Tenants: configured ones, those with keys, those served so far (idle ones too) and those
/// with tasks queued or running.
#[utoipa::path(
    get, operation_id = "listTenants", path = "/v1/tenants", tag = "control",
    responses((status = 200, description = "Each tenant's weight, tasks, share and quotas", body = TenantList))
)]
pub async fn list(State(state): State<SharedState>) -> Json<TenantList> {
    let queued = state.queue.by_tenant();
    let running = state.running.owners();
    let fair = state.queue.fair();
    let mut names: Vec<String> = state.quotas.configured().map(str::to_string).collect();
    let known = fair.known();
    let keyed = state.auth.keys.tenants();
    for t in keyed
        .iter()
        .chain(&known)
        .chain(queued.iter().map(|(t, _)| t))
        .chain(&running)
    {
        if !names.contains(t) {
            names.push(t.clone());
        }
    }
    let capacity = state.queue.capacity();
    let tenants = names
        .iter()
        .map(|t| {
            let q = queued.iter().find(|(o, _)| o == t).map_or(0, |(_, n)| *n);
            let limits = state.quotas.limits(t);
            TenantStatus {
                tenant: t.clone(),
                weight: fair.weight(t),
                queued: q as u32,
                running: running.iter().filter(|o| *o == t).count() as u32,
                // under fifo everyone shares the whole line
                queue_share: state.queue.share_of(t).unwrap_or(capacity as f64),
                weighted_tokens_served: fair.served(t),
                max_concurrent: limits.and_then(|l| l.max_concurrent).map(|n| n as u64),
                max_queued: limits.and_then(|l| l.max_queued).map(|n| n as u64),
                tokens_per_minute: limits.and_then(|l| l.tokens_per_minute),
                requests_per_minute: limits.and_then(|l| l.requests_per_minute),
                max_priority: limits.and_then(|l| l.max_priority),
            }
        })
        .collect();
    Json(TenantList {
        fairness: fair.mode().label().to_string(),
        queue_capacity: capacity as u32,
        tenants,
    })
}
