//! `/metrics`, `/openapi.json` and the typed 404 for unknown routes.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::{Extension, Json};

use crate::app_state::SharedState;
use crate::auth::{Principal, Scope};
use crate::error::ApiError;
use crate::openapi;

/// The Prometheus text. Prompt-cache series (how many prompt tokens came from a cache) would
/// tell a tenant whether a prefix it guessed was sent by another, and the per-tenant series
/// name every tenant and what it was served (SEC-MET-1), so with keys configured both are
/// shown to admin keys only (a scrape config gives Prometheus one as its bearer token). The vLLM-named gauges are left out unless
/// `metrics.vllm_names`.
pub async fn metrics(
    State(state): State<SharedState>,
    principal: Option<Extension<Principal>>,
) -> impl IntoResponse {
    state.publish_pool_gauges();
    if let Some(cluster) = state.cluster_tasks.get() {
        cluster.publish_gauges().await;
    }
    crate::metrics::process();
    let text = state.metrics.render();
    let admin = principal.is_some_and(|Extension(p)| p.scope == Scope::Admin);
    // with keys, what tenants there are and what each was served is for admins (SEC-MET-1)
    let hide_cache = !admin && state.auth.enabled();
    let hide_vllm = !state.cfg.metrics.vllm_names;
    let body = if !hide_cache && !hide_vllm {
        text
    } else {
        text.lines()
            .filter(|l| {
                !(hide_cache
                    && (l.contains(crate::metrics::PROMPT_CACHE_PREFIX)
                        || l.contains(contracts::metric_names::TENANT_PREFIX)))
            })
            .filter(|l| !(hide_vllm && l.contains(crate::metrics::VLLM_PREFIX)))
            .flat_map(|l| [l, "\n"])
            .collect()
    };
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body)
}

pub async fn openapi_json(State(state): State<SharedState>) -> impl IntoResponse {
    Json(openapi::combined(&state.cfg))
}

/// An unknown route: 404 in the shape of the API its path belongs to.
pub async fn not_found(
    method: axum::http::Method,
    uri: axum::http::Uri,
) -> axum::response::Response {
    let (_, shape) = crate::auth::routes::classify(&method, uri.path());
    crate::auth::respond(shape, ApiError::not_found("route", uri.path()))
}
