//! The cluster's event relay on JetStream (issue 38): every
//! event of a task (`started`, `token`, `metrics`, `end`, `error`) is a message on the task's
//! own subject of one stream, published by whichever replica runs it; any replica follows a
//! task from the start or from an event id, and an event's id is its stream sequence — so a
//! client whose replica died resumes on another with `Last-Event-ID` and gets every later
//! event once, in order. The stream keeps each task's events for the transcript's time and at
//! most a bounded number per task.

use std::time::{Duration, Instant};

use async_nats::jetstream;
use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use async_nats::jetstream::stream::{self, DiscardPolicy, StorageType};
use bytes::Bytes;
use futures::{Stream, StreamExt};

use super::subject_token::task_token;
use super::ClusterError;

/// The stream's name.
pub const STREAM: &str = "ORCHD_EVENTS";

/// A task's subject (see `subject_token.rs`).
fn subject(task_id: &str) -> Result<String, ClusterError> {
    task_token(task_id)
        .map(|t| format!("orchd.events.{t}"))
        .ok_or_else(|| ClusterError::JetStream(format!("not a task id: {task_id:?}")))
}

/// How the relay keeps events.
#[derive(Debug, Clone, Copy)]
pub struct RelayLimits {
    /// A task's events are dropped this long after they were written.
    pub keep: Duration,
    /// Events kept per task at most (the oldest go first).
    pub per_task: i64,
    /// All tasks' events together at most (the oldest go first).
    pub bytes: i64,
}

/// One event as a follower receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relayed {
    /// The event id: its sequence in the stream (grows with every event of every task).
    pub id: u64,
    pub payload: Bytes,
    /// When the relay stored it, on this replica's clock: a follower that reads a task's
    /// events late (adopting it, or after a lost consumer) times the task as it ran.
    pub at: Instant,
}

/// The instant on this replica's clock of a time the NATS server stamped (ns since the Unix
/// epoch); a stamp ahead of this replica's clock (skew) reads as now.
fn stamped_at(unix_ns: i128) -> Instant {
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    let ago = u64::try_from(now_ns - unix_ns).unwrap_or(0);
    let now = Instant::now();
    now.checked_sub(Duration::from_nanos(ago)).unwrap_or(now)
}

#[derive(Clone)]
pub struct EventRelay {
    js: jetstream::Context,
    stream: stream::Stream,
}

impl EventRelay {
    /// Creates the stream (or opens it as another replica created it).
    pub async fn open(
        js: jetstream::Context,
        replicas: usize,
        limits: RelayLimits,
    ) -> Result<Self, ClusterError> {
        let config = stream::Config {
            name: STREAM.into(),
            description: Some("orchestratord task events, a subject per task".into()),
            subjects: vec!["orchd.events.>".into()],
            max_age: limits.keep,
            max_messages_per_subject: limits.per_task,
            max_bytes: limits.bytes,
            discard: DiscardPolicy::Old,
            duplicate_window: Duration::from_secs(120).min(limits.keep),
            storage: StorageType::File,
            num_replicas: replicas,
            ..Default::default()
        };
        let stream = match js.get_stream(STREAM).await {
            Ok(s) => s,
            Err(_) => js
                .get_or_create_stream(config)
                .await
                .map_err(ClusterError::jetstream)?,
        };
        Ok(Self { js, stream })
    }

    /// Appends event `number` (0, 1, 2, … per task) of `task_id`; its id once the stream has
    /// it. Sending the same number again (a retry after a lost answer) does not add it twice.
    pub async fn publish(
        &self,
        task_id: &str,
        number: u64,
        payload: Bytes,
    ) -> Result<u64, ClusterError> {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", format!("{task_id}-{number}").as_str());
        let ack = self
            .js
            .publish_with_headers(subject(task_id)?, headers, payload)
            .await
            .map_err(ClusterError::jetstream)?
            .await
            .map_err(ClusterError::jetstream)?;
        Ok(ack.sequence)
    }

    /// Appends event `number` of `task_id`'s run `run` (its delivery from the queue) only if
    /// the task's last event is still `last` (the one this run appended or read last): a
    /// replica that lost the task to another (it was stopped past `ack_wait`, and another took
    /// it) learns so here, and appends nothing. Two runs never share an event's dedupe id, so
    /// the stale one cannot pass for a retry of the other's append.
    pub async fn append_after(
        &self,
        task_id: &str,
        run: i64,
        number: u64,
        payload: Bytes,
        last: u64,
    ) -> Result<Appended, ClusterError> {
        use async_nats::jetstream::context::PublishErrorKind;
        let own = format!("{task_id}-r{run}-{number}");
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", own.as_str());
        headers.insert(
            "Nats-Expected-Last-Subject-Sequence",
            last.to_string().as_str(),
        );
        let sent = self
            .js
            .publish_with_headers(subject(task_id)?, headers, payload)
            .await;
        let ack = match sent {
            Ok(pending) => pending.await,
            Err(e) => Err(e),
        };
        match ack {
            Ok(a) if a.duplicate => Ok(Appended::Duplicate(a.sequence)),
            Ok(a) => Ok(Appended::At(a.sequence)),
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence => {
                // a retry of an append that landed (its answer lost) finds itself last
                match self
                    .stream
                    .get_last_raw_message_by_subject(&subject(task_id)?)
                    .await
                {
                    Ok(m)
                        if m.headers
                            .get("Nats-Msg-Id")
                            .is_some_and(|v| v.as_str() == own) =>
                    {
                        Ok(Appended::Duplicate(m.sequence))
                    }
                    _ => Ok(Appended::Superseded),
                }
            }
            Err(e) => Err(ClusterError::jetstream(e)),
        }
    }

    /// The id of `task_id`'s last event so far; `None` when it has none.
    pub async fn last_id(&self, task_id: &str) -> Result<Option<u64>, ClusterError> {
        Ok(self.last(task_id).await?.map(|r| r.id))
    }

    /// `task_id`'s last event so far; `None` when it has none.
    pub async fn last(&self, task_id: &str) -> Result<Option<Relayed>, ClusterError> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind;
        match self
            .stream
            .get_last_raw_message_by_subject(&subject(task_id)?)
            .await
        {
            Ok(m) => Ok(Some(Relayed {
                id: m.sequence,
                at: stamped_at(m.time.unix_timestamp_nanos()),
                payload: m.payload,
            })),
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(e) => Err(ClusterError::jetstream(e)),
        }
    }

    /// The NATS node leading the stream now.
    pub async fn leader(&self) -> Result<Option<String>, ClusterError> {
        let mut s = self.stream.clone();
        let info = s.info().await.map_err(ClusterError::jetstream)?;
        Ok(info.cluster.as_ref().and_then(|c| c.leader.clone()))
    }

    /// `task_id`'s events after event `after` (0: from its first), as they come. A follower
    /// silent for [`RECHECK`] asks the stream for the task's last event; if there is one it
    /// has not seen (its consumer was lost with a NATS node), it follows again from there.
    pub async fn follow(
        &self,
        task_id: &str,
        after: u64,
    ) -> Result<impl Stream<Item = Result<Relayed, ClusterError>>, ClusterError> {
        let subject = subject(task_id)?;
        let first = self.consumer(&subject, after).await?;
        let state = Follow {
            relay: self.clone(),
            subject,
            last: after,
            messages: Some(first),
        };
        Ok(futures::stream::unfold(state, |mut f| async move {
            loop {
                let messages = match f.messages.as_mut() {
                    Some(m) => m,
                    None => match f.relay.consumer(&f.subject, f.last).await {
                        Ok(m) => f.messages.insert(m),
                        Err(e) => return Some((Err(e), f)),
                    },
                };
                match tokio::time::timeout(RECHECK, messages.next()).await {
                    Ok(Some(Ok(m))) => {
                        let (id, at) = match m.info() {
                            Ok(info) => (
                                info.stream_sequence,
                                stamped_at(info.published.unix_timestamp_nanos()),
                            ),
                            Err(e) => return Some((Err(ClusterError::jetstream(e)), f)),
                        };
                        if id <= f.last {
                            continue;
                        }
                        f.last = id;
                        let event = Relayed {
                            id,
                            at,
                            payload: m.payload.clone(),
                        };
                        return Some((Ok(event), f));
                    }
                    // the consumer failed or ended: follow again from the last event seen
                    Ok(Some(Err(_))) | Ok(None) => {
                        f.messages = None;
                        tokio::time::sleep(RECHECK / 4).await;
                    }
                    Err(_) => {
                        let newer = f
                            .relay
                            .stream
                            .get_last_raw_message_by_subject(&f.subject)
                            .await
                            .map(|m| m.sequence > f.last)
                            .unwrap_or(false);
                        if newer {
                            f.messages = None;
                        }
                    }
                }
            }
        }))
    }

    async fn consumer(&self, subject: &str, after: u64) -> Result<Ordered, ClusterError> {
        let consumer = self
            .stream
            .create_consumer(pull::OrderedConfig {
                filter_subject: subject.to_string(),
                deliver_policy: match after {
                    0 => DeliverPolicy::All,
                    n => DeliverPolicy::ByStartSequence {
                        start_sequence: n + 1,
                    },
                },
                ..Default::default()
            })
            .await
            .map_err(ClusterError::jetstream)?;
        consumer.messages().await.map_err(ClusterError::jetstream)
    }
}

type Ordered = async_nats::jetstream::consumer::pull::Ordered;

/// What a fenced append did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Appended {
    /// Appended with this id.
    At(u64),
    /// Appended before (a retry after a lost answer): its id.
    Duplicate(u64),
    /// Another event came after `last`: someone else appends to the task now.
    Superseded,
}

/// A follower silent this long checks whether it missed events.
pub const RECHECK: Duration = Duration::from_secs(2);

struct Follow {
    relay: EventRelay,
    subject: String,
    /// The last event id delivered.
    last: u64,
    messages: Option<Ordered>,
}
