//! Cancel from any replica: a cancel for a task this replica does not hold goes out on the
//! core NATS subject `orchd.cancel.<task id>` as a request; every replica listens, and the one
//! holding the task (for a caller allowed to see it) cancels it at once and answers with its
//! name. No answer within [`ANSWER_WAIT`]: no replica has it (404).

use std::time::Duration;

use async_nats::client::RequestErrorKind;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::subject_token::task_token;
use super::{Cluster, ClusterError};

const PREFIX: &str = "orchd.cancel";
/// How long a replica waits for the one holding a task to answer its cancel.
pub const ANSWER_WAIT: Duration = Duration::from_millis(500);
/// Largest cancel request read (a task id, a tenant's name and a flag).
const MAX_ASK_BYTES: usize = 4 << 10;

/// Who asks: the holder applies the same visibility as for its own callers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CancelAsk {
    pub tenant: String,
    pub sees_all: bool,
}

#[derive(Serialize, Deserialize)]
struct CancelDone {
    replica: String,
}

/// What goes on the wire: the task (its id in full: the subject holds it encoded) and who asks.
#[derive(Serialize, Deserialize)]
struct CancelRequest {
    task_id: String,
    #[serde(flatten)]
    ask: CancelAsk,
}

/// The subject of `task_id`'s cancels (see `subject_token.rs`); `None`: nobody's task.
fn subject(task_id: &str) -> Option<String> {
    task_token(task_id).map(|t| format!("{PREFIX}.{t}"))
}

impl Cluster {
    /// Asks the other replicas to cancel `task_id`: the name of the one that did, or `None`
    /// when none holds it (for this caller).
    pub async fn cancel_elsewhere(
        &self,
        task_id: &str,
        ask: &CancelAsk,
    ) -> Result<Option<String>, ClusterError> {
        let Some(subject) = subject(task_id) else {
            return Ok(None);
        };
        if self.client.connection_state() != async_nats::connection::State::Connected {
            return Err(ClusterError::JetStream(
                "not connected to the NATS cluster".into(),
            ));
        }
        let payload = serde_json::to_vec(&CancelRequest {
            task_id: task_id.to_string(),
            ask: ask.clone(),
        })
        .map_err(ClusterError::jetstream)?;
        let request = async_nats::Request::new()
            .payload(payload.into())
            .timeout(Some(ANSWER_WAIT));
        match self.client.send_request(subject, request).await {
            Ok(msg) => Ok(serde_json::from_slice::<CancelDone>(&msg.payload)
                .ok()
                .map(|d| d.replica)),
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

    /// Answers the other replicas' cancels until `stop`: `cancel(task_id, ask)` cancels a task
    /// this replica holds and says whether it did.
    pub async fn serve_cancels(
        &self,
        cancel: impl Fn(&str, &CancelAsk) -> bool,
        stop: tokio_util::sync::CancellationToken,
    ) -> Result<(), ClusterError> {
        let mut asks = self
            .client
            .subscribe(format!("{PREFIX}.*"))
            .await
            .map_err(ClusterError::jetstream)?;
        let done = serde_json::to_vec(&CancelDone {
            replica: self.replica.clone(),
        })
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
            let Ok(req) = serde_json::from_slice::<CancelRequest>(&msg.payload) else {
                continue;
            };
            // the subject names the task the payload names, or the request is nobody's
            if subject(&req.task_id).as_deref() != Some(msg.subject.as_str()) {
                continue;
            }
            let (task_id, ask) = (req.task_id.as_str(), req.ask);
            if !cancel(task_id, &ask) {
                continue;
            }
            if let Some(reply) = msg.reply {
                if let Err(e) = self.client.publish(reply, done.clone().into()).await {
                    tracing::warn!(error = %e, task_id, "cluster: cancel done, answer not sent");
                }
            }
        }
    }
}
