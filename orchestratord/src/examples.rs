//! Example payloads for the OpenAPI documents (one per error status and endpoint).

use serde_json::{json, Value};

pub fn invalid_params() -> Value {
    json!({"code": "INVALID_PARAMS", "message": "max_tokens must be within [1, 1024]", "retriable": false, "field": "max_tokens"})
}
pub fn admission_reject() -> Value {
    json!({"code": "ADMISSION_REJECT", "message": "queue full (64 tasks waiting)", "retriable": true, "retry_after_ms": 1800, "policy_label": "reject"})
}
pub fn budget_exceeded() -> Value {
    json!({"code": "BUDGET_EXCEEDED", "message": "session token budget exceeded: task needs 300 tokens, 120 remain", "retriable": false})
}
pub fn pool_unready() -> Value {
    json!({"code": "POOL_UNREADY", "message": "pool \"gpu0\" is draining", "retriable": true, "retry_after_ms": 1000, "pool_id": "gpu0"})
}
pub fn cluster_unavailable() -> Value {
    json!({"code": "CLUSTER_UNAVAILABLE", "message": "the cancel could not reach the other replicas: not connected to the NATS cluster", "retriable": true, "retry_after_ms": 1000})
}
pub fn deadline_unmet() -> Value {
    json!({"code": "DEADLINE_UNMET", "message": "deadline_ms 200 cannot be met even with no wait: predicted 1450 ms to answer (1250 ms short)", "retriable": false})
}
pub fn payload_too_large() -> Value {
    json!({"code": "PAYLOAD_TOO_LARGE", "message": "request body exceeds the configured limit", "retriable": false})
}
pub fn not_found() -> Value {
    json!({"code": "NOT_FOUND", "message": "task \"42\" not found", "retriable": false})
}
pub fn conflict() -> Value {
    json!({"code": "CONFLICT", "message": "cannot Drain while reloading: a reload is in progress; drain after it ends", "retriable": false})
}
pub fn reload_rollback() -> Value {
    json!({"code": "CONFLICT", "message": "reload failed, rolled back: cannot read model file /models/missing.gguf: No such file or directory (os error 2)", "retriable": false, "pool_id": "default"})
}
pub fn sse_stream() -> Value {
    Value::String("retry: 1000\n\nid: 0\nevent: started\ndata: {\"queue_position\":0,\"predicted_start_ms\":0}\n\nid: 1\nevent: token\ndata: {\"t\":\"The\",\"i\":0}\n\nid: 2\nevent: token\ndata: {\"t\":\" capital\",\"i\":1}\n\nid: 3\nevent: metrics\ndata: {\"queue_depth\":0,\"on_time_probability\":1.0,\"tokens_out\":2}\n\nid: 4\nevent: end\ndata: {\"tokens_out\":2,\"decode_time_ms\":31,\"decode_ms\":31,\"finish_reason\":\"length\"}\n\n".into())
}
pub fn sse_error_stream() -> Value {
    Value::String("retry: 1000\n\nid: 0\nevent: started\ndata: {\"queue_position\":3,\"predicted_start_ms\":1200}\n\nid: 1\nevent: error\ndata: {\"code\":\"QUEUE_FULL_DROP_LRU\",\"message\":\"evicted from a full queue by a newer task (drop-lru)\",\"retriable\":true,\"retry_after_ms\":400}\n\n".into())
}
pub fn task_status() -> Value {
    json!({"task_id": "t-1", "state": "completed", "record": record()})
}
pub fn record() -> Value {
    json!({"task_id": "t-1", "correlation_id": "c0ffee00-0000-4000-8000-000000000001", "priority": "interactive", "params": {"prompt": "[redacted 29 chars]", "max_tokens": 2}, "seed": 7, "max_tokens": 2, "prompt_tokens": 9, "tokens_out": 2, "pool_id": "default", "engine": "candle", "engine_version": "1.0.0+candle-0.11.1", "model_ref": ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf", "ctx": 2048, "timings": {"queued_ms": 1, "ttft_ms": 60, "decode_time_ms": 31, "total_ms": 91}, "terminal": {"event": "end", "tokens_out": 2, "decode_time_ms": 31, "decode_ms": 31, "finish_reason": "length"}, "transcript": [{"event": "started", "data": {"queue_position": 0, "predicted_start_ms": 0}}, {"event": "token", "data": {"t": "The", "i": 0}}, {"event": "token", "data": {"t": " capital", "i": 1}}, {"event": "end", "data": {"tokens_out": 2, "decode_time_ms": 31, "decode_ms": 31, "finish_reason": "length"}}]})
}

pub fn artifact_request() -> Value {
    json!({"kind": "plan", "content": {"goal": "summarise the report", "steps": ["read", "outline", "write"]}, "tags": ["project:alpha", "draft"], "session_id": "s-1"})
}
pub fn artifact_meta() -> Value {
    json!({"id": "sha256:4f1f0c1a9a63d9e4a1f0c7d2c1b4e0a3f0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5", "kind": "plan", "tags": ["draft", "project:alpha"], "parents": [], "session_id": "s-1", "created_at_ms": 1795000000000_u64, "bytes": 67})
}
pub fn artifact() -> Value {
    let mut a = artifact_meta();
    a["content"] = artifact_request()["content"].clone();
    a
}
pub fn artifact_list() -> Value {
    json!({"artifacts": [artifact_meta(), {"id": "t-1", "kind": "task_record", "tags": [], "parents": [], "session_id": "s-1", "task_id": "t-1", "created_at_ms": 1794999990000_u64, "bytes": 912}], "next_cursor": "1794999990000:t-1"})
}

// OpenAI-shaped errors (the OpenAI, Kolosal and seed-001 chat adapters).
pub fn openai_invalid() -> Value {
    json!({"error": {"message": "only n = 1 is supported", "type": "invalid_request_error", "param": "n", "code": "INVALID_PARAMS"}})
}
pub fn openai_not_found() -> Value {
    json!({"error": {"message": "no pool serves model \"gpt-4o\"", "type": "not_found_error", "param": "model", "code": "NOT_FOUND"}})
}
pub fn openai_rate_limited() -> Value {
    json!({"error": {"message": "queue full (64 tasks waiting)", "type": "rate_limit_error", "param": null, "code": "ADMISSION_REJECT"}})
}
pub fn openai_deadline_unmet() -> Value {
    json!({"error": {"message": "the client's timeout of 300 ms (sdk timeout) cannot be met even with no wait: predicted 1450 ms to answer (1650 ms short)", "type": "invalid_request_error", "param": null, "code": "DEADLINE_UNMET"}})
}
pub fn openai_queue_timeout() -> Value {
    json!({"error": {"message": "no slot within the 14420 ms this task could wait to answer in time", "type": "server_error", "param": null, "code": "QUEUE_TIMEOUT"}})
}
pub fn openai_unready() -> Value {
    json!({"error": {"message": "no pool serving \"SmolLM2-135M-Instruct.Q4_1\" is ready", "type": "server_error", "param": null, "code": "POOL_UNREADY"}})
}
pub fn openai_conflict() -> Value {
    json!({"error": {"message": "engine \"smol\" already exists", "type": "invalid_request_error", "param": "engine_id", "code": "CONFLICT"}})
}
pub fn openai_engine_not_found() -> Value {
    json!({"error": {"message": "engine \"llama-7b\" not found", "type": "not_found_error", "param": null, "code": "NOT_FOUND"}})
}
pub fn openai_bad_model_file() -> Value {
    json!({"error": {"message": "model_path \"/models/missing.gguf\": No such file or directory (os error 2)", "type": "invalid_request_error", "param": "model_path", "code": "INVALID_PARAMS"}})
}
