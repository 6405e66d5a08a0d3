//! Rendering chat turns into a prompt with the model's own Jinja template (minijinja).

use minijinja::{Environment, ErrorKind};

use engine_port::ChatTurn;

use crate::error::{EngineError, Result};

/// ChatML, used when a model ships no `tokenizer.chat_template` (documented fallback).
pub const CHATML_FALLBACK: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Gemma's turns (`<start_of_turn>user` … `<end_of_turn>`, the assistant is `model`, a system
/// message goes before the first user turn's text), for Gemma GGUFs that ship no template —
/// Google's own template without its `bos_token`, which the tokenizer adds.
pub const GEMMA_FALLBACK: &str = "{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}{%- for message in loop_messages -%}{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}{%- else -%}{%- set role = message['role'] -%}{%- endif -%}{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{%- endfor -%}{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}";

/// A piece of a rendered prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// The template's own text: special tokens written here are control tokens.
    Markup(String),
    /// A message's content, from a client: tokenized as plain text.
    Content(String),
}

impl Piece {
    pub fn text(&self) -> &str {
        match self {
            Self::Markup(t) | Self::Content(t) => t,
        }
    }
}

/// Where the template in use came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateSource {
    /// `tokenizer.chat_template` from the GGUF metadata.
    Model,
    /// The model had none; ChatML is used.
    ChatMlFallback,
    /// A Gemma model had none; Gemma's turns are used ([`GEMMA_FALLBACK`]).
    GemmaFallback,
    /// The pool's configuration gave one (a built-in name or a Jinja file), over the model's.
    Configured,
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
    /// Compiles `template`, or when `None` the fallback of the `architecture` (Gemma's for
    /// `gemma*`, else ChatML).
    pub fn new(
        template: Option<&str>,
        architecture: &str,
        bos_token: String,
        eos_token: String,
    ) -> Result<Self> {
        let (text, source) = match template {
            Some(t) => (t.to_string(), TemplateSource::Model),
            None if architecture.starts_with("gemma") => {
                (GEMMA_FALLBACK.to_string(), TemplateSource::GemmaFallback)
            }
            None => (CHATML_FALLBACK.to_string(), TemplateSource::ChatMlFallback),
        };
        Self::compile(text, source, bos_token, eos_token)
    }

    /// Compiles a template the pool's configuration gives, used whatever the model carries.
    pub fn configured(template: &str, bos_token: String, eos_token: String) -> Result<Self> {
        Self::compile(
            template.to_string(),
            TemplateSource::Configured,
            bos_token,
            eos_token,
        )
    }

    /// Whether `template` compiles and renders a conversation: checked when a configuration
    /// is read, so a broken template is a start-up error, not every chat's.
    pub fn check(template: &str) -> std::result::Result<(), String> {
        let t =
            Self::configured(template, String::new(), String::new()).map_err(|e| e.to_string())?;
        let probe = [ChatTurn {
            role: "user".into(),
            content: "hi".into(),
        }];
        t.render(&probe).map(|_| ()).map_err(|e| e.to_string())
    }

    fn compile(
        text: String,
        source: TemplateSource,
        bos_token: String,
        eos_token: String,
    ) -> Result<Self> {
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

    /// Renders the conversation as pieces: the template's own text (`Piece::Markup`, where
    /// special tokens count) and the messages' contents (`Piece::Content`, text from clients,
    /// where they do not). Each content is replaced by a placeholder with a fresh random nonce
    /// while the template runs, then put back, so no content can ever be read as markup. A
    /// template that transforms contents (trims them, say) sees only the placeholder: the
    /// content goes in as sent.
    pub fn render_pieces(&self, messages: &[ChatTurn]) -> Result<Vec<Piece>> {
        let nonce: u64 = rand::random();
        let mark = |i: usize| format!("\u{E000}{nonce:016x}:{i}\u{E001}");
        let masked: Vec<ChatTurn> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| ChatTurn {
                role: m.role.clone(),
                content: mark(i),
            })
            .collect();
        let text = self.render(&masked)?;
        let mut pieces = Vec::new();
        let mut rest = text.as_str();
        let prefix = format!("\u{E000}{nonce:016x}:");
        while let Some(at) = rest.find(&prefix) {
            let after = &rest[at + prefix.len()..];
            let Some(end) = after.find('\u{E001}') else {
                break;
            };
            let Some(m) = after[..end]
                .parse::<usize>()
                .ok()
                .and_then(|i| messages.get(i))
            else {
                break;
            };
            if at > 0 {
                pieces.push(Piece::Markup(rest[..at].to_string()));
            }
            pieces.push(Piece::Content(m.content.clone()));
            rest = &after[end + '\u{E001}'.len_utf8()..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Markup(rest.to_string()));
        }
        Ok(pieces)
    }

    /// Renders the conversation with the generation prompt for the assistant's next turn.
    pub fn render(&self, messages: &[ChatTurn]) -> Result<String> {
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
