//! `POST /api/pull`, `POST /api/copy` and `DELETE /api/delete`: models fetched from a Hugging Face–style hub
//! into the first model folder, and taken out of it (admin keys only; `models_folder/pull.rs`
//! does the pulling). A pulled model is listed and served at once, by its file's name.

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderValue, Response, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::app_state::SharedState;
use crate::error::ollama::{body as error_body, OllamaError};
use crate::error::ApiError;
use crate::json_body::JsonBody;
use crate::models_folder::pull::{HubRef, Progress};

/// Progress lines buffered for a slow reader (lines past it are skipped: the next says more).
const PROGRESS_LINES: usize = 64;

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"model": "hf.co/ggml-org/gemma-3-270m-GGUF:Q4_K_M"}))]
pub struct PullRequest {
    /// `hf.co/OWNER/REPO[:QUANT]`.
    pub model: Option<String>,
    /// The same (Ollama's older name).
    pub name: Option<String>,
    /// Accepted (the hub is reached over HTTPS or as `HF_ENDPOINT` says).
    #[serde(default)]
    pub insecure: bool,
    /// Progress lines as the pull goes (default), or one answer at its end.
    pub stream: Option<bool>,
}

/// A line of a pull's progress, Ollama's fields.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PullLine {
    pub status: String,
    /// On the `success` line: the name the pulled model is listed and served by (its file's
    /// name without `.gguf`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed: Option<u64>,
}

impl From<Progress> for PullLine {
    fn from(p: Progress) -> Self {
        match p {
            Progress::Status(status) => Self {
                status,
                model: None,
                digest: None,
                total: None,
                completed: None,
            },
            Progress::Bytes {
                digest,
                total,
                completed,
            } => Self {
                status: crate::models_folder::pull::pulling(&digest),
                model: None,
                digest: Some(digest),
                total: Some(total),
                completed: Some(completed),
            },
        }
    }
}

/// The last line of a pull that succeeded: the name the model is served by.
fn success(path: &std::path::Path) -> PullLine {
    PullLine {
        status: "success".into(),
        model: path.file_stem().map(|s| s.to_string_lossy().into_owned()),
        digest: None,
        total: None,
        completed: None,
    }
}

fn line<T: Serialize>(v: &T) -> Bytes {
    let mut out = serde_json::to_vec(v).unwrap_or_default();
    out.push(b'\n');
    out.into()
}

/// Aborts the pull when the response is dropped (the client left): what was downloaded stays
/// for the next pull to resume.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Pulls a GGUF from a hub into the model folder.
#[utoipa::path(
    post, operation_id = "ollamaPull", path = "/api/pull", tag = "ollama",
    request_body = PullRequest,
    responses(
        (status = 200, description = "NDJSON progress lines (`status`, and while bytes come `digest`, `total`, `completed`), `{\"status\":\"success\"}` last, or `{\"error\": …}` last when it failed (what was downloaded stays for the next pull to resume, unless its digest was wrong); with `stream: false` one `{\"status\":\"success\"}`", content(
            (PullLine = "application/x-ndjson"),
        )),
        (status = 400, description = "Not an `hf.co/OWNER/REPO[:QUANT]` name, no model folder, or no single file for the name", body = crate::error::ollama::ErrorBody, example = json!({"error": "\"llama3\": models are pulled from a Hugging Face hub, named hf.co/OWNER/REPO[:QUANT]"})),
        (status = 404, description = "The hub has no such repository or no GGUF in it", body = crate::error::ollama::ErrorBody, example = json!({"error": "ggml-org/nope-GGUF is not on the hub at https://huggingface.co"})),
        (status = 409, description = "The file would pass the folder's disk budget", body = crate::error::ollama::ErrorBody, example = json!({"error": "the model folder holds 900 MiB; with this file's 241 MiB it would pass its budget of 1024 MiB (models.disk_budget_mib): delete a model first"})),
        (status = 502, description = "The hub failed, or sent a file whose digest differs from the one it gave (nothing kept)", body = crate::error::ollama::ErrorBody, example = json!({"error": "sha256 mismatch: the hub says 1f2e…, the download is 9a0b…; nothing was kept"})),
    )
)]
pub async fn pull(
    State(state): State<SharedState>,
    body: Result<JsonBody<PullRequest>, ApiError>,
) -> Result<Response<Body>, OllamaError> {
    let JsonBody(req) = body?;
    let name = req
        .model
        .or(req.name)
        .ok_or_else(|| ApiError::invalid("model", "model is required"))?;
    let hub = HubRef::parse(&name, false).map_err(|e| e.into_api())?;
    let puller = state.models_folder.puller()?;
    if req.stream == Some(false) {
        let _one = state.models_folder.changing.lock().await;
        let path = puller
            .pull(&hub, &mut |_| {})
            .await
            .map_err(|e| e.into_api())?;
        state.models_folder.catalog.refresh();
        return Ok(Json(success(&path)).into_response());
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(PROGRESS_LINES);
    let task = tokio::spawn({
        let state = state.clone();
        async move {
            let _one = state.models_folder.changing.lock().await;
            let progress_tx = tx.clone();
            let mut say = move |p: Progress| {
                // a full buffer skips a line: the next says more
                let _ = progress_tx.try_send(line(&PullLine::from(p)));
            };
            let last = match puller.pull(&hub, &mut say).await {
                Ok(path) => {
                    state.models_folder.catalog.refresh();
                    tracing::info!(model = %name, path = %path.display(), "model pulled");
                    line(&success(&path))
                }
                Err(e) => line(&error_body(&e.into_api().envelope)),
            };
            let _ = tx.send(last).await;
        }
    });
    let guard = AbortOnDrop(task.abort_handle());
    let lines = futures::stream::unfold((rx, guard), |(mut rx, guard)| async move {
        let next = rx.recv().await?;
        Some((Ok::<_, std::io::Error>(next), (rx, guard)))
    });
    let mut resp = Response::new(Body::from_stream(lines));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(resp)
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"model": "gemma-3-270m-Q4_K_M"}))]
pub struct DeleteRequest {
    /// The model's name as listed (its file's name without `.gguf`).
    pub model: Option<String>,
    /// The same (Ollama's older name).
    pub name: Option<String>,
}

/// Removes a model of the folder (its on-demand pool unloaded first).
#[utoipa::path(
    delete, operation_id = "ollamaDelete", path = "/api/delete", tag = "ollama",
    request_body = DeleteRequest,
    responses(
        (status = 200, description = "Removed: no longer listed or served"),
        (status = 404, description = "No model of that name in the folder", body = crate::error::ollama::ErrorBody, example = json!({"error": "model \"smol-Q4_1\" not found"})),
        (status = 409, description = "A configured pool serves it", body = crate::error::ollama::ErrorBody, example = json!({"error": "model \"smol\" is served by the configured pool default: take it out of the configuration first"})),
    )
)]
pub async fn delete(
    State(state): State<SharedState>,
    body: Result<JsonBody<DeleteRequest>, ApiError>,
) -> Result<StatusCode, OllamaError> {
    let JsonBody(req) = body?;
    let name = req
        .model
        .or(req.name)
        .ok_or_else(|| ApiError::invalid("model", "model is required"))?;
    let _one = state.models_folder.changing.lock().await;
    let worker = state.clone();
    tokio::task::spawn_blocking(move || worker.models_folder.delete(&worker.lifecycle, &name))
        .await
        .map_err(|e| ApiError::internal(format!("the delete did not finish: {e}")))??;
    Ok(StatusCode::OK)
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"source": "smol-Q4_1", "destination": "my-smol"}))]
pub struct CopyRequest {
    /// A model of the folder, as listed.
    pub source: String,
    /// Its new name (1-128 of `A-Z a-z 0-9 - _ . :`).
    pub destination: String,
}

/// Copies a model of the folder under another name.
#[utoipa::path(
    post, operation_id = "ollamaCopy", path = "/api/copy", tag = "ollama",
    request_body = CopyRequest,
    responses(
        (status = 200, description = "Copied: both names listed and served"),
        (status = 400, description = "Not a model name", body = crate::error::ollama::ErrorBody, example = json!({"error": "destination: a model name is 1-128 letters, digits, '-', '_', '.' and ':', not starting with '.'"})),
        (status = 404, description = "No model of the source's name in the folder", body = crate::error::ollama::ErrorBody, example = json!({"error": "model \"smol\" not found"})),
        (status = 409, description = "The destination exists", body = crate::error::ollama::ErrorBody, example = json!({"error": "model \"my-smol\" exists: delete it first"})),
    )
)]
pub async fn copy(
    State(state): State<SharedState>,
    body: Result<JsonBody<CopyRequest>, ApiError>,
) -> Result<StatusCode, OllamaError> {
    let JsonBody(req) = body?;
    let _one = state.models_folder.changing.lock().await;
    let worker = state.clone();
    tokio::task::spawn_blocking(move || worker.models_folder.copy(&req.source, &req.destination))
        .await
        .map_err(|e| ApiError::internal(format!("the copy did not finish: {e}")))??;
    Ok(StatusCode::OK)
}
