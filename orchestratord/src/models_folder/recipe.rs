//! A model's recipe: what a model of the folder is beyond its GGUF — the chat template, system
//! prompt, sampling defaults and context `/api/create` gave it, and the hub name a pulled model
//! was pulled as (so `hf.co/OWNER/REPO:QUANT` names it, as it does in Ollama). Kept beside the
//! file as `NAME.recipe.json`, written aside and renamed into place; read with the folder.
//!
//! What a request says wins over the recipe: its defaults fill only what the request left out,
//! and its system prompt is put first only in a chat that has none (Ollama's order).

use std::path::{Path, PathBuf};

use contracts::{ChatTurn, StopField, TaskRequest};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The largest recipe file read (a template and a system prompt of up to 32 KiB each, and
/// room for the rest).
pub const MAX_RECIPE_BYTES: u64 = 80 << 10;
/// The longest template or system prompt a recipe keeps.
pub const MAX_TEXT_BYTES: usize = 32 << 10;
/// The largest context a recipe may ask for (`num_ctx`).
pub const MAX_NUM_CTX: usize = 1 << 20;

/// Ollama's `parameters` this server applies (the names of its Modelfile's `PARAMETER`s).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Parameters {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// One stop sequence or several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub stop: Option<StopField>,
    /// Tokens to generate when a request says not (-1 and -2: as many as the context allows).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_predict: Option<i64>,
    /// The context per sequence of the model's pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub num_ctx: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repeat_penalty: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f32>,
}

impl Parameters {
    /// Ollama's text for them (`/api/show`'s `parameters`: one `name value` a line).
    pub fn as_text(&self) -> String {
        let mut out = Vec::new();
        let mut line = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                out.push(format!("{k:<16}{v}"));
            }
        };
        line("temperature", self.temperature.map(|v| v.to_string()));
        line("top_k", self.top_k.map(|v| v.to_string()));
        line("top_p", self.top_p.map(|v| v.to_string()));
        line("min_p", self.min_p.map(|v| v.to_string()));
        line("seed", self.seed.map(|v| v.to_string()));
        line("num_predict", self.num_predict.map(|v| v.to_string()));
        line("num_ctx", self.num_ctx.map(|v| v.to_string()));
        line("repeat_penalty", self.repeat_penalty.map(|v| v.to_string()));
        line(
            "presence_penalty",
            self.presence_penalty.map(|v| v.to_string()),
        );
        line(
            "frequency_penalty",
            self.frequency_penalty.map(|v| v.to_string()),
        );
        for s in self
            .stop
            .clone()
            .map(StopField::into_vec)
            .unwrap_or_default()
        {
            line("stop", Some(format!("{s:?}")));
        }
        out.join("\n")
    }
}

/// What a model of the folder is beyond its file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// The model it was created from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The hub name it was pulled as (`hf.co/OWNER/REPO[:QUANT]`): a second name for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pulled_as: Option<String>,
    /// The chat template (Jinja text) its pool renders chats with instead of its GGUF's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The system prompt of a chat that brings none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    #[serde(default, skip_serializing_if = "is_default")]
    pub parameters: Parameters,
}

fn is_default(p: &Parameters) -> bool {
    *p == Parameters::default()
}

impl Recipe {
    /// Whether it changes nothing a request or a load sees.
    pub fn is_empty(&self) -> bool {
        self.template.is_none() && self.system.is_none() && is_default(&self.parameters)
    }

    /// Fills what `req` left out with the recipe's defaults, and puts its system prompt first
    /// in a chat that has none (a raw prompt is sent as it is).
    pub fn apply(&self, req: &mut TaskRequest) {
        let p = &self.parameters;
        req.temperature = req.temperature.or(p.temperature);
        req.top_k = req.top_k.or(p.top_k);
        req.top_p = req.top_p.or(p.top_p);
        req.min_p = req.min_p.or(p.min_p);
        req.seed = req.seed.or(p.seed);
        req.repetition_penalty = req.repetition_penalty.or(p.repeat_penalty);
        req.presence_penalty = req.presence_penalty.or(p.presence_penalty);
        req.frequency_penalty = req.frequency_penalty.or(p.frequency_penalty);
        if req.stop.is_none() {
            req.stop = p.stop.clone();
        }
        if req.max_tokens.is_none() {
            req.max_tokens = p.num_predict.filter(|n| *n > 0).map(|n| n as u32);
        }
        if let (Some(system), Some(turns)) = (&self.system, &mut req.messages) {
            if !turns.iter().any(|t| t.role == "system") {
                turns.insert(
                    0,
                    ChatTurn {
                        role: "system".into(),
                        content: system.clone(),
                    },
                );
            }
        }
    }
}

/// Where the recipe of the model file at `gguf` is kept.
pub fn path_of(gguf: &Path) -> PathBuf {
    let stem = gguf
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    gguf.with_file_name(format!("{stem}.recipe.json"))
}

/// The recipe of the model file at `gguf`: `None` without one, an error saying why one cannot
/// be read (too large, not a recipe).
pub fn read(gguf: &Path) -> Option<Result<Recipe, String>> {
    let path = path_of(gguf);
    let meta = std::fs::symlink_metadata(&path).ok()?;
    if !meta.is_file() {
        return Some(Err(format!(
            "{} is not a plain file",
            path.file_name()?.to_string_lossy()
        )));
    }
    if meta.len() > MAX_RECIPE_BYTES {
        return Some(Err(format!(
            "its recipe is over {} KiB",
            MAX_RECIPE_BYTES >> 10
        )));
    }
    Some(
        std::fs::read(&path)
            .map_err(|e| format!("its recipe cannot be read: {e}"))
            .and_then(|b| {
                serde_json::from_slice(&b).map_err(|e| format!("its recipe is not valid: {e}"))
            }),
    )
}

/// Writes `recipe` beside the model file at `gguf` (aside, then renamed into place); an empty
/// recipe removes the file.
pub fn write(gguf: &Path, recipe: &Recipe) -> std::io::Result<()> {
    let path = path_of(gguf);
    if recipe.is_empty() && recipe.pulled_as.is_none() {
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let aside = path.with_file_name(format!(".{name}.partial"));
    let bytes = serde_json::to_vec_pretty(recipe).map_err(std::io::Error::other)?;
    std::fs::write(&aside, bytes).and_then(|_| std::fs::rename(&aside, &path))
}

/// Removes the recipe of the model file at `gguf`, if it has one.
pub fn remove(gguf: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path_of(gguf)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// MOD-CREATE-2: a request's own fields win; the recipe fills the rest and gives a chat
    /// without a system turn its system prompt.
    #[test]
    fn a_recipe_fills_only_what_the_request_left_out() {
        let recipe = Recipe {
            system: Some("You are a pirate.".into()),
            parameters: Parameters {
                temperature: Some(0.0),
                top_k: Some(5),
                num_predict: Some(7),
                stop: Some(StopField::One("\n".into())),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut req: TaskRequest = serde_json::from_value(serde_json::json!({
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0.5,
        }))
        .unwrap();
        recipe.apply(&mut req);
        assert_eq!(req.temperature, Some(0.5));
        assert_eq!(req.top_k, Some(5));
        assert_eq!(req.max_tokens, Some(7));
        assert_eq!(req.stop, Some(StopField::One("\n".into())));
        let turns = req.messages.as_ref().unwrap();
        assert_eq!(turns[0].role, "system");
        assert_eq!(turns[0].content, "You are a pirate.");
        // a chat with its own system turn keeps it, alone
        let mut own: TaskRequest = serde_json::from_value(serde_json::json!({
            "messages": [{"role": "system", "content": "mine"}, {"role": "user", "content": "hi"}],
            "max_tokens": 3,
        }))
        .unwrap();
        recipe.apply(&mut own);
        let turns = own.messages.unwrap();
        assert_eq!(turns.len(), 2);
        assert_eq!(turns[0].content, "mine");
        assert_eq!(own.max_tokens, Some(3));
        // -1: as many as the context allows, the server's default
        let endless = Recipe {
            parameters: Parameters {
                num_predict: Some(-1),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut req: TaskRequest =
            serde_json::from_value(serde_json::json!({"prompt": "x"})).unwrap();
        endless.apply(&mut req);
        assert_eq!(req.max_tokens, None);
    }

    #[test]
    fn a_recipe_is_written_beside_its_file_and_read_back() {
        let dir = std::env::temp_dir().join(format!("orchd-recipe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let gguf = dir.join("m-Q4.gguf");
        assert!(read(&gguf).is_none());
        let r = Recipe {
            pulled_as: Some("hf.co/a/b:Q4".into()),
            ..Default::default()
        };
        write(&gguf, &r).unwrap();
        assert!(dir.join("m-Q4.recipe.json").is_file());
        assert_eq!(read(&gguf).unwrap().unwrap(), r);
        std::fs::write(path_of(&gguf), b"{\"nope\": 1}").unwrap();
        let err = read(&gguf).unwrap().unwrap_err();
        assert!(err.contains("not valid"), "{err}");
        remove(&gguf).unwrap();
        assert!(read(&gguf).is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
