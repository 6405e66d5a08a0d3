//! Tools on Ollama's `/api/chat`: `tools` (function definitions, the OpenAI shape), an
//! assistant turn's `tool_calls` and `tool` turns in the history, and `message.tool_calls` in
//! the answer with the arguments as a JSON object, as Ollama gives them. Ollama has no tool
//! choice: the model calls tools or answers in text (`auto`, all calls allowed). The answer's
//! shape and constraint: the shared `adapters::tool_calls`.

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::adapters::tool_calls::{self, Answer, Call, Tool, ToolChoice, Toolbox};
use crate::error::ApiError;

/// A call in an answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = OllamaToolCall)]
pub struct ToolCall {
    pub function: FunctionCall,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
#[schema(as = OllamaFunctionCall)]
pub struct FunctionCall {
    pub name: String,
    /// Valid against the function's `parameters`.
    #[schema(value_type = Object)]
    pub arguments: Value,
}

/// The request's `tools` as a [`Toolbox`] (`None`: absent, null or empty).
pub fn toolbox(tools: &Option<Value>) -> Result<Option<Toolbox>, ApiError> {
    let list = match tools {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(a)) if a.is_empty() => return Ok(None),
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(ApiError::invalid(
                "tools",
                "tools must be a list of {\"type\": \"function\", \"function\": {...}}",
            ))
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let f = t
            .get("function")
            .filter(|_| t.get("type").is_none_or(|k| k == "function"))
            .ok_or_else(|| {
                ApiError::invalid(
                    format!("tools[{i}]"),
                    "a tool is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                )
            })?;
        out.push(Tool {
            name: f
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            description: f
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_string),
            parameters: f
                .get("parameters")
                .cloned()
                .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}})),
        });
    }
    Toolbox::new(out, ToolChoice::Auto, true)
        .map(Some)
        .map_err(|e| ApiError::invalid(format!("tools{}", e.field), e.message))
}

/// An assistant turn's `tool_calls` (`[{"function": {"name", "arguments": {…}}}]`) as the
/// answer the model gives.
pub fn history_calls(index: usize, calls: &Value) -> Result<String, ApiError> {
    let bad = || {
        ApiError::invalid(
            format!("messages[{index}].tool_calls"),
            "tool_calls is a list of {\"function\": {\"name\": ..., \"arguments\": {...}}}",
        )
    };
    let calls = calls
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|c| {
            let f = c.get("function")?;
            Some(Call {
                name: f.get("name")?.as_str()?.to_string(),
                arguments: f.get("arguments").filter(|a| a.is_object())?.to_string(),
            })
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(bad)?;
    Ok(tool_calls::history_calls(&calls))
}

/// The answer's text and calls (as [`tool_calls::read`] reads it): a call answer has empty
/// content; text is the `content` answer's as far as it went — never the answer's JSON.
pub fn answer(text: &str) -> (String, Option<Vec<ToolCall>>) {
    match tool_calls::read(text) {
        Answer::Calls(calls) => {
            let calls = calls
                .into_iter()
                .map(|c| ToolCall {
                    function: FunctionCall {
                        name: c.name,
                        arguments: serde_json::from_str(&c.arguments).unwrap_or(Value::Null),
                    },
                })
                .collect();
            (String::new(), Some(calls))
        }
        Answer::Content(s) => (s, None),
    }
}
