//! A JSON extractor whose every failure is a typed `ApiError` naming the field at fault.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use contracts::ErrorCode;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// Like `axum::Json`, but malformed JSON, wrong types, unknown fields, invalid UTF-8 and
/// oversized bodies become 400 `INVALID_PARAMS` / 413 `PAYLOAD_TOO_LARGE` envelopes.
pub struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rej| {
            if rej.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    ErrorCode::PayloadTooLarge,
                    "request body exceeds the configured limit",
                    false,
                )
            } else {
                ApiError::invalid("body", format!("cannot read body: {rej}"))
            }
        })?;
        parse(&bytes).map(JsonBody)
    }
}

/// Parses `bytes` as `T`, naming the path of the first bad field.
pub fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if std::str::from_utf8(bytes).is_err() {
        return Err(ApiError::invalid("body", "body is not valid UTF-8"));
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." || path == "?" || path.is_empty() {
            named_field(e.inner()).unwrap_or_else(|| "body".to_string())
        } else if let Some(missing) = missing_field(e.inner()) {
            // a missing field inside an object: report its full path
            format!("{path}.{missing}")
        } else {
            path
        };
        ApiError::invalid(field, format!("invalid JSON body: {}", e.inner()))
    })
}

fn missing_field(e: &serde_json::Error) -> Option<String> {
    let msg = e.to_string();
    Some(
        msg.strip_prefix("missing field `")?
            .split('`')
            .next()?
            .to_string(),
    )
}

/// The field an "unknown field" or "missing field" error names.
fn named_field(e: &serde_json::Error) -> Option<String> {
    let msg = e.to_string();
    let rest = msg
        .strip_prefix("unknown field `")
        .or_else(|| msg.strip_prefix("missing field `"))?;
    Some(rest.split('`').next()?.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        role: String,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        model: String,
        messages: Vec<Inner>,
    }

    fn field_of(body: &str) -> String {
        parse::<Outer>(body.as_bytes())
            .unwrap_err()
            .envelope
            .field
            .clone()
            .unwrap()
    }

    /// ORCH-ADM-1: every 400 names the field at fault, missing and unknown ones included.
    #[test]
    fn errors_name_the_field() {
        assert_eq!(field_of(r#"{"messages": []}"#), "model");
        assert_eq!(
            field_of(r#"{"model": "m", "messages": [{}]}"#),
            "messages[0].role"
        );
        assert_eq!(field_of(r#"{"model": "m", "messages": [], "x": 1}"#), "x");
        assert_eq!(field_of(r#"{"model": 3, "messages": []}"#), "model");
        assert!(field_of(r#"{"model": "m", "messages": [{"role": "u", "y": 1}]}"#).ends_with('y'));
        assert_eq!(field_of("{"), "body");
    }
}
