//! Task records readable from every replica: each ended task's record, as a replica following
//! it wrote it, is the last message on its own subject of the stream `ORCHD_RECORDS` (one kept
//! per task; `records.max_age_s` and `records.max_bytes` bound it, the oldest going first).
//! A replica's own store (`records/`) still keeps what it saw; a record it does not have is
//! read from here. JetStream rather than PostgreSQL: records are looked up by task id and
//! expire, which a stream with one message per subject does, on the cluster every replica
//! already needs — no second system to run, secure and back up.

use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::stream::{self, DiscardPolicy, LastRawMessageErrorKind, StorageType};
use contracts::TaskRecord;
use serde::{Deserialize, Serialize};

use super::subject_token::task_token;
use super::ClusterError;

const STREAM: &str = "ORCHD_RECORDS";

#[derive(Serialize, Deserialize)]
struct Stored {
    tenant: String,
    record: TaskRecord,
}

fn subject(task_id: &str) -> Option<String> {
    task_token(task_id).map(|t| format!("orchd.records.{t}"))
}

#[derive(Clone)]
pub struct RecordStream {
    js: jetstream::Context,
    stream: stream::Stream,
}

impl RecordStream {
    /// Creates the stream (or opens it as another replica created it).
    pub async fn open(
        js: jetstream::Context,
        replicas: usize,
        keep: Duration,
        max_bytes: u64,
    ) -> Result<Self, ClusterError> {
        let config = stream::Config {
            name: STREAM.into(),
            description: Some("orchestratord task records, one per task".into()),
            subjects: vec!["orchd.records.>".into()],
            max_age: keep,
            max_messages_per_subject: 1,
            max_bytes: max_bytes.min(i64::MAX as u64) as i64,
            discard: DiscardPolicy::Old,
            storage: StorageType::File,
            num_replicas: replicas,
            ..Default::default()
        };
        let stream = match js.get_stream(STREAM).await {
            Ok(s) => s,
            Err(_) => js
                .get_or_create_stream(config)
                .await
                .map_err(ClusterError::jetstream)?,
        };
        Ok(Self { js, stream })
    }

    /// Stores `record` of `tenant`'s task (replacing what another replica stored for it).
    pub async fn put(&self, tenant: &str, record: TaskRecord) -> Result<(), ClusterError> {
        let Some(subject) = subject(&record.task_id) else {
            return Ok(());
        };
        let payload = serde_json::to_vec(&Stored {
            tenant: tenant.to_string(),
            record,
        })
        .map_err(ClusterError::jetstream)?;
        self.js
            .publish(subject, payload.into())
            .await
            .map_err(ClusterError::jetstream)?
            .await
            .map_err(ClusterError::jetstream)?;
        Ok(())
    }

    /// The record of task `id` when `tenant` may see it (`any_tenant`: an admin).
    pub async fn get(
        &self,
        tenant: &str,
        any_tenant: bool,
        id: &str,
    ) -> Result<Option<TaskRecord>, ClusterError> {
        let Some(subject) = subject(id) else {
            return Ok(None);
        };
        let m = match self.stream.get_last_raw_message_by_subject(&subject).await {
            Ok(m) => m,
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
            Err(e) => return Err(ClusterError::jetstream(e)),
        };
        let Ok(stored) = serde_json::from_slice::<Stored>(&m.payload) else {
            return Ok(None);
        };
        Ok((any_tenant || stored.tenant == tenant).then_some(stored.record))
    }
}
