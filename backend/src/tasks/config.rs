//! The `[task]` table of a run config, and building a task from it.
//!
//! ```toml
//! [task]
//! kind = "arithmetic"   # or "scratchpad", "countdown", "jsonl"
//! digits = 2
//! ops = ["+"]
//! heldout = 200
//! seed = 7
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::arithmetic::{ArithOp, ArithmeticTask};
use super::countdown::CountdownTask;
use super::dataset::{DatasetFormat, JsonlTask};
use super::error::TaskError;
use super::problem::Task;
use super::scratchpad::ScratchpadTask;

/// Which task to train on, with its settings; every field but `kind` (and `path` for
/// `jsonl`) has a default. Unknown keys, and keys of another kind, are rejected with an
/// error naming them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", try_from = "RawTaskConfig")]
pub enum TaskConfig {
    Arithmetic(ArithmeticConfig),
    Scratchpad(ScratchpadConfig),
    Countdown(CountdownConfig),
    Jsonl(JsonlConfig),
}

impl Default for TaskConfig {
    fn default() -> Self {
        TaskConfig::Arithmetic(ArithmeticConfig::default())
    }
}

/// `kind = "arithmetic"`: prompts like `12+34=`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArithmeticConfig {
    /// Digits per operand, 1..=6 (operands are uniform in `0..10^digits`). Default 2.
    pub digits: u32,
    /// Operands per problem, 2..=3. Default 2.
    pub operands: u32,
    /// Operators to draw from: `"+"`, `"-"`, `"*"`. Default `["+"]`.
    pub ops: Vec<ArithOp>,
    /// Held-out problems. Default 200.
    pub heldout: usize,
    /// Seed of the problem streams. Default 0.
    pub seed: u64,
}

impl Default for ArithmeticConfig {
    fn default() -> Self {
        ArithmeticConfig {
            digits: 2,
            operands: 2,
            ops: vec![ArithOp::Add],
            heldout: 200,
            seed: 0,
        }
    }
}

/// `kind = "scratchpad"`: prompts like `123+989=`, answered with a written
/// column-by-column scratchpad (9 tokens per column with a character-level tokenizer).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScratchpadConfig {
    /// Most digits per operand, 1..=64: sets the longest response. Default 8.
    pub digits: u32,
    /// Fewest digits per operand, 1..=digits (lengths are uniform in between):
    /// sets the spread of response lengths. Default 1.
    pub min_digits: u32,
    /// Operators to draw from: `"+"` (two operands), `"*"` (by one digit, 2..=9).
    /// Default `["+"]`.
    pub ops: Vec<ArithOp>,
    /// Held-out problems. Default 200.
    pub heldout: usize,
    /// Seed of the problem streams. Default 0.
    pub seed: u64,
}

impl Default for ScratchpadConfig {
    fn default() -> Self {
        ScratchpadConfig {
            digits: 8,
            min_digits: 1,
            ops: vec![ArithOp::Add],
            heldout: 200,
            seed: 0,
        }
    }
}

/// `kind = "countdown"`: prompts like `3 7 9 -> 30:`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CountdownConfig {
    /// Numbers given, 2..=6. Default 3.
    pub numbers: u32,
    /// Numbers are drawn from `1..=max_number` (at most 10000). Default 20.
    pub max_number: u32,
    /// Held-out problems. Default 200.
    pub heldout: usize,
    /// Seed of the problem streams. Default 0.
    pub seed: u64,
}

impl Default for CountdownConfig {
    fn default() -> Self {
        CountdownConfig {
            numbers: 3,
            max_number: 20,
            heldout: 200,
            seed: 0,
        }
    }
}

/// `kind = "jsonl"`: the user's own problems.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonlConfig {
    /// The dataset; a relative path is taken from the config file's folder.
    pub path: PathBuf,
    /// `"gsm8k"`, `"math"` or `"auto"` (per line). Default auto.
    #[serde(default)]
    pub format: DatasetFormat,
    /// Share of the questions held out, chosen by hash of the question. Default 0.1
    /// (0 with `heldout_path`).
    #[serde(default = "default_heldout_fraction")]
    pub heldout_fraction: f64,
    /// A separate held-out file (e.g. GSM8K's test split): evaluations use all of
    /// it and training leaves its questions out. Relative to the config's folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heldout_path: Option<PathBuf>,
    /// Seed of the training order. Default 0.
    #[serde(default)]
    pub seed: u64,
    /// The prompt; `{question}` is replaced by the question. Default `"{question}\n"`.
    #[serde(default = "default_prompt_template")]
    pub prompt_template: String,
}

fn default_heldout_fraction() -> f64 {
    0.1
}

fn default_prompt_template() -> String {
    "{question}\n".to_string()
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum TaskKind {
    Arithmetic,
    Scratchpad,
    Countdown,
    Jsonl,
}

/// The flat form `TaskConfig` is read through: a plain struct, so that the format's own
/// errors point at the offending key (a tagged enum would buffer the table first and
/// report type errors without it).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTaskConfig {
    kind: TaskKind,
    digits: Option<u32>,
    min_digits: Option<u32>,
    operands: Option<u32>,
    ops: Option<Vec<ArithOp>>,
    numbers: Option<u32>,
    max_number: Option<u32>,
    heldout: Option<usize>,
    seed: Option<u64>,
    path: Option<PathBuf>,
    format: Option<DatasetFormat>,
    heldout_fraction: Option<f64>,
    heldout_path: Option<PathBuf>,
    prompt_template: Option<String>,
}

impl TryFrom<RawTaskConfig> for TaskConfig {
    type Error = String;

    fn try_from(r: RawTaskConfig) -> Result<Self, String> {
        let (kind, allowed): (&str, &[&str]) = match r.kind {
            TaskKind::Arithmetic => (
                "arithmetic",
                &["digits", "operands", "ops", "heldout", "seed"],
            ),
            TaskKind::Scratchpad => (
                "scratchpad",
                &["digits", "min_digits", "ops", "heldout", "seed"],
            ),
            TaskKind::Countdown => ("countdown", &["numbers", "max_number", "heldout", "seed"]),
            TaskKind::Jsonl => (
                "jsonl",
                &[
                    "path",
                    "format",
                    "heldout_fraction",
                    "heldout_path",
                    "seed",
                    "prompt_template",
                ],
            ),
        };
        let present = [
            ("digits", r.digits.is_some()),
            ("min_digits", r.min_digits.is_some()),
            ("operands", r.operands.is_some()),
            ("ops", r.ops.is_some()),
            ("numbers", r.numbers.is_some()),
            ("max_number", r.max_number.is_some()),
            ("heldout", r.heldout.is_some()),
            ("path", r.path.is_some()),
            ("format", r.format.is_some()),
            ("heldout_fraction", r.heldout_fraction.is_some()),
            ("heldout_path", r.heldout_path.is_some()),
            ("prompt_template", r.prompt_template.is_some()),
        ];
        if let Some((field, _)) = present.iter().find(|(f, set)| *set && !allowed.contains(f)) {
            return Err(format!(
                "field `{field}` does not apply to kind = \"{kind}\" (its fields: {})",
                allowed.join(", ")
            ));
        }
        Ok(match r.kind {
            TaskKind::Arithmetic => {
                let d = ArithmeticConfig::default();
                TaskConfig::Arithmetic(ArithmeticConfig {
                    digits: r.digits.unwrap_or(d.digits),
                    operands: r.operands.unwrap_or(d.operands),
                    ops: r.ops.unwrap_or(d.ops),
                    heldout: r.heldout.unwrap_or(d.heldout),
                    seed: r.seed.unwrap_or(d.seed),
                })
            }
            TaskKind::Scratchpad => {
                let d = ScratchpadConfig::default();
                TaskConfig::Scratchpad(ScratchpadConfig {
                    digits: r.digits.unwrap_or(d.digits),
                    min_digits: r.min_digits.unwrap_or(d.min_digits),
                    ops: r.ops.unwrap_or(d.ops),
                    heldout: r.heldout.unwrap_or(d.heldout),
                    seed: r.seed.unwrap_or(d.seed),
                })
            }
            TaskKind::Countdown => {
                let d = CountdownConfig::default();
                TaskConfig::Countdown(CountdownConfig {
                    numbers: r.numbers.unwrap_or(d.numbers),
                    max_number: r.max_number.unwrap_or(d.max_number),
                    heldout: r.heldout.unwrap_or(d.heldout),
                    seed: r.seed.unwrap_or(d.seed),
                })
            }
            // (0 is what a config written back by Jet says with a held-out file.)
            TaskKind::Jsonl
                if r.heldout_path.is_some() && r.heldout_fraction.is_some_and(|f| f != 0.0) =>
            {
                return Err(
                    "give one of `heldout_fraction` (a share of `path`) and `heldout_path` (a file)"
                        .into(),
                )
            }
            TaskKind::Jsonl => TaskConfig::Jsonl(JsonlConfig {
                path: r
                    .path
                    .ok_or("missing field `path` (required for kind = \"jsonl\")")?,
                format: r.format.unwrap_or_default(),
                heldout_fraction: match r.heldout_path {
                    Some(_) => 0.0,
                    None => r.heldout_fraction.unwrap_or_else(default_heldout_fraction),
                },
                heldout_path: r.heldout_path,
                seed: r.seed.unwrap_or(0),
                prompt_template: r.prompt_template.unwrap_or_else(default_prompt_template),
            }),
        })
    }
}

/// Builds the configured task. Relative dataset paths are resolved against `base_dir`
/// (normally the folder of the config file).
pub fn build_task(cfg: &TaskConfig, base_dir: &Path) -> Result<Box<dyn Task>, TaskError> {
    Ok(match cfg {
        TaskConfig::Arithmetic(c) => Box::new(ArithmeticTask::new(
            c.digits, c.operands, &c.ops, c.heldout, c.seed,
        )?),
        TaskConfig::Scratchpad(c) => Box::new(ScratchpadTask::new(
            c.digits,
            c.min_digits,
            &c.ops,
            c.heldout,
            c.seed,
        )?),
        TaskConfig::Countdown(c) => Box::new(CountdownTask::new(
            c.numbers,
            c.max_number,
            c.heldout,
            c.seed,
        )?),
        TaskConfig::Jsonl(c) if c.heldout_path.is_some() => {
            let held = base_dir.join(c.heldout_path.as_ref().expect("matched"));
            Box::new(JsonlTask::with_heldout_file(
                &base_dir.join(&c.path),
                &held,
                c.format,
                c.seed,
                &c.prompt_template,
            )?)
        }
        TaskConfig::Jsonl(c) => {
            let path = base_dir.join(&c.path);
            Box::new(JsonlTask::new(
                &path,
                c.format,
                c.heldout_fraction,
                c.seed,
                &c.prompt_template,
            )?)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Wrapper {
        task: TaskConfig,
    }

    fn parse(s: &str) -> Result<TaskConfig, String> {
        toml::from_str::<Wrapper>(s)
            .map(|w| w.task)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn parses_examples() {
        let a = parse("[task]\nkind = \"arithmetic\"\ndigits = 3\nops = [\"+\", \"*\"]\nheldout = 50\nseed = 7\n").unwrap();
        assert_eq!(
            a,
            TaskConfig::Arithmetic(ArithmeticConfig {
                digits: 3,
                operands: 2,
                ops: vec![ArithOp::Add, ArithOp::Mul],
                heldout: 50,
                seed: 7,
            })
        );
        let c = parse("[task]\nkind = \"countdown\"\nnumbers = 4\nmax_number = 50\n").unwrap();
        assert_eq!(
            c,
            TaskConfig::Countdown(CountdownConfig {
                numbers: 4,
                max_number: 50,
                ..CountdownConfig::default()
            })
        );
        let j = parse("[task]\nkind = \"jsonl\"\npath = \"data/gsm8k.jsonl\"\nformat = \"gsm8k\"\nheldout_fraction = 0.05\n").unwrap();
        assert_eq!(
            j,
            TaskConfig::Jsonl(JsonlConfig {
                path: "data/gsm8k.jsonl".into(),
                format: DatasetFormat::Gsm8k,
                heldout_fraction: 0.05,
                heldout_path: None,
                seed: 0,
                prompt_template: "{question}\n".into(),
            })
        );
        assert_eq!(
            parse("[task]\nkind = \"arithmetic\"\n").unwrap(),
            TaskConfig::default()
        );
        let s =
            parse("[task]\nkind = \"scratchpad\"\ndigits = 40\nmin_digits = 4\nops = [\"*\"]\n")
                .unwrap();
        assert_eq!(
            s,
            TaskConfig::Scratchpad(ScratchpadConfig {
                digits: 40,
                min_digits: 4,
                ops: vec![ArithOp::Mul],
                ..ScratchpadConfig::default()
            })
        );
    }

    #[test]
    fn rejects_unknown_and_bad_values() {
        let cases = [
            ("[task]\nkind = \"arithmetic\"\ndigit = 3\n", "digit"),
            ("[task]\nkind = \"countdown\"\nnumber = 3\n", "number"),
            (
                "[task]\nkind = \"jsonl\"\npath = \"x\"\nheldout = 3\n",
                "heldout",
            ),
            ("[task]\nkind = \"jsonl\"\n", "path"),
            (
                "[task]\nkind = \"jsonl\"\npath = \"x\"\nheldout_path = \"y\"\nheldout_fraction = 0.1\n",
                "heldout_path",
            ),
            (
                "[task]\nkind = \"countdown\"\nheldout_path = \"y\"\n",
                "heldout_path",
            ),
            ("[task]\nkind = \"sudoku\"\n", "sudoku"),
            ("[task]\ndigits = 2\n", "kind"),
            ("[task]\nkind = \"arithmetic\"\nops = [\"/\"]\n", "/"),
            (
                "[task]\nkind = \"jsonl\"\npath = \"x\"\nformat = \"csv\"\n",
                "csv",
            ),
            ("[task]\nkind = \"arithmetic\"\ndigits = -1\n", "digits"),
            ("[task]\nkind = \"arithmetic\"\npath = \"x\"\n", "path"),
            ("[task]\nkind = \"countdown\"\ndigits = 2\n", "digits"),
            (
                "[task]\nkind = \"arithmetic\"\nmin_digits = 2\n",
                "min_digits",
            ),
            ("[task]\nkind = \"scratchpad\"\noperands = 3\n", "operands"),
            (
                "[task]\nkind = \"scratchpad\"\nmin_digit = 3\n",
                "min_digit",
            ),
            (
                "[task]\nkind = \"countdown\"\nmax_number = \"20\"\n",
                "max_number",
            ),
        ];
        for (src, needle) in cases {
            let e = parse(src).unwrap_err();
            assert!(
                e.contains(needle),
                "{src:?}: error {e:?} does not name {needle:?}"
            );
        }
    }

    #[test]
    fn round_trips_through_toml() {
        for cfg in [
            TaskConfig::default(),
            TaskConfig::Scratchpad(ScratchpadConfig::default()),
            TaskConfig::Countdown(CountdownConfig::default()),
            TaskConfig::Jsonl(JsonlConfig {
                path: "a.jsonl".into(),
                format: DatasetFormat::Math,
                heldout_fraction: 0.0,
                heldout_path: Some("b.jsonl".into()),
                seed: 3,
                prompt_template: "Q: {question}\nA:".into(),
            }),
        ] {
            #[derive(Serialize)]
            struct W<'a> {
                task: &'a TaskConfig,
            }
            let text = toml::to_string(&W { task: &cfg }).unwrap();
            assert_eq!(parse(&text).unwrap(), cfg, "{text}");
        }
    }

    #[test]
    fn builds_each_kind() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("d.jsonl"),
            "{\"question\": \"1+1?\", \"answer\": \"#### 2\"}\n",
        )
        .unwrap();
        let arith = build_task(&TaskConfig::default(), dir.path()).unwrap();
        assert_eq!(arith.name(), "arithmetic");
        assert_eq!(arith.heldout_size(), 200);
        let cd = build_task(
            &TaskConfig::Countdown(CountdownConfig::default()),
            dir.path(),
        )
        .unwrap();
        assert_eq!(cd.name(), "countdown");
        let sp = build_task(
            &TaskConfig::Scratchpad(ScratchpadConfig::default()),
            dir.path(),
        )
        .unwrap();
        assert_eq!(sp.name(), "scratchpad");
        let bad = TaskConfig::Scratchpad(ScratchpadConfig {
            min_digits: 9,
            ..ScratchpadConfig::default()
        });
        let e = build_task(&bad, dir.path()).err().unwrap();
        assert!(e.to_string().contains("min_digits"), "{e}");
        let cfg = parse("[task]\nkind = \"jsonl\"\npath = \"d.jsonl\"\nheldout_fraction = 0.0\n")
            .unwrap();
        let j = build_task(&cfg, dir.path()).unwrap();
        assert_eq!(j.name(), "jsonl");
        assert_eq!(j.train_problem(0).prompt, "1+1?\n");
        let missing = parse("[task]\nkind = \"jsonl\"\npath = \"nope.jsonl\"\n").unwrap();
        let e = build_task(&missing, dir.path()).err().unwrap();
        assert!(e.to_string().contains("nope.jsonl"), "{e}");
        let bad = TaskConfig::Arithmetic(ArithmeticConfig {
            digits: 9,
            ..ArithmeticConfig::default()
        });
        let e = build_task(&bad, dir.path()).err().unwrap();
        assert!(e.to_string().contains("digits"), "{e}");
    }
}
