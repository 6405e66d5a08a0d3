//! Rendering chat turns into a prompt with the model's own Jinja template (minijinja).

use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};

/// One chat turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

/// ChatML, used when a model ships no `tokenizer.chat_template` (documented fallback).
pub const CHATML_FALLBACK: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Where the template in use came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateSource {
    /// `tokenizer.chat_template` from the GGUF metadata.
    Model,
    /// The model had none; ChatML is used.
    ChatMlFallback,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: TemplateSource,
    bos_token: String,
    eos_token: String,
}

const NAME: &str = "chat";

fn raise_exception(msg: String) -> std::result::Result<String, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
}

impl ChatTemplate {
    /// Compiles `template`, or the ChatML fallback when `None`.
    pub fn new(template: Option<&str>, bos_token: String, eos_token: String) -> Result<Self> {
        let (text, source) = match template {
            Some(t) => (t.to_string(), TemplateSource::Model),
            None => (CHATML_FALLBACK.to_string(), TemplateSource::ChatMlFallback),
        };
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(NAME, text)
            .map_err(|e| EngineError::ChatTemplate(format!("cannot compile: {e}")))?;
        Ok(Self {
            env,
            source,
            bos_token,
            eos_token,
        })
    }

    pub fn source(&self) -> TemplateSource {
        self.source
    }

    /// Renders the conversation with the generation prompt for the assistant's next turn.
    pub fn render(&self, messages: &[ChatMessage]) -> Result<String> {
        if messages.is_empty() {
            return Err(EngineError::ChatTemplate("no messages to render".into()));
        }
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| EngineError::ChatTemplate(e.to_string()))?;
        tmpl.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        })
        .map_err(|e| EngineError::ChatTemplate(format!("cannot render: {e}")))
    }
}
