//! `/completion`'s `prompt` in every form llama-server takes (LLS-API-1): a string, token ids
//! (`[12, 34]`), ids and text mixed (`[12, " and", 34]`: one prompt), or several prompts (an
//! array of strings and of such arrays), each its own task and its own result by `index`.

use contracts::PromptPart;
use serde_json::Value;

pub use crate::adapters::raw_prompt::RawPrompt as Prompt;
use crate::error::ApiError;

/// The prompts of `prompt`, read as llama-server reads them: an array of numbers, or of
/// numbers and strings, is one prompt; an array holding only strings, or arrays, is several.
pub fn prompts_of(prompt: Option<&Value>, max_prompts: usize) -> Result<Vec<Prompt>, ApiError> {
    let items = match prompt {
        None => return Err(ApiError::invalid("prompt", "prompt is required")),
        Some(Value::String(s)) => return Ok(vec![Prompt::Text(s.clone())]),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::invalid("prompt", "the prompt array is empty"))
        }
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(ApiError::invalid(
                "prompt",
                "prompt must be a string, token ids, or an array of prompts",
            ))
        }
    };
    if items.iter().any(Value::is_number) {
        return Ok(vec![Prompt::Parts(parts_of(items, "prompt")?)]);
    }
    if items.len() > max_prompts {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "{} prompts in one request; at most {max_prompts}",
                items.len()
            ),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) => Ok(Prompt::Text(s.clone())),
            Value::Array(parts) if !parts.is_empty() => {
                Ok(Prompt::Parts(parts_of(parts, &format!("prompt[{i}]"))?))
            }
            _ => Err(ApiError::invalid(
                format!("prompt[{i}]"),
                "each prompt is a string or a non-empty array of token ids and strings",
            )),
        })
        .collect()
}

/// One prompt of ids and text pieces; `field` names it in a refusal.
fn parts_of(items: &[Value], field: &str) -> Result<Vec<PromptPart>, ApiError> {
    items
        .iter()
        .enumerate()
        .map(|(i, item)| match item {
            Value::String(s) => Ok(PromptPart::Text(s.clone())),
            Value::Number(n) => n
                .as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .map(PromptPart::Token)
                .ok_or_else(|| {
                    ApiError::invalid(
                        format!("{field}[{i}]"),
                        format!("{n} is not a token id (an integer from 0)"),
                    )
                }),
            _ => Err(ApiError::invalid(
                format!("{field}[{i}]"),
                "a prompt's items are token ids and strings",
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(v: Value) -> Result<Vec<Prompt>, ApiError> {
        prompts_of(Some(&v), 4)
    }

    fn text(s: &str) -> PromptPart {
        PromptPart::Text(s.into())
    }

    /// LLS-API-1: llama-server's README's forms — a string, ids, ids and text mixed (one
    /// prompt), strings (several), and several of mixed kinds.
    #[test]
    fn every_prompt_form_of_llama_servers_readme_is_read_as_it_reads_it() {
        assert_eq!(read(json!("hi")).unwrap(), vec![Prompt::Text("hi".into())]);
        assert_eq!(
            read(json!([12, 34, 56])).unwrap(),
            vec![Prompt::Parts(vec![
                PromptPart::Token(12),
                PromptPart::Token(34),
                PromptPart::Token(56)
            ])]
        );
        assert_eq!(
            read(json!([12, 34, "string", 56])).unwrap(),
            vec![Prompt::Parts(vec![
                PromptPart::Token(12),
                PromptPart::Token(34),
                text("string"),
                PromptPart::Token(56)
            ])]
        );
        assert_eq!(
            read(json!(["string1", "string2"])).unwrap(),
            vec![
                Prompt::Text("string1".into()),
                Prompt::Text("string2".into())
            ]
        );
        assert_eq!(
            read(json!([[12, 34, "string", 56], [12, 34], "string"])).unwrap(),
            vec![
                Prompt::Parts(vec![
                    PromptPart::Token(12),
                    PromptPart::Token(34),
                    text("string"),
                    PromptPart::Token(56)
                ]),
                Prompt::Parts(vec![PromptPart::Token(12), PromptPart::Token(34)]),
                Prompt::Text("string".into()),
            ]
        );
    }

    /// LLS-API-1: what is not a prompt is refused naming the item; more prompts than the
    /// server takes in one request are refused (ids in one prompt are not counted so).
    #[test]
    fn bad_prompts_are_refused_naming_the_item() {
        for (v, field) in [
            (json!([]), "prompt"),
            (json!(7), "prompt"),
            (json!([1, -2]), "prompt[1]"),
            (json!([1, 2.5]), "prompt[1]"),
            (json!([1, 4294967296u64]), "prompt[1]"),
            (json!([1, null]), "prompt[1]"),
            (json!(["a", []]), "prompt[1]"),
            (json!(["a", [1, [2]]]), "prompt[1][1]"),
            (json!(["a", {}]), "prompt[1]"),
            (json!(["a", "b", "c", "d", "e"]), "prompt"),
        ] {
            let e = read(v.clone()).unwrap_err();
            assert_eq!(e.envelope.field.as_deref(), Some(field), "{v}");
        }
        assert_eq!(read(json!([1, 2, 3, 4, 5, 6])).unwrap().len(), 1);
        assert!(prompts_of(None, 4).is_err());
    }
}
