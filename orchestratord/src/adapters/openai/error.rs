//! OpenAI-shaped errors: `{"error": {message, type, param, code}}`, same statuses and backoff
//! headers as the task API.

use axum::response::{IntoResponse, Response};
use axum::Json;
use contracts::ErrorCode;
use serde_json::json;

use crate::error::{backoff_headers, status_of, ApiError};

/// An error answered in OpenAI's shape.
pub struct OpenAiError(pub ApiError);

impl From<ApiError> for OpenAiError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

/// OpenAI's `type` for one of our codes.
pub fn error_type(code: ErrorCode) -> &'static str {
    let status = status_of(code);
    if status.as_u16() == 429 {
        "rate_limit_error"
    } else if status.is_client_error() {
        "invalid_request_error"
    } else {
        "server_error"
    }
}

/// The `{"error": …}` body.
pub fn body(e: &contracts::ErrorEnvelope) -> serde_json::Value {
    json!({"error": {
        "message": e.message,
        "type": error_type(e.code),
        "param": e.field,
        "code": e.code.as_str(),
    }})
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let env = &self.0.envelope;
        crate::metrics::error(env.code);
        let mut resp = (status_of(env.code), Json(body(env))).into_response();
        backoff_headers(resp.headers_mut(), env.retry_after_ms);
        resp
    }
}
