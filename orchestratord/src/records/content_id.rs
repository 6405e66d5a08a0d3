//! Content-addressed ids and the checks on what a client posts.
//!
//! An artifact's id is `sha256:` + the hex SHA-256 of the canonical JSON of
//! `{"content": …, "kind": …, "parents": […]}`: object keys sorted by their UTF-8 bytes, no
//! whitespace, strings and numbers as serde_json writes them. The same artifact posted twice
//! gets the same id whatever the key order or spacing of the body; its tags, session and task
//! are metadata, outside the id. Parents are part of it (like a commit's): the same text made
//! from other inputs is another artifact.

use contracts::artifact::{ArtifactRequest, ARTIFACT_ID_PREFIX, TASK_RECORD_KIND};
use sha2::{Digest, Sha256};

use crate::records::error::RecordsError;

/// Most tags on one artifact.
pub const MAX_TAGS: usize = 32;
/// Most parents of one artifact.
pub const MAX_PARENTS: usize = 16;
/// Longest session or task id an artifact may name.
const MAX_REF_LEN: usize = 128;

/// `value` as canonical JSON (see the module docs).
pub fn canonical_json(value: &serde_json::Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// The id of an artifact of `kind` with `content` made from `parents`.
pub fn artifact_id(kind: &str, content: &serde_json::Value, parents: &[String]) -> String {
    let whole = serde_json::json!({ "kind": kind, "content": content, "parents": parents });
    let digest = Sha256::digest(canonical_json(&whole).as_bytes());
    format!("{ARTIFACT_ID_PREFIX}{}", hex::encode(digest))
}

/// Whether `id` has the form of a content-addressed artifact id.
pub fn is_artifact_id(id: &str) -> bool {
    id.strip_prefix(ARTIFACT_ID_PREFIX).is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// A posted artifact that passed the checks, with its id and stored content.
#[derive(Debug, Clone)]
pub struct NewArtifact {
    pub id: String,
    pub kind: String,
    /// Sorted, without repeats.
    pub tags: Vec<String>,
    pub parents: Vec<String>,
    pub session_id: Option<String>,
    pub task_id: Option<String>,
    /// The content as canonical JSON (what is stored and counted).
    pub content_json: String,
}

/// Checks `req` and computes its id; `max_bytes` bounds the content's canonical JSON.
pub fn prepare(req: ArtifactRequest, max_bytes: usize) -> Result<NewArtifact, RecordsError> {
    if !valid_kind(&req.kind) {
        return Err(RecordsError::invalid(
            "kind",
            "kind must be 1-32 characters of [a-z0-9_.-] and not \"task_record\"",
        ));
    }
    if req.tags.len() > MAX_TAGS {
        return Err(RecordsError::invalid(
            "tags",
            format!("at most {MAX_TAGS} tags"),
        ));
    }
    if let Some(t) = req.tags.iter().find(|t| !valid_tag(t)) {
        return Err(RecordsError::invalid(
            "tags",
            format!("tag {t:?} must be 1-64 characters of [A-Za-z0-9_.:/-]"),
        ));
    }
    if req.parents.len() > MAX_PARENTS {
        return Err(RecordsError::invalid(
            "parents",
            format!("at most {MAX_PARENTS} parents"),
        ));
    }
    if let Some(p) = req.parents.iter().find(|p| !is_artifact_id(p)) {
        return Err(RecordsError::invalid(
            "parents",
            format!("parent {p:?} is not an artifact id (sha256:<64 hex digits>)"),
        ));
    }
    for (field, v) in [("session_id", &req.session_id), ("task_id", &req.task_id)] {
        if v.as_ref()
            .is_some_and(|v| v.is_empty() || v.len() > MAX_REF_LEN)
        {
            return Err(RecordsError::invalid(
                field,
                format!("{field} must be 1-{MAX_REF_LEN} characters"),
            ));
        }
    }
    let content_json = canonical_json(&req.content);
    if content_json.len() > max_bytes {
        return Err(RecordsError::TooLarge {
            bytes: content_json.len(),
            max: max_bytes,
        });
    }
    let id = artifact_id(&req.kind, &req.content, &req.parents);
    let mut tags = req.tags;
    tags.sort();
    tags.dedup();
    Ok(NewArtifact {
        id,
        kind: req.kind,
        tags,
        parents: req.parents,
        session_id: req.session_id,
        task_id: req.task_id,
        content_json,
    })
}

fn valid_kind(kind: &str) -> bool {
    (1..=32).contains(&kind.len())
        && kind != TASK_RECORD_KIND
        && kind
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b))
}

fn valid_tag(tag: &str) -> bool {
    (1..=64).contains(&tag.len())
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.:/-".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req(content: serde_json::Value) -> ArtifactRequest {
        ArtifactRequest {
            kind: "plan".into(),
            content,
            tags: vec!["b".into(), "a".into(), "b".into()],
            parents: vec![],
            session_id: None,
            task_id: None,
        }
    }

    #[test]
    fn key_order_and_spacing_do_not_change_the_id() {
        let a: serde_json::Value =
            serde_json::from_str(r#"{"steps": [1, 2], "goal": {"x": "é", "a": null}}"#).unwrap();
        let b: serde_json::Value =
            serde_json::from_str(r#"{"goal":{"a":null,"x":"é"},"steps":[1,2]}"#).unwrap();
        assert_eq!(
            canonical_json(&a),
            r#"{"goal":{"a":null,"x":"é"},"steps":[1,2]}"#
        );
        assert_eq!(artifact_id("plan", &a, &[]), artifact_id("plan", &b, &[]));
    }

    #[test]
    fn kind_content_and_parents_each_change_the_id() {
        let c = json!({"t": 1});
        let base = artifact_id("plan", &c, &[]);
        assert!(is_artifact_id(&base));
        assert_ne!(base, artifact_id("summary", &c, &[]));
        assert_ne!(base, artifact_id("plan", &json!({"t": 2}), &[]));
        assert_ne!(base, artifact_id("plan", &c, std::slice::from_ref(&base)));
    }

    #[test]
    fn tags_are_sorted_and_deduplicated_and_outside_the_id() {
        let a = prepare(req(json!("x")), 1024).unwrap();
        assert_eq!(a.tags, ["a", "b"]);
        let mut other = req(json!("x"));
        other.tags = vec!["zzz".into()];
        assert_eq!(prepare(other, 1024).unwrap().id, a.id);
    }

    #[test]
    fn bad_input_is_refused_with_the_field() {
        let mut r = req(json!(1));
        r.kind = "task_record".into();
        assert!(matches!(
            prepare(r, 1024),
            Err(RecordsError::Invalid { field: "kind", .. })
        ));
        let mut r = req(json!(1));
        r.tags = vec!["has space".into()];
        assert!(matches!(
            prepare(r, 1024),
            Err(RecordsError::Invalid { field: "tags", .. })
        ));
        let mut r = req(json!(1));
        r.parents = vec!["sha256:abc".into()];
        assert!(matches!(
            prepare(r, 1024),
            Err(RecordsError::Invalid {
                field: "parents",
                ..
            })
        ));
        let r = req(json!("a long string"));
        assert!(matches!(
            prepare(r, 4),
            Err(RecordsError::TooLarge { max: 4, .. })
        ));
    }
}
