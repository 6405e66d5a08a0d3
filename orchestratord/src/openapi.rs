//! The OpenAPI documents, generated from the handlers and wire types. The checked-in
//! `contracts/openapi/{data,control}.yaml` must equal these (drift test).

use contracts::API_VERSION;
use utoipa::OpenApi;

use crate::routes;

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
    info(title = "orchestratord control plane", description = "Pools: health, drain, resume, reload; capabilities."),
    paths(
        routes::capabilities::get,
        routes::pools::list,
        routes::pools::health,
        routes::pools::drain,
        routes::pools::resume,
        routes::pools::reload,
    ),
    components(schemas(contracts::ErrorEnvelope, contracts::ErrorCode, contracts::Capabilities, contracts::PoolHealth)),
    tags((name = "control", description = "Control plane"))
)]
struct ControlApi;

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

/// Both planes in one document (served at `/openapi.json`).
pub fn combined() -> utoipa::openapi::OpenApi {
    let mut doc = data();
    doc.merge(control());
    doc.info.title = "orchestratord".into();
    doc.info.description = Some("Data and control plane of orchestratord.".into());
    doc
}

/// YAML of a document, as checked in under `contracts/openapi/`.
pub fn to_yaml(doc: &utoipa::openapi::OpenApi) -> String {
    doc.to_yaml().unwrap_or_default()
}
