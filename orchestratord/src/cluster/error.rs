//! What can go wrong between a replica and its cluster.

/// A cluster failure (at start: the process exits with it; later: logged, and the replica
/// goes on with what it last knew).
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cluster.nats_urls: {url:?} is not a NATS URL: {message}")]
    BadUrl { url: String, message: String },
    #[error("cannot reach the NATS cluster at {urls} within {waited_ms} ms: {message}")]
    Unreachable {
        urls: String,
        waited_ms: u64,
        message: String,
    },
    #[error(
        "cluster.stream_replicas = {replicas} needs a NATS cluster of at least {replicas} JetStream nodes, and the NATS server at {url} runs alone: set cluster.stream_replicas = 1 (env ORCHD_CLUSTER_STREAM_REPLICAS=1) or join it to a cluster"
    )]
    NotClustered { replicas: usize, url: String },
    #[error("JetStream: {0}")]
    JetStream(String),
}

impl ClusterError {
    pub(crate) fn jetstream(e: impl std::fmt::Display) -> Self {
        Self::JetStream(e.to_string())
    }
}
