//! The OpenAI shapes a worker's backend speaks: the request body the server sends for a task,
//! and a reader of the streamed `data:` lines that turns them into text pieces, the finish
//! reason and the usage. The worker uses the reader too, for `token_counts`.

use contracts::worker::TokenCounts;
use pool_manager::{
    EngineJob, OutputConstraint, PortError, PromptInput, PromptPart, StepLogprobs, TokenLogprob,
    MAX_TOP_LOGPROBS,
};
use serde_json::{json, Value};

/// Longest line kept while waiting for its newline (a frame limit bounds it anyway).
const MAX_LINE_BYTES: usize = 1 << 20;

/// The ids of a prompt given as token ids only (`None` when a piece is text).
fn ids_only(parts: &[PromptPart]) -> Option<Vec<u32>> {
    parts
        .iter()
        .map(|p| match p {
            PromptPart::Token(id) => Some(*id),
            PromptPart::Text(_) => None,
        })
        .collect()
}

/// Whether a backend can take `prompt` as OpenAI's completions do: text, or token ids alone
/// (vLLM, llama.cpp's server and orchestratord take `prompt` as an id array). Ids mixed with
/// text, or ids to continue after text already streamed, have no spelling there. Returns the
/// ids of a prompt of ids.
pub fn backend_prompt(
    prompt: &PromptInput,
    continuation: &str,
) -> Result<Option<Vec<u32>>, PortError> {
    let PromptInput::Tokens(parts) = prompt else {
        return Ok(None);
    };
    if !prompt.has_token_ids() {
        return Ok(None);
    }
    match ids_only(parts) {
        Some(ids) if continuation.is_empty() => Ok(Some(ids)),
        _ => Err(PortError::Refused {
            field: "prompt_tokens".into(),
            message: "a remote worker's backend takes a prompt of text or of token ids alone: \
                      not ids mixed with text, nor ids continued after streamed text"
                .into(),
        }),
    }
}

/// The endpoint and JSON body of a job for an OpenAI-compatible backend. A continuation is
/// sent as a final assistant turn with `continue_final_message` (vLLM's parameter, honoured by
/// orchestratord; llama.cpp's server continues a final assistant turn by itself), or appended
/// to a raw prompt.
pub fn request_body(model: &str, job: &EngineJob) -> (&'static str, Value) {
    let s = &job.sampling;
    let mut body = json!({
        "model": model,
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_tokens": job.max_tokens,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "seed": s.seed,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
    });
    if s.top_k > 0 {
        body["top_k"] = json!(s.top_k);
    }
    if s.min_p > 0.0 {
        body["min_p"] = json!(s.min_p);
    }
    if s.repetition_penalty != 1.0 {
        body["repetition_penalty"] = json!(s.repetition_penalty);
    }
    if !job.stop.is_empty() {
        body["stop"] = json!(job.stop);
    }
    // structured output, as vLLM, llama.cpp's server and orchestratord take it
    if let Some(OutputConstraint::JsonSchema(text)) = &job.constraint {
        let schema: Value = serde_json::from_str(text).unwrap_or(Value::Bool(true));
        body["response_format"] = json!({"type": "json_schema", "json_schema": {
            "name": "output", "schema": schema, "strict": true}});
    }
    let top = job.logprobs.map(|n| n.min(MAX_TOP_LOGPROBS));
    match &job.prompt {
        PromptInput::Text(_) | PromptInput::Tokens(_) => {
            body["prompt"] = match &job.prompt {
                PromptInput::Tokens(parts) => match ids_only(parts) {
                    // `backend_prompt` let only ids alone through, uncontinued
                    Some(ids) => json!(ids),
                    None => json!(format!("{}{}", text_of(parts), job.continuation)),
                },
                PromptInput::Text(p) => json!(format!("{p}{}", job.continuation)),
                PromptInput::Chat(_) => Value::Null,
            };
            if let Some(n) = top {
                // the completions spelling: how many alternatives (the chosen one always)
                body["logprobs"] = json!(n);
            }
            ("/v1/completions", body)
        }
        PromptInput::Chat(turns) => {
            let mut messages: Vec<Value> = turns
                .iter()
                .map(|t| json!({"role": t.role, "content": t.content}))
                .collect();
            if !job.continuation.is_empty() {
                messages.push(json!({"role": "assistant", "content": job.continuation}));
                body["continue_final_message"] = json!(true);
                body["add_generation_prompt"] = json!(false);
            }
            body["messages"] = json!(messages);
            if let Some(n) = top {
                body["logprobs"] = json!(true);
                body["top_logprobs"] = json!(n);
            }
            ("/v1/chat/completions", body)
        }
    }
}

/// The text pieces of a prompt of parts, one after the other.
fn text_of(parts: &[PromptPart]) -> String {
    parts
        .iter()
        .filter_map(|p| match p {
            PromptPart::Text(t) => Some(t.as_str()),
            PromptPart::Token(_) => None,
        })
        .collect()
}

/// What one streamed line said.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamItem {
    Text(String),
    /// Text with the log-probabilities of the tokens that make it (one per token, in order).
    Scored(String, Vec<StepLogprobs>),
    Finish(String),
    /// vLLM's `stop_reason` (and ours): the stop sequence that ended the choice.
    StopSequence(String),
    Usage(TokenCounts),
    Error(String),
}

/// Reads `data: {json}` lines of an OpenAI stream across arbitrary chunk boundaries.
#[derive(Debug, Default)]
pub struct StreamReader {
    pending: String,
}

impl StreamReader {
    /// Feeds one chunk; returns what its complete lines said.
    pub fn feed(&mut self, chunk: &str) -> Vec<StreamItem> {
        self.pending.push_str(chunk);
        let mut out = Vec::new();
        while let Some(nl) = self.pending.find('\n') {
            let line: String = self.pending.drain(..=nl).collect();
            read_line(line.trim_end(), &mut out);
        }
        if self.pending.len() > MAX_LINE_BYTES {
            self.pending.clear();
            out.push(StreamItem::Error("a stream line exceeded 1 MiB".into()));
        }
        out
    }
}

fn read_line(line: &str, out: &mut Vec<StreamItem>) {
    let Some(data) = line.strip_prefix("data:") else {
        return;
    };
    let data = data.trim();
    if data.is_empty() || data == "[DONE]" {
        return;
    }
    match serde_json::from_str::<Value>(data) {
        Ok(v) => read_object(&v, out),
        Err(e) => out.push(StreamItem::Error(format!("unreadable stream line: {e}"))),
    }
}

/// Reads one chunk object (or a whole non-streamed response).
pub fn read_object(v: &Value, out: &mut Vec<StreamItem>) {
    if let Some(err) = v.get("error") {
        let msg = err
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| err.to_string());
        out.push(StreamItem::Error(msg));
        return;
    }
    if let Some(choice) = v.get("choices").and_then(|c| c.get(0)) {
        let text = choice
            .pointer("/delta/content")
            .or_else(|| choice.pointer("/message/content"))
            .or_else(|| choice.get("text"))
            .and_then(Value::as_str);
        if let Some(t) = text.filter(|t| !t.is_empty()) {
            let steps = choice
                .get("logprobs")
                .map(read_logprobs)
                .unwrap_or_default();
            out.push(if steps.is_empty() {
                StreamItem::Text(t.to_string())
            } else {
                StreamItem::Scored(t.to_string(), steps)
            });
        }
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            out.push(StreamItem::Finish(f.to_string()));
        }
        if let Some(s) = choice.get("stop_reason").and_then(Value::as_str) {
            out.push(StreamItem::StopSequence(s.to_string()));
        }
    }
    if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
        let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
        out.push(StreamItem::Usage(TokenCounts {
            prompt_tokens: n("prompt_tokens"),
            completion_tokens: n("completion_tokens"),
            total_tokens: n("total_tokens"),
            cached_tokens: u
                .pointer("/prompt_tokens_details/cached_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0),
        }));
    }
}

/// A choice's `logprobs`: the chat spelling (`content: [{token, logprob, bytes,
/// top_logprobs: [{token, logprob, bytes}]}]`) or the completions one (`tokens`,
/// `token_logprobs`, `top_logprobs: [{token: logprob}]`). Entries it cannot read are left out.
fn read_logprobs(v: &Value) -> Vec<StepLogprobs> {
    let one = |e: &Value| -> Option<TokenLogprob> {
        let token = e.get("token")?.as_str()?;
        let bytes = e
            .get("bytes")
            .and_then(Value::as_array)
            .and_then(|b| {
                b.iter()
                    .map(|x| x.as_u64().and_then(|x| u8::try_from(x).ok()))
                    .collect::<Option<Vec<u8>>>()
            })
            .unwrap_or_else(|| token.as_bytes().to_vec());
        Some(TokenLogprob {
            id: None,
            bytes,
            logprob: e.get("logprob")?.as_f64()? as f32,
        })
    };
    if let Some(content) = v.get("content").and_then(Value::as_array) {
        return content
            .iter()
            .filter_map(|e| {
                let mut top: Vec<TokenLogprob> = e
                    .get("top_logprobs")
                    .and_then(Value::as_array)
                    .map(|t| t.iter().filter_map(one).collect())
                    .unwrap_or_default();
                top.truncate(MAX_TOP_LOGPROBS);
                Some(StepLogprobs {
                    chosen: one(e)?,
                    top,
                })
            })
            .collect();
    }
    let (Some(tokens), Some(lps)) = (
        v.get("tokens").and_then(Value::as_array),
        v.get("token_logprobs").and_then(Value::as_array),
    ) else {
        return Vec::new();
    };
    let tops = v.get("top_logprobs").and_then(Value::as_array);
    tokens
        .iter()
        .zip(lps)
        .enumerate()
        .filter_map(|(k, (t, lp))| {
            let token = t.as_str()?;
            let mut top: Vec<TokenLogprob> = tops
                .and_then(|a| a.get(k))
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .filter_map(|(tok, lp)| {
                            Some(TokenLogprob {
                                id: None,
                                bytes: tok.as_bytes().to_vec(),
                                logprob: lp.as_f64()? as f32,
                            })
                        })
                        .collect()
                })
                .unwrap_or_default();
            top.sort_by(|a, b| b.logprob.total_cmp(&a.logprob));
            top.truncate(MAX_TOP_LOGPROBS);
            Some(StepLogprobs {
                chosen: TokenLogprob {
                    id: None,
                    bytes: token.as_bytes().to_vec(),
                    logprob: lp.as_f64()? as f32,
                },
                top,
            })
        })
        .collect()
}

/// The task field a backend's refusal names (`error.param`, OpenAI's and vLLM's), as the task
/// calls it: `response_format` is the task's `json_schema`.
pub fn refused_field(body: &str) -> Option<String> {
    let v: Value = serde_json::from_str(body).ok()?;
    let param = v.pointer("/error/param").and_then(Value::as_str)?;
    Some(match param {
        "response_format" => "json_schema".to_string(),
        other => other.chars().take(64).collect(),
    })
}

/// The message of an error body (`{"error": {"message": …}}`, or the text itself).
pub fn error_message(body: &str) -> String {
    serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .or_else(|| v.get("error"))
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_else(|| body.chars().take(500).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pool_manager::{ChatTurn, SamplingParams, Slots};

    /// WRK-ENG-2: stream lines split anywhere still give each piece of text once, in order,
    /// with the finish reason and usage.
    #[test]
    fn reads_chunks_split_anywhere() {
        let stream = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Par\"}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"is é\"},\"finish_reason\":null}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n",
            "data: [DONE]\n\n"
        );
        for split in [1, 3, 7, 50, stream.len()] {
            let mut r = StreamReader::default();
            let mut items = Vec::new();
            let mut rest = stream;
            while !rest.is_empty() {
                let mut at = split.min(rest.len());
                while !rest.is_char_boundary(at) {
                    at += 1;
                }
                items.extend(r.feed(&rest[..at]));
                rest = &rest[at..];
            }
            assert_eq!(
                items,
                vec![
                    StreamItem::Text("Par".into()),
                    StreamItem::Text("is é".into()),
                    StreamItem::Finish("stop".into()),
                    StreamItem::Usage(TokenCounts {
                        prompt_tokens: 5,
                        completion_tokens: 2,
                        total_tokens: 7,
                        cached_tokens: 0,
                    }),
                ],
                "split {split}"
            );
        }
    }

    /// WRK-ENG-3: a continuation goes as a final assistant turn with `continue_final_message`;
    /// a raw prompt gets it appended.
    #[test]
    fn continuation_in_the_body() {
        let turns = vec![ChatTurn {
            role: "user".into(),
            content: "Hi".into(),
        }];
        let mut job = EngineJob::new(
            Slots::new(1).try_acquire().unwrap(),
            PromptInput::Chat(turns),
            SamplingParams::default(),
            5,
        );
        job.continuation = "Hello the".into();
        let (path, body) = request_body("m", &job);
        assert_eq!(path, "/v1/chat/completions");
        assert_eq!(body["messages"][1]["role"], "assistant");
        assert_eq!(body["messages"][1]["content"], "Hello the");
        assert_eq!(body["continue_final_message"], true);
        assert_eq!(body["max_tokens"], 5);
        let mut job = EngineJob::new(
            Slots::new(1).try_acquire().unwrap(),
            PromptInput::Text("Once".into()),
            SamplingParams::default(),
            3,
        );
        job.continuation = " upon".into();
        let (path, body) = request_body("m", &job);
        assert_eq!(path, "/v1/completions");
        assert_eq!(body["prompt"], "Once upon");
    }

    #[test]
    fn error_lines_and_bodies() {
        let mut r = StreamReader::default();
        assert_eq!(
            r.feed("data: {\"error\":{\"message\":\"boom\"}}\n"),
            vec![StreamItem::Error("boom".into())]
        );
        assert_eq!(
            error_message(r#"{"error":{"message":"too long"}}"#),
            "too long"
        );
        assert_eq!(error_message("plain"), "plain");
    }
}

#[cfg(test)]
mod passing_on {
    use super::*;
    use pool_manager::{SamplingParams, Slots};

    /// ADP-SO-4: a JSON Schema goes to the backend as `response_format`; a backend's refusal
    /// naming `response_format` is the task's `json_schema`.
    #[test]
    fn a_schema_goes_as_response_format_and_its_refusal_is_named() {
        let slots = Slots::new(1);
        let permit = slots.try_acquire().unwrap();
        let mut job = EngineJob::new(
            permit,
            PromptInput::Text("x".into()),
            SamplingParams::default(),
            4,
        );
        job.constraint = Some(OutputConstraint::JsonSchema(r#"{"type":"object"}"#.into()));
        let (_, body) = request_body("m", &job);
        assert_eq!(body["response_format"]["type"], "json_schema");
        assert_eq!(
            body["response_format"]["json_schema"]["schema"]["type"],
            "object"
        );
        let refusal = r#"{"error":{"message":"bad","type":"invalid_request_error","param":"response_format"}}"#;
        assert_eq!(refused_field(refusal).as_deref(), Some("json_schema"));
        assert_eq!(refused_field(r#"{"error":{"message":"bad"}}"#), None);
        assert_eq!(refused_field("not json"), None);
    }

    /// ADP-LP-4: logprobs are asked in each endpoint's spelling and read back from both.
    #[test]
    fn logprobs_are_asked_and_read_back_in_both_spellings() {
        let slots = Slots::new(1);
        let job = |prompt: PromptInput| {
            let mut j = EngineJob::new(
                slots.try_acquire().unwrap(),
                prompt,
                SamplingParams::default(),
                4,
            );
            j.logprobs = Some(3);
            j
        };
        let (path, body) = request_body("m", &job(PromptInput::Text("x".into())));
        assert_eq!(
            (path, body["logprobs"].clone()),
            ("/v1/completions", json!(3))
        );
        let chat = PromptInput::Chat(vec![pool_manager::ChatTurn {
            role: "user".into(),
            content: "hi".into(),
        }]);
        let (_, body) = request_body("m", &job(chat));
        assert_eq!(
            (body["logprobs"].clone(), body["top_logprobs"].clone()),
            (json!(true), json!(3))
        );

        let mut items = Vec::new();
        read_object(
            &json!({"choices": [{"delta": {"content": "Hi!"}, "logprobs": {"content": [
                {"token": "Hi", "logprob": -0.5, "bytes": [72, 105],
                 "top_logprobs": [{"token": "Hi", "logprob": -0.5}, {"token": "Hey", "logprob": -1.5}]},
                {"token": "!", "logprob": -0.25, "top_logprobs": []}]}}]}),
            &mut items,
        );
        let StreamItem::Scored(text, steps) = &items[0] else {
            panic!("{items:?}")
        };
        assert_eq!(text, "Hi!");
        assert_eq!(steps.len(), 2);
        assert_eq!(steps[0].chosen.bytes, b"Hi");
        assert_eq!(steps[0].top[1].bytes, b"Hey");
        assert_eq!(steps[1].chosen.logprob, -0.25);

        let mut items = Vec::new();
        read_object(
            &json!({"choices": [{"text": " Paris", "logprobs": {"tokens": [" Paris"],
                "token_logprobs": [-0.1], "top_logprobs": [{" London": -3.0, " Paris": -0.1}]}}]}),
            &mut items,
        );
        let StreamItem::Scored(_, steps) = &items[0] else {
            panic!("{items:?}")
        };
        assert_eq!(steps[0].chosen.bytes, b" Paris");
        assert_eq!(steps[0].top[0].bytes, b" Paris", "likeliest first");
        assert_eq!(steps[0].top[1].logprob, -3.0);

        let mut items = Vec::new();
        read_object(
            &json!({"choices": [{"delta": {"content": "x"}, "logprobs": null}]}),
            &mut items,
        );
        assert_eq!(items, vec![StreamItem::Text("x".into())]);
    }
}
