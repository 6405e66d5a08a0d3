//! A bounded streaming load generator for any OpenAI-compatible `/v1/chat/completions`
//! server: ours, llama.cpp's, vLLM's. One level sends `requests` streamed chats with at most
//! `concurrency` in flight (a new one starts when one ends) and reports TTFT, inter-token and
//! end-to-end percentiles, aggregate output tokens/s and errors by kind. Request `i` always
//! carries the same prompt, so two servers see the same sequence. Used by `orchd-load` and the
//! benches.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;

/// One level of load.
#[derive(Debug, Clone)]
pub struct LoadSpec {
    pub base_url: String,
    pub model: String,
    pub concurrency: usize,
    pub requests: usize,
    pub max_tokens: usize,
    /// Per-request limit.
    pub timeout: Duration,
}

/// What one level measured (milliseconds; tokens from `usage` when the server sends it,
/// else the content chunks).
#[derive(Debug, Clone, Serialize)]
pub struct LevelReport {
    pub concurrency: usize,
    pub requests: usize,
    pub completed: usize,
    pub errors: BTreeMap<String, usize>,
    pub output_tokens: usize,
    pub wall_s: f64,
    pub tokens_per_s: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p95_ms: f64,
    pub itl_p50_ms: f64,
    pub itl_p95_ms: f64,
    pub e2e_p50_ms: f64,
    pub e2e_p95_ms: f64,
}

/// One streamed chat as the client saw it.
struct Sample {
    tokens: usize,
    ttft: Option<f64>,
    gaps: Vec<f64>,
    e2e: f64,
    error: Option<String>,
}

/// The `q` quantile (0..=1) of `v`, nearest rank; 0 when empty.
pub fn percentile(v: &mut [f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * q).round() as usize;
    v[i.min(v.len() - 1)]
}

/// The prompt of request `i`.
pub fn prompt(i: usize) -> String {
    format!("Write a short story about robot number {i}.")
}

async fn one(client: &reqwest::Client, spec: &LoadSpec, i: usize) -> Sample {
    let body = serde_json::json!({
        "model": spec.model, "stream": true, "max_tokens": spec.max_tokens, "temperature": 0,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": prompt(i)}]
    });
    let t0 = Instant::now();
    let mut s = Sample {
        tokens: 0,
        ttft: None,
        gaps: Vec::new(),
        e2e: 0.0,
        error: None,
    };
    let sent = client
        .post(format!("{}/v1/chat/completions", spec.base_url))
        .timeout(spec.timeout)
        .json(&body)
        .send()
        .await;
    let r = match sent {
        Ok(r) if r.status().is_success() => r,
        Ok(r) => {
            s.error = Some(format!("http {}", r.status().as_u16()));
            return s;
        }
        Err(e) => {
            s.error = Some(if e.is_timeout() { "timeout" } else { "connect" }.into());
            return s;
        }
    };
    let mut stream = r.bytes_stream();
    let (mut buf, mut last, mut chunks, mut usage) = (String::new(), None::<Instant>, 0, None);
    while let Some(piece) = stream.next().await {
        let Ok(bytes) = piece else {
            s.error = Some("broken stream".into());
            break;
        };
        buf.push_str(&String::from_utf8_lossy(&bytes));
        while let Some(nl) = buf.find('\n') {
            let line: String = buf.drain(..=nl).collect();
            let Some(data) = line.trim().strip_prefix("data:") else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<serde_json::Value>(data.trim()) else {
                continue;
            };
            if let Some(n) = v
                .pointer("/usage/completion_tokens")
                .and_then(|n| n.as_u64())
            {
                usage = Some(n as usize);
            }
            let content = v
                .pointer("/choices/0/delta/content")
                .and_then(|c| c.as_str());
            if content.is_some_and(|c| !c.is_empty()) {
                let now = Instant::now();
                match last {
                    None => s.ttft = Some((now - t0).as_secs_f64() * 1000.0),
                    Some(prev) => s.gaps.push((now - prev).as_secs_f64() * 1000.0),
                }
                last = Some(now);
                chunks += 1;
            }
        }
    }
    s.tokens = usage.unwrap_or(chunks);
    s.e2e = t0.elapsed().as_secs_f64() * 1000.0;
    if s.error.is_none() && chunks == 0 {
        s.error = Some("no content".into());
    }
    s
}

/// Runs one level and reports it.
pub async fn run_level(client: &reqwest::Client, spec: &LoadSpec) -> LevelReport {
    let t0 = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut lanes = Vec::new();
    for _ in 0..spec.concurrency.max(1) {
        let (client, spec, next) = (client.clone(), spec.clone(), next.clone());
        lanes.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= spec.requests {
                    return out;
                }
                out.push(one(&client, &spec, i).await);
            }
        }));
    }
    let mut samples = Vec::new();
    for lane in lanes {
        if let Ok(s) = lane.await {
            samples.extend(s);
        }
    }
    let wall_s = t0.elapsed().as_secs_f64();
    let mut errors = BTreeMap::new();
    for e in samples.iter().filter_map(|s| s.error.clone()) {
        *errors.entry(e).or_insert(0) += 1;
    }
    let ok: Vec<&Sample> = samples.iter().filter(|s| s.error.is_none()).collect();
    let output_tokens: usize = samples.iter().map(|s| s.tokens).sum();
    let mut ttft: Vec<f64> = ok.iter().filter_map(|s| s.ttft).collect();
    let mut itl: Vec<f64> = ok.iter().flat_map(|s| s.gaps.iter().copied()).collect();
    let mut e2e: Vec<f64> = ok.iter().map(|s| s.e2e).collect();
    LevelReport {
        concurrency: spec.concurrency,
        requests: spec.requests,
        completed: ok.len(),
        errors,
        output_tokens,
        wall_s,
        tokens_per_s: output_tokens as f64 / wall_s.max(1e-9),
        ttft_p50_ms: percentile(&mut ttft, 0.5),
        ttft_p95_ms: percentile(&mut ttft, 0.95),
        itl_p50_ms: percentile(&mut itl, 0.5),
        itl_p95_ms: percentile(&mut itl, 0.95),
        e2e_p50_ms: percentile(&mut e2e, 0.5),
        e2e_p95_ms: percentile(&mut e2e, 0.95),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut v = vec![5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(percentile(&mut v, 0.5), 3.0);
        assert_eq!(percentile(&mut v, 0.95), 5.0);
        assert_eq!(percentile(&mut v, 0.0), 1.0);
        assert_eq!(percentile(&mut [], 0.5), 0.0);
    }
}
