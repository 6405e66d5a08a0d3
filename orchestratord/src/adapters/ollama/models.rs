//! `GET /api/tags`, `GET /api/ps`, `POST /api/show` and `GET /api/version`: the models the
//! pools serve, described as Ollama describes its own.

use std::collections::BTreeMap;
use std::path::Path;

use axum::extract::State;
use axum::Json;
use pool_manager::{EngineDescriptor, Pool};

use super::types::*;
use crate::app_state::SharedState;
use crate::error::ollama::OllamaError;
use crate::error::ApiError;
use crate::json_body::JsonBody;

/// `134.5M`, `1.2B`: Ollama's `parameter_size`.
fn parameter_size(n: u64) -> String {
    let n = n as f64;
    if n >= 1e9 {
        format!("{:.1}B", n / 1e9)
    } else if n >= 1e6 {
        format!("{:.1}M", n / 1e6)
    } else {
        format!("{:.1}K", n / 1e3)
    }
}

fn details(pool: &Pool, descriptor: Option<&EngineDescriptor>) -> Details {
    let facts = descriptor.and_then(|d| d.facts.as_ref());
    Details {
        parent_model: String::new(),
        format: if pool.spec().is_local() {
            "gguf".into()
        } else {
            "remote".into()
        },
        family: facts.map(|f| f.architecture.clone()),
        families: facts.map(|f| vec![f.architecture.clone()]),
        parameter_size: facts.map(|f| parameter_size(f.parameters)),
        quantization_level: facts.map(|f| f.quantization.clone()),
    }
}

/// What a model file's header says, as Ollama's `details` (a model of the folder no pool
/// serves yet).
fn file_details(facts: &pool_manager::candle::FileFacts) -> Details {
    Details {
        parent_model: String::new(),
        format: "gguf".into(),
        family: Some(facts.architecture.clone()),
        families: Some(vec![facts.architecture.clone()]),
        parameter_size: Some(parameter_size(facts.parameters)),
        quantization_level: Some(facts.quantization.clone()),
    }
}

/// The model file of a local pool, its length and modification time.
fn file_of(pool: &Pool) -> Option<(&Path, std::fs::Metadata)> {
    if !pool.spec().is_local() {
        return None;
    }
    let path = Path::new(&pool.spec().model_ref);
    Some((path, std::fs::metadata(path).ok()?))
}

fn modified(meta: &std::fs::Metadata) -> Option<String> {
    let t = meta.modified().ok()?;
    Some(humantime::format_rfc3339_nanos(t).to_string())
}

/// One entry; `running`: as `/api/ps` reports it (memory in use, context) rather than as a
/// file on disk.
async fn entry(state: &SharedState, pool: &Pool, running: bool) -> ModelEntry {
    let descriptor = pool.engine().map(|e| e.descriptor());
    let file = file_of(pool);
    let digest = match &file {
        Some((path, _)) => state.model_digests.of(path).await,
        None => None,
    };
    let alias = pool.spec().model_alias.clone();
    let (size, size_vram, context_length) = match (&descriptor, running) {
        (Some(d), true) => {
            let total = d.weights_bytes + d.kv_cache_bytes;
            let on_accel = if d.layers == 0 {
                0
            } else {
                total * d.layers_on_accelerator as u64 / d.layers as u64
            };
            (total, Some(on_accel), Some(d.ctx_max))
        }
        _ => (file.as_ref().map_or(0, |(_, m)| m.len()), None, None),
    };
    ModelEntry {
        name: alias.clone(),
        model: alias,
        modified_at: file.as_ref().and_then(|(_, m)| modified(m)),
        size,
        digest,
        details: details(pool, descriptor.as_ref()),
        size_vram,
        context_length,
        expires_at: running.then(|| expires_at(state, pool)).flatten(),
    }
}

/// When an on-demand pool unloads if nothing uses it: idle, its time left; busy, its whole
/// keep-alive from now. None for a pool that stays loaded.
fn expires_at(state: &SharedState, pool: &Pool) -> Option<String> {
    let o = state.models_folder.on_demand(pool)?;
    let ms = o
        .unloads_in_ms
        .or(o.keep_alive_s.map(|s| s.saturating_mul(1000)))?;
    let at = std::time::SystemTime::now() + std::time::Duration::from_millis(ms);
    Some(humantime::format_rfc3339_millis(at).to_string())
}

/// Every model a pool is configured for, once each (by its alias), loaded or not.
#[utoipa::path(
    get, operation_id = "ollamaTags", path = "/api/tags", tag = "ollama",
    responses((status = 200, description = "The models the pools serve", body = ModelList, example = json!({"models": [{"name": "SmolLM2-135M-Instruct.Q4_1", "model": "SmolLM2-135M-Instruct.Q4_1", "modified_at": "2026-11-20T09:14:02.5Z", "size": 99189312, "digest": "2c9d…", "details": {"parent_model": "", "format": "gguf", "family": "llama", "families": ["llama"], "parameter_size": "134.5M", "quantization_level": "Q4_1"}}]})))
)]
pub async fn tags(State(state): State<SharedState>) -> Json<ModelList> {
    let mut models: Vec<ModelEntry> = Vec::new();
    for p in state.pools.all().iter() {
        if models.iter().any(|m| m.name == p.spec().model_alias) {
            continue;
        }
        models.push(entry(&state, p, false).await);
    }
    // the model folder's models no pool serves yet (a request loads them)
    for e in state.models_folder.entries(&state.lifecycle).await {
        let Ok(facts) = &e.facts else { continue };
        if models.iter().any(|m| m.name == e.name) {
            continue;
        }
        let meta = std::fs::metadata(&e.path).ok();
        models.push(ModelEntry {
            name: e.name.clone(),
            model: e.name.clone(),
            modified_at: meta.as_ref().and_then(modified),
            size: e.bytes,
            digest: state.model_digests.of(&e.path).await,
            details: file_details(facts),
            size_vram: None,
            context_length: None,
            expires_at: None,
        });
    }
    Json(ModelList { models })
}

/// The models loaded now: each pool with an engine, its memory (weights and KV cache; on an
/// accelerator in `size_vram`) and context.
#[utoipa::path(
    get, operation_id = "ollamaPs", path = "/api/ps", tag = "ollama",
    responses((status = 200, description = "The loaded models", body = ModelList))
)]
pub async fn ps(State(state): State<SharedState>) -> Json<ModelList> {
    let mut models = Vec::new();
    for p in state.pools.all().iter().filter(|p| p.engine().is_some()) {
        models.push(entry(&state, p, true).await);
    }
    Json(ModelList { models })
}

/// One model: its details, what its GGUF says (architecture, parameters, context), its chat
/// template and this server's sampling defaults.
#[utoipa::path(
    post, operation_id = "ollamaShow", path = "/api/show", tag = "ollama",
    request_body = ShowRequest,
    responses(
        (status = 200, description = "The model", body = ShowResponse),
        (status = 404, description = "No pool serves the model", body = crate::error::ollama::ErrorBody, example = json!({"error": "model \"llama3\" not found"})),
    )
)]
pub async fn show(
    State(state): State<SharedState>,
    body: Result<JsonBody<ShowRequest>, ApiError>,
) -> Result<Json<ShowResponse>, OllamaError> {
    let JsonBody(req) = body?;
    let entry = state
        .models_folder
        .folder_entry(&state.lifecycle, &req.model)
        .await;
    let recipe = entry.as_ref().and_then(|e| e.recipe().cloned());
    let name = entry.as_ref().map_or(req.model.clone(), |e| e.name.clone());
    let pools = state.pools.all();
    let serving: Vec<_> = pools.iter().filter(|p| p.serves(&name)).collect();
    // a loaded one says the most
    let pool = serving
        .iter()
        .find(|p| p.engine().is_some())
        .or_else(|| serving.first());
    let mut shown = match (pool, &entry) {
        (Some(pool), _) => of_pool(&state, pool),
        (None, Some(e)) => of_file(e)?,
        (None, None) => {
            return Err(ApiError::not_found("model", &req.model)
                .with_field("model")
                .into())
        }
    };
    if let Some(r) = recipe {
        let own = r.parameters.as_text();
        if !own.is_empty() {
            shown.parameters = format!("{own}\n{}", shown.parameters);
        }
        if let Some(from) = &r.from {
            shown.modelfile = format!("FROM {from}\n");
            shown.details.parent_model = from.clone();
        }
        if let Some(system) = &r.system {
            shown
                .modelfile
                .push_str(&format!("SYSTEM \"\"\"{system}\"\"\"\n"));
        }
        shown.template = r.template.or(shown.template);
        shown.system = r.system;
    }
    Ok(Json(shown))
}

/// The server's sampling defaults, one `name value` a line.
fn server_defaults(state: &SharedState) -> String {
    let sampling = pool_manager::SamplingParams::default();
    format!(
        "temperature {}\ntop_p {}\nnum_predict {}",
        sampling.temperature, sampling.top_p, state.cfg.admission.default_max_tokens
    )
}

/// What a pool serving the model says of it.
fn of_pool(state: &SharedState, pool: &Pool) -> ShowResponse {
    let descriptor = pool.engine().map(|e| e.descriptor());
    let facts = descriptor.as_ref().and_then(|d| d.facts.clone());
    let mut model_info = BTreeMap::new();
    if let Some(d) = &descriptor {
        model_info.insert("general.name".to_string(), d.model_name.clone().into());
    }
    if let Some(f) = &facts {
        model_info.insert(
            "general.architecture".to_string(),
            f.architecture.clone().into(),
        );
        model_info.insert("general.parameter_count".to_string(), f.parameters.into());
        if let Some(d) = &descriptor {
            model_info.insert(
                format!("{}.context_length", f.architecture),
                d.ctx_max.into(),
            );
        }
    }
    ShowResponse {
        template: facts.as_ref().and_then(|f| f.chat_template.clone()),
        system: None,
        modelfile: format!("FROM {}\n", pool.spec().model_ref),
        parameters: server_defaults(state),
        details: details(pool, descriptor.as_ref()),
        model_info,
        // tools are decoded under a JSON Schema, which every generating engine takes (the
        // built-in one, and a remote worker's backend); an encoder only embeds (Ollama's
        // word for a model its /api/embed is for)
        capabilities: match descriptor.as_ref().is_some_and(|d| !d.generates) {
            true => vec!["embedding"],
            false => vec!["completion", "tools"],
        },
        modified_at: file_of(pool).and_then(|(_, m)| modified(&m)),
    }
}

/// What the header of a model of the folder no pool serves yet says of it.
fn of_file(e: &crate::models_folder::Entry) -> Result<ShowResponse, ApiError> {
    let facts = e
        .facts
        .as_ref()
        .map_err(|_| ApiError::invalid("model", format!("model {:?} cannot be read", e.name)))?;
    let mut model_info = BTreeMap::new();
    if let Some(n) = &facts.name {
        model_info.insert("general.name".to_string(), n.clone().into());
    }
    model_info.insert(
        "general.architecture".to_string(),
        facts.architecture.clone().into(),
    );
    model_info.insert(
        "general.parameter_count".to_string(),
        facts.parameters.into(),
    );
    if let Some(c) = facts.context_length {
        model_info.insert(format!("{}.context_length", facts.architecture), c.into());
    }
    Ok(ShowResponse {
        template: None,
        system: None,
        modelfile: format!("FROM {}\n", e.name),
        parameters: String::new(),
        details: file_details(facts),
        model_info,
        capabilities: match facts.architecture.as_str() {
            a if pool_manager::candle::ENCODER_ARCHITECTURES.contains(&a) => vec!["embedding"],
            _ => vec!["completion", "tools"],
        },
        modified_at: e
            .modified
            .map(|t| humantime::format_rfc3339_nanos(t).to_string()),
    })
}

/// This server's version (the `orchestratord` crate's).
#[utoipa::path(
    get, operation_id = "ollamaVersion", path = "/api/version", tag = "ollama",
    responses((status = 200, description = "The server's version", body = Version))
)]
pub async fn version() -> Json<Version> {
    Json(Version {
        version: env!("CARGO_PKG_VERSION").to_string(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn parameter_sizes_read_as_ollama_writes_them() {
        assert_eq!(super::parameter_size(134_515_008), "134.5M");
        assert_eq!(super::parameter_size(1_235_814_400), "1.2B");
        assert_eq!(super::parameter_size(268_098_176), "268.1M");
    }
}
