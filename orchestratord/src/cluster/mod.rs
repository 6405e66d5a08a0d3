//! A replica's link to its cluster on NATS JetStream (issue 38; ARCHITECTURE.md "Replicas").
//! Without `cluster.nats_urls` none of this exists: one process, nothing external. With it,
//! the replica connects at start (JetStream's buckets created or opened, retried until
//! `connect_timeout_ms`: a cluster just started elects its leaders first), keeps the cluster's
//! pool directory (`pool_directory.rs`), answers cancels (`cancel.rs`), and its tasks take the
//! cluster's path (`task_path.rs`): the pools' queues on JetStream (`task_queue.rs`), taken by
//! any replica with a free slot (`taker.rs`), their events relayed (`event_relay.rs`,
//! `lifecycle/handoff.rs`) to every replica following them (`mirror.rs`), their records kept for every
//! replica to read (`record_stream.rs`); a worker connected to any replica is listed and
//! driven from every replica (`pool_directory.rs`, `worker_control.rs`).

mod ask;
pub mod cancel;
mod early_run;
mod error;
pub mod event_relay;
mod given_back;
mod head_start;
pub mod held_prefixes;
pub mod known_full;
mod mirror;
pub mod pool_directory;
pub mod record_stream;
mod run_here;
mod slot_claims;
mod subject_token;
mod taker;
pub mod task_path;
pub mod task_queue;
pub mod worker_control;

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::ServerAddr;
use tokio::time::Instant;

use crate::config::ClusterConfig;
pub use error::ClusterError;
pub use pool_directory::PoolDirectory;

/// The connection and what this replica keeps in the cluster.
pub struct Cluster {
    replica: String,
    directory: Arc<PoolDirectory>,
    /// What the other replicas' pools hold (`held_prefixes.rs`).
    held: held_prefixes::HeldIndex,
    client: async_nats::Client,
    js: jetstream::Context,
    stream_replicas: usize,
    max_deliveries: u32,
    /// Tasks given back to their queue untried (`given_back.rs`).
    given_back: Arc<given_back::GivenBack>,
}

impl Cluster {
    /// Connects to any of `cfg.nats_urls` and opens the cluster's buckets, retrying until
    /// `cfg.connect_timeout_ms` has passed.
    pub async fn connect(cfg: &ClusterConfig) -> Result<Self, ClusterError> {
        let addrs = cfg
            .nats_urls
            .iter()
            .map(|u| {
                u.parse::<ServerAddr>().map_err(|e| ClusterError::BadUrl {
                    url: u.clone(),
                    message: e.to_string(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let waited = Duration::from_millis(cfg.connect_timeout_ms);
        let deadline = Instant::now() + waited;
        let unreachable = |message: String| ClusterError::Unreachable {
            urls: cfg.nats_urls.join(","),
            waited_ms: cfg.connect_timeout_ms,
            message,
        };
        let client = loop {
            let attempt = async_nats::ConnectOptions::new()
                .name(format!("orchestratord {}", cfg.replica_id))
                .connection_timeout(Duration::from_secs(2))
                // a node that stops answering (stopped, cut off) without closing the socket
                // is left for another after two pings unanswered, not after minutes
                .ping_interval(Duration::from_millis(cfg.heartbeat_ms))
                .connect(addrs.clone());
            match tokio::time::timeout_at(deadline, attempt).await {
                Ok(Ok(client)) => break client,
                Ok(Err(e)) if Instant::now() + RETRY < deadline => {
                    tracing::debug!(error = %e, "NATS not reachable yet");
                    tokio::time::sleep(RETRY).await;
                }
                Ok(Err(e)) => return Err(unreachable(e.to_string())),
                Err(_) => return Err(unreachable("no answer".into())),
            }
        };
        // a server on its own (no cluster) keeps one copy of a stream: asked for more, each
        // create would fail until the start gave up, as if the server did not answer
        if let Some(info) = client
            .try_server_info()
            .filter(|i| i.cluster.is_none() && cfg.stream_replicas > 1)
        {
            return Err(ClusterError::NotClustered {
                replicas: cfg.stream_replicas,
                url: format!("{}:{}", info.host, info.port),
            });
        }
        let js = jetstream::new(client.clone());
        let open = || async {
            let directory = PoolDirectory::open(&js, cfg).await?;
            let given_back = given_back::GivenBack::open(&js, cfg.stream_replicas).await?;
            Ok::<_, ClusterError>((directory, given_back))
        };
        let (directory, given_back) = loop {
            match open().await {
                Ok(opened) => break opened,
                // JetStream answers once the cluster has elected its meta leader
                Err(e) if Instant::now() + RETRY < deadline => {
                    tracing::debug!(error = %e, "JetStream not ready yet");
                    tokio::time::sleep(RETRY).await;
                }
                Err(e) => return Err(unreachable(e.to_string())),
            }
        };
        tracing::info!(replica = %cfg.replica_id, urls = %cfg.nats_urls.join(","), "joined the cluster");
        Ok(Self {
            replica: cfg.replica_id.clone(),
            directory: Arc::new(directory),
            held: held_prefixes::HeldIndex::new(&cfg.replica_id),
            client,
            js,
            stream_replicas: cfg.stream_replicas,
            max_deliveries: cfg.max_deliveries,
            given_back: Arc::new(given_back),
        })
    }

    /// Whether the replica is connected to a NATS server of its cluster now.
    pub fn connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// This replica's name in the cluster.
    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// The cluster's task queues, a taker losing a task it is silent on for `ack_wait`.
    pub fn queue(&self, ack_wait: Duration) -> task_queue::ClusterQueue {
        task_queue::ClusterQueue::new(
            self.js.clone(),
            self.stream_replicas,
            ack_wait,
            self.max_deliveries,
            self.given_back.clone(),
        )
    }

    /// The cluster's event relay (its stream created or opened with `limits`).
    pub async fn events(
        &self,
        limits: event_relay::RelayLimits,
    ) -> Result<event_relay::EventRelay, ClusterError> {
        event_relay::EventRelay::open(self.js.clone(), self.stream_replicas, limits).await
    }

    /// The cluster's task records (their stream created or opened).
    pub async fn records(
        &self,
        keep: Duration,
        max_bytes: u64,
    ) -> Result<record_stream::RecordStream, ClusterError> {
        record_stream::RecordStream::open(self.js.clone(), self.stream_replicas, keep, max_bytes)
            .await
    }

    /// Tells the replicas taking from queue `queue` that a task is in it (core NATS, at most
    /// once: a replica that misses it finds the task at its next look), and which pool the
    /// others leave it to for a moment (`head_start.rs`).
    pub async fn nudge(&self, queue: &str, prefer: Option<&head_start::Preference>) {
        let subject = format!("orchd.nudge.{}", subject_token::subject_token(queue));
        let payload = prefer
            .and_then(|p| serde_json::to_vec(p).ok())
            .unwrap_or_default();
        if let Err(e) = self.client.publish(subject, payload.into()).await {
            tracing::debug!(error = %e, "cluster: nudge not sent");
        }
    }

    /// The nudges of `queues`.
    pub async fn nudges(
        &self,
        queues: &[String],
    ) -> Result<futures::stream::SelectAll<async_nats::Subscriber>, ClusterError> {
        let mut all = futures::stream::SelectAll::new();
        for q in queues {
            let subject = format!("orchd.nudge.{}", subject_token::subject_token(q));
            all.push(
                self.client
                    .subscribe(subject)
                    .await
                    .map_err(ClusterError::jetstream)?,
            );
        }
        Ok(all)
    }

    /// Every live replica's pools.
    pub fn directory(&self) -> &Arc<PoolDirectory> {
        &self.directory
    }

    /// What the other replicas' pools hold.
    pub fn held(&self) -> &held_prefixes::HeldIndex {
        &self.held
    }
}

/// Pause between attempts to reach the cluster at start.
const RETRY: Duration = Duration::from_millis(250);

/// The key-value bucket `config` describes: created, or opened where another replica created
/// it (with other settings: used as it is).
async fn key_value_bucket(
    js: &jetstream::Context,
    config: jetstream::kv::Config,
) -> Result<jetstream::kv::Store, ClusterError> {
    let bucket = config.bucket.clone();
    match js.create_key_value(config).await {
        Ok(kv) => Ok(kv),
        Err(created) => js
            .get_key_value(&bucket)
            .await
            .map_err(|e| ClusterError::JetStream(format!("{created}; {e}"))),
    }
}
