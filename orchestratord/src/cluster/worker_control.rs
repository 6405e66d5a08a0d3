//! Workers of any replica, driven from any replica: a drain or `models_refresh` for a worker
//! connected to another replica (the pool directory says which) goes out on the core NATS
//! subject `orchd.worker.<worker id>` as a request; the replica holding the worker acts on it
//! and answers with the worker as its `/v1/workers` shows it. No answer within
//! [`ANSWER_WAIT`]: the worker is gone (404).

use std::time::Duration;

use contracts::worker::WorkerInfo;
use serde::{Deserialize, Serialize};

use super::subject_token::subject_token;
use super::{Cluster, ClusterError};

const PREFIX: &str = "orchd.worker";
/// How long a replica waits for the one holding a worker to answer.
pub const ANSWER_WAIT: Duration = Duration::from_millis(500);
/// Largest request read (a worker id and an action).
const MAX_ASK_BYTES: usize = 4 << 10;
/// Longest worker id sent on (a subject token of its bytes in hex stays far below NATS's
/// limits).
const MAX_ID_BYTES: usize = 256;

/// What to do with a worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum WorkerAction {
    /// `graceful_shutdown`: no new work, its socket closes once its requests end.
    Drain { deadline_ms: u64 },
    /// Ask it to report its models again.
    ModelsRefresh,
}

#[derive(Serialize, Deserialize)]
struct WorkerRequest {
    worker_id: String,
    #[serde(flatten)]
    action: WorkerAction,
}

fn subject(worker_id: &str) -> Option<String> {
    (!worker_id.is_empty() && worker_id.len() <= MAX_ID_BYTES)
        .then(|| format!("{PREFIX}.{}", subject_token(worker_id)))
}

impl Cluster {
    /// Asks the replica holding worker `worker_id` to apply `action`: the worker as it is
    /// then, or `None` when no replica holds it.
    pub async fn control_worker(
        &self,
        worker_id: &str,
        action: &WorkerAction,
    ) -> Result<Option<WorkerInfo>, ClusterError> {
        let Some(subject) = subject(worker_id) else {
            return Ok(None);
        };
        let payload = serde_json::to_vec(&WorkerRequest {
            worker_id: worker_id.to_string(),
            action: action.clone(),
        })
        .map_err(ClusterError::jetstream)?;
        let answer = self.ask(subject, payload, ANSWER_WAIT).await?;
        Ok(answer.and_then(|a| serde_json::from_slice::<WorkerInfo>(&a).ok()))
    }

    /// Answers the other replicas' requests for this replica's workers until `stop`:
    /// `apply(worker_id, action)` acts on a worker connected here and returns it, `None` when
    /// it is not here.
    pub async fn serve_worker_controls(
        &self,
        apply: impl Fn(&str, &WorkerAction) -> Option<WorkerInfo>,
        stop: tokio_util::sync::CancellationToken,
    ) -> Result<(), ClusterError> {
        let answer = |subject_named: &str, payload: &[u8]| {
            let req = serde_json::from_slice::<WorkerRequest>(payload).ok()?;
            // the subject names the worker the payload names, or the request is nobody's
            if subject(&req.worker_id).as_deref() != Some(subject_named) {
                return None;
            }
            serde_json::to_vec(&apply(&req.worker_id, &req.action)?).ok()
        };
        self.answer(format!("{PREFIX}.*"), MAX_ASK_BYTES, stop, answer)
            .await
    }
}
