//! One task: its request, its event transcript, and the invariant that it ends exactly once.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use contracts::{
    ErrorCode, Priority, SseEnd, SseError, SseLogprobs, SseMetrics, SseStarted, SseToken,
    TaskRecord, TaskState, TaskTimings, TerminalEvent, TranscriptEvent,
};
use pool_manager::{EngineDescriptor, OutputConstraint, PromptInput, SamplingParams, StopCause};

use super::placement::sessions::ConversationKey;
use super::request_work::PromptIds;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// Where a task runs, as the replica running it says (it travels in the cluster's handoff:
/// `handoff.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placed {
    pub replica: String,
    pub pool_id: String,
    pub engine: String,
    pub engine_version: String,
    pub model_ref: String,
    /// Why the running replica's pool took it (absent from replicas before PLACE-8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<contracts::PlacementNote>,
}

/// One SSE event of a task, stored once and written to every subscriber.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskEvent {
    Started(SseStarted),
    Token(SseToken),
    Metrics(SseMetrics),
    End(SseEnd),
    Error(SseError),
}

impl TaskEvent {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Started(_) => "started",
            Self::Token(_) => "token",
            Self::Metrics(_) => "metrics",
            Self::End(_) => "end",
            Self::Error(_) => "error",
        }
    }

    /// Writes the JSON payload.
    pub fn write_json<W: std::io::Write>(&self, w: W) -> serde_json::Result<()> {
        match self {
            Self::Started(p) => serde_json::to_writer(w, p),
            Self::Token(p) => serde_json::to_writer(w, p),
            Self::Metrics(p) => serde_json::to_writer(w, p),
            Self::End(p) => serde_json::to_writer(w, p),
            Self::Error(p) => serde_json::to_writer(w, p),
        }
    }

    pub(crate) fn to_transcript(&self) -> TranscriptEvent {
        fn v<T: Serialize>(p: &T) -> serde_json::Value {
            serde_json::to_value(p).unwrap_or(serde_json::Value::Null)
        }
        let data = match self {
            Self::Started(p) => v(p),
            Self::Token(p) => v(p),
            Self::Metrics(p) => v(p),
            Self::End(p) => v(p),
            Self::Error(p) => v(p),
        };
        TranscriptEvent {
            event: self.name().to_string(),
            data,
        }
    }
}

/// What the engine needs to run the task.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub prompt: PromptInput,
    /// Text the client asked to continue (a final assistant turn with
    /// `continue_final_message`); empty for a fresh answer.
    pub continuation: String,
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    /// The language the answer must be in (structured output).
    pub constraint: Option<OutputConstraint>,
    /// `Some(n)`: each token's log-probability and the `n` likeliest.
    pub logprobs: Option<usize>,
    /// An embedding task: what to embed instead of a prompt to continue (its `prompt` is
    /// empty and `max_tokens` 0).
    pub embed: Option<EmbedSpec>,
}

/// What an embedding task embeds and how.
#[derive(Debug, Clone)]
pub struct EmbedSpec {
    pub inputs: Vec<pool_manager::EmbedInput>,
    /// `None`: the model's own.
    pub pooling: Option<pool_manager::Pooling>,
    pub normalize: bool,
    /// Inputs over the model's length are cut to fit (else refused).
    pub truncate: bool,
    /// Keep the first this many dimensions of each vector.
    pub dimensions: Option<usize>,
}

/// An embedding task's inputs as token ids, and the model whose tokenizer made them.
#[derive(Debug, Clone)]
pub struct EmbedIds {
    pub model_ref: String,
    pub ids: Arc<Vec<Vec<u32>>>,
}

/// The index of the token a task's own pace is read from: the gaps before it include the
/// prefills of the other tasks of a burst that arrived with it (one engine prefills one prompt
/// at a time), which a line of waiting tasks mostly does not meet again.
pub const PACE_FROM_TOKEN: u32 = 3;

/// Mutable part of a task, behind one lock: every event append and the terminal decision
/// happen under it, which is what makes cancel race-free.
pub struct TaskInner {
    pub state: TaskState,
    pub events: Vec<TaskEvent>,
    pub pool_id: Option<String>,
    pub engine: Option<EngineDescriptor>,
    pub placed_at: Option<Instant>,
    pub first_token_at: Option<Instant>,
    pub last_token_at: Option<Instant>,
    /// When token [`PACE_FROM_TOKEN`] came: the task's own pace is read from there on.
    pub pace_from_at: Option<Instant>,
    pub ended_at: Option<Instant>,
    pub tokens_out: u32,
    pub last_metrics_at: Option<Instant>,
    pub error_code: Option<ErrorCode>,
    /// When the task (re-)entered the queue: the queue timeout counts from here.
    pub queued_since: Instant,
    /// Times the task went back to the queue after its remote worker was lost.
    pub requeues: u32,
    /// The prompt tokens as the engine that ran the task counted them (a remote worker's
    /// `token_counts`), when admission could only estimate.
    pub counted_prompt_tokens: Option<u32>,
    /// Of the prompt tokens, those the engine took from its cache (not computed).
    pub cached_prompt_tokens: u32,
    /// Followed while another replica runs it: where it runs, as that replica said.
    pub placed_elsewhere: Option<Placed>,
    /// Why the pool it runs on was chosen (placed here).
    pub placement: Option<contracts::PlacementNote>,
}

impl TaskInner {
    pub fn is_terminal(&self) -> bool {
        self.ended_at.is_some()
    }
}

/// An admitted task.
pub struct Task {
    pub id: String,
    /// The tenant that submitted it: only that tenant (and admins) can see it.
    pub owner: String,
    pub correlation_id: String,
    pub priority: Priority,
    pub session_id: Option<String>,
    pub pin: Option<String>,
    pub model: Option<String>,
    pub spec: RunSpec,
    pub prompt_tokens: usize,
    /// The prompt's token ids as admission counted them (engines that take token ids).
    pub prompt_ids: Option<PromptIds>,
    /// The block hashes of those ids, or without ids of the prompt's bytes (placement compares
    /// them with what pools hold).
    pub prefix_chain: Vec<u64>,
    /// The conversation it belongs to, for placement's session affinity.
    pub conversation: Option<ConversationKey>,
    /// An embedding task's inputs as admission counted them.
    pub embed_ids: Option<EmbedIds>,
    /// The request with the prompt redacted, for the record.
    pub params: serde_json::Value,
    pub ctx: usize,
    pub submitted: Instant,
    /// The task must end by then (`deadline_ms`, or the client's timeout for a whole answer).
    pub deadline: Option<Instant>,
    /// The task must start by then to answer in time (a stream's client timeout, the longest
    /// queue wait); past it, a queued task leaves the queue (ORCH-ADM-DL-3).
    pub start_by: Option<Instant>,
    /// Whether `start_by` is the server's longest queue wait, not the client's time: while
    /// every pool that could run it is loading, it waits for the load instead (ISO-7).
    pub start_by_servers: bool,
    /// Its place in line: when it arrived, or the place a refusal kept for this retry.
    pub rank: Instant,
    /// Admission's prediction of its wait for a slot (compared with the real one, metrics).
    pub predicted_start: Duration,
    /// Its client's last attempt (ORCH-ADM-RETRY-2): queued even when predicted late, never
    /// sent back by the line's re-play; its start budget still ends its wait.
    pub last_attempt: bool,
    /// Whom its place in line is kept for if it is sent back (`None`: its client's retry
    /// could not claim one).
    pub claimant: Option<Claimant>,
    /// Its reservation in its tenant's per-minute token quota, settled when it ends.
    pub quota_ticket: Option<crate::lifecycle::quota::Ticket>,
    /// Fired when the task ends early (cancel, timeout, drain): the engine stops decoding it.
    pub cancel: CancellationToken,
    /// Why the task was stopped early, for a remote worker's `cancel` reason.
    pub stop_cause: StopCause,
    inner: Mutex<TaskInner>,
    changed: watch::Sender<u64>,
    /// Its part in a cluster: [`ROLE_OWN`], [`ROLE_FOLLOWED`] or [`ROLE_RUN_FOR_CLUSTER`].
    role: std::sync::atomic::AtomicU8,
    /// Who follows the task now, and how many times the last of them left (see
    /// `subscription.rs`: a disconnect cancels only when nobody came back in the grace period).
    followers: Mutex<Followers>,
}

#[derive(Default)]
struct Followers {
    now: usize,
    departures: u64,
}

/// A task of this replica alone (no cluster, or admitted and run here without one).
const ROLE_OWN: u8 = 0;
/// Followed from the cluster's relay.
const ROLE_FOLLOWED: u8 = 1;
/// Run here for the cluster (taken from its queue).
const ROLE_RUN_FOR_CLUSTER: u8 = 2;

/// Fields of a new task.
pub struct NewTask {
    pub id: String,
    pub owner: String,
    pub correlation_id: String,
    pub priority: Priority,
    pub session_id: Option<String>,
    pub pin: Option<String>,
    pub model: Option<String>,
    pub spec: RunSpec,
    pub prompt_tokens: usize,
    pub prompt_ids: Option<PromptIds>,
    pub conversation: Option<ConversationKey>,
    pub embed_ids: Option<EmbedIds>,
    pub params: serde_json::Value,
    pub ctx: usize,
    pub deadline: Option<Duration>,
    pub start_by: Option<Duration>,
    pub start_by_servers: bool,
    /// The place in line a retry claimed (default: now).
    pub rank: Option<Instant>,
    pub predicted_start: Duration,
    pub last_attempt: bool,
    pub claimant: Option<Claimant>,
    pub quota_ticket: Option<crate::lifecycle::quota::Ticket>,
    /// How long ago it was admitted (zero here; a task followed from another replica was
    /// admitted there earlier): its record's times count from there.
    pub admitted_ago: Duration,
}

impl Task {
    pub fn new(n: NewTask) -> Self {
        let now = Instant::now();
        let submitted = now.checked_sub(n.admitted_ago).unwrap_or(now);
        let prefix_chain = match (&n.prompt_ids, &n.spec.embed) {
            (Some(p), _) => pool_manager::prefix_chain(&p.ids),
            (None, None) => pool_manager::text_prefix_chain(&n.spec.prompt, &n.spec.continuation),
            (None, Some(_)) => Vec::new(),
        };
        Self {
            id: n.id,
            owner: n.owner,
            correlation_id: n.correlation_id,
            priority: n.priority,
            session_id: n.session_id,
            pin: n.pin,
            model: n.model,
            spec: n.spec,
            prompt_tokens: n.prompt_tokens,
            prefix_chain,
            prompt_ids: n.prompt_ids,
            conversation: n.conversation,
            embed_ids: n.embed_ids,
            params: n.params,
            ctx: n.ctx,
            submitted,
            deadline: n.deadline.map(|d| now + d),
            start_by: n.start_by.map(|d| now + d),
            start_by_servers: n.start_by_servers,
            rank: n.rank.unwrap_or(now),
            predicted_start: n.predicted_start,
            last_attempt: n.last_attempt,
            claimant: n.claimant,
            quota_ticket: n.quota_ticket,
            cancel: CancellationToken::new(),
            stop_cause: StopCause::default(),
            inner: Mutex::new(TaskInner {
                state: TaskState::Queued,
                events: Vec::with_capacity(16),
                pool_id: None,
                engine: None,
                placed_elsewhere: None,
                placement: None,
                placed_at: None,
                first_token_at: None,
                last_token_at: None,
                pace_from_at: None,
                ended_at: None,
                tokens_out: 0,
                last_metrics_at: None,
                error_code: None,
                queued_since: now,
                requeues: 0,
                counted_prompt_tokens: None,
                cached_prompt_tokens: 0,
            }),
            changed: watch::channel(0).0,
            role: std::sync::atomic::AtomicU8::new(ROLE_OWN),
            followers: Mutex::new(Followers::default()),
        }
    }

    /// From now on its events come from the cluster's relay.
    pub fn mark_relayed(&self) {
        self.role
            .store(ROLE_FOLLOWED, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether its events come from the relay (another replica runs it, or this one does
    /// from the cluster's queue): the replica follows it as its clients see it.
    pub fn is_relayed(&self) -> bool {
        self.role.load(std::sync::atomic::Ordering::Relaxed) == ROLE_FOLLOWED
    }

    /// It is this replica's run of a task taken from the cluster's queue: its events go to the
    /// relay; the replicas following it keep its record.
    pub fn mark_run_for_cluster(&self) {
        self.role
            .store(ROLE_RUN_FOR_CLUSTER, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn is_run_for_cluster(&self) -> bool {
        self.role.load(std::sync::atomic::Ordering::Relaxed) == ROLE_RUN_FOR_CLUSTER
    }

    fn followers(&self) -> MutexGuard<'_, Followers> {
        self.followers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a new follower of the task's events.
    pub fn follow(&self) {
        self.followers().now += 1;
    }

    /// A follower left. When it was the last one, returns the number of that departure (to
    /// tell later whether anyone came back and left again).
    pub fn unfollow(&self) -> Option<u64> {
        let mut f = self.followers();
        f.now = f.now.saturating_sub(1);
        if f.now > 0 {
            return None;
        }
        f.departures += 1;
        Some(f.departures)
    }

    /// Whether nobody followed the task since departure `n` (from [`Task::unfollow`]).
    pub fn unfollowed_since(&self, n: u64) -> bool {
        let f = self.followers();
        f.now == 0 && f.departures == n
    }

    pub fn lock(&self) -> MutexGuard<'_, TaskInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A receiver that changes whenever an event is appended.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn bump(&self, g: &TaskInner) {
        self.changed.send_replace(g.events.len() as u64);
    }

    pub fn is_terminal(&self) -> bool {
        self.lock().is_terminal()
    }

    pub fn state(&self) -> TaskState {
        self.lock().state
    }

    pub fn push_started(&self, started: SseStarted) {
        let mut g = self.lock();
        if g.events.is_empty() {
            g.events.push(TaskEvent::Started(started));
            self.bump(&g);
        }
    }

    /// Where the replica running it says it runs (a task this replica follows).
    pub fn mark_placed_elsewhere(&self, placed: Placed) {
        self.lock().placed_elsewhere = Some(placed);
    }

    /// Where it runs, as a replica following it tells the others: its pool and engine.
    pub fn placement(&self, replica: &str) -> Option<Placed> {
        let g = self.lock();
        let e = g.engine.as_ref()?;
        Some(Placed {
            replica: replica.to_string(),
            pool_id: g.pool_id.clone()?,
            engine: e.engine.clone(),
            engine_version: e.engine_version.clone(),
            model_ref: e.model_ref.clone(),
            placement: g.placement.clone(),
        })
    }

    /// Records placement. False when the task already ended (e.g. cancelled while placed).
    pub fn mark_running(&self, pool_id: &str, engine: EngineDescriptor) -> bool {
        let mut g = self.lock();
        if g.is_terminal() {
            return false;
        }
        g.state = TaskState::Running;
        g.pool_id = Some(pool_id.to_string());
        g.engine = Some(engine);
        g.placed_at = Some(Instant::now());
        true
    }

    /// Records that another replica of the cluster runs the task: its output came from there,
    /// the first of it written to the relay `at`.
    pub fn mark_running_elsewhere(&self, at: Instant) {
        let mut g = self.lock();
        if g.state == TaskState::Queued && !g.is_terminal() {
            g.state = TaskState::Running;
            g.placed_at = Some(at);
        }
    }

    /// Prompt tokens for usage: the running engine's count when it gave one, else admission's.
    pub fn prompt_tokens_used(&self) -> u32 {
        self.lock()
            .counted_prompt_tokens
            .unwrap_or(self.prompt_tokens as u32)
    }

    /// Where the task's time went so far (up to its end, or now): Ollama's durations.
    pub fn spans(&self) -> Spans {
        let g = self.lock();
        let end = g.ended_at.unwrap_or_else(Instant::now);
        let placed = g.placed_at.unwrap_or(end);
        let first = g.first_token_at.unwrap_or(end);
        Spans {
            total: end.saturating_duration_since(self.submitted),
            waited: placed.saturating_duration_since(self.submitted),
            prefill: first.saturating_duration_since(placed),
            decode: end.saturating_duration_since(first),
        }
    }

    pub fn set_counted_prompt_tokens(&self, n: u32) {
        self.lock().counted_prompt_tokens = Some(n);
    }

    /// Of [`Self::prompt_tokens_used`], those the engine took from its cache: OpenAI's
    /// `cached_tokens`, Anthropic's `cache_read_input_tokens`, llama-server's `cache_n`.
    pub fn prompt_tokens_cached(&self) -> u32 {
        self.lock().cached_prompt_tokens
    }

    pub fn set_cached_prompt_tokens(&self, n: u32) {
        self.lock().cached_prompt_tokens = n;
    }

    /// Puts a running task back to `Queued` after its worker was lost, counting the requeue.
    /// Returns the new count, or `None` when the task already ended.
    pub fn back_to_queue(&self) -> Option<u32> {
        let mut g = self.lock();
        if g.is_terminal() {
            return None;
        }
        g.state = TaskState::Queued;
        g.pool_id = None;
        g.queued_since = Instant::now();
        g.requeues += 1;
        Some(g.requeues)
    }

    /// What a (re)started run continues from: the client's continuation plus every token
    /// already streamed, and how many tokens those were.
    pub fn continuation(&self) -> (String, usize) {
        let g = self.lock();
        let mut text = self.spec.continuation.clone();
        for ev in &g.events {
            if let TaskEvent::Token(t) = ev {
                text.push_str(&t.t);
            }
        }
        (text, g.tokens_out as usize)
    }

    /// Appends a token unless the task already ended. Returns false when it has: the caller
    /// must stop the engine. This check under the lock is what keeps tokens out after cancel.
    pub fn push_token(&self, text: String) -> bool {
        self.push_scored_token(text, None)
    }

    /// [`Self::push_token`] with the step's log-probabilities.
    pub fn push_scored_token(&self, text: String, logprobs: Option<SseLogprobs>) -> bool {
        self.push_token_at(text, logprobs, Instant::now())
    }

    /// A token the replica running the task wrote to the relay `at` (a follower reading
    /// events late still times them as they came).
    pub fn push_relayed_token(
        &self,
        text: String,
        logprobs: Option<SseLogprobs>,
        at: Instant,
    ) -> bool {
        self.push_token_at(text, logprobs, at)
    }

    fn push_token_at(&self, text: String, logprobs: Option<SseLogprobs>, now: Instant) -> bool {
        let mut g = self.lock();
        if g.is_terminal() {
            return false;
        }
        match g.last_token_at {
            None => crate::metrics::ttft(now.saturating_duration_since(self.submitted)),
            Some(prev) => crate::metrics::token_latency(now.saturating_duration_since(prev)),
        }
        if g.first_token_at.is_none() {
            g.first_token_at = Some(now);
        }
        g.last_token_at = Some(now);
        let i = g.tokens_out;
        if i == PACE_FROM_TOKEN {
            g.pace_from_at = Some(now);
        }
        g.tokens_out += 1;
        g.events.push(TaskEvent::Token(SseToken {
            t: text,
            i,
            logprobs,
        }));
        crate::metrics::token_out();
        self.bump(&g);
        true
    }

    /// Appends a metrics frame if the interval since the last one has passed.
    pub fn maybe_push_metrics(&self, interval: Duration, make: impl FnOnce(u32) -> SseMetrics) {
        let mut g = self.lock();
        if g.is_terminal() {
            return;
        }
        let now = Instant::now();
        if g.last_metrics_at.is_some_and(|t| now - t < interval) {
            return;
        }
        g.last_metrics_at = Some(now);
        let m = make(g.tokens_out);
        g.events.push(TaskEvent::Metrics(m));
        self.bump(&g);
    }

    /// Appends a metrics frame another replica wrote to the relay `at` for the task it runs.
    pub fn push_relayed_metrics(&self, m: SseMetrics, at: Instant) {
        let mut g = self.lock();
        if g.is_terminal() {
            return;
        }
        g.last_metrics_at = Some(at);
        g.events.push(TaskEvent::Metrics(m));
        self.bump(&g);
    }

    fn decode_ms(g: &TaskInner, now: Instant) -> u64 {
        g.first_token_at
            .map(|t| now.saturating_duration_since(t).as_millis() as u64)
            .unwrap_or(0)
    }

    /// Ends the task with `end` (finish reason `stop`/`length`/`cancelled`). Returns false
    /// if it had already ended: exactly one terminal event per task.
    pub fn finish(&self, finish_reason: &str, stop_sequence: Option<String>) -> bool {
        self.finish_with(Instant::now(), |g, now| {
            let decode = Self::decode_ms(g, now);
            SseEnd {
                tokens_out: g.tokens_out,
                decode_time_ms: decode,
                decode_ms: decode,
                finish_reason: finish_reason.to_string(),
                stop_sequence,
                cached_tokens: g.cached_prompt_tokens,
                embeddings: None,
                prompt_tokens: None,
            }
        })
    }

    /// Ends an embedding task with its vectors in its `end` event. False if it had already
    /// ended.
    pub fn finish_embedded(&self, vectors: contracts::EmbedVectors) -> bool {
        self.finish_with(Instant::now(), |g, now| {
            let decode = Self::decode_ms(g, now);
            SseEnd {
                tokens_out: 0,
                decode_time_ms: decode,
                decode_ms: decode,
                finish_reason: "stop".into(),
                stop_sequence: None,
                cached_tokens: 0,
                embeddings: Some(vectors),
                prompt_tokens: Some(g.counted_prompt_tokens.unwrap_or(self.prompt_tokens as u32)),
            }
        })
    }

    /// Ends the task with the `end` the replica running it sent, as it sent it (every replica
    /// following the task gives the same), written to the relay `at`. False if it had already
    /// ended.
    pub fn finish_relayed(&self, end: SseEnd, at: Instant) -> bool {
        self.set_cached_prompt_tokens(end.cached_tokens);
        if let Some(n) = end.prompt_tokens {
            self.set_counted_prompt_tokens(n);
        }
        self.finish_with(at, |_, _| end)
    }

    fn finish_with(&self, now: Instant, end: impl FnOnce(&TaskInner, Instant) -> SseEnd) -> bool {
        let mut g = self.lock();
        if g.is_terminal() {
            return false;
        }
        let end = end(&g, now);
        let cancelled = end.finish_reason == "cancelled";
        g.events.push(TaskEvent::End(end));
        g.state = if cancelled {
            TaskState::Cancelled
        } else {
            TaskState::Completed
        };
        g.ended_at = Some(now);
        self.bump(&g);
        drop(g);
        self.cancel.cancel();
        true
    }

    /// Ends the task with an `error` event. Returns false if it had already ended.
    pub fn fail(&self, error: SseError) -> bool {
        self.fail_at(error, Instant::now())
    }

    /// [`Self::fail`] with the time it failed (a relayed `error`: when it was written there).
    pub fn fail_at(&self, error: SseError, at: Instant) -> bool {
        let mut g = self.lock();
        if g.is_terminal() {
            return false;
        }
        g.error_code = Some(error.code);
        g.events.push(TaskEvent::Error(error));
        g.state = TaskState::Failed;
        g.ended_at = Some(at);
        self.bump(&g);
        drop(g);
        self.cancel.cancel();
        true
    }

    /// The per-task record (artifact).
    pub fn record(&self) -> TaskRecord {
        let g = self.lock();
        let since = |t: Option<Instant>| {
            t.map(|t| t.saturating_duration_since(self.submitted).as_millis() as u64)
        };
        // an embedding task's vectors are its live stream's, not kept in its record (they
        // are made from the inputs, which the record redacts)
        let kept = |e: &TaskEvent| match e {
            TaskEvent::End(p) if p.embeddings.is_some() => TaskEvent::End(SseEnd {
                embeddings: None,
                ..p.clone()
            }),
            other => other.clone(),
        };
        let terminal = g.events.last().map(kept).and_then(|e| match e {
            TaskEvent::End(p) => Some(TerminalEvent::End(p)),
            TaskEvent::Error(p) => Some(TerminalEvent::Error(p)),
            _ => None,
        });
        let elsewhere = g.placed_elsewhere.as_ref();
        let decode_time_ms = match (g.first_token_at, g.ended_at) {
            (Some(a), Some(b)) => Some(b.saturating_duration_since(a).as_millis() as u64),
            _ => None,
        };
        TaskRecord {
            task_id: self.id.clone(),
            session_id: self.session_id.clone(),
            correlation_id: self.correlation_id.clone(),
            priority: self.priority,
            params: self.params.clone(),
            seed: self.spec.sampling.seed,
            max_tokens: self.spec.max_tokens as u32,
            // what the engine ran once it said (admission's count before)
            prompt_tokens: g.counted_prompt_tokens.unwrap_or(self.prompt_tokens as u32),
            tokens_out: g.tokens_out,
            pool_id: g
                .pool_id
                .clone()
                .or_else(|| elsewhere.map(|p| p.pool_id.clone())),
            engine: g
                .engine
                .as_ref()
                .map(|e| e.engine.clone())
                .or_else(|| elsewhere.map(|p| p.engine.clone())),
            engine_version: g
                .engine
                .as_ref()
                .map(|e| e.engine_version.clone())
                .or_else(|| elsewhere.map(|p| p.engine_version.clone())),
            model_ref: g
                .engine
                .as_ref()
                .map(|e| e.model_ref.clone())
                .or_else(|| elsewhere.map(|p| p.model_ref.clone())),
            replica: elsewhere.map(|p| p.replica.clone()),
            placement: g
                .placement
                .clone()
                .or_else(|| elsewhere.and_then(|p| p.placement.clone())),
            ctx: self.ctx as u32,
            timings: TaskTimings {
                queued_ms: since(g.placed_at),
                ttft_ms: since(g.first_token_at),
                decode_time_ms,
                total_ms: since(g.ended_at),
            },
            terminal,
            transcript: g.events.iter().map(|e| kept(e).to_transcript()).collect(),
        }
    }
}

/// Where a task's time went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spans {
    /// Submission to the end.
    pub total: Duration,
    /// Submission to placement on a slot (queue, and a pool loading its model).
    pub waited: Duration,
    /// Placement to the first token: reading the prompt.
    pub prefill: Duration,
    /// The first token to the end.
    pub decode: Duration,
}

/// Who a place in line is kept for: a client that counts its tries (a retry-count header),
/// refused on this connection (`None`: the server's own callers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claimant {
    pub connection: Option<std::net::SocketAddr>,
}

impl Claimant {
    /// Who a place in line may be kept for when `caller`'s request is refused: a client that
    /// counts its tries, on its connection; `None` when its retry could not claim a place.
    pub fn of(caller: &crate::auth::Caller) -> Option<Self> {
        caller.patience.counts_tries.then_some(Self {
            connection: caller.connection,
        })
    }
}

#[cfg(test)]
pub(crate) fn test_task(id: &str, rank: Option<Instant>) -> std::sync::Arc<Task> {
    std::sync::Arc::new(Task::new(NewTask {
        id: id.into(),
        owner: "local".into(),
        correlation_id: id.into(),
        priority: Priority::Interactive,
        session_id: None,
        pin: None,
        model: None,
        spec: RunSpec {
            prompt: PromptInput::Text("hi".into()),
            continuation: String::new(),
            sampling: Default::default(),
            max_tokens: 1,
            stop: Vec::new(),
            constraint: None,
            logprobs: None,
            embed: None,
        },
        prompt_tokens: 1,
        prompt_ids: None,
        conversation: None,
        embed_ids: None,
        params: serde_json::Value::Null,
        ctx: 16,
        deadline: None,
        start_by: None,
        start_by_servers: false,
        rank,
        predicted_start: Duration::ZERO,
        last_attempt: false,
        claimant: None,
        quota_ticket: None,
        admitted_ago: Duration::ZERO,
    }))
}
