//! OpenAI request fields this server does not implement. A request that sets one to anything
//! but its neutral value is refused with a 400 naming the field: a client that asked for JSON
//! output, tools or log-probabilities must never get a 200 answered as if it had not asked.

use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::ToSchema;

use crate::error::ApiError;

/// Fields refused unless neutral (absent, null, false, empty, or the value named).
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
pub struct Unimplemented {
    /// Refused unless `{"type": "text"}`: structured (JSON) output is not implemented.
    pub response_format: Option<Value>,
    /// Tool calling is not implemented: refused unless empty.
    pub tools: Option<Value>,
    /// Refused unless `"none"`.
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<Value>,
    /// Deprecated function calling: refused unless empty.
    pub functions: Option<Value>,
    pub function_call: Option<Value>,
    /// Log-probabilities are not implemented: refused unless false/null.
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<Value>,
    pub logit_bias: Option<Value>,
    /// Text only: refused unless `["text"]`.
    pub modalities: Option<Value>,
    pub audio: Option<Value>,
    pub prediction: Option<Value>,
    pub reasoning_effort: Option<Value>,
    pub verbosity: Option<Value>,
    pub web_search_options: Option<Value>,
    /// Completions are not stored: refused unless false.
    pub store: Option<Value>,
    /// Text after the completion (`/v1/completions`): refused unless empty.
    pub suffix: Option<Value>,
}

fn neutral(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Number(_) | Value::Bool(true) => false,
    }
}

impl Unimplemented {
    /// The first field set to something this server would not honour, as a 400.
    pub fn check(&self) -> Result<(), ApiError> {
        let fields: [(&str, &Option<Value>, Option<Value>); 17] = [
            (
                "response_format",
                &self.response_format,
                Some(json!({"type": "text"})),
            ),
            ("tools", &self.tools, None),
            ("tool_choice", &self.tool_choice, Some(json!("none"))),
            ("parallel_tool_calls", &self.parallel_tool_calls, None),
            ("functions", &self.functions, None),
            ("function_call", &self.function_call, Some(json!("none"))),
            ("logprobs", &self.logprobs, None),
            ("top_logprobs", &self.top_logprobs, Some(json!(0))),
            ("logit_bias", &self.logit_bias, None),
            ("modalities", &self.modalities, Some(json!(["text"]))),
            ("audio", &self.audio, None),
            ("prediction", &self.prediction, None),
            ("reasoning_effort", &self.reasoning_effort, None),
            ("verbosity", &self.verbosity, None),
            ("web_search_options", &self.web_search_options, None),
            ("store", &self.store, None),
            ("suffix", &self.suffix, None),
        ];
        for (name, value, also_neutral) in fields {
            let Some(v) = value else { continue };
            // an empty `web_search_options` object turns search on with its defaults
            let empty_asks = name == "web_search_options" && v.is_object();
            if (neutral(v) && !empty_asks) || also_neutral.as_ref() == Some(v) {
                continue;
            }
            return Err(ApiError::invalid(
                name,
                format!("{name} is not supported by this server"),
            ));
        }
        Ok(())
    }
}
