//! Tools on Anthropic's `/v1/messages`: `tools` (custom tools: `name`, `description`,
//! `input_schema`) and `tool_choice` (`auto` | `any` | `tool` + `name` | `none`,
//! `disable_parallel_tool_use`) into a [`Toolbox`]; `tool_use` blocks of assistant turns and
//! `tool_result` blocks of user turns in the history; the model's calls as `tool_use` blocks
//! (`stop_reason: tool_use`), streamed as `input_json_delta`s. The answer's shape and its
//! constraint: the shared `adapters::tool_calls`.

use serde_json::{Map, Value};

use super::types::{Block, ContentBlock};
use crate::adapters::tool_calls::{self, Call, Tool, ToolChoice, Toolbox};
use crate::error::ApiError;

/// The keys a custom tool may have (`cache_control` and `strict` accepted and not needed:
/// the prompt cache is this server's own, and calls always match their schema).
const TOOL_KEYS: [&str; 6] = [
    "type",
    "name",
    "description",
    "input_schema",
    "cache_control",
    "strict",
];

fn shown(s: &str) -> String {
    s.escape_debug().take(40).collect()
}

/// The request's tools as a [`Toolbox`], or `None` when there are none or the choice is
/// `none`. A 400 names the field that is wrong.
pub fn toolbox(tools: &Option<Value>, choice: &Option<Value>) -> Result<Option<Toolbox>, ApiError> {
    let list = match tools {
        None | Some(Value::Null) => &Vec::new(),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::invalid("tools", "tools must be a list of tools")),
    };
    let (choice, parallel) = tool_choice(choice)?;
    let Some(choice) = choice else {
        return Ok(None);
    };
    if list.is_empty() {
        if matches!(choice, ToolChoice::Auto) {
            // auto without tools is just no tools
            return Ok(None);
        }
        return Err(ApiError::invalid(
            "tool_choice",
            "tool_choice needs tools to choose from",
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        out.push(tool(i, t)?);
    }
    Toolbox::new(out, choice, parallel).map(Some).map_err(|e| {
        let field = match e.field.as_str() {
            "choice" => "tool_choice.name".to_string(),
            f => format!("tools{}", f.replace(".parameters", ".input_schema")),
        };
        ApiError::invalid(field, e.message)
    })
}

/// `tool_choice`: (the choice, None for `none`; calls in parallel).
fn tool_choice(choice: &Option<Value>) -> Result<(Option<ToolChoice>, bool), ApiError> {
    let Some(c) = choice.as_ref().filter(|c| !c.is_null()) else {
        return Ok((Some(ToolChoice::Auto), true));
    };
    let Some(fields) = c.as_object() else {
        return Err(ApiError::invalid(
            "tool_choice",
            "tool_choice is an object: {\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}",
        ));
    };
    if let Some(key) = fields
        .keys()
        .find(|k| !["type", "name", "disable_parallel_tool_use"].contains(&k.as_str()))
    {
        return Err(ApiError::invalid(
            format!("tool_choice.{}", shown(key)),
            format!("unknown field \"{}\"", shown(key)),
        ));
    }
    let parallel = match fields.get("disable_parallel_tool_use") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => !b,
        Some(_) => {
            return Err(ApiError::invalid(
                "tool_choice.disable_parallel_tool_use",
                "disable_parallel_tool_use is a boolean",
            ))
        }
    };
    let kind = fields.get("type").and_then(Value::as_str).unwrap_or("");
    let choice = match kind {
        "auto" => Some(ToolChoice::Auto),
        "any" => Some(ToolChoice::Required),
        "none" => None,
        "tool" => match fields.get("name").and_then(Value::as_str) {
            Some(n) => Some(ToolChoice::Named(n.to_string())),
            None => {
                return Err(ApiError::invalid(
                    "tool_choice.name",
                    "a tool_choice of type tool needs the tool's name",
                ))
            }
        },
        other => {
            return Err(ApiError::invalid(
                "tool_choice.type",
                format!(
                    "tool_choice type \"{}\" is not one of auto, any, tool, none",
                    shown(other)
                ),
            ))
        }
    };
    Ok((choice, parallel))
}

/// One custom tool; Anthropic's server tools (web search, bash, …) are refused by type.
fn tool(i: usize, t: &Value) -> Result<Tool, ApiError> {
    let field = format!("tools[{i}]");
    let fields = t
        .as_object()
        .ok_or_else(|| ApiError::invalid(&field, "a tool is an object"))?;
    match fields.get("type") {
        None | Some(Value::Null) => {}
        Some(Value::String(k)) if k == "custom" => {}
        Some(k) => {
            let k = k.as_str().unwrap_or("");
            return Err(ApiError::invalid(
                format!("{field}.type"),
                format!(
                    "tools of type \"{}\" are not served here: only custom tools (name, description, input_schema)",
                    shown(k)
                ),
            ));
        }
    }
    if let Some(key) = fields.keys().find(|k| !TOOL_KEYS.contains(&k.as_str())) {
        return Err(ApiError::invalid(
            format!("{field}.{}", shown(key)),
            format!("unknown field \"{}\" in a tool", shown(key)),
        ));
    }
    let name = fields
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid(format!("{field}.name"), "a tool needs its name"))?;
    let parameters = fields
        .get("input_schema")
        .filter(|s| s.is_object())
        .ok_or_else(|| {
            ApiError::invalid(
                format!("{field}.input_schema"),
                "a tool needs its input_schema (a JSON Schema of an object)",
            )
        })?;
    Ok(Tool {
        name: name.to_string(),
        description: fields
            .get("description")
            .and_then(Value::as_str)
            .map(str::to_string),
        parameters: parameters.clone(),
    })
}

/// Refuses any key of a block beyond `allowed` (and `type`, `cache_control`).
fn only_keys(b: &Block, allowed: &[&str], field: &str) -> Result<(), ApiError> {
    if b.text.is_some() {
        return Err(ApiError::invalid(
            format!("{field}.text"),
            format!("a {} block has no text", shown(&b.kind)),
        ));
    }
    match b.rest.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(key) => Err(ApiError::invalid(
            format!("{field}.{}", shown(key)),
            format!(
                "unknown field \"{}\" in a {} block",
                shown(key),
                shown(&b.kind)
            ),
        )),
        None => Ok(()),
    }
}

/// A `tool_use` block of an assistant turn as the call the model made.
pub fn history_call(b: &Block, field: &str) -> Result<Call, ApiError> {
    only_keys(b, &["id", "name", "input"], field)?;
    let name = b.rest.get("name").and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid(format!("{field}.name"), "a tool_use block needs its name")
    })?;
    let input = b
        .rest
        .get("input")
        .filter(|i| i.is_object())
        .ok_or_else(|| {
            ApiError::invalid(
                format!("{field}.input"),
                "a tool_use block's input is a JSON object",
            )
        })?;
    Ok(Call {
        name: name.to_string(),
        arguments: input.to_string(),
    })
}

/// A `tool_result` block of a user turn as the text the model reads.
pub fn history_result(b: &Block, field: &str) -> Result<String, ApiError> {
    only_keys(b, &["tool_use_id", "content", "is_error"], field)?;
    let id = b
        .rest
        .get("tool_use_id")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            ApiError::invalid(
                format!("{field}.tool_use_id"),
                "a tool_result block needs the tool_use_id it answers",
            )
        })?;
    let content = tool_calls::result_text(b.rest.get("content"), &["text"], true).map_err(|e| match e {
        Some((k, kind)) => ApiError::invalid(
            format!("{field}.content[{k}]"),
            format!("content blocks of type \"{kind}\" are not supported: the models served here read text only"),
        ),
        None => ApiError::invalid(
            format!("{field}.content"),
            "a tool_result's content is a string or a list of text blocks",
        ),
    })?;
    let is_error = match b.rest.get("is_error") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(e)) => *e,
        Some(_) => {
            return Err(ApiError::invalid(
                format!("{field}.is_error"),
                "is_error is a boolean",
            ))
        }
    };
    Ok(tool_calls::history_result(Some(id), &content, is_error))
}

/// The id of call `index` of a task's answer.
pub fn tool_use_id(task_id: &str, index: usize) -> String {
    format!("toolu_{}_{index}", task_id.replace('-', ""))
}

/// A block of an answer under tools as Anthropic's content block.
pub fn content_block(block: tool_calls::Block, task_id: &str, call_index: usize) -> ContentBlock {
    match block {
        tool_calls::Block::Text(text) => ContentBlock::Text { text },
        tool_calls::Block::Call(c) => ContentBlock::ToolUse {
            id: tool_use_id(task_id, call_index),
            name: c.name,
            // a cut answer's arguments may not parse: they are then an empty object
            input: serde_json::from_str(&c.arguments)
                .ok()
                .filter(Value::is_object)
                .unwrap_or_else(|| Value::Object(Map::new())),
        },
    }
}

/// The content of a whole answer under tools, and whether it made calls.
pub fn content(text: &str, task_id: &str) -> (Vec<ContentBlock>, bool) {
    let mut calls = 0;
    let blocks = tool_calls::blocks(text)
        .into_iter()
        .map(|b| {
            let call = matches!(b, tool_calls::Block::Call(_));
            let block = content_block(b, task_id, calls);
            calls += usize::from(call);
            block
        })
        .collect();
    (blocks, calls > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn weather() -> Value {
        json!([{"name": "get_weather", "description": "The weather",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}])
    }

    #[test]
    fn choices_map_to_the_toolbox() {
        let t = Some(weather());
        assert!(toolbox(&t, &None).unwrap().is_some(), "auto by default");
        assert!(toolbox(&t, &Some(json!({"type": "none"})))
            .unwrap()
            .is_none());
        assert!(toolbox(&None, &None).unwrap().is_none());
        assert!(toolbox(&None, &Some(json!({"type": "auto"})))
            .unwrap()
            .is_none());
        let any = toolbox(
            &t,
            &Some(json!({"type": "any", "disable_parallel_tool_use": true})),
        )
        .unwrap()
        .unwrap();
        let schema = any.schema();
        assert!(schema.get("anyOf").is_none(), "any: no text branch");
        assert_eq!(schema["properties"]["tool_calls"]["maxItems"], 1);
    }

    #[test]
    fn refusals_name_the_field() {
        let field = |tools: Value, choice: Option<Value>| {
            toolbox(&Some(tools), &choice)
                .unwrap_err()
                .envelope
                .field
                .unwrap()
        };
        assert_eq!(
            field(weather(), Some(json!({"type": "tool", "name": "x"}))),
            "tool_choice.name"
        );
        assert_eq!(
            field(weather(), Some(json!({"type": "sometimes"}))),
            "tool_choice.type"
        );
        assert_eq!(
            field(
                json!([{"type": "web_search_20250305", "name": "web_search"}]),
                None
            ),
            "tools[0].type"
        );
        assert_eq!(field(json!([{"name": "x"}]), None), "tools[0].input_schema");
        assert_eq!(
            field(
                json!([{"name": "a b", "input_schema": {"type": "object"}}]),
                None
            ),
            "tools[0].name"
        );
        assert_eq!(
            field(
                json!([{"name": "x", "input_schema": {"type": "string"}}]),
                None
            ),
            "tools[0].input_schema"
        );
        assert_eq!(
            field(
                json!([{"name": "x", "input_schema": {}, "input_examples": []}]),
                None
            ),
            "tools[0].input_examples"
        );
        assert_eq!(
            toolbox(&None, &Some(json!({"type": "any"})))
                .unwrap_err()
                .envelope
                .field
                .unwrap(),
            "tool_choice"
        );
    }

    #[test]
    fn answers_become_tool_use_blocks() {
        let (blocks, called) = content(
            r#"{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}"#,
            "ab-cd",
        );
        assert!(called);
        assert_eq!(
            serde_json::to_value(&blocks).unwrap(),
            json!([{"type": "tool_use", "id": "toolu_abcd_0", "name": "get_weather",
                    "input": {"city": "Paris"}}])
        );
        let (blocks, called) = content(r#"{"content":"Sunny."}"#, "x");
        assert!(!called);
        assert_eq!(
            serde_json::to_value(&blocks).unwrap(),
            json!([{"type": "text", "text": "Sunny."}])
        );
    }
}
