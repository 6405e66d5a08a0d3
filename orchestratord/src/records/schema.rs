//! The database: its tables, and opening it (a file in WAL mode, or memory).
//!
//! `task_records` holds one row per ended task (its [`contracts::TaskRecord`] as JSON);
//! `artifacts` one row per posted artifact and tenant, `artifact_tags` its tags (for listing by
//! tag; deleted with the artifact). Each row carries `bytes`, the length of its stored JSON,
//! which retention adds up.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::Connection;

use crate::records::error::RecordsError;

/// The schema version in `PRAGMA user_version`.
const SCHEMA_VERSION: i64 = 1;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS task_records (
    tenant TEXT NOT NULL,
    task_id TEXT NOT NULL,
    session_id TEXT,
    ended_at_ms INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (tenant, task_id)
);
CREATE INDEX IF NOT EXISTS task_records_by_time ON task_records (ended_at_ms);
CREATE INDEX IF NOT EXISTS task_records_by_session
    ON task_records (tenant, session_id, ended_at_ms);
CREATE TABLE IF NOT EXISTS artifacts (
    tenant TEXT NOT NULL,
    id TEXT NOT NULL,
    kind TEXT NOT NULL,
    tags TEXT NOT NULL,
    parents TEXT NOT NULL,
    session_id TEXT,
    task_id TEXT,
    created_at_ms INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    content TEXT NOT NULL,
    PRIMARY KEY (tenant, id)
);
CREATE INDEX IF NOT EXISTS artifacts_by_time ON artifacts (created_at_ms);
CREATE INDEX IF NOT EXISTS artifacts_by_session ON artifacts (tenant, session_id, created_at_ms);
CREATE TABLE IF NOT EXISTS artifact_tags (
    tenant TEXT NOT NULL,
    tag TEXT NOT NULL,
    id TEXT NOT NULL,
    PRIMARY KEY (tenant, tag, id),
    FOREIGN KEY (tenant, id) REFERENCES artifacts (tenant, id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS artifact_tags_by_artifact ON artifact_tags (tenant, id);
";

/// The connections of a store: the writer's and the readers'. In memory they are one (a
/// memory database is private to its connection).
pub struct Connections {
    pub writer: Arc<Mutex<Connection>>,
    pub reader: Arc<Mutex<Connection>>,
}

/// Opens (creating when needed) the database at `path`, or one in memory for `":memory:"`.
pub fn open(path: &str, in_memory: bool) -> Result<Connections, RecordsError> {
    if in_memory {
        let conn = Connection::open_in_memory()?;
        prepare(&conn)?;
        let shared = Arc::new(Mutex::new(conn));
        return Ok(Connections {
            writer: shared.clone(),
            reader: shared,
        });
    }
    if let Some(dir) = Path::new(path)
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
    {
        std::fs::create_dir_all(dir)?;
    }
    let writer = Connection::open(path)?;
    prepare(&writer)?;
    let reader = Connection::open(path)?;
    pragmas(&reader)?;
    Ok(Connections {
        writer: Arc::new(Mutex::new(writer)),
        reader: Arc::new(Mutex::new(reader)),
    })
}

fn pragmas(conn: &Connection) -> Result<(), RecordsError> {
    // first: another process opening the same file holds its lock for a moment
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    // WAL: readers never wait for the writer; NORMAL: a commit survives a crash of the
    // process (not of the machine's power) without an fsync per commit
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(())
}

fn prepare(conn: &Connection) -> Result<(), RecordsError> {
    pragmas(conn)?;
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(RecordsError::Schema(format!(
            "the database has schema version {version}; this build knows {SCHEMA_VERSION}"
        )));
    }
    conn.execute_batch(SCHEMA)?;
    conn.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    Ok(())
}

/// The stored bytes of both tables.
pub fn total_bytes(conn: &Connection) -> Result<u64, RecordsError> {
    let n: i64 = conn.query_row(
        "SELECT (SELECT COALESCE(SUM(bytes), 0) FROM task_records)
              + (SELECT COALESCE(SUM(bytes), 0) FROM artifacts)",
        [],
        |r| r.get(0),
    )?;
    Ok(n.max(0) as u64)
}
