//! Function tools on `/v1/responses`: `tools` (`{"type": "function", "name", "description",
//! "parameters", "strict"}`), `tool_choice` and `parallel_tool_calls` into a [`Toolbox`]; the
//! `function_call` and `function_call_output` items of the input as the turns the model reads;
//! the model's calls as `function_call` output items. The answer's shape and its constraint:
//! the shared `adapters::tool_calls`.

use serde_json::Value;

use super::types::{FunctionCallItem, InputItem};
use crate::adapters::tool_calls::{self, Call, Tool, ToolChoice, Toolbox};
use crate::error::ApiError;

const TOOL_KEYS: [&str; 5] = ["type", "name", "description", "parameters", "strict"];

fn shown(s: &str) -> String {
    s.escape_debug().take(40).collect()
}

/// The request's tools as a [`Toolbox`], or `None` when there are none or the choice is
/// `none`. A 400 names the field that is wrong.
pub fn toolbox(
    tools: &Option<Value>,
    choice: &Option<Value>,
    parallel: Option<bool>,
) -> Result<Option<Toolbox>, ApiError> {
    let list = match tools {
        None | Some(Value::Null) => &Vec::new(),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(ApiError::invalid("tools", "tools must be a list of tools")),
    };
    let choice = match choice.as_ref().filter(|c| !c.is_null()) {
        None => (!list.is_empty()).then_some(ToolChoice::Auto),
        Some(Value::String(mode)) => match mode.as_str() {
            "none" => None,
            "auto" => (!list.is_empty()).then_some(ToolChoice::Auto),
            "required" => Some(ToolChoice::Required),
            other => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                        "tool_choice \"{}\" is not one of none, auto, required",
                        shown(other)
                    ),
                ))
            }
        },
        Some(c) => match (
            c.get("type").and_then(Value::as_str),
            c.get("name").and_then(Value::as_str),
        ) {
            (Some("function"), Some(name)) => Some(ToolChoice::Named(name.to_string())),
            (Some("function"), None) => {
                return Err(ApiError::invalid(
                    "tool_choice.name",
                    "a function tool_choice needs the function's name",
                ))
            }
            (kind, _) => {
                return Err(ApiError::invalid(
                    "tool_choice.type",
                    format!(
                        "tool_choice of type \"{}\" is not served: function tools only",
                        shown(kind.unwrap_or(""))
                    ),
                ))
            }
        },
    };
    let Some(choice) = choice else {
        return Ok(None);
    };
    if list.is_empty() {
        return Err(ApiError::invalid(
            "tool_choice",
            "tool_choice needs tools to choose from",
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        out.push(tool(i, t)?);
    }
    Toolbox::new(out, choice, parallel.unwrap_or(true))
        .map(Some)
        .map_err(|e| {
            let field = match e.field.as_str() {
                "choice" => "tool_choice.name".to_string(),
                f => format!("tools{f}"),
            };
            ApiError::invalid(field, e.message)
        })
}

/// One function tool; the built-in tools (web search, file search, computer use, MCP, …) are
/// refused by type.
fn tool(i: usize, t: &Value) -> Result<Tool, ApiError> {
    let field = format!("tools[{i}]");
    let fields = t
        .as_object()
        .ok_or_else(|| ApiError::invalid(&field, "a tool is an object"))?;
    let kind = fields.get("type").and_then(Value::as_str).unwrap_or("");
    if kind != "function" {
        return Err(ApiError::invalid(
            format!("{field}.type"),
            format!(
                "tools of type \"{}\" are not served here: function tools only",
                shown(kind)
            ),
        ));
    }
    if let Some(key) = fields.keys().find(|k| !TOOL_KEYS.contains(&k.as_str())) {
        return Err(ApiError::invalid(
            format!("{field}.{}", shown(key)),
            format!("unknown field \"{}\" in a function tool", shown(key)),
        ));
    }
    let name = fields.get("name").and_then(Value::as_str).ok_or_else(|| {
        ApiError::invalid(format!("{field}.name"), "a function tool needs its name")
    })?;
    Ok(Tool {
        name: name.to_string(),
        description: fields
            .get("description")
            .and_then(Value::as_str)
            .map(str::to_string),
        parameters: match fields.get("parameters") {
            None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
            Some(p) => p.clone(),
        },
    })
}

/// A `function_call` input item as the call the model made.
pub fn history_call(item: &InputItem, field: &str) -> Result<Call, ApiError> {
    let name = item.name.as_deref().ok_or_else(|| {
        ApiError::invalid(format!("{field}.name"), "a function_call needs its name")
    })?;
    let arguments = item
        .arguments
        .as_deref()
        .and_then(|a| serde_json::from_str::<Value>(a).ok())
        .filter(Value::is_object)
        .ok_or_else(|| {
            ApiError::invalid(
                format!("{field}.arguments"),
                "a function_call's arguments are a JSON object, as text",
            )
        })?;
    Ok(Call {
        name: name.to_string(),
        arguments: arguments.to_string(),
    })
}

/// A `function_call_output` input item as the text the model reads.
pub fn history_result(item: &InputItem, field: &str) -> Result<String, ApiError> {
    let call_id = item.call_id.as_deref().ok_or_else(|| {
        ApiError::invalid(
            format!("{field}.call_id"),
            "a function_call_output needs the call_id it answers",
        )
    })?;
    let output = tool_calls::result_text(
        item.output.as_ref(),
        &["input_text", "output_text", "text"],
        false,
    )
    .map_err(|e| match e {
        Some((k, kind)) => ApiError::invalid(
            format!("{field}.output[{k}]"),
            format!(
                "parts of type \"{kind}\" are not supported: the models served here read text only"
            ),
        ),
        None => ApiError::invalid(
            format!("{field}.output"),
            "a function_call_output's output is a string or text parts",
        ),
    })?;
    Ok(tool_calls::history_result(Some(call_id), &output, false))
}

/// Call `index` of a task's answer as an output item.
pub fn call_item(
    task_id: &str,
    index: usize,
    call: Call,
    status: &'static str,
) -> FunctionCallItem {
    let task = task_id.replace('-', "");
    FunctionCallItem {
        kind: "function_call",
        id: format!("fc_{task}_{index}"),
        call_id: format!("call_{task}_{index}"),
        name: call.name,
        arguments: call.arguments,
        status,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn weather() -> Option<Value> {
        Some(json!([{"type": "function", "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]))
    }

    #[test]
    fn choices_map_to_the_toolbox() {
        assert!(toolbox(&weather(), &None, None).unwrap().is_some());
        assert!(toolbox(&weather(), &Some(json!("none")), None)
            .unwrap()
            .is_none());
        assert!(toolbox(&None, &Some(json!("auto")), None)
            .unwrap()
            .is_none());
        let named = toolbox(
            &weather(),
            &Some(json!({"type": "function", "name": "get_weather"})),
            Some(false),
        )
        .unwrap()
        .unwrap();
        assert_eq!(named.schema()["properties"]["tool_calls"]["maxItems"], 1);
    }

    #[test]
    fn refusals_name_the_field() {
        let field = |tools: Option<Value>, choice: Option<Value>| {
            toolbox(&tools, &choice, None)
                .unwrap_err()
                .envelope
                .field
                .unwrap()
        };
        assert_eq!(field(None, Some(json!("required"))), "tool_choice");
        assert_eq!(field(weather(), Some(json!("sometimes"))), "tool_choice");
        assert_eq!(
            field(weather(), Some(json!({"type": "function", "name": "x"}))),
            "tool_choice.name"
        );
        assert_eq!(
            field(weather(), Some(json!({"type": "file_search"}))),
            "tool_choice.type"
        );
        assert_eq!(
            field(Some(json!([{"type": "web_search"}])), None),
            "tools[0].type"
        );
        assert_eq!(
            field(Some(json!([{"type": "function", "name": "a b"}])), None),
            "tools[0].name"
        );
        assert_eq!(
            field(
                Some(json!([{"type": "function", "name": "x", "parameters": {"type": "array"}}])),
                None
            ),
            "tools[0].parameters"
        );
    }
}
