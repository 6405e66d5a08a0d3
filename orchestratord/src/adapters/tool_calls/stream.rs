//! The streamed answer scanner: turns an answer object's text into [`Piece`]s (a call's name,
//! fragments of its arguments, text of a `content` answer) as the tokens arrive, and ends the
//! list at a call identical to an earlier one (a small model, free to make up to
//! [`super::MAX_CALLS`] calls, repeats its call until the token budget ends it). A call that
//! may still turn out a repeat — same name, arguments so far a prefix of an earlier call's —
//! is held back until it differs or ends.

use super::Call;

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
/// else ends the scan.
#[derive(Debug)]
pub struct AnswerStream {
    at: At,
    /// Text not scanned yet (a key or a name still incomplete).
    pending: String,
    /// Name of the call being read (its name comes before its arguments in what the schema
    /// allows, but arguments first would be buffered here).
    name: String,
    held_arguments: String,
    /// Whether `held_arguments` are whole.
    arguments_ended: bool,
    calls: usize,
    /// The calls whose arguments ended, in order (a repeat is not among them).
    complete: Vec<Call>,
    /// The arguments of the call being read, so far.
    arguments: String,
    /// Pieces of the call being read, held while it may be a repeat.
    held: Vec<Piece>,
    holding: bool,
    repeated: bool,
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
            arguments_ended: false,
            calls: 0,
            complete: Vec::new(),
            arguments: String::new(),
            held: Vec::new(),
            holding: false,
            repeated: false,
        }
    }

    /// The calls whose arguments are whole, in order; a repeated call is not among them.
    pub fn complete_calls(&self) -> &[Call] {
        &self.complete
    }

    /// Whether the model began a call identical to an earlier one: the answer ends there (the
    /// adapter stops the task); the repeat was not given out.
    pub fn repeated(&self) -> bool {
        self.repeated
    }

    /// Gives out `piece` of the call being read, or holds it while the call may be a repeat.
    fn call_piece(&mut self, out: &mut Vec<Piece>, piece: Piece) {
        if let Piece::Arguments { fragment, .. } = &piece {
            self.arguments.push_str(fragment);
        }
        if !self.holding {
            out.push(piece);
            return;
        }
        self.held.push(piece);
        let (name, so_far) = (&self.name, &self.arguments);
        let may_repeat = self
            .complete
            .iter()
            .any(|c| &c.name == name && c.arguments.starts_with(so_far.as_str()));
        if !may_repeat {
            self.holding = false;
            out.append(&mut self.held);
        }
    }

    /// Call `index` has a name: a call of a function called before may be a repeat.
    fn call_starts(&mut self, out: &mut Vec<Piece>, index: usize) {
        self.arguments.clear();
        self.held.clear();
        self.holding = self.complete.iter().any(|c| c.name == self.name);
        let name = self.name.clone();
        self.call_piece(out, Piece::CallStart { index, name });
    }

    /// The call being read is whole: a repeat ends the answer, any other is given out.
    fn call_ends(&mut self, out: &mut Vec<Piece>) {
        let repeat = self
            .complete
            .iter()
            .any(|c| c.name == self.name && c.arguments == self.arguments);
        self.holding = false;
        if repeat {
            self.held.clear();
            self.repeated = true;
            self.at = At::Done;
            return;
        }
        out.append(&mut self.held);
        self.complete.push(Call {
            name: self.name.clone(),
            arguments: std::mem::take(&mut self.arguments),
        });
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
                    self.arguments_ended = false;
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
                    self.call_starts(out, index);
                    self.at = At::Call { index };
                    if !self.held_arguments.is_empty() {
                        let fragment = std::mem::take(&mut self.held_arguments);
                        self.call_piece(out, Piece::Arguments { index, fragment });
                        if self.arguments_ended {
                            self.call_ends(out);
                        }
                    }
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
                self.at = match end {
                    Some(_) => At::Call { index },
                    None => At::Arguments {
                        index,
                        depth,
                        in_string,
                        escaped,
                    },
                };
                if self.name.is_empty() {
                    // arguments before the name: given out (and judged) once it comes
                    self.held_arguments.push_str(&fragment);
                    self.arguments_ended = end.is_some();
                } else {
                    if !fragment.is_empty() {
                        self.call_piece(out, Piece::Arguments { index, fragment });
                    }
                    if end.is_some() {
                        self.call_ends(out);
                    }
                }
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

    /// ADP-TOOL-6: a repeat is never given out, piece by piece either; a call that only
    /// begins like an earlier one is, once it differs.
    #[test]
    fn a_repeated_call_is_held_back_and_ends_the_scan() {
        let first = r#"{"tool_calls":[{"name":"f","arguments":{"q":"cats"}}"#;
        let near = r#",{"name":"f","arguments":{"q":"cat"}}"#;
        let again = r#",{"name":"f","arguments":{"q":"cats"}},{"name":"g","arguments":{}}]}"#;
        for n in 1..=7 {
            let text: Vec<char> = format!("{first}{near}{again}").chars().collect();
            let mut s = AnswerStream::new();
            let mut all = Vec::new();
            for chunk in text.chunks(n) {
                all.extend(s.push(&chunk.iter().collect::<String>()));
            }
            let all = merge(all);
            let starts = all
                .iter()
                .filter(|p| matches!(p, Piece::CallStart { .. }))
                .count();
            assert_eq!(
                starts, 2,
                "the first and the near one, not the repeat: {all:?}"
            );
            assert_eq!(
                all.last(),
                Some(&Piece::Arguments {
                    index: 1,
                    fragment: r#"{"q":"cat"}"#.into()
                })
            );
            assert!(s.repeated());
            assert_eq!(s.complete_calls().len(), 2);
        }
    }

    #[test]
    fn text_that_is_no_answer_ends_the_scan_quietly() {
        let mut s = AnswerStream::new();
        assert!(s.push("Hello, I am a model").is_empty());
        assert!(s.push(r#"{"content":"x"}"#).is_empty());
    }
}
