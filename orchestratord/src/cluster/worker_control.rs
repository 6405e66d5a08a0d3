//! Workers of any replica, driven from any replica: a drain or `models_refresh` for a worker
//! connected to another replica (the pool directory says which) goes out on the core NATS
//! subject `orchd.worker.<worker id>` as a request; the replica holding the worker acts on it
//! and answers with the worker as its `/v1/workers` shows it. No answer within
//! [`ANSWER_WAIT`]: the worker is gone (404).

use std::time::Duration;

use async_nats::client::RequestErrorKind;
use contracts::worker::WorkerInfo;
use futures::StreamExt;
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
        if !self.connected() {
            return Err(ClusterError::JetStream(
                "not connected to the NATS cluster".into(),
            ));
        }
        let payload = serde_json::to_vec(&WorkerRequest {
            worker_id: worker_id.to_string(),
            action: action.clone(),
        })
        .map_err(ClusterError::jetstream)?;
        let request = async_nats::Request::new()
            .payload(payload.into())
            .timeout(Some(ANSWER_WAIT));
        match self.client.send_request(subject, request).await {
            Ok(msg) => Ok(serde_json::from_slice::<WorkerInfo>(&msg.payload).ok()),
            Err(e)
                if matches!(
                    e.kind(),
                    RequestErrorKind::NoResponders | RequestErrorKind::TimedOut
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(ClusterError::jetstream(e)),
        }
    }

    /// Answers the other replicas' requests for this replica's workers until `stop`:
    /// `apply(worker_id, action)` acts on a worker connected here and returns it, `None` when
    /// it is not here.
    pub async fn serve_worker_controls(
        &self,
        apply: impl Fn(&str, &WorkerAction) -> Option<WorkerInfo>,
        stop: tokio_util::sync::CancellationToken,
    ) -> Result<(), ClusterError> {
        let mut asks = self
            .client
            .subscribe(format!("{PREFIX}.*"))
            .await
            .map_err(ClusterError::jetstream)?;
        loop {
            let msg = tokio::select! {
                _ = stop.cancelled() => return Ok(()),
                m = asks.next() => m,
            };
            let Some(msg) = msg else {
                return Ok(());
            };
            if msg.payload.len() > MAX_ASK_BYTES {
                continue;
            }
            let Ok(req) = serde_json::from_slice::<WorkerRequest>(&msg.payload) else {
                continue;
            };
            // the subject names the worker the payload names, or the request is nobody's
            if subject(&req.worker_id).as_deref() != Some(msg.subject.as_str()) {
                continue;
            }
            let Some(info) = apply(&req.worker_id, &req.action) else {
                continue;
            };
            let (Some(reply), Ok(body)) = (msg.reply, serde_json::to_vec(&info)) else {
                continue;
            };
            if let Err(e) = self.client.publish(reply, body.into()).await {
                tracing::warn!(error = %e, worker_id = %req.worker_id, "cluster: worker request done, answer not sent");
            }
        }
    }
}
