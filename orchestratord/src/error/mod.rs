//! The data/control-plane error type, its one mapping to HTTP, and each protocol's error shape
//! (`openai`: the one the chat adapters and auth answer in; `ollama`: Ollama's native API;
//! `anthropic`: the Messages API).

pub mod anthropic;
pub mod ollama;
pub mod openai;

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use contracts::{ErrorCode, ErrorEnvelope};

/// An error answered to a client: a status, the typed envelope, and backoff headers.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub envelope: Box<ErrorEnvelope>,
}

/// The HTTP status of each code. The only place codes meet statuses.
pub fn status_of(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::InvalidParams => StatusCode::BAD_REQUEST,
        ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
        ErrorCode::Forbidden => StatusCode::FORBIDDEN,
        ErrorCode::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ErrorCode::NotFound => StatusCode::NOT_FOUND,
        ErrorCode::Conflict => StatusCode::CONFLICT,
        ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::DeadlineUnmet => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorCode::AdmissionReject
        | ErrorCode::QueueFullDropLru
        | ErrorCode::BudgetExceeded
        | ErrorCode::AuthRateLimited => StatusCode::TOO_MANY_REQUESTS,
        ErrorCode::PoolUnready
        | ErrorCode::PoolUnavailable
        | ErrorCode::ReplicaExhausted
        | ErrorCode::ShuttingDown
        | ErrorCode::WorkerReset
        | ErrorCode::RecordsUnavailable
        | ErrorCode::ClusterUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::DecodeTimeout | ErrorCode::QueueTimeout => StatusCode::GATEWAY_TIMEOUT,
        ErrorCode::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
        ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        ErrorCode::HubUnavailable => StatusCode::BAD_GATEWAY,
    }
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>, retriable: bool) -> Self {
        Self {
            envelope: Box::new(ErrorEnvelope::new(code, message, retriable)),
        }
    }

    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidParams, message, false).with_field(field)
    }

    pub fn not_found(what: &str, id: &str) -> Self {
        Self::new(
            ErrorCode::NotFound,
            format!("{what} {id:?} not found"),
            false,
        )
    }

    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Conflict, message, false)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message, true)
    }

    pub fn with_retry_after(mut self, ms: u64) -> Self {
        self.envelope.retry_after_ms = Some(ms);
        self
    }

    /// Names the request field (or header) at fault.
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.envelope.field = Some(field.into());
        self
    }

    pub fn with_pool(mut self, pool_id: &str) -> Self {
        self.envelope.pool_id = Some(pool_id.to_string());
        self
    }

    pub fn with_policy(mut self, label: &str) -> Self {
        self.envelope.policy_label = Some(label.to_string());
        self
    }

    pub fn code(&self) -> ErrorCode {
        self.envelope.code
    }

    pub fn status(&self) -> StatusCode {
        status_of(self.envelope.code)
    }
}

/// `Retry-After` in whole seconds, rounded up, at least 1.
pub fn retry_after_secs(ms: u64) -> u64 {
    ms.div_ceil(1000).max(1)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        shaped_response(&self, &self.envelope)
    }
}

/// `e` answered with `body` (its protocol's shape): its status, backoff headers, and the error
/// counted.
pub fn shaped_response<B: serde::Serialize>(e: &ApiError, body: B) -> Response {
    crate::metrics::error(e.envelope.code);
    let mut resp = (e.status(), Json(body)).into_response();
    backoff_headers(resp.headers_mut(), e.envelope.retry_after_ms);
    resp
}

/// `Retry-After` (whole seconds), `retry-after-ms` (what the `openai` and `anthropic` SDKs
/// prefer) and `X-Backoff-Ms` when an error advises a wait.
pub fn backoff_headers(h: &mut axum::http::HeaderMap, retry_after_ms: Option<u64>) {
    if let Some(ms) = retry_after_ms {
        if let Ok(v) = HeaderValue::from_str(&retry_after_secs(ms).to_string()) {
            h.insert(axum::http::header::RETRY_AFTER, v);
        }
        if let Ok(v) = HeaderValue::from_str(&ms.to_string()) {
            h.insert("retry-after-ms", v.clone());
            h.insert("x-backoff-ms", v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds_at_least_one() {
        assert_eq!(retry_after_secs(0), 1);
        assert_eq!(retry_after_secs(1), 1);
        assert_eq!(retry_after_secs(1000), 1);
        assert_eq!(retry_after_secs(1001), 2);
    }

    #[test]
    fn client_mistakes_are_4xx_and_only_internal_is_500() {
        for code in ErrorCode::ALL {
            let s = status_of(code);
            if code == ErrorCode::Internal {
                assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
            } else {
                assert_ne!(s, StatusCode::INTERNAL_SERVER_ERROR, "{code:?}");
            }
        }
        assert!(status_of(ErrorCode::InvalidParams).is_client_error());
    }
}
