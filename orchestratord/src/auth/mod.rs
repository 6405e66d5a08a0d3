//! Who may call what. API keys (bearer tokens or `x-api-key`) with a tenant and a scope
//! (`keys.rs`), which key each route needs (`routes.rs`), failed attempts limited per client
//! and key tried (`limiter.rs`), and the request hygiene that keeps a web page in the user's
//! browser from driving the server: bodies must be JSON (415), and writes from a foreign
//! `Origin` are refused (403).
//!
//! With no key configured, auth is off: every caller is the one `local` tenant with admin
//! scope, which the server allows only on a loopback address (or when the operator says
//! `--insecure-no-auth`).

pub mod keys;
pub mod limiter;
pub mod routes;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use contracts::ErrorCode;

pub use keys::{KeyStore, Principal, Scope};
use routes::{Access, Shape};

use crate::config::{AuthConfig, ConfigError};
use crate::correlation::CorrelationId;
use crate::error::ApiError;
use crate::patience::Patience;

/// The env variable with `tenant:scope:key` entries, comma-separated.
pub const KEYS_ENV: &str = "ORCHD_API_KEYS";

/// The server's keys and the failure limiter.
pub struct Auth {
    pub keys: KeyStore,
    pub limiter: limiter::FailureLimiter,
    pub metrics_public: bool,
    pub allowed_origins: Vec<String>,
    /// Proxies whose forwarded client address is believed (`http.trusted_proxies`).
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Names besides loopback ones and IP addresses the server answers to without keys
    /// (`http.allowed_hosts`).
    pub allowed_hosts: Vec<String>,
}

impl Auth {
    /// Keys from `cfg.keys`, `cfg.key_file` and `ORCHD_API_KEYS`.
    pub fn load(cfg: &AuthConfig, http: &crate::config::HttpConfig) -> Result<Self, ConfigError> {
        let bad = |e: keys::KeyError| ConfigError::Invalid(format!("API keys: {e}"));
        let mut keys = KeyStore::default();
        keys.add_entries("auth.keys", cfg.keys.iter().map(String::as_str))
            .map_err(bad)?;
        if let Some(path) = &cfg.key_file {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.into(),
                source,
            })?;
            keys.add_file(path, &text).map_err(bad)?;
        }
        if let Ok(v) = std::env::var(KEYS_ENV) {
            keys.add_entries(KEYS_ENV, v.split(',').filter(|s| !s.trim().is_empty()))
                .map_err(bad)?;
        }
        Ok(Self {
            keys,
            limiter: limiter::FailureLimiter::new(cfg.max_failures_per_minute),
            metrics_public: cfg.metrics_public,
            allowed_origins: http.cors_allowed_origins.clone(),
            trusted_proxies: http.trusted_proxies.clone(),
            allowed_hosts: http
                .allowed_hosts
                .iter()
                .map(|h| h.to_ascii_lowercase())
                .chain(own_hostname())
                .collect(),
        })
    }

    /// Whether keys are required.
    pub fn enabled(&self) -> bool {
        !self.keys.is_empty()
    }
}

/// Refuses to serve a non-loopback address without keys unless the operator said so.
pub fn check_exposure(bind: &str, auth: &Auth, insecure_no_auth: bool) -> Result<(), ConfigError> {
    if auth.enabled() || insecure_no_auth || is_loopback(bind) {
        return Ok(());
    }
    Err(ConfigError::Invalid(format!(
        "refusing to listen on {bind} without API keys: anyone who can reach it could drain pools, load files and read others' tasks. \
         Set keys ({KEYS_ENV}=tenant:scope:key,… or auth.key_file), bind to 127.0.0.1, or pass --insecure-no-auth (auth.insecure_no_auth = true) if this network is trusted"
    )))
}

/// Whether `bind` (`ip:port`, `[ip]:port` or `localhost:port`) is a loopback address.
pub fn is_loopback(bind: &str) -> bool {
    if let Ok(a) = bind.parse::<SocketAddr>() {
        return a.ip().is_loopback();
    }
    bind.rsplit_once(':')
        .is_some_and(|(host, _)| host.eq_ignore_ascii_case("localhost"))
}

fn presented_key(h: &HeaderMap) -> Option<&str> {
    if let Some(v) = h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        let (scheme, token) = v.trim().split_once(' ')?;
        return scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| token.trim())
            .filter(|t| !t.is_empty());
    }
    h.get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// An error in the route's own shape.
pub fn respond(shape: Shape, e: ApiError) -> Response {
    match shape {
        Shape::Envelope => e.into_response(),
        Shape::OpenAi => crate::error::openai::OpenAiError(e).into_response(),
        Shape::Ollama => crate::error::ollama::OllamaError(e).into_response(),
        Shape::Anthropic => crate::error::anthropic::AnthropicError(e).into_response(),
    }
}

fn unauthorized(shape: Shape, message: &str, invalid: bool) -> Response {
    let mut r = respond(
        shape,
        ApiError::new(ErrorCode::Unauthorized, message, false),
    );
    let challenge = if invalid {
        r#"Bearer realm="orchestratord", error="invalid_token""#
    } else {
        r#"Bearer realm="orchestratord""#
    };
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static(challenge),
    );
    r
}

fn is_write(m: &Method) -> bool {
    !matches!(*m, Method::GET | Method::HEAD | Method::OPTIONS)
}

fn has_body(h: &HeaderMap) -> bool {
    h.contains_key(header::TRANSFER_ENCODING)
        || h.get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|n| n > 0)
}

fn is_json(h: &HeaderMap) -> bool {
    h.get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

/// Whether a write from page origin `origin` to this server (its `Host`) is the server's own
/// page (the console at `/`): the origin is the host the request went to, and that host cannot
/// be a name someone else's DNS points here (a rebinding attack) — an IP literal or
/// `localhost` — unless keys are required (a rebound page has no key: the console's lives in
/// the storage of the server's own origin).
fn own_page(auth: &Auth, origin: &str, h: &HeaderMap) -> bool {
    let Some(host) = h.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let same = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        .is_some_and(|rest| rest.eq_ignore_ascii_case(host));
    if !same {
        return false;
    }
    unbindable(host_name(host)) || auth.enabled()
}

/// This machine's own name (Linux), which its users may reach it by.
fn own_hostname() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = name.trim().to_ascii_lowercase();
    (!name.is_empty()).then_some(name)
}

/// The name of a `Host` header's value, without its port.
fn host_name(host: &str) -> &str {
    host.rsplit_once(':')
        .filter(|(name, port)| port.bytes().all(|b| b.is_ascii_digit()) && !name.ends_with(':'))
        .map_or(host, |(name, _)| name)
}

/// Whether `name` cannot be a name someone else's DNS points at this server: an IP literal,
/// `localhost` or a name under `.localhost` (which resolvers keep to the machine).
fn unbindable(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower == "localhost"
        || lower.ends_with(".localhost")
        || name.parse::<IpAddr>().is_ok()
        || name
            .strip_prefix('[')
            .and_then(|n| n.strip_suffix(']'))
            .is_some_and(|n| n.parse::<IpAddr>().is_ok())
}

/// SEC-HOST-1: without keys every caller is the local admin, so a request must have been
/// meant for this machine: its `Host` is an IP literal, a loopback name, the machine's own
/// name, or a name the operator allowed (`http.allowed_hosts`) — not a name a web page's DNS
/// rebinding points here (as Ollama refuses them). A request without a `Host` (HTTP/1.0, a raw socket) comes
/// from no browser and passes.
fn host_refused(auth: &Auth, h: &HeaderMap, shape: Shape) -> Option<Response> {
    let host = h.get(header::HOST)?;
    let Ok(host) = host.to_str() else {
        return Some(foreign_host(shape));
    };
    let name = host_name(host);
    if unbindable(name)
        || auth
            .allowed_hosts
            .iter()
            .any(|a| a.eq_ignore_ascii_case(name))
    {
        return None;
    }
    Some(foreign_host(shape))
}

fn foreign_host(shape: Shape) -> Response {
    respond(
        shape,
        ApiError::new(
            ErrorCode::Forbidden,
            "without API keys this server answers only to loopback names and IP addresses: add this Host to http.allowed_hosts, or configure keys",
            false,
        ),
    )
}

/// Request hygiene before any key is looked at: a write from a browser page of a foreign
/// origin is refused (403; the server's own page is not foreign), and a body that is not
/// declared JSON is 415 (but on Ollama's routes).
fn hygiene(auth: &Auth, req: &Request, shape: Shape) -> Option<Response> {
    let h = req.headers();
    if is_write(req.method()) {
        if let Some(origin) = h.get(header::ORIGIN) {
            let allowed = origin
                .to_str()
                .is_ok_and(|o| auth.allowed_origins.iter().any(|a| a == o) || own_page(auth, o, h));
            if !allowed {
                return Some(respond(
                    shape,
                    ApiError::new(
                        ErrorCode::Forbidden,
                        "cross-origin writes are refused: this Origin is not in http.cors_allowed_origins",
                        false,
                    ),
                ));
            }
        }
    }
    // Ollama's own examples send JSON with `curl -d` (form-encoded, by curl's default) and its
    // clients may send none: its routes read the body as JSON whatever it is declared as. A
    // page's form or "simple" POST still carries its foreign Origin (403 above).
    if has_body(h) && !is_json(h) && shape != Shape::Ollama {
        let mut e = ApiError::new(
            ErrorCode::UnsupportedMediaType,
            "request bodies must be sent with Content-Type: application/json",
            false,
        );
        e.envelope.field = Some("content-type".into());
        return Some(respond(shape, e));
    }
    None
}

/// The client's address: the peer's, or the forwarded one behind a trusted proxy.
pub fn client_of(auth: &Auth, req: &Request) -> IpAddr {
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(a)| a.ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    crate::client_addr::client_ip(peer, req.headers(), &auth.trusted_proxies)
}

/// Checks the request's key against the route's needs and puts the [`Principal`] in its
/// extensions.
pub async fn middleware(
    State(auth): State<std::sync::Arc<Auth>>,
    mut req: Request,
    next: Next,
) -> Response {
    let auth = auth.as_ref();
    let (access, shape) = routes::classify(req.method(), req.uri().path());
    if let Some(refused) = hygiene(auth, &req, shape) {
        return refused;
    }
    // a principal already on the request was put there in this process (a worker's
    // in-process backend): requests from sockets never carry one
    if req.extensions().get::<Principal>().is_some() {
        return next.run(req).await;
    }
    if !auth.enabled() {
        // a worker's socket carries its secret (no page has it): the name it dials is its own
        let worker = req.uri().path() == contracts::worker::CONNECT_PATH;
        if let Some(refused) = host_refused(auth, req.headers(), shape).filter(|_| !worker) {
            crate::metrics::auth_failed("foreign_host");
            return refused;
        }
        req.extensions_mut().insert(Principal::local());
        return next.run(req).await;
    }
    let needed = match access {
        Access::Open => None,
        Access::Metrics if auth.metrics_public => None,
        Access::Metrics | Access::Data => Some(Scope::Data),
        Access::Admin => Some(Scope::Admin),
    };
    let Some(needed) = needed else {
        // an open route: a valid key, when one comes, still says who is asking (`/metrics`
        // shows prompt-cache series to admins only)
        if let Some(p) = presented_key(req.headers()).and_then(|k| auth.keys.verify(k)) {
            req.extensions_mut().insert(p);
        }
        return next.run(req).await;
    };
    // a missing key is no guess: 401, never counted against anyone
    let Some(key) = presented_key(req.headers()) else {
        crate::metrics::auth_failed("missing");
        return unauthorized(
            shape,
            "an API key is required: Authorization: Bearer <key> (or x-api-key)",
            false,
        );
    };
    // failures are counted per client and key tried: a key that verifies has none, so no
    // one's failures ever refuse it
    let client = client_of(auth, &req);
    let attempt = limiter::Attempt::new(client, key);
    if let Some(wait) = auth.limiter.limited_for(&attempt) {
        crate::metrics::auth_failed("rate_limited");
        return respond(
            shape,
            ApiError::new(
                ErrorCode::AuthRateLimited,
                "too many failed authentications with this key from this address",
                true,
            )
            .with_retry_after(wait.as_millis().max(1) as u64),
        );
    }
    let Some(principal) = auth.keys.verify(key) else {
        auth.limiter.record_failure(attempt);
        crate::metrics::auth_failed("invalid");
        tracing::warn!(%client, "request refused: unknown API key");
        return unauthorized(shape, "the API key is not valid", true);
    };
    if principal.scope < needed {
        crate::metrics::auth_failed("forbidden");
        return respond(
            shape,
            ApiError::new(
                ErrorCode::Forbidden,
                format!(
                    "this route needs an {} key; tenant {:?} has a {} key",
                    needed.as_str(),
                    principal.tenant,
                    principal.scope.as_str()
                ),
                false,
            ),
        );
    }
    req.extensions_mut().insert(principal);
    next.run(req).await
}

/// Who made a request: its correlation id and principal (set by the middlewares).
#[derive(Debug, Clone)]
pub struct Caller {
    pub correlation_id: String,
    pub principal: Principal,
    /// The client's stated timeout and retry count (`patience.rs`).
    pub patience: Patience,
    /// The connection the request came on (`None`: the server's own callers).
    pub connection: Option<std::net::SocketAddr>,
}

impl Caller {
    /// A caller of the server's own making (the Hyperswarm host's peers, soak drivers).
    pub fn internal(tenant: &str, correlation_id: impl Into<String>) -> Self {
        Self {
            correlation_id: correlation_id.into(),
            principal: Principal {
                tenant: tenant.into(),
                scope: Scope::Data,
            },
            patience: Patience::default(),
            connection: None,
        }
    }

    pub fn tenant(&self) -> &str {
        &self.principal.tenant
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let principal = parts
            .extensions
            .get::<Principal>()
            .cloned()
            .ok_or_else(|| {
                ApiError::new(ErrorCode::Unauthorized, "an API key is required", false)
            })?;
        let correlation_id = parts
            .extensions
            .get::<CorrelationId>()
            .map(|c| c.0.clone())
            .unwrap_or_default();
        let patience = Patience::from_headers(&parts.headers)?;
        let connection = parts
            .extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|c| c.0);
        Ok(Self {
            correlation_id,
            principal,
            patience,
            connection,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_binds() {
        assert!(is_loopback("127.0.0.1:8080"));
        assert!(is_loopback("[::1]:8080"));
        assert!(is_loopback("localhost:1"));
        assert!(!is_loopback("0.0.0.0:8080"));
        assert!(!is_loopback("10.1.2.3:80"));
        assert!(!is_loopback("example.org:80"));
    }

    #[test]
    fn keys_are_read_from_bearer_or_x_api_key() {
        let mut h = HeaderMap::new();
        assert_eq!(presented_key(&h), None);
        h.insert("x-api-key", HeaderValue::from_static("k2"));
        assert_eq!(presented_key(&h), Some("k2"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k1"));
        assert_eq!(presented_key(&h), Some("k1"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic k1"));
        assert_eq!(presented_key(&h), None);
    }
}
