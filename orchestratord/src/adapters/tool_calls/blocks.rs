//! An answer under tools as a list of blocks — its text, or one block per call — whole or, while
//! it streams, as the steps that open, grow and close them: what Anthropic's `content` blocks
//! and the Responses API's output items are made of.

use super::{read, Answer, AnswerStream, Call, Piece};

/// One block of an answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Block {
    Text(String),
    Call(Call),
}

/// The blocks of a whole answer (as [`read`] reads it): its calls, or its text — none when
/// the token budget cut it before either.
pub fn blocks(text: &str) -> Vec<Block> {
    match read(text) {
        Answer::Calls(calls) => calls.into_iter().map(Block::Call).collect(),
        Answer::Content(s) if s.is_empty() => Vec::new(),
        Answer::Content(s) => vec![Block::Text(s)],
    }
}

/// What a streamed answer's next text did to its blocks.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Block `index` opens: text (`call` None) or a call of the function `call`.
    Open { index: usize, call: Option<String> },
    /// Block `index` grows: text, or JSON text of the call's arguments.
    Delta { index: usize, text: String },
    /// Block `index` is whole.
    Close { index: usize, block: Block },
}

/// Follows a streamed answer block by block.
#[derive(Debug, Default)]
pub struct BlockStream {
    scan: AnswerStream,
    /// Blocks closed so far (the open one's index).
    closed: usize,
    open: Option<Block>,
    calls: usize,
}

impl BlockStream {
    pub fn new() -> Self {
        Self::default()
    }

    /// The steps that `text` (the answer's next characters) completes.
    pub fn push(&mut self, text: &str) -> Vec<Step> {
        let mut out = Vec::new();
        for piece in self.scan.push(text) {
            match piece {
                Piece::Content(s) => {
                    if !matches!(self.open, Some(Block::Text(_))) {
                        self.close(&mut out);
                        self.open = Some(Block::Text(String::new()));
                        out.push(Step::Open {
                            index: self.closed,
                            call: None,
                        });
                    }
                    if let Some(Block::Text(t)) = self.open.as_mut() {
                        t.push_str(&s);
                    }
                    out.push(Step::Delta {
                        index: self.closed,
                        text: s,
                    });
                }
                Piece::CallStart { name, .. } => {
                    self.close(&mut out);
                    self.calls += 1;
                    out.push(Step::Open {
                        index: self.closed,
                        call: Some(name.clone()),
                    });
                    self.open = Some(Block::Call(Call {
                        name,
                        arguments: String::new(),
                    }));
                }
                Piece::Arguments { fragment, .. } => {
                    if let Some(Block::Call(c)) = self.open.as_mut() {
                        c.arguments.push_str(&fragment);
                        out.push(Step::Delta {
                            index: self.closed,
                            text: fragment,
                        });
                    }
                }
            }
        }
        out
    }

    /// The answer is over: the open block closes.
    pub fn finish(&mut self) -> Vec<Step> {
        let mut out = Vec::new();
        self.close(&mut out);
        out
    }

    /// Whether the model began a call identical to an earlier one (see [`AnswerStream`]).
    pub fn repeated(&self) -> bool {
        self.scan.repeated()
    }

    /// Calls begun so far.
    pub fn calls(&self) -> usize {
        self.calls
    }

    /// Blocks opened so far.
    pub fn opened(&self) -> usize {
        self.closed + usize::from(self.open.is_some())
    }

    fn close(&mut self, out: &mut Vec<Step>) {
        if let Some(block) = self.open.take() {
            out.push(Step::Close {
                index: self.closed,
                block,
            });
            self.closed += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str, size: usize) -> Vec<Step> {
        let chars: Vec<char> = text.chars().collect();
        let mut s = BlockStream::new();
        let mut out = Vec::new();
        for chunk in chars.chunks(size) {
            out.extend(s.push(&chunk.iter().collect::<String>()));
        }
        out.extend(s.finish());
        out
    }

    /// A block as opened (index, function name) with its deltas joined.
    type Opened = (usize, Option<String>, String);

    /// The deltas of each block, joined, and the closed blocks.
    fn summary(steps: &[Step]) -> (Vec<Opened>, Vec<Block>) {
        let mut opened: Vec<Opened> = Vec::new();
        let mut closed = Vec::new();
        for s in steps {
            match s {
                Step::Open { index, call } => opened.push((*index, call.clone(), String::new())),
                Step::Delta { index, text } => {
                    let o = opened.last_mut().unwrap();
                    assert_eq!(o.0, *index, "a delta belongs to the open block");
                    o.2.push_str(text);
                }
                Step::Close { index, block } => {
                    assert_eq!(opened.last().unwrap().0, *index);
                    closed.push(block.clone());
                }
            }
        }
        (opened, closed)
    }

    #[test]
    fn calls_stream_as_one_block_each_and_match_the_whole_answer() {
        let text = r#"{"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}},{"name":"get_time","arguments":{"zone":"CET"}}]}"#;
        for size in 1..=6 {
            let (opened, closed) = summary(&run(text, size));
            assert_eq!(
                opened,
                vec![
                    (0, Some("get_weather".into()), r#"{"city":"Paris"}"#.into()),
                    (1, Some("get_time".into()), r#"{"zone":"CET"}"#.into()),
                ]
            );
            assert_eq!(closed, blocks(text));
        }
    }

    #[test]
    fn text_answers_are_one_text_block() {
        let text = r#"{"content":"It is \"sunny\"."}"#;
        for size in 1..=4 {
            let steps = run(text, size);
            let (opened, closed) = summary(&steps);
            assert_eq!(opened, vec![(0, None, "It is \"sunny\".".into())]);
            assert_eq!(closed, vec![Block::Text("It is \"sunny\".".into())]);
        }
        assert_eq!(
            blocks("{\"tool_calls\":[{\"na"),
            vec![],
            "a cut answer is no block, never its JSON"
        );
    }
}
