//! The reliability soak: for a set time, clients of every adapter (task API, OpenAI chat and
//! completions, the seed-001 chat, Hyperswarm) run tasks against a server on the real engine
//! with random cancels, disconnects, reconnects with `Last-Event-ID`, late subscribers and
//! session budgets, while a control loop drains, resumes and reloads pools. Every task is
//! checked from the client side and against its record; at the end the pools must hold no
//! slot. Used by `orchd-soak` (any duration) and, for two minutes, by `tests/soak.rs`.

mod checks;
mod clients;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

/// What to run.
#[derive(Debug, Clone)]
pub struct SoakSpec {
    pub base_url: String,
    /// `model` of model-addressed requests.
    pub model: String,
    pub duration: Duration,
    /// Clients running at once.
    pub concurrency: usize,
    /// Pools the control loop drains and resumes (keep one pool out of it so tasks always
    /// have somewhere to run).
    pub drain_pools: Vec<String>,
    /// Pools the control loop reloads, with the model each reloads to.
    pub reload_pools: Vec<(String, String)>,
    /// The Hyperswarm host's TCP address, when it runs.
    pub hyperswarm: Option<SocketAddr>,
    /// Most tokens a task asks for (each asks for 1..=this).
    pub max_tokens: u32,
    pub seed: u64,
}

/// What the soak saw. The `*_failures` fields, `slots_busy_at_end` and `records_unstored`
/// must all be 0.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SoakReport {
    pub tasks: usize,
    pub by_adapter: BTreeMap<String, usize>,
    /// How tasks ended: finish reasons, stream error codes, refusal statuses.
    pub outcomes: BTreeMap<String, usize>,
    /// A task whose record or stream never reached a terminal event.
    pub lost_failures: usize,
    /// A record with more than one terminal event, or an event after it.
    pub double_terminal_failures: usize,
    /// Tokens appended after a cancel had returned 204.
    pub tokens_after_cancel_failures: usize,
    /// HTTP 5xx answers other than a retriable 503, and `INTERNAL` stream errors.
    pub server_error_failures: usize,
    /// Anything else a client found wrong (a stream that broke its protocol).
    pub protocol_failures: usize,
    /// The first few failures, described.
    pub failure_samples: Vec<String>,
    pub cancels: usize,
    pub disconnects: usize,
    pub resumes: usize,
    pub late_subscribers: usize,
    pub drains: usize,
    pub resumes_of_pools: usize,
    pub reloads: usize,
    pub control_refusals: usize,
    /// Busy slots summed over the pools once every client is done and the server is idle.
    pub slots_busy_at_end: u64,
    /// Ended tasks whose record did not reach the record store (finished minus written).
    pub records_unstored: u64,
    pub rss_start_bytes: Option<u64>,
    pub rss_middle_bytes: Option<u64>,
    pub rss_end_bytes: Option<u64>,
    pub wall_s: f64,
}

impl SoakReport {
    /// Whether every failure count is 0 and every slot came back.
    pub fn clean(&self) -> bool {
        self.lost_failures == 0
            && self.double_terminal_failures == 0
            && self.tokens_after_cancel_failures == 0
            && self.server_error_failures == 0
            && self.protocol_failures == 0
            && self.slots_busy_at_end == 0
            && self.records_unstored == 0
    }
}

/// The kinds of failure a check can find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    Lost,
    DoubleTerminal,
    TokensAfterCancel,
    ServerError,
    Protocol,
}

/// The report, shared by the clients while they run.
#[derive(Clone, Default)]
pub(crate) struct Tally(Arc<Mutex<SoakReport>>);

/// Failure descriptions kept in the report.
const MAX_SAMPLES: usize = 20;

impl Tally {
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut SoakReport) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub(crate) fn task(&self, adapter: &str) {
        self.with(|r| {
            r.tasks += 1;
            *r.by_adapter.entry(adapter.to_string()).or_default() += 1;
        });
    }

    pub(crate) fn outcome(&self, what: impl Into<String>) {
        let what = what.into();
        self.with(|r| *r.outcomes.entry(what).or_default() += 1);
    }

    pub(crate) fn fail(&self, kind: Failure, what: String) {
        self.with(|r| {
            match kind {
                Failure::Lost => r.lost_failures += 1,
                Failure::DoubleTerminal => r.double_terminal_failures += 1,
                Failure::TokensAfterCancel => r.tokens_after_cancel_failures += 1,
                Failure::ServerError => r.server_error_failures += 1,
                Failure::Protocol => r.protocol_failures += 1,
            }
            if r.failure_samples.len() < MAX_SAMPLES {
                r.failure_samples.push(format!("{kind:?}: {what}"));
            }
        });
    }
}

/// A small deterministic generator (the soak replays with the same seed).
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(
            seed.wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407)
                | 1,
        )
    }

    pub(crate) fn next(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545F4914F6CDD1D)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Runs the soak. `rss` reads the server's resident memory (the caller knows where it runs).
pub async fn run(spec: SoakSpec, rss: impl Fn() -> Option<u64>) -> SoakReport {
    let started = Instant::now();
    let tally = Tally::default();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(spec.concurrency)
        .build()
        .unwrap_or_default();
    let spec = Arc::new(spec);
    tally.with(|r| r.rss_start_bytes = rss());
    let until = started + spec.duration;
    let mut clients = Vec::new();
    for c in 0..spec.concurrency {
        let (spec, tally, client) = (spec.clone(), tally.clone(), client.clone());
        let mut rng = Rng::new(spec.seed ^ (c as u64 + 1).wrapping_mul(0x9E37_79B9));
        clients.push(tokio::spawn(async move {
            while Instant::now() < until {
                clients::one_task(&client, &spec, &tally, &mut rng).await;
            }
        }));
    }
    let control = {
        let (spec, tally, client) = (spec.clone(), tally.clone(), client.clone());
        tokio::spawn(async move { clients::control_loop(&client, &spec, &tally, until).await })
    };
    tokio::time::sleep(spec.duration / 2).await;
    tally.with(|r| r.rss_middle_bytes = rss());
    for c in clients {
        let _ = c.await;
    }
    let _ = control.await;
    // the control loop leaves every pool serving; wait for the server to go idle
    let busy = checks::wait_slots_free(&client, &spec.base_url, Duration::from_secs(60)).await;
    let unstored =
        checks::wait_records_stored(&client, &spec.base_url, Duration::from_secs(10)).await;
    tally.with(|r| {
        r.slots_busy_at_end = busy;
        r.records_unstored = unstored;
        r.rss_end_bytes = rss();
        r.wall_s = started.elapsed().as_secs_f64();
    });
    tally.with(|r| r.clone())
}

/// The config (TOML) of the server the soak runs against: two pools of `model` (the control
/// loop reloads `p1` and drains `p2`), the Hyperswarm host on `hyperswarm_listen`
/// (`127.0.0.1:0`: any free port), session budgets small enough to run out, and a short
/// disconnect grace so abandoned task API streams end soon. The Hyperswarm identity and the
/// record store live in `scratch`.
pub fn server_toml(model: &str, scratch: &std::path::Path, hyperswarm_listen: &str) -> String {
    // a JSON string is a TOML basic string
    let q = |s: &str| serde_json::Value::from(s).to_string();
    let path = |f: &str| q(&scratch.join(f).display().to_string());
    let mut t = format!(
        "[queue]\ncapacity = 256\n\
         [stream]\ndisconnect_grace_ms = 500\nmax_retained_tasks = 100000\n\
         [sessions]\ntoken_budget = 3000\n\
         [records]\npath = {}\n\
         [hyperswarm]\nenabled = true\nlisten = {}\nmodel = \"soak-model\"\nidentity_path = {}\n\
         [hyperswarm.sidecar]\nenabled = false\n",
        path("records.sqlite3"),
        q(hyperswarm_listen),
        path("identity.json"),
    );
    for id in ["p1", "p2"] {
        t.push_str(&format!(
            "[[pools]]\nid = \"{id}\"\nmodel = {}\nalias = \"soak-model\"\nslots = 4\nctx = 512\n",
            q(model)
        ));
    }
    t
}

/// The spec for [`server_toml`]'s server at `base_url`.
pub fn spec_for(
    base_url: String,
    model: &str,
    hyperswarm: Option<SocketAddr>,
    duration: Duration,
    concurrency: usize,
) -> SoakSpec {
    SoakSpec {
        base_url,
        model: "soak-model".into(),
        duration,
        concurrency,
        drain_pools: vec!["p2".into()],
        reload_pools: vec![("p1".into(), model.into())],
        hyperswarm,
        max_tokens: 24,
        seed: 42,
    }
}
