//! `/metrics`, `/openapi.json` and the typed 404 for unknown routes.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;

use crate::error::ApiError;
use crate::openapi;
use crate::state::SharedState;

pub async fn metrics(State(state): State<SharedState>) -> impl IntoResponse {
    state.publish_pool_gauges();
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}

pub async fn openapi_json() -> impl IntoResponse {
    Json(openapi::combined())
}

pub async fn not_found(uri: axum::http::Uri) -> ApiError {
    ApiError::not_found("route", uri.path())
}
