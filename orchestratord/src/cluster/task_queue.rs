//! The cluster's queue on JetStream (issue 38; not yet behind `POST /v1/tasks`): per pool a
//! work-queue stream with a subject per class, its bound the subject's message cap with
//! discard-new-per-subject, so the stream's Raft leader refuses the admission past the bound
//! whatever the number of replicas admitting at once. A task stays in the stream until it
//! ends (`Taken::done`): the bound counts queued and running tasks. A task's id is its
//! `Nats-Msg-Id`, so a publish retried after a lost answer is not admitted twice (within the
//! stream's duplicate window).
//!
//! Taking: every replica pulls from one durable consumer per pool and class, so each task goes
//! to one of them; the taker acknowledges progress while it works (`Taken::progress`); a taker
//! that stops (killed, stopped, cut off) loses the task to the next puller after `ack_wait`.
//! A task whose runners stopped `cluster.max_deliveries` times is taken out of the queue and
//! handed back as exhausted, for the caller to fail (`REPLICA_EXHAUSTED`): its deliveries less
//! the times it was given back untried (`given_back.rs`).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy};
use async_nats::jetstream::stream::{self, DiscardPolicy, RetentionPolicy, StorageType};
use async_nats::jetstream::{self, AckKind};
use bytes::Bytes;
use futures::StreamExt;

use super::given_back::GivenBack;
use super::subject_token::subject_token;
use super::ClusterError;
use contracts::Priority as Class;

/// The queues' stream names begin so (then the queue's name as a subject token).
const STREAM_PREFIX: &str = "ORCHD_QUEUE_";
/// Largest task accepted into the stream (its prompt and parameters).
const MAX_TASK_BYTES: i32 = 4 << 20;
/// How long an admission or a take is tried again while the stream or its consumer has no
/// leader to answer it.
const RETRY_FOR: Duration = Duration::from_secs(2);
/// Retries of one publish recognized as the same task.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// The queues of one JetStream account.
#[derive(Clone)]
pub struct ClusterQueue {
    js: jetstream::Context,
    replicas: usize,
    ack_wait: Duration,
    max_deliveries: i64,
    given_back: Arc<GivenBack>,
}

/// One pool's queue.
pub struct PoolQueue {
    js: jetstream::Context,
    pool: String,
    stream: stream::Stream,
    consumers: [jetstream::consumer::PullConsumer; 2],
    max_deliveries: i64,
    given_back: Arc<GivenBack>,
}

/// A task admitted into a pool's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admitted {
    /// Its place in the pool's stream.
    pub sequence: u64,
    /// It was admitted before (the same id within the duplicate window): not added again.
    pub duplicate: bool,
}

/// Why an admission was refused.
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    #[error("the {class} queue of pool {pool} is full ({bound} tasks)")]
    Full {
        pool: String,
        class: &'static str,
        bound: i64,
    },
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// A task taken from a queue by this replica.
pub struct Taken {
    pub task_id: String,
    /// The queue it was taken from and its class there.
    pub queue: String,
    pub class: Class,
    pub payload: Bytes,
    /// 1 the first time; more after takers that stopped or gave it back.
    pub delivered: i64,
    msg: jetstream::Message,
    given_back: Arc<GivenBack>,
}

/// What a take found.
pub enum Take {
    Task(Box<Taken>),
    /// Its runners stopped too often: out of the queue now; the caller fails the task.
    Exhausted {
        task_id: String,
        /// The runs that stopped.
        runs: i64,
    },
    Empty,
}

impl Take {
    /// What it brought, for a log line: a task's id, or nothing.
    pub fn what(&self) -> Option<&str> {
        match self {
            Take::Task(t) => Some(&t.task_id),
            Take::Exhausted { task_id, .. } => Some(task_id),
            Take::Empty => None,
        }
    }
}

fn class_name(class: Class) -> &'static str {
    match class {
        Class::Interactive => "interactive",
        Class::Batch => "batch",
    }
}

fn subject(pool: &str, class: Class) -> String {
    format!("orchd.queue.{}.{}", subject_token(pool), class_name(class))
}

impl ClusterQueue {
    /// The queues of `js`, their streams kept `replicas` times, a taker silent on a task for
    /// `ack_wait` losing it, a task whose runners stopped `max_deliveries` times exhausted
    /// (the times it was given back untried counted in `given_back`).
    pub fn new(
        js: jetstream::Context,
        replicas: usize,
        ack_wait: Duration,
        max_deliveries: u32,
        given_back: Arc<GivenBack>,
    ) -> Self {
        Self {
            js,
            replicas,
            ack_wait,
            max_deliveries: i64::from(max_deliveries),
            given_back,
        }
    }

    /// Tasks in every queue of the cluster (queued and running), interactive and batch.
    pub async fn tasks_by_class(&self) -> Result<(u64, u64), ClusterError> {
        let mut names = self.js.stream_names();
        let (mut interactive, mut batch) = (0u64, 0u64);
        while let Some(name) = names.next().await {
            let name = name.map_err(ClusterError::jetstream)?;
            if !name.starts_with(STREAM_PREFIX) {
                continue;
            }
            // the subjects' counts come with their own look: no stream info asked first
            let stream = self
                .js
                .get_stream_no_info(&name)
                .await
                .map_err(ClusterError::jetstream)?;
            let mut subjects = stream
                .info_with_subjects("orchd.queue.>")
                .await
                .map_err(ClusterError::jetstream)?;
            while let Some(s) = subjects.next().await {
                let (subject, n) = s.map_err(ClusterError::jetstream)?;
                if subject.ends_with(class_name(Class::Batch)) {
                    batch += n as u64;
                } else {
                    interactive += n as u64;
                }
            }
        }
        Ok((interactive, batch))
    }

    /// Opens `pool`'s queue, creating its stream (or updating its bound) as needed: at most
    /// `bound` tasks per class, queued or running.
    pub async fn pool(&self, pool: &str, bound: i64) -> Result<PoolQueue, ClusterError> {
        let name = format!("{STREAM_PREFIX}{}", subject_token(pool));
        let config = stream::Config {
            name: name.clone(),
            description: Some(format!("orchestratord queue of pool {pool:?}")),
            subjects: vec![
                subject(pool, Class::Interactive),
                subject(pool, Class::Batch),
            ],
            retention: RetentionPolicy::WorkQueue,
            max_messages_per_subject: bound,
            discard: DiscardPolicy::New,
            discard_new_per_subject: true,
            max_message_size: MAX_TASK_BYTES,
            duplicate_window: DUPLICATE_WINDOW,
            storage: StorageType::File,
            num_replicas: self.replicas,
            ..Default::default()
        };
        let stream = match self.js.get_stream(&name).await {
            Ok(mut s) => {
                let same = s
                    .info()
                    .await
                    .map(|i| i.config.max_messages_per_subject == bound)
                    .unwrap_or(false);
                if !same {
                    self.js
                        .update_stream(&config)
                        .await
                        .map_err(ClusterError::jetstream)?;
                }
                s
            }
            Err(_) => self
                .js
                .get_or_create_stream(config)
                .await
                .map_err(ClusterError::jetstream)?,
        };
        let consumer = |class: Class| pull::Config {
            durable_name: Some(format!("take_{}", class_name(class))),
            filter_subject: subject(pool, class),
            ack_policy: AckPolicy::Explicit,
            ack_wait: self.ack_wait,
            // deliveries are counted here, not by JetStream, so the last one can be failed
            max_deliver: -1,
            ..Default::default()
        };
        let interactive = stream
            .get_or_create_consumer("take_interactive", consumer(Class::Interactive))
            .await
            .map_err(ClusterError::jetstream)?;
        let batch = stream
            .get_or_create_consumer("take_batch", consumer(Class::Batch))
            .await
            .map_err(ClusterError::jetstream)?;
        Ok(PoolQueue {
            js: self.js.clone(),
            pool: pool.to_string(),
            stream,
            consumers: [interactive, batch],
            max_deliveries: self.max_deliveries,
            given_back: self.given_back.clone(),
        })
    }
}

impl PoolQueue {
    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.pool
    }

    /// Admits task `task_id` (its `payload`) into `class`'s queue, unless the queue is full.
    pub async fn admit(
        &self,
        class: Class,
        task_id: &str,
        payload: Bytes,
    ) -> Result<Admitted, AdmitError> {
        // a stream between leaders (just created, or its leader lost) answers nobody for a
        // moment: the same task is sent again for a while (its id makes that safe)
        let until = tokio::time::Instant::now() + RETRY_FOR;
        loop {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert("Nats-Msg-Id", task_id);
            let sent = self
                .js
                .publish_with_headers(subject(&self.pool, class), headers, payload.clone())
                .await;
            let ack = match sent {
                Ok(pending) => pending.await,
                Err(e) => Err(e),
            };
            match ack {
                Ok(a) => {
                    return Ok(Admitted {
                        sequence: a.sequence,
                        duplicate: a.duplicate,
                    })
                }
                Err(e) if e.to_string().contains("maximum messages per subject") => {
                    return Err(AdmitError::Full {
                        pool: self.pool.clone(),
                        class: class_name(class),
                        bound: self.stream.cached_info().config.max_messages_per_subject,
                    })
                }
                Err(_) if tokio::time::Instant::now() < until => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(ClusterError::jetstream(e).into()),
            }
        }
    }

    /// Takes the task at `sequence` out of the queue (admitted, then refused).
    pub async fn withdraw(&self, sequence: u64) -> Result<(), ClusterError> {
        self.stream
            .delete_message(sequence)
            .await
            .map(|_| ())
            .map_err(ClusterError::jetstream)
    }

    /// Tasks in `class`'s queue, queued or running, as the stream counts them now.
    pub async fn depth(&self, class: Class) -> Result<u64, ClusterError> {
        let mut subjects = self
            .stream
            .info_with_subjects(subject(&self.pool, class))
            .await
            .map_err(ClusterError::jetstream)?;
        let mut n = 0u64;
        while let Some(s) = subjects.next().await {
            n += s.map_err(ClusterError::jetstream)?.1 as u64;
        }
        Ok(n)
    }

    /// The NATS node leading the pool's stream now (the one that orders its admissions).
    pub async fn leader(&mut self) -> Result<Option<String>, ClusterError> {
        let info = self.stream.info().await.map_err(ClusterError::jetstream)?;
        Ok(info.cluster.as_ref().and_then(|c| c.leader.clone()))
    }

    /// The next task of `class` no other replica holds, waiting up to `wait` for one (zero:
    /// only what is there now).
    pub async fn take(&self, class: Class, wait: Duration) -> Result<Take, ClusterError> {
        let consumer = &self.consumers[match class {
            Class::Interactive => 0,
            Class::Batch => 1,
        }];
        let until = tokio::time::Instant::now() + RETRY_FOR;
        let msg = loop {
            let batch = if wait.is_zero() {
                consumer.fetch().max_messages(1).messages().await
            } else {
                consumer
                    .batch()
                    .max_messages(1)
                    .expires(wait)
                    .messages()
                    .await
            };
            let pulled = match batch {
                Ok(mut batch) => batch
                    .next()
                    .await
                    .transpose()
                    .map_err(ClusterError::jetstream),
                Err(e) => Err(ClusterError::jetstream(e)),
            };
            match pulled {
                Ok(Some(msg)) => break msg,
                Ok(None) => return Ok(Take::Empty),
                // a consumer between leaders answers 503 for a moment
                Err(_) if tokio::time::Instant::now() < until => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => return Err(e),
            }
        };
        let delivered = msg.info().map_err(ClusterError::jetstream)?.delivered;
        let task_id = msg
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Msg-Id"))
            .map(|v| v.to_string())
            .unwrap_or_default();
        // the deliveries before this one were runs that stopped, or give-backs (read only
        // when the deliveries alone would exhaust the task)
        if delivered > self.max_deliveries {
            let untried = match self.given_back.count(&task_id).await {
                Ok(n) => n,
                Err(e) => {
                    // not known now: the task waits for another look, not failed on a guess
                    tracing::warn!(%task_id, error = %e, "cluster: cannot read a task's give-backs");
                    let _ = msg.ack_with(AckKind::Nak(None)).await;
                    return Err(e);
                }
            };
            let runs = delivered - 1 - untried;
            if runs >= self.max_deliveries {
                // out of the queue, confirmed (the caller fails the task)
                msg.double_ack().await.map_err(ClusterError::jetstream)?;
                let _ = self.given_back.forget(&task_id).await;
                return Ok(Take::Exhausted { task_id, runs });
            }
        }
        Ok(Take::Task(Box::new(Taken {
            task_id,
            queue: self.pool.clone(),
            class,
            payload: msg.payload.clone(),
            delivered,
            msg,
            given_back: self.given_back.clone(),
        })))
    }
}

impl Taken {
    /// Still working on it: JetStream waits another `ack_wait` before giving it to another.
    pub async fn progress(&self) -> Result<(), ClusterError> {
        self.msg
            .ack_with(AckKind::Progress)
            .await
            .map_err(ClusterError::jetstream)
    }

    /// Ended (whatever the outcome): out of the queue, its place free.
    pub async fn done(self) -> Result<(), ClusterError> {
        self.msg
            .double_ack()
            .await
            .map_err(ClusterError::jetstream)?;
        if self.delivered > 1 {
            // it may have been given back before: that count goes with it
            if let Err(e) = self.given_back.forget(&self.task_id).await {
                tracing::debug!(task_id = %self.task_id, error = %e, "cluster: a task's give-backs not forgotten");
            }
        }
        Ok(())
    }

    /// Given back untried (no slot for it here after all), for another replica to take at
    /// once: not a run, so it does not bring the task nearer `REPLICA_EXHAUSTED`.
    pub async fn give_back(self) -> Result<(), ClusterError> {
        tracing::debug!(task_id = %self.task_id, delivered = self.delivered, "cluster: given back untried");
        if let Err(e) = self.given_back.add(&self.task_id).await {
            // counted as a run that stopped: the task is exhausted one run sooner at worst
            tracing::warn!(task_id = %self.task_id, error = %e, "cluster: a give-back not counted");
        }
        self.hand_back().await
    }

    /// Handed back after its run here stopped (this replica shuts down), for another replica
    /// to take at once and go on with: a run that stopped.
    pub async fn hand_back(self) -> Result<(), ClusterError> {
        self.msg
            .ack_with(AckKind::Nak(None))
            .await
            .map_err(ClusterError::jetstream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_become_subject_tokens() {
        assert_eq!(subject("p", Class::Batch), "orchd.queue.p.batch");
        assert_eq!(
            subject("a.b", Class::Interactive),
            "orchd.queue.x612e62.interactive"
        );
    }
}
