//! The one writer: a thread that takes what to store from a bounded channel and writes it in
//! batches, one transaction each, then applies retention.
//!
//! Task records are queued by [`super::Records::task_ended`] without waiting and gathered for
//! up to `records.batch_ms` into one transaction, so a busy server commits a few times a
//! second however many tasks end. An artifact post waits for its commit; a batch holding one
//! is written at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use contracts::{ArtifactMeta, TaskRecord};
use rusqlite::{params, Connection, OptionalExtension, Transaction};
use tokio::sync::oneshot;

use crate::metrics;
use crate::records::content_id::NewArtifact;
use crate::records::error::RecordsError;
use crate::records::store_file::StoreFile;
use crate::records::{query, schema};

/// Most operations in one transaction.
const MAX_BATCH: usize = 512;
/// Retention runs at least this often (and after a batch that took the store over its bytes).
const PRUNE_EVERY: Duration = Duration::from_secs(30);
/// Rows deleted per statement when over the byte budget.
const PRUNE_CHUNK: i64 = 256;

/// What the writer is asked to do.
pub enum Op {
    Task(Box<TaskRow>),
    Artifact {
        tenant: String,
        artifact: Box<NewArtifact>,
        ack: oneshot::Sender<Result<(ArtifactMeta, bool), RecordsError>>,
    },
    /// Write what is queued, then stop.
    Close(oneshot::Sender<()>),
}

impl Op {
    /// Someone waits for this one: write the batch without lingering.
    fn awaited(&self) -> bool {
        !matches!(self, Op::Task(_))
    }
}

/// An ended task's record.
pub struct TaskRow {
    pub tenant: String,
    pub ended_at_ms: u64,
    pub record: TaskRecord,
}

/// How long and how much is kept.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    pub max_age: Duration,
    pub max_bytes: u64,
}

pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Runs until a `Close` or until every sender is gone.
pub fn run(
    conn: Arc<Mutex<Connection>>,
    file: StoreFile,
    rx: Receiver<Op>,
    retention: Retention,
    linger: Duration,
    total: Arc<AtomicU64>,
) {
    let lock = || conn.lock().unwrap_or_else(|p| p.into_inner());
    prune_logged(&lock(), retention, &total);
    let mut pruned_at = Instant::now();
    let mut lost_before = false;
    metrics::records_store_available(file.lost().is_none());
    loop {
        let first = match rx.recv_timeout(PRUNE_EVERY) {
            Ok(op) => op,
            Err(RecvTimeoutError::Timeout) => {
                metrics::records_store_available(file.lost().is_none());
                prune_logged(&lock(), retention, &total);
                pruned_at = Instant::now();
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return,
        };
        let ops = gather(first, &rx, linger);
        // a file deleted or replaced under us: SQLite would commit into the unlinked file
        let lost = file.lost();
        metrics::records_store_available(lost.is_none());
        match (&lost, lost_before) {
            (Some(why), false) => tracing::error!(%why, "record store: nothing can be stored"),
            (None, true) => tracing::info!("record store: its file is back"),
            _ => {}
        }
        lost_before = lost.is_some();
        let closing = match lost {
            Some(why) => refuse_batch(ops, &why),
            None => write_batch(&mut lock(), ops, &total),
        };
        if total.load(Ordering::Relaxed) > retention.max_bytes || pruned_at.elapsed() >= PRUNE_EVERY
        {
            prune_logged(&lock(), retention, &total);
            pruned_at = Instant::now();
        }
        if let Some(ack) = closing {
            let _ = ack.send(());
            return;
        }
    }
}

/// `first` and whatever follows it within `linger` (none when someone waits).
fn gather(first: Op, rx: &Receiver<Op>, linger: Duration) -> Vec<Op> {
    let until = Instant::now() + linger;
    let mut ops = vec![first];
    while ops.len() < MAX_BATCH {
        let urgent = ops.iter().any(Op::awaited);
        let left = until.saturating_duration_since(Instant::now());
        let next = if urgent || left.is_zero() {
            rx.try_recv().ok()
        } else {
            rx.recv_timeout(left).ok()
        };
        match next {
            Some(op) => ops.push(op),
            None => break,
        }
    }
    ops
}

/// Answers a batch that cannot be stored: its task records are dropped (counted), its artifact
/// posts told why; returns a `Close`'s ack.
fn refuse_batch(ops: Vec<Op>, why: &str) -> Option<oneshot::Sender<()>> {
    let mut closing = None;
    let mut tasks = 0usize;
    for op in ops {
        match op {
            Op::Task(_) => tasks += 1,
            Op::Artifact { ack, .. } => {
                let _ = ack.send(Err(RecordsError::FileLost(why.to_string())));
            }
            Op::Close(ack) => closing = Some(ack),
        }
    }
    metrics::records_dropped(tasks);
    closing
}

/// Writes `ops` in one transaction and answers those who wait; returns a `Close`'s ack.
fn write_batch(
    conn: &mut Connection,
    ops: Vec<Op>,
    total: &AtomicU64,
) -> Option<oneshot::Sender<()>> {
    let mut closing = None;
    let mut acks = Vec::new();
    let mut tasks = 0usize;
    let mut added = 0u64;
    let outcome = (|| -> Result<(), RecordsError> {
        let tx = conn.transaction()?;
        for op in ops {
            match op {
                Op::Task(row) => {
                    added += insert_task(&tx, &row)?;
                    tasks += 1;
                }
                Op::Artifact {
                    tenant,
                    artifact,
                    ack,
                } => {
                    let r = insert_artifact(&tx, &tenant, &artifact);
                    if let Ok((_, true)) = &r {
                        added += artifact.content_json.len() as u64;
                    }
                    acks.push((ack, r));
                }
                Op::Close(ack) => closing = Some(ack),
            }
        }
        tx.commit()?;
        Ok(())
    })();
    match outcome {
        Ok(()) => {
            total.fetch_add(added, Ordering::Relaxed);
            metrics::records_bytes(total.load(Ordering::Relaxed));
            metrics::records_written("task", tasks);
            let stored = acks
                .iter()
                .filter(|(_, r)| matches!(r, Ok((_, true))))
                .count();
            metrics::records_written("artifact", stored);
            for (ack, r) in acks {
                let _ = ack.send(r);
            }
        }
        Err(e) => {
            tracing::error!(error = %e, tasks, "record store: a batch was not written");
            metrics::records_dropped(tasks);
            for (ack, _) in acks {
                let _ = ack.send(Err(RecordsError::WriteFailed(e.to_string())));
            }
        }
    }
    closing
}

/// Stores a task's record (replacing one of the same tenant and id); returns its bytes.
fn insert_task(tx: &Transaction, row: &TaskRow) -> Result<u64, RecordsError> {
    let body = serde_json::to_string(&row.record)?;
    tx.execute(
        "INSERT OR REPLACE INTO task_records
             (tenant, task_id, session_id, ended_at_ms, bytes, body)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![
            row.tenant,
            row.record.task_id,
            row.record.session_id,
            row.ended_at_ms as i64,
            body.len() as i64,
            body
        ],
    )?;
    Ok(body.len() as u64)
}

/// Stores an artifact unless the tenant has it (then adds its tags); returns its metadata and
/// whether it is new. A parent the tenant does not have refuses it.
fn insert_artifact(
    tx: &Transaction,
    tenant: &str,
    a: &NewArtifact,
) -> Result<(ArtifactMeta, bool), RecordsError> {
    for p in &a.parents {
        let known = tx
            .query_row(
                "SELECT 1 FROM artifacts WHERE tenant = ?1 AND id = ?2",
                params![tenant, p],
                |_| Ok(()),
            )
            .optional()?;
        if known.is_none() {
            return Err(RecordsError::UnknownParent(p.clone()));
        }
    }
    let new = tx.execute(
        "INSERT INTO artifacts
             (tenant, id, kind, tags, parents, session_id, task_id, created_at_ms, bytes, content)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
         ON CONFLICT (tenant, id) DO NOTHING",
        params![
            tenant,
            a.id,
            a.kind,
            serde_json::to_string(&a.tags)?,
            serde_json::to_string(&a.parents)?,
            a.session_id,
            a.task_id,
            unix_ms() as i64,
            a.content_json.len() as i64,
            a.content_json
        ],
    )? == 1;
    let mut tag_added = false;
    for t in &a.tags {
        tag_added |= tx.execute(
            "INSERT OR IGNORE INTO artifact_tags (tenant, tag, id) VALUES (?1, ?2, ?3)",
            params![tenant, t, a.id],
        )? == 1;
    }
    if !new && tag_added {
        let mut stmt =
            tx.prepare("SELECT tag FROM artifact_tags WHERE tenant = ?1 AND id = ?2 ORDER BY tag")?;
        let tags = stmt
            .query_map(params![tenant, a.id], |r| r.get::<_, String>(0))?
            .collect::<Result<Vec<_>, _>>()?;
        tx.execute(
            "UPDATE artifacts SET tags = ?3 WHERE tenant = ?1 AND id = ?2",
            params![tenant, a.id, serde_json::to_string(&tags)?],
        )?;
    }
    let meta = query::artifact_meta(tx, tenant, &a.id)?
        .ok_or_else(|| RecordsError::WriteFailed(format!("artifact {} vanished", a.id)))?;
    Ok((meta, new))
}

fn prune_logged(conn: &Connection, retention: Retention, total: &AtomicU64) {
    match prune(conn, retention) {
        Ok(bytes) => {
            total.store(bytes, Ordering::Relaxed);
            metrics::records_bytes(bytes);
        }
        Err(e) => tracing::error!(error = %e, "record store: retention failed"),
    }
}

/// Deletes what is older than the age limit, then the oldest rows (records and artifacts
/// alike) until the store holds at most 90 % of its byte budget, so that the next record does
/// not prune again. Returns the bytes kept.
pub fn prune(conn: &Connection, retention: Retention) -> Result<u64, RecordsError> {
    let cutoff = unix_ms().saturating_sub(retention.max_age.as_millis() as u64) as i64;
    let aged = conn.execute(
        "DELETE FROM task_records WHERE ended_at_ms < ?1",
        params![cutoff],
    )? + conn.execute(
        "DELETE FROM artifacts WHERE created_at_ms < ?1",
        params![cutoff],
    )?;
    metrics::records_pruned("age", aged);
    let mut total = schema::total_bytes(conn)?;
    if total <= retention.max_bytes {
        return Ok(total);
    }
    let target = retention.max_bytes / 10 * 9;
    while total > target {
        let deleted = delete_oldest(conn, total - target)?;
        if deleted == 0 {
            break;
        }
        metrics::records_pruned("bytes", deleted);
        total = schema::total_bytes(conn)?;
    }
    Ok(total)
}

/// Deletes the oldest rows of both tables until `excess` bytes are freed (or
/// [`PRUNE_CHUNK`] rows); returns how many went.
fn delete_oldest(conn: &Connection, excess: u64) -> Result<usize, RecordsError> {
    let mut stmt = conn.prepare(
        "SELECT 'artifacts', rowid, created_at_ms AS at, bytes FROM artifacts
         UNION ALL
         SELECT 'task_records', rowid, ended_at_ms AS at, bytes FROM task_records
         ORDER BY at LIMIT ?1",
    )?;
    let oldest = stmt
        .query_map(params![PRUNE_CHUNK], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(3)?,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let tx = conn.unchecked_transaction()?;
    let (mut freed, mut deleted) = (0u64, 0usize);
    for (table, rowid, bytes) in oldest {
        if freed >= excess {
            break;
        }
        let sql = if table == "artifacts" {
            "DELETE FROM artifacts WHERE rowid = ?1"
        } else {
            "DELETE FROM task_records WHERE rowid = ?1"
        };
        deleted += tx.execute(sql, params![rowid])?;
        freed += bytes.max(0) as u64;
    }
    tx.commit()?;
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> Connection {
        let c = schema::open(":memory:", true).unwrap();
        drop(c.reader);
        Arc::try_unwrap(c.writer)
            .ok()
            .unwrap()
            .into_inner()
            .unwrap()
    }

    fn add(conn: &Connection, id: &str, at_ms: u64, bytes: usize) {
        conn.execute(
            "INSERT INTO artifacts (tenant, id, kind, tags, parents, created_at_ms, bytes, content)
             VALUES ('t', ?1, 'note', '[\"x\"]', '[]', ?2, ?3, ?4)",
            params![id, at_ms as i64, bytes as i64, "x".repeat(bytes)],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO artifact_tags (tenant, tag, id) VALUES ('t', 'x', ?1)",
            params![id],
        )
        .unwrap();
    }

    fn count(conn: &Connection, table: &str) -> i64 {
        conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn rows_past_the_age_limit_go_with_their_tags() {
        let conn = store();
        let now = unix_ms();
        add(&conn, "old", now - 3_600_000, 10);
        add(&conn, "new", now - 1_000, 10);
        let kept = prune(
            &conn,
            Retention {
                max_age: Duration::from_secs(600),
                max_bytes: 1 << 20,
            },
        )
        .unwrap();
        assert_eq!(kept, 10);
        assert_eq!(count(&conn, "artifacts"), 1);
        assert_eq!(
            count(&conn, "artifact_tags"),
            1,
            "tags follow their artifact"
        );
    }

    #[test]
    fn over_the_bytes_the_oldest_go_down_to_nine_tenths() {
        let conn = store();
        let now = unix_ms();
        for i in 0..10 {
            add(&conn, &format!("a{i}"), now - 10_000 + i, 100);
        }
        let kept = prune(
            &conn,
            Retention {
                max_age: Duration::from_secs(600),
                max_bytes: 500,
            },
        )
        .unwrap();
        assert!(kept <= 450, "{kept}");
        let newest: i64 = conn
            .query_row("SELECT COUNT(*) FROM artifacts WHERE id = 'a9'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(newest, 1);
    }
}
