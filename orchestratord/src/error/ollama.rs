//! The error shape of Ollama's native API: `{"error": "…"}`, with the task API's statuses and
//! backoff headers (the `ollama` client raises it as `ResponseError(error, status_code)`).

use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

use crate::error::{shaped_response, ApiError};

/// An error answered in Ollama's shape.
pub struct OllamaError(pub ApiError);

impl From<ApiError> for OllamaError {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

/// `{"error": "…"}`: the message, prefixed by the field at fault when the message does not
/// name it.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = OllamaErrorBody, example = json!({"error": "model \"llama3\" not found"}))]
pub struct ErrorBody {
    pub error: String,
}

/// The body of `e`.
pub fn body(e: &contracts::ErrorEnvelope) -> ErrorBody {
    let error = match &e.field {
        Some(f) if !e.message.contains(f.as_str()) => format!("{f}: {}", e.message),
        _ => e.message.clone(),
    };
    ErrorBody { error }
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        shaped_response(&self.0, body(&self.0.envelope))
    }
}
