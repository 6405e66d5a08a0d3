//! `/v1/artifacts`: the artifact registry (seed 003 §9). Posted artifacts have
//! content-addressed ids (`sha256:…`); every other id names a task, whose record is its
//! artifact. Both outlive the process (see `records`).

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use contracts::{
    ArtifactList, ArtifactMeta, ArtifactQuery, ArtifactRequest, ErrorEnvelope, StoredArtifact,
};

use crate::app_state::SharedState;
use crate::auth::Caller;
use crate::error::ApiError;
use crate::examples;
use crate::json_body::JsonBody;
use crate::records::content_id::is_artifact_id;

/// Store an artifact. Its id is the SHA-256 of its kind, content and parents, so posting the
/// same one again answers 200 with the same id (and adds the new tags).
#[utoipa::path(
    post, operation_id = "putArtifact", path = "/v1/artifacts", tag = "data",
    request_body(content = ArtifactRequest, example = examples::artifact_request),
    responses(
        (status = 201, description = "Stored; `Location` names it", body = ArtifactMeta, example = examples::artifact_meta),
        (status = 200, description = "Already stored (its tags now include the posted ones)", body = ArtifactMeta, example = examples::artifact_meta),
        (status = 400, description = "Invalid kind, tags, parents (malformed or not stored), ids (names the field)", body = ErrorEnvelope, example = examples::invalid_params),
        (status = 409, description = "This server keeps no records (`records.enabled = false`)", body = ErrorEnvelope, example = examples::conflict),
        (status = 413, description = "Content larger than `records.max_artifact_bytes`, or body over the limit", body = ErrorEnvelope, example = examples::payload_too_large),
    )
)]
pub async fn put(
    State(state): State<SharedState>,
    caller: Caller,
    JsonBody(req): JsonBody<ArtifactRequest>,
) -> Result<Response, ApiError> {
    let (meta, created) = state.records.put_artifact(caller.tenant(), req).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let mut resp = (status, Json(&meta)).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/artifacts/{}", meta.id)) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    Ok(resp)
}

/// An artifact with its metadata and content, or a task's record (params with the prompt
/// redacted, seed, timings, terminal event, transcript). Both survive restarts, within
/// retention.
#[utoipa::path(
    get, operation_id = "getArtifact", path = "/v1/artifacts/{id}", tag = "data",
    params(("id" = String, Path, description = "An artifact id (`sha256:…`) or a task id")),
    responses(
        (status = 200, description = "The artifact, or the task's record", body = StoredArtifact, example = examples::record),
        (status = 404, description = "Unknown, or deleted by retention", body = ErrorEnvelope, example = examples::not_found),
    )
)]
pub async fn get(
    State(state): State<SharedState>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<StoredArtifact>, ApiError> {
    let all = caller.principal.sees_all();
    if is_artifact_id(&id) {
        return match state.records.artifact(caller.tenant(), all, &id).await? {
            Some(a) => Ok(Json(StoredArtifact::Artifact(Box::new(a)))),
            None => Err(ApiError::not_found("artifact", &id)),
        };
    }
    if let Some(t) = state.tasks.get(caller.tenant(), &id, all) {
        return Ok(Json(StoredArtifact::TaskRecord(Box::new(t.record()))));
    }
    match stored_task_record(&state, caller.tenant(), all, &id).await? {
        Some(r) => Ok(Json(StoredArtifact::TaskRecord(Box::new(r)))),
        None => Err(ApiError::not_found("artifact", &id)),
    }
}

/// An ended task's stored record: this replica's, or in a cluster the one a replica that
/// followed it stored.
pub(crate) async fn stored_task_record(
    state: &SharedState,
    tenant: &str,
    any_tenant: bool,
    id: &str,
) -> Result<Option<contracts::TaskRecord>, ApiError> {
    if let Some(r) = state.records.task_record(tenant, any_tenant, id).await? {
        return Ok(Some(r));
    }
    let Some(path) = state.cluster_tasks.get() else {
        return Ok(None);
    };
    path.stored_record(tenant, any_tenant, id)
        .await
        .map_err(|e| {
            ApiError::new(
                contracts::ErrorCode::ClusterUnavailable,
                format!("the cluster's records did not answer: {e}"),
                true,
            )
            .with_retry_after(1000)
        })
}

/// Artifacts and task records, newest first, by tag, session or kind; pages of `limit`,
/// continued with `before`.
#[utoipa::path(
    get, operation_id = "listArtifacts", path = "/v1/artifacts", tag = "data",
    params(ArtifactQuery),
    responses(
        (status = 200, description = "A page, newest first", body = ArtifactList, example = examples::artifact_list),
        (status = 400, description = "Bad filter, limit or cursor (names the field)", body = ErrorEnvelope, example = examples::invalid_params),
    )
)]
pub async fn list(
    State(state): State<SharedState>,
    caller: Caller,
    query: Result<Query<ArtifactQuery>, QueryRejection>,
) -> Result<Json<ArtifactList>, ApiError> {
    let Query(q) = query.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    let all = caller.principal.sees_all();
    Ok(Json(state.records.list(caller.tenant(), all, q).await?))
}
