//! The decode thread: continuous batching over the cache rows of one loaded model.
//!
//! Every step is one forward pass: each running sequence decodes its next token, and the
//! prompts of new sequences go through in chunks beside them — while any sequence decodes,
//! `step_prompt_tokens` prompt tokens per pass (fewer past `ATTENTION_TAKES_OVER` positions of
//! history), or as many as fit a step time (`step_budget.rs`), so a long prompt never holds up
//! the streams for more than one short pass (cancel is checked between passes). A sequence whose last prompt chunk went through
//! starts decoding from that chunk's logits; finished or cancelled sequences leave at once.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::mpsc::Sender;
use tokio_util::sync::CancellationToken;

use crate::constrained::{Constrained, ConstraintFailure};
use crate::contention::Governor;
use crate::embed_job::EmbedRequest;
use crate::embed_rows::{After, EmbedRun};
use crate::engine::EngineSettings;
use crate::error::EngineError;
use crate::held_prefixes::{Held, Publisher};
use crate::model::{KvCache, Model, Segment};
use crate::ngram_draft::NgramDraft;
use crate::pass_cost::PassCost;
use crate::prompt_cache::{common_prefix, Entry, PromptCache};
use crate::step_budget::StepBudget;

use crate::sampling::Sampler;
use crate::text_stream::TextStream;
use crate::tokenizer::GgufTokenizer;
use engine_port::{
    CachedPrefixes, FailureNote, Finish, FinishReason, PortError, SamplingParams, SeqEvent,
    SlotPermit, Slots, StepLogprobs, TokenLogprob, MAX_TOP_LOGPROBS,
};

/// A generation request for one sequence.
pub struct GenerateRequest {
    /// The slot the sequence runs in, taken with [`crate::CandleEngine::try_acquire`]; the
    /// engine releases it when it lets go of the sequence's row, before the final event.
    pub permit: SlotPermit,
    pub prompt_tokens: Vec<u32>,
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    /// The language the text must be in (structured output), from
    /// [`crate::CandleEngine::constrain`].
    pub constraint: Option<Constrained>,
    /// `Some(n)`: each token's log-probability and the `n` likeliest (at most 20).
    pub logprobs: Option<usize>,
    pub cancel: CancellationToken,
    pub events: Sender<SeqEvent>,
    /// Set before a `Failed` event that is the request's own doing (its constraint could not
    /// be followed: the field and why), so the caller answers it as the client's mistake.
    pub failure: FailureNote,
}

pub(crate) enum Command {
    Submit(Box<GenerateRequest>, Instant),
    Embed(Box<EmbedRequest>),
}

struct Running {
    req: GenerateRequest,
    /// Its KV cache row.
    row: usize,
    sampler: Sampler,
    text: TextStream,
    tokens: Vec<u32>,
    /// Tokens already in the cache row.
    pos: usize,
    /// Token to feed at `pos` in the next step.
    next: u32,
    generated: usize,
    backlog: VecDeque<SeqEvent>,
    first_token: Instant,
    prefill_ms: u64,
    /// Prompt tokens its row held from a cached prefix (not computed for it).
    cached: usize,
    /// Why its constraint could not pick the token (the row then fails).
    failed: Option<ConstraintFailure>,
    /// The log-probabilities of the step that picked `next`, when asked for.
    logprobs: Option<Box<StepLogprobs>>,
    /// Its guessing of the tokens ahead (prompt lookup), when on.
    draft: Option<NgramDraft>,
    /// The guesses the last pass fed after `next`, with the logits that followed each.
    verify: Option<Verify>,
}

/// Guesses fed after a sequence's token in one pass, checked one by one as its tokens are
/// picked: the pass's logits, row after row (`vocab` each): row `k + 1` follows `drafts[k]`
/// (whose keys and values are in the row).
struct Verify {
    drafts: Vec<u32>,
    logits: Vec<f32>,
    vocab: usize,
    /// Guesses checked so far.
    at: usize,
}

impl Running {
    /// Picks the token after `logits` with the sequence's sampler (and constraint): it is
    /// `next`, with its log-probabilities, or the constraint's failure.
    fn pick_next(&mut self, logits: &mut [f32], tokenizer: &GgufTokenizer) {
        match pick(
            &mut self.sampler,
            &mut self.req,
            logits,
            &self.tokens,
            tokenizer,
        ) {
            Ok((t, lp)) => {
                self.next = t;
                self.logprobs = lp;
            }
            Err(e) => self.failed = Some(e),
        }
    }
}

/// The event of a sequence whose constraint could not be followed: noted as the request's
/// own doing (its field and why, for the caller's answer), then failed.
fn constraint_failed(req: &GenerateRequest, why: ConstraintFailure) -> SeqEvent {
    req.failure.set(PortError::Refused {
        field: why.field.to_string(),
        message: why.message.clone(),
    });
    SeqEvent::Failed(format!("constrained decoding: {why}"))
}

/// Shared prompt tokens worth waiting for another sequence's prefill (and copying its keys and
/// values) rather than computing them alongside.
const SHARE_AFTER_PREFILL: usize = 32;

/// A sequence's next token: its constraint masks the logits first, when it has one; with
/// `logprobs`, the step's log-probabilities over what the sampler saw (penalties and mask
/// applied).
fn pick(
    sampler: &mut Sampler,
    req: &mut GenerateRequest,
    logits: &mut [f32],
    recent: &[u32],
    tokenizer: &GgufTokenizer,
) -> Result<(u32, Option<Box<StepLogprobs>>), ConstraintFailure> {
    if let Some(c) = req.constraint.as_mut() {
        c.mask(logits)?;
    }
    let token = sampler.sample(logits, recent);
    let Some(n) = req.logprobs else {
        return Ok((token, None));
    };
    let (lp, top) = crate::sampling::log_probs(logits, token, n.min(MAX_TOP_LOGPROBS));
    let entry = |id: u32, logprob: f32| TokenLogprob {
        id: Some(id),
        bytes: match tokenizer.token_bytes(id) {
            [] => tokenizer.token_text(id).unwrap_or_default().into_bytes(),
            b => b.to_vec(),
        },
        logprob,
    };
    Ok((
        token,
        Some(Box::new(StepLogprobs {
            chosen: entry(token, lp),
            top: top.into_iter().map(|(id, l)| entry(id, l)).collect(),
        })),
    ))
}

/// A sequence with a row whose prompt is still going through, a chunk per pass.
struct Prefilling {
    req: Box<GenerateRequest>,
    submitted: Instant,
    row: usize,
    /// Prompt tokens already in the row.
    done: usize,
    /// Prompt tokens that were in the row (a cached prefix) before any was computed.
    cached: usize,
}

/// Events of a sequence that left its row but whose receiver has not taken them all yet.
struct Draining {
    events: Sender<SeqEvent>,
    backlog: VecDeque<SeqEvent>,
}

pub(crate) struct Shared {
    pub alive: AtomicBool,
    /// Prompt tokens whose keys and values were reused from a cached prefix (not recomputed).
    pub reused_tokens: std::sync::atomic::AtomicU64,
    /// Prompt tokens of the sequences given a row (of which `reused_tokens` came cached).
    pub prompt_tokens: std::sync::atomic::AtomicU64,
    /// Bytes the host-memory prompt cache holds.
    pub prompt_cache_bytes: AtomicUsize,
    /// The prefixes the rows and the prompt cache hold, as published after the last step
    /// that changed them.
    pub held: Held,
}

/// A cache row no sequence runs in, with the prompt tokens whose keys and values it still
/// holds (positions `0..cached.len()`).
struct FreeRow {
    row: usize,
    cached: Vec<u32>,
}

/// Marks the engine dead when the decode thread ends for any reason, panics included.
struct AliveGuard(Arc<Shared>);
impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.alive.store(false, Ordering::SeqCst);
    }
}

fn push_event(backlog: &mut VecDeque<SeqEvent>, tx: &Sender<SeqEvent>, ev: SeqEvent) {
    backlog.push_back(ev);
    flush(backlog, tx);
}

/// Sends what the channel takes; returns false when the receiver is gone.
fn flush(backlog: &mut VecDeque<SeqEvent>, tx: &Sender<SeqEvent>) -> bool {
    while let Some(ev) = backlog.pop_front() {
        match tx.try_send(ev) {
            Ok(()) => {}
            Err(TrySendError::Full(ev)) => {
                backlog.push_front(ev);
                return true;
            }
            Err(TrySendError::Closed(_)) => {
                backlog.clear();
                return false;
            }
        }
    }
    true
}

pub(crate) struct Scheduler {
    pub model: Model,
    pub cache: KvCache,
    pub tokenizer: Arc<GgufTokenizer>,
    pub slots: usize,
    /// The engine's one count of slots: an embedding job borrows the ones nobody holds.
    pub slot_count: Slots,
    /// Embedding jobs waiting for a row, and those running.
    embed_waiting: VecDeque<Box<EmbedRequest>>,
    embedding: Vec<EmbedRun>,
    pub shared: Arc<Shared>,
    running: Vec<Running>,
    /// Sequences computing their prompts, in arrival order.
    prefilling: Vec<Prefilling>,
    /// Prompt tokens one pass takes while sequences decode.
    step: StepBudget,
    /// Rows nobody runs in, oldest first.
    free: Vec<FreeRow>,
    waiting: VecDeque<(Box<GenerateRequest>, Instant)>,
    draining: Vec<Draining>,
    /// Prompts whose rows were taken by others.
    saved: PromptCache,
    publisher: Publisher,
    /// Tokens a sequence guesses ahead per pass when its request does not say (0: off).
    draft_tokens: usize,
    /// What a token more in a pass costs (how likely a guess must be kept to be fed).
    pass_cost: PassCost,
}

impl Scheduler {
    pub fn new(
        model: Model,
        cache: KvCache,
        tokenizer: Arc<GgufTokenizer>,
        slot_count: Slots,
        shared: Arc<Shared>,
        settings: &EngineSettings,
    ) -> Self {
        let slots = slot_count.capacity();
        Self {
            model,
            cache,
            tokenizer,
            slots,
            slot_count,
            embed_waiting: VecDeque::new(),
            embedding: Vec::new(),
            shared,
            running: Vec::with_capacity(slots),
            prefilling: Vec::with_capacity(slots),
            step: StepBudget::new(
                settings.step_prompt_tokens,
                Duration::from_millis(settings.step_ms),
                Duration::from_millis(settings.step_prompt_ms),
            ),
            free: (0..slots)
                .map(|row| FreeRow {
                    row,
                    cached: Vec::new(),
                })
                .collect(),
            waiting: VecDeque::new(),
            draining: Vec::new(),
            saved: PromptCache::new(settings.prompt_cache_bytes),
            publisher: Publisher::default(),
            draft_tokens: settings.draft_tokens,
            pass_cost: PassCost::default(),
        }
    }

    pub fn run(mut self, rx: Receiver<Command>) {
        let _guard = AliveGuard(self.shared.clone());
        let mut governor = Governor::new(crate::cpu_parallel::current_workers());
        loop {
            if self.running.is_empty()
                && self.prefilling.is_empty()
                && self.waiting.is_empty()
                && self.draining.is_empty()
                && self.embedding.is_empty()
                && self.embed_waiting.is_empty()
            {
                match rx.recv() {
                    Ok(cmd) => self.accept(cmd),
                    Err(_) => return,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(cmd) => self.accept(cmd),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        if self.running.is_empty()
                            && self.prefilling.is_empty()
                            && self.waiting.is_empty()
                            && self.embedding.is_empty()
                        {
                            return;
                        }
                        break;
                    }
                }
            }
            self.flush_draining();
            self.retire_cancelled();
            if !self.step() {
                // every running sequence waits for its receiver: do not spin
                std::thread::sleep(Duration::from_millis(1));
            }
            self.publish_held();
            governor.after_step();
        }
    }

    fn accept(&mut self, cmd: Command) {
        match cmd {
            Command::Submit(req, at) => self.waiting.push_back((req, at)),
            Command::Embed(req) => self.embed_waiting.push_back(req),
        }
    }

    /// Publishes what the rows and the prompt cache hold when that changed: the running
    /// sequences' prompts, the prompts going through so far, the free rows' (most recently
    /// freed first), then the prompt cache's entries.
    fn publish_held(&mut self) {
        let mut rows = Vec::with_capacity(self.slots);
        rows.extend(
            self.running
                .iter()
                .map(|s| (s.row, s.req.prompt_tokens.len())),
        );
        rows.extend(self.prefilling.iter().map(|p| (p.row, p.done)));
        rows.extend(self.free.iter().map(|f| (f.row, f.cached.len())));
        if !self.publisher.changed(rows, self.saved.generation()) {
            return;
        }
        let running = self.running.iter().map(|s| s.req.prompt_tokens.as_slice());
        let prefilling = self
            .prefilling
            .iter()
            .map(|p| &p.req.prompt_tokens[..p.done]);
        let free = self.free.iter().rev().map(|f| f.cached.as_slice());
        self.shared.held.set(CachedPrefixes::of(
            running
                .chain(prefilling)
                .chain(free)
                .chain(self.saved.sequences()),
        ));
    }

    fn flush_draining(&mut self) {
        self.draining
            .retain_mut(|d| flush(&mut d.backlog, &d.events) && !d.backlog.is_empty());
    }

    /// Removes the running sequence `i` (the last one takes its index); its row becomes free
    /// and keeps the sequence's prompt as a reusable prefix.
    fn remove_row(&mut self, i: usize, final_event: Option<SeqEvent>) {
        let mut seq = self.running.swap_remove(i);
        // only prompt positions: their keys and values are computed the way a later prompt
        // with the same prefix would compute them (generated tokens use decode arithmetic)
        let kept = seq.req.prompt_tokens.len().min(seq.pos);
        self.free.push(FreeRow {
            row: seq.row,
            cached: seq.req.prompt_tokens[..kept].to_vec(),
        });
        // free the slot before the final event goes out: whoever receives it may submit at once
        seq.req.permit.release();
        if let Some(ev) = final_event {
            seq.backlog.push_back(ev);
        }
        if flush(&mut seq.backlog, &seq.req.events) && !seq.backlog.is_empty() {
            self.draining.push(Draining {
                events: seq.req.events,
                backlog: seq.backlog,
            });
        }
    }

    /// Picks a free row for `prompt` (see `choose_row`) and returns it with the number of
    /// prompt tokens it holds ready.
    fn take_row(&mut self, prompt: &[u32]) -> Option<(usize, usize)> {
        let (pick, _) = self.choose_row(prompt)?;
        Some(self.take_chosen(pick, prompt))
    }

    /// Removes free-list entry `pick` (from `choose_row`) and readies its row for `prompt`:
    /// the part of the row's cached prompt that `prompt` would overwrite is saved to the
    /// prompt cache first, then a longer prefix from the prompt cache (if one is saved) is
    /// copied in. Returns the row and the number of prompt tokens it now holds (at most all
    /// but the last: that one is run for its logits).
    fn take_chosen(&mut self, pick: usize, prompt: &[u32]) -> (usize, usize) {
        let FreeRow { row, cached } = self.free.remove(pick);
        let kept = common_prefix(&cached, prompt);
        if kept < cached.len() {
            self.save_row(row, &cached);
        }
        let most = prompt.len().saturating_sub(1);
        let mut reuse = kept.min(most);
        if let Some((entry, lcp)) = self.saved.best(prompt, reuse) {
            let lcp = lcp.min(most);
            if lcp > reuse {
                match self.cache.write_prefix(row, &entry.kv, lcp) {
                    Ok(()) => reuse = lcp,
                    // positions past `reuse` are prefilled again, whatever was written
                    Err(e) => tracing::warn!(error = %e, "prompt cache restore failed"),
                }
            }
        }
        // a running sequence's row may hold more of it (the same prompt, sent n times)
        let running = self
            .running
            .iter()
            .map(|s| {
                (
                    s.row,
                    common_prefix(&s.tokens[..s.pos.min(s.tokens.len())], prompt),
                )
            })
            .max_by_key(|&(_, lcp)| lcp);
        if let Some((src, lcp)) = running {
            let lcp = lcp.min(most);
            if lcp > reuse {
                let copied = self
                    .cache
                    .read_prefix(src, lcp)
                    .and_then(|kv| self.cache.write_prefix(row, &kv, lcp));
                match copied {
                    Ok(()) => reuse = lcp,
                    Err(e) => tracing::warn!(error = %e, "shared prefix copy failed"),
                }
            }
        }
        self.shared
            .reused_tokens
            .fetch_add(reuse as u64, Ordering::Relaxed);
        self.shared
            .prompt_tokens
            .fetch_add(prompt.len() as u64, Ordering::Relaxed);
        (row, reuse)
    }

    /// Whether `prompt` shares at least `SHARE_AFTER_PREFILL` tokens with a prompt going
    /// through now, beyond anything a free row or the prompt cache holds: it then waits for
    /// that prefill and copies its keys and values (n answers to one prompt share its prefill).
    fn better_after_a_prefill(&self, prompt: &[u32]) -> bool {
        let shared = self
            .prefilling
            .iter()
            .map(|p| common_prefix(&p.req.prompt_tokens, prompt))
            .max()
            .unwrap_or(0);
        if shared < SHARE_AFTER_PREFILL {
            return false;
        }
        let ready = self.choose_row(prompt).map_or(0, |(_, ready)| ready);
        shared > ready + SHARE_AFTER_PREFILL / 2
    }

    /// Saves the keys and values of `tokens` (positions `0..len` of `row`) to the prompt
    /// cache, unless it already holds them.
    fn save_row(&mut self, row: usize, tokens: &[u32]) {
        if !self.saved.wants(
            tokens,
            KvCache::bytes(&self.model.hp, 1, tokens.len(), self.cache.kv_type()),
        ) {
            return;
        }
        let began = Instant::now();
        match self.cache.read_prefix(row, tokens.len()) {
            Ok(kv) => {
                tracing::debug!(
                    tokens = tokens.len(),
                    us = began.elapsed().as_micros() as u64,
                    "prompt saved"
                );
                self.saved.insert(Entry {
                    tokens: tokens.to_vec(),
                    kv,
                });
                self.shared
                    .prompt_cache_bytes
                    .store(self.saved.bytes(), Ordering::Relaxed);
            }
            Err(e) => tracing::warn!(error = %e, "prompt cache save failed"),
        }
    }

    /// The free-list index to take for `prompt`, and the prompt tokens that would not need
    /// computing. The row with the longest common prefix wins when that prefix covers at
    /// least half the prompt; otherwise the least recently freed row is taken (keeping the
    /// others' prompts for the requests they fit, as llama.cpp's slot similarity rule does)
    /// — its common prefix, say a shared system prompt, is still reused, and so is a longer
    /// prefix from the prompt cache.
    fn choose_row(&self, prompt: &[u32]) -> Option<(usize, usize)> {
        let lcps: Vec<usize> = self
            .free
            .iter()
            .map(|f| common_prefix(&f.cached, prompt))
            .collect();
        let (best, best_lcp) = lcps.iter().copied().enumerate().fold(
            None,
            |acc: Option<(usize, usize)>, (k, l)| match acc {
                Some((_, bl)) if bl >= l => acc,
                _ => Some((k, l)),
            },
        )?;
        let pick = if 2 * best_lcp >= prompt.len() {
            best
        } else {
            0
        };
        let ready = lcps[pick].max(self.saved.longest(prompt));
        Some((pick, ready.min(prompt.len().saturating_sub(1))))
    }

    fn finish_event(
        seq: &Running,
        reason: FinishReason,
        stop_sequence: Option<String>,
    ) -> SeqEvent {
        SeqEvent::Done(Finish {
            reason,
            stop_sequence,
            prompt_tokens: seq.req.prompt_tokens.len(),
            cached_tokens: seq.cached,
            tokens_out: seq.generated,
            prefill_ms: seq.prefill_ms,
            decode_ms: seq.first_token.elapsed().as_millis() as u64,
            guessed_tokens: seq.draft.as_ref().map_or(0, NgramDraft::guessed),
            guesses_kept: seq.draft.as_ref().map_or(0, NgramDraft::kept),
        })
    }

    fn retire_cancelled(&mut self) {
        let mut i = 0;
        while i < self.running.len() {
            let seq = &mut self.running[i];
            let gone = !flush(&mut seq.backlog, &seq.req.events);
            if gone || seq.req.cancel.is_cancelled() {
                // a cancelled sequence emits nothing more: drop what was not delivered
                seq.backlog.clear();
                let ev = Self::finish_event(seq, FinishReason::Cancelled, None);
                self.remove_row(i, Some(ev));
            } else {
                i += 1;
            }
        }
        let mut k = 0;
        while k < self.prefilling.len() {
            let p = &self.prefilling[k];
            if p.req.cancel.is_cancelled() || p.req.events.is_closed() {
                let p = self.prefilling.remove(k);
                // the prompt positions computed so far stay reusable
                self.free.push(FreeRow {
                    row: p.row,
                    cached: p.req.prompt_tokens[..p.done].to_vec(),
                });
                let mut req = p.req;
                Self::cancel_unstarted(&mut req);
            } else {
                k += 1;
            }
        }
        self.waiting.retain_mut(|(req, _)| {
            if req.cancel.is_cancelled() || req.events.is_closed() {
                Self::cancel_unstarted(req);
                false
            } else {
                true
            }
        });
        let mut k = 0;
        while k < self.embedding.len() {
            let r = &self.embedding[k];
            if r.req.cancel.is_cancelled() || r.req.reply.is_closed() {
                let run = self.embedding.remove(k);
                self.free_rows(run.held_rows());
                run.end(Some(PortError::Dead("the job was cancelled".into())));
            } else {
                k += 1;
            }
        }
        self.embed_waiting
            .retain(|r| !(r.cancel.is_cancelled() || r.reply.is_closed()));
    }

    /// Rows an embedding job left mid-input: nothing in them is reusable.
    fn free_rows(&mut self, rows: Vec<usize>) {
        for row in rows {
            self.free.push(FreeRow {
                row,
                cached: Vec::new(),
            });
        }
    }

    /// The oldest free row for an embedding input, which is computed from its first token
    /// (every token's hidden state is pooled): a prompt the row held goes to the prompt cache
    /// first.
    fn take_plain_row(&mut self) -> Option<usize> {
        if self.free.is_empty() {
            return None;
        }
        let FreeRow { row, cached } = self.free.remove(0);
        if !cached.is_empty() {
            self.save_row(row, &cached);
        }
        Some(row)
    }

    /// Rows for embedding jobs: a waiting job's own, then rows of slots nobody holds for
    /// inputs no row runs yet (borrowed from the engine's count, so they show as taken).
    fn start_embedding(&mut self) {
        let width = self.model.width();
        let busy = |s: &Self| {
            s.running.len()
                + s.prefilling.len()
                + s.embedding.iter().map(|r| r.rows.len()).sum::<usize>()
        };
        while busy(self) < self.slots && !self.embed_waiting.is_empty() {
            let Some(row) = self.take_plain_row() else {
                break;
            };
            if let Some(req) = self.embed_waiting.pop_front() {
                let mut run = EmbedRun::new(*req, width);
                run.start(row, None);
                self.embedding.push(run);
            }
        }
        for k in 0..self.embedding.len() {
            while self.embedding[k].unstarted() > 0 && busy(self) < self.slots {
                let Some(permit) = self.slot_count.try_acquire() else {
                    return;
                };
                let Some(row) = self.take_plain_row() else {
                    return;
                };
                self.embedding[k].start(row, Some(permit));
            }
        }
    }

    /// Ends a sequence that had not produced a token: its slot back, then `Cancelled`.
    fn cancel_unstarted(req: &mut GenerateRequest) {
        req.permit.release();
        let _ = req.events.try_send(SeqEvent::Done(Finish {
            reason: FinishReason::Cancelled,
            stop_sequence: None,
            prompt_tokens: req.prompt_tokens.len(),
            cached_tokens: 0,
            tokens_out: 0,
            prefill_ms: 0,
            decode_ms: 0,
            guessed_tokens: 0,
            guesses_kept: 0,
        }));
    }

    /// Starts the sequence `req` in the next row from the logits of its prompt's last token.
    fn start_running(
        &mut self,
        req: GenerateRequest,
        row: usize,
        submitted: Instant,
        cached: usize,
        mut logits: Vec<f32>,
    ) {
        let mut req = req;
        let mut sampler = Sampler::new(req.sampling.clone());
        let prompt = std::mem::take(&mut req.prompt_tokens);
        let (first, logprobs, failed) = match pick(
            &mut sampler,
            &mut req,
            &mut logits,
            &prompt,
            &self.tokenizer,
        ) {
            Ok((t, lp)) => (t, lp, None),
            Err(e) => (0, None, Some(e)),
        };
        req.prompt_tokens = prompt;
        let pos = req.prompt_tokens.len();
        let mut tokens = Vec::with_capacity(pos + req.max_tokens);
        tokens.extend_from_slice(&req.prompt_tokens);
        // a grammar's matcher moves token by token and cannot take back a guess: constrained
        // sequences do not guess
        let draft = NgramDraft::new(req.sampling.draft_tokens.unwrap_or(self.draft_tokens))
            .filter(|_| req.constraint.is_none());
        self.running.push(Running {
            row,
            sampler,
            text: TextStream::new(req.stop.clone()),
            tokens,
            pos,
            next: first,
            generated: 0,
            backlog: VecDeque::new(),
            first_token: Instant::now(),
            prefill_ms: submitted.elapsed().as_millis() as u64,
            cached,
            failed,
            logprobs,
            draft,
            verify: None,
            req,
        });
    }

    fn fail_waiting(&mut self, req: &mut GenerateRequest, row: usize, e: &EngineError) {
        // the row's contents are unknown after a failed pass: nothing is reusable
        self.free.push(FreeRow {
            row,
            cached: Vec::new(),
        });
        req.permit.release();
        let _ = req.events.try_send(SeqEvent::Failed(e.to_string()));
    }

    /// Handles the freshly sampled `next` token of row `i`: emit it, check the end conditions.
    ///
    /// Every generated token except an end-of-sequence token with nothing left to show yields
    /// exactly one `Token` event, so `tokens_out` equals the number of `Token` events. Text held
    /// back (a possible stop prefix, a partial character) is released with the last token.
    /// Returns whether the sequence goes on (else it left `running`, the last taking `i`).
    fn accept_token(&mut self, i: usize) -> bool {
        let tok = self.running[i].next;
        let ctx = self.model.ctx();
        let seq = &mut self.running[i];
        if seq.req.cancel.is_cancelled() {
            seq.backlog.clear();
            let ev = Self::finish_event(seq, FinishReason::Cancelled, None);
            self.remove_row(i, Some(ev));
            return false;
        }
        if let Some(why) = seq.failed.take() {
            flush(&mut seq.backlog, &seq.req.events);
            let ev = constraint_failed(&seq.req, why);
            self.remove_row(i, Some(ev));
            return false;
        }
        if self.tokenizer.is_stop(tok) {
            let tail = seq.text.finish();
            if !tail.is_empty() {
                let index = seq.generated;
                seq.generated += 1;
                seq.backlog.push_back(SeqEvent::Token {
                    text: tail,
                    index,
                    id: Some(tok),
                    logprobs: seq.logprobs.take(),
                });
            }
            let ev = Self::finish_event(seq, FinishReason::Stop, None);
            self.remove_row(i, Some(ev));
            return false;
        }
        seq.sampler.observe(tok);
        // the grammar moves past the token; complete, the sequence ends (its mask would allow
        // nothing but the end)
        let mut grammar_done = false;
        if let Some(c) = seq.req.constraint.as_mut() {
            if let Err(why) = c.consume(tok) {
                flush(&mut seq.backlog, &seq.req.events);
                let ev = constraint_failed(&seq.req, why);
                self.remove_row(i, Some(ev));
                return false;
            }
            grammar_done = c.is_done();
        }
        let pushed = seq.text.push(self.tokenizer.token_bytes(tok));
        let index = seq.generated;
        seq.generated += 1;
        seq.tokens.push(tok);
        let out_of_room = seq.generated >= seq.req.max_tokens || seq.pos >= ctx;
        let stop_sequence = pushed.stopped;
        let finish = if stop_sequence.is_some() || grammar_done {
            Some(FinishReason::Stop)
        } else if out_of_room {
            Some(FinishReason::Length)
        } else {
            None
        };
        let mut text = pushed.text;
        // the end of the budget or of the grammar: what was held back (a possible stop
        // sequence's start) is text after all
        if finish == Some(FinishReason::Length) || (grammar_done && stop_sequence.is_none()) {
            text.push_str(&seq.text.finish());
        }
        push_event(
            &mut seq.backlog,
            &seq.req.events,
            SeqEvent::Token {
                text,
                index,
                id: Some(tok),
                logprobs: seq.logprobs.take(),
            },
        );
        if let Some(reason) = finish {
            let ev = Self::finish_event(seq, reason, stop_sequence);
            self.remove_row(i, Some(ev));
            return false;
        }
        true
    }

    /// Accepts row `i`'s freshly sampled token, then, while the guess fed after it in the last
    /// pass equals it, picks the next token from the logits that followed the guess and accepts
    /// that too — what one pass per token would have given, with the keys and values already
    /// in the row. The first guess that differs ends it (its position is written again by the
    /// next pass); the sequence's guessing learns how many were kept.
    fn accept_tokens(&mut self, i: usize) {
        if !self.accept_token(i) {
            return;
        }
        let Some(mut v) = self.running[i].verify.take() else {
            return;
        };
        if let Some(d) = self.running[i].draft.as_mut() {
            d.fed(v.drafts.len());
        }
        while v.at < v.drafts.len() && self.running[i].next == v.drafts[v.at] {
            let seq = &mut self.running[i];
            if let Some(d) = seq.draft.as_mut() {
                d.kept_one();
            }
            seq.pos += 1;
            v.at += 1;
            let row = &mut v.logits[v.at * v.vocab..(v.at + 1) * v.vocab];
            seq.pick_next(row, &self.tokenizer);
            if !self.accept_token(i) {
                return;
            }
        }
        if let Some(d) = self.running[i].draft.as_mut() {
            d.learn(v.drafts.len(), v.at);
        }
    }

    /// The hidden states of the embedding rows of a pass: pooled into their inputs; rows
    /// without an input left go back to the free list, finished jobs are answered.
    fn absorb_embedding(&mut self, chunks: &[((usize, usize), usize)], hidden: Vec<Vec<f32>>) {
        // highest row first: a row leaving its job never moves one not yet visited
        for (&((j, k), n), h) in chunks.iter().zip(hidden).rev() {
            if let After::Free { row, cached } = self.embedding[j].absorb(k, n, &h) {
                self.free.push(FreeRow { row, cached });
            }
        }
        let mut j = self.embedding.len();
        while j > 0 {
            j -= 1;
            if self.embedding[j].is_done() {
                self.embedding.remove(j).end(None);
            }
        }
    }

    /// One forward pass: every running sequence that can take its next token feeds it, and
    /// the prompts being computed feed their next chunks — within `step_prompt_tokens` while
    /// any sequence decodes (its next token waits for the whole pass), else a whole chunk.
    /// Returns false when nothing could run.
    fn step(&mut self) -> bool {
        // free rows go to waiting sequences, in order: their prompts start going through
        while self.running.len() + self.prefilling.len() < self.slots {
            let Some((req, submitted)) = self.waiting.pop_front() else {
                break;
            };
            if self.better_after_a_prefill(&req.prompt_tokens) {
                // the same prompt (or a long part of it) is going through now: wait for it
                // and copy its keys and values rather than compute them again
                self.waiting.push_front((req, submitted));
                break;
            }
            let Some((row, reuse)) = self.take_row(&req.prompt_tokens) else {
                self.waiting.push_front((req, submitted));
                break;
            };
            self.prefilling.push(Prefilling {
                req,
                submitted,
                row,
                done: reuse,
                cached: reuse,
            });
        }
        self.start_embedding();
        let decoding: Vec<usize> = (0..self.running.len())
            .filter(|&i| self.running[i].backlog.is_empty())
            .collect();
        // the embedding rows, after the prompts: (job, row of the job)
        let embed_rows: Vec<(usize, usize)> = self
            .embedding
            .iter()
            .enumerate()
            .flat_map(|(j, r)| (0..r.rows.len()).map(move |k| (j, k)))
            .collect();
        // tokens this pass of each prompt, then of each embedding row (in that order: the
        // budget runs out for the last first)
        let mut all_chunks = self.step.chunks(
            !decoding.is_empty(),
            self.prefilling
                .iter()
                .map(|p| (p.done, p.req.prompt_tokens.len() - p.done))
                .chain(embed_rows.iter().map(|&(j, k)| {
                    (
                        self.embedding[j].rows[k].done,
                        self.embedding[j].left(k).len(),
                    )
                })),
        );
        let embed_chunks: Vec<((usize, usize), usize)> = if all_chunks.len() > self.prefilling.len()
        {
            all_chunks
                .split_off(self.prefilling.len())
                .into_iter()
                .zip(embed_rows.iter().copied())
                .map(|(n, at)| (at, n))
                .collect()
        } else {
            Vec::new()
        };
        // (prefilling index, tokens this pass)
        let chunks: Vec<(usize, usize)> = all_chunks.into_iter().enumerate().collect();
        if decoding.is_empty() && chunks.is_empty() && embed_chunks.is_empty() {
            return self.running.is_empty()
                && (!self.draining.is_empty() || !self.waiting.is_empty());
        }
        // each decoding sequence's next token, then the tokens it guesses follow it — as far
        // as a guess is likely enough to be kept for what a token costs in this pass
        let ctx = self.model.ctx();
        let prompt_chunk: usize = chunks.iter().map(|&(_, n)| n).sum::<usize>()
            + embed_chunks.iter().map(|&(_, n)| n).sum::<usize>();
        let chance_needed = self.pass_cost.chance_needed(decoding.len() + prompt_chunk);
        let nexts: Vec<Vec<u32>> = decoding
            .iter()
            .map(|&i| {
                let seq = &self.running[i];
                let mut t = vec![seq.next];
                if let Some(d) = &seq.draft {
                    // a guess kept is one more token out: no more than the budget has left,
                    // and every position inside the context
                    let room = (seq.req.max_tokens.saturating_sub(seq.generated))
                        .min(ctx.saturating_sub(seq.pos))
                        .saturating_sub(1);
                    t.extend(d.propose(&seq.tokens, room, chance_needed));
                }
                t
            })
            .collect();
        let mut segs: Vec<Segment<'_>> = decoding
            .iter()
            .zip(&nexts)
            .map(|(&i, t)| Segment {
                row: self.running[i].row,
                tokens: t,
                start: self.running[i].pos,
                prompt: false,
                prompt_end: self.running[i].pos + t.len(),
                hidden: false,
                all_logits: t.len() > 1,
            })
            .collect();
        for &(k, n) in &chunks {
            let p = &self.prefilling[k];
            segs.push(Segment {
                row: p.row,
                tokens: &p.req.prompt_tokens[p.done..p.done + n],
                start: p.done,
                prompt: true,
                prompt_end: p.req.prompt_tokens.len(),
                hidden: false,
                all_logits: false,
            });
        }
        for &((j, k), n) in &embed_chunks {
            let r = &self.embedding[j];
            let left = r.left(k);
            segs.push(Segment {
                row: r.rows[k].row,
                tokens: &left[..n],
                start: r.rows[k].done,
                prompt: true,
                prompt_end: r.rows[k].done + left.len(),
                hidden: true,
                all_logits: false,
            });
        }
        let began = Instant::now();
        let result = self.model.forward(&self.cache, &segs);
        drop(segs);
        let took = began.elapsed();
        let prompt_tokens: usize = chunks.iter().map(|&(_, n)| n).sum::<usize>()
            + embed_chunks.iter().map(|&(_, n)| n).sum::<usize>();
        tracing::trace!(
            decode = decoding.len(),
            prompt_tokens,
            us = took.as_micros() as u64,
            "pass"
        );
        if !decoding.is_empty() {
            self.step.observe(prompt_tokens, took);
            if prompt_tokens == 0 {
                let tokens = nexts.iter().map(Vec::len).sum();
                self.pass_cost.observe(tokens, took.as_secs_f64());
            }
        }
        let mut logits = match result {
            Ok(l) => l,
            Err(e) => {
                let msg = e.to_string();
                tracing::error!(error = %msg, "forward pass failed");
                // the sequences of this pass: their rows hold unknown contents
                for &(k, _) in chunks.iter().rev() {
                    let mut p = self.prefilling.remove(k);
                    self.fail_waiting(&mut p.req, p.row, &e);
                }
                let mut failed: Vec<usize> = embed_chunks.iter().map(|&((j, _), _)| j).collect();
                failed.dedup();
                for j in failed.into_iter().rev() {
                    let run = self.embedding.remove(j);
                    self.free_rows(run.held_rows());
                    run.end(Some(PortError::Load(format!(
                        "a forward pass failed: {msg}"
                    ))));
                }
                while !self.running.is_empty() {
                    let i = self.running.len() - 1;
                    self.remove_row(i, Some(SeqEvent::Failed(msg.clone())));
                }
                return true;
            }
        };
        let mut prompt_logits = logits.split_off(decoding.len());
        let hidden = prompt_logits.split_off(chunks.len());
        self.absorb_embedding(&embed_chunks, hidden);
        for ((i, row), fed) in decoding.iter().zip(logits).zip(&nexts) {
            let seq = &mut self.running[*i];
            seq.pos += 1;
            let mut row = row;
            if fed.len() > 1 {
                // the logits after the token, then after each guess: the first picks now,
                // the others as the guesses before them are kept
                let vocab = row.len() / fed.len();
                seq.pick_next(&mut row[..vocab], &self.tokenizer);
                seq.verify = Some(Verify {
                    drafts: fed[1..].to_vec(),
                    logits: row,
                    vocab,
                    at: 0,
                });
            } else {
                seq.pick_next(&mut row, &self.tokenizer);
            }
        }
        // prompts whose last chunk went through start from its logits, in arrival order
        let mut complete = Vec::new();
        for (&(k, n), l) in chunks.iter().zip(prompt_logits) {
            let p = &mut self.prefilling[k];
            p.done += n;
            if p.done == p.req.prompt_tokens.len() {
                complete.push((k, l));
            }
        }
        let mut starting = Vec::with_capacity(complete.len());
        for (k, l) in complete.into_iter().rev() {
            starting.push((self.prefilling.remove(k), l));
        }
        let base = self.running.len();
        for (p, l) in starting.into_iter().rev() {
            self.start_running(*p.req, p.row, p.submitted, p.cached, l);
        }
        // every sampled row, highest first, so removals never move an unvisited row
        let mut sampled: Vec<usize> = decoding;
        sampled.extend(base..self.running.len());
        for &i in sampled.iter().rev() {
            if i < self.running.len() {
                self.accept_tokens(i);
            }
        }
        true
    }
}
