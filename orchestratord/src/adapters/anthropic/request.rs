//! Anthropic's requests as tasks: `system` and the turns' blocks as chat turns (text; an
//! assistant's `tool_use` blocks as the calls the model made, a user's `tool_result` blocks as
//! the results it reads), a final assistant turn continued (prefill), the tools as the answer's
//! constraint, the fields this server does not serve refused by name.

use contracts::{ChatTurn, StopField, TaskRequest};

use super::tools;
use super::types::{Block, Content, CountRequest, Message, MessagesRequest};
use crate::adapters::tool_calls::{self, Toolbox};
use crate::error::ApiError;

fn refuse(field: impl Into<String>, why: impl Into<String>) -> ApiError {
    ApiError::invalid(field, why)
}

/// The text of one text block; any other kind of block is refused naming it.
fn block_text(b: &Block, field: &str) -> Result<String, ApiError> {
    if b.kind != "text" {
        let shown: String = b.kind.escape_debug().take(40).collect();
        let why = match b.kind.as_str() {
            "server_tool_use" | "web_search_tool_result" | "web_fetch_tool_result"
            | "code_execution_tool_result" | "mcp_tool_use" | "mcp_tool_result" => {
                format!("{shown} blocks are not served here: only custom tools")
            }
            "thinking" | "redacted_thinking" => {
                format!("{shown} blocks are not supported: no model served here thinks")
            }
            _ => format!(
                "content blocks of type \"{shown}\" are not supported: the models served here read text only"
            ),
        };
        return Err(refuse(field, why));
    }
    if let Some((key, _)) = b.rest.iter().find(|(k, v)| {
        !(k.as_str() == "citations" && (v.is_null() || v == &&serde_json::json!([])))
    }) {
        let shown: String = key.escape_debug().take(40).collect();
        return Err(refuse(
            format!("{field}.{shown}"),
            format!("unknown field \"{shown}\" in a text block"),
        ));
    }
    b.text
        .clone()
        .ok_or_else(|| refuse(format!("{field}.text"), "a text block needs its text"))
}

/// The text of a content (blocks joined without a separator, as one turn).
fn content_text(c: &Content, field: &str) -> Result<String, ApiError> {
    match c {
        Content::Text(t) => Ok(t.clone()),
        Content::Blocks(blocks) => {
            let mut text = String::new();
            for (j, b) in blocks.iter().enumerate() {
                text.push_str(&block_text(b, &format!("{field}[{j}]"))?);
            }
            Ok(text)
        }
    }
}

/// A message's content as the text of its turn: its text blocks; an assistant's `tool_use`
/// blocks as the answer that made those calls (text beside them is not shown to the model,
/// whose answer is either text or calls); a user's `tool_result` blocks as the results, before
/// its text.
fn message_text(role: &str, c: &Content, field: &str) -> Result<String, ApiError> {
    let Content::Blocks(blocks) = c else {
        return content_text(c, field);
    };
    let mut text = String::new();
    let mut calls = Vec::new();
    let mut results = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let f = format!("{field}[{j}]");
        match (b.kind.as_str(), role) {
            ("tool_use", "assistant") => calls.push(tools::history_call(b, &f)?),
            ("tool_result", "user") => results.push(tools::history_result(b, &f)?),
            ("tool_use", _) => {
                return Err(refuse(f, "tool_use blocks belong in assistant turns"));
            }
            ("tool_result", _) => {
                return Err(refuse(f, "tool_result blocks belong in user turns"));
            }
            _ => text.push_str(&block_text(b, &f)?),
        }
    }
    if !calls.is_empty() {
        return Ok(tool_calls::history_calls(&calls));
    }
    if !text.is_empty() {
        results.push(text);
    }
    Ok(results.join("\n"))
}

/// Thinking: refused unless disabled (no model served here thinks).
fn no_thinking(thinking: &Option<serde_json::Value>) -> Result<(), ApiError> {
    use serde_json::Value;
    let disabled =
        |v: &Value| v.is_null() || v.get("type").and_then(Value::as_str) == Some("disabled");
    if thinking.as_ref().is_some_and(|t| !disabled(t)) {
        return Err(refuse(
            "thinking",
            "extended thinking is not supported: no model served here thinks",
        ));
    }
    Ok(())
}

/// `system` and the messages as chat turns; a final assistant turn marks a continuation.
fn turns(
    system: &Option<Content>,
    messages: &[Message],
) -> Result<(Vec<ChatTurn>, bool), ApiError> {
    let mut out = Vec::with_capacity(messages.len() + 1);
    if let Some(s) = system {
        let text = content_text(s, "system")?;
        if !text.is_empty() {
            out.push(ChatTurn {
                role: "system".into(),
                content: text,
            });
        }
    }
    if messages.is_empty() {
        return Err(refuse(
            "messages",
            "messages: at least one message is required",
        ));
    }
    for (i, m) in messages.iter().enumerate() {
        if m.role != "user" && m.role != "assistant" {
            let shown: String = m.role.escape_debug().take(40).collect();
            return Err(refuse(
                format!("messages[{i}].role"),
                format!("role \"{shown}\" is not one of user, assistant (the system prompt is the system field)"),
            ));
        }
        out.push(ChatTurn {
            role: m.role.clone(),
            content: message_text(&m.role, &m.content, &format!("messages[{i}].content"))?,
        });
    }
    let prefill = messages.last().is_some_and(|m| m.role == "assistant");
    let calls_last = messages.last().is_some_and(|m| match &m.content {
        Content::Blocks(b) => b.iter().any(|b| b.kind == "tool_use"),
        Content::Text(_) => false,
    });
    if prefill && calls_last {
        return Err(refuse(
            format!("messages[{}].content", messages.len() - 1),
            "a final assistant turn with tool_use blocks cannot be continued: send the tool_result in a user turn",
        ));
    }
    if prefill
        && out
            .last()
            .is_some_and(|t| t.content.ends_with(char::is_whitespace))
    {
        return Err(refuse(
            format!("messages[{}].content", messages.len() - 1),
            "final assistant content cannot end with trailing whitespace",
        ));
    }
    Ok((out, prefill))
}

/// The turns, whether the last is continued, and the tools (their instructions added to the
/// system turn).
fn chat(
    system: &Option<Content>,
    messages: &[Message],
    tools: &Option<serde_json::Value>,
    tool_choice: &Option<serde_json::Value>,
) -> Result<(Vec<ChatTurn>, bool, Option<Toolbox>), ApiError> {
    let toolbox = tools::toolbox(tools, tool_choice)?;
    let (mut turns, prefill) = turns(system, messages)?;
    if let Some(t) = &toolbox {
        if prefill {
            return Err(refuse(
                format!("messages[{}]", messages.len() - 1),
                "a final assistant turn (prefill) cannot be combined with tools",
            ));
        }
        tool_calls::instruct(&mut turns, t);
    }
    Ok((turns, prefill, toolbox))
}

/// `/v1/messages` as a task, and its tools (the answer is then decoded under them).
pub fn messages_task(req: &MessagesRequest) -> Result<(TaskRequest, Option<Toolbox>), ApiError> {
    let max_tokens = req
        .max_tokens
        .ok_or_else(|| refuse("max_tokens", "max_tokens: field required"))?;
    no_thinking(&req.thinking)?;
    if let Some(t) = req.temperature.filter(|t| !(0.0..=1.0).contains(t)) {
        return Err(refuse(
            "temperature",
            format!("temperature: {t} is not within [0, 1]"),
        ));
    }
    if let Some(speed) = req.speed.as_deref().filter(|s| *s != "standard") {
        let shown: String = speed.escape_debug().take(40).collect();
        return Err(refuse(
            "speed",
            format!("speed \"{shown}\" is not served: this server has one speed (standard)"),
        ));
    }
    if req.container.as_ref().is_some_and(|c| !c.is_null()) {
        return Err(refuse(
            "container",
            "code-execution containers are not supported",
        ));
    }
    if req.diagnostics.as_ref().is_some_and(|d| !d.is_null()) {
        return Err(refuse(
            "diagnostics",
            "prompt-cache diagnostics are not supported",
        ));
    }
    if let Some(tier) = req
        .service_tier
        .as_deref()
        .filter(|t| *t != "auto" && *t != "standard_only")
    {
        let shown: String = tier.escape_debug().take(40).collect();
        return Err(refuse(
            "service_tier",
            format!("service_tier \"{shown}\" is not one of auto, standard_only"),
        ));
    }
    let (turns, prefill, toolbox) = chat(&req.system, &req.messages, &req.tools, &req.tool_choice)?;
    let user = req.metadata.as_ref().and_then(|m| m.user_id.as_deref());
    let mut json_schema = output_schema(&req.output_config)?;
    if let Some(t) = &toolbox {
        if json_schema.is_some() {
            return Err(refuse(
                "output_config.format",
                "output_config.format cannot be combined with tools",
            ));
        }
        json_schema = Some(t.schema());
    }
    let task = TaskRequest {
        model: Some(req.model.clone()),
        messages: Some(turns),
        max_tokens: Some(max_tokens),
        temperature: req.temperature,
        top_p: req.top_p,
        top_k: req.top_k,
        stop: req
            .stop_sequences
            .clone()
            .filter(|s| !s.is_empty())
            .map(StopField::Many),
        session_id: crate::adapters::openai::session_of(user),
        continue_final_message: prefill.then_some(true),
        json_schema,
        priority: req.priority,
        ..Default::default()
    };
    Ok((task, toolbox))
}

/// `output_config.format` (`{"type": "json_schema", "schema": {…}}`) as the task's schema;
/// `output_config.effort` is accepted (one effort here), any other key refused.
fn output_schema(
    config: &Option<serde_json::Value>,
) -> Result<Option<serde_json::Value>, ApiError> {
    use serde_json::Value;
    let Some(config) = config.as_ref().filter(|c| !c.is_null()) else {
        return Ok(None);
    };
    let Some(fields) = config.as_object() else {
        return Err(refuse("output_config", "output_config must be an object"));
    };
    if let Some(key) = fields.keys().find(|k| *k != "format" && *k != "effort") {
        let shown: String = key.escape_debug().take(40).collect();
        return Err(refuse(
            format!("output_config.{shown}"),
            format!("unknown field \"{shown}\""),
        ));
    }
    match fields.get("format") {
        None | Some(Value::Null) => Ok(None),
        Some(f) if f.get("type").and_then(Value::as_str) == Some("json_schema") => {
            match f.get("schema") {
                Some(s @ (Value::Object(_) | Value::Bool(true))) => Ok(Some(s.clone())),
                _ => Err(refuse(
                    "output_config.format.schema",
                    "a json_schema format needs its schema (an object)",
                )),
            }
        }
        Some(_) => Err(refuse(
            "output_config.format",
            "output_config.format must be {\"type\": \"json_schema\", \"schema\": {…}}",
        )),
    }
}

/// `/v1/messages/count_tokens` as the task it would be (its prompt with the tools'
/// instructions, and its continuation).
pub fn count_task(req: &CountRequest) -> Result<TaskRequest, ApiError> {
    no_thinking(&req.thinking)?;
    let (turns, prefill, _) = chat(&req.system, &req.messages, &req.tools, &req.tool_choice)?;
    Ok(TaskRequest {
        model: Some(req.model.clone()),
        messages: Some(turns),
        continue_final_message: prefill.then_some(true),
        ..Default::default()
    })
}
