//! Which key each route needs, and in which shape its errors are answered. One table, read by
//! the auth middleware and by the OpenAPI document (so the two cannot disagree).

use axum::http::Method;

/// What a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Health, readiness, the API document, and the worker socket (which checks the worker
    /// secret itself): no key.
    Open,
    /// `/metrics`: open unless `auth.metrics_public` is false, then any valid key.
    Metrics,
    /// Any valid key; the caller sees only its own tenant's tasks and sessions.
    Data,
    /// An `admin` key.
    Admin,
}

/// The error body a route answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `{code, message, retriable, …}`: the task API and the control plane.
    Envelope,
    /// `{"error": {message, type, param, code}}`: OpenAI, seed-001 chat, Kolosal,
    /// llama-server's routes.
    OpenAi,
    /// `{"error": "…"}`: Ollama's native API (`/api/…`).
    Ollama,
    /// `{"type": "error", "error": {type, message}}`: Anthropic's Messages API.
    Anthropic,
}

/// Routes that need no key.
pub const OPEN_PATHS: [&str; 9] = [
    // the console's page, script and style: they carry no data (routes/console)
    "/",
    "/console/console.js",
    "/console/console.css",
    "/health",
    "/v1/health",
    "/status",
    "/openapi.json",
    "/livez",
    "/readyz",
];

/// The access and error shape of a request to `path` with `method` (unknown paths need a
/// key, so probing answers 401 before 404).
pub fn classify(method: &Method, path: &str) -> (Access, Shape) {
    let shape = if path.starts_with("/api/") {
        Shape::Ollama
    } else if path == "/v1/messages" || path.starts_with("/v1/messages/") {
        Shape::Anthropic
    } else if path.starts_with("/v1/chat/")
        || path.starts_with("/v1/completions")
        || path == "/v1/responses"
        || path.starts_with("/v1/models")
        || path == "/tokenize"
        || path == "/detokenize"
        || path == "/completion"
        || path == "/v1/embeddings"
        || path == "/embeddings"
        || path == "/embedding"
        || matches!(
            path,
            "/rerank" | "/v1/rerank" | "/reranking" | "/v1/reranking"
        )
        || path == "/props"
        || path == "/slots"
        || path.starts_with("/chat/")
        || path.starts_with("/engines")
        || path == "/health"
        || path == "/v1/health"
        || path == "/status"
    {
        Shape::OpenAi
    } else {
        Shape::Envelope
    };
    let access = if OPEN_PATHS.contains(&path) || path == contracts::worker::CONNECT_PATH {
        Access::Open
    } else if path == "/metrics" || path == "/console/history" {
        Access::Metrics
    } else if path.starts_with("/v1/pools")
        || path == "/api/pull"
        || path == "/api/copy"
        || path == "/api/create"
        || path == "/api/delete"
        || path.starts_with("/v1/workers")
        || path == "/v1/tenants"
        || (path.starts_with("/engines") && (method == Method::POST || method == Method::DELETE))
    {
        Access::Admin
    } else {
        Access::Data
    };
    (access, shape)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_plane_is_admin_and_chat_is_openai_shaped() {
        let c = |m: Method, p: &str| classify(&m, p);
        assert_eq!(c(Method::POST, "/v1/pools/x/drain").0, Access::Admin);
        assert_eq!(c(Method::GET, "/v1/pools").0, Access::Admin);
        assert_eq!(c(Method::POST, "/engines"), (Access::Admin, Shape::OpenAi));
        assert_eq!(c(Method::DELETE, "/engines/e").0, Access::Admin);
        assert_eq!(c(Method::GET, "/engines").0, Access::Data);
        assert_eq!(
            c(Method::POST, "/v1/chat/completions"),
            (Access::Data, Shape::OpenAi)
        );
        assert_eq!(
            c(Method::GET, "/v1/tasks/t"),
            (Access::Data, Shape::Envelope)
        );
        assert_eq!(c(Method::GET, "/health").0, Access::Open);
        assert_eq!(c(Method::GET, "/nope").0, Access::Data);
        assert_eq!(c(Method::GET, "/metrics").0, Access::Metrics);
        assert_eq!(c(Method::POST, "/api/chat"), (Access::Data, Shape::Ollama));
        assert_eq!(c(Method::GET, "/api/tags"), (Access::Data, Shape::Ollama));
        assert_eq!(
            c(Method::POST, "/v1/messages/count_tokens"),
            (Access::Data, Shape::Anthropic)
        );
    }
}
