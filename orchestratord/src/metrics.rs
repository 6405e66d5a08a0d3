//! The helpers that record every Prometheus metric (the names and labels are
//! `contracts::metric_names`: what dashboards and the tools read, one list for all).
//! Labels are bounded: priorities, reasons and error codes are fixed sets (all of them exist
//! from the start, at 0); pool ids are those of live pools. The upkeep loop ([`upkeep`], every
//! `metrics.upkeep_interval_ms`) drains histogram samples into their buckets, so memory does
//! not grow between scrapes, and refreshes every live series; gauges and counters nobody
//! refreshed for `metrics.idle_timeout_ms` (those of removed pools) are dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use contracts::{ErrorCode, Priority};
use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;

pub use contracts::metric_names::*;

/// Why a task was cancelled.
#[derive(Debug, Clone, Copy)]
pub enum CancelReason {
    Client,
    Disconnect,
}

impl CancelReason {
    fn label(self) -> &'static str {
        match self {
            Self::Client => "client",
            Self::Disconnect => "disconnect",
        }
    }
}

/// Installs the process-wide recorder once and returns its handle; series not refreshed for
/// `idle_timeout` are dropped (the first call's value holds for the process).
pub fn install(idle_timeout: Duration) -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let buckets = [
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ];
            let builder = PrometheusBuilder::new()
                .idle_timeout(
                    MetricKindMask::GAUGE | MetricKindMask::COUNTER,
                    Some(idle_timeout),
                )
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &buckets)
                .unwrap_or_else(|_| PrometheusBuilder::new());
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            // another recorder may exist (tests embedding several servers); then ours only
            // renders what was recorded through it
            let _ = metrics::set_global_recorder(recorder);
            describe();
            handle
        })
        .clone()
}

fn describe() {
    describe_counter!(TASKS_ENQUEUED, "Tasks admitted to the queue, by priority");
    describe_counter!(TASKS_STARTED, "Tasks placed on a pool slot, by pool");
    describe_counter!(
        TASKS_CANCELLED,
        "Tasks cancelled, by reason (client, disconnect)"
    );
    describe_counter!(
        TASKS_REJECTED,
        "Submissions refused at admission, by reason code"
    );
    describe_counter!(
        TASKS_FINISHED,
        "Tasks that reached their terminal event, by outcome"
    );
    describe_counter!(TOKENS_IN, "Prompt tokens of admitted tasks");
    describe_counter!(
        EMBEDDING_INPUTS,
        "Inputs embedded (embedding tasks that ended with their vectors), by pool"
    );
    describe_counter!(EMBEDDING_TOKENS, "Tokens of the inputs embedded, by pool");
    describe_counter!(EMBEDDING_PASSES, "The engine's embedding passes, by pool");
    describe_counter!(
        EMBEDDING_PASS_INPUTS,
        "Inputs the embedding passes carried, by pool (over passes: the mean batch)"
    );
    describe_counter!(TOKENS_OUT, "Tokens streamed to clients");
    describe_counter!(ERRORS, "Errors answered or streamed, by code");
    describe_gauge!(QUEUE_DEPTH, "Queued tasks, by priority");
    describe_gauge!(
        CLUSTER_TASKS,
        "In a cluster: tasks in the cluster's queues (queued and running, every replica's), by priority"
    );
    describe_gauge!(
        CLUSTER_REPLICAS,
        "In a cluster: live replicas (this one and those heard from within three heartbeats)"
    );
    describe_gauge!(
        QUEUE_CAPACITY,
        "The queue's bound across both priorities (queue.capacity)"
    );
    describe_histogram!(TTFT, "Submission to first token");
    describe_histogram!(TOKEN_LATENCY, "Time between consecutive tokens of a task");
    describe_histogram!(QUEUE_WAIT, "Submission to placement on a slot, by priority");
    describe_histogram!(
        START_PREDICTION_ERROR,
        "How far admission's predicted wait for a slot was from the real one, by direction (late: started after the prediction, early: before)"
    );
    describe_counter!(
        RETRY_PLACES,
        "Places in line kept for refused requests told to come back, and those retries claimed, by outcome (kept, claimed)"
    );
    describe_counter!(
        QUEUE_SHED,
        "Queued tasks sent back with a 429 before any compute: the line, re-played at the pace the running tasks showed, would not have started them within their client's time"
    );
    describe_gauge!(POOL_SLOTS_BUSY, "Busy slots, by pool");
    describe_gauge!(POOL_SLOTS, "Slots, by pool");
    describe_counter!(
        POOL_RELOADS,
        "Model reloads, by pool and outcome (ok, rolled_back)"
    );
    describe_counter!(
        POOL_RESTARTS,
        "Engine restarts after the engine died, by pool"
    );
    describe_gauge!(
        POOL_LOAD_SECONDS,
        "Time the pool's current model took to load and self-test"
    );
    describe_gauge!(
        POOL_CIRCUIT_OPEN,
        "1 while repeated load failures keep the pool's circuit breaker open"
    );
    describe_gauge!(
        POOL_STATE,
        "1 for the pool's current state, 0 for the others"
    );
    describe_counter!(
        PLACEMENTS,
        "Placement decisions, by pool and reason (pinned, auto)"
    );
    describe_counter!(
        POOL_PROMPT_REUSED,
        "Prompt tokens taken from a prefix cache instead of computed, by pool"
    );
    describe_counter!(
        POOL_PROMPT_TOKENS,
        "Prompt tokens of the sequences that finished on the pool, by pool"
    );
    describe_counter!(
        POOL_PROMPT_CACHED,
        "Of those, the tokens taken from the cache (the hit rate: this over orchd_pool_prompt_tokens_total), by pool"
    );
    describe_counter!(
        POOL_GUESSED,
        "Tokens guessed ahead by speculation (prompt lookup) in the sequences that finished, by pool"
    );
    describe_counter!(
        POOL_GUESSES_KEPT,
        "Of those, the guesses kept: tokens out without a pass of their own (the acceptance: this over orchd_pool_guessed_tokens_total), by pool"
    );
    describe_gauge!(
        POOL_PROMPT_CACHE_BYTES,
        "Bytes the host-memory prompt cache holds, by pool"
    );
    describe_gauge!(WORKERS_CONNECTED, "Remote workers registered now");
    describe_counter!(
        WORKER_DISCONNECTS,
        "Remote worker connections that ended, by reason (closed, heartbeat, drained, shutdown)"
    );
    describe_counter!(
        WORKER_AUTH_FAILURES,
        "Worker connection attempts refused for a wrong or missing secret"
    );
    describe_counter!(
        AUTH_FAILURES,
        "Requests refused by API-key checks, by reason (missing, invalid, forbidden, rate_limited)"
    );
    describe_gauge!(
        HTTP_CONNECTIONS,
        "Open HTTP connections (http.max_connections at most)"
    );
    describe_counter!(
        HTTP_CONNECTIONS_EVICTED,
        "Idle HTTP connections closed at the connection cap to make room for a new one"
    );
    describe_gauge!(PROCESS_RSS, "Resident memory of the process, in bytes");
    describe_counter!(
        PROCESS_CPU,
        "User and system CPU time of the process, in seconds"
    );
    describe_gauge!(
        VLLM_WAITING,
        "Queued tasks this pool could serve (vLLM's name, for Gateway API inference extension endpoint pickers and autoscalers)"
    );
    describe_gauge!(
        VLLM_RUNNING,
        "Tasks running on this pool's slots (vLLM's name)"
    );
    describe_gauge!(
        VLLM_KV_USAGE,
        "Share of the pool's KV cache held by running tasks, 0 to 1: each slot reserves a row of ctx positions, so busy slots over slots (vLLM's name)"
    );
    describe_counter!(
        TASKS_REQUEUED,
        "Tasks put back at the front of the queue after their remote worker was lost"
    );
    describe_counter!(
        RECORDS_WRITTEN,
        "Task records and artifacts written to the record store, by kind (task, artifact)"
    );
    describe_counter!(
        RECORDS_DROPPED,
        "Task records not stored: the writer's queue was full, it had stopped, or a write failed"
    );
    describe_counter!(
        RECORDS_PRUNED,
        "Task records and artifacts deleted by retention, by reason (age, bytes)"
    );
    describe_gauge!(
        RECORDS_AVAILABLE,
        "1 while the record store's database file is the one it opened; 0 once it was deleted or replaced (nothing is stored until a restart)"
    );
    describe_gauge!(
        RECORDS_BYTES,
        "Stored JSON of the task records and artifacts kept, in bytes"
    );
    describe_counter!(
        MODEL_LOADS,
        "Models of the model folder loaded on demand, by model and outcome (ok, failed)"
    );
    describe_counter!(
        MODEL_UNLOADS,
        "On-demand pools unloaded, by model and reason (idle, budget, drained)"
    );
    describe_gauge!(
        MODELS_RESIDENT_BYTES,
        "Memory the on-demand pools hold (weights and KV caches; estimated while loading)"
    );
    describe_gauge!(TENANT_QUEUED, "Tasks queued, by tenant");
    describe_gauge!(TENANT_RUNNING, "Tasks running, by tenant");
    describe_counter!(
        TENANT_TOKENS,
        "Tokens served (prompt tokens read and tokens generated), by tenant"
    );
    describe_counter!(
        TENANT_REFUSALS,
        "Requests refused at admission or sent back from the queue, by tenant and reason (the error code)"
    );
}

/// Reasons of `orchd_worker_disconnects_total`.
const WORKER_DISCONNECT_REASONS: [&str; 5] =
    ["closed", "heartbeat", "drained", "shutdown", "refused"];
/// Reasons of `orchd_auth_failures_total`.
const AUTH_FAILURE_REASONS: [&str; 5] = [
    "missing",
    "invalid",
    "forbidden",
    "rate_limited",
    "foreign_host",
];
/// Outcomes of `orchd_tasks_finished_total`.
const OUTCOMES: [&str; 4] = ["stop", "length", "cancelled", "error"];

/// Drains histogram samples and refreshes every series that should stay: the fixed label sets
/// (so they exist at 0 before their first event) and the live pools' (from `pools`). What is
/// not refreshed here or by traffic for the idle timeout (a removed pool's series) goes away.
pub fn upkeep(
    handle: &PrometheusHandle,
    pools: &[(pool_manager::PoolSnapshot, usize)],
    queue_capacity: usize,
    records_bytes: u64,
) {
    handle.run_upkeep();
    gauge!(QUEUE_CAPACITY).set(queue_capacity as f64);
    gauge!(RECORDS_BYTES).set(records_bytes as f64);
    for k in ["task", "artifact"] {
        counter!(RECORDS_WRITTEN, L_KIND => k).increment(0);
    }
    for r in ["age", "bytes"] {
        counter!(RECORDS_PRUNED, L_REASON => r).increment(0);
    }
    counter!(RECORDS_DROPPED).increment(0);
    for p in [Priority::Interactive, Priority::Batch] {
        counter!(TASKS_ENQUEUED, L_PRIORITY => p.as_str()).increment(0);
    }
    for r in [CancelReason::Client, CancelReason::Disconnect] {
        counter!(TASKS_CANCELLED, L_REASON => r.label()).increment(0);
    }
    for code in ErrorCode::ALL {
        counter!(TASKS_REJECTED, L_REASON => code.as_str()).increment(0);
        counter!(ERRORS, L_CODE => code.as_str()).increment(0);
    }
    for o in OUTCOMES {
        counter!(TASKS_FINISHED, L_OUTCOME => o).increment(0);
    }
    for r in WORKER_DISCONNECT_REASONS {
        counter!(WORKER_DISCONNECTS, L_REASON => r).increment(0);
    }
    for r in AUTH_FAILURE_REASONS {
        counter!(AUTH_FAILURES, L_REASON => r).increment(0);
    }
    for o in ["kept", "claimed"] {
        counter!(RETRY_PLACES, L_OUTCOME => o).increment(0);
    }
    counter!(TOKENS_IN).increment(0);
    counter!(TOKENS_OUT).increment(0);
    counter!(WORKER_AUTH_FAILURES).increment(0);
    counter!(TASKS_REQUEUED).increment(0);
    counter!(QUEUE_SHED).increment(0);
    counter!(HTTP_CONNECTIONS_EVICTED).increment(0);
    gauge!(HTTP_CONNECTIONS).increment(0.0);
    gauge!(QUEUE_DEPTH, L_PRIORITY => "interactive").increment(0.0);
    gauge!(QUEUE_DEPTH, L_PRIORITY => "batch").increment(0.0);
    gauge!(WORKERS_CONNECTED).increment(0.0);
    process();
    for (s, queued) in pools {
        pool(s, *queued);
        counter!(TASKS_STARTED, L_POOL => s.id.clone()).increment(0);
        for reason in contracts::PlacementReason::ALL {
            counter!(PLACEMENTS, L_POOL => s.id.clone(), L_REASON => reason.as_str()).increment(0);
        }
    }
}

/// The process's resident memory and CPU time (when `/proc` has them).
pub fn process() {
    if let Some(rss) = crate::process_stats::resident_bytes() {
        gauge!(PROCESS_RSS).set(rss as f64);
    }
    if let Some(cpu) = crate::process_stats::cpu_time() {
        counter!(PROCESS_CPU).absolute(cpu.as_secs());
    }
}

pub fn connections_open(n: usize) {
    gauge!(HTTP_CONNECTIONS).set(n as f64);
}

pub fn connection_evicted() {
    counter!(HTTP_CONNECTIONS_EVICTED).increment(1);
}

pub fn workers_connected(n: usize) {
    gauge!(WORKERS_CONNECTED).set(n as f64);
}

/// `reason`: closed, heartbeat, drained, shutdown, refused.
pub fn worker_disconnected(reason: &'static str) {
    counter!(WORKER_DISCONNECTS, L_REASON => reason).increment(1);
}

pub fn worker_auth_failed() {
    counter!(WORKER_AUTH_FAILURES).increment(1);
}

/// `reason`: one of `AUTH_FAILURE_REASONS`.
pub fn auth_failed(reason: &'static str) {
    counter!(AUTH_FAILURES, L_REASON => reason).increment(1);
}

/// `kind`: task or artifact.
pub fn records_written(kind: &'static str, n: usize) {
    counter!(RECORDS_WRITTEN, L_KIND => kind).increment(n as u64);
}

pub fn records_dropped(n: usize) {
    counter!(RECORDS_DROPPED).increment(n as u64);
}

/// `reason`: age or bytes.
pub fn records_pruned(reason: &'static str, n: usize) {
    counter!(RECORDS_PRUNED, L_REASON => reason).increment(n as u64);
}

pub fn records_store_available(ok: bool) {
    gauge!(RECORDS_AVAILABLE).set(if ok { 1.0 } else { 0.0 });
}

pub fn records_bytes(total: u64) {
    gauge!(RECORDS_BYTES).set(total as f64);
}

/// A model of the folder loaded on demand (`outcome`: ok, failed). Model names are the
/// folder's files: as many as the operator put there.
pub fn model_loaded(model: &str, outcome: &'static str) {
    counter!(MODEL_LOADS, L_MODEL_NAME => model.to_string(), L_OUTCOME => outcome).increment(1);
}

/// An on-demand pool unloaded (`reason`: idle, budget, drained, deleted).
pub fn model_unloaded(model: &str, reason: &'static str) {
    counter!(MODEL_UNLOADS, L_MODEL_NAME => model.to_string(), L_REASON => reason).increment(1);
}

/// The load and unload series of a folder model, at 0 until something happens (dashboards
/// find every model of the folder).
pub fn model_listed(model: &str) {
    for outcome in ["ok", "failed"] {
        counter!(MODEL_LOADS, L_MODEL_NAME => model.to_string(), L_OUTCOME => outcome).increment(0);
    }
    for reason in ["idle", "budget", "drained", "deleted"] {
        counter!(MODEL_UNLOADS, L_MODEL_NAME => model.to_string(), L_REASON => reason).increment(0);
    }
}

pub fn models_resident(bytes: u64) {
    gauge!(MODELS_RESIDENT_BYTES).set(bytes as f64);
}

/// Tasks queued by tenant label; `labels`: every label in use, set to 0 when none queued.
pub fn tenant_queued(labels: &[&str], queued: &[(&str, usize)]) {
    for l in labels {
        let n: usize = queued.iter().filter(|(t, _)| t == l).map(|(_, n)| n).sum();
        gauge!(TENANT_QUEUED, L_TENANT => l.to_string()).set(n as f64);
    }
}

pub fn tenant_running(labels: &[&str], running: &[(&str, usize)]) {
    for l in labels {
        let n: usize = running.iter().filter(|(t, _)| t == l).map(|(_, n)| n).sum();
        gauge!(TENANT_RUNNING, L_TENANT => l.to_string()).set(n as f64);
    }
}

pub fn tenant_tokens(label: &str, n: usize) {
    counter!(TENANT_TOKENS, L_TENANT => label.to_string()).increment(n as u64);
}

/// Every tenant label's series at 0 (refusals: those of a full queue or a quota).
pub fn tenant_series_at_zero(labels: &[&str]) {
    tenant_queued(labels, &[]);
    tenant_running(labels, &[]);
    for l in labels {
        tenant_tokens(l, 0);
        counter!(TENANT_REFUSALS, L_TENANT => l.to_string(), L_REASON => ErrorCode::AdmissionReject.as_str())
            .increment(0);
    }
}

pub fn tenant_refused(label: &str, code: ErrorCode) {
    counter!(TENANT_REFUSALS, L_TENANT => label.to_string(), L_REASON => code.as_str())
        .increment(1);
}

pub fn requeued() {
    counter!(TASKS_REQUEUED).increment(1);
}

pub fn enqueued(p: Priority) {
    counter!(TASKS_ENQUEUED, L_PRIORITY => p.as_str()).increment(1);
}

pub fn started(pool: &str) {
    counter!(TASKS_STARTED, L_POOL => pool.to_string()).increment(1);
}

pub fn placement(pool: &str, reason: contracts::PlacementReason) {
    counter!(PLACEMENTS, L_POOL => pool.to_string(), L_REASON => reason.as_str()).increment(1);
}

pub fn cancelled(r: CancelReason) {
    counter!(TASKS_CANCELLED, L_REASON => r.label()).increment(1);
}

pub fn rejected(code: ErrorCode) {
    counter!(TASKS_REJECTED, L_REASON => code.as_str()).increment(1);
}

/// `outcome` is the finish reason (`stop`, `length`, `cancelled`) or `error`.
pub fn finished(outcome: &'static str) {
    counter!(TASKS_FINISHED, L_OUTCOME => outcome).increment(1);
}

/// An embedding task ended with its vectors: `inputs` of `tokens` tokens on `pool`.
pub fn embedded(pool: &str, inputs: usize, tokens: usize) {
    counter!(EMBEDDING_INPUTS, L_POOL => pool.to_string()).increment(inputs as u64);
    counter!(EMBEDDING_TOKENS, L_POOL => pool.to_string()).increment(tokens as u64);
}

/// A sequence finished on `pool`: its prompt's tokens, and those the cache held.
pub fn prompt_ran(pool: &str, prompt: usize, cached: usize) {
    counter!(POOL_PROMPT_TOKENS, L_POOL => pool.to_string()).increment(prompt as u64);
    counter!(POOL_PROMPT_CACHED, L_POOL => pool.to_string()).increment(cached as u64);
}

/// A sequence finished on `pool` having guessed `guessed` tokens ahead and kept `kept`.
pub fn guesses(pool: &str, guessed: usize, kept: usize) {
    if guessed > 0 {
        counter!(POOL_GUESSED, L_POOL => pool.to_string()).increment(guessed as u64);
        counter!(POOL_GUESSES_KEPT, L_POOL => pool.to_string()).increment(kept as u64);
    }
}

pub fn tokens_in(n: usize) {
    counter!(TOKENS_IN).increment(n as u64);
}

/// What the process has done so far, beside the counters and histograms (the console's
/// history reads these: `routes/console/history.rs`).
static TOTAL_TOKENS_OUT: AtomicU64 = AtomicU64::new(0);
static TOTAL_TTFT_MICROS: AtomicU64 = AtomicU64::new(0);
static TOTAL_TTFT_COUNT: AtomicU64 = AtomicU64::new(0);

/// The tokens streamed and the times to first token, summed, since the process started.
#[derive(Debug, Clone, Copy)]
pub struct Totals {
    pub tokens_out: u64,
    pub ttft_micros: u64,
    pub ttft_count: u64,
}

pub fn totals() -> Totals {
    Totals {
        tokens_out: TOTAL_TOKENS_OUT.load(Ordering::Relaxed),
        ttft_micros: TOTAL_TTFT_MICROS.load(Ordering::Relaxed),
        ttft_count: TOTAL_TTFT_COUNT.load(Ordering::Relaxed),
    }
}

pub fn token_out() {
    counter!(TOKENS_OUT).increment(1);
    TOTAL_TOKENS_OUT.fetch_add(1, Ordering::Relaxed);
}

pub fn error(code: ErrorCode) {
    counter!(ERRORS, L_CODE => code.as_str()).increment(1);
}

pub fn queue_depth(interactive: usize, batch: usize) {
    gauge!(QUEUE_DEPTH, L_PRIORITY => "interactive").set(interactive as f64);
    gauge!(QUEUE_DEPTH, L_PRIORITY => "batch").set(batch as f64);
}

/// The cluster's tasks (queued and running) by priority.
pub fn cluster_tasks(interactive: u64, batch: u64) {
    gauge!(CLUSTER_TASKS, L_PRIORITY => "interactive").set(interactive as f64);
    gauge!(CLUSTER_TASKS, L_PRIORITY => "batch").set(batch as f64);
}

/// The cluster's live replicas.
pub fn cluster_replicas(replicas: usize) {
    gauge!(CLUSTER_REPLICAS).set(replicas as f64);
}

pub fn ttft(d: Duration) {
    histogram!(TTFT).record(d.as_secs_f64());
    TOTAL_TTFT_MICROS.fetch_add(d.as_micros() as u64, Ordering::Relaxed);
    TOTAL_TTFT_COUNT.fetch_add(1, Ordering::Relaxed);
}

pub fn token_latency(d: Duration) {
    histogram!(TOKEN_LATENCY).record(d.as_secs_f64());
}

pub fn queue_wait(d: Duration, p: Priority) {
    histogram!(QUEUE_WAIT, L_PRIORITY => p.as_str()).record(d.as_secs_f64());
}

/// A task started after waiting `actual`; admission had predicted `predicted`.
pub fn start_prediction(predicted: Duration, actual: Duration) {
    let (direction, error) = if actual >= predicted {
        ("late", actual - predicted)
    } else {
        ("early", predicted - actual)
    };
    histogram!(START_PREDICTION_ERROR, L_DIRECTION => direction).record(error.as_secs_f64());
}

/// A queued task was sent back: the line re-played at the measured pace would start it late.
pub fn shed() {
    counter!(QUEUE_SHED).increment(1);
}

/// A place in line was kept for a refused request (`kept`), a retry took one (`claimed`), or a
/// client's last attempt was queued though predicted late (`last_attempt_queued`).
pub fn retry_place(outcome: &'static str) {
    counter!(RETRY_PLACES, L_OUTCOME => outcome).increment(1);
}

/// Publishes one pool's gauges and counters from its snapshot; `queued`: the queued tasks it
/// could serve.
pub fn pool(s: &pool_manager::PoolSnapshot, queued: usize) {
    let id = s.id.clone();
    let model = || s.model_alias.clone();
    gauge!(VLLM_WAITING, L_POOL => id.clone(), L_MODEL_NAME => model()).set(queued as f64);
    gauge!(VLLM_RUNNING, L_POOL => id.clone(), L_MODEL_NAME => model()).set(s.slots_busy as f64);
    let usage = if s.slots_total == 0 {
        0.0
    } else {
        (s.slots_busy as f64 / s.slots_total as f64).min(1.0)
    };
    gauge!(VLLM_KV_USAGE, L_POOL => id.clone(), L_MODEL_NAME => model()).set(usage);
    gauge!(POOL_SLOTS_BUSY, L_POOL => id.clone()).set(s.slots_busy as f64);
    gauge!(POOL_SLOTS, L_POOL => id.clone()).set(s.slots_total as f64);
    for st in pool_manager::PoolState::ALL {
        let v = if st == s.state { 1.0 } else { 0.0 };
        gauge!(POOL_STATE, L_POOL => id.clone(), L_STATE => st.as_str()).set(v);
    }
    counter!(POOL_RELOADS, L_POOL => id.clone(), L_OUTCOME => "ok").absolute(s.reloads_ok);
    counter!(POOL_RELOADS, L_POOL => id.clone(), L_OUTCOME => "rolled_back")
        .absolute(s.reloads_failed);
    counter!(POOL_RESTARTS, L_POOL => id.clone()).absolute(s.restarts);
    counter!(POOL_PROMPT_REUSED, L_POOL => id.clone()).absolute(s.prompt_tokens_reused);
    if let Some((inputs, passes)) = s.embed_passes {
        counter!(EMBEDDING_PASSES, L_POOL => id.clone()).absolute(passes);
        counter!(EMBEDDING_PASS_INPUTS, L_POOL => id.clone()).absolute(inputs);
    }
    gauge!(POOL_PROMPT_CACHE_BYTES, L_POOL => id.clone()).set(s.prompt_cache_bytes as f64);
    gauge!(POOL_LOAD_SECONDS, L_POOL => id.clone()).set(s.model_load_ms as f64 / 1000.0);
    gauge!(POOL_CIRCUIT_OPEN, L_POOL => id).set(if s.circuit_open() { 1.0 } else { 0.0 });
}
