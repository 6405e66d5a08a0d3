//! The cluster's pool directory: every replica announces its pools (their health, as its own
//! `/v1/pools` lists them) and its remote workers (as its `/v1/workers` lists them) under its name in the KV bucket `orchd_pools` every
//! `cluster.heartbeat_ms`, and watches the bucket for the others'. A replica silent for three
//! heartbeats (killed, stopped, cut off) is left out of the list; one shutting down deletes its
//! entry. The bucket keeps one value per replica, and JetStream replicates it
//! (`stream_replicas`), so the directory outlives any one NATS node.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::{self, kv};
use contracts::worker::WorkerInfo;
use contracts::PoolHealth;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::ClusterError;
use crate::config::ClusterConfig;
use crate::lifecycle::eta::SlotForecast;

/// The bucket's name.
pub const BUCKET: &str = "orchd_pools";
/// Largest announcement accepted (a replica's pools: far below this).
const MAX_VALUE_BYTES: i32 = 1 << 20;
/// Replicas remembered at most (announcements beyond are ignored).
const MAX_REPLICAS: usize = 256;
/// JetStream drops an entry this long after its last write (a replica gone for good).
const ENTRY_MAX_AGE: Duration = Duration::from_secs(60);

/// What a replica puts under its name.
#[derive(Serialize, Deserialize)]
pub struct Announcement {
    pub pools: Vec<PoolHealth>,
    /// Absent from replicas older than the cluster-wide worker list.
    #[serde(default)]
    pub workers: Vec<WorkerInfo>,
    /// Each pool's line (by pool id): when its slots free up, for the other replicas'
    /// predicted starts. Absent for a pool with no measured pace.
    #[serde(default)]
    pub lines: HashMap<String, SlotForecast>,
}

struct Peer {
    pools: Vec<PoolHealth>,
    workers: Vec<WorkerInfo>,
    lines: HashMap<String, SlotForecast>,
    /// When the announcement was written (by the NATS server's clock, as this host sees it).
    written: Instant,
}

pub struct PoolDirectory {
    kv: kv::Store,
    replica: String,
    heartbeat: Duration,
    peers: Mutex<HashMap<String, Peer>>,
}

impl PoolDirectory {
    /// Creates the bucket, or opens it where another replica created it.
    pub(super) async fn open(
        js: &jetstream::Context,
        cfg: &ClusterConfig,
    ) -> Result<Self, ClusterError> {
        let config = kv::Config {
            bucket: BUCKET.into(),
            description: "orchestratord replicas and their pools".into(),
            history: 1,
            max_age: ENTRY_MAX_AGE,
            max_value_size: MAX_VALUE_BYTES,
            max_bytes: i64::from(MAX_VALUE_BYTES) * MAX_REPLICAS as i64,
            num_replicas: cfg.stream_replicas,
            ..Default::default()
        };
        let kv = super::key_value_bucket(js, config).await?;
        Ok(Self {
            kv,
            replica: cfg.replica_id.clone(),
            heartbeat: Duration::from_millis(cfg.heartbeat_ms),
            peers: Mutex::new(HashMap::new()),
        })
    }

    /// How often this replica announces itself.
    pub fn heartbeat(&self) -> Duration {
        self.heartbeat
    }

    /// Puts this replica's pools and workers under its name.
    pub async fn announce(&self, now: &Announcement) -> Result<(), ClusterError> {
        let value = serde_json::to_vec(now).map_err(ClusterError::jetstream)?;
        self.kv
            .put(&self.replica, value.into())
            .await
            .map_err(ClusterError::jetstream)?;
        Ok(())
    }

    /// Takes this replica out of the directory (at shutdown).
    pub async fn withdraw(&self) -> Result<(), ClusterError> {
        self.kv
            .delete(&self.replica)
            .await
            .map_err(ClusterError::jetstream)
    }

    /// The pools of every other replica heard from within three heartbeats, by replica name.
    pub fn others(&self) -> Vec<PoolHealth> {
        self.of_others(|p| p.pools.clone())
    }

    /// `f` of each pool of every other live replica, in no particular order, read in place
    /// (admission asks on every request: nothing is copied): the sum of what it gives.
    pub fn sum_over_others(&self, f: impl Fn(&PoolHealth) -> i64) -> i64 {
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers
            .iter()
            .filter(|(name, p)| **name != self.replica && self.heard(&peers, p))
            .flat_map(|(_, p)| p.pools.iter())
            .map(f)
            .sum()
    }

    /// Whether `f` holds for a pool of another live replica (read in place).
    pub fn any_other_pool(&self, f: impl Fn(&PoolHealth) -> bool) -> bool {
        self.sum_over_others(|p| i64::from(f(p))) > 0
    }

    /// Whether a pool of another live replica that `takes` selects has a line for which `line`
    /// holds (read in place, as [`Self::sum_over_others`]).
    pub fn any_other_line(
        &self,
        takes: impl Fn(&PoolHealth) -> bool,
        line: impl Fn(&SlotForecast) -> bool,
    ) -> bool {
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        peers
            .iter()
            .filter(|(name, p)| **name != self.replica && self.heard(&peers, p))
            .any(|(_, p)| {
                p.pools
                    .iter()
                    .filter(|pool| takes(pool))
                    .filter_map(|pool| p.lines.get(&pool.pool_id))
                    .any(&line)
            })
    }

    /// The workers connected to every other replica heard from within three heartbeats, by
    /// replica name.
    pub fn other_workers(&self) -> Vec<WorkerInfo> {
        self.of_others(|p| p.workers.clone())
    }

    /// The lines of the other live replicas' pools that `takes` selects, as they stand now
    /// (each slot closer to free by the time since its replica announced it).
    pub fn other_lines(&self, takes: impl Fn(&PoolHealth) -> bool) -> Vec<SlotForecast> {
        self.of_others(|p| {
            let age = p.written.elapsed().as_millis() as u64;
            p.pools
                .iter()
                .filter(|pool| takes(pool))
                .filter_map(|pool| p.lines.get(&pool.pool_id).cloned())
                .map(|l| l.aged(age))
                .collect()
        })
    }

    /// Live replicas: this one and every other heard from within three heartbeats.
    pub fn live_replicas(&self) -> usize {
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        1 + peers
            .iter()
            .filter(|(name, p)| **name != self.replica && self.heard(&peers, p))
            .count()
    }

    /// Whether `p` counts as live: heard from within three heartbeats — or, while this
    /// replica's own announcements do not come back either (the bucket's leader stopped: the
    /// directory is silent, not its replicas), heard within three heartbeats of the last one
    /// of its own that did.
    fn heard(&self, peers: &HashMap<String, Peer>, p: &Peer) -> bool {
        let window = 3 * self.heartbeat;
        if p.written.elapsed() < window {
            return true;
        }
        peers
            .get(&self.replica)
            .is_some_and(|own| own.written.elapsed() >= window && p.written + window > own.written)
    }

    fn of_others<T>(&self, of: impl Fn(&Peer) -> Vec<T>) -> Vec<T> {
        let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        let mut names: Vec<&String> = peers
            .iter()
            .filter(|(name, p)| **name != self.replica && self.heard(&peers, p))
            .map(|(name, _)| name)
            .collect();
        names.sort();
        names
            .into_iter()
            .flat_map(|name| of(&peers[name]))
            .collect()
    }

    /// Follows the bucket until `stop`: each replica's latest announcement, then every change
    /// (a watch that breaks is opened again).
    pub async fn follow(&self, stop: tokio_util::sync::CancellationToken) {
        while !stop.is_cancelled() {
            match self.kv.watch_with_history(">").await {
                Ok(mut watch) => loop {
                    // this replica's own announcement comes every heartbeat: a watch silent for
                    // three has lost its consumer (a NATS node that held it died) and is
                    // opened again
                    let entry = tokio::select! {
                        _ = stop.cancelled() => return,
                        e = tokio::time::timeout(3 * self.heartbeat, watch.next()) => e,
                    };
                    match entry {
                        Ok(Some(Ok(entry))) => self.take(entry),
                        Ok(Some(Err(e))) => {
                            tracing::warn!(error = %e, "cluster pool directory: watch failed");
                            break;
                        }
                        Ok(None) => break,
                        Err(_) => {
                            tracing::info!(
                                "cluster pool directory: watch silent, opening it again"
                            );
                            break;
                        }
                    }
                },
                Err(e) => tracing::warn!(error = %e, "cluster pool directory: cannot watch"),
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(self.heartbeat) => {}
            }
        }
    }

    fn take(&self, entry: kv::Entry) {
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if entry.operation != kv::Operation::Put {
            peers.remove(&entry.key);
            return;
        }
        let Ok(a) = serde_json::from_slice::<Announcement>(&entry.value) else {
            tracing::warn!(replica = %entry.key, "cluster pool directory: unreadable announcement");
            return;
        };
        if !peers.contains_key(&entry.key) && peers.len() >= MAX_REPLICAS {
            return;
        }
        // an announcement replayed from history is as old as it was written, not fresh
        let now_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        let age_ns = (now_ns - entry.created.unix_timestamp_nanos()).clamp(0, i128::from(u64::MAX));
        let age = Duration::from_nanos(age_ns as u64);
        let written = Instant::now().checked_sub(age).unwrap_or_else(Instant::now);
        let pools = a
            .pools
            .into_iter()
            .map(|p| PoolHealth {
                replica: Some(entry.key.clone()),
                ..p
            })
            .collect();
        let workers = a
            .workers
            .into_iter()
            .map(|w| WorkerInfo {
                replica: Some(entry.key.clone()),
                ..w
            })
            .collect();
        peers.insert(
            entry.key,
            Peer {
                pools,
                workers,
                lines: a.lines,
                written,
            },
        );
    }
}
