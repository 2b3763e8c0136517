//! The fields of each request and their JSON types. serde's messages for an
//! internally tagged enum do not say which field was wrong ("invalid type:
//! string, expected u64"); checking against this table first lets the reply
//! name the request and the field.

use serde_json::{Map, Value};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Str,
    OptStr,
    U64,
    OptU64,
}

impl Kind {
    fn fits(self, v: &Value) -> bool {
        match self {
            Kind::Str => v.is_string(),
            Kind::OptStr => v.is_string() || v.is_null(),
            Kind::U64 => v.is_u64(),
            Kind::OptU64 => v.is_u64() || v.is_null(),
        }
    }

    fn wants(self) -> &'static str {
        match self {
            Kind::Str => "a string",
            Kind::OptStr => "a string or null",
            Kind::U64 => "a non-negative integer",
            Kind::OptU64 => "a non-negative integer or null",
        }
    }
}

const RUN: &[(&str, Kind)] = &[("run", Kind::Str)];

/// Every op a client may send, with its fields (besides `id` and `op`).
pub const FIELDS: &[(&str, &[(&str, Kind)])] = &[
    ("auth", &[("token", Kind::Str)]),
    (
        "submit",
        &[
            ("config", Kind::OptStr),
            ("config_path", Kind::OptStr),
            ("steps", Kind::OptU64),
            ("flow", Kind::OptStr),
            ("seed", Kind::OptU64),
            ("name", Kind::OptStr),
        ],
    ),
    ("runs", &[]),
    ("status", RUN),
    ("pause", RUN),
    ("resume", RUN),
    ("stop", RUN),
    ("checkpoint", RUN),
    ("checkpoints", RUN),
    ("rollback", &[("run", Kind::Str), ("step", Kind::U64)]),
    ("delete", RUN),
    (
        "metrics",
        &[
            ("run", Kind::Str),
            ("from", Kind::OptU64),
            ("to", Kind::OptU64),
        ],
    ),
    ("events", &[("run", Kind::Str), ("from", Kind::OptU64)]),
    ("subscribe", &[("run", Kind::OptStr)]),
];

/// The fields of `op`; None for an op clients cannot send.
pub fn fields(op: &str) -> Option<&'static [(&'static str, Kind)]> {
    FIELDS.iter().find(|(o, _)| *o == op).map(|(_, f)| *f)
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_u64() => "a non-negative integer",
        Value::Number(n) if n.is_i64() => "a negative integer",
        Value::Number(_) => "a number that is not an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The first field of a request for `op` whose type is wrong, as a message
/// naming the op and the field.
pub fn wrong_field(op: &str, obj: &Map<String, Value>) -> Option<String> {
    let (name, kind, v) = fields(op)?
        .iter()
        .find_map(|&(f, k)| obj.get(f).filter(|v| !k.fits(v)).map(|v| (f, k, v)))?;
    Some(format!(
        "op '{op}': field '{name}' must be {}, not {}",
        kind.wants(),
        json_type(v)
    ))
}
