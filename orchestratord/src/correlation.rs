//! `X-Correlation-Id`: echoed when the client sends a sane one, else a new UUIDv4; set on every
//! non-204 response (SSE included) and carried by the request's tracing span. The same layer
//! writes the request log: method, route template, status, latency to the response head (a
//! stream's head comes first; its length is not in it). Never bodies, never query strings.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
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

/// The route template that served a request (`/v1/tasks/{id}`), carried back on the response
/// by [`mark_route`] for the request log.
#[derive(Debug, Clone)]
struct RouteTemplate(MatchedPath);

/// Innermost layer (a route layer, where axum knows the matched route): records the template.
pub async fn mark_route(req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .cloned()
        .map(RouteTemplate);
    let mut resp = next.run(req).await;
    if let Some(r) = route {
        resp.extensions_mut().insert(r);
    }
    resp
}

pub async fn middleware(mut req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
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
    let mut resp = next.run(req).instrument(span.clone()).await;
    let route = resp
        .extensions()
        .get::<RouteTemplate>()
        .map_or("unmatched", |r| r.0.as_str());
    span.in_scope(|| {
        tracing::info!(
            target: crate::logging::ACCESS_TARGET,
            method = %method,
            route,
            status = resp.status().as_u16(),
            latency_ms = (started.elapsed().as_secs_f64() * 1e6).round() / 1e3,
            "request"
        )
    });
    if resp.status() != StatusCode::NO_CONTENT {
        if let Ok(v) = HeaderValue::from_str(&id) {
            resp.headers_mut().insert(HEADER, v);
        }
    }
    resp
}
