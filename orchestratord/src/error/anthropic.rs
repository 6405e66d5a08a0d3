//! The error shape of Anthropic's Messages API: `{"type": "error", "error": {"type",
//! "message"}}`, with the task API's statuses and backoff headers (`retry-after`, which the
//! `anthropic` SDK honours).

use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::{shaped_response, ApiError};

/// An error answered in Anthropic's shape.
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

/// The inner object.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = AnthropicErrorDetail)]
pub struct ErrorDetail {
    /// `invalid_request_error` | `authentication_error` | `permission_error` |
    /// `not_found_error` | `request_too_large` | `rate_limit_error` | `overloaded_error` |
    /// `api_error`
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub message: String,
}

/// `{"type": "error", "error": {…}}`.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = AnthropicErrorBody, example = json!({"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: field required"}}))]
pub struct ErrorBody {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub error: ErrorDetail,
}

/// Anthropic's error `type` for a status.
fn kind_of(status: u16) -> &'static str {
    match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        s if (400..500).contains(&s) => "invalid_request_error",
        _ => "api_error",
    }
}

/// The body of `e`, the field at fault named in the message.
pub fn body(e: &contracts::ErrorEnvelope) -> ErrorBody {
    let status = crate::error::status_of(e.code).as_u16();
    let message = match &e.field {
        Some(f) if !e.message.contains(f.as_str()) => format!("{f}: {}", e.message),
        _ => e.message.clone(),
    };
    ErrorBody {
        kind: "error",
        error: ErrorDetail {
            kind: kind_of(status),
            message,
        },
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        shaped_response(&self.0, body(&self.0.envelope))
    }
}
