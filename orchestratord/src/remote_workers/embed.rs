//! Embeddings on a remote worker (issue 51): a job goes to the worker's backend as OpenAI's
//! `/v1/embeddings` (texts, or token ids; vectors asked in base64, the compact form every
//! OpenAI-compatible server gives) or, for query-document pairs, as the rerank request
//! llama-server, vLLM and orchestratord take (`/v1/rerank`), not streamed; the answer comes
//! back whole (within the worker socket's frame limit) and is read into the job's vectors.

use std::sync::Arc;

use base64::Engine as _;
use contracts::worker::{CancelReason, ServerToWorker};
use pool_manager::{EmbedInput, EmbedJob, Embeddings, Pooling, PortError};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use super::link::{RequestEvent, WorkerLink};
use super::openai_wire::{error_message, refused_field};

/// The endpoint and body of an embedding job for an OpenAI-compatible backend.
pub fn request(model: &str, job: &EmbedJob) -> Result<(&'static str, Value), PortError> {
    let pairs: Vec<(&str, &str)> = job
        .inputs
        .iter()
        .filter_map(|i| match i {
            EmbedInput::Pair { query, document } => Some((query.as_str(), document.as_str())),
            _ => None,
        })
        .collect();
    if !pairs.is_empty() {
        let query = pairs[0].0;
        if pairs.len() != job.inputs.len() || pairs.iter().any(|(q, _)| *q != query) {
            return Err(PortError::InvalidInput(
                "a remote worker's backend ranks documents against one query a request".into(),
            ));
        }
        let documents: Vec<&str> = pairs.iter().map(|(_, d)| *d).collect();
        return Ok((
            "/v1/rerank",
            json!({"model": model, "query": query, "documents": documents}),
        ));
    }
    if !matches!(
        job.pooling,
        None | Some(Pooling::Mean) | Some(Pooling::Cls) | Some(Pooling::Last)
    ) {
        return Err(PortError::InvalidInput(
            "pooling: a remote worker's backend gives one vector per input (its own pooling)"
                .into(),
        ));
    }
    let input: Vec<Value> = job
        .inputs
        .iter()
        .map(|i| match i {
            EmbedInput::Text(t) => json!(t),
            EmbedInput::Tokens(ids) => json!(ids),
            EmbedInput::Pair { .. } => Value::Null,
        })
        .collect();
    Ok((
        "/v1/embeddings",
        json!({"model": model, "input": input, "encoding_format": "base64"}),
    ))
}

/// A vector of the backend's answer: base64 little-endian f32, or floats.
fn vector(v: &Value) -> Option<Vec<f32>> {
    match v {
        Value::String(b64) => {
            let bytes = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
            if bytes.len() % 4 != 0 {
                return None;
            }
            Some(
                bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            )
        }
        Value::Array(xs) => xs.iter().map(|x| x.as_f64().map(|f| f as f32)).collect(),
        _ => None,
    }
}

/// The job's vectors from the backend's answer to `path`: `n` inputs, each unit length when
/// `unit` (the backend's vectors are; raw ones are not to be had from it).
pub fn answer(path: &str, body: &str, n: usize, unit: bool) -> Result<Embeddings, String> {
    let v: Value = serde_json::from_str(body).map_err(|e| format!("not JSON: {e}"))?;
    let mut out: Vec<Option<Vec<Vec<f32>>>> = vec![None; n];
    if path == "/v1/rerank" {
        for r in v["results"].as_array().ok_or("no results")? {
            let i = r["index"].as_u64().ok_or("a result without its index")? as usize;
            let s = r["relevance_score"]
                .as_f64()
                .ok_or("a result without its score")?;
            *out.get_mut(i).ok_or("a result's index is out of range")? = Some(vec![vec![s as f32]]);
        }
    } else {
        for d in v["data"].as_array().ok_or("no data")? {
            let i = d["index"]
                .as_u64()
                .ok_or("an embedding without its index")? as usize;
            let mut x = vector(&d["embedding"]).ok_or("an embedding that is not a vector")?;
            if unit {
                let norm = x.iter().map(|f| f64::from(*f).powi(2)).sum::<f64>().sqrt();
                if norm > 0.0 {
                    x.iter_mut()
                        .for_each(|f| *f = (f64::from(*f) / norm) as f32);
                }
            }
            *out.get_mut(i)
                .ok_or("an embedding's index is out of range")? = Some(vec![x]);
        }
    }
    out.into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| "the answer misses an input".into())
}

/// Waits for the backend's answer to request `id` and sends the job's vectors; tells the
/// worker to stop when the job is cancelled first. The worker's slot goes with the relay.
pub async fn relay(
    link: Arc<WorkerLink>,
    id: String,
    path: &'static str,
    job: EmbedJob,
    mut events: mpsc::Receiver<RequestEvent>,
    reply: oneshot::Sender<Result<Embeddings, PortError>>,
) {
    let EmbedJob {
        permit: _slot,
        inputs,
        normalize,
        cancel,
        ..
    } = job;
    let mut body = String::new();
    let result = loop {
        let ev = tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                link.close_request(&id);
                link.send(ServerToWorker::Cancel { request_id: id.clone(), reason: CancelReason::ClientDisconnect });
                return;
            }
            ev = events.recv() => ev,
        };
        match ev {
            None => {
                break Err(PortError::Dead(
                    "the worker was lost while embedding".into(),
                ))
            }
            Some(RequestEvent::Chunk(c)) => body.push_str(&c),
            Some(RequestEvent::Complete {
                status_code,
                body: whole,
                ..
            }) => {
                link.close_request(&id);
                let text = whole.unwrap_or(std::mem::take(&mut body));
                if status_code != 200 {
                    let msg = format!(
                        "the worker's backend answered {status_code}: {}",
                        error_message(&text)
                    );
                    let refused =
                        (400..500).contains(&status_code) && ![408, 429].contains(&status_code);
                    break Err(match (refused, refused_field(&text)) {
                        (true, Some(field)) => PortError::Refused {
                            field,
                            message: msg,
                        },
                        (true, None) => PortError::InvalidInput(msg),
                        (false, _) => PortError::Load(msg),
                    });
                }
                break answer(path, &text, inputs.len(), normalize && path != "/v1/rerank")
                    .map_err(|why| {
                        PortError::Load(format!("the worker's backend answered: {why}"))
                    });
            }
            Some(RequestEvent::Error { code, message }) => {
                link.close_request(&id);
                break Err(PortError::Load(format!("worker error {code}: {message}")));
            }
        }
    };
    let _ = reply.send(result);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// WRK-EMB-1: a backend's OpenAI answer (base64 or floats, in any order) and its rerank
    /// answer (best first) become the job's vectors by input.
    #[test]
    fn backend_answers_become_the_jobs_vectors() {
        let b64 = base64::engine::general_purpose::STANDARD.encode(
            [3.0f32, 4.0]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect::<Vec<u8>>(),
        );
        let body = json!({"data": [{"index": 1, "embedding": [1.0, 0.0]},
            {"index": 0, "embedding": b64}]})
        .to_string();
        let v = answer("/v1/embeddings", &body, 2, true).unwrap();
        assert_eq!(v[0][0], vec![0.6, 0.8]);
        assert_eq!(v[1][0], vec![1.0, 0.0]);
        let body = json!({"results": [{"index": 1, "relevance_score": 0.9},
            {"index": 0, "relevance_score": 0.1}]})
        .to_string();
        let v = answer("/v1/rerank", &body, 2, false).unwrap();
        assert_eq!((v[0][0][0], v[1][0][0]), (0.1, 0.9));
        assert!(answer("/v1/embeddings", r#"{"data": []}"#, 1, true).is_err());
    }
}
