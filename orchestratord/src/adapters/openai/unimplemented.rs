//! OpenAI request fields this server does not implement. A request that sets one to anything
//! but its neutral value is refused with a 400 naming the field: a client that asked for audio
//! or a web search must never get a 200 answered as if it had not asked.

use serde::Deserialize;
use serde_json::{json, Value};
use utoipa::ToSchema;

use crate::error::ApiError;

/// Fields refused unless neutral (absent, null, false, empty, or the value named).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Unimplemented {
    /// Deprecated function calling (`tools` replaced it): refused unless empty.
    pub functions: Option<Value>,
    pub function_call: Option<Value>,
    /// Log-probabilities are not implemented: refused unless false/null.
    pub logit_bias: Option<Value>,
    /// Text only: refused unless `["text"]`.
    pub modalities: Option<Value>,
    pub audio: Option<Value>,
    pub prediction: Option<Value>,
    pub reasoning_effort: Option<Value>,
    pub verbosity: Option<Value>,
    pub web_search_options: Option<Value>,
    /// Completions are not stored: refused unless false.
    pub store: Option<Value>,
    /// Text after the completion (`/v1/completions`): refused unless empty.
    pub suffix: Option<Value>,
}

/// The fields, each with the value that is neutral besides the empty ones (`also_neutral`).
const FIELDS: [&str; 11] = [
    "functions",
    "function_call",
    "logit_bias",
    "modalities",
    "audio",
    "prediction",
    "reasoning_effort",
    "verbosity",
    "web_search_options",
    "store",
    "suffix",
];

fn also_neutral(name: &str) -> Option<Value> {
    match name {
        "function_call" => Some(json!("none")),
        "modalities" => Some(json!(["text"])),
        _ => None,
    }
}

/// An empty `web_search_options` object turns search on with its defaults.
fn empty_object_asks(name: &str) -> bool {
    name == "web_search_options"
}

/// Written by hand so each field's schema is exactly the values [`Unimplemented::check`] lets
/// pass: null, false, an empty string, array or object, or the field's own neutral value.
impl utoipa::PartialSchema for Unimplemented {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{
            AnyOfBuilder, ArrayBuilder, ObjectBuilder, SchemaType, Type,
        };
        let one = |v: Value| {
            ObjectBuilder::new()
                .schema_type(SchemaType::AnyValue)
                .enum_values(Some([v]))
        };
        let mut object = ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(
                "Fields of OpenAI's API not implemented here: each is refused with a 400 naming \
                 it unless neutral (absent, null, false, empty, or the value its schema allows).",
            ));
        for name in FIELDS {
            let mut neutral = AnyOfBuilder::new()
                .item(ObjectBuilder::new().schema_type(Type::Null))
                .item(one(json!(false)))
                .item(
                    ObjectBuilder::new()
                        .schema_type(Type::String)
                        .max_length(Some(0)),
                )
                .item(ArrayBuilder::new().max_items(Some(0)));
            if !empty_object_asks(name) {
                neutral = neutral.item(
                    ObjectBuilder::new()
                        .schema_type(Type::Object)
                        .max_properties(Some(0)),
                );
            }
            if let Some(v) = also_neutral(name) {
                neutral = neutral.item(one(v));
            }
            object = object.property(
                name,
                neutral.description(Some("Not implemented: refused unless neutral.")),
            );
        }
        object.into()
    }
}

impl ToSchema for Unimplemented {}

fn neutral(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::Number(_) | Value::Bool(true) => false,
    }
}

impl Unimplemented {
    /// The first field set to something this server would not honour, as a 400.
    pub fn check(&self) -> Result<(), ApiError> {
        let values: [&Option<Value>; 11] = [
            &self.functions,
            &self.function_call,
            &self.logit_bias,
            &self.modalities,
            &self.audio,
            &self.prediction,
            &self.reasoning_effort,
            &self.verbosity,
            &self.web_search_options,
            &self.store,
            &self.suffix,
        ];
        for (name, value) in FIELDS.into_iter().zip(values) {
            let Some(v) = value else { continue };
            let empty_asks = empty_object_asks(name) && v.is_object();
            if (neutral(v) && !empty_asks) || also_neutral(name).as_ref() == Some(v) {
                continue;
            }
            return Err(ApiError::invalid(
                name,
                format!("{name} is not supported by this server"),
            ));
        }
        Ok(())
    }
}
