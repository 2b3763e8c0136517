//! Errors of model and tokenizer I/O. Every variant names the file it is about
//! and, where there is one, the tensor or config field.

use std::path::PathBuf;

/// An error while reading, checking or writing a model or tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{}: file not found", .path.display())]
    MissingFile { path: PathBuf },

    #[error(
        "{}: no weights found (expected model.safetensors or model.safetensors.index.json)",
        .dir.display()
    )]
    MissingWeights { dir: PathBuf },

    #[error("{}: invalid JSON: {source}", .path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    #[error("{}: missing field `{field}`", .path.display())]
    MissingField { path: PathBuf, field: String },

    #[error("{}: field `{field}` should be {expected}, found {found}", .path.display())]
    WrongType {
        path: PathBuf,
        field: String,
        expected: &'static str,
        found: String,
    },

    #[error("{}: field `{field}`: {reason}", .path.display())]
    InvalidField {
        path: PathBuf,
        field: String,
        reason: String,
    },

    #[error("{}: unsupported architecture {arch} (supported: LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)", .path.display())]
    UnsupportedArch { path: PathBuf, arch: String },

    #[error("{}: unsupported field `{field}` = {value}: {reason}", .path.display())]
    UnsupportedField {
        path: PathBuf,
        field: String,
        value: String,
        reason: String,
    },

    #[error("{}: tensor `{tensor}` has unsupported dtype {dtype} (supported: F32, F16, BF16)", .path.display())]
    UnsupportedDtype {
        path: PathBuf,
        tensor: String,
        dtype: String,
    },

    #[error("{}: missing tensor `{tensor}`", .path.display())]
    MissingTensor { path: PathBuf, tensor: String },

    #[error("{}: tensor `{tensor}` has shape {found:?}, expected {expected:?}", .path.display())]
    WrongShape {
        path: PathBuf,
        tensor: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },

    #[error("{}: unexpected tensor `{tensor}` (not part of a {arch} model with this config; wrong architecture?)", .path.display())]
    UnexpectedTensor {
        path: PathBuf,
        tensor: String,
        arch: String,
    },

    #[error("{}: tensor `{tensor}` is stored twice (also in {})", .path.display(), .other.display())]
    DuplicateTensor {
        path: PathBuf,
        tensor: String,
        other: PathBuf,
    },

    #[error("{}: invalid safetensors file: {reason}", .path.display())]
    Safetensors { path: PathBuf, reason: String },

    #[error("{}: shard {} listed in the index is missing", .index.display(), .shard.display())]
    MissingShard { index: PathBuf, shard: PathBuf },

    #[error("{}: invalid index: {reason}", .path.display())]
    InvalidIndex { path: PathBuf, reason: String },

    #[error("{}: tokenizer: {reason}", .path.display())]
    Tokenizer { path: PathBuf, reason: String },
}

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        if source.kind() == std::io::ErrorKind::NotFound {
            ModelError::MissingFile { path }
        } else {
            ModelError::Io { path, source }
        }
    }
}
