//! Names as NATS subject tokens and stream names: pool ids, queue names and task ids (a
//! client's task id may hold `.` and `:`, which a subject splits on). A name of letters,
//! digits, `-` and `_` that does not start with `x` is used as it is; any other is `x` and its
//! bytes in hex — so two names never share a token.

/// `name` as one subject token.
pub fn subject_token(name: &str) -> String {
    let plain = !name.is_empty()
        && !name.starts_with('x')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if plain {
        return name.to_string();
    }
    let hex: String = name.bytes().map(|b| format!("{b:02x}")).collect();
    format!("x{hex}")
}

/// A task id's token, for a task id only (what admission accepts: the server's UUIDs, a
/// client's 1–128 characters of `A-Za-z0-9-_.:`); `None` for anything else — nobody's task, and
/// never a subject NATS could refuse for its length.
pub fn task_token(task_id: &str) -> Option<String> {
    crate::lifecycle::admission::valid_id(task_id).then(|| subject_token(task_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_tokens_no_two_alike() {
        assert_eq!(subject_token("default"), "default");
        assert_eq!(subject_token("gpu-a_1"), "gpu-a_1");
        assert_eq!(
            subject_token("3f2c9a1e-7b4d-4e0a-9c1f-2d3e4f5a6b7c"),
            "3f2c9a1e-7b4d-4e0a-9c1f-2d3e4f5a6b7c"
        );
        assert_eq!(subject_token("a.b"), "x612e62");
        assert_eq!(subject_token("job:1"), "x6a6f623a31");
        assert_eq!(subject_token("a b>"), "x6120623e");
        // a plain name that looks like an encoded one is encoded itself
        assert_eq!(subject_token("x612e62"), "x78363132653632");
        let names = ["a.b", "a_b", "x612e62", "", "x", "X1", "a:b", "a-b"];
        let tokens: std::collections::BTreeSet<String> =
            names.iter().map(|n| subject_token(n)).collect();
        assert_eq!(tokens.len(), names.len());
        assert_eq!(task_token("job:1").as_deref(), Some("x6a6f623a31"));
        assert_eq!(task_token(&"a".repeat(129)), None);
        assert_eq!(task_token("a>b"), None);
        assert_eq!(task_token(""), None);
        for t in &tokens {
            assert!(
                !t.is_empty() && !t.contains(['.', '*', '>', ' ', ':']),
                "{t}"
            );
        }
    }
}
