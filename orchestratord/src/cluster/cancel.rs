//! Cancel from any replica: a cancel for a task this replica does not hold goes out on the
//! core NATS subject `orchd.cancel.<task id>` as a request; every replica listens, and the one
//! holding the task (for a caller allowed to see it) cancels it at once and answers with its
//! name. No answer within [`ANSWER_WAIT`]: no replica has it (404).

use std::time::Duration;

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
        let payload = serde_json::to_vec(&CancelRequest {
            task_id: task_id.to_string(),
            ask: ask.clone(),
        })
        .map_err(ClusterError::jetstream)?;
        let answer = self.ask(subject, payload, ANSWER_WAIT).await?;
        Ok(answer
            .and_then(|a| serde_json::from_slice::<CancelDone>(&a).ok())
            .map(|d| d.replica))
    }

    /// Answers the other replicas' cancels until `stop`: `cancel(task_id, ask)` cancels a task
    /// this replica holds and says whether it did.
    pub async fn serve_cancels(
        &self,
        cancel: impl Fn(&str, &CancelAsk) -> bool,
        stop: tokio_util::sync::CancellationToken,
    ) -> Result<(), ClusterError> {
        let done = serde_json::to_vec(&CancelDone {
            replica: self.replica.clone(),
        })
        .map_err(ClusterError::jetstream)?;
        let answer = |subject_named: &str, payload: &[u8]| {
            let req = serde_json::from_slice::<CancelRequest>(payload).ok()?;
            // the subject names the task the payload names, or the request is nobody's
            if subject(&req.task_id).as_deref() != Some(subject_named) {
                return None;
            }
            cancel(&req.task_id, &req.ask).then(|| done.clone())
        };
        self.answer(format!("{PREFIX}.*"), MAX_ASK_BYTES, stop, answer)
            .await
    }
}
