//! `response_format`: OpenAI's structured output, as the task's JSON Schema.

use serde::Deserialize;
use serde_json::Value;
use utoipa::ToSchema;

/// `{"type": "text"}` (the default), `{"type": "json_object"}` (any JSON object) or
/// `{"type": "json_schema", "json_schema": {name, schema, strict}}`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

/// The schema of `{"type": "json_schema"}`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    /// The schema's name (`a-z A-Z 0-9 _ -`, at most 64).
    pub name: String,
    pub description: Option<String>,
    /// The JSON Schema; absent, any JSON.
    #[schema(value_type = Option<Object>)]
    pub schema: Option<Value>,
    /// Accepted either way: output always follows the schema here (constrained decoding).
    pub strict: Option<bool>,
}

/// The task's `json_schema` of a request's `response_format`.
pub fn schema_of(format: &Option<ResponseFormat>) -> Result<Option<Value>, crate::error::ApiError> {
    match format {
        Some(f) => f.schema(),
        None => Ok(None),
    }
}

impl ResponseFormat {
    /// The JSON Schema the answer must follow, or `None` for text.
    pub fn schema(&self) -> Result<Option<Value>, crate::error::ApiError> {
        match self {
            Self::Text => Ok(None),
            Self::JsonObject => Ok(Some(serde_json::json!({"type": "object"}))),
            Self::JsonSchema { json_schema } => {
                let n = &json_schema.name;
                let valid = !n.is_empty()
                    && n.len() <= 64
                    && n.chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if !valid {
                    return Err(crate::error::ApiError::invalid(
                        "response_format.json_schema.name",
                        "the name must be 1-64 characters of a-z, A-Z, 0-9, _ and -",
                    ));
                }
                Ok(Some(
                    json_schema.schema.clone().unwrap_or(Value::Bool(true)),
                ))
            }
        }
    }
}
