//! Runs one placed task on its slot: engine events in, task events out, with cancel, drain
//! deadline, wall-clock, idle and task deadline checks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use contracts::{ErrorCode, SseMetrics};
use pool_manager::{
    EngineJob, FailureNote, FinishReason, OnLoss, PortError, SeqEvent, ServiceSample, SlotLease,
};
use tokio::sync::mpsc::Receiver;

use crate::lifecycle::eta;
use crate::lifecycle::state::SharedLifecycle;
use crate::lifecycle::task::Task;
use crate::metrics;

enum Outcome {
    Finished(usize),
    Ended,
    /// The engine's channel closed without a terminal event (engine died, worker lost).
    Lost,
}

pub async fn run(state: SharedLifecycle, task: Arc<Task>, mut lease: SlotLease) {
    let pool = lease.pool().clone();
    let engine = lease.engine.clone();
    let desc = engine.descriptor();
    // a lost engine whose tasks go on elsewhere (a remote worker's)
    let remote = desc.on_loss == OnLoss::ContinueElsewhere;
    if !task.mark_running(pool.id(), desc.clone()) {
        return;
    }
    let _running = state.running.enter(pool.id(), &task);
    // a run for the cluster is counted by its taker once the task is its to run (an early
    // run may be withdrawn: `cluster/run_here.rs`), its wait from its admission elsewhere
    if !task.is_run_for_cluster() {
        metrics::started(pool.id());
        let waited = task.submitted.elapsed();
        metrics::queue_wait(waited, task.priority);
        metrics::start_prediction(task.predicted_start, waited);
    }
    let placed = Instant::now();
    if task.spec.embed.is_some() {
        crate::lifecycle::embed_runner::run(&state, &task, &mut lease, placed).await;
        if !engine.is_alive() {
            pool.engine_died("the engine's thread stopped");
        }
        return;
    }
    // its own slot is one of those busy
    let alone_at_start = pool.slots_busy() <= 1;
    // a requeued task goes on after what it already streamed: no token twice, none missing
    let (continuation, produced) = task.continuation();
    let max_tokens = task.spec.max_tokens.saturating_sub(produced);
    if max_tokens == 0 {
        state.complete_task(&task, FinishReason::Length.as_str(), None);
        return;
    }
    // admission's ids serve when this engine has the model that counted them and nothing was
    // produced since; else tokenize again, off the runtime
    let counted = task
        .prompt_ids
        .as_ref()
        .filter(|p| produced == 0 && p.model_ref == desc.model_ref);
    let recounted = counted.is_none() && produced == 0;
    let tokens = match counted {
        Some(p) => Some(p.ids.as_ref().clone()),
        None => match tokenize_admitted(&state, &task, engine.clone(), &continuation).await {
            Ok(ids) => ids,
            Err(e) => {
                state.fail_task(&task, ErrorCode::InvalidParams, e.to_string(), false, None);
                return;
            }
        },
    };
    if let Some(n) = tokens.as_ref().map(Vec::len).filter(|_| recounted) {
        // admitted before its pool's engine could count it (a model loading on demand):
        // the usage reports this count, not admission's estimate
        task.set_counted_prompt_tokens(n as u32);
    }
    // a context of 0 is one the engine does not know (a remote worker's backend checks)
    if let Some(n) = tokens.as_ref().map(Vec::len).filter(|_| desc.ctx_max > 0) {
        if n + max_tokens > desc.ctx_max {
            state.fail_task(
                &task,
                ErrorCode::InvalidParams,
                format!(
                    "prompt of {n} tokens plus max_tokens {max_tokens} exceeds the context of {} tokens of pool {}",
                    desc.ctx_max,
                    pool.id()
                ),
                false,
                None,
            );
            return;
        }
    }
    let n_prompt = tokens.as_ref().map_or(task.prompt_tokens, Vec::len);
    // the tokens it reads count as served to its tenant now, those it writes as they come
    state.queue.fair().started(&task.owner, n_prompt);
    // an engine that takes text counts the prompt itself (its `Done` says how many)
    let engine_counts_prompt = tokens.is_none();
    let Some(permit) = lease.take_permit() else {
        state.fail_task(
            &task,
            ErrorCode::Internal,
            "the slot lease carried no slot",
            true,
            Some(1000),
        );
        return;
    };
    let failure = FailureNote::default();
    let job = EngineJob {
        permit,
        failure: failure.clone(),
        prompt: task.spec.prompt.clone(),
        continuation,
        prompt_tokens: tokens,
        sampling: task.spec.sampling.clone(),
        max_tokens,
        stop: task.spec.stop.clone(),
        constraint: task.spec.constraint.clone(),
        logprobs: task.spec.logprobs,
        cancel: task.cancel.clone(),
        stop_cause: task.stop_cause.clone(),
        correlation_id: task.correlation_id.clone(),
    };
    let mut rx = match engine.start(job) {
        Ok(rx) => rx,
        Err(PortError::Dead(why)) if remote => {
            drop(lease);
            state.requeue_lost(&task, &why);
            return;
        }
        Err(e) => {
            let (code, retriable) = match &e {
                PortError::InvalidInput(_) | PortError::Refused { .. } => {
                    (ErrorCode::InvalidParams, false)
                }
                PortError::Dead(_) | PortError::Load(_) | PortError::Unloadable(_) => {
                    (ErrorCode::WorkerReset, true)
                }
            };
            state.fail_task(&task, code, e.to_string(), retriable, Some(1000));
            if matches!(e, PortError::Dead(_)) {
                pool.engine_died(&e.to_string());
            }
            return;
        }
    };
    let wall_ms = if remote {
        state.cfg.workers.request_timeout_ms
    } else {
        state.cfg.timeouts.wall_ms
    };
    let watch = Watch {
        placed,
        wall_ms,
        failure: &failure,
        engine_counts_prompt,
    };
    let outcome = pump(&state, &task, &lease, &mut rx, watch).await;
    match outcome {
        Outcome::Finished(tokens_out) => {
            // the engine gave this task's slot back before its last event
            let busy = pool.slots_busy();
            let pool_was_full = busy + 1 >= pool.spec().slots;
            let ran_alone = alone_at_start && busy == 0;
            let first_token_after = task
                .lock()
                .first_token_at
                .map(|t| t.saturating_duration_since(placed));
            pool.record_service(ServiceSample {
                took: placed.elapsed(),
                first_token_after,
                prompt_tokens: n_prompt,
                tokens_out,
                max_tokens,
                pool_was_full,
                ran_alone,
            });
        }
        Outcome::Lost if remote => {
            // the worker's socket closed under the task, or the worker had no slot for it:
            // another worker (or this one, once it has room) takes it from here
            drop(lease);
            let why = match failure.get() {
                Some(PortError::Dead(why)) => why,
                _ => "the worker was lost while running the task".to_string(),
            };
            state.requeue_lost(&task, &why);
            return;
        }
        Outcome::Lost => {
            state.fail_task(
                &task,
                ErrorCode::WorkerReset,
                "the engine stopped while running the task",
                true,
                Some(1000),
            );
        }
        // the engine gives the slot back when it lets go of the sequence
        Outcome::Ended => {}
    }
    if !engine.is_alive() {
        pool.engine_died("the decode thread stopped");
    }
    drop(lease);
}

/// What the pump watches a running sequence for besides its events.
struct Watch<'a> {
    /// When the task took its slot.
    placed: Instant,
    /// The longest it may run from then.
    wall_ms: u64,
    /// How the engine says to read a `Failed` event.
    failure: &'a FailureNote,
    /// The engine counts the prompt (it took text): its `Done` has the real count.
    engine_counts_prompt: bool,
}

async fn pump(
    state: &SharedLifecycle,
    task: &Task,
    lease: &SlotLease,
    rx: &mut Receiver<SeqEvent>,
    watch: Watch<'_>,
) -> Outcome {
    let Watch {
        placed,
        wall_ms,
        failure,
        engine_counts_prompt,
    } = watch;
    let t = &state.cfg.timeouts;
    let wall = tokio::time::sleep_until((placed + Duration::from_millis(wall_ms)).into());
    tokio::pin!(wall);
    let idle = Duration::from_millis(t.idle_ms);
    // the first token comes after the prompt: a long one is not a stuck engine. Its wait is
    // the idle limit plus twice the prompt's time at the pool's measured pace for each slot
    // (the prompts of the other slots may go through first)
    let snapshot = lease.pool().snapshot();
    let prompt_ms = task.prompt_tokens as f64
        * snapshot.prefill_ms_per_token_ewma.unwrap_or(0.0)
        * 2.0
        * snapshot.slots_total.max(1) as f64;
    let allowance = if prompt_ms.is_finite() && prompt_ms > 0.0 {
        Duration::try_from_secs_f64(prompt_ms / 1000.0).unwrap_or(Duration::MAX)
    } else {
        Duration::ZERO
    };
    let first_wait = idle.saturating_add(allowance);
    let mut waited_for_first = true;
    let deadline = async {
        match task.deadline {
            Some(d) => tokio::time::sleep_until(d.into()).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let interval = Duration::from_millis(state.cfg.stream.metrics_interval_ms);
    let ms_per_token = snapshot.ms_per_token_ewma;
    loop {
        tokio::select! {
            biased;
            _ = task.cancel.cancelled() => return Outcome::Ended,
            _ = lease.drain_deadline.cancelled() => {
                lease.pool().note_cut_by_drain();
                state.fail_task(task, ErrorCode::PoolUnready,
                    "the pool was drained and its deadline passed", true, Some(1000));
                return Outcome::Ended;
            }
            _ = &mut wall => {
                state.fail_task(task, ErrorCode::DecodeTimeout,
                    format!("the task ran longer than {wall_ms} ms"), true, None);
                return Outcome::Ended;
            }
            _ = &mut deadline => {
                state.fail_task(task, ErrorCode::DeadlineUnmet,
                    "the task's deadline passed during decoding", false, None);
                return Outcome::Ended;
            }
            ev = tokio::time::timeout(if waited_for_first { first_wait } else { idle }, rx.recv()) => match ev {
                Err(_) => {
                    let waited = if waited_for_first { first_wait } else { idle };
                    state.fail_task(task, ErrorCode::DecodeTimeout,
                        format!("no token for {} ms", waited.as_millis()), true, None);
                    return Outcome::Ended;
                }
                Ok(None) => return Outcome::Lost,
                Ok(Some(SeqEvent::Token { text, logprobs, .. })) => {
                    waited_for_first = false;
                    state.queue.fair().charge(&task.owner, 1);
                    if !task.push_scored_token(text, logprobs.map(|l| wire_logprobs(*l))) {
                        return Outcome::Ended;
                    }
                    task.maybe_push_metrics(interval, |tokens_out| {
                        let remaining = task.session_id.as_deref()
                            .map(|s| state.sessions.remaining(&task.owner, s))
                            .unwrap_or_default();
                        let left = task.deadline.map(|d| d.saturating_duration_since(Instant::now()).as_millis() as u64);
                        SseMetrics {
                            queue_depth: state.queue.len() as u32,
                            on_time_probability: eta::on_time_probability(
                                left,
                                task.spec.max_tokens.saturating_sub(tokens_out as usize),
                                ms_per_token,
                            ),
                            tokens_out,
                            tokens_budget_remaining: remaining.tokens,
                            time_budget_remaining_ms: remaining.time_ms,
                        }
                    });
                }
                Ok(Some(SeqEvent::Done(f))) => {
                    let reason = f.reason.as_str();
                    // the engine counted the prompt; admission only estimated it
                    if f.prompt_tokens > 0 && engine_counts_prompt {
                        task.set_counted_prompt_tokens(f.prompt_tokens as u32);
                    }
                    task.set_cached_prompt_tokens(f.cached_tokens as u32);
                    metrics::prompt_ran(lease.pool().id(), f.prompt_tokens, f.cached_tokens);
                    metrics::guesses(lease.pool().id(), f.guessed_tokens, f.guesses_kept);
                    if f.reason == FinishReason::Cancelled {
                        // only a cancel of ours stops a sequence; the task already ended
                        return Outcome::Ended;
                    }
                    state.complete_task(task, reason, f.stop_sequence);
                    return Outcome::Finished(f.tokens_out);
                }
                Ok(Some(SeqEvent::Failed(m))) => {
                    if let Some(PortError::Refused { field, message }) = failure.get() {
                        state.refuse_task(task, field, message);
                    } else if let Some(PortError::InvalidInput(why)) = failure.get() {
                        state.fail_task(task, ErrorCode::InvalidParams, why, false, None);
                    } else {
                        state.fail_task(task, ErrorCode::Internal, format!("engine error: {m}"), true, None);
                    }
                    return Outcome::Ended;
                }
            }
        }
    }
}

/// A step's log-probabilities as the task's `token` event carries them.
fn wire_logprobs(l: pool_manager::StepLogprobs) -> contracts::SseLogprobs {
    let one = |t: pool_manager::TokenLogprob| contracts::SseTokenLogprob {
        token: String::from_utf8_lossy(&t.bytes).into_owned(),
        logprob: t.logprob,
        bytes: t.bytes,
    };
    let chosen = one(l.chosen);
    contracts::SseLogprobs {
        token: chosen.token,
        logprob: chosen.logprob,
        bytes: chosen.bytes,
        top: l.top.into_iter().map(one).collect(),
    }
}

/// The task's prompt (and `continuation`) tokenized by `engine`, on the request-work threads
/// in its tenant's turn.
async fn tokenize_admitted(
    state: &SharedLifecycle,
    task: &Arc<Task>,
    engine: Arc<dyn pool_manager::Engine>,
    continuation: &str,
) -> Result<Option<Vec<u32>>, crate::lifecycle::request_work::WorkError> {
    let (prompt, continuation) = (task.spec.prompt.clone(), continuation.to_string());
    Ok(state
        .request_work
        .run(
            crate::lifecycle::request_work::Turn::Admitted(&task.owner),
            move || engine.tokenize(&prompt, &continuation),
        )
        .await??)
}
