//! `POST /api/create`: a model of the folder made from another with its own template, system
//! prompt and sampling defaults, as Ollama's `FROM`, `TEMPLATE`, `SYSTEM` and `PARAMETER`
//! (admin keys only; `models_folder/derive.rs` makes it, `models_folder/recipe.rs` applies it).

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderValue, Response, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use utoipa::ToSchema;

use super::pull::PullLine;
use crate::app_state::SharedState;
use crate::error::ollama::OllamaError;
use crate::error::ApiError;
use crate::json_body::JsonBody;
use crate::models_folder::recipe::Parameters;
use crate::models_folder::Creation;

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"model": "pirate", "from": "SmolLM2-135M-Instruct.Q4_1", "system": "You are a pirate.", "parameters": {"temperature": 0.2, "num_ctx": 1024}}))]
pub struct CreateRequest {
    /// The new model's name (1-128 of `A-Z a-z 0-9 - _ . :`).
    pub model: Option<String>,
    /// The same (Ollama's older name).
    pub name: Option<String>,
    /// The folder's model it is built on: its name, or the `hf.co/…` name it was pulled as.
    pub from: Option<String>,
    /// A built-in template's name (`chatml`, `llama3`, `gemma`, …) or Jinja text, as a GGUF's
    /// `tokenizer.chat_template` is written (Ollama's Go templates are refused, naming why).
    pub template: Option<String>,
    /// The system prompt of a chat that brings none.
    pub system: Option<String>,
    /// Sampling defaults, `num_predict` and `num_ctx` (Ollama's `PARAMETER` names).
    pub parameters: Option<Parameters>,
    /// Accepted and not kept.
    #[schema(value_type = Option<Object>)]
    pub license: Option<serde_json::Value>,
    /// Refused: models come from the folder (`from`), not from uploaded blobs.
    #[schema(value_type = Option<Object>)]
    pub files: Option<serde_json::Value>,
    /// Refused: LoRA adapters are not applied here.
    #[schema(value_type = Option<Object>)]
    pub adapters: Option<serde_json::Value>,
    /// Refused: models are served in the format of their file.
    pub quantize: Option<String>,
    /// Refused: a conversation to start from is not kept.
    #[schema(value_type = Option<Object>)]
    pub messages: Option<serde_json::Value>,
    /// Refused: Ollama's older Modelfile text; its clients since 0.4 send the fields above.
    pub modelfile: Option<String>,
    /// Progress lines (default), or one answer at the end.
    pub stream: Option<bool>,
}

fn not_taken(field: &str, why: &str) -> ApiError {
    ApiError::invalid(field, format!("{field} is not taken here: {why}"))
}

impl CreateRequest {
    fn into_creation(self) -> Result<(Creation, bool), ApiError> {
        if self.files.is_some() {
            return Err(not_taken(
                "files",
                "put the GGUF in the models folder (or /api/pull it) and name it in `from`",
            ));
        }
        if self.adapters.is_some() {
            return Err(not_taken("adapters", "LoRA adapters are not applied"));
        }
        if self.quantize.is_some() {
            return Err(not_taken(
                "quantize",
                "a model is served in its file's format; pull the quantization you want",
            ));
        }
        if self.messages.is_some() {
            return Err(not_taken(
                "messages",
                "a conversation to start from is not kept; send it with each chat",
            ));
        }
        if self.modelfile.is_some() {
            return Err(not_taken("modelfile", "send from, template, system and parameters as fields (Ollama's clients since 0.4 do)"));
        }
        let model = self
            .model
            .or(self.name)
            .ok_or_else(|| ApiError::invalid("model", "model is required"))?;
        let from = self.from.ok_or_else(|| {
            ApiError::invalid("from", "from is required: the folder's model to build on")
        })?;
        Ok((
            Creation {
                model,
                from,
                template: self.template,
                system: self.system,
                parameters: self.parameters.unwrap_or_default(),
            },
            self.stream != Some(false),
        ))
    }
}

fn status(s: &str) -> PullLine {
    PullLine {
        status: s.into(),
        model: None,
        digest: None,
        total: None,
        completed: None,
    }
}

/// Makes a model of the folder from another: its file shared, its recipe its own.
#[utoipa::path(
    post, operation_id = "ollamaCreate", path = "/api/create", tag = "ollama",
    request_body = CreateRequest,
    responses(
        (status = 200, description = "Made: listed and served at once (NDJSON status lines ending `{\"status\":\"success\"}`; with `stream: false` that line alone). Made under its source's own name, the source's recipe changes and its pool reloads on its next request", content(
            (PullLine = "application/x-ndjson"),
        )),
        (status = 400, description = "A missing `model` or `from`, a name that cannot be a model's, a template that is neither built in nor Jinja that renders, parameters a request would be refused for, or a field not taken here (`files`, `adapters`, `quantize`, `messages`, `modelfile`)", body = crate::error::ollama::ErrorBody, example = json!({"error": "parameters.temperature: temperature must be within [0, 100]"})),
        (status = 404, description = "No model of the `from` name in the folder", body = crate::error::ollama::ErrorBody, example = json!({"error": "model \"llama3\" not found"})),
        (status = 409, description = "A model of that name exists (delete it first)", body = crate::error::ollama::ErrorBody, example = json!({"error": "model \"pirate\" exists: delete it first"})),
    )
)]
pub async fn create(
    State(state): State<SharedState>,
    body: Result<JsonBody<CreateRequest>, ApiError>,
) -> Result<Response<Body>, OllamaError> {
    let JsonBody(req) = body?;
    let (creation, stream) = req.into_creation()?;
    let model = creation.model.clone();
    let _one = state.models_folder.changing.lock().await;
    let worker = state.clone();
    let from = tokio::task::spawn_blocking(move || {
        worker.models_folder.create(&worker.lifecycle, creation)
    })
    .await
    .map_err(|e| ApiError::internal(format!("the create did not finish: {e}")))??;
    let done = PullLine {
        model: Some(model.clone()),
        ..status("success")
    };
    if !stream {
        return Ok(Json(done).into_response());
    }
    let mut out = Vec::new();
    for line in [
        status(&format!("using model {from}")),
        status(&format!("writing recipe of {model}")),
        done,
    ] {
        out.extend(serde_json::to_vec(&line).unwrap_or_default());
        out.push(b'\n');
    }
    let mut resp = Response::new(Body::from(Bytes::from(out)));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(resp)
}
