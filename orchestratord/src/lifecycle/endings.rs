//! How a task ends — completed, failed, cancelled, or put back in line after its remote
//! worker was lost — and what every ending does after it (the queue, the record, the
//! session's refund, the dispatcher woken). The lifecycle is the one owner of endings: the
//! runner, the dispatcher, the adapters and remote workers all end a task through these.

use std::sync::Arc;
use std::time::Instant;

use contracts::worker::{CancelReason as WireCancel, MAX_REQUEUE_COUNT};
use contracts::{ErrorCode, SseError};

use crate::lifecycle::state::Lifecycle;
use crate::lifecycle::task::{Task, TaskEvent};
use crate::metrics::{self, CancelReason};

impl Lifecycle {
    /// What every ending does after the task's own state changed.
    fn after_end(&self, task: &Task) {
        self.queue.remove(task);
        // a run for the cluster leaves its record to the replicas following the task (theirs
        // has every event its clients saw); theirs goes where every replica can read it
        if !task.is_run_for_cluster() {
            let record = task.record();
            if task.is_relayed() {
                if let Some(path) = self.cluster_tasks.get() {
                    path.record_ended(&task.owner, record.clone());
                }
            }
            self.records.task_ended(&task.owner, record);
        }
        if let Some(ticket) = task.quota_ticket {
            // what it was served: its prompt once placed, and what it generated
            let g = task.lock();
            let served = if g.placed_at.is_some() {
                (task.prompt_tokens + g.tokens_out as usize) as u64
            } else {
                0
            };
            drop(g);
            self.quotas.settle(&task.owner, ticket, served);
        }
        if let Some(sid) = &task.session_id {
            let g = task.lock();
            let refund = (task.spec.max_tokens as u64).saturating_sub(g.tokens_out as u64);
            let time = match (g.first_token_at, g.ended_at) {
                (Some(a), Some(b)) => (b - a).as_millis() as u64,
                _ => 0,
            };
            drop(g);
            self.sessions.settle(&task.owner, sid, refund, time);
        }
        self.wake.notify_one();
    }

    /// Cancels a queued or running task. After this returns, the task emits no more tokens.
    /// False if it had already ended.
    pub fn cancel_task(&self, task: &Task, reason: CancelReason) -> bool {
        task.stop_cause.set(WireCancel::ClientDisconnect);
        if !task.finish("cancelled", None) {
            return false;
        }
        metrics::cancelled(reason);
        metrics::finished("cancelled");
        tracing::info!(task_id = %task.id, ?reason, "task cancelled");
        self.after_end(task);
        true
    }

    /// Stops a run begun before its task was known to be this replica's to run (a cluster
    /// admission's early start, CLU-PATH-2): nobody asked for it, so it counts as no cancel
    /// and no ending; its slot is given back when its engine run stops. False if it had
    /// already ended.
    pub fn withdraw_run(&self, task: &Task) -> bool {
        task.stop_cause.set(WireCancel::ClientDisconnect);
        if !task.finish("cancelled", None) {
            return false;
        }
        tracing::info!(task_id = %task.id, "cluster: an early run withdrawn");
        self.after_end(task);
        true
    }

    /// Ends an embedding task with its vectors. False if it had already ended.
    pub fn complete_embedded(&self, task: &Task, vectors: contracts::EmbedVectors) -> bool {
        if !task.finish_embedded(vectors) {
            return false;
        }
        metrics::finished("stop");
        tracing::info!(task_id = %task.id, "embedding task ended");
        self.after_end(task);
        true
    }

    /// Ends a task with `end` (`stop` or `length`). False if it had already ended.
    pub fn complete_task(
        &self,
        task: &Task,
        finish_reason: &'static str,
        stop_sequence: Option<String>,
    ) -> bool {
        if !task.finish(finish_reason, stop_sequence) {
            return false;
        }
        metrics::finished(finish_reason);
        tracing::info!(task_id = %task.id, finish_reason, "task ended");
        self.after_end(task);
        true
    }

    /// Ends a task this replica follows while another runs it, with the terminal event the
    /// other wrote to the relay `at`. False if it had already ended (or `ev` ends nothing).
    pub fn end_relayed(&self, task: &Task, ev: TaskEvent, at: Instant) -> bool {
        match ev {
            TaskEvent::End(e) => {
                let outcome = match e.finish_reason.as_str() {
                    "cancelled" => "cancelled",
                    "length" => "length",
                    _ => "stop",
                };
                if !task.finish_relayed(e, at) {
                    return false;
                }
                if outcome == "cancelled" {
                    task.stop_cause.set(WireCancel::ClientDisconnect);
                    metrics::cancelled(CancelReason::Client);
                }
                metrics::finished(outcome);
                self.after_end(task);
                true
            }
            TaskEvent::Error(e) => self.end_with_error(task, e, at),
            _ => false,
        }
    }

    /// Ends a task with an `error` event. False if it had already ended.
    pub fn fail_task(
        &self,
        task: &Task,
        code: ErrorCode,
        message: impl Into<String>,
        retriable: bool,
        retry_after_ms: Option<u64>,
    ) -> bool {
        self.end_with_error(
            task,
            SseError {
                code,
                message: message.into(),
                retriable,
                retry_after_ms,
                field: None,
            },
            Instant::now(),
        )
    }

    /// Ends a task with an `INVALID_PARAMS` error naming the request field at fault (a remote
    /// backend refused it). False if it had already ended.
    pub fn refuse_task(&self, task: &Task, field: String, message: String) -> bool {
        self.end_with_error(
            task,
            SseError {
                code: ErrorCode::InvalidParams,
                message,
                retriable: false,
                retry_after_ms: None,
                field: Some(field),
            },
            Instant::now(),
        )
    }

    fn end_with_error(&self, task: &Task, error: SseError, at: Instant) -> bool {
        let (code, message) = (error.code, error.message.clone());
        task.stop_cause.set(match code {
            ErrorCode::DecodeTimeout | ErrorCode::DeadlineUnmet | ErrorCode::QueueTimeout => {
                WireCancel::Timeout
            }
            ErrorCode::ShuttingDown => WireCancel::ServerShutdown,
            ErrorCode::PoolUnready => WireCancel::GracefulShutdown,
            ErrorCode::ReplicaExhausted => WireCancel::RequeueExhausted,
            _ => WireCancel::ClientDisconnect,
        });
        if !task.fail_at(error, at) {
            return false;
        }
        metrics::error(code);
        metrics::finished("error");
        tracing::warn!(task_id = %task.id, code = code.as_str(), %message, "task failed");
        self.after_end(task);
        true
    }

    /// A running task whose remote worker was lost goes back to the front of the queue,
    /// keeping its turn; past `MAX_REQUEUE_COUNT` requeues it ends `REPLICA_EXHAUSTED` (the
    /// seed's cancel reason `requeue_exhausted`).
    pub fn requeue_lost(&self, task: &Arc<Task>, why: &str) {
        let Some(n) = task.back_to_queue() else {
            return;
        };
        if n > MAX_REQUEUE_COUNT {
            self.fail_task(
                task,
                ErrorCode::ReplicaExhausted,
                format!(
                    "requeue attempts exhausted ({MAX_REQUEUE_COUNT}): {why} (requeue_exhausted)"
                ),
                true,
                Some(1000),
            );
            return;
        }
        metrics::requeued();
        tracing::warn!(task_id = %task.id, requeues = n, %why, "worker lost: task requeued");
        self.queue.push_front(task.clone());
        self.wake.notify_one();
    }
}
