//! Every Prometheus metric name and label orchestratord exports: what dashboards, alerts and
//! the tools (`orchctl metrics`, the soak's checks) read. The server records them in
//! `orchestratord/src/metrics.rs`.

pub const TASKS_ENQUEUED: &str = "orchd_tasks_enqueued_total";
pub const TASKS_STARTED: &str = "orchd_tasks_started_total";
pub const TASKS_CANCELLED: &str = "orchd_tasks_cancelled_total";
pub const TASKS_REJECTED: &str = "orchd_tasks_rejected_total";
pub const TASKS_FINISHED: &str = "orchd_tasks_finished_total";
pub const TOKENS_IN: &str = "orchd_tokens_in_total";
pub const TOKENS_OUT: &str = "orchd_tokens_out_total";
pub const ERRORS: &str = "orchd_errors_total";
pub const QUEUE_DEPTH: &str = "orchd_queue_depth";
pub const QUEUE_CAPACITY: &str = "orchd_queue_capacity";
pub const TTFT: &str = "orchd_time_to_first_token_seconds";
pub const TOKEN_LATENCY: &str = "orchd_token_latency_seconds";
pub const QUEUE_WAIT: &str = "orchd_queue_wait_seconds";
pub const START_PREDICTION_ERROR: &str = "orchd_start_prediction_error_seconds";
pub const RETRY_PLACES: &str = "orchd_retry_places_total";
pub const QUEUE_SHED: &str = "orchd_queue_shed_total";
pub const POOL_SLOTS_BUSY: &str = "orchd_pool_slots_busy";
pub const POOL_SLOTS: &str = "orchd_pool_slots";
pub const POOL_STATE: &str = "orchd_pool_state";
pub const PLACEMENTS: &str = "orchd_placement_total";
pub const POOL_RELOADS: &str = "orchd_pool_reloads_total";
pub const POOL_RESTARTS: &str = "orchd_pool_restarts_total";
pub const POOL_LOAD_SECONDS: &str = "orchd_pool_model_load_seconds";
pub const POOL_CIRCUIT_OPEN: &str = "orchd_pool_circuit_open";
pub const POOL_PROMPT_REUSED: &str = "orchd_pool_prompt_tokens_reused_total";
pub const POOL_PROMPT_TOKENS: &str = "orchd_pool_prompt_tokens_total";
pub const POOL_PROMPT_CACHED: &str = "orchd_pool_prompt_tokens_cached_total";
pub const POOL_PROMPT_CACHE_BYTES: &str = "orchd_pool_prompt_cache_bytes";
/// Tokens guessed ahead by speculation (prompt lookup) in the sequences that finished, by pool.
pub const POOL_GUESSED: &str = "orchd_pool_guessed_tokens_total";
/// Of those, the guesses kept (each one a token out without a pass of its own), by pool.
pub const POOL_GUESSES_KEPT: &str = "orchd_pool_guessed_tokens_kept_total";
/// Inputs of embedding tasks that ended with their vectors, by pool.
pub const EMBEDDING_INPUTS: &str = "orchd_embedding_inputs_total";
/// Tokens of those inputs, by pool.
pub const EMBEDDING_TOKENS: &str = "orchd_embedding_tokens_total";
/// The engine's embedding passes, by pool, and the inputs they carried: their ratio is the
/// mean batch (inputs of several requests share a pass).
pub const EMBEDDING_PASSES: &str = "orchd_embedding_passes_total";
pub const EMBEDDING_PASS_INPUTS: &str = "orchd_embedding_pass_inputs_total";
/// In a cluster only, the same on every replica: tasks in the cluster's queues (queued and
/// running), by priority, and the live replicas.
pub const CLUSTER_TASKS: &str = "orchd_cluster_tasks";
pub const CLUSTER_REPLICAS: &str = "orchd_cluster_replicas";
/// What the prompt-cache series' names start with (shown to admin keys only, SEC-TEN-1).
pub const PROMPT_CACHE_PREFIX: &str = "orchd_pool_prompt_";
pub const WORKERS_CONNECTED: &str = "orchd_workers_connected";
pub const WORKER_DISCONNECTS: &str = "orchd_worker_disconnects_total";
pub const WORKER_AUTH_FAILURES: &str = "orchd_worker_auth_failures_total";
pub const TASKS_REQUEUED: &str = "orchd_tasks_requeued_total";
pub const AUTH_FAILURES: &str = "orchd_auth_failures_total";
pub const HTTP_CONNECTIONS: &str = "orchd_http_connections";
pub const HTTP_CONNECTIONS_EVICTED: &str = "orchd_http_connections_evicted_total";
pub const RECORDS_WRITTEN: &str = "orchd_records_written_total";
pub const RECORDS_DROPPED: &str = "orchd_records_dropped_total";
pub const RECORDS_PRUNED: &str = "orchd_records_pruned_total";
pub const RECORDS_BYTES: &str = "orchd_records_bytes";
pub const RECORDS_AVAILABLE: &str = "orchd_records_store_available";
pub const MODEL_LOADS: &str = "orchd_model_loads_total";
pub const MODEL_UNLOADS: &str = "orchd_model_unloads_total";
pub const MODELS_RESIDENT_BYTES: &str = "orchd_models_resident_bytes";
/// Per tenant (label `tenant`: configured and key-set tenants, the rest `other`).
/// What every per-tenant series' name starts with (shown to admin keys only when keys are
/// configured: SEC-MET-1).
pub const TENANT_PREFIX: &str = "orchd_tenant_";
pub const TENANT_QUEUED: &str = "orchd_tenant_queued";
pub const TENANT_RUNNING: &str = "orchd_tenant_running";
pub const TENANT_TOKENS: &str = "orchd_tenant_tokens_total";
pub const TENANT_REFUSALS: &str = "orchd_tenant_refusals_total";
/// The process collector's standard names (what dashboards for any server read).
pub const PROCESS_RSS: &str = "process_resident_memory_bytes";
pub const PROCESS_CPU: &str = "process_cpu_seconds_total";
/// The names the Kubernetes Gateway API Inference Extension's endpoint picker and autoscalers
/// read from model servers (vLLM's), per pool; label `model_name` as vLLM's.
pub const VLLM_PREFIX: &str = "vllm:";
pub const VLLM_WAITING: &str = "vllm:num_requests_waiting";
pub const VLLM_RUNNING: &str = "vllm:num_requests_running";
pub const VLLM_KV_USAGE: &str = "vllm:kv_cache_usage_perc";

pub const L_PRIORITY: &str = "priority";
pub const L_REASON: &str = "reason";
pub const L_CODE: &str = "code";
pub const L_POOL: &str = "pool";
pub const L_OUTCOME: &str = "outcome";
pub const L_STATE: &str = "state";
pub const L_DIRECTION: &str = "direction";
pub const L_MODEL_NAME: &str = "model_name";
pub const L_KIND: &str = "kind";
pub const L_TENANT: &str = "tenant";
