//! Cancel from any replica: a cancel for a task this replica does not hold goes out on the
//! core NATS subject `orchd.cancel.<task id>` as a request; every replica listens, and the one
//! holding the task (for a caller allowed to see it) cancels it at once and answers with its
//! name. No answer within [`ANSWER_WAIT`]: no replica has it (404).

use std::time::Duration;

use async_nats::client::RequestErrorKind;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::{Cluster, ClusterError};

const PREFIX: &str = "orchd.cancel";
/// How long a replica waits for the one holding a task to answer its cancel.
pub const ANSWER_WAIT: Duration = Duration::from_millis(500);
/// Largest cancel request read (a tenant's name and a flag).
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

/// A task id as a subject token (the server's ids are UUIDs; anything else is nobody's).
fn subject(task_id: &str) -> Option<String> {
    let ok = !task_id.is_empty()
        && task_id.len() <= 128
        && task_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    ok.then(|| format!("{PREFIX}.{task_id}"))
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
        let payload = serde_json::to_vec(ask).map_err(ClusterError::jetstream)?;
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
            let Some(task_id) = msg
                .subject
                .as_str()
                .strip_prefix(PREFIX)
                .and_then(|s| s.strip_prefix('.'))
            else {
                continue;
            };
            if msg.payload.len() > MAX_ASK_BYTES {
                continue;
            }
            let Ok(ask) = serde_json::from_slice::<CancelAsk>(&msg.payload) else {
                continue;
            };
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
