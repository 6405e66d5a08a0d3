//! The soak's clients, one function per protocol, and the control loop. Each client runs one
//! task the way a real client of that protocol would, sometimes leaving early, and checks what
//! it got.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::checks::{tokens_now, verify_record};
use super::{Failure, Rng, SoakSpec, Tally};
use crate::sse_reader::{SseFrame, SseReader};

/// Longest a client waits for any one answer or stream.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

const PROMPTS: [&str; 6] = [
    "Count from one to twenty:",
    "Write a haiku about the sea.",
    "What is the capital of France?",
    "List three colours.",
    "Once upon a time",
    "Explain what a queue is in one sentence.",
];

/// Runs one task through a protocol picked at random.
pub(crate) async fn one_task(
    client: &reqwest::Client,
    spec: &SoakSpec,
    tally: &Tally,
    rng: &mut Rng,
) {
    let pick = rng.below(100);
    let r = match pick {
        0..=34 => task_api(client, spec, tally, rng).await,
        35..=54 => openai_chat(client, spec, tally, rng, true).await,
        55..=64 => openai_chat(client, spec, tally, rng, false).await,
        65..=74 => completions(client, spec, tally, rng).await,
        75..=87 => seed_chat(client, spec, tally, rng).await,
        _ => match spec.hyperswarm {
            Some(addr) => hyperswarm(addr, spec, tally, rng).await,
            None => task_api(client, spec, tally, rng).await,
        },
    };
    if let Err(e) = r {
        tally.fail(Failure::Protocol, e);
    }
}

fn max_tokens(spec: &SoakSpec, rng: &mut Rng) -> u32 {
    1 + rng.below(spec.max_tokens as u64) as u32
}

fn prompt(rng: &mut Rng) -> &'static str {
    PROMPTS[rng.below(PROMPTS.len() as u64) as usize]
}

/// Longest pause a refused client takes before its next request.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// The pause after a refusal that advised none (the Hyperswarm protocol has no retry hint).
const DEFAULT_BACKOFF: Duration = Duration::from_millis(500);

/// The server's advice: `retry-after-ms`, else `Retry-After` in whole seconds.
fn advised_wait(h: &reqwest::header::HeaderMap) -> Option<Duration> {
    let num = |name: &str| h.get(name)?.to_str().ok()?.trim().parse::<u64>().ok();
    num("retry-after-ms")
        .map(Duration::from_millis)
        .or_else(|| num("retry-after").map(Duration::from_secs))
}

async fn back_off(advised: Option<Duration>) {
    tokio::time::sleep(advised.unwrap_or(DEFAULT_BACKOFF).min(MAX_BACKOFF)).await;
}

/// Classifies a refused request: retriable refusals (429, 503, a 504 `QUEUE_TIMEOUT`: the task
/// could not start in time) are outcomes, other 5xx are server errors, other 4xx are the
/// soak's own mistakes (protocol failures).
///
/// A retriable refusal is followed as a real client follows it: it waits what the server
/// advised (`retry-after-ms`, else `Retry-After`; at most [`MAX_BACKOFF`]) before its next
/// request, so a refused client does not spin.
async fn refused(tally: &Tally, what: &str, r: reqwest::Response) -> Result<(), String> {
    let status = r.status().as_u16();
    let advised = advised_wait(r.headers());
    let body: Value = r.json().await.unwrap_or_default();
    let code = body["code"]
        .as_str()
        .or_else(|| body["error"]["code"].as_str())
        .unwrap_or("")
        .to_string();
    match status {
        429 | 503 => {
            tally.outcome(format!("refused {status} {code}"));
            back_off(advised).await;
            Ok(())
        }
        504 if code == "QUEUE_TIMEOUT" => {
            tally.outcome(format!("refused {status} {code}"));
            back_off(advised).await;
            Ok(())
        }
        500..=599 => {
            tally.fail(Failure::ServerError, format!("{what}: {status} {body}"));
            Ok(())
        }
        _ => Err(format!("{what}: {status} {body}")),
    }
}

/// Longest SSE frame a client accepts.
const MAX_FRAME: usize = 1 << 20;

/// What reading a stream gave.
struct Read {
    frames: Vec<SseFrame>,
    /// The stream ended by itself (not because the reader stopped).
    ended: bool,
}

/// Reads SSE frames from `r` until `stop` says so, the stream ends, or the timeout.
async fn read_sse(
    r: reqwest::Response,
    mut stop: impl FnMut(&[SseFrame]) -> bool,
) -> Result<Read, String> {
    let mut body = r.bytes_stream();
    let mut reader = SseReader::new(MAX_FRAME);
    let mut got = Vec::new();
    let deadline = tokio::time::sleep(CLIENT_TIMEOUT);
    tokio::pin!(deadline);
    loop {
        let chunk = tokio::select! {
            c = body.next() => c,
            _ = &mut deadline => return Err("stream timed out".into()),
        };
        let Some(chunk) = chunk else {
            return Ok(Read {
                frames: got,
                ended: true,
            });
        };
        let chunk = chunk.map_err(|e| format!("stream broke: {e}"))?;
        got.extend(reader.feed(&chunk).map_err(|e| e.to_string())?);
        if stop(&got) {
            return Ok(Read {
                frames: got,
                ended: false,
            });
        }
    }
}

fn is_terminal(f: &SseFrame) -> bool {
    f.event == "end" || f.event == "error"
}

fn tokens(fs: &[SseFrame]) -> usize {
    fs.iter().filter(|f| f.event == "token").count()
}

/// The task API: submit, then read the SSE stream fully, or cancel, or leave (and come back
/// with `Last-Event-ID`, or not), or with a second reader joining late.
async fn task_api(
    client: &reqwest::Client,
    spec: &SoakSpec,
    tally: &Tally,
    rng: &mut Rng,
) -> Result<(), String> {
    tally.task("task-api");
    let base = &spec.base_url;
    let mut body = json!({
        "prompt": prompt(rng),
        "max_tokens": max_tokens(spec, rng),
        "priority": if rng.below(3) == 0 { "batch" } else { "interactive" },
    });
    if rng.below(2) == 0 {
        body["temperature"] = json!(0.8);
        body["seed"] = json!(rng.below(1000));
    }
    if rng.below(5) == 0 {
        body["session_id"] = json!(format!("soak-{}", rng.below(8)));
    }
    let r = client
        .post(format!("{base}/v1/tasks"))
        .json(&body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if r.status().as_u16() != 202 {
        return refused(tally, "submit", r).await;
    }
    let adm: Value = r.json().await.map_err(|e| e.to_string())?;
    let id = adm["task_id"].as_str().ok_or("no task_id")?.to_string();
    let open = |last: Option<u64>| {
        let mut req = client.get(format!("{base}/v1/tasks/{id}/stream"));
        if let Some(l) = last {
            req = req.header("last-event-id", l.to_string());
        }
        req.send()
    };
    let plan = rng.below(10);
    let k = rng.below(4) as usize;
    let r = open(None).await.map_err(|e| e.to_string())?;
    let mut cancel_tokens = None;
    let events: Vec<SseFrame> = match plan {
        // cancel after k tokens, then read to the end
        0 | 1 => {
            tally.with(|r| r.cancels += 1);
            let mut body = r.bytes_stream();
            let mut reader = SseReader::new(MAX_FRAME);
            let mut got = Vec::new();
            let mut cancelled = false;
            while let Some(chunk) = tokio::time::timeout(CLIENT_TIMEOUT, body.next())
                .await
                .map_err(|_| "stream timed out")?
            {
                let chunk = chunk.map_err(|e| e.to_string())?;
                got.extend(reader.feed(&chunk).map_err(|e| e.to_string())?);
                if !cancelled && (tokens(&got) >= k || got.iter().any(is_terminal)) {
                    let c = client
                        .post(format!("{base}/v1/tasks/{id}/cancel"))
                        .send()
                        .await
                        .map_err(|e| e.to_string())?;
                    if c.status().as_u16() != 204 {
                        return Err(format!("cancel answered {}", c.status()));
                    }
                    cancel_tokens = tokens_now(client, base, &id).await;
                    cancelled = true;
                }
            }
            got
        }
        // leave after k tokens and come back with Last-Event-ID
        2 | 3 => {
            tally.with(|r| r.resumes += 1);
            let first = read_sse(r, |f| tokens(f) >= k || f.iter().any(is_terminal)).await?;
            let mut all = first.frames;
            if !all.iter().any(is_terminal) {
                let last = all.last().and_then(|f| f.id);
                let again = open(last).await.map_err(|e| e.to_string())?;
                let rest = read_sse(again, |_| false).await?;
                if let (Some(l), Some(f)) = (last, rest.frames.first()) {
                    if f.id != Some(l + 1) {
                        return Err(format!("task {id}: resumed at {:?} after {l}", f.id));
                    }
                }
                all.extend(rest.frames);
            }
            all
        }
        // leave after k tokens for good: the task ends by itself or after the grace period
        4 => {
            tally.with(|r| r.disconnects += 1);
            let _ = read_sse(r, |f| tokens(f) >= k || f.iter().any(is_terminal)).await?;
            if let Some(o) = verify_record(client, base, &id, None, tally).await {
                tally.outcome(o);
            }
            return Ok(());
        }
        // a second reader joins after the first event and reads it all too
        5 => {
            tally.with(|r| r.late_subscribers += 1);
            let late = async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let r = open(None).await.map_err(|e| e.to_string())?;
                read_sse(r, |_| false).await
            };
            let (a, b) = futures::join!(read_sse(r, |_| false), late);
            let (a, b) = (a?, b?);
            if a.frames.len() != b.frames.len() {
                return Err(format!(
                    "task {id}: readers saw {} and {} events",
                    a.frames.len(),
                    b.frames.len()
                ));
            }
            a.frames
        }
        _ => read_sse(r, |_| false).await?.frames,
    };
    // ids run 0, 1, 2, … and exactly one terminal event comes last
    for (i, f) in events.iter().enumerate() {
        if f.id != Some(i as u64) {
            return Err(format!("task {id}: event {i} has id {:?}", f.id));
        }
    }
    let terminals = events.iter().filter(|f| is_terminal(f)).count();
    if terminals != 1 || !events.last().is_some_and(is_terminal) {
        tally.fail(
            Failure::Lost,
            format!("task {id}: stream had {terminals} terminal events"),
        );
    }
    if let Some(o) = verify_record(client, base, &id, cancel_tokens, tally).await {
        tally.outcome(o);
    }
    Ok(())
}

/// OpenAI chat completions, streamed (sometimes left early) or not.
async fn openai_chat(
    client: &reqwest::Client,
    spec: &SoakSpec,
    tally: &Tally,
    rng: &mut Rng,
    stream: bool,
) -> Result<(), String> {
    tally.task(if stream {
        "openai-chat-stream"
    } else {
        "openai-chat"
    });
    let base = &spec.base_url;
    let body = json!({
        "model": spec.model,
        "messages": [{"role": "user", "content": prompt(rng)}],
        "max_tokens": max_tokens(spec, rng),
        "stream": stream,
        "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null },
    });
    let r = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if r.status().as_u16() != 200 {
        return refused(tally, "chat", r).await;
    }
    if !stream {
        let v: Value = r.json().await.map_err(|e| e.to_string())?;
        let id = v["id"]
            .as_str()
            .and_then(|s| s.strip_prefix("chatcmpl-"))
            .ok_or("no id")?
            .to_string();
        if v["choices"][0]["finish_reason"].is_null() {
            return Err(format!("chat {id}: no finish_reason: {v}"));
        }
        if let Some(o) = verify_record(client, base, &id, None, tally).await {
            tally.outcome(o);
        }
        return Ok(());
    }
    let leave = rng.below(5) == 0;
    let k = rng.below(3) as usize;
    let read = read_sse(r, |f| leave && f.len() > k).await?;
    let datas: Vec<&str> = read.frames.iter().map(|f| f.data.as_str()).collect();
    let id = datas
        .iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|v| v["id"].as_str().map(str::to_string))
        .and_then(|s| s.strip_prefix("chatcmpl-").map(str::to_string));
    if leave && !read.ended {
        tally.with(|r| r.disconnects += 1);
    } else {
        if datas.last() != Some(&"[DONE]") {
            tally.fail(
                Failure::Lost,
                format!("chat stream {id:?} ended without [DONE]"),
            );
        }
        if let Some(err) = datas
            .iter()
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .find(|v| !v["error"].is_null())
        {
            tally.outcome(format!(
                "chat error {}",
                err["error"]["code"].as_str().unwrap_or("?")
            ));
        }
    }
    if let Some(id) = id {
        if let Some(o) = verify_record(client, base, &id, None, tally).await {
            tally.outcome(o);
        }
    }
    Ok(())
}

/// OpenAI completions with two prompts (two tasks), not streamed.
async fn completions(
    client: &reqwest::Client,
    spec: &SoakSpec,
    tally: &Tally,
    rng: &mut Rng,
) -> Result<(), String> {
    tally.task("openai-completions");
    let base = &spec.base_url;
    let body = json!({
        "model": spec.model,
        "prompt": [prompt(rng), prompt(rng)],
        "max_tokens": max_tokens(spec, rng),
    });
    let r = client
        .post(format!("{base}/v1/completions"))
        .json(&body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if r.status().as_u16() != 200 {
        return refused(tally, "completions", r).await;
    }
    let v: Value = r.json().await.map_err(|e| e.to_string())?;
    let choices = v["choices"].as_array().map_or(0, Vec::len);
    if choices != 2 {
        return Err(format!("completions: {choices} choices for 2 prompts: {v}"));
    }
    let id = v["id"]
        .as_str()
        .and_then(|s| s.strip_prefix("cmpl-"))
        .ok_or("no id")?
        .to_string();
    if let Some(o) = verify_record(client, base, &id, None, tally).await {
        tally.outcome(o);
    }
    Ok(())
}

/// The seed-001 chat, streamed as NDJSON.
async fn seed_chat(
    client: &reqwest::Client,
    spec: &SoakSpec,
    tally: &Tally,
    rng: &mut Rng,
) -> Result<(), String> {
    tally.task("seed-chat");
    let body = json!({
        "model": spec.model,
        "messages": [{"role": "user", "content": prompt(rng)}],
        "max_tokens": max_tokens(spec, rng),
        "stream": true,
    });
    let r = client
        .post(format!("{}/chat/completions", spec.base_url))
        .json(&body)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if r.status().as_u16() != 200 {
        return refused(tally, "seed chat", r).await;
    }
    let text = tokio::time::timeout(CLIENT_TIMEOUT, r.text())
        .await
        .map_err(|_| "seed chat timed out")?
        .map_err(|e| e.to_string())?;
    let lines: Vec<Value> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(|e| format!("seed chat line {l:?}: {e}")))
        .collect::<Result<_, _>>()?;
    let last = lines.last().ok_or("seed chat: no line")?;
    if last["done"] != true || lines.iter().filter(|l| l["done"] == true).count() != 1 {
        tally.fail(Failure::Lost, format!("seed chat: bad ending {last}"));
    } else if !last["error"].is_null() {
        tally.outcome(format!(
            "seed error {}",
            last["error"]["code"].as_str().unwrap_or("?")
        ));
    } else {
        tally.outcome(last["finish_reason"].as_str().unwrap_or("?").to_string());
    }
    Ok(())
}

/// A Hyperswarm peer over the host's TCP listener: one `chat_start`, sometimes aborted.
async fn hyperswarm(
    addr: std::net::SocketAddr,
    spec: &SoakSpec,
    tally: &Tally,
    rng: &mut Rng,
) -> Result<(), String> {
    tally.task("hyperswarm");
    let conn = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (r, mut w) = conn.into_split();
    let mut lines = BufReader::new(r).lines();
    // a peer of its own: the host takes one connection per public key
    let peer =
        json!({"type": "_peer", "payload": {"public_key": format!("{:08x}", rng.below(1 << 30))}});
    w.write_all(format!("{peer}\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let info = read_msg(&mut lines).await?;
    if info["type"] == "error" && info["payload"]["code"] == "CONNECT_FAILED" {
        // the host's client cap (`hyperswarm.max_clients`), every place running a request:
        // an honest refusal, as a 429 is
        tally.outcome("hyperswarm refused CONNECT_FAILED".to_string());
        back_off(None).await;
        return Ok(());
    }
    if info["type"] != "server_info" {
        return Err(format!("hyperswarm: first message {info}"));
    }
    let start = json!({"type": "chat_start", "request_id": "s1", "payload": {"prompt": prompt(rng), "max_tokens": max_tokens(spec, rng)}});
    w.write_all(format!("{start}\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let abort_after = (rng.below(6) == 0).then(|| rng.below(3));
    let mut chunks = 0;
    let began = Instant::now();
    loop {
        let m = read_msg(&mut lines).await?;
        match m["type"].as_str() {
            Some("chat_chunk") => {
                chunks += 1;
                if abort_after == Some(chunks - 1) {
                    tally.with(|r| r.cancels += 1);
                    w.write_all(b"{\"type\":\"abort\",\"request_id\":\"s1\",\"payload\":{}}\n")
                        .await
                        .map_err(|e| e.to_string())?;
                }
            }
            Some("chat_end") => {
                tally.outcome(format!(
                    "hyperswarm {}",
                    m["payload"]["finish_reason"].as_str().unwrap_or("?")
                ));
                return Ok(());
            }
            Some("error") => {
                let code = m["payload"]["code"].as_str().unwrap_or("?");
                // a refusal of the start (HS-PROTO-6) ends the request: no chat_end follows
                if chunks == 0 && ["MODEL_BUSY", "OLLAMA_MODEL_NOT_AVAILABLE"].contains(&code) {
                    tally.outcome(format!("hyperswarm refused {code}"));
                    back_off(None).await;
                    return Ok(());
                }
                tally.outcome(format!("hyperswarm error {code}"));
            }
            _ => {}
        }
        if began.elapsed() > CLIENT_TIMEOUT {
            tally.fail(Failure::Lost, "hyperswarm: no chat_end".into());
            return Ok(());
        }
    }
}

async fn read_msg(
    lines: &mut tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
) -> Result<Value, String> {
    match tokio::time::timeout(CLIENT_TIMEOUT, lines.next_line()).await {
        Ok(Ok(Some(l))) => serde_json::from_str::<Value>(&l).map_err(|e| e.to_string()),
        Ok(Ok(None)) => Err("hyperswarm: connection closed".to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("hyperswarm: timed out".to_string()),
    }
}

/// Drains and resumes, and reloads, pools every few seconds until `until`; leaves every pool
/// serving.
pub(crate) async fn control_loop(
    client: &reqwest::Client,
    spec: &SoakSpec,
    tally: &Tally,
    until: Instant,
) {
    let base = &spec.base_url;
    let mut rng = Rng::new(spec.seed ^ 0xC0DE);
    let post = |path: String, body: Value| client.post(format!("{base}{path}")).json(&body).send();
    let mut turn = 0u64;
    while Instant::now() + Duration::from_secs(3) < until {
        tokio::time::sleep(Duration::from_millis(1500 + rng.below(2000))).await;
        // drains and reloads take turns
        turn += 1;
        let drain = turn % 2 == 1 || spec.reload_pools.is_empty();
        if drain && !spec.drain_pools.is_empty() {
            let id = &spec.drain_pools[rng.below(spec.drain_pools.len() as u64) as usize];
            match post(
                format!("/v1/pools/{id}/drain"),
                json!({"deadline_ms": 1000 + rng.below(1500)}),
            )
            .await
            {
                Ok(r) if r.status().as_u16() == 202 => tally.with(|r| r.drains += 1),
                _ => tally.with(|r| r.control_refusals += 1),
            }
            tokio::time::sleep(Duration::from_millis(500 + rng.below(2000))).await;
            match post(format!("/v1/pools/{id}/resume"), json!({})).await {
                Ok(r) if r.status().is_success() => tally.with(|r| r.resumes_of_pools += 1),
                _ => tally.with(|r| r.control_refusals += 1),
            }
        } else if !spec.reload_pools.is_empty() {
            let (id, model) =
                &spec.reload_pools[rng.below(spec.reload_pools.len() as u64) as usize];
            match post(
                format!("/v1/pools/{id}/reload"),
                json!({"new_model_ref": model}),
            )
            .await
            {
                Ok(r) if r.status().is_success() => tally.with(|r| r.reloads += 1),
                _ => tally.with(|r| r.control_refusals += 1),
            }
        }
    }
}
