//! Tool calling for models whose chat template has no tool format of its own (SmolLM2's and
//! most small models'), shared by the API adapters. The tools are described to the model in a
//! system turn, and its answer is constrained (a JSON Schema, decoded through llguidance) to
//! one compact JSON object: `{"tool_calls":[{"name":…,"arguments":{…}},…]}` or, where the
//! choice allows plain text, `{"content":"…"}`. `required` and a named function leave out the
//! `content` branch and narrow the names, so every call is well-formed JSON that matches its
//! function's parameter schema. The adapters turn an [`Answer`] into their own shapes (OpenAI
//! `tool_calls`, Anthropic `tool_use`, Ollama `message.tool_calls`); [`AnswerStream`] does it
//! piece by piece for streams.

use serde_json::{json, Map, Value};

/// Most tools one request may describe (each one is prompt text and a grammar branch).
pub const MAX_TOOLS: usize = 128;
/// Most calls in one answer (a small model, free to go on, repeats its call until the token
/// budget ends it).
pub const MAX_CALLS: usize = 8;

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// A JSON Schema of an object (the arguments); `{"type":"object"}` when the client gave none.
    pub parameters: Value,
}

/// What the model may do with the tools (the adapters map "none" to no toolbox at all).
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// Call tools or answer in text, as it decides.
    Auto,
    /// Call at least one tool.
    Required,
    /// Call this function.
    Named(String),
}

/// Why a request's tools cannot be used, with the field of the request (relative: the adapter
/// puts its own name for the list first) that is wrong.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolError {
    pub field: String,
    pub message: String,
}

fn bad(field: impl Into<String>, message: impl Into<String>) -> ToolError {
    ToolError {
        field: field.into(),
        message: message.into(),
    }
}

/// The tools of one request and how they may be used.
#[derive(Debug, Clone, PartialEq)]
pub struct Toolbox {
    tools: Vec<Tool>,
    choice: ToolChoice,
    /// More than one call in one answer.
    parallel: bool,
}

impl Toolbox {
    /// Checks the tools: 1..=MAX_TOOLS of them, names of 1-64 letters, digits, `_` or `-`
    /// (what OpenAI and Anthropic accept), no name twice, parameters an object schema, and a
    /// named choice among them. `field` of an error: `[i].name`, `[i].parameters` or `choice`.
    pub fn new(tools: Vec<Tool>, choice: ToolChoice, parallel: bool) -> Result<Self, ToolError> {
        if tools.is_empty() || tools.len() > MAX_TOOLS {
            return Err(bad("", format!("between 1 and {MAX_TOOLS} tools")));
        }
        for (i, t) in tools.iter().enumerate() {
            let ok = (1..=64).contains(&t.name.len())
                && t.name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
            if !ok {
                return Err(bad(
                    format!("[{i}].name"),
                    "a tool name is 1-64 letters, digits, '_' or '-'",
                ));
            }
            if tools[..i].iter().any(|u| u.name == t.name) {
                return Err(bad(
                    format!("[{i}].name"),
                    format!("two tools are named {:?}", t.name),
                ));
            }
            let object = t.parameters.as_object().is_some_and(|o| {
                o.get("type").is_none_or(|ty| {
                    ty == "object" || ty.as_array().is_some_and(|a| a.contains(&json!("object")))
                })
            });
            if !object {
                return Err(bad(
                    format!("[{i}].parameters"),
                    "parameters must be a JSON Schema of an object",
                ));
            }
        }
        if let ToolChoice::Named(n) = &choice {
            if !tools.iter().any(|t| &t.name == n) {
                return Err(bad("choice", format!("no tool is named {n:?}")));
            }
        }
        Ok(Self {
            tools,
            choice,
            parallel,
        })
    }

    pub fn tools(&self) -> &[Tool] {
        &self.tools
    }

    /// The system turn that tells the model about the tools and the answer's shape.
    pub fn instructions(&self) -> String {
        let mut s = String::from(
            "You can call these functions (name, what it does, the JSON Schema of its arguments):\n",
        );
        for t in &self.tools {
            s.push_str(&format!("- {}", t.name));
            if let Some(d) = t.description.as_deref().filter(|d| !d.is_empty()) {
                s.push_str(&format!(": {d}"));
            }
            s.push_str(&format!("\n  arguments: {}\n", t.parameters));
        }
        s.push_str("Answer with one JSON object. To call functions: ");
        s.push_str(r#"{"tool_calls":[{"name":"<function name>","arguments":{...}}]}"#);
        match &self.choice {
            ToolChoice::Auto => s.push_str(
                r#". To answer the user directly: {"content":"<your answer>"}. Call a function when it helps answer; its result comes back as {"tool_result":{...}}."#,
            ),
            ToolChoice::Required => s.push_str(". Call at least one function."),
            ToolChoice::Named(n) => s.push_str(&format!(". Call the function {n}.")),
        }
        if !self.parallel {
            s.push_str(" Call one function at a time.");
        }
        s
    }

    /// The JSON Schema the answer is decoded under.
    pub fn schema(&self) -> Value {
        let calls: Vec<Value> = self
            .tools
            .iter()
            .filter(|t| match &self.choice {
                ToolChoice::Named(n) => &t.name == n,
                _ => true,
            })
            .map(|t| {
                json!({"type": "object",
                    "properties": {"name": {"const": t.name}, "arguments": closed(&t.parameters)},
                    "required": ["name", "arguments"], "additionalProperties": false})
            })
            .collect();
        let call = if calls.len() == 1 {
            calls.into_iter().next().unwrap_or_default()
        } else {
            json!({ "anyOf": calls })
        };
        let mut list = Map::new();
        list.insert("type".into(), json!("array"));
        list.insert("items".into(), call);
        list.insert("minItems".into(), json!(1));
        list.insert(
            "maxItems".into(),
            json!(if self.parallel { MAX_CALLS } else { 1 }),
        );
        let with_calls = json!({"type": "object", "properties": {"tool_calls": list},
            "required": ["tool_calls"], "additionalProperties": false});
        match self.choice {
            ToolChoice::Auto => json!({"anyOf": [with_calls,
                {"type": "object", "properties": {"content": {"type": "string"}},
                 "required": ["content"], "additionalProperties": false}]}),
            _ => with_calls,
        }
    }
}

/// Adds the tools' instructions to the system turn (a first one if there is none).
pub fn instruct(turns: &mut Vec<contracts::ChatTurn>, toolbox: &Toolbox) {
    let text = toolbox.instructions();
    match turns.first_mut() {
        Some(t) if t.role == "system" => {
            t.content.push_str("\n\n");
            t.content.push_str(&text);
        }
        _ => turns.insert(
            0,
            contracts::ChatTurn {
                role: "system".into(),
                content: text,
            },
        ),
    }
}

/// The arguments' schema with its top level closed to the properties it declares, unless it
/// says otherwise (`additionalProperties` given): JSON Schema lets any other key through, and
/// a small model decoding under it invents keys (seen: `{"city":"Paris","city_type":…}`).
fn closed(parameters: &Value) -> Value {
    let mut p = parameters.clone();
    if let Some(o) = p.as_object_mut() {
        if o.contains_key("properties") && !o.contains_key("additionalProperties") {
            o.insert("additionalProperties".into(), json!(false));
        }
    }
    p
}

/// One call the model made: its arguments as the compact JSON text it wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub name: String,
    pub arguments: String,
}

/// What the model answered.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Calls(Vec<Call>),
    Content(String),
}

/// The model's answer as far as it went: its whole calls (a call repeating an earlier one
/// ends the list), else the text of its `content` answer so far — empty when the token budget
/// cut it before either: the answer object's own JSON never reaches a client.
pub fn read(text: &str) -> Answer {
    let mut scan = AnswerStream::new();
    let content: String = scan
        .push(text)
        .into_iter()
        .filter_map(|p| match p {
            Piece::Content(s) => Some(s),
            _ => None,
        })
        .collect();
    match scan.complete_calls() {
        [] => Answer::Content(content),
        calls => Answer::Calls(calls.to_vec()),
    }
}

/// An earlier answer that made `calls`, as the model writes one (for the history).
pub fn history_calls(calls: &[Call]) -> String {
    let list: Vec<Value> = calls
        .iter()
        .map(|c| {
            let arguments: Value = serde_json::from_str(&c.arguments).unwrap_or(Value::Null);
            json!({"name": c.name, "arguments": arguments})
        })
        .collect();
    json!({ "tool_calls": list }).to_string()
}

/// A tool result's content from a client as the text the model reads: a string, or a list of
/// text parts (`{"type": <one of kinds>, "text": …}`, joined by newlines); absent or null is
/// empty where `absent_ok`. Errors: `Some(i)`, part `i` is not text (with its kind); `None`,
/// the content is neither a string nor a list.
pub fn result_text(
    content: Option<&Value>,
    kinds: &[&str],
    absent_ok: bool,
) -> Result<String, Option<(usize, String)>> {
    match content {
        None | Some(Value::Null) if absent_ok => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (k, p) in parts.iter().enumerate() {
                let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
                match p.get("text").and_then(Value::as_str) {
                    Some(t) if kinds.contains(&kind) => texts.push(t),
                    _ => return Err(Some((k, kind.escape_debug().take(40).collect()))),
                }
            }
            Ok(texts.join("\n"))
        }
        _ => Err(None),
    }
}

/// A tool's result, as the (user) turn that brings it back to the model; `is_error` when the
/// tool failed (Anthropic's `is_error`).
pub fn history_result(call_id: Option<&str>, content: &str, is_error: bool) -> String {
    let mut r = Map::new();
    if let Some(id) = call_id {
        r.insert("tool_call_id".into(), json!(id));
    }
    r.insert("content".into(), json!(content));
    if is_error {
        r.insert("is_error".into(), json!(true));
    }
    json!({ "tool_result": r }).to_string()
}

mod blocks;
mod stream;

pub use blocks::{blocks, Block, BlockStream, Step};
pub use stream::{AnswerStream, Piece};

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Tool {
        Tool {
            name: "get_weather".into(),
            description: Some("The weather in a city".into()),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"]}),
        }
    }

    fn time() -> Tool {
        Tool {
            name: "get_time".into(),
            description: None,
            parameters: json!({"type": "object"}),
        }
    }

    #[test]
    fn bad_tools_are_refused_naming_the_field() {
        let named = |n: &str| Tool {
            name: n.into(),
            ..weather()
        };
        assert_eq!(
            Toolbox::new(vec![named("a b")], ToolChoice::Auto, true)
                .unwrap_err()
                .field,
            "[0].name"
        );
        assert_eq!(
            Toolbox::new(vec![named("x"), named("x")], ToolChoice::Auto, true)
                .unwrap_err()
                .field,
            "[1].name"
        );
        let string_params = Tool {
            parameters: json!({"type": "string"}),
            ..weather()
        };
        assert_eq!(
            Toolbox::new(vec![string_params], ToolChoice::Auto, true)
                .unwrap_err()
                .field,
            "[0].parameters"
        );
        assert_eq!(
            Toolbox::new(vec![weather()], ToolChoice::Named("nope".into()), true)
                .unwrap_err()
                .field,
            "choice"
        );
        assert!(Toolbox::new(vec![], ToolChoice::Auto, true).is_err());
    }

    #[test]
    fn the_schema_follows_the_choice() {
        let auto = Toolbox::new(vec![weather(), time()], ToolChoice::Auto, true).unwrap();
        let s = auto.schema();
        assert_eq!(s["anyOf"].as_array().unwrap().len(), 2, "calls or content");
        let named = Toolbox::new(
            vec![weather(), time()],
            ToolChoice::Named("get_time".into()),
            false,
        )
        .unwrap();
        let s = named.schema();
        assert!(s.get("anyOf").is_none(), "no content branch");
        let list = &s["properties"]["tool_calls"];
        assert_eq!(list["maxItems"], 1);
        assert_eq!(list["items"]["properties"]["name"]["const"], "get_time");
        // declared properties only, unless the schema says otherwise
        let weather = &auto.schema()["anyOf"][0]["properties"]["tool_calls"]["items"]["anyOf"][0];
        assert_eq!(
            weather["properties"]["arguments"]["additionalProperties"],
            false
        );
        let text = auto.instructions();
        assert!(text.contains("get_weather: The weather in a city"));
        assert!(text.contains(r#"{"content":"#));
    }

    fn paris() -> Call {
        Call {
            name: "get_weather".into(),
            arguments: r#"{"city":"Paris"}"#.into(),
        }
    }

    #[test]
    fn whole_answers_read() {
        assert_eq!(
            read(r#"{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}"#),
            Answer::Calls(vec![paris()])
        );
        assert_eq!(
            read(r#"{"content":"Hi \"there\""}"#),
            Answer::Content("Hi \"there\"".into())
        );
    }

    /// ADP-TOOL-6: an answer cut by the token budget gives its whole calls, or its text so
    /// far, never the answer object's JSON.
    #[test]
    fn cut_answers_give_what_is_whole_and_no_json() {
        assert_eq!(
            read(r#"{"tool_calls":[{"name":"get_wea"#),
            Answer::Content(String::new())
        );
        assert_eq!(
            read(r#"{"tool_calls":[{"name":"search","arguments":{"query":"https://r/r12/r12"#),
            Answer::Content(String::new())
        );
        assert_eq!(
            read(
                r#"{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}},{"name":"get_time","argu"#
            ),
            Answer::Calls(vec![paris()])
        );
        assert_eq!(
            read(r#"{"content":"The weather in Par"#),
            Answer::Content("The weather in Par".into())
        );
    }

    /// ADP-TOOL-6: a call identical to an earlier one ends the list; calls that only share a
    /// name or a prefix of the arguments stay.
    #[test]
    fn a_repeated_call_ends_the_list() {
        let twice = r#"{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}},{"name":"get_weather","arguments":{"city":"Paris"}},{"name":"get_weather","arguments":{"city":"Paris"}}"#;
        assert_eq!(read(twice), Answer::Calls(vec![paris()]));
        let similar = r#"{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}},{"name":"get_weather","arguments":{"city":"Pari"}},{"name":"get_time","arguments":{"city":"Paris"}}]}"#;
        match read(similar) {
            Answer::Calls(calls) => assert_eq!(calls.len(), 3, "{calls:?}"),
            other => panic!("{other:?}"),
        }
    }

    /// Feeds `text` in pieces of every size from 1 to 7 and checks the pieces add up.
    #[test]
    fn history_turns_read_as_the_answers_do() {
        let calls = vec![Call {
            name: "get_weather".into(),
            arguments: r#"{"city":"Paris"}"#.into(),
        }];
        let text = history_calls(&calls);
        assert_eq!(read(&text), Answer::Calls(calls));
        assert_eq!(
            history_result(Some("call_1"), "18 C", false),
            r#"{"tool_result":{"tool_call_id":"call_1","content":"18 C"}}"#
        );
    }
}
