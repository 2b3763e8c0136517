//! Typed access to the fields of a JSON object, with errors that name the file
//! and the field.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::error::ModelError;

/// Reads a JSON file, mapping a missing file and bad JSON to errors naming it.
pub(crate) fn read_json_file(path: &Path) -> Result<Value, ModelError> {
    let bytes = std::fs::read(path).map_err(|e| ModelError::io(path, e))?;
    parse_json(&bytes, path)
}

pub(crate) fn parse_json(bytes: &[u8], path: &Path) -> Result<Value, ModelError> {
    serde_json::from_slice(bytes).map_err(|source| ModelError::Json {
        path: path.to_path_buf(),
        source,
    })
}

/// A short description of a JSON value's type and content, for error messages.
pub(crate) fn describe(v: &Value) -> String {
    let kind = match v {
        Value::Null => return "null".into(),
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    let mut text = v.to_string();
    if text.len() > 60 {
        let mut cut = 57;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("...");
    }
    format!("{kind} ({text})")
}

/// The fields of one JSON object, with the file they came from.
pub(crate) struct Fields<'a> {
    pub path: &'a Path,
    pub obj: &'a Map<String, Value>,
    /// Prefix for field names in messages, e.g. "rope_scaling.".
    pub prefix: String,
}

impl<'a> Fields<'a> {
    /// The top-level object of a JSON document.
    pub fn root(path: &'a Path, v: &'a Value) -> Result<Self, ModelError> {
        match v {
            Value::Object(obj) => Ok(Fields {
                path,
                obj,
                prefix: String::new(),
            }),
            other => Err(ModelError::WrongType {
                path: path.to_path_buf(),
                field: "(top level)".into(),
                expected: "an object",
                found: describe(other),
            }),
        }
    }

    pub fn path_buf(&self) -> PathBuf {
        self.path.to_path_buf()
    }

    pub fn name(&self, field: &str) -> String {
        format!("{}{}", self.prefix, field)
    }

    /// The field's value; `None` when absent or JSON null.
    pub fn get(&self, field: &str) -> Option<&'a Value> {
        match self.obj.get(field) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        }
    }

    pub fn missing(&self, field: &str) -> ModelError {
        ModelError::MissingField {
            path: self.path_buf(),
            field: self.name(field),
        }
    }

    pub fn wrong_type(&self, field: &str, expected: &'static str, v: &Value) -> ModelError {
        ModelError::WrongType {
            path: self.path_buf(),
            field: self.name(field),
            expected,
            found: describe(v),
        }
    }

    pub fn invalid(&self, field: &str, reason: impl Into<String>) -> ModelError {
        ModelError::InvalidField {
            path: self.path_buf(),
            field: self.name(field),
            reason: reason.into(),
        }
    }

    pub fn unsupported(&self, field: &str, v: &Value, reason: impl Into<String>) -> ModelError {
        ModelError::UnsupportedField {
            path: self.path_buf(),
            field: self.name(field),
            value: v.to_string(),
            reason: reason.into(),
        }
    }

    pub fn opt_usize(&self, field: &str) -> Result<Option<usize>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
                Some(n) => Ok(Some(n)),
                None => Err(self.wrong_type(field, "a non-negative integer", v)),
            },
        }
    }

    pub fn req_usize(&self, field: &str) -> Result<usize, ModelError> {
        self.opt_usize(field)?.ok_or_else(|| self.missing(field))
    }

    pub fn usize_or(&self, field: &str, default: usize) -> Result<usize, ModelError> {
        Ok(self.opt_usize(field)?.unwrap_or(default))
    }

    pub fn opt_f64(&self, field: &str) -> Result<Option<f64>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) => Ok(Some(x)),
                None => Err(self.wrong_type(field, "a number", v)),
            },
        }
    }

    pub fn f64_or(&self, field: &str, default: f64) -> Result<f64, ModelError> {
        Ok(self.opt_f64(field)?.unwrap_or(default))
    }

    pub fn req_f64(&self, field: &str) -> Result<f64, ModelError> {
        self.opt_f64(field)?.ok_or_else(|| self.missing(field))
    }

    pub fn bool_or(&self, field: &str, default: bool) -> Result<bool, ModelError> {
        match self.get(field) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => Err(self.wrong_type(field, "a boolean", v)),
        }
    }

    pub fn opt_str(&self, field: &str) -> Result<Option<&'a str>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.as_str())),
            Some(v) => Err(self.wrong_type(field, "a string", v)),
        }
    }

    pub fn opt_object(&self, field: &str) -> Result<Option<Fields<'a>>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Object(obj)) => Ok(Some(Fields {
                path: self.path,
                obj,
                prefix: format!("{}{}.", self.prefix, field),
            })),
            Some(v) => Err(self.wrong_type(field, "an object", v)),
        }
    }

    /// A token id field: absent/null, or an integer that fits in u32.
    pub fn opt_token_id(&self, field: &str) -> Result<Option<u32>, ModelError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
                Some(id) => Ok(Some(id)),
                None => Err(self.wrong_type(field, "a token id (integer)", v)),
            },
        }
    }

    /// A token id list field that HF allows to be an int, a list of ints, or null.
    pub fn token_ids(&self, field: &str) -> Result<Vec<u32>, ModelError> {
        let expected = "a token id or a list of token ids";
        match self.get(field) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| self.wrong_type(field, expected, v))
                })
                .collect(),
            Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
                Some(id) => Ok(vec![id]),
                None => Err(self.wrong_type(field, expected, v)),
            },
        }
    }
}
