//! The artifact registry (seed 003 §9): structured artifacts (plans, summaries, diffs, traces)
//! stored under content-addressed ids with tags and lineage, and the task records every task
//! leaves, listed side by side.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// The prefix of a content-addressed artifact id: `sha256:` and 64 lowercase hex digits.
pub const ARTIFACT_ID_PREFIX: &str = "sha256:";

/// The `kind` under which task records appear in listings (their id is the task id).
pub const TASK_RECORD_KIND: &str = "task_record";

/// `POST /v1/artifacts`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ArtifactRequest {
    /// What it is: `plan`, `summary`, `diff`, `trace` or another name of 1–32 characters
    /// `[a-z0-9_.-]` (not `task_record`).
    #[schema(pattern = "^[a-z0-9_.-]{1,32}$")]
    pub kind: String,
    /// The artifact itself: any JSON value (an object, an array, a string, …).
    pub content: serde_json::Value,
    /// Labels to find it by (at most 32, each 1–64 characters `[A-Za-z0-9_.:/-]`). Posting the
    /// same artifact again adds its tags to those it has.
    #[serde(default)]
    #[schema(max_items = 32, inline, value_type = Vec<ArtifactTag>)]
    pub tags: Vec<String>,
    /// Lineage: the ids of the artifacts it was made from (at most 16; each must exist).
    #[serde(default)]
    #[schema(max_items = 16, inline, value_type = Vec<ArtifactId>)]
    pub parents: Vec<String>,
    /// The session it belongs to, for listing by session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 128)]
    pub session_id: Option<String>,
    /// The task that produced it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 128)]
    pub task_id: Option<String>,
}

/// A tag: 1–64 characters `[A-Za-z0-9_.:/-]`.
#[derive(ToSchema)]
#[schema(pattern = "^[A-Za-z0-9_.:/-]{1,64}$")]
pub struct ArtifactTag(pub String);

/// A posted artifact's id: `sha256:` and 64 lowercase hex digits.
#[derive(ToSchema)]
#[schema(pattern = "^sha256:[0-9a-f]{64}$")]
pub struct ArtifactId(pub String);

/// An artifact's metadata: what listings return and what a post answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ArtifactMeta {
    /// `sha256:<hex>` of the canonical JSON of kind, content and parents; for a task record,
    /// the task id.
    pub id: String,
    pub kind: String,
    pub tags: Vec<String>,
    pub parents: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// When it was first stored (a task record: when the task ended), Unix ms.
    pub created_at_ms: u64,
    /// Size of the stored JSON.
    pub bytes: u64,
}

/// `GET /v1/artifacts/{id}` for a content-addressed id: the metadata and the content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Artifact {
    #[serde(flatten)]
    pub meta: ArtifactMeta,
    /// Any JSON value, as posted.
    pub content: serde_json::Value,
}

/// `GET /v1/artifacts`: newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ArtifactList {
    pub artifacts: Vec<ArtifactMeta>,
    /// Pass as `before` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// The filters of `GET /v1/artifacts`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ArtifactQuery {
    /// Only artifacts carrying this tag (task records carry none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Only artifacts and task records of this session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Only this kind (`task_record` lists task records only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Page size, 1–500 (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 500)]
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page (`<created_at_ms>:<id>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[0-9]{1,18}:.+$")]
    #[param(pattern = "^[0-9]{1,18}:.+$")]
    pub before: Option<String>,
}

/// What `GET /v1/artifacts/{id}` returns: a posted artifact (a `sha256:` id), or the record
/// of the task with that id (every task leaves one, OC-CTRL-2067).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum StoredArtifact {
    Artifact(Box<Artifact>),
    TaskRecord(Box<crate::task::TaskRecord>),
}
