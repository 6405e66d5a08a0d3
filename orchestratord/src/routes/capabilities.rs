//! `/v1/capabilities`: discovery, built from the live pools.

use axum::extract::State;
use axum::Json;
use contracts::{Capabilities, PoolCapability, QueueCapability, API_VERSION};

use crate::app_state::SharedState;

/// Features this server implements, for clients to check.
pub const FEATURES: &[&str] = &[
    "sse",
    "cancel",
    "pin_override",
    "sessions",
    "budgets",
    "artifacts",
    "deadlines",
    "drop_lru",
];

/// What the pools serve now, and the admission limits.
#[utoipa::path(
    get, operation_id = "getCapabilities", path = "/v1/capabilities", tag = "control",
    responses((status = 200, description = "Capabilities of the live pools", body = Capabilities))
)]
pub async fn get(State(state): State<SharedState>) -> Json<Capabilities> {
    let max_out = state.cfg.admission.max_tokens_out;
    let pools = state
        .pools
        .all()
        .into_iter()
        .map(|p| {
            let s = p.snapshot();
            let d = s.descriptor.clone();
            PoolCapability {
                pool_id: s.id.clone(),
                kind: p.spec().kind().to_string(),
                engine: d.as_ref().map(|d| d.engine.clone()).unwrap_or_default(),
                engine_version: d
                    .as_ref()
                    .map(|d| d.engine_version.clone())
                    .unwrap_or_default(),
                model_ref: d
                    .as_ref()
                    .map(|d| d.model_ref.clone())
                    .unwrap_or_else(|| p.spec().model_ref.clone()),
                ctx_max: d.as_ref().map(|d| d.ctx_max as u32).unwrap_or(0),
                max_tokens_out: max_out,
                slots: s.slots_total as u32,
                state: s.state.as_str().to_string(),
                supported_workloads: vec!["completion".into(), "chat".into()],
            }
        })
        .collect();
    Json(Capabilities {
        api_version: API_VERSION.to_string(),
        pools,
        queue: QueueCapability {
            capacity: state.queue.capacity() as u32,
            policy: state.queue.policy().label().to_string(),
        },
        features: FEATURES.iter().map(|s| s.to_string()).collect(),
        hyperswarm: state.hyperswarm.get().map(|report| report()),
    })
}
