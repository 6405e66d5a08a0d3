//! Asking the replica that holds something (a task, a worker) to act on it: a core NATS
//! request on a subject naming the thing, answered only by the replica holding it. The one
//! request–answer exchange behind `cancel.rs` and `worker_control.rs`.

use std::time::Duration;

use async_nats::client::RequestErrorKind;
use bytes::Bytes;
use futures::StreamExt;

use super::{Cluster, ClusterError};

impl Cluster {
    /// Sends `payload` to whoever answers on `subject`: the answer, or `None` when nobody did
    /// within `wait`. Not connected to NATS: an error (the caller cannot know who holds it).
    pub(super) async fn ask(
        &self,
        subject: String,
        payload: Vec<u8>,
        wait: Duration,
    ) -> Result<Option<Bytes>, ClusterError> {
        if !self.connected() {
            return Err(ClusterError::JetStream(
                "not connected to the NATS cluster".into(),
            ));
        }
        let request = async_nats::Request::new()
            .payload(payload.into())
            .timeout(Some(wait));
        match self.client.send_request(subject, request).await {
            Ok(msg) => Ok(Some(msg.payload)),
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

    /// Answers the requests on `subjects` (a wildcard) until `stop`: `answer(subject,
    /// payload)` acts on one (payloads over `max_bytes` are ignored) and returns the answer,
    /// `None` when this replica does not hold what it names (it stays silent).
    pub(super) async fn answer(
        &self,
        subjects: String,
        max_bytes: usize,
        stop: tokio_util::sync::CancellationToken,
        answer: impl Fn(&str, &[u8]) -> Option<Vec<u8>>,
    ) -> Result<(), ClusterError> {
        let mut asks = self
            .client
            .subscribe(subjects)
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
            if msg.payload.len() > max_bytes {
                continue;
            }
            let (Some(reply), Some(body)) = (msg.reply, answer(&msg.subject, &msg.payload)) else {
                continue;
            };
            if let Err(e) = self.client.publish(reply, body.into()).await {
                tracing::warn!(error = %e, subject = %msg.subject, "cluster: done, the answer not sent");
            }
        }
    }
}
