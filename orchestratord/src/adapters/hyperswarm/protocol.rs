//! The seed-000 wire protocol: NDJSON envelopes `{type, payload, request_id?}` between a peer
//! (client) and this host.

use contracts::ErrorCode;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Error codes of the protocol (seed 000), plus whatever a peer sends that we do not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerCode {
    InvalidServerId,
    ConnectFailed,
    HostOffline,
    HostDisconnected,
    OllamaNotFound,
    OllamaModelNotAvailable,
    ModelBusy,
    GenerationFailed,
    GenerationAborted,
    BadMessage,
    UnsupportedVersion,
    TimeoutNoResponse,
    /// A code this host does not know (from a peer): treated as a generic error.
    Other(String),
}

impl PeerCode {
    pub fn as_str(&self) -> &str {
        match self {
            Self::InvalidServerId => "INVALID_SERVER_ID",
            Self::ConnectFailed => "CONNECT_FAILED",
            Self::HostOffline => "HOST_OFFLINE",
            Self::HostDisconnected => "HOST_DISCONNECTED",
            Self::OllamaNotFound => "OLLAMA_NOT_FOUND",
            Self::OllamaModelNotAvailable => "OLLAMA_MODEL_NOT_AVAILABLE",
            Self::ModelBusy => "MODEL_BUSY",
            Self::GenerationFailed => "GENERATION_FAILED",
            Self::GenerationAborted => "GENERATION_ABORTED",
            Self::BadMessage => "BAD_MESSAGE",
            Self::UnsupportedVersion => "UNSUPPORTED_VERSION",
            Self::TimeoutNoResponse => "TIMEOUT_NO_RESPONSE",
            Self::Other(s) => s,
        }
    }

    pub fn parse(s: &str) -> Self {
        const KNOWN: [PeerCode; 12] = [
            PeerCode::InvalidServerId,
            PeerCode::ConnectFailed,
            PeerCode::HostOffline,
            PeerCode::HostDisconnected,
            PeerCode::OllamaNotFound,
            PeerCode::OllamaModelNotAvailable,
            PeerCode::ModelBusy,
            PeerCode::GenerationFailed,
            PeerCode::GenerationAborted,
            PeerCode::BadMessage,
            PeerCode::UnsupportedVersion,
            PeerCode::TimeoutNoResponse,
        ];
        KNOWN
            .into_iter()
            .find(|k| k.as_str() == s)
            .unwrap_or_else(|| Self::Other(s.to_string()))
    }

    /// The protocol code for a refusal or failure of the task spine.
    pub fn from_task_error(code: ErrorCode) -> Self {
        match code {
            ErrorCode::AdmissionReject | ErrorCode::QueueFullDropLru => Self::ModelBusy,
            ErrorCode::NotFound | ErrorCode::PoolUnavailable | ErrorCode::PoolUnready => {
                Self::OllamaModelNotAvailable
            }
            ErrorCode::InvalidParams | ErrorCode::PayloadTooLarge => Self::BadMessage,
            ErrorCode::DecodeTimeout | ErrorCode::DeadlineUnmet | ErrorCode::QueueTimeout => {
                Self::TimeoutNoResponse
            }
            ErrorCode::ShuttingDown => Self::HostOffline,
            _ => Self::GenerationFailed,
        }
    }
}

/// A request id as the peer sent it (string or number), echoed back unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RequestId(pub String, bool);

impl RequestId {
    fn from_value(v: &Value) -> Option<Self> {
        match v {
            Value::String(s) if !s.is_empty() && s.len() <= 256 => Some(Self(s.clone(), true)),
            Value::Number(n) => Some(Self(n.to_string(), false)),
            _ => None,
        }
    }

    pub fn to_value(&self) -> Value {
        if self.1 {
            Value::String(self.0.clone())
        } else {
            serde_json::from_str(&self.0).unwrap_or(Value::String(self.0.clone()))
        }
    }
}

/// `chat_start` payload fields this host reads (others are ignored).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ChatStart {
    pub prompt: String,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub max_tokens: Option<u32>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub seed: Option<u64>,
}

/// A message from a peer.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    ChatStart(RequestId, ChatStart),
    Abort(RequestId),
    /// An `error` from the peer (logged; unknown codes are generic).
    PeerError {
        code: PeerCode,
        message: String,
        request_id: Option<RequestId>,
    },
    /// The sidecar's first line: who the remote peer is.
    Peer {
        public_key: String,
    },
}

/// Why a line is refused (`BAD_MESSAGE`), with the request id when one could be read.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub message: String,
    pub request_id: Option<RequestId>,
}

fn refuse(message: impl Into<String>, request_id: Option<RequestId>) -> Refusal {
    Refusal {
        message: message.into(),
        request_id,
    }
}

/// Parses one line (without its newline).
pub fn parse(line: &str, max_prompt_bytes: usize) -> Result<Incoming, Refusal> {
    let v: Value =
        serde_json::from_str(line).map_err(|e| refuse(format!("not a JSON object: {e}"), None))?;
    let Value::Object(obj) = v else {
        return Err(refuse("a message must be a JSON object", None));
    };
    let request_id = match obj.get("request_id") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            RequestId::from_value(v)
                .ok_or_else(|| refuse("request_id must be a non-empty string or a number", None))?,
        ),
    };
    let Some(kind) = obj.get("type").and_then(Value::as_str) else {
        return Err(refuse("the message has no string `type`", request_id));
    };
    let payload = match obj.get("payload") {
        None | Some(Value::Null) => None,
        Some(Value::Object(p)) => Some(p),
        Some(_) => return Err(refuse("`payload` must be an object", request_id)),
    };
    match kind {
        "chat_start" => {
            let Some(id) = request_id else {
                return Err(refuse("chat_start needs a request_id", None));
            };
            let Some(payload) = payload else {
                return Err(refuse("chat_start needs a payload", Some(id)));
            };
            let start: ChatStart = serde_json::from_value(Value::Object(payload.clone()))
                .map_err(|e| refuse(format!("bad chat_start payload: {e}"), Some(id.clone())))?;
            if start.prompt.len() > max_prompt_bytes {
                return Err(refuse(
                    format!(
                        "prompt of {} bytes exceeds the limit of {max_prompt_bytes}",
                        start.prompt.len()
                    ),
                    Some(id),
                ));
            }
            if start.prompt.trim().is_empty() {
                return Err(refuse("the prompt is empty", Some(id)));
            }
            Ok(Incoming::ChatStart(id, start))
        }
        "abort" => match request_id {
            Some(id) => Ok(Incoming::Abort(id)),
            None => Err(refuse("abort needs a request_id", None)),
        },
        "error" => {
            let field = |k: &str| {
                payload
                    .and_then(|p| p.get(k))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            Ok(Incoming::PeerError {
                code: PeerCode::parse(&field("code")),
                message: field("message"),
                request_id,
            })
        }
        "_peer" => Ok(Incoming::Peer {
            public_key: payload
                .and_then(|p| p.get("public_key"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
        }),
        other => Err(refuse(
            format!("unknown message type {other:?}"),
            request_id,
        )),
    }
}

/// A message from this host, as one NDJSON line.
#[derive(Debug, Clone, Serialize)]
pub struct Outgoing {
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub payload: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<Value>,
}

impl Outgoing {
    pub fn server_info(host_name: &str, model: &str, status: &str) -> Self {
        Self {
            kind: "server_info",
            payload: json!({"host_name": host_name, "model": model, "status": status}),
            request_id: None,
        }
    }

    pub fn chunk(id: &RequestId, text: &str) -> Self {
        Self {
            kind: "chat_chunk",
            payload: json!({ "text": text }),
            request_id: Some(id.to_value()),
        }
    }

    /// `finish_reason` is `stop`, `abort` or `error`; `length` tells a `stop` that hit
    /// `max_tokens` (an addition to the seed).
    pub fn end(id: &RequestId, finish_reason: &str, tokens: Option<(usize, u32, bool)>) -> Self {
        let mut payload = json!({ "finish_reason": finish_reason });
        if let Some((prompt_tokens, completion_tokens, length)) = tokens {
            payload["usage"] =
                json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens});
            payload["length"] = json!(length);
        }
        Self {
            kind: "chat_end",
            payload,
            request_id: Some(id.to_value()),
        }
    }

    pub fn error(code: &PeerCode, message: &str, id: Option<&RequestId>) -> Self {
        Self {
            kind: "error",
            payload: json!({"code": code.as_str(), "message": message}),
            request_id: id.map(RequestId::to_value),
        }
    }

    /// The line, newline included.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec(self).unwrap_or_default();
        out.push(b'\n');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 8 * 1024;

    fn id(s: &str) -> RequestId {
        RequestId(s.into(), true)
    }

    /// HS-PROTO-1: every accepted message kind.
    #[test]
    fn parses_every_message_kind() {
        assert_eq!(
            parse(
                r#"{"type":"chat_start","request_id":"r1","payload":{"prompt":"hi","extra":1}}"#,
                MAX
            ),
            Ok(Incoming::ChatStart(
                id("r1"),
                ChatStart {
                    prompt: "hi".into(),
                    model: None,
                    max_tokens: None,
                    temperature: None,
                    seed: None
                }
            ))
        );
        assert_eq!(
            parse(r#"{"type":"abort","request_id":"r1","payload":{}}"#, MAX),
            Ok(Incoming::Abort(id("r1")))
        );
        assert_eq!(
            parse(
                r#"{"type":"error","payload":{"code":"WEIRD_THING","message":"m"}}"#,
                MAX
            ),
            Ok(Incoming::PeerError {
                code: PeerCode::Other("WEIRD_THING".into()),
                message: "m".into(),
                request_id: None
            })
        );
        assert_eq!(
            parse(r#"{"type":"_peer","payload":{"public_key":"ab"}}"#, MAX),
            Ok(Incoming::Peer {
                public_key: "ab".into()
            })
        );
        // numeric request ids are echoed as numbers
        let Ok(Incoming::Abort(n)) = parse(r#"{"type":"abort","request_id":7}"#, MAX) else {
            panic!()
        };
        assert_eq!(n.to_value(), json!(7));
    }

    /// HS-PROTO-2: every refusal is BAD_MESSAGE with the request id when it could be read.
    #[test]
    fn refuses_bad_lines() {
        let bad = |l: &str| parse(l, MAX).unwrap_err();
        assert_eq!(bad("not json").request_id, None);
        assert_eq!(bad("[1,2]").request_id, None);
        assert_eq!(
            bad(r#"{"payload":{},"request_id":"r"}"#).request_id,
            Some(id("r"))
        );
        assert!(bad(r#"{"payload":{}}"#).message.contains("type"));
        assert!(bad(r#"{"type":5}"#).message.contains("type"));
        assert!(bad(r#"{"type":"dance","request_id":"r"}"#)
            .message
            .contains("dance"));
        assert!(bad(r#"{"type":"chat_start","payload":{"prompt":"x"}}"#)
            .message
            .contains("request_id"));
        assert!(bad(r#"{"type":"chat_start","request_id":"r"}"#)
            .message
            .contains("payload"));
        assert!(
            bad(r#"{"type":"chat_start","request_id":"r","payload":{"prompt":3}}"#)
                .message
                .contains("payload")
        );
        assert!(
            bad(r#"{"type":"chat_start","request_id":"r","payload":{"prompt":"  "}}"#)
                .message
                .contains("empty")
        );
        assert!(
            bad(r#"{"type":"chat_start","request_id":"r","payload":[]}"#)
                .message
                .contains("object")
        );
        assert!(bad(r#"{"type":"abort"}"#).message.contains("request_id"));
        assert!(bad(r#"{"type":"abort","request_id":{}}"#)
            .message
            .contains("request_id"));
        let big = format!(
            r#"{{"type":"chat_start","request_id":"r","payload":{{"prompt":"{}"}}}}"#,
            "é".repeat(4097)
        );
        let r = bad(&big);
        assert!(r.message.contains("8194 bytes"), "{}", r.message);
        assert_eq!(r.request_id, Some(id("r")));
        // exactly at the limit is fine
        let ok = format!(
            r#"{{"type":"chat_start","request_id":"r","payload":{{"prompt":"{}"}}}}"#,
            "a".repeat(MAX)
        );
        assert!(parse(&ok, MAX).is_ok());
    }

    #[test]
    fn encodes_one_line_envelopes() {
        let line = Outgoing::chunk(&id("r1"), "a\nb").encode();
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
        let v: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(
            v,
            json!({"type":"chat_chunk","payload":{"text":"a\nb"},"request_id":"r1"})
        );
        let v: Value =
            serde_json::from_slice(&Outgoing::error(&PeerCode::ModelBusy, "busy", None).encode())
                .unwrap();
        assert_eq!(
            v,
            json!({"type":"error","payload":{"code":"MODEL_BUSY","message":"busy"}})
        );
        let v: Value =
            serde_json::from_slice(&Outgoing::end(&id("r"), "stop", Some((3, 4, true))).encode())
                .unwrap();
        assert_eq!(v["payload"]["usage"]["completion_tokens"], 4);
        assert_eq!(v["payload"]["length"], true);
        assert_eq!(PeerCode::parse("MODEL_BUSY"), PeerCode::ModelBusy);
        assert_eq!(
            PeerCode::from_task_error(ErrorCode::AdmissionReject),
            PeerCode::ModelBusy
        );
    }
}
