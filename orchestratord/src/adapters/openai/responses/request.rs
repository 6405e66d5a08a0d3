//! `/v1/responses` requests as tasks: `instructions` and `input` (a string, or message,
//! `function_call` and `function_call_output` items) as chat turns, the tools as the answer's
//! constraint, what a stateless server cannot honour refused by name.

use contracts::{ChatTurn, TaskRequest};
use serde_json::json;

use super::tools;
use super::types::*;
use crate::adapters::tool_calls::{self, Toolbox};
use crate::error::ApiError;

fn refuse(field: impl Into<String>, why: impl Into<String>) -> ApiError {
    ApiError::invalid(field, why)
}

/// What a stateless server without reasoning cannot honour, refused by name.
fn unserved(req: &ResponsesRequest) -> Result<(), ApiError> {
    if req.store == Some(true) {
        return Err(refuse(
            "store",
            "responses are not stored here (stateless): send store: false",
        ));
    }
    if req.previous_response_id.is_some() {
        return Err(refuse(
            "previous_response_id",
            "responses are not stored here (stateless): send the conversation as input",
        ));
    }
    if req.reasoning.as_ref().is_some_and(|r| !r.is_null()) {
        return Err(refuse("reasoning", "no model served here reasons"));
    }
    if req.truncation.as_deref().is_some_and(|t| t != "disabled") {
        return Err(refuse("truncation", "truncation must be disabled"));
    }
    if req.include.as_ref().is_some_and(|i| !i.is_empty()) {
        return Err(refuse("include", "no extra output can be included here"));
    }
    if req.background == Some(true) {
        return Err(refuse(
            "background",
            "answers are not kept to be fetched later (stateless)",
        ));
    }
    Ok(())
}

fn part_text(p: &InputPart, field: &str) -> Result<String, ApiError> {
    match (p.kind.as_str(), &p.text) {
        ("input_text" | "output_text" | "text", Some(t)) => Ok(t.clone()),
        ("input_text" | "output_text" | "text", None) => {
            Err(refuse(field, "a text part needs its text"))
        }
        (kind, _) => {
            let shown: String = kind.escape_debug().take(40).collect();
            Err(refuse(
                field,
                format!("parts of type \"{shown}\" are not supported: the models served here read text only"),
            ))
        }
    }
}

/// The instructions and input as chat turns.
fn turns(req: &ResponsesRequest) -> Result<Vec<ChatTurn>, ApiError> {
    let mut out = Vec::new();
    if let Some(i) = req.instructions.as_ref().filter(|i| !i.is_empty()) {
        out.push(ChatTurn {
            role: "system".into(),
            content: i.clone(),
        });
    }
    let items = match &req.input {
        Input::Text(t) => {
            out.push(ChatTurn {
                role: "user".into(),
                content: t.clone(),
            });
            return Ok(out);
        }
        Input::Items(items) => items,
    };
    if items.is_empty() {
        return Err(refuse("input", "input has no items"));
    }
    // the calls of the assistant turn being built from function_call items
    let mut calls: Option<Vec<tool_calls::Call>> = None;
    for (i, item) in items.iter().enumerate() {
        let field = format!("input[{i}]");
        if item.kind.as_deref() != Some("function_call") {
            calls = None;
        }
        match item.kind.as_deref() {
            None | Some("message") => {}
            Some("function_call") => {
                let call = tools::history_call(item, &field)?;
                // consecutive calls are one answer
                match (calls.as_mut(), out.last_mut()) {
                    (Some(open), Some(last)) => {
                        open.push(call);
                        last.content = tool_calls::history_calls(open);
                    }
                    _ => {
                        let open = vec![call];
                        out.push(ChatTurn {
                            role: "assistant".into(),
                            content: tool_calls::history_calls(&open),
                        });
                        calls = Some(open);
                    }
                }
                continue;
            }
            Some("function_call_output") => {
                out.push(ChatTurn {
                    role: "user".into(),
                    content: tools::history_result(item, &field)?,
                });
                continue;
            }
            Some(other) => {
                let shown: String = other.escape_debug().take(40).collect();
                return Err(refuse(
                    field,
                    format!("input items of type \"{shown}\" are not supported (messages, function_call, function_call_output)"),
                ));
            }
        }
        let role = match item.role.as_deref() {
            Some("developer") | Some("system") => "system",
            Some("user") => "user",
            Some("assistant") => "assistant",
            _ => {
                return Err(refuse(
                    format!("{field}.role"),
                    "role must be user, assistant, system or developer",
                ))
            }
        };
        let content = match &item.content {
            Some(InputContent::Text(t)) => t.clone(),
            Some(InputContent::Parts(parts)) => {
                let mut texts = Vec::with_capacity(parts.len());
                for (j, p) in parts.iter().enumerate() {
                    texts.push(part_text(p, &format!("{field}.content[{j}]"))?);
                }
                texts.join("\n")
            }
            None => {
                return Err(refuse(
                    format!("{field}.content"),
                    "a message needs content",
                ))
            }
        };
        out.push(ChatTurn {
            role: role.into(),
            content,
        });
    }
    Ok(out)
}

/// The request as a task, and its tools (the answer is then decoded under them).
pub fn to_task(req: &ResponsesRequest) -> Result<(TaskRequest, Option<Toolbox>), ApiError> {
    unserved(req)?;
    let mut json_schema = match req.text.as_ref().and_then(|t| t.format.as_ref()) {
        None | Some(TextFormat::Text) => None,
        Some(TextFormat::JsonObject) => Some(json!({"type": "object"})),
        Some(TextFormat::JsonSchema { schema, .. }) => Some(schema.clone()),
    };
    let toolbox = tools::toolbox(&req.tools, &req.tool_choice, req.parallel_tool_calls)?;
    let mut messages = turns(req)?;
    if let Some(t) = &toolbox {
        if json_schema.is_some() {
            return Err(refuse(
                "text.format",
                "text.format cannot be combined with tools",
            ));
        }
        tool_calls::instruct(&mut messages, t);
        json_schema = Some(t.schema());
    }
    let user = req.user.as_deref().or(req.safety_identifier.as_deref());
    let task = TaskRequest {
        model: req.model.clone(),
        messages: Some(messages),
        max_tokens: req.max_output_tokens,
        temperature: req.temperature,
        top_p: req.top_p,
        session_id: crate::adapters::openai::session_of(user),
        prompt_cache_key: req.prompt_cache_key.clone(),
        json_schema,
        priority: req.priority,
        ..Default::default()
    };
    Ok((task, toolbox))
}
