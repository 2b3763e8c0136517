//! Errors from building tasks.

use std::path::PathBuf;

/// Why a task could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// A config value is out of range or inconsistent.
    #[error("task config: field `{field}`: {message}")]
    Config {
        field: &'static str,
        message: String,
    },
    /// A dataset file could not be read.
    #[error("reading dataset {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A dataset file held no usable problem.
    #[error("dataset {}: no valid problem ({} line(s) skipped{})", path.display(), skipped, first_reason.as_ref().map(|r| format!("; first: {r}")).unwrap_or_default())]
    NoValidProblems {
        path: PathBuf,
        skipped: usize,
        first_reason: Option<String>,
    },
    /// The held-out split left nothing to train on.
    #[error("dataset {}: all {total} problems fell into the held-out split; lower `heldout_fraction`", path.display())]
    EmptyTrainSplit { path: PathBuf, total: usize },
    /// A generator could not produce enough distinct held-out problems.
    #[error("task {task}: could only generate {got} distinct held-out problems of {wanted}; lower `heldout` or make problems harder")]
    HeldoutExhausted {
        task: &'static str,
        got: usize,
        wanted: usize,
    },
}
