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

/// The model's whole answer, or `None` when it is not a complete answer object (the token
/// budget ran out mid-way): then the adapter gives the raw text.
pub fn parse(text: &str) -> Option<Answer> {
    let v: Value = serde_json::from_str(text).ok()?;
    let o = v.as_object()?;
    if let Some(s) = o.get("content").and_then(Value::as_str) {
        return Some(Answer::Content(s.to_string()));
    }
    let calls = o
        .get("tool_calls")?
        .as_array()?
        .iter()
        .map(|c| {
            Some(Call {
                name: c.get("name")?.as_str()?.to_string(),
                arguments: c.get("arguments")?.to_string(),
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Answer::Calls(calls))
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

/// A tool's result, as the (user) turn that brings it back to the model.
pub fn history_result(call_id: Option<&str>, content: &str) -> String {
    let mut r = Map::new();
    if let Some(id) = call_id {
        r.insert("tool_call_id".into(), json!(id));
    }
    r.insert("content".into(), json!(content));
    json!({ "tool_result": r }).to_string()
}

/// A piece of an answer, as the text arrives.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// Text of a `content` answer.
    Content(String),
    /// Call `index` begins: its function's name.
    CallStart { index: usize, name: String },
    /// More of call `index`'s arguments (JSON text; together they are the whole object).
    Arguments { index: usize, fragment: String },
}

/// Where the scanner of a streamed answer is.
#[derive(Debug, Clone, PartialEq)]
enum At {
    /// Before the answer's one key.
    Start,
    /// Inside the `content` string (`escape`: the characters of an escape so far).
    Content { escape: Option<String> },
    /// Inside the list of calls, between calls.
    Calls,
    /// Inside call `index`'s object, before one of its keys.
    Call { index: usize },
    /// Inside the name string of call `index`.
    Name { index: usize },
    /// Inside call `index`'s arguments: `depth` of brackets open, `in_string`, after a `\`.
    Arguments {
        index: usize,
        depth: u32,
        in_string: bool,
        escaped: bool,
    },
    /// After the answer (or after something that is not one: the rest is ignored).
    Done,
}

/// Turns a streamed answer object into [`Piece`]s as its text arrives (compact or not: the
/// scanner skips whitespace between tokens). Its input is what the schema allowed; anything
/// else ends the scan (the whole text is still parsed with [`parse`] at the end).
#[derive(Debug)]
pub struct AnswerStream {
    at: At,
    /// Text not scanned yet (a key or a name still incomplete).
    pending: String,
    /// Name of the call being read (its name comes before its arguments in what the schema
    /// allows, but arguments first would be buffered here).
    name: String,
    held_arguments: String,
    calls: usize,
}

impl Default for AnswerStream {
    fn default() -> Self {
        Self::new()
    }
}

impl AnswerStream {
    pub fn new() -> Self {
        Self {
            at: At::Start,
            pending: String::new(),
            name: String::new(),
            held_arguments: String::new(),
            calls: 0,
        }
    }

    /// The pieces that `text` (the answer's next characters) completes.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        loop {
            let before = (self.pending.len(), self.at.clone());
            self.step(&mut out);
            if self.pending.is_empty() || (self.pending.len(), self.at.clone()) == before {
                break;
            }
        }
        merge(out)
    }

    /// Scans as much of `pending` as the state can take.
    fn step(&mut self, out: &mut Vec<Piece>) {
        match self.at.clone() {
            At::Start => {
                let t = self.pending.trim_start();
                if let Some(rest) = key(t, "content") {
                    if let Some(rest) = rest.trim_start().strip_prefix('"') {
                        self.pending = rest.to_string();
                        self.at = At::Content { escape: None };
                    }
                } else if let Some(rest) = key(t, "tool_calls") {
                    if let Some(rest) = rest.trim_start().strip_prefix('[') {
                        self.pending = rest.to_string();
                        self.at = At::Calls;
                    }
                } else if !could_be_key(t, &["content", "tool_calls"]) {
                    self.at = At::Done;
                }
            }
            At::Content { escape } => {
                let (text, escape, end) = unescape(&self.pending, escape);
                if !text.is_empty() {
                    out.push(Piece::Content(text));
                }
                self.pending.clear();
                self.at = match end {
                    Some(_) => At::Done,
                    None => At::Content { escape },
                };
            }
            At::Calls => {
                let t = self.pending.trim_start();
                if let Some(rest) = t.strip_prefix(',') {
                    self.pending = rest.to_string();
                } else if let Some(rest) = t.strip_prefix('{') {
                    self.pending = rest.to_string();
                    self.name.clear();
                    self.held_arguments.clear();
                    self.at = At::Call { index: self.calls };
                    self.calls += 1;
                } else if t.starts_with(']') {
                    self.at = At::Done;
                } else {
                    self.pending = t.to_string();
                }
            }
            At::Call { index } => {
                let t = self.pending.trim_start();
                if let Some(rest) = t.strip_prefix(',') {
                    self.pending = rest.to_string();
                } else if let Some(rest) = t.strip_prefix('}') {
                    self.pending = rest.to_string();
                    self.at = At::Calls;
                } else if let Some(rest) = key(t, "name") {
                    if let Some(rest) = rest.trim_start().strip_prefix('"') {
                        self.pending = rest.to_string();
                        self.at = At::Name { index };
                    }
                } else if let Some(rest) = key(t, "arguments") {
                    let rest = rest.trim_start();
                    if !rest.is_empty() {
                        self.pending = rest.to_string();
                        self.at = At::Arguments {
                            index,
                            depth: 0,
                            in_string: false,
                            escaped: false,
                        };
                    }
                } else if !could_be_key(t, &["name", "arguments"]) {
                    self.at = At::Done;
                }
            }
            At::Name { index } => {
                // names are plain (checked), so the first quote ends one
                if let Some(end) = self.pending.find('"') {
                    self.name = self.pending[..end].to_string();
                    self.pending = self.pending[end + 1..].to_string();
                    out.push(Piece::CallStart {
                        index,
                        name: self.name.clone(),
                    });
                    if !self.held_arguments.is_empty() {
                        out.push(Piece::Arguments {
                            index,
                            fragment: std::mem::take(&mut self.held_arguments),
                        });
                    }
                    self.at = At::Call { index };
                }
            }
            At::Arguments {
                index,
                mut depth,
                mut in_string,
                mut escaped,
            } => {
                let mut end = None;
                for (i, c) in self.pending.char_indices() {
                    if in_string {
                        match (escaped, c) {
                            (true, _) => escaped = false,
                            (false, '\\') => escaped = true,
                            (false, '"') => in_string = false,
                            _ => {}
                        }
                        continue;
                    }
                    match c {
                        '"' => in_string = true,
                        '{' | '[' => depth += 1,
                        '}' | ']' => depth = depth.saturating_sub(1),
                        _ => {}
                    }
                    if depth == 0 && !c.is_whitespace() {
                        end = Some(i + c.len_utf8());
                        break;
                    }
                }
                let cut = end.unwrap_or(self.pending.len());
                let fragment = self.pending[..cut].to_string();
                self.pending = self.pending[cut..].to_string();
                if self.name.is_empty() {
                    self.held_arguments.push_str(&fragment);
                } else if !fragment.is_empty() {
                    out.push(Piece::Arguments { index, fragment });
                }
                self.at = match end {
                    Some(_) => At::Call { index },
                    None => At::Arguments {
                        index,
                        depth,
                        in_string,
                        escaped,
                    },
                };
            }
            At::Done => self.pending.clear(),
        }
    }
}

/// After `{"name":` (or `,"name":` or `"name":`, whitespace allowed): the rest.
fn key<'a>(t: &'a str, name: &str) -> Option<&'a str> {
    let t = t.strip_prefix('{').unwrap_or(t).trim_start();
    let rest = t.strip_prefix('"')?.strip_prefix(name)?.strip_prefix('"')?;
    rest.trim_start().strip_prefix(':')
}

/// Whether `t` may still become one of the keys once more text arrives.
fn could_be_key(t: &str, names: &[&str]) -> bool {
    let t = t.strip_prefix('{').unwrap_or(t).trim_start();
    if t.is_empty() {
        return true;
    }
    names.iter().any(|n| {
        let whole = format!("\"{n}\"");
        whole.starts_with(t) || (t.starts_with(&whole) && t[whole.len()..].trim().is_empty())
    })
}

/// Decodes JSON string text up to its closing quote: (text, an escape left incomplete, where
/// the closing quote was).
fn unescape(s: &str, mut escape: Option<String>) -> (String, Option<String>, Option<usize>) {
    let mut out = String::new();
    for (i, c) in s.char_indices() {
        if let Some(e) = escape.as_mut() {
            e.push(c);
            if let Some(text) = escape_done(e) {
                out.push_str(&text);
                escape = None;
            }
            continue;
        }
        match c {
            '\\' => escape = Some(String::new()),
            '"' => return (out, None, Some(i)),
            c => out.push(c),
        }
    }
    (out, escape, None)
}

/// The text of a complete escape (after its `\`), or None while more is needed. A `\u` of a
/// high surrogate waits for its low half.
fn escape_done(e: &str) -> Option<String> {
    let simple = |c| match c {
        'n' => Some('\n'),
        't' => Some('\t'),
        'r' => Some('\r'),
        'b' => Some('\u{8}'),
        'f' => Some('\u{c}'),
        '/' => Some('/'),
        '\\' => Some('\\'),
        '"' => Some('"'),
        _ => None,
    };
    let mut cs = e.chars();
    match cs.next()? {
        'u' => {
            if e.len() < 5 {
                return None;
            }
            let hi = u32::from_str_radix(&e[1..5], 16).ok()?;
            if (0xD800..0xDC00).contains(&hi) {
                if e.len() < 11 {
                    return None;
                }
                let lo = e.get(7..11).and_then(|h| u32::from_str_radix(h, 16).ok())?;
                let c = 0x10000 + ((hi - 0xD800) << 10) + (lo.wrapping_sub(0xDC00) & 0x3FF);
                return Some(char::from_u32(c).unwrap_or('\u{FFFD}').to_string());
            }
            Some(char::from_u32(hi).unwrap_or('\u{FFFD}').to_string())
        }
        c => Some(simple(c).unwrap_or(c).to_string()),
    }
}

/// Joins neighbouring pieces of one kind (one delta per piece of text a token brought).
fn merge(pieces: Vec<Piece>) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::with_capacity(pieces.len());
    for p in pieces {
        match (out.last_mut(), p) {
            (Some(Piece::Content(a)), Piece::Content(b)) => a.push_str(&b),
            (
                Some(Piece::Arguments { index: i, fragment }),
                Piece::Arguments {
                    index: j,
                    fragment: f,
                },
            ) if *i == j => fragment.push_str(&f),
            (_, p) => out.push(p),
        }
    }
    out
}

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

    #[test]
    fn whole_answers_parse() {
        assert_eq!(
            parse(r#"{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]}"#),
            Some(Answer::Calls(vec![Call {
                name: "get_weather".into(),
                arguments: r#"{"city":"Paris"}"#.into()
            }]))
        );
        assert_eq!(
            parse(r#"{"content":"Hi \"there\""}"#),
            Some(Answer::Content("Hi \"there\"".into()))
        );
        assert_eq!(parse(r#"{"tool_calls":[{"name":"get_wea"#), None);
    }

    /// Feeds `text` in pieces of every size from 1 to 7 and checks the pieces add up.
    fn streamed(text: &str) -> Vec<Vec<Piece>> {
        (1..=7)
            .map(|n| {
                let chars: Vec<char> = text.chars().collect();
                let mut s = AnswerStream::new();
                let mut all = Vec::new();
                for chunk in chars.chunks(n) {
                    all.extend(s.push(&chunk.iter().collect::<String>()));
                }
                merge(all)
            })
            .collect()
    }

    #[test]
    fn streamed_calls_come_as_name_then_arguments() {
        let text = r#"{"tool_calls":[{"name":"get_weather","arguments":{"city":"Pa\"ris","n":[1,{"a":"}"}]}},{"name":"get_time","arguments":{}}]}"#;
        for pieces in streamed(text) {
            assert_eq!(
                pieces,
                vec![
                    Piece::CallStart {
                        index: 0,
                        name: "get_weather".into()
                    },
                    Piece::Arguments {
                        index: 0,
                        fragment: r#"{"city":"Pa\"ris","n":[1,{"a":"}"}]}"#.into()
                    },
                    Piece::CallStart {
                        index: 1,
                        name: "get_time".into()
                    },
                    Piece::Arguments {
                        index: 1,
                        fragment: "{}".into()
                    },
                ]
            );
        }
    }

    #[test]
    fn streamed_content_is_unescaped() {
        let text = r#"{"content":"a\"b\\c\nd \u00e9 \ud83d\ude00 end"}"#;
        for pieces in streamed(text) {
            assert_eq!(pieces, vec![Piece::Content("a\"b\\c\nd é 😀 end".into())]);
        }
    }

    #[test]
    fn history_turns_read_as_the_answers_do() {
        let calls = vec![Call {
            name: "get_weather".into(),
            arguments: r#"{"city":"Paris"}"#.into(),
        }];
        let text = history_calls(&calls);
        assert_eq!(parse(&text), Some(Answer::Calls(calls)));
        assert_eq!(
            history_result(Some("call_1"), "18 C"),
            r#"{"tool_result":{"tool_call_id":"call_1","content":"18 C"}}"#
        );
    }

    #[test]
    fn text_that_is_no_answer_ends_the_scan_quietly() {
        let mut s = AnswerStream::new();
        assert!(s.push("Hello, I am a model").is_empty());
        assert!(s.push(r#"{"content":"x"}"#).is_empty());
    }
}
