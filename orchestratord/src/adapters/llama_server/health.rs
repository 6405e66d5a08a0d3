//! `/health` in llama-server's shape (`http.health_shape = "llama-server"`, or a command line
//! written with llama-server's flags): 200 `{"status":"ok"}` while a pool serves (or, with
//! nothing loaded and nothing loading, a model folder loads on demand); 503 with its error
//! body while the model loads, and when nothing can serve.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::app_state::SharedState;

fn unavailable(message: &str) -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({"error": {"code": 503, "message": message, "type": "unavailable_error"}})),
    )
        .into_response()
}

/// llama-server's answer to `GET /health`.
pub fn answer(state: &SharedState) -> Response {
    if state.is_shutting_down() {
        return unavailable("Server is shutting down");
    }
    let pools = state.pools.all();
    let serving = pools.iter().any(|p| p.accepts_work());
    let loading = pools
        .iter()
        .any(|p| p.state() == pool_manager::PoolState::Loading);
    let on_demand = state.cfg.models.on_demand && !state.models_folder.catalog.is_empty();
    if serving || (!loading && on_demand) {
        return Json(json!({"status": "ok"})).into_response();
    }
    if loading {
        return unavailable("Loading model");
    }
    unavailable("No model is loaded")
}
