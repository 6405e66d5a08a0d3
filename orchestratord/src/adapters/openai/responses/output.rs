//! A response's output items — the answer's message, or one `function_call` item per call —
//! whole, or as the stream's numbered events while the answer arrives: `output_item.added`,
//! `content_part.added`, `output_text.delta`* … `output_item.done` for a message,
//! `output_item.added`, `function_call_arguments.delta`*, `function_call_arguments.done`,
//! `output_item.done` for a call.

use axum::body::Bytes;
use serde_json::{json, Value};

use super::tools::call_item;
use super::types::{OutputItem, OutputMessage, OutputText};
use crate::adapters::follow;
use crate::adapters::tool_calls::{Block, Call, Step};

/// The answer's message item (`text` None: opened, no content yet).
pub fn message(id: &str, status: &'static str, text: Option<String>) -> OutputMessage {
    OutputMessage {
        kind: "message",
        id: id.to_string(),
        status,
        role: "assistant",
        content: text
            .map(|text| OutputText {
                kind: "output_text",
                text,
                annotations: vec![],
            })
            .into_iter()
            .collect(),
    }
}

/// The output items of a whole answer's blocks.
pub fn items(
    blocks: Vec<Block>,
    task_id: &str,
    msg_id: &str,
    status: &'static str,
) -> Vec<OutputItem> {
    let mut calls = 0;
    blocks
        .into_iter()
        .map(|b| match b {
            Block::Text(t) => OutputItem::Message(message(msg_id, status, Some(t))),
            Block::Call(c) => {
                calls += 1;
                OutputItem::FunctionCall(call_item(task_id, calls - 1, c, status))
            }
        })
        .collect()
}

/// The events of one streamed response, numbered from its first.
pub struct Events {
    seq: u64,
    task_id: String,
    msg_id: String,
    /// Items closed so far, in order.
    done: Vec<OutputItem>,
    /// The open item is call number …
    call: Option<usize>,
    calls: usize,
    /// The status of items closed from now on (`incomplete` once the budget cut the answer).
    pub closing: &'static str,
}

impl Events {
    pub fn new(task_id: &str, msg_id: &str) -> Self {
        Self {
            seq: 0,
            task_id: task_id.to_string(),
            msg_id: msg_id.to_string(),
            done: Vec::new(),
            call: None,
            calls: 0,
            closing: "completed",
        }
    }

    /// `event: <type>` with `data` carrying `type` and `sequence_number`.
    pub fn event(&mut self, kind: &str, mut data: Value) -> Bytes {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        follow::sse_event(kind, &data)
    }

    /// The items closed so far.
    pub fn output(&self) -> Vec<OutputItem> {
        self.done.clone()
    }

    fn fc_id(&self, index: usize) -> String {
        format!("fc_{}_{index}", self.task_id.replace('-', ""))
    }

    /// The events of one step of the answer (`index`: the item's `output_index`).
    pub fn step(&mut self, step: Step) -> Vec<Bytes> {
        let text_at = |id: &str, index: usize| json!({"item_id": id, "output_index": index, "content_index": 0});
        match step {
            Step::Open { index, call: None } => {
                self.call = None;
                let item = message(&self.msg_id, "in_progress", None);
                let mut part = text_at(&self.msg_id, index);
                part["part"] = json!({"type": "output_text", "text": "", "annotations": []});
                vec![
                    self.event(
                        "response.output_item.added",
                        json!({"output_index": index, "item": item}),
                    ),
                    self.event("response.content_part.added", part),
                ]
            }
            Step::Open {
                index,
                call: Some(name),
            } => {
                let n = self.calls;
                self.calls += 1;
                self.call = Some(n);
                let call = Call {
                    name,
                    arguments: String::new(),
                };
                let item = call_item(&self.task_id, n, call, "in_progress");
                vec![self.event(
                    "response.output_item.added",
                    json!({"output_index": index, "item": item}),
                )]
            }
            Step::Delta { index, text } => match self.call {
                Some(n) => {
                    let d = json!({"item_id": self.fc_id(n), "output_index": index, "delta": text});
                    vec![self.event("response.function_call_arguments.delta", d)]
                }
                None => {
                    let mut d = text_at(&self.msg_id, index);
                    d["delta"] = json!(text);
                    d["logprobs"] = json!([]);
                    vec![self.event("response.output_text.delta", d)]
                }
            },
            Step::Close {
                index,
                block: Block::Text(text),
            } => {
                let mut d = text_at(&self.msg_id, index);
                d["text"] = json!(text);
                d["logprobs"] = json!([]);
                let mut p = text_at(&self.msg_id, index);
                p["part"] = json!({"type": "output_text", "text": text, "annotations": []});
                let item = message(&self.msg_id, self.closing, Some(text));
                let frames = vec![
                    self.event("response.output_text.done", d),
                    self.event("response.content_part.done", p),
                    self.event(
                        "response.output_item.done",
                        json!({"output_index": index, "item": item}),
                    ),
                ];
                self.done.push(OutputItem::Message(item));
                frames
            }
            Step::Close {
                index,
                block: Block::Call(c),
            } => {
                let n = self.call.take().unwrap_or(self.calls.saturating_sub(1));
                let d = json!({"item_id": self.fc_id(n), "output_index": index, "arguments": c.arguments});
                let item = call_item(&self.task_id, n, c, self.closing);
                let frames = vec![
                    self.event("response.function_call_arguments.done", d),
                    self.event(
                        "response.output_item.done",
                        json!({"output_index": index, "item": item}),
                    ),
                ];
                self.done.push(OutputItem::FunctionCall(item));
                frames
            }
        }
    }
}
