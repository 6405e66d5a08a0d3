//! The remote worker protocol (seed 002, the modelrelay worker protocol): JSON text frames over
//! one WebSocket per worker, `#[serde(tag = "type")]`, snake_case. Unknown fields are ignored
//! so newer peers can add fields; unknown cancel reasons are kept as they came.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The path a worker connects to (WebSocket upgrade).
pub const CONNECT_PATH: &str = "/v1/worker/connect";
/// The header carrying the worker secret (or the `worker_secret` query parameter).
pub const SECRET_HEADER: &str = "x-worker-secret";
/// The protocol version of the seed.
pub const PROTOCOL_V1: &str = "1";
/// The version the modelrelay worker daemon sends.
pub const PROTOCOL_BRIDGE_V1: &str = "2026-04-bridge-v1";
/// Versions a server accepts (a register without one is accepted too).
pub const SUPPORTED_PROTOCOLS: [&str; 2] = [PROTOCOL_V1, PROTOCOL_BRIDGE_V1];
/// Requeues of one request after its worker was lost, before it fails (seed: 3).
pub const MAX_REQUEUE_COUNT: u32 = 3;

/// Usage of one finished request, as the backend counted it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TokenCounts {
    #[serde(default)]
    pub prompt_tokens: u64,
    #[serde(default)]
    pub completion_tokens: u64,
    #[serde(default)]
    pub total_tokens: u64,
    /// Of `prompt_tokens`, those the backend took from its cache (OpenAI's
    /// `usage.prompt_tokens_details.cached_tokens`); absent: none or unknown.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Why the server stops a request on a worker. Unknown reasons are kept verbatim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelReason {
    /// The HTTP client dropped the connection (or cancelled the task).
    ClientDisconnect,
    /// The request ran past the request timeout.
    Timeout,
    /// The worker is being drained.
    GracefulShutdown,
    /// The worker's WebSocket closed unexpectedly.
    WorkerDisconnect,
    /// The request was requeued too often.
    RequeueExhausted,
    /// The server process is terminating.
    ServerShutdown,
    #[serde(untagged)]
    Other(String),
}

impl CancelReason {
    pub fn as_str(&self) -> &str {
        match self {
            Self::ClientDisconnect => "client_disconnect",
            Self::Timeout => "timeout",
            Self::GracefulShutdown => "graceful_shutdown",
            Self::WorkerDisconnect => "worker_disconnect",
            Self::RequeueExhausted => "requeue_exhausted",
            Self::ServerShutdown => "server_shutdown",
            Self::Other(s) => s,
        }
    }
}

/// Messages a worker sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerToServer {
    Register {
        worker_name: String,
        models: Vec<String>,
        max_concurrent: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        protocol_version: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        current_load: Option<u32>,
    },
    ModelsUpdate {
        models: Vec<String>,
        #[serde(default)]
        current_load: u32,
    },
    ResponseChunk {
        request_id: String,
        chunk: String,
    },
    ResponseComplete {
        request_id: String,
        status_code: u16,
        #[serde(default)]
        headers: BTreeMap<String, String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        body: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        token_counts: Option<TokenCounts>,
    },
    Pong {
        #[serde(default)]
        current_load: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timestamp_unix_ms: Option<u64>,
    },
    Error {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request_id: Option<String>,
        code: String,
        message: String,
    },
    /// Not in the seed, sent only to a server whose `register_ack` asked for it: what the
    /// worker's engines hold of the prompts they saw for one of its models (chained block
    /// hashes, `engine_port::prefix`), as changes since the model's previous such message
    /// (`seq` one more) or (`full`) the first part of its whole set. Block hashes are base64
    /// of little-endian `u64`s.
    HeldPrefixes {
        model: String,
        seq: u64,
        #[serde(default, skip_serializing_if = "is_false")]
        full: bool,
        #[serde(default)]
        added: String,
        #[serde(default)]
        evicted: String,
    },
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Messages the server sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ServerToWorker {
    RegisterAck {
        worker_id: String,
        models: Vec<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        warnings: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        protocol_version: Option<String>,
        /// Not in the seed: the server reads `held_prefixes` (a worker that can say what its
        /// engines hold sends them; one that cannot, or does not know the field, sends none).
        #[serde(default, skip_serializing_if = "is_false")]
        held_prefixes: bool,
    },
    Request {
        request_id: String,
        model: String,
        endpoint_path: String,
        is_streaming: bool,
        /// The request body as JSON text, forwarded to the backend as it is.
        body: String,
        #[serde(default)]
        headers: BTreeMap<String, String>,
    },
    Cancel {
        request_id: String,
        reason: CancelReason,
    },
    Ping {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timestamp_unix_ms: Option<u64>,
    },
    GracefulShutdown {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        drain_timeout_secs: Option<u64>,
    },
    ModelsRefresh {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Not in the seed: the answer to a frame the server could not read (same shape as the
    /// worker's `error`). Workers that do not know it ignore an unknown type.
    Error {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        request_id: Option<String>,
        code: String,
        message: String,
    },
}

/// One connected worker, as `GET /v1/workers` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"worker_id": "w-a1b2c3d4", "worker_name": "gpu-box-1", "protocol_version": "1", "models": ["llama3-8b"], "pools": ["w-a1b2c3d4:llama3-8b"], "max_concurrent": 4, "in_flight": 1, "current_load": 1, "draining": false}))]
pub struct WorkerInfo {
    pub worker_id: String,
    pub worker_name: String,
    pub protocol_version: Option<String>,
    pub models: Vec<String>,
    /// The pools its models are (`<worker_id>:<model>`).
    pub pools: Vec<String>,
    pub max_concurrent: u32,
    /// Requests this server has running on it.
    pub in_flight: u32,
    /// The load it last reported (`pong`, `models_update`).
    pub current_load: u32,
    pub draining: bool,
    /// In a cluster (`cluster.nats_urls`): the replica the worker is connected to. Every
    /// replica lists every replica's workers (as each last announced them); drain and
    /// `models_refresh` on any replica reach the one holding the worker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
}

/// `GET /v1/workers`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WorkerList {
    pub workers: Vec<WorkerInfo>,
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// WRK-PROTO-1: every message of the seed's traces parses field for field and writes back
    /// the same JSON.
    #[test]
    fn seed_messages_round_trip() {
        let worker = [
            json!({"type":"register","worker_name":"gpu-box-1","models":["llama3-8b"],"max_concurrent":4,"protocol_version":"1","current_load":0}),
            json!({"type":"models_update","models":["llama3-8b","codellama-13b"],"current_load":1}),
            json!({"type":"response_chunk","request_id":"r-002","chunk":"data: {\"choices\":[]}\n\n"}),
            json!({"type":"response_complete","request_id":"r-001","status_code":200,"headers":{"content-type":"application/json"},"body":"{}","token_counts":{"prompt_tokens":42,"completion_tokens":128,"total_tokens":170}}),
            json!({"type":"pong","current_load":1,"timestamp_unix_ms":5}),
            json!({"type":"error","request_id":"r-1","code":"backend","message":"down"}),
            json!({"type":"held_prefixes","model":"llama3-8b","seq":1,"full":true,"added":"AQAAAAAAAAA=","evicted":""}),
        ];
        for v in worker {
            let m: WorkerToServer = serde_json::from_value(v.clone()).unwrap();
            assert_eq!(serde_json::to_value(&m).unwrap(), v);
        }
        let server = [
            json!({"type":"register_ack","worker_id":"w-a1b2c3","models":["llama3-8b"],"protocol_version":"1"}),
            json!({"type":"register_ack","worker_id":"w-a1b2c3","models":["llama3-8b"],"protocol_version":"1","held_prefixes":true}),
            json!({"type":"request","request_id":"r-001","model":"llama3-8b","endpoint_path":"/v1/chat/completions","is_streaming":false,"body":"{}","headers":{}}),
            json!({"type":"cancel","request_id":"r-002","reason":"client_disconnect"}),
            json!({"type":"ping","timestamp_unix_ms":7}),
            json!({"type":"graceful_shutdown","reason":"maintenance","drain_timeout_secs":30}),
            json!({"type":"models_refresh","reason":"periodic"}),
        ];
        for v in server {
            let m: ServerToWorker = serde_json::from_value(v.clone()).unwrap();
            assert_eq!(serde_json::to_value(&m).unwrap(), v);
        }
    }

    /// WRK-PROTO-2: unknown fields are ignored, optional fields may be missing, and cancel
    /// reasons are the seed's words; an unknown reason is tolerated and kept.
    #[test]
    fn forward_compatible() {
        let m: WorkerToServer = serde_json::from_value(json!({"type":"register","worker_name":"w","models":[],"max_concurrent":1,"gpu":"H100"})).unwrap();
        assert!(matches!(
            m,
            WorkerToServer::Register {
                protocol_version: None,
                ..
            }
        ));
        let m: WorkerToServer =
            serde_json::from_value(json!({"type":"pong","current_load":2,"extra":1})).unwrap();
        assert_eq!(
            m,
            WorkerToServer::Pong {
                current_load: 2,
                timestamp_unix_ms: None
            }
        );
        for (r, s) in [
            (CancelReason::ClientDisconnect, "client_disconnect"),
            (CancelReason::Timeout, "timeout"),
            (CancelReason::GracefulShutdown, "graceful_shutdown"),
            (CancelReason::WorkerDisconnect, "worker_disconnect"),
            (CancelReason::RequeueExhausted, "requeue_exhausted"),
            (CancelReason::ServerShutdown, "server_shutdown"),
        ] {
            assert_eq!(serde_json::to_value(&r).unwrap(), json!(s));
            assert_eq!(r.as_str(), s);
        }
        let m: ServerToWorker = serde_json::from_value(
            json!({"type":"cancel","request_id":"x","reason":"cosmic_rays"}),
        )
        .unwrap();
        assert_eq!(
            m,
            ServerToWorker::Cancel {
                request_id: "x".into(),
                reason: CancelReason::Other("cosmic_rays".into())
            }
        );
        assert!(serde_json::from_str::<WorkerToServer>(r#"{"type":"bogus"}"#).is_err());
    }
}
