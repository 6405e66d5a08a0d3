//! Reading records and artifacts back: by id, and listed newest first by tag, session or kind.

use contracts::artifact::TASK_RECORD_KIND;
use contracts::{Artifact, ArtifactList, ArtifactMeta, ArtifactQuery, TaskRecord};
use rusqlite::types::Value;
use rusqlite::{params, Connection, OptionalExtension, Row};

use crate::records::error::RecordsError;

/// Default and largest page of a listing.
pub const DEFAULT_PAGE: u32 = 100;
pub const MAX_PAGE: u32 = 500;

const META_COLUMNS: &str = "id, kind, tags, parents, session_id, task_id, created_at_ms, bytes";

/// Listings see artifacts and task records as one table.
const ALL_ROWS: &str = "
    SELECT tenant, id, kind, tags, parents, session_id, task_id, created_at_ms, bytes
      FROM artifacts
    UNION ALL
    SELECT tenant, task_id, 'task_record', '[]', '[]', session_id, task_id, ended_at_ms, bytes
      FROM task_records";

fn meta_of(r: &Row<'_>) -> rusqlite::Result<(ArtifactMeta, String, String)> {
    Ok((
        ArtifactMeta {
            id: r.get(0)?,
            kind: r.get(1)?,
            tags: Vec::new(),
            parents: Vec::new(),
            session_id: r.get(4)?,
            task_id: r.get(5)?,
            created_at_ms: r.get::<_, i64>(6)?.max(0) as u64,
            bytes: r.get::<_, i64>(7)?.max(0) as u64,
        },
        r.get(2)?,
        r.get(3)?,
    ))
}

fn finish(parts: (ArtifactMeta, String, String)) -> Result<ArtifactMeta, RecordsError> {
    let (mut meta, tags, parents) = parts;
    meta.tags = serde_json::from_str(&tags)?;
    meta.parents = serde_json::from_str(&parents)?;
    Ok(meta)
}

/// The metadata of `tenant`'s artifact `id`.
pub fn artifact_meta(
    conn: &Connection,
    tenant: &str,
    id: &str,
) -> Result<Option<ArtifactMeta>, RecordsError> {
    conn.query_row(
        &format!("SELECT {META_COLUMNS} FROM artifacts WHERE tenant = ?1 AND id = ?2"),
        params![tenant, id],
        meta_of,
    )
    .optional()?
    .map(finish)
    .transpose()
}

/// Which tenant's rows a read may see: one tenant's, or (an admin) the caller's first and
/// then anyone's.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    pub tenant: &'a str,
    pub any_tenant: bool,
}

impl Scope<'_> {
    /// `WHERE` clause on `tenant` with `?1` the caller's tenant, and the order that puts the
    /// caller's own row first.
    fn clause(&self) -> (&'static str, &'static str) {
        if self.any_tenant {
            ("1 = 1", "ORDER BY tenant = ?1 DESC LIMIT 1")
        } else {
            ("tenant = ?1", "LIMIT 1")
        }
    }
}

/// The artifact `id` (content-addressed) with its content.
pub fn artifact(
    conn: &Connection,
    scope: Scope<'_>,
    id: &str,
) -> Result<Option<Artifact>, RecordsError> {
    let (who, order) = scope.clause();
    let row = conn
        .query_row(
            &format!(
                "SELECT {META_COLUMNS}, content FROM artifacts WHERE ({who}) AND id = ?2 {order}"
            ),
            params![scope.tenant, id],
            |r| Ok((meta_of(r)?, r.get::<_, String>(8)?)),
        )
        .optional()?;
    let Some((parts, content)) = row else {
        return Ok(None);
    };
    Ok(Some(Artifact {
        meta: finish(parts)?,
        content: serde_json::from_str(&content)?,
    }))
}

/// The stored record of task `id`.
pub fn task_record(
    conn: &Connection,
    scope: Scope<'_>,
    id: &str,
) -> Result<Option<TaskRecord>, RecordsError> {
    let (who, order) = scope.clause();
    let body = conn
        .query_row(
            &format!("SELECT body FROM task_records WHERE ({who}) AND task_id = ?2 {order}"),
            params![scope.tenant, id],
            |r| r.get::<_, String>(0),
        )
        .optional()?;
    Ok(body.map(|b| serde_json::from_str(&b)).transpose()?)
}

/// A page of artifacts and task records, newest first. The cursor is
/// `<created_at_ms>:<id>` of the last row of the previous page.
pub fn list(
    conn: &Connection,
    scope: Scope<'_>,
    q: &ArtifactQuery,
) -> Result<ArtifactList, RecordsError> {
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(RecordsError::invalid(
            "limit",
            format!("limit must be 1-{MAX_PAGE}"),
        ));
    }
    let mut conds: Vec<String> = Vec::new();
    let mut args: Vec<Value> = Vec::new();
    let arg = |v: Value, args: &mut Vec<Value>| {
        args.push(v);
        format!("?{}", args.len())
    };
    if !scope.any_tenant {
        conds.push(format!(
            "tenant = {}",
            arg(scope.tenant.to_string().into(), &mut args)
        ));
    }
    if let Some(s) = &q.session_id {
        conds.push(format!("session_id = {}", arg(s.clone().into(), &mut args)));
    }
    if let Some(k) = &q.kind {
        conds.push(format!("kind = {}", arg(k.clone().into(), &mut args)));
    }
    if let Some(t) = &q.tag {
        let tag = arg(t.clone().into(), &mut args);
        conds.push(format!(
            "kind <> '{TASK_RECORD_KIND}' AND EXISTS (SELECT 1 FROM artifact_tags g
                 WHERE g.tenant = rows.tenant AND g.id = rows.id AND g.tag = {tag})"
        ));
    }
    if let Some(c) = &q.before {
        let (ms, id) = parse_cursor(c)?;
        let ms = arg(ms.into(), &mut args);
        let id = arg(id.into(), &mut args);
        conds.push(format!(
            "(created_at_ms < {ms} OR (created_at_ms = {ms} AND id < {id}))"
        ));
    }
    let filter = if conds.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", conds.join(" AND "))
    };
    let page = arg(i64::from(limit + 1).into(), &mut args);
    let sql = format!(
        "SELECT {META_COLUMNS} FROM ({ALL_ROWS}) AS rows {filter}
         ORDER BY created_at_ms DESC, id DESC LIMIT {page}"
    );
    let mut stmt = conn.prepare(&sql)?;
    let mut artifacts = stmt
        .query_map(rusqlite::params_from_iter(args), meta_of)?
        .map(|r| finish(r?))
        .collect::<Result<Vec<_>, _>>()?;
    let next_cursor = if artifacts.len() > limit as usize {
        artifacts.truncate(limit as usize);
        artifacts
            .last()
            .map(|m| format!("{}:{}", m.created_at_ms, m.id))
    } else {
        None
    };
    Ok(ArtifactList {
        artifacts,
        next_cursor,
    })
}

fn parse_cursor(c: &str) -> Result<(i64, String), RecordsError> {
    c.split_once(':')
        .and_then(|(ms, id)| Some((ms.parse::<i64>().ok()?, id.to_string())))
        .filter(|(_, id)| !id.is_empty())
        .ok_or_else(|| RecordsError::invalid("before", "before must be a next_cursor"))
}
