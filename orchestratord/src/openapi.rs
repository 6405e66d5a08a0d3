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

pub fn data() -> utoipa::openapi::OpenApi {
    versioned(DataApi::openapi())
}

pub fn control() -> utoipa::openapi::OpenApi {
    versioned(ControlApi::openapi())
}

pub fn adapters() -> utoipa::openapi::OpenApi {
    versioned(AdaptersApi::openapi())
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
