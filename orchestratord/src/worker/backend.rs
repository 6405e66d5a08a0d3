//! What a worker forwards requests to: its own pools (the same server, in process, with no
//! socket: the request goes through the router as it would over HTTP) or any OpenAI-compatible
//! server by URL. Either way a request is an HTTP request and its answer a status plus a body
//! stream; dropping the stream aborts the backend's work.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use futures::{Stream, TryStreamExt};
use pool_manager::CachedPrefixes;
use tower::ServiceExt;

use crate::app_state::SharedState;

pub type BodyStream = Pin<Box<dyn Stream<Item = Result<Bytes, String>> + Send>>;

pub struct BackendResponse {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: BodyStream,
}

/// Headers a worker passes to its backend from the server's `request` (nothing else).
const PASSED_HEADERS: [&str; 3] = ["content-type", "accept", crate::correlation::HEADER];

pub enum Backend {
    /// This binary's own pools, served by an in-process router.
    Local {
        state: SharedState,
        router: axum::Router,
    },
    /// An OpenAI-compatible server (llama.cpp's server, vLLM, Ollama, another orchestratord).
    Http {
        client: reqwest::Client,
        base: String,
        /// Models to announce; empty: ask the backend's `/v1/models`.
        models: Vec<String>,
    },
}

impl Backend {
    /// The models to register: the Ready pools' names, or the backend's list.
    pub async fn models(&self) -> Vec<String> {
        match self {
            Self::Local { state, .. } => {
                let mut v: Vec<String> = state
                    .pools
                    .all()
                    .iter()
                    .filter(|p| p.accepts_work())
                    .map(|p| p.spec().model_alias.clone())
                    .collect();
                v.sort();
                v.dedup();
                v
            }
            Self::Http {
                models,
                client,
                base,
            } => {
                if !models.is_empty() {
                    return models.clone();
                }
                let url = format!("{base}/v1/models");
                let listed = async {
                    let v: serde_json::Value =
                        client.get(&url).send().await.ok()?.json().await.ok()?;
                    Some(
                        v["data"]
                            .as_array()?
                            .iter()
                            .filter_map(|m| m["id"].as_str().map(str::to_string))
                            .collect::<Vec<_>>(),
                    )
                };
                listed.await.unwrap_or_default()
            }
        }
    }

    /// Requests the backend can run at once, when the operator does not say.
    pub fn default_max_concurrent(&self) -> u32 {
        match self {
            Self::Local { state, .. } => state
                .pools
                .all()
                .iter()
                .map(|p| p.spec().slots as u32)
                .sum::<u32>()
                .max(1),
            Self::Http { .. } => 4,
        }
    }

    /// What the backend's engines hold, per model (the union of the pools serving it), when
    /// they say: its own pools do; a URL backend's cache is out of sight (`None`).
    pub fn held_by_model(&self) -> Option<Vec<(String, Arc<CachedPrefixes>)>> {
        let Self::Local { state, .. } = self else {
            return None;
        };
        let mut by_model: BTreeMap<String, Vec<Arc<CachedPrefixes>>> = BTreeMap::new();
        for pool in state.pools.all() {
            if !pool.accepts_work() {
                continue;
            }
            if let Some(held) = pool.engine().and_then(|e| e.cached_prefixes()) {
                by_model
                    .entry(pool.spec().model_alias.clone())
                    .or_default()
                    .push(held);
            }
        }
        Some(
            by_model
                .into_iter()
                .map(|(model, mut sets)| {
                    let held = match sets.len() {
                        1 => sets.remove(0),
                        _ => Arc::new(CachedPrefixes::from_blocks(
                            sets.iter().flat_map(|s| s.hashes()),
                        )),
                    };
                    (model, held)
                })
                .collect(),
        )
    }

    /// Sends one request to the backend.
    pub async fn send(
        &self,
        path: &str,
        body: String,
        headers: &BTreeMap<String, String>,
    ) -> Result<BackendResponse, String> {
        let pass = || {
            headers
                .iter()
                .filter(|(k, _)| PASSED_HEADERS.contains(&k.to_ascii_lowercase().as_str()))
        };
        match self {
            Self::Local { router, .. } => {
                // an in-process caller: the orchestrator's requests came through the worker
                // secret, not an API key (the auth middleware takes this principal as is)
                let mut req = axum::http::Request::post(path).extension(
                    crate::auth::Principal::in_process(crate::auth::keys::REMOTE_TENANT),
                );
                for (k, v) in pass() {
                    req = req.header(k.as_str(), v.as_str());
                }
                if !headers
                    .keys()
                    .any(|k| k.eq_ignore_ascii_case("content-type"))
                {
                    req = req.header("content-type", "application/json");
                }
                let req = req.body(Body::from(body)).map_err(|e| e.to_string())?;
                let resp = router
                    .clone()
                    .oneshot(req)
                    .await
                    .map_err(|e| e.to_string())?;
                let status = resp.status().as_u16();
                let content_type = content_type(resp.headers());
                let stream = resp
                    .into_body()
                    .into_data_stream()
                    .map_err(|e| e.to_string());
                Ok(BackendResponse {
                    status,
                    content_type,
                    body: Box::pin(stream),
                })
            }
            Self::Http { client, base, .. } => {
                let mut req = client.post(format!("{base}{path}")).body(body);
                for (k, v) in pass() {
                    req = req.header(k.as_str(), v.as_str());
                }
                let resp = req.send().await.map_err(|e| e.to_string())?;
                let status = resp.status().as_u16();
                let content_type = content_type(resp.headers());
                Ok(BackendResponse {
                    status,
                    content_type,
                    body: Box::pin(resp.bytes_stream().map_err(|e| e.to_string())),
                })
            }
        }
    }
}

fn content_type(h: &axum::http::HeaderMap) -> Option<String> {
    h.get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Cuts a byte stream into text at UTF-8 character boundaries (a chunk may end mid-character).
#[derive(Default)]
pub struct Utf8Chunks {
    pending: Vec<u8>,
}

impl Utf8Chunks {
    /// The complete characters so far; an incomplete tail waits for the next bytes.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            // invalid bytes are not text: replace them rather than stall
            Err(_) => {
                let s = String::from_utf8_lossy(&self.pending).into_owned();
                self.pending.clear();
                return s;
            }
        };
        let rest = self.pending.split_off(valid);
        String::from_utf8(std::mem::replace(&mut self.pending, rest)).unwrap_or_default()
    }

    /// Whatever is left at the end of the stream.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// WRK-RELAY-1: a character split across chunks is sent once, whole.
    #[test]
    fn characters_split_across_chunks() {
        let text = "Paris é 東京";
        let bytes = text.as_bytes();
        for cut in 1..bytes.len() {
            let mut u = Utf8Chunks::default();
            let mut out = u.push(&bytes[..cut]);
            out.push_str(&u.push(&bytes[cut..]));
            out.push_str(&u.finish());
            assert_eq!(out, text, "cut at {cut}");
        }
    }
}
