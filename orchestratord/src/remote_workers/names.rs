//! The names a worker may give itself and its models. They reach every tenant's
//! `/v1/models`, pool ids, logs and metric labels, so only a documented set passes:
//! - a worker name: 1–64 of `A-Z a-z 0-9 . _ -`, starting with a letter or digit (empty:
//!   `worker`);
//! - a model name: 1–128 of `A-Z a-z 0-9 . _ - : / @ +` (what hub and Ollama names use, e.g.
//!   `llama3.1:8b`, `Qwen/Qwen2.5-7B-Instruct`), starting with a letter or digit, with no
//!   `..` and no `//`; and not a name a pool of this server already answers to.
//!
//! Control characters, bidirectional overrides, newlines and path walks never pass.

/// Why a worker name is refused, if it is.
pub fn worker_name_problem(name: &str) -> Option<String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "._-".contains(c);
    problem(name, 64, ok_char, "A-Z a-z 0-9 . _ -")
}

/// Why a model name is refused by its form, if it is.
pub fn model_name_problem(name: &str) -> Option<String> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "._-:/@+".contains(c);
    if let Some(p) = problem(name, 128, ok_char, "A-Z a-z 0-9 . _ - : / @ +") {
        return Some(p);
    }
    if name.contains("..") || name.contains("//") {
        return Some("'..' and '//' are not allowed".into());
    }
    None
}

fn problem(name: &str, max: usize, ok_char: impl Fn(char) -> bool, set: &str) -> Option<String> {
    if name.is_empty() || name.len() > max {
        return Some(format!("1 to {max} characters"));
    }
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Some("must start with a letter or digit".into());
    }
    if !name.chars().all(ok_char) {
        return Some(format!("only {set} are allowed"));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// WRK-NAME-1: the names people use pass; control characters, bidirectional overrides,
    /// newlines, path walks and overlong names do not.
    #[test]
    fn names_outside_the_set_are_refused() {
        for ok in [
            "llama3-8b",
            "llama3.1:8b",
            "Qwen/Qwen2.5-7B-Instruct",
            "hf.co/a/b:Q4_K_M",
        ] {
            assert_eq!(model_name_problem(ok), None, "{ok}");
        }
        let long = "m".repeat(129);
        for bad in [
            "",
            "bad\0nul",
            "\u{202e}evil",
            "line\nbreak",
            "../../etc/passwd",
            "a/../b",
            "/abs",
            "a//b",
            "sp ace",
            long.as_str(),
        ] {
            assert!(model_name_problem(bad).is_some(), "{bad:?}");
        }
        assert_eq!(worker_name_problem("gpu-box-1.local"), None);
        for bad in [
            "../x",
            "a/b",
            "-lead",
            "tab\t",
            "\u{202e}x",
            &"w".repeat(65),
        ] {
            assert!(worker_name_problem(bad).is_some(), "{bad:?}");
        }
    }
}
