//! The streamed answer scanner: turns an answer object's text into [`Piece`]s (a call's name,
//! fragments of its arguments, text of a `content` answer) as the tokens arrive.

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
    fn text_that_is_no_answer_ends_the_scan_quietly() {
        let mut s = AnswerStream::new();
        assert!(s.push("Hello, I am a model").is_empty());
        assert!(s.push(r#"{"content":"x"}"#).is_empty());
    }
}
