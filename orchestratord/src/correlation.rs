//! `X-Correlation-Id`: echoed when the client sends a sane one, else a new UUIDv4; set on every
//! non-204 response (SSE included) and carried by the request's tracing span.

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

pub const HEADER: &str = "x-correlation-id";

/// The correlation id of the current request (a request extension).
#[derive(Debug, Clone)]
pub struct CorrelationId(pub String);

fn acceptable(v: &str) -> bool {
    !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic())
}

pub async fn middleware(mut req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get(HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| acceptable(v))
        .map(str::to_string)
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    req.extensions_mut().insert(CorrelationId(id.clone()));
    let span = tracing::info_span!(
        "request",
        correlation_id = %id,
        method = %req.method(),
        path = %req.uri().path()
    );
    let mut resp = next.run(req).instrument(span).await;
    if resp.status() != StatusCode::NO_CONTENT {
        if let Ok(v) = HeaderValue::from_str(&id) {
            resp.headers_mut().insert(HEADER, v);
        }
    }
    resp
}
