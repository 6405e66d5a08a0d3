//! Ollama's requests as tasks: `options` checked and mapped onto the task's sampling, the
//! fields this server does not serve refused by name.

use contracts::{ChatTurn, TaskRequest};

use super::types::{ChatRequest, GenerateRequest, Message, Options};
use crate::adapters::tool_calls;
use crate::app_state::SharedState;
use crate::error::ApiError;

fn refuse(field: &str, why: &str) -> ApiError {
    ApiError::invalid(field, why)
}

/// A sampler parameter this server has no sampler for: accepted at its neutral value only.
fn neutral<T: PartialEq + Copy + std::fmt::Display>(
    value: Option<T>,
    neutral: T,
    name: &str,
) -> Result<(), ApiError> {
    match value {
        Some(v) if v != neutral => Err(refuse(
            &format!("options.{name}"),
            &format!("{name} = {v} is not supported: this server's sampler has no {name} (leave it out or send {neutral})"),
        )),
        _ => Ok(()),
    }
}

/// `think`: `false` (or absent) only.
fn no_thinking(think: &Option<serde_json::Value>, model: &str) -> Result<(), ApiError> {
    match think {
        None | Some(serde_json::Value::Null) | Some(serde_json::Value::Bool(false)) => Ok(()),
        Some(_) => Err(refuse(
            "think",
            &format!("\"{model}\" does not support thinking"),
        )),
    }
}

/// The context the pools serving `model` offer: the largest.
fn served_context(state: &SharedState, model: &str) -> Option<usize> {
    state
        .pools
        .all()
        .iter()
        .filter(|p| p.serves(model))
        .map(|p| p.engine().map_or(p.spec().ctx, |e| e.descriptor().ctx_max))
        .max()
}

/// Applies `options` to `task`.
fn apply_options(
    state: &SharedState,
    model: &str,
    options: &Option<Options>,
    task: &mut TaskRequest,
) -> Result<(), ApiError> {
    let Some(o) = options else {
        return Ok(());
    };
    neutral(o.typical_p, 1.0, "typical_p")?;
    neutral(o.mirostat, 0, "mirostat")?;
    neutral(o.tfs_z, 1.0, "tfs_z")?;
    task.temperature = o.temperature;
    task.top_p = o.top_p;
    task.min_p = o.min_p;
    task.top_k = match o.top_k {
        None | Some(0) => None,
        Some(k) if k < 0 => {
            return Err(refuse("options.top_k", "top_k must be 0 (off) or more"));
        }
        Some(k) => Some(u32::try_from(k).unwrap_or(u32::MAX)),
    };
    // llama.cpp's and Ollama's -1: a random seed
    task.seed = o.seed.and_then(|s| u64::try_from(s).ok());
    task.max_tokens = match o.num_predict {
        None | Some(-1) | Some(-2) => None,
        Some(n) if n >= 1 => Some(u32::try_from(n).unwrap_or(u32::MAX)),
        Some(_) => {
            return Err(refuse(
                "options.num_predict",
                "num_predict must be at least 1, or -1 for as many as the context allows",
            ))
        }
    };
    task.stop = o.stop.clone();
    task.repetition_penalty = o.repeat_penalty;
    task.presence_penalty = o.presence_penalty;
    task.frequency_penalty = o.frequency_penalty;
    if let Some(n) = o.num_ctx {
        if n < 1 {
            return Err(refuse("options.num_ctx", "num_ctx must be at least 1"));
        }
        // as Ollama does past a model's context: the context served, said in the log (a
        // prompt longer than it is still refused, naming the prompt)
        if let Some(ctx) = served_context(state, model).filter(|ctx| n as u64 > *ctx as u64) {
            tracing::info!(
                model,
                num_ctx = n,
                ctx,
                "num_ctx is over the context the model is served with: clamped to it"
            );
        }
    }
    Ok(())
}

/// `format`: `"json"` (any JSON object, as Ollama's JSON mode) or a JSON Schema, as the task's
/// schema; absent, null or empty: text.
fn format_schema(
    format: &Option<serde_json::Value>,
) -> Result<Option<serde_json::Value>, ApiError> {
    use serde_json::Value;
    match format {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if s == "json" => Ok(Some(serde_json::json!({"type": "object"}))),
        Some(schema @ Value::Object(_)) => Ok(Some(schema.clone())),
        Some(_) => Err(refuse(
            "format",
            "format must be \"json\" or a JSON Schema object",
        )),
    }
}

fn turn(i: usize, m: &Message) -> Result<ChatTurn, ApiError> {
    let at = |f: &str| format!("messages[{i}].{f}");
    if m.images.as_ref().is_some_and(|v| !v.is_empty()) {
        return Err(refuse(
            &at("images"),
            "images are not supported: the models served here read text only",
        ));
    }
    if let Some(calls) = m.tool_calls.as_ref().filter(|v| !v.is_null()) {
        if m.role != "assistant" {
            return Err(refuse(
                &at("tool_calls"),
                "only an assistant turn has tool_calls",
            ));
        }
        return Ok(ChatTurn {
            role: m.role.clone(),
            content: super::tools::history_calls(i, calls)?,
        });
    }
    if m.role == "tool" {
        // a tool's result reaches the model as a user turn (any chat template has one)
        return Ok(ChatTurn {
            role: "user".into(),
            content: tool_calls::history_result(m.tool_name.as_deref(), &m.content, false),
        });
    }
    Ok(ChatTurn {
        role: m.role.clone(),
        content: m.content.clone(),
    })
}

/// The `options` name of a task field admission may refuse (`max_tokens` is `num_predict`), so
/// a refusal names what the client sent.
pub fn option_name(task_field: &str) -> Option<&'static str> {
    Some(match task_field {
        "temperature" => "temperature",
        "top_p" => "top_p",
        "top_k" => "top_k",
        "min_p" => "min_p",
        "seed" => "seed",
        "max_tokens" => "num_predict",
        "stop" => "stop",
        "repetition_penalty" => "repeat_penalty",
        "presence_penalty" => "presence_penalty",
        "frequency_penalty" => "frequency_penalty",
        _ => return None,
    })
}

/// `/api/chat` as a task (`None`: no messages, the "load" request), and whether its answer is
/// decoded under the request's tools.
pub fn chat_task(
    state: &SharedState,
    req: &ChatRequest,
) -> Result<(Option<TaskRequest>, bool), ApiError> {
    no_thinking(&req.think, &req.model)?;
    let toolbox = super::tools::toolbox(&req.tools)?;
    let mut task = TaskRequest {
        model: Some(req.model.clone()),
        json_schema: format_schema(&req.format)?,
        logprobs: req.logprobs,
        top_logprobs: req.top_logprobs,
        priority: req.priority,
        ..Default::default()
    };
    apply_options(state, &req.model, &req.options, &mut task)?;
    if req.messages.is_empty() {
        return Ok((None, false));
    }
    let mut turns = req
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| turn(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(t) = &toolbox {
        if task.json_schema.is_some() {
            return Err(refuse("format", "format cannot be combined with tools"));
        }
        if req.logprobs == Some(true) {
            return Err(refuse("logprobs", "logprobs cannot be combined with tools"));
        }
        tool_calls::instruct(&mut turns, t);
        task.json_schema = Some(t.schema());
    }
    task.messages = Some(turns);
    Ok((Some(task), toolbox.is_some()))
}

/// `/api/generate` as a task. `None`: no prompt (the "load" request).
pub fn generate_task(
    state: &SharedState,
    req: &GenerateRequest,
) -> Result<Option<TaskRequest>, ApiError> {
    no_thinking(&req.think, &req.model)?;
    if req.template.as_deref().is_some_and(|t| !t.is_empty()) {
        return Err(refuse(
            "template",
            "a custom template is not supported: the model's own chat template is applied (or none with raw)",
        ));
    }
    if req.suffix.as_deref().is_some_and(|t| !t.is_empty()) {
        return Err(refuse(
            "suffix",
            "fill-in-the-middle (suffix) is not supported",
        ));
    }
    if req.images.as_ref().is_some_and(|v| !v.is_empty()) {
        return Err(refuse(
            "images",
            "images are not supported: the models served here read text only",
        ));
    }
    if req.context.as_ref().is_some_and(|v| !v.is_empty()) {
        return Err(refuse(
            "context",
            "context (an earlier answer's tokens) is not supported: send the conversation to /api/chat",
        ));
    }
    let mut task = TaskRequest {
        model: Some(req.model.clone()),
        json_schema: format_schema(&req.format)?,
        logprobs: req.logprobs,
        top_logprobs: req.top_logprobs,
        priority: req.priority,
        ..Default::default()
    };
    apply_options(state, &req.model, &req.options, &mut task)?;
    if req.prompt.is_empty() {
        return Ok(None);
    }
    if req.raw {
        task.prompt = Some(req.prompt.clone());
    } else {
        let mut turns = Vec::with_capacity(2);
        if let Some(system) = req.system.as_ref().filter(|s| !s.is_empty()) {
            turns.push(ChatTurn {
                role: "system".into(),
                content: system.clone(),
            });
        }
        turns.push(ChatTurn {
            role: "user".into(),
            content: req.prompt.clone(),
        });
        task.messages = Some(turns);
    }
    Ok(Some(task))
}
