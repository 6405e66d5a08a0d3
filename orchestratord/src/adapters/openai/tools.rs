//! Tool calling on `/v1/chat/completions`: OpenAI's `tools` / `tool_choice` /
//! `parallel_tool_calls` into a [`Toolbox`] (the shared core in `adapters::tool_calls`), the
//! assistant's calls and the tools' results in the history into turns the model reads, and the
//! model's answer into `message.tool_calls` or, streamed, `delta.tool_calls`.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::adapters::tool_calls::{self, Answer, Piece, Tool, ToolChoice, Toolbox};
use crate::error::ApiError;

/// One tool the model may call (only functions exist).
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ToolDef {
    /// `function`
    #[serde(rename = "type")]
    #[schema(pattern = "^function$")]
    pub kind: String,
    pub function: FunctionDef,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct FunctionDef {
    /// 1-64 letters, digits, `_` or `-`.
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub name: String,
    pub description: Option<String>,
    /// A JSON Schema of an object: the call's arguments always validate against it
    /// (constrained decoding), whatever `strict` says.
    #[schema(value_type = Option<Object>)]
    pub parameters: Option<Value>,
    pub strict: Option<bool>,
}

/// `none` | `auto` | `required`, or `{"type": "function", "function": {"name": …}}`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum ToolChoiceField {
    Mode(ToolMode),
    Named(NamedChoice),
}

/// What the model may do with the tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ToolMode {
    /// Answer in text; the tools are not described.
    None,
    /// Call tools or answer in text.
    Auto,
    /// Call at least one tool.
    Required,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct NamedChoice {
    /// `function`
    #[serde(rename = "type")]
    #[schema(pattern = "^function$")]
    pub kind: String,
    pub function: NamedFunction,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct NamedFunction {
    pub name: String,
}

/// A call in an assistant turn of the history.
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct ToolCallIn {
    pub id: Option<String>,
    pub function: FunctionCallIn,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct FunctionCallIn {
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

/// A call the model made.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ToolCallOut {
    pub id: String,
    /// `function`
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCallOut,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FunctionCallOut {
    pub name: String,
    /// The arguments as JSON text, valid against the function's `parameters`.
    pub arguments: String,
}

/// A piece of a call in a streamed chunk: the first names it (`id`, `type`, `function.name`),
/// the next carry fragments of `function.arguments`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ToolCallDelta {
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

/// The request's tools as a [`Toolbox`], or `None` when there are none or `tool_choice` is
/// `none` (a plain answer). A 400 names the field that is wrong.
pub fn toolbox(
    tools: Option<&[ToolDef]>,
    choice: Option<&ToolChoiceField>,
    parallel: Option<bool>,
) -> Result<Option<Toolbox>, ApiError> {
    let tools = tools.unwrap_or_default();
    let choice = match choice {
        None => (!tools.is_empty()).then_some(ToolChoice::Auto),
        Some(ToolChoiceField::Mode(ToolMode::None)) => None,
        Some(ToolChoiceField::Mode(ToolMode::Auto)) => Some(ToolChoice::Auto),
        Some(ToolChoiceField::Mode(ToolMode::Required)) => Some(ToolChoice::Required),
        Some(ToolChoiceField::Named(n)) if n.kind == "function" => {
            Some(ToolChoice::Named(n.function.name.clone()))
        }
        Some(ToolChoiceField::Named(_)) => {
            return Err(ApiError::invalid(
                "tool_choice.type",
                "a named tool_choice is {\"type\": \"function\", ...}",
            ))
        }
    };
    let Some(choice) = choice else {
        return Ok(None);
    };
    if tools.is_empty() {
        return Err(ApiError::invalid(
            "tool_choice",
            "tool_choice needs tools to choose from",
        ));
    }
    if let Some(i) = tools.iter().position(|t| t.kind != "function") {
        return Err(ApiError::invalid(
            format!("tools[{i}].type"),
            "only function tools are supported",
        ));
    }
    let list = tools
        .iter()
        .map(|t| Tool {
            name: t.function.name.clone(),
            description: t.function.description.clone(),
            parameters: t
                .function
                .parameters
                .clone()
                .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}})),
        })
        .collect();
    Toolbox::new(list, choice, parallel.unwrap_or(true))
        .map(Some)
        .map_err(|e| {
            let field = match e.field.as_str() {
                "choice" => "tool_choice".to_string(),
                f if f.ends_with(".parameters") || f.ends_with(".name") => {
                    let (i, rest) = f.split_once('.').unwrap_or((f, ""));
                    format!("tools{i}.function.{rest}")
                }
                f => format!("tools{f}"),
            };
            ApiError::invalid(field, e.message)
        })
}

/// An assistant turn that made calls, as the model would have written it.
pub fn history_calls(index: usize, calls: &[ToolCallIn]) -> Result<String, ApiError> {
    let calls = calls
        .iter()
        .enumerate()
        .map(|(j, c)| {
            serde_json::from_str::<Value>(&c.function.arguments)
                .ok()
                .filter(Value::is_object)
                .map(|arguments| tool_calls::Call {
                    name: c.function.name.clone(),
                    arguments: arguments.to_string(),
                })
                .ok_or_else(|| {
                    ApiError::invalid(
                        format!("messages[{index}].tool_calls[{j}].function.arguments"),
                        "the arguments must be a JSON object",
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(tool_calls::history_calls(&calls))
}

/// The call ids of one choice: its task's id and the call's place.
pub fn call_id(task_id: &str, index: usize) -> String {
    format!("call_{}_{index}", task_id.replace('-', ""))
}

/// The message and finish reason of a whole answer under tools (as [`tool_calls::read`] reads
/// it): its calls (`tool_calls`; `finish_reason: tool_calls` unless the token budget cut it),
/// or its text as far as it went — never the answer object's JSON.
pub fn answer(
    text: &str,
    finish_reason: String,
    task_id: &str,
) -> (Option<String>, Option<Vec<ToolCallOut>>, String) {
    match tool_calls::read(text) {
        Answer::Calls(calls) => {
            let out = calls
                .into_iter()
                .enumerate()
                .map(|(j, c)| ToolCallOut {
                    id: call_id(task_id, j),
                    kind: "function",
                    function: FunctionCallOut {
                        name: c.name,
                        arguments: c.arguments,
                    },
                })
                .collect();
            let finish = match finish_reason.as_str() {
                "stop" => "tool_calls".to_string(),
                _ => finish_reason,
            };
            (None, Some(out), finish)
        }
        Answer::Content(s) => (Some(s), None, finish_reason),
    }
}

/// A streamed piece as a chunk's delta: (content, tool call).
pub fn delta_of(piece: Piece, task_id: &str) -> (Option<String>, Option<ToolCallDelta>) {
    match piece {
        Piece::Content(s) => (Some(s), None),
        Piece::CallStart { index, name } => (
            None,
            Some(ToolCallDelta {
                index: index as u32,
                id: Some(call_id(task_id, index)),
                kind: Some("function"),
                function: FunctionDelta {
                    name: Some(name),
                    arguments: String::new(),
                },
            }),
        ),
        Piece::Arguments { index, fragment } => (
            None,
            Some(ToolCallDelta {
                index: index as u32,
                id: None,
                kind: None,
                function: FunctionDelta {
                    name: None,
                    arguments: fragment,
                },
            }),
        ),
    }
}
