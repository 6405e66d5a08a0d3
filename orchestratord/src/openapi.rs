//! The OpenAPI documents, generated from the handlers and wire types. The checked-in
//! `contracts/openapi/{data,control}.yaml` must equal these (drift test).

use contracts::API_VERSION;
use utoipa::OpenApi;

use crate::config::Config;
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
        routes::artifacts::put,
        routes::artifacts::get,
        routes::artifacts::list,
    ),
    components(schemas(
        contracts::TaskRequest, contracts::AdmissionResponse, contracts::ErrorEnvelope,
        contracts::ErrorCode, contracts::Prediction, contracts::SseStarted, contracts::SseToken, contracts::SseMetrics,
        contracts::SseEnd, contracts::SseError, contracts::SseEvent, contracts::TaskStatus, contracts::TaskRecord,
        contracts::SessionInfo, contracts::ArtifactRequest, contracts::ArtifactMeta,
        contracts::Artifact, contracts::ArtifactList, contracts::StoredArtifact,
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
        routes::tenants::list,
        routes::probes::livez,
        routes::probes::readyz,
    ),
    components(schemas(contracts::ErrorEnvelope, contracts::ErrorCode, contracts::Capabilities, contracts::PoolHealth, contracts::Readiness, contracts::PoolReadiness, contracts::worker::WorkerInfo, contracts::worker::WorkerList, contracts::TenantList, contracts::TenantStatus)),
    tags((name = "control", description = "Control plane"))
)]
struct ControlApi;

#[derive(OpenApi)]
#[openapi(
    info(title = "orchestratord adapters", description = "Protocol adapters on the task spine: OpenAI-compatible chat and text completions, the seed-001 chat API (Ollama's shape, JSON/NDJSON/SSE), and the Kolosal engine API. Errors are OpenAI-shaped: {\"error\": {message, type, param, code}}."),
    paths(
        adapters::openai::chat_completions,
        adapters::openai::completions,
        adapters::openai::responses,
        adapters::openai::models,
        adapters::openai::model,
        adapters::tokenize::tokenize,
        adapters::tokenize::detokenize,
        adapters::seed_chat::completions,
        adapters::seed_chat::sse,
        adapters::anthropic::messages,
        adapters::anthropic::count_tokens,
        adapters::ollama::chat,
        adapters::ollama::generate,
        adapters::ollama::tags,
        adapters::ollama::ps,
        adapters::ollama::show,
        adapters::ollama::version,
        adapters::ollama::pull,
        adapters::ollama::copy,
        adapters::ollama::create,
        adapters::ollama::delete,
        adapters::kolosal::add,
        adapters::kolosal::list,
        adapters::kolosal::status,
        adapters::kolosal::remove,
        adapters::kolosal::health,
        adapters::llama_server::completion,
        adapters::llama_server::props,
        adapters::llama_server::slots,
        adapters::embeddings::openai::embeddings,
        adapters::embeddings::ollama::embed_route,
        adapters::embeddings::ollama::embeddings_route,
        adapters::embeddings::llama_server::embeddings,
        adapters::embeddings::rerank::rerank,
    ),
    components(schemas(
        crate::error::openai::ErrorBody, crate::error::openai::ErrorDetail, contracts::ErrorCode,
        contracts::SseEvent,
        adapters::openai::types::ChatRequest, adapters::openai::types::ChatResponse,
        adapters::openai::types::Chunk, adapters::openai::types::CompletionRequest,
        adapters::openai::types::CompletionResponse, adapters::openai::types::ModelList,
        adapters::openai::types::Model,
        adapters::openai::responses::types::ResponsesRequest,
        adapters::openai::responses::types::ResponseObject,
        adapters::seed_chat::types::ChatRequest, adapters::seed_chat::types::ChatResponse,
        adapters::seed_chat::types::ChatChunk, adapters::seed_chat::types::StreamError,
        adapters::seed_chat::types::NdjsonError,
        crate::error::anthropic::ErrorBody, crate::error::anthropic::ErrorDetail,
        adapters::anthropic::types::Block, adapters::anthropic::types::Content,
        adapters::anthropic::types::Message, adapters::anthropic::types::Metadata,
        adapters::anthropic::types::MessagesRequest, adapters::anthropic::types::CountRequest,
        adapters::anthropic::types::TokenCount, adapters::anthropic::types::ContentBlock,
        adapters::anthropic::types::Usage, adapters::anthropic::types::MessageResponse,
        crate::error::ollama::ErrorBody, adapters::ollama::types::Message,
        adapters::ollama::types::Options, adapters::ollama::types::ChatRequest,
        adapters::ollama::types::GenerateRequest, adapters::ollama::types::ChatLine,
        adapters::ollama::types::GenerateLine, adapters::ollama::types::AnswerMessage,
        adapters::ollama::types::Stats, adapters::ollama::types::Details,
        adapters::ollama::types::ModelEntry, adapters::ollama::types::ModelList,
        adapters::ollama::types::ShowRequest, adapters::ollama::types::ShowResponse,
        adapters::ollama::types::Version, adapters::ollama::PullRequest,
        adapters::ollama::PullLine, adapters::ollama::DeleteRequest,
        adapters::ollama::CopyRequest, adapters::ollama::CreateRequest,
        crate::models_folder::recipe::Parameters,
        adapters::kolosal::types::AddEngine, adapters::kolosal::types::EngineCreated,
        adapters::kolosal::types::EngineList, adapters::kolosal::types::EngineStatus,
        adapters::kolosal::types::EngineRemoved, adapters::kolosal::types::Health,
        adapters::llama_server::completion::CompletionRequest,
        adapters::llama_server::completion::CompletionResponse,
        adapters::llama_server::completion::CompletionChunk,
        adapters::llama_server::completion::Timings,
        adapters::llama_server::completion::TokenProbability,
        adapters::llama_server::completion::TopProbability,
        adapters::llama_server::settings::GenerationSettings,
        adapters::llama_server::props::PropsResponse,
        adapters::llama_server::props::DefaultSettings,
        adapters::llama_server::props::Modalities,
        adapters::llama_server::props::Slot,
        adapters::llama_server::props::NextToken,
        adapters::embeddings::openai::EmbeddingsRequest,
        adapters::embeddings::openai::EmbeddingInput,
        adapters::embeddings::openai::EmbeddingsResponse,
        adapters::embeddings::openai::Embedding,
        adapters::embeddings::openai::Vector,
        adapters::embeddings::openai::EmbeddingUsage,
        adapters::embeddings::ollama::EmbedRequest,
        adapters::embeddings::ollama::EmbedResponse,
        adapters::embeddings::ollama::EmbeddingsRequest,
        adapters::embeddings::ollama::EmbeddingsResponse,
        adapters::embeddings::ollama::OneOrMany,
        adapters::embeddings::llama_server::EmbeddingRequest,
        adapters::embeddings::llama_server::EmbeddingEntry,
        adapters::embeddings::rerank::RerankRequest,
        adapters::embeddings::rerank::Document,
        adapters::embeddings::rerank::RerankResponse,
        adapters::embeddings::rerank::RerankResult,
        adapters::embeddings::rerank::RerankDocument,
        adapters::embeddings::rerank::RerankUsage,
    )),
    tags(
        (name = "openai", description = "OpenAI-compatible"),
        (name = "chat", description = "Seed-001 chat (Ollama's response shape)"),
        (name = "anthropic", description = "Anthropic's Messages API; errors are `{\"type\": \"error\", \"error\": {type, message}}`"),
        (name = "ollama", description = "Ollama's native API; errors are `{\"error\": \"…\"}`"),
        (name = "engines", description = "Kolosal engine management and health"),
        (name = "tokenize", description = "Token ids of a text or a chat, and text of ids (llama.cpp's and vLLM's routes)"),
        (name = "llama-server", description = "llama-server's native routes: `/completion`, `/props`, `/slots`"),
    )
)]
struct AdaptersApi;

fn versioned(mut doc: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    doc.info.version = API_VERSION.to_string();
    doc
}

/// Declares the API-key schemes and, on every operation that needs a key (per
/// `auth::routes::classify`, the table the server enforces), the requirement and its 401; 403
/// on admin routes; 415 where a body is taken, each in the error shape of its route.
fn secured(mut doc: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    use axum::http::Method;
    use utoipa::openapi::security::{
        ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
    };
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};

    use crate::auth::routes::{classify, Access, Shape};

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
    let error = |shape: Shape, description: &str, code: &str, message: &str| {
        let (error_schema, example) = match shape {
            Shape::OpenAi => (
                "ErrorBody",
                serde_json::json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": code}}),
            ),
            Shape::Ollama => ("OllamaErrorBody", serde_json::json!({"error": message})),
            Shape::Anthropic => (
                "AnthropicErrorBody",
                serde_json::json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}}),
            ),
            Shape::Envelope => (
                "ErrorEnvelope",
                serde_json::json!({"code": code, "message": message, "retriable": false}),
            ),
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
            let (access, shape) = classify(&method, path);
            let error = |description: &str, code: &str, message: &str| {
                error(shape, description, code, message)
            };
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

/// Rules across fields that the derive cannot state, added to a component schema as raw JSON
/// Schema keywords (utoipa has no `not`, nor `oneOf` beside `properties`): each is exactly the
/// check the handler makes, so a body these rules accept is never refused for them.
fn cross_field_rules(mut doc: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    use serde_json::json;
    use utoipa::openapi::{schema::Schema, RefOr};
    let rules = [
        // an artifact's kind is never the one task records are listed under
        // (`records::content_id::valid_kind`)
        (
            "ArtifactRequest",
            "not",
            json!({"required": ["kind"], "properties": {"kind": {"const": contracts::artifact::TASK_RECORD_KIND}}}),
        ),
        // the task API: exactly one of `prompt` and `messages` (admission's `prompt_input`)
        (
            "TaskRequest",
            "oneOf",
            json!([
                {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
                {"required": ["messages"], "properties": {"messages": {"type": "array"}}},
            ]),
        ),
        // OpenAI chat: `add_generation_prompt`, when given, is the opposite of
        // `continue_final_message` (absent or null meaning false)
        (
            "ChatRequest",
            "not",
            json!({"anyOf": [
                {"required": ["add_generation_prompt", "continue_final_message"],
                 "properties": {"add_generation_prompt": {"const": true},
                                "continue_final_message": {"const": true}}},
                {"required": ["add_generation_prompt"],
                 "properties": {"add_generation_prompt": {"const": false},
                                "continue_final_message": {"not": {"const": true}}}},
            ]}),
        ),
    ];
    let Some(components) = doc.components.as_mut() else {
        return doc;
    };
    for (name, keyword, rule) in rules {
        let extensions = match components.schemas.get_mut(name) {
            Some(RefOr::T(Schema::Object(o))) => &mut o.extensions,
            Some(RefOr::T(Schema::AllOf(a))) => &mut a.extensions,
            _ => continue,
        };
        extensions
            .get_or_insert_with(Default::default)
            .insert(keyword.to_string(), rule);
    }
    doc
}

/// The configured limits (so the served document states this server's): the largest
/// `max_tokens`, the stop sequences' count and length, the prompts of one completions request,
/// the largest `n_ctx` of an added engine.
fn configured_limits(mut doc: utoipa::openapi::OpenApi, cfg: &Config) -> utoipa::openapi::OpenApi {
    let a = &cfg.admission;
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};
    use utoipa::openapi::RefOr;
    let Some(components) = doc.components.as_mut() else {
        return doc;
    };
    for name in [
        "TaskRequest",
        "ChatRequest",
        "SeedChatRequest",
        "CompletionRequest",
    ] {
        let objects: Vec<&mut utoipa::openapi::schema::Object> =
            match components.schemas.get_mut(name) {
                Some(RefOr::T(Schema::Object(o))) => vec![o],
                Some(RefOr::T(Schema::AllOf(all))) => all
                    .items
                    .iter_mut()
                    .filter_map(|i| match i {
                        RefOr::T(Schema::Object(o)) => Some(o),
                        _ => None,
                    })
                    .collect(),
                _ => vec![],
            };
        for o in objects {
            for field in ["max_tokens", "max_completion_tokens"] {
                if let Some(RefOr::T(Schema::Object(f))) = o.properties.get_mut(field) {
                    f.maximum = Some(a.max_tokens_out.into());
                }
            }
        }
    }
    let stop = || {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .max_length(Some(a.max_stop_chars))
    };
    if components.schemas.contains_key("StopField") {
        components.schemas.insert(
            "StopField".into(),
            OneOfBuilder::new()
                .item(stop())
                .item(
                    ArrayBuilder::new()
                        .items(stop())
                        .max_items(Some(a.max_stop_sequences)),
                )
                .description(Some("A stop sequence or a list of them."))
                .into(),
        );
    }
    if let Some(RefOr::T(Schema::Object(add))) = components.schemas.get_mut("AddEngine") {
        if let Some(RefOr::T(Schema::Object(n_ctx))) = add.properties.get_mut("n_ctx") {
            n_ctx.maximum = Some(cfg.engines_api.max_n_ctx.into());
        }
    }
    if let Some(RefOr::T(Schema::OneOf(prompt))) = components.schemas.get_mut("PromptField") {
        // the lists of prompts (of texts, of id arrays), not one prompt's ids
        for i in [1, 3] {
            if let Some(RefOr::T(Schema::Array(many))) = prompt.items.get_mut(i) {
                many.max_items = Some(a.max_prompts_per_request);
            }
        }
    }
    doc
}

/// utoipa writes `u32` and `u64` as `int32` / `int64` with `minimum: 0`, formats that cap them
/// at the signed maximum, while the server takes the whole unsigned range: such a schema drops
/// its format and states the unsigned maximum (in components and in operation parameters).
fn unsigned_ranges(mut doc: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    use utoipa::openapi::schema::{ArrayItems, KnownFormat, Schema, SchemaFormat};
    use utoipa::openapi::RefOr;
    use utoipa::Number;

    fn is_integer(t: &utoipa::openapi::schema::SchemaType) -> bool {
        use utoipa::openapi::schema::{SchemaType, Type};
        match t {
            SchemaType::Type(t) => *t == Type::Integer,
            SchemaType::Array(ts) => ts.contains(&Type::Integer),
            SchemaType::AnyValue => false,
        }
    }

    fn walk(schema: &mut RefOr<Schema>) {
        let RefOr::T(s) = schema else { return };
        match s {
            Schema::Object(o) => {
                // a lower bound of 0 or more on an integer: a Rust unsigned type
                let unsigned = match o.minimum {
                    Some(Number::Int(m)) => m >= 0,
                    Some(Number::UInt(_)) => true,
                    Some(Number::Float(m)) => m >= 0.0,
                    None => false,
                } && is_integer(&o.schema_type);
                let max = match &o.format {
                    Some(SchemaFormat::KnownFormat(KnownFormat::Int32)) => u32::MAX as usize,
                    Some(SchemaFormat::KnownFormat(KnownFormat::Int64)) | None => u64::MAX as usize,
                    _ => 0,
                };
                if unsigned && max > 0 {
                    o.format = None;
                    o.maximum.get_or_insert(Number::UInt(max));
                }
                o.properties.values_mut().for_each(walk);
            }
            Schema::Array(a) => {
                if let ArrayItems::RefOrSchema(items) = &mut a.items {
                    walk(items);
                }
            }
            Schema::AllOf(a) => a.items.iter_mut().for_each(walk),
            Schema::OneOf(o) => o.items.iter_mut().for_each(walk),
            Schema::AnyOf(a) => a.items.iter_mut().for_each(walk),
            _ => {}
        }
    }

    if let Some(components) = doc.components.as_mut() {
        components.schemas.values_mut().for_each(walk);
    }
    for item in doc.paths.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for op in operations.into_iter().flatten() {
            for param in op.parameters.iter_mut().flatten() {
                if let Some(schema) = param.schema.as_mut() {
                    walk(schema);
                }
            }
        }
    }
    doc
}

pub fn data() -> utoipa::openapi::OpenApi {
    data_for(&Config::default())
}

fn data_for(cfg: &Config) -> utoipa::openapi::OpenApi {
    let doc = secured(versioned(DataApi::openapi()));
    configured_limits(cross_field_rules(unsigned_ranges(doc)), cfg)
}

pub fn control() -> utoipa::openapi::OpenApi {
    unsigned_ranges(secured(versioned(ControlApi::openapi())))
}

pub fn adapters() -> utoipa::openapi::OpenApi {
    adapters_for(&Config::default())
}

fn adapters_for(cfg: &Config) -> utoipa::openapi::OpenApi {
    let doc = secured(versioned(AdaptersApi::openapi()));
    configured_limits(cross_field_rules(unsigned_ranges(doc)), cfg)
}

/// Every document in one, with this server's configured limits (served at `/openapi.json`).
pub fn combined(cfg: &Config) -> utoipa::openapi::OpenApi {
    let mut doc = data_for(cfg);
    doc.merge(control());
    doc.merge(adapters_for(cfg));
    doc.info.title = "orchestratord".into();
    doc.info.description = Some("Data and control plane of orchestratord.".into());
    doc
}

/// YAML of a document, as checked in under `contracts/openapi/`.
pub fn to_yaml(doc: &utoipa::openapi::OpenApi) -> String {
    doc.to_yaml().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AdmissionConfig;

    /// The served document states the configured admission limits, and the cross-field rules
    /// sit on the request schemas.
    #[test]
    fn served_document_carries_this_servers_limits() {
        let mut cfg = Config {
            admission: AdmissionConfig {
                max_tokens_out: 77,
                max_stop_sequences: 3,
                max_stop_chars: 9,
                max_prompts_per_request: 5,
                ..AdmissionConfig::default()
            },
            ..Config::default()
        };
        cfg.engines_api.max_n_ctx = 999;
        let doc = serde_json::to_value(combined(&cfg)).unwrap();
        let schemas = &doc["components"]["schemas"];
        assert_eq!(
            schemas["TaskRequest"]["properties"]["max_tokens"]["maximum"],
            77
        );
        assert_eq!(
            schemas["SeedChatRequest"]["properties"]["max_tokens"]["maximum"],
            77
        );
        assert_eq!(schemas["StopField"]["oneOf"][0]["maxLength"], 9);
        assert_eq!(schemas["StopField"]["oneOf"][1]["maxItems"], 3);
        assert_eq!(schemas["PromptField"]["oneOf"][1]["maxItems"], 5);
        assert_eq!(schemas["PromptField"]["oneOf"][3]["maxItems"], 5);
        assert!(schemas["PromptField"]["oneOf"][2].get("maxItems").is_none());
        assert_eq!(schemas["TaskRequest"]["oneOf"].as_array().unwrap().len(), 2);
        assert!(schemas["ChatRequest"]["not"]["anyOf"].is_array());
        assert_eq!(schemas["AddEngine"]["properties"]["n_ctx"]["maximum"], 999);
        // unsigned fields state the unsigned range, not int32's / int64's signed cap
        let top_k = &schemas["TaskRequest"]["properties"]["top_k"];
        assert_eq!(top_k["maximum"], u32::MAX);
        assert!(top_k.get("format").is_none(), "{top_k}");
        let deadline = &schemas["TaskRequest"]["properties"]["deadline_ms"];
        assert_eq!(deadline["maximum"], u64::MAX);
        // an unimplemented OpenAI field admits exactly its neutral values
        let suffix = schemas["Unimplemented"]["properties"]["suffix"]["anyOf"]
            .as_array()
            .unwrap();
        assert!(suffix.iter().any(|s| s["maxLength"] == 0));
        assert!(suffix.iter().all(|s| s.get("minLength").is_none()));
        let choice = &schemas["Unimplemented"]["properties"]["function_call"]["anyOf"];
        assert!(choice
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["enum"][0] == "none"));
    }
}
