//! The OpenAPI documents, generated from the handlers and wire types. The checked-in
//! `contracts/openapi/{data,control}.yaml` must equal these (drift test).

use contracts::API_VERSION;
use utoipa::OpenApi;

use crate::{adapters, routes};

#[derive(OpenApi)]
#[openapi(
    info(title = "orchestratord data plane", description = "Tasks: admission, queue, SSE streaming, cancel, sessions, artifacts."),
    paths(
        routes::tasks::submit,
        routes::tasks::status,
        routes::tasks::stream,
        routes::tasks::cancel,
        routes::sessions::get,
        routes::sessions::delete,
        routes::artifacts::get,
    ),
    components(schemas(
        contracts::TaskRequest, contracts::AdmissionResponse, contracts::ErrorEnvelope,
        contracts::ErrorCode, contracts::SseStarted, contracts::SseToken, contracts::SseMetrics,
        contracts::SseEnd, contracts::SseError, contracts::TaskStatus, contracts::TaskRecord,
        contracts::SessionInfo,
    )),
    tags((name = "data", description = "Data plane"))
)]
struct DataApi;

#[derive(OpenApi)]
#[openapi(
    info(title = "orchestratord control plane", description = "Pools: health, drain, resume, reload; remote workers; capabilities. Workers connect at GET /v1/worker/connect (WebSocket, seed-002 protocol)."),
    paths(
        routes::capabilities::get,
        routes::pools::list,
        routes::pools::health,
        routes::pools::drain,
        routes::pools::resume,
        routes::pools::reload,
        routes::workers::list,
        routes::workers::drain,
        routes::workers::refresh,
    ),
    components(schemas(contracts::ErrorEnvelope, contracts::ErrorCode, contracts::Capabilities, contracts::PoolHealth, contracts::worker::WorkerInfo, contracts::worker::WorkerList)),
    tags((name = "control", description = "Control plane"))
)]
struct ControlApi;

#[derive(OpenApi)]
#[openapi(
    info(title = "orchestratord adapters", description = "Protocol adapters on the task spine: OpenAI-compatible chat and text completions, the seed-001 chat API (Ollama's shape, JSON/NDJSON/SSE), and the Kolosal engine API. Errors are OpenAI-shaped: {\"error\": {message, type, param, code}}."),
    paths(
        adapters::openai::chat_completions,
        adapters::openai::completions,
        adapters::openai::models,
        adapters::ollama::completions,
        adapters::ollama::sse,
        adapters::kolosal::add,
        adapters::kolosal::list,
        adapters::kolosal::status,
        adapters::kolosal::remove,
        adapters::kolosal::health,
    ),
    components(schemas(
        adapters::error::ErrorBody, adapters::error::ErrorDetail, contracts::ErrorCode,
        adapters::openai::types::ChatRequest, adapters::openai::types::ChatResponse,
        adapters::openai::types::Chunk, adapters::openai::types::CompletionRequest,
        adapters::openai::types::CompletionResponse, adapters::openai::types::ModelList,
        adapters::ollama::types::ChatRequest, adapters::ollama::types::ChatResponse,
        adapters::ollama::types::ChatChunk, adapters::ollama::types::StreamError,
        adapters::ollama::types::NdjsonError,
        adapters::kolosal::types::AddEngine, adapters::kolosal::types::EngineCreated,
        adapters::kolosal::types::EngineList, adapters::kolosal::types::EngineStatus,
        adapters::kolosal::types::EngineRemoved, adapters::kolosal::types::Health,
    )),
    tags(
        (name = "openai", description = "OpenAI-compatible"),
        (name = "chat", description = "Seed-001 chat (Ollama's response shape)"),
        (name = "engines", description = "Kolosal engine management and health"),
    )
)]
struct AdaptersApi;

fn versioned(mut doc: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    doc.info.version = API_VERSION.to_string();
    doc
}

/// Declares the API-key schemes and, on every operation that needs a key (per
/// `auth::routes::classify`, the table the server enforces), the requirement and its 401; 403
/// on admin routes; 415 where a body is taken. `error_schema` is the body those errors have.
fn secured(mut doc: utoipa::openapi::OpenApi, error_schema: &str) -> utoipa::openapi::OpenApi {
    use axum::http::Method;
    use utoipa::openapi::security::{
        ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
    };
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};

    use crate::auth::routes::{classify, Access};

    let comps = doc.components.get_or_insert_with(Default::default);
    comps.add_security_scheme(
        "bearer",
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(
                    "An API key (`tenant:scope:key` in ORCHD_API_KEYS or auth.key_file) as a bearer token",
                ))
                .build(),
        ),
    );
    comps.add_security_scheme(
        "apiKey",
        SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
            "x-api-key",
            "The same key in the x-api-key header",
        ))),
    );
    let error = |description: &str, code: &str, message: &str| {
        let example = if error_schema == "ErrorBody" {
            serde_json::json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": code}})
        } else {
            serde_json::json!({"code": code, "message": message, "retriable": false})
        };
        ResponseBuilder::new()
            .description(description)
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name(error_schema)))
                    .example(Some(example))
                    .build(),
            )
            .build()
    };
    for (path, item) in doc.paths.paths.iter_mut() {
        let ops = [
            (Method::GET, item.get.as_mut()),
            (Method::POST, item.post.as_mut()),
            (Method::DELETE, item.delete.as_mut()),
            (Method::PUT, item.put.as_mut()),
        ];
        for (method, op) in ops {
            let Some(op) = op else { continue };
            let (access, _) = classify(&method, path);
            if matches!(access, Access::Open | Access::Metrics) {
                continue;
            }
            op.security = Some(vec![
                SecurityRequirement::new("bearer", Vec::<String>::new()),
                SecurityRequirement::new("apiKey", Vec::<String>::new()),
            ]);
            let r = &mut op.responses.responses;
            r.insert(
                "401".into(),
                error(
                    "UNAUTHORIZED: no API key, or not a valid one (with WWW-Authenticate: Bearer)",
                    "UNAUTHORIZED",
                    "an API key is required: Authorization: Bearer <key> (or x-api-key)",
                )
                .into(),
            );
            r.insert(
                "403".into(),
                if access == Access::Admin {
                    error(
                        "FORBIDDEN: the key's scope is data and this route needs admin, or a browser write from an origin not allowed",
                        "FORBIDDEN",
                        "this route needs an admin key; tenant \"alice\" has a data key",
                    )
                } else {
                    error(
                        "FORBIDDEN: a browser write from an origin not in http.cors_allowed_origins",
                        "FORBIDDEN",
                        "cross-origin writes are refused: this Origin is not in http.cors_allowed_origins",
                    )
                }
                .into(),
            );
            // a 429 an operation already documents (a full queue) has the same body shape
            r.entry("429".into()).or_insert_with(|| {
                error(
                    "AUTH_RATE_LIMITED: too many failed authentications from this address (with Retry-After)",
                    "AUTH_RATE_LIMITED",
                    "too many failed authentications from this address",
                )
                .into()
            });
            if op.request_body.is_some() {
                r.insert(
                    "415".into(),
                    error(
                        "UNSUPPORTED_MEDIA_TYPE: the body is not sent as application/json",
                        "UNSUPPORTED_MEDIA_TYPE",
                        "request bodies must be sent with Content-Type: application/json",
                    )
                    .into(),
                );
            }
        }
    }
    doc
}

pub fn data() -> utoipa::openapi::OpenApi {
    secured(versioned(DataApi::openapi()), "ErrorEnvelope")
}

pub fn control() -> utoipa::openapi::OpenApi {
    secured(versioned(ControlApi::openapi()), "ErrorEnvelope")
}

pub fn adapters() -> utoipa::openapi::OpenApi {
    secured(versioned(AdaptersApi::openapi()), "ErrorBody")
}

/// Every document in one (served at `/openapi.json`).
pub fn combined() -> utoipa::openapi::OpenApi {
    let mut doc = data();
    doc.merge(control());
    doc.merge(adapters());
    doc.info.title = "orchestratord".into();
    doc.info.description = Some("Data and control plane of orchestratord.".into());
    doc
}

/// YAML of a document, as checked in under `contracts/openapi/`.
pub fn to_yaml(doc: &utoipa::openapi::OpenApi) -> String {
    doc.to_yaml().unwrap_or_default()
}
