//! Test support: a scripted engine whose timing and failures the test controls, a server on a
//! real socket, and an SSE client that parses the raw frames.
#![allow(dead_code)]

pub mod browser;
pub mod fake_worker;
pub mod nats;
pub mod procs;
pub mod task_client;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use orchestratord::app_state::SharedState;
use orchestratord::config::{Config, PoolConfig};
use pool_manager::{
    Engine, EngineDescriptor, EngineFactory, EngineJob, Finish, FinishReason, OnLoss, PoolSpec,
    PortError, PromptInput, SeqEvent, SlotPermit, Slots,
};
use tokio::sync::mpsc;

/// An engine that emits `tok{i} ` every `delay`; prompt words count as tokens. Markers in the
/// prompt script failures: `[hang]` emits nothing, `[fail]` fails after 2 tokens, `[die]`
/// drops the channel after 2 tokens without a terminal event, `[linger]` keeps its slot for
/// [`LINGER`] after a cancel (an engine slow to let go of a sequence), `[slowtok]` takes
/// [`SLOW_TOKENIZE`] to tokenize, `[slow]` takes [`SLOW_FACTOR`] times the delay per token (a
/// machine slower under load than when the pool measured its pace at load).
/// Prompts marked `[counted]` the scripted engines of this test binary tokenized.
pub static TOKENIZE_CALLS: AtomicUsize = AtomicUsize::new(0);

/// How long tokenizing a `[slowtok]` prompt takes (a huge prompt's CPU time).
pub const SLOW_TOKENIZE: Duration = Duration::from_millis(400);

/// How many times the delay a `[slow]` sequence takes per token.
pub const SLOW_FACTOR: u32 = 4;

/// How long a `[linger]` sequence keeps its slot after its cancel.
pub const LINGER: Duration = Duration::from_millis(1500);

/// How many times the delay the load-time sequences (the self-test and the full-pool
/// measurement) of an engine whose model ref says `busyload` take per token: a machine that
/// was busy while the pool loaded (issue 33: 1,085 ms a token measured, 14 ms later).
pub const BUSY_LOAD_FACTOR: u32 = 20;

pub struct ScriptedEngine {
    pub delay: Duration,
    pub slots: usize,
    pub ctx: usize,
    pub model_ref: String,
    pub gate: Slots,
    pub alive: Arc<AtomicBool>,
    /// Sequences still to run `BUSY_LOAD_FACTOR` times slower (`busyload`: the load-time ones).
    pub slow_at_load: Arc<AtomicUsize>,
    /// `crowded`: each token takes the delay once per sequence running (a CPU engine whose
    /// steps slow as its slots fill).
    pub crowded: bool,
}

fn words(p: &PromptInput) -> (usize, String) {
    match p {
        PromptInput::Text(t) => (t.split_whitespace().count(), t.clone()),
        PromptInput::Chat(m) => {
            let all: Vec<String> = m.iter().map(|t| t.content.clone()).collect();
            let text = all.join(" ");
            (text.split_whitespace().count() + 4 * m.len(), text)
        }
        // an id a word, text pieces by their words
        PromptInput::Tokens(parts) => {
            let text: Vec<String> = parts
                .iter()
                .map(|p| match p {
                    pool_manager::PromptPart::Token(id) => id.to_string(),
                    pool_manager::PromptPart::Text(t) => t.clone(),
                })
                .collect();
            let text = text.join(" ");
            (text.split_whitespace().count(), text)
        }
    }
}

impl Engine for ScriptedEngine {
    fn descriptor(&self) -> EngineDescriptor {
        EngineDescriptor {
            engine: "scripted".into(),
            engine_version: "test".into(),
            model_ref: self.model_ref.clone(),
            model_name: "scripted-model".into(),
            ctx_max: self.ctx,
            slots: self.slots,
            weights_bytes: 1 << 20,
            kv_cache_bytes: 1 << 16,
            layers: 2,
            layers_on_accelerator: 0,
            on_loss: OnLoss::Restart,
            facts: None,
            generates: true,
            embedding: None,
        }
    }

    fn tokenize(
        &self,
        prompt: &PromptInput,
        _continuation: &str,
    ) -> Result<Option<Vec<u32>>, PortError> {
        let (n, text) = words(prompt);
        if text.contains("[counted]") {
            TOKENIZE_CALLS.fetch_add(1, Ordering::SeqCst);
        }
        if text.contains("[slowtok]") {
            // blocks its thread, as tokenizing a megabyte does
            std::thread::sleep(SLOW_TOKENIZE);
        }
        // markers ride along as token ids the engine recognises
        let mut ids: Vec<u32> = (0..n as u32).map(|i| i + 10).collect();
        if text.contains("[hang]") {
            ids.push(1);
        }
        if text.contains("[fail]") {
            ids.push(2);
        }
        if text.contains("[die]") {
            ids.push(3);
        }
        if text.contains("[linger]") {
            ids.push(4);
        }
        if text.contains("[slow]") {
            ids.push(5);
        }
        Ok(Some(ids))
    }

    fn try_acquire(&self) -> Option<SlotPermit> {
        self.gate.try_acquire()
    }

    fn slots_in_use(&self) -> usize {
        self.gate.in_use()
    }

    fn start(&self, job: EngineJob) -> Result<mpsc::Receiver<SeqEvent>, PortError> {
        if !self.gate.owns(&job.permit) {
            return Err(PortError::InvalidInput("permit of another engine".into()));
        }
        let (tx, rx) = mpsc::channel(pool_manager::EVENT_CHANNEL_CAPACITY);
        let alive = self.alive.clone();
        let prompt_tokens = match job.prompt_tokens.clone() {
            Some(t) => t,
            None => self
                .tokenize(&job.prompt, &job.continuation)?
                .unwrap_or_default(),
        };
        let hang = prompt_tokens.contains(&1);
        let fail = prompt_tokens.contains(&2);
        let die = prompt_tokens.contains(&3);
        let linger = prompt_tokens.contains(&4);
        let delay = match prompt_tokens.contains(&5) {
            true => self.delay * SLOW_FACTOR,
            false => self.delay,
        };
        let at_load = self
            .slow_at_load
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        let delay = if at_load {
            delay * BUSY_LOAD_FACTOR
        } else {
            delay
        };
        let (crowded, gate) = (self.crowded, self.gate.clone());
        let mut permit = job.permit;
        tokio::spawn(async move {
            let finish = |reason, n| {
                SeqEvent::Done(Finish {
                    reason,
                    stop_sequence: None,
                    prompt_tokens: prompt_tokens.len(),
                    cached_tokens: 0,
                    tokens_out: n,
                    prefill_ms: 0,
                    decode_ms: 0,
                    guessed_tokens: 0,
                    guesses_kept: 0,
                })
            };
            let mut n = 0;
            loop {
                if hang {
                    job.cancel.cancelled().await;
                    if linger {
                        tokio::time::sleep(LINGER).await;
                    }
                    permit.release();
                    let _ = tx.send(finish(FinishReason::Cancelled, 0)).await;
                    break;
                }
                if n == job.max_tokens {
                    permit.release();
                    let _ = tx.send(finish(FinishReason::Length, n)).await;
                    break;
                }
                if (fail || die) && n == 2 {
                    if fail {
                        permit.release();
                        let _ = tx.send(SeqEvent::Failed("scripted failure".into())).await;
                    } else {
                        alive.store(false, Ordering::SeqCst);
                    }
                    break;
                }
                if job.cancel.is_cancelled() {
                    permit.release();
                    let _ = tx.send(finish(FinishReason::Cancelled, n)).await;
                    break;
                }
                let delay = match crowded {
                    true => delay * gate.in_use().max(1) as u32,
                    false => delay,
                };
                if delay.is_zero() {
                    // an instant engine (tokio timers have 1 ms granularity)
                    tokio::task::yield_now().await;
                } else {
                    tokio::select! {
                        _ = job.cancel.cancelled() => {
                            permit.release();
                    let _ = tx.send(finish(FinishReason::Cancelled, n)).await;
                            break;
                        }
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
                if tx
                    .send(SeqEvent::Token {
                        text: format!("tok{n} "),
                        index: n,
                        id: Some(100 + n as u32),
                        logprobs: None,
                    })
                    .await
                    .is_err()
                {
                    break;
                }
                n += 1;
            }
            // like candle: the slot is free before the final event goes out
            drop(permit);
        });
        Ok(rx)
    }

    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }
}

/// Loads scripted engines; a model ref containing "missing" fails to load, one containing
/// "unsupported" fails as a model the engine cannot have (`PortError::Unloadable`); one
/// containing "busyload" runs its load-time sequences slow, "crowded" slows as it fills.
pub struct ScriptedFactory {
    pub delay: Duration,
    pub ctx: usize,
}

impl EngineFactory for ScriptedFactory {
    fn load(&self, spec: &PoolSpec, model_ref: &str) -> Result<Arc<dyn Engine>, PortError> {
        if model_ref.contains("unsupported") {
            return Err(PortError::Unloadable(format!(
                "unsupported model: {model_ref} has an architecture this engine does not have"
            )));
        }
        if model_ref.contains("missing") {
            return Err(PortError::Load(format!(
                "cannot read model file {model_ref}"
            )));
        }
        Ok(Arc::new(ScriptedEngine {
            delay: self.delay,
            slots: spec.slots,
            // as candle: the pool's context when it asks for less than the model's (0: all)
            ctx: match spec.ctx {
                0 => self.ctx,
                asked => asked.min(self.ctx),
            },
            model_ref: model_ref.to_string(),
            gate: Slots::new(spec.slots),
            alive: Arc::new(AtomicBool::new(true)),
            // the self-test, then one sequence a slot for the full-pool measurement
            slow_at_load: Arc::new(AtomicUsize::new(match model_ref.contains("busyload") {
                true => 1 + spec.slots,
                false => 0,
            })),
            crowded: model_ref.contains("crowded"),
        }))
    }
}

pub fn pool(id: &str, slots: usize) -> PoolConfig {
    PoolConfig {
        alias: Some("scripted-model".into()),
        slots,
        ctx: 256,
        kv_cache_mib: 64,
        ..PoolConfig::new(id, &format!("/models/{id}.gguf"))
    }
}

/// A config with small limits for tests.
pub fn config(pools: Vec<PoolConfig>) -> Config {
    let mut c = Config {
        bind: "127.0.0.1:0".into(),
        pools,
        ..Default::default()
    };
    c.stream.metrics_interval_ms = 50;
    c.stream.keepalive_ms = 0;
    c.timeouts.idle_ms = 2_000;
    // fake model files live in the temp dir (a folder allowed for loads, not served on demand:
    // the model folder's own tests turn that on with a folder of their own)
    c.models.dirs = vec![std::env::temp_dir().display().to_string()];
    c.models.on_demand = false;
    // records in memory; the tests of the store itself give each server a file
    c.records.path = orchestratord::config::RecordsConfig::IN_MEMORY.into();
    c
}

/// A file with the GGUF magic in the temp dir (the scripted factory loads any such path;
/// one named `*missing*` it refuses). Returns its canonical path.
pub fn fake_gguf(name: &str) -> std::path::PathBuf {
    let p = std::env::temp_dir().join(format!("orchd-{}-{name}.gguf", std::process::id()));
    std::fs::write(&p, b"GGUF\x03\x00\x00\x00rest").unwrap();
    std::fs::canonicalize(&p).unwrap()
}

pub struct TestServer {
    pub base: String,
    pub state: SharedState,
    pub background: orchestratord::server::Background,
    pub client: reqwest::Client,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

pub async fn start_with(cfg: Config, factory: Arc<dyn EngineFactory>) -> TestServer {
    let state = orchestratord::server::build_state(cfg, factory).expect("config");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let bg = orchestratord::server::start_background(&state).await;
    measured(&state).await;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let st = state.clone();
    tokio::spawn(async move {
        let _ = orchestratord::server::serve(st, listener, async {
            let _ = rx.await;
        })
        .await;
    });
    TestServer {
        base,
        state,
        background: bg,
        client: reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap(),
        shutdown: Some(tx),
    }
}

/// Waits (10 s at most) until no pool still measures itself with every slot busy: the tests
/// start from a server that has measured its pace, as one that served a while has (a first
/// request would cancel the measurement, ISO-7).
pub async fn measured(state: &SharedState) {
    for _ in 0..1000 {
        if state.pools.all().iter().all(|p| !p.snapshot().measuring) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub async fn start(cfg: Config, token_delay: Duration) -> TestServer {
    start_with(
        cfg,
        Arc::new(ScriptedFactory {
            delay: token_delay,
            ctx: 256,
        }),
    )
    .await
}

/// One parsed SSE event.
#[derive(Debug, Clone, PartialEq)]
pub struct Ev {
    /// The SSE `id:` (the task API sends one per event).
    pub id: Option<usize>,
    pub event: String,
    pub data: serde_json::Value,
}

/// Parses complete SSE frames out of `buf`, leaving a partial frame in place.
pub fn parse_frames(buf: &mut String) -> Vec<Ev> {
    let mut out = Vec::new();
    while let Some(end) = buf.find("\n\n") {
        let frame: String = buf.drain(..end + 2).collect();
        let mut event = None;
        let mut id = None;
        let mut data = String::new();
        for line in frame.lines() {
            if let Some(v) = line.strip_prefix("id: ") {
                id = Some(v.parse().unwrap_or_else(|e| panic!("id {v:?}: {e}")));
            } else if let Some(v) = line.strip_prefix("event: ") {
                event = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("data: ") {
                data.push_str(v);
            }
        }
        if let Some(event) = event {
            let data = serde_json::from_str(&data)
                .unwrap_or_else(|e| panic!("event {event} data is not JSON ({e}): {data:?}"));
            out.push(Ev { id, event, data });
        }
    }
    out
}

impl TestServer {
    /// Sends the shutdown signal (as SIGTERM would).
    pub fn begin_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub async fn submit(&self, body: serde_json::Value) -> reqwest::Response {
        self.client
            .post(self.url("/v1/tasks"))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// Submits and returns the task id, asserting 202.
    pub async fn submit_ok(&self, body: serde_json::Value) -> String {
        let r = self.submit(body).await;
        assert_eq!(r.status(), 202, "{:?}", r.text().await);
        let v: serde_json::Value = r.json().await.unwrap();
        v["task_id"].as_str().unwrap().to_string()
    }

    /// Opens a task's SSE stream (response not yet read).
    pub async fn open_stream(&self, id: &str) -> reqwest::Response {
        self.client
            .get(self.url(&format!("/v1/tasks/{id}/stream")))
            .send()
            .await
            .unwrap()
    }

    /// Reads a whole stream; panics if anything follows the terminal event.
    pub async fn stream_all(&self, id: &str) -> Vec<Ev> {
        let r = self.open_stream(id).await;
        assert_eq!(r.status(), 200);
        read_events(r).await.into_iter().map(|(e, _)| e).collect()
    }

    pub async fn cancel(&self, id: &str) -> u16 {
        self.client
            .post(self.url(&format!("/v1/tasks/{id}/cancel")))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    pub async fn record(&self, id: &str) -> serde_json::Value {
        self.get_json(&format!("/v1/artifacts/{id}")).await
    }

    /// POSTs `body` as JSON to `path`.
    pub async fn post(&self, path: &str, body: &serde_json::Value) -> reqwest::Response {
        self.client
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .expect("request sent")
    }

    /// GET `path` and parse the JSON body (any status).
    pub async fn get_json(&self, path: &str) -> serde_json::Value {
        self.client
            .get(self.url(path))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    pub async fn metrics(&self) -> String {
        self.client
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }
}

/// The value of a counter line `name{labels} value` in Prometheus text (0 when absent).
pub fn counter(text: &str, name_and_labels: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name_and_labels) && l[name_and_labels.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Asserts the stream invariant: `started` first, then tokens/metrics, exactly one terminal last.
pub fn assert_well_formed(events: &[Ev]) {
    assert!(!events.is_empty(), "empty stream");
    assert_eq!(events[0].event, "started", "{events:?}");
    let terminals = events
        .iter()
        .filter(|e| e.event == "end" || e.event == "error")
        .count();
    assert_eq!(terminals, 1, "exactly one terminal: {events:?}");
    let last = &events[events.len() - 1];
    assert!(
        last.event == "end" || last.event == "error",
        "terminal last: {events:?}"
    );
    for (i, e) in events.iter().filter(|e| e.event == "token").enumerate() {
        assert_eq!(e.data["i"], i, "token indices consecutive");
    }
}

/// Reads an SSE response to its end, stamping each event with its arrival time.
pub async fn read_events(r: reqwest::Response) -> Vec<(Ev, std::time::Instant)> {
    use futures::StreamExt;
    let mut body = r.bytes_stream();
    let mut buf = String::new();
    let mut events = Vec::new();
    while let Some(chunk) = body.next().await {
        buf.push_str(std::str::from_utf8(&chunk.unwrap()).expect("SSE is UTF-8"));
        let now = std::time::Instant::now();
        events.extend(parse_frames(&mut buf).into_iter().map(|e| (e, now)));
    }
    assert!(buf.trim().is_empty(), "partial frame left: {buf:?}");
    events
}

/// The repository root.
pub fn repo_root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where `ci/test.sh` installs the official Python SDKs (`pip --target`); panics with the fix
/// when the `openai` package is not there.
pub fn sdk_pythonpath() -> std::path::PathBuf {
    let pydeps = repo_root().join(".cache/pydeps");
    assert!(
        pydeps.join("openai").exists(),
        "the openai package is missing: run ci/test.sh (or pip install --target .cache/pydeps -r ci/requirements-sdk.txt)"
    );
    pydeps
}

/// Runs `ci/<script>` with `args` under `python3` (or `$ORCHD_PYTHON`) with the SDKs on its
/// path, prints its output and asserts it succeeded; returns its stdout.
pub async fn run_sdk_script(script: &str, args: &[std::ffi::OsString]) -> String {
    let python = std::env::var("ORCHD_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = tokio::process::Command::new(python)
        .arg(repo_root().join("ci").join(script))
        .args(args)
        .env("PYTHONPATH", sdk_pythonpath())
        .kill_on_drop(true)
        .output()
        .await
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{script} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

/// The default model as `ci/fetch-model.sh` caches it.
/// A pool of the real default model with `slots` slots of `ctx` tokens.
/// A server on the real default model for the official clients' checks: one pool of 2 slots
/// and a context of 2048; `queue` caps its queue (for an overload check, whose refusal must be
/// the queue's capacity: a long queue wait allowed, so the deadline refusal never comes first).
pub async fn real_model_server(queue: Option<usize>) -> TestServer {
    let mut cfg = config(vec![real_pool("default", 2, 2048)]);
    if let Some(n) = queue {
        cfg.queue.capacity = n;
        cfg.admission.max_queue_wait_ms = 600_000;
    }
    cfg.timeouts.idle_ms = 60_000;
    start_with(cfg, Arc::new(pool_manager::candle::CandleFactory)).await
}

pub fn real_pool(id: &str, slots: usize, ctx: usize) -> PoolConfig {
    let mut p = pool(id, slots);
    p.model = default_model_path();
    p.alias = None;
    p.ctx = ctx;
    p
}

pub fn default_model_path() -> String {
    let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "run ci/fetch-model.sh first ({})", p.display());
    // canonical: model paths with `..` are refused by the server
    std::fs::canonicalize(&p).unwrap().display().to_string()
}
