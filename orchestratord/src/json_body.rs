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
            } else if let Some(within) = crate::body_deadline::elapsed_in(&rej) {
                ApiError::new(
                    ErrorCode::RequestTimeout,
                    format!(
                        "the request body did not arrive within {} ms (http.body_read_timeout_ms)",
                        within.as_millis()
                    ),
                    true,
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
    let mut value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::invalid("body", format!("invalid JSON body: {e}")))?;
    integral_floats_as_integers(&mut value);
    serde_path_to_error::deserialize(value).map_err(|e| {
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

/// 2^64 and -2^63: the integral `f64`s in `[-2^63, 2^64)` are exactly some `u64` or `i64`.
const U64_END: f64 = 18_446_744_073_709_551_616.0;
const I64_MIN: f64 = -9_223_372_036_854_775_808.0;

/// JSON Schema's `integer` is any number with a zero fractional part (`16.0` included), and
/// clients that compute a value in floating point send it that way: every such number becomes
/// an integer before the typed parse, so integer fields accept it and float fields still do.
fn integral_floats_as_integers(value: &mut serde_json::Value) {
    use serde_json::{Number, Value};
    match value {
        Value::Number(n) => {
            let Some(f) = n.as_f64().filter(|_| n.is_f64()) else {
                return;
            };
            if f.is_finite() && f.fract() == 0.0 && (I64_MIN..U64_END).contains(&f) {
                *n = if f >= 0.0 {
                    Number::from(f as u64)
                } else {
                    Number::from(f as i64)
                };
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_floats_as_integers),
        Value::Object(map) => map.values_mut().for_each(integral_floats_as_integers),
        _ => {}
    }
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

    #[derive(Debug, serde::Deserialize)]
    struct Numbers {
        max_tokens: u32,
        temperature: f32,
    }

    /// A number with a zero fraction is an integer (JSON Schema's rule); a fraction is still
    /// refused for an integer field, and float fields take integers.
    #[test]
    fn integral_floats_fill_integer_fields() {
        let n: Numbers = parse(br#"{"max_tokens": 16.0, "temperature": 1}"#).unwrap();
        assert_eq!((n.max_tokens, n.temperature), (16, 1.0));
        let e = parse::<Numbers>(br#"{"max_tokens": 16.5, "temperature": 1}"#).unwrap_err();
        assert_eq!(e.envelope.field.as_deref(), Some("max_tokens"));
        let e = parse::<Numbers>(br#"{"max_tokens": -2.0, "temperature": 1}"#).unwrap_err();
        assert_eq!(e.envelope.field.as_deref(), Some("max_tokens"));
    }
}
