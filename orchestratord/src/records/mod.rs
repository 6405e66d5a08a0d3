//! Records that outlive the process: every ended task's record and the artifacts clients post
//! (seed 003 §9), in an embedded SQLite database (`records.path`).
//!
//! One writer thread ([`writer`]) owns every write: task records reach it through a bounded
//! channel that a task's end never waits on (full: the record is dropped and counted), and
//! are written in batches; artifact posts wait for their commit. Reads use their own
//! connection (the file is in WAL mode, so they never wait for the writer), off the async
//! runtime. Retention keeps the store under `records.max_age_s` and `records.max_bytes`.
//! At shutdown [`Records::close`] writes what is queued.

pub mod content_id;
pub mod error;
pub mod query;
pub mod schema;
pub mod store_file;
pub mod writer;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use contracts::{Artifact, ArtifactList, ArtifactMeta, ArtifactQuery, ArtifactRequest, TaskRecord};
use rusqlite::Connection;
use tokio::sync::oneshot;

use crate::config::RecordsConfig;
use crate::metrics;
pub use error::RecordsError;
pub use query::Scope;
use writer::{Op, Retention, TaskRow};

/// The record store; without one (`records.enabled = false`) nothing is kept, reads find
/// nothing and posting an artifact is refused.
pub struct Records {
    store: Option<Store>,
}

struct Store {
    tx: SyncSender<Op>,
    reader: Arc<Mutex<Connection>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Bytes stored, as the writer last counted them.
    total_bytes: Arc<AtomicU64>,
    max_artifact_bytes: usize,
}

impl Records {
    /// Opens the store of `cfg` and starts its writer (none when disabled).
    pub fn open(cfg: &RecordsConfig) -> Result<Self, RecordsError> {
        let store = if cfg.enabled {
            Some(Store::open(cfg)?)
        } else {
            None
        };
        Ok(Self { store })
    }

    fn store(&self) -> Result<&Store, RecordsError> {
        self.store.as_ref().ok_or(RecordsError::Disabled)
    }

    pub fn total_bytes(&self) -> u64 {
        self.store
            .as_ref()
            .map_or(0, |s| s.total_bytes.load(Ordering::Relaxed))
    }

    /// Queues an ended task's record for the writer; never waits.
    pub fn task_ended(&self, tenant: &str, record: TaskRecord) {
        if let Some(s) = &self.store {
            s.task_ended(tenant, record);
        }
    }

    /// Stores an artifact for `tenant` (or adds the tags of one it has); returns its metadata
    /// and whether it is new, once committed.
    pub async fn put_artifact(
        &self,
        tenant: &str,
        req: ArtifactRequest,
    ) -> Result<(ArtifactMeta, bool), RecordsError> {
        self.store()?.put_artifact(tenant, req).await
    }

    /// The content-addressed artifact `id`.
    pub async fn artifact(
        &self,
        tenant: &str,
        any_tenant: bool,
        id: &str,
    ) -> Result<Option<Artifact>, RecordsError> {
        let Some(s) = &self.store else {
            return Ok(None);
        };
        let (tenant, id) = (tenant.to_string(), id.to_string());
        s.read(move |c| query::artifact(c, scope(&tenant, any_tenant), &id))
            .await
    }

    /// The stored record of task `id`.
    pub async fn task_record(
        &self,
        tenant: &str,
        any_tenant: bool,
        id: &str,
    ) -> Result<Option<TaskRecord>, RecordsError> {
        let Some(s) = &self.store else {
            return Ok(None);
        };
        let (tenant, id) = (tenant.to_string(), id.to_string());
        s.read(move |c| query::task_record(c, scope(&tenant, any_tenant), &id))
            .await
    }

    /// A page of artifacts and task records.
    pub async fn list(
        &self,
        tenant: &str,
        any_tenant: bool,
        q: ArtifactQuery,
    ) -> Result<ArtifactList, RecordsError> {
        let Some(s) = &self.store else {
            return Ok(ArtifactList {
                artifacts: Vec::new(),
                next_cursor: None,
            });
        };
        let tenant = tenant.to_string();
        s.read(move |c| query::list(c, scope(&tenant, any_tenant), &q))
            .await
    }

    /// Writes what is queued and stops the writer; later records are dropped (counted).
    pub async fn close(&self) {
        if let Some(s) = &self.store {
            s.close().await;
        }
    }
}

impl Store {
    fn open(cfg: &RecordsConfig) -> Result<Self, RecordsError> {
        let in_memory = cfg.path == RecordsConfig::IN_MEMORY;
        let conns = schema::open(&cfg.path, in_memory)?;
        let total_bytes = Arc::new(AtomicU64::new(0));
        let (tx, rx) = sync_channel(cfg.queue_capacity);
        let retention = Retention {
            max_age: Duration::from_secs(cfg.max_age_s),
            max_bytes: cfg.max_bytes,
        };
        let linger = Duration::from_millis(cfg.batch_ms);
        let file = store_file::StoreFile::at((!in_memory).then(|| cfg.path.clone().into()));
        let (conn, total) = (conns.writer, total_bytes.clone());
        let handle = std::thread::Builder::new()
            .name("orchd-records".into())
            .spawn(move || writer::run(conn, file, rx, retention, linger, total))?;
        Ok(Store {
            tx,
            reader: conns.reader,
            writer: Mutex::new(Some(handle)),
            total_bytes,
            max_artifact_bytes: cfg.max_artifact_bytes,
        })
    }

    fn task_ended(&self, tenant: &str, record: TaskRecord) {
        let row = TaskRow {
            tenant: tenant.to_string(),
            ended_at_ms: writer::unix_ms(),
            record,
        };
        match self.tx.try_send(Op::Task(Box::new(row))) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                metrics::records_dropped(1);
                tracing::warn!("record store: writer queue full, a task record was dropped");
            }
            Err(TrySendError::Disconnected(_)) => metrics::records_dropped(1),
        }
    }

    async fn put_artifact(
        &self,
        tenant: &str,
        req: ArtifactRequest,
    ) -> Result<(ArtifactMeta, bool), RecordsError> {
        let artifact = content_id::prepare(req, self.max_artifact_bytes)?;
        let (ack, done) = oneshot::channel();
        let op = Op::Artifact {
            tenant: tenant.to_string(),
            artifact: Box::new(artifact),
            ack,
        };
        match self.tx.try_send(op) {
            Ok(()) => {}
            Err(TrySendError::Full(op)) => {
                // the queue is full of task records: wait for room off the runtime
                let tx = self.tx.clone();
                tokio::task::spawn_blocking(move || tx.send(op))
                    .await
                    .map_err(|_| RecordsError::Closed)?
                    .map_err(|_| RecordsError::Closed)?;
            }
            Err(TrySendError::Disconnected(_)) => return Err(RecordsError::Closed),
        }
        done.await.map_err(|_| RecordsError::Closed)?
    }

    /// Runs `read` on the reader connection off the async runtime.
    async fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&Connection) -> Result<T, RecordsError> + Send + 'static,
    ) -> Result<T, RecordsError> {
        let conn = self.reader.clone();
        tokio::task::spawn_blocking(move || {
            let conn = conn.lock().unwrap_or_else(|p| p.into_inner());
            read(&conn)
        })
        .await
        .map_err(|_| RecordsError::Closed)?
    }

    async fn close(&self) {
        let (ack, done) = oneshot::channel();
        let tx = self.tx.clone();
        let sent = tokio::task::spawn_blocking(move || tx.send(Op::Close(ack)).is_ok()).await;
        if matches!(sent, Ok(true)) {
            let _ = done.await;
        }
        let handle = self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            let _ = tokio::task::spawn_blocking(move || h.join()).await;
        }
    }
}

fn scope(tenant: &str, any_tenant: bool) -> Scope<'_> {
    Scope { tenant, any_tenant }
}
