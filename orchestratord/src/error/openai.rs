//! The error shape all chat adapters answer (OpenAI's, which the Kolosal and seed-001 APIs
//! share): `{"error": {message, type, param, code}}`, with the task API's statuses and backoff
//! headers.

use axum::response::{IntoResponse, Response};
use contracts::ErrorCode;
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::{status_of, ApiError};

/// An error answered in OpenAI's shape.
pub struct OpenAiError(pub ApiError);

impl From<ApiError> for OpenAiError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

/// The inner object of an OpenAI-shaped error.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorDetail {
    pub message: String,
    /// `invalid_request_error` | `not_found_error` | `rate_limit_error` | `server_error`
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    /// Our stable error code (`ADMISSION_REJECT`, `INVALID_PARAMS`, …).
    pub code: ErrorCode,
}

/// `{"error": {…}}`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// OpenAI's `type` for one of our codes.
pub fn error_type(code: ErrorCode) -> &'static str {
    let status = status_of(code);
    if status.as_u16() == 429 {
        "rate_limit_error"
    } else if status.as_u16() == 404 {
        "not_found_error"
    } else if status.is_client_error() {
        "invalid_request_error"
    } else {
        "server_error"
    }
}

/// The `{"error": …}` body.
pub fn body(e: &contracts::ErrorEnvelope) -> ErrorBody {
    ErrorBody {
        error: ErrorDetail {
            message: e.message.clone(),
            kind: error_type(e.code),
            param: e.field.clone(),
            code: e.code,
        },
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        crate::error::shaped_response(&self.0, body(&self.0.envelope))
    }
}
