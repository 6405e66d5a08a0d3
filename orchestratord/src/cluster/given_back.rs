//! How often each queued task was given back untried (CLU-TASK-6): a replica that took a task
//! and found no slot for it after all (another task got the slot first) gives it back, and
//! JetStream counts that redelivery as it counts one after a runner stopped. Only runs that
//! stopped may exhaust a task, so each give-back is counted here, per task, in a bucket every
//! replica reads: written only when a task is given back, read only when a task's deliveries
//! pass `cluster.max_deliveries`, forgotten when a task taken more than once leaves its queue.
//! Nothing is written or read on the path of a task taken once.

use std::time::Duration;

use async_nats::jetstream::{self, kv};

use super::subject_token::subject_token;
use super::ClusterError;

const BUCKET: &str = "orchd_given_back";
/// How long a count is kept without a change (longer than a task waits in a queue).
const KEEP: Duration = Duration::from_secs(6 * 3600);
/// The bucket's size: past it the oldest counts go first (each is a few dozen bytes).
const MAX_BYTES: i64 = 8 << 20;
/// Tries of one count's update against another replica's at the same moment.
const TRIES: usize = 4;

/// The cluster's counts of tasks given back untried.
#[derive(Clone)]
pub struct GivenBack {
    kv: kv::Store,
}

impl GivenBack {
    /// Creates the bucket, or opens it where another replica created it.
    pub(super) async fn open(
        js: &jetstream::Context,
        replicas: usize,
    ) -> Result<Self, ClusterError> {
        let config = kv::Config {
            bucket: BUCKET.into(),
            description: "orchestratord: tasks given back to their queue untried".into(),
            history: 1,
            max_age: KEEP,
            // a count is a few digits; the size counts the headers too
            max_value_size: 1024,
            max_bytes: MAX_BYTES,
            num_replicas: replicas,
            ..Default::default()
        };
        Ok(Self {
            kv: super::key_value_bucket(js, config).await?,
        })
    }

    /// How often `task_id` was given back untried (0 when never, or forgotten).
    pub async fn count(&self, task_id: &str) -> Result<i64, ClusterError> {
        let entry = self
            .kv
            .entry(subject_token(task_id))
            .await
            .map_err(ClusterError::jetstream)?;
        Ok(entry
            .filter(|e| e.operation == kv::Operation::Put)
            .map_or(0, |e| parse(&e.value)))
    }

    /// Counts one more give-back of `task_id`.
    pub async fn add(&self, task_id: &str) -> Result<(), ClusterError> {
        let key = subject_token(task_id);
        let mut tries = 0;
        loop {
            tries += 1;
            let entry = self
                .kv
                .entry(key.as_str())
                .await
                .map_err(ClusterError::jetstream)?;
            let written = match entry.filter(|e| e.operation == kv::Operation::Put) {
                Some(e) => {
                    let next = (parse(&e.value) + 1).to_string();
                    self.kv
                        .update(&key, next.into(), e.revision)
                        .await
                        .map(|_| ())
                        .map_err(ClusterError::jetstream)
                }
                // never counted, or forgotten (a deleted key is created again)
                None => self
                    .kv
                    .create(&key, "1".into())
                    .await
                    .map(|_| ())
                    .map_err(ClusterError::jetstream),
            };
            match written {
                // another count written meanwhile: read it again
                Err(_) if tries < TRIES => {}
                done => return done,
            }
        }
    }

    /// Forgets `task_id`'s count (it left its queue).
    pub async fn forget(&self, task_id: &str) -> Result<(), ClusterError> {
        self.kv
            .purge(subject_token(task_id))
            .await
            .map_err(ClusterError::jetstream)
    }
}

/// A count as stored (decimal text); anything else counts nothing.
fn parse(value: &[u8]) -> i64 {
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}
