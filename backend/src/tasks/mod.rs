//! Built-in RL tasks and their verifiers.
//!
//! A [`Task`] hands out prompts (deterministic in the configured seed and an index) and
//! judges responses. Four kinds exist:
//!
//! - [`ArithmeticTask`]: `12+34=` -> `46`, for tiny character-level models;
//! - [`ScratchpadTask`]: `123+989=` -> `3+9+0=12 2+8+1=11 1+9+1=11 =1112`, long
//!   answers written column by column (9 tokens per column);
//! - [`CountdownTask`]: `3 7 9 -> 30:` -> `3*7+9`;
//! - [`JsonlTask`]: the user's own problems, GSM8K or MATH style, from a JSONL file.
//!
//! [`build_task`] turns a [`TaskConfig`] (the `[task]` table of a run config) into a task.
//! Training problems never repeat a held-out prompt.

mod answer;
mod arithmetic;
mod config;
mod countdown;
mod dataset;
mod error;
mod expr;
mod problem;
mod reward;
mod scratchpad;
mod split;

pub use answer::{answers_match, extract_answer, normalize_answer, Extracted};
pub use arithmetic::{ArithOp, ArithmeticTask, ARITH_ALPHABET};
pub use config::{
    build_task, ArithmeticConfig, CountdownConfig, JsonlConfig, ScratchpadConfig, TaskConfig,
};
pub use countdown::{CountdownTask, COUNTDOWN_ALPHABET};
pub use dataset::{load_jsonl, DatasetFormat, JsonlTask, LoadReport};
pub use error::TaskError;
pub use expr::{eval_expression, ExprError, Rational};
pub use problem::{Problem, Task, Verdict};
pub use reward::{reward, RewardConfig};
pub use scratchpad::{
    parse_prompt, parse_trace, scratchpad_trace, steps_right, ScratchpadTask, Step, Trace,
    SCRATCHPAD_MAX_DIGITS,
};
