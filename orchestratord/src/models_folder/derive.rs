//! Models made from models of the folder: a copy under another name (`/api/copy`), and a model
//! with its own recipe — template, system prompt, sampling defaults, context — built on one
//! (`/api/create`, Ollama's `FROM` with `TEMPLATE`, `SYSTEM` and `PARAMETER`s). Both share the
//! GGUF (a hard link where the folder's file system allows, else a copy written aside and
//! renamed into place) and are listed at once.

use std::path::Path;

use contracts::TaskRequest;
use pool_manager::candle;

use super::recipe::{self, Parameters, Recipe, MAX_NUM_CTX, MAX_TEXT_BYTES};
use super::ModelsFolder;
use crate::error::ApiError;
use crate::lifecycle::state::SharedLifecycle;

/// What `/api/create` asks for.
#[derive(Debug, Clone)]
pub struct Creation {
    /// The new model's name.
    pub model: String,
    /// The folder's model it is built on (by name, or the hub name it was pulled as).
    pub from: String,
    /// A built-in template's name (`chatml`, `llama3`, …) or Jinja text.
    pub template: Option<String>,
    pub system: Option<String>,
    pub parameters: Parameters,
}

/// Whether `name` can name a model of the folder (it becomes a file name).
fn check_name(field: &str, name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && !name.ends_with(".recipe")
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
    if ok {
        return Ok(());
    }
    Err(ApiError::invalid(
        field,
        format!("{field}: a model name is 1-128 letters, digits, '-', '_', '.' and ':', not starting with '.'"),
    ))
}

/// The file at `source` also at `target`: a hard link, else a copy written aside and renamed.
fn link_or_copy(source: &Path, target: &Path) -> Result<(), ApiError> {
    if std::fs::hard_link(source, target).is_ok() {
        return Ok(());
    }
    let name = target.file_name().unwrap_or_default().to_string_lossy();
    let aside = target.with_file_name(format!(".{name}.partial"));
    std::fs::copy(source, &aside)
        .and_then(|_| std::fs::rename(&aside, target))
        .map_err(|e| {
            let _ = std::fs::remove_file(&aside);
            ApiError::internal(format!("cannot copy {}: {e}", source.display()))
        })
}

/// The Jinja text of a recipe's `template`: a built-in template's name, or Jinja that renders.
fn template_text(t: &str) -> Result<String, ApiError> {
    if let Some(text) = candle::builtin_template(t.trim()) {
        return Ok(text.to_string());
    }
    if t.len() > MAX_TEXT_BYTES {
        return Err(ApiError::invalid(
            "template",
            format!("a template is at most {} KiB", MAX_TEXT_BYTES >> 10),
        ));
    }
    candle::check_template(t).map_err(|e| {
        let names: Vec<&str> = candle::builtin_template_names().collect();
        ApiError::invalid(
            "template",
            format!(
                "the template is neither a built-in one ({}) nor Jinja that renders (Ollama's Go templates are not read here; a GGUF's tokenizer.chat_template is Jinja): {e}",
                names.join(", ")
            ),
        )
    })?;
    Ok(t.to_string())
}

/// Refuses sampling defaults a request carrying them would be refused for, and a context or
/// a `num_predict` that means nothing.
fn check_parameters(state: &SharedLifecycle, p: &Parameters) -> Result<(), ApiError> {
    if p.num_ctx.is_some_and(|n| n == 0 || n > MAX_NUM_CTX) {
        return Err(ApiError::invalid(
            "parameters.num_ctx",
            format!("num_ctx must be within [1, {MAX_NUM_CTX}]"),
        ));
    }
    if p.num_predict.is_some_and(|n| n == 0 || n < -2) {
        return Err(ApiError::invalid(
            "parameters.num_predict",
            "num_predict must be at least 1, or -1 for as many as the context allows",
        ));
    }
    let mut probe = TaskRequest {
        prompt: Some("x".into()),
        ..Default::default()
    };
    Recipe {
        parameters: p.clone(),
        ..Default::default()
    }
    .apply(&mut probe);
    crate::lifecycle::admission::validate(state, &probe)
        .map(|_| ())
        .map_err(|e| {
            let field = e.envelope.field.clone().unwrap_or_default();
            let field = match field.as_str() {
                "max_tokens" => "num_predict",
                "repetition_penalty" => "repeat_penalty",
                f => f,
            };
            ApiError::invalid(format!("parameters.{field}"), e.envelope.message)
        })
}

impl ModelsFolder {
    /// Copies the folder's model `source` as `destination`, its recipe with it (but not the
    /// hub name it was pulled as: that names the source).
    pub fn copy(&self, source: &str, destination: &str) -> Result<(), ApiError> {
        let Some(entry) = self.catalog.find(source) else {
            return Err(ApiError::not_found("model", source).with_field("source"));
        };
        check_name("destination", destination)?;
        if self.catalog.find(destination).is_some() {
            return Err(ApiError::conflict(format!(
                "model {destination:?} exists: delete it first"
            )));
        }
        let dir = entry.path.parent().unwrap_or(Path::new("."));
        let target = dir.join(format!("{destination}.gguf"));
        link_or_copy(&entry.path, &target)?;
        if let Some(r) = entry.recipe() {
            let r = Recipe {
                pulled_as: None,
                ..r.clone()
            };
            recipe::write(&target, &r).map_err(|e| {
                ApiError::internal(format!("cannot write the recipe of {destination}: {e}"))
            })?;
        }
        self.catalog.refresh();
        tracing::info!(source, destination, "model copied");
        Ok(())
    }

    /// Makes the model `c.model`: `c.from`'s file with `c.from`'s recipe and what `c` gives
    /// over it. Made under its own name, it is listed at once; made under `c.from`'s own name,
    /// its recipe changes and its pool (if loaded) is unloaded so that its next request loads
    /// it as the recipe now says. Returns the name it was made from.
    pub fn create(&self, state: &SharedLifecycle, c: Creation) -> Result<String, ApiError> {
        check_name("model", &c.model)?;
        let Some(source) = self.catalog.find(&c.from) else {
            return Err(ApiError::not_found("model", &c.from).with_field("from"));
        };
        if let Some(Err(why)) = &source.recipe {
            return Err(ApiError::invalid(
                "from",
                format!("model {:?} cannot be built on: {why}", c.from),
            ));
        }
        if c.system.as_ref().is_some_and(|s| s.len() > MAX_TEXT_BYTES) {
            return Err(ApiError::invalid(
                "system",
                format!("a system prompt is at most {} KiB", MAX_TEXT_BYTES >> 10),
            ));
        }
        let template = c.template.as_deref().map(template_text).transpose()?;
        check_parameters(state, &c.parameters)?;
        let base = source.recipe().cloned().unwrap_or_default();
        let p = c.parameters;
        let b = base.parameters.clone();
        let made = Recipe {
            from: Some(source.name.clone()),
            pulled_as: None,
            template: template.or(base.template.clone()),
            system: c.system.or(base.system.clone()),
            parameters: Parameters {
                temperature: p.temperature.or(b.temperature),
                top_k: p.top_k.or(b.top_k),
                top_p: p.top_p.or(b.top_p),
                min_p: p.min_p.or(b.min_p),
                seed: p.seed.or(b.seed),
                stop: p.stop.or(b.stop),
                num_predict: p.num_predict.or(b.num_predict),
                num_ctx: p.num_ctx.or(b.num_ctx),
                repeat_penalty: p.repeat_penalty.or(b.repeat_penalty),
                presence_penalty: p.presence_penalty.or(b.presence_penalty),
                frequency_penalty: p.frequency_penalty.or(b.frequency_penalty),
            },
        };
        let write_err =
            |e: std::io::Error| ApiError::internal(format!("cannot write the recipe: {e}"));
        if c.model == source.name {
            // the model itself, made again: its hub name stays
            let made = Recipe {
                from: base.from.clone(),
                pulled_as: base.pulled_as.clone(),
                ..made
            };
            recipe::write(&source.path, &made).map_err(write_err)?;
            for pool in super::pools_serving(state, &source.name) {
                if self.owns(pool.id()) {
                    self.unload(state, &pool, "recreated");
                }
            }
        } else {
            if self.catalog.find(&c.model).is_some() {
                return Err(ApiError::conflict(format!(
                    "model {:?} exists: delete it first",
                    c.model
                )));
            }
            let dir = source.path.parent().unwrap_or(Path::new("."));
            let target = dir.join(format!("{}.gguf", c.model));
            link_or_copy(&source.path, &target)?;
            if let Err(e) = recipe::write(&target, &made) {
                let _ = std::fs::remove_file(&target);
                return Err(write_err(e));
            }
        }
        self.catalog.refresh();
        tracing::info!(model = %c.model, from = %source.name, "model created");
        Ok(source.name)
    }
}
