//! Users' own problems from a JSONL file, GSM8K or MATH style.
//!
//! - GSM8K: `{"question": "...", "answer": "... #### 42"}`; the reference answer is the
//!   rest of the line after the last `####`.
//! - MATH: `{"problem" | "question": "...", "solution": "... \boxed{42} ..."}`, or
//!   `"answer"` holding either a `\boxed{...}` or a short plain answer (one line, at most
//!   100 characters; it wins over `"solution"` when both exist).
//! - Auto (per line): GSM8K if `"answer"` contains `####`, MATH otherwise.
//!
//! Malformed lines are skipped and reported with their 1-based line number; blank lines
//! are ignored. The held-out split is by SHA-256 of the trimmed question, so it is stable
//! across runs, seeds and file reorderings.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::answer::{answers_match, extract_answer, last_boxed, normalize_answer};
use super::error::TaskError;
use super::problem::{Problem, Task, Verdict};
use super::split::{mix, permute};

/// How the lines of a JSONL dataset are read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatasetFormat {
    /// Decide per line (see the module docs).
    #[default]
    Auto,
    Gsm8k,
    Math,
}

/// The result of reading a JSONL dataset. `problems[i].prompt` is the raw question
/// (trimmed); `id` is `FILE_NAME:LINE`.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadReport {
    pub problems: Vec<Problem>,
    /// (1-based line number, reason) of each line that was skipped.
    pub skipped: Vec<(usize, String)>,
}

/// Longest plain (unboxed) `"answer"` accepted as a MATH reference answer.
const MAX_PLAIN_ANSWER: usize = 100;

fn str_field<'a>(obj: &'a Map<String, Value>, names: &[&str]) -> Result<Option<&'a str>, String> {
    for name in names {
        match obj.get(*name) {
            None | Some(Value::Null) => continue,
            Some(Value::String(s)) => return Ok(Some(s)),
            Some(_) => return Err(format!("field `{name}` is not a string")),
        }
    }
    Ok(None)
}

fn question_of(obj: &Map<String, Value>, names: &[&str]) -> Result<String, String> {
    let q = str_field(obj, names)?.map(str::trim).unwrap_or("");
    if q.is_empty() {
        return Err(format!("missing or empty field `{}`", names.join("` or `")));
    }
    Ok(q.to_string())
}

/// Removes GSM8K calculator annotations `<<48/2=24>>`.
fn strip_calculator(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(open) = rest.find("<<") {
        match rest[open..].find(">>") {
            Some(close) => {
                out.push_str(&rest[..open]);
                rest = &rest[open + close + 2..];
            }
            None => break,
        }
    }
    out.push_str(rest);
    out
}

/// (question, reference answer, demonstration)
type Parsed = (String, String, String);

fn parse_gsm8k(obj: &Map<String, Value>) -> Result<Parsed, String> {
    let question = question_of(obj, &["question"])?;
    let answer = str_field(obj, &["answer"])?.ok_or("missing field `answer`")?;
    let pos = answer
        .rfind("####")
        .ok_or("field `answer` has no `#### <answer>`")?;
    let gold = answer[pos + 4..]
        .trim_start()
        .lines()
        .next()
        .unwrap_or("")
        .trim();
    if gold.is_empty() {
        return Err("nothing after `####` in field `answer`".into());
    }
    Ok((question, gold.to_string(), strip_calculator(answer.trim())))
}

fn parse_math(obj: &Map<String, Value>) -> Result<Parsed, String> {
    let question = question_of(obj, &["problem", "question"])?;
    let solution = str_field(obj, &["solution"])?.map(str::trim);
    let answer = str_field(obj, &["answer"])?.map(str::trim);
    if solution.is_none() && answer.is_none() {
        return Err("missing field `solution` or `answer`".into());
    }
    let plain = answer.filter(|a| {
        !a.is_empty() && a.len() <= MAX_PLAIN_ANSWER && !a.contains('\n') && !a.contains("####")
    });
    let gold = answer
        .and_then(last_boxed)
        .or_else(|| plain.map(str::to_string))
        .or_else(|| solution.and_then(last_boxed))
        .ok_or("no `\\boxed{...}` answer in `solution` or `answer`")?;
    let demo = [solution, answer]
        .into_iter()
        .flatten()
        .find(|text| last_boxed(text).is_some_and(|b| answers_match(&b, &gold)))
        .map(str::to_string)
        .unwrap_or_else(|| {
            let lead = solution.map(|s| format!("{s}\n")).unwrap_or_default();
            format!("{lead}The answer is $\\boxed{{{gold}}}$.")
        });
    Ok((question, gold, demo))
}

fn parse_line(line: &str, format: DatasetFormat) -> Result<Parsed, String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
    let Value::Object(obj) = value else {
        return Err("not a JSON object".into());
    };
    let format = match format {
        DatasetFormat::Auto => match obj.get("answer") {
            Some(Value::String(a)) if a.contains("####") => DatasetFormat::Gsm8k,
            _ => DatasetFormat::Math,
        },
        f => f,
    };
    let (q, gold, demo) = match format {
        DatasetFormat::Gsm8k => parse_gsm8k(&obj)?,
        _ => parse_math(&obj)?,
    };
    let gold = normalize_answer(&gold);
    if gold.is_empty() {
        return Err("the answer is empty after normalisation".into());
    }
    Ok((q, gold, demo))
}

/// Reads a JSONL dataset; fails (naming the file) when it cannot be read or no line is
/// valid.
pub fn load_jsonl(path: &Path, format: DatasetFormat) -> Result<LoadReport, TaskError> {
    let bytes = std::fs::read(path).map_err(|source| TaskError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let file = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    let mut report = LoadReport {
        problems: Vec::new(),
        skipped: Vec::new(),
    };
    for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let line_no = i + 1;
        let Ok(line) = std::str::from_utf8(raw) else {
            report.skipped.push((line_no, "invalid UTF-8".into()));
            continue;
        };
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        match parse_line(line, format) {
            Ok((prompt, answer, demonstration)) => report.problems.push(Problem {
                id: format!("{file}:{line_no}"),
                prompt,
                answer,
                demonstration,
            }),
            Err(reason) => report.skipped.push((line_no, reason)),
        }
    }
    if report.problems.is_empty() {
        return Err(TaskError::NoValidProblems {
            path: path.to_path_buf(),
            skipped: report.skipped.len(),
            first_reason: report
                .skipped
                .first()
                .map(|(n, r)| format!("line {n}: {r}")),
        });
    }
    Ok(report)
}

/// Whether a question belongs to the held-out split.
fn is_heldout(question: &str, fraction: f64) -> bool {
    let digest = Sha256::digest(question.trim().as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let h = u64::from_be_bytes(first);
    (h as f64) < fraction * 18_446_744_073_709_551_616.0
}

/// A task over a JSONL dataset; see the module docs.
#[derive(Debug)]
pub struct JsonlTask {
    train: Vec<Problem>,
    heldout: Vec<Problem>,
    seed: u64,
    warnings: Vec<String>,
}

const MAX_WARNINGS: usize = 20;
const EPOCH_STREAM: u64 = 0x4550_4f43; // "EPOC"

impl JsonlTask {
    /// Loads `path` and splits it. `prompt_template` must contain `{question}`.
    pub fn new(
        path: &Path,
        format: DatasetFormat,
        heldout_fraction: f64,
        seed: u64,
        prompt_template: &str,
    ) -> Result<Self, TaskError> {
        check_fraction(heldout_fraction)?;
        check_template(prompt_template)?;
        let report = load_jsonl(path, format)?;
        Self::from_report(report, path, heldout_fraction, seed, prompt_template)
    }

    /// Splits already loaded problems (`path` only names the source in messages).
    pub fn from_report(
        report: LoadReport,
        path: &Path,
        heldout_fraction: f64,
        seed: u64,
        prompt_template: &str,
    ) -> Result<Self, TaskError> {
        check_fraction(heldout_fraction)?;
        check_template(prompt_template)?;
        let total = report.problems.len();
        let file = path.display();
        let mut warnings: Vec<String> = report
            .skipped
            .iter()
            .take(MAX_WARNINGS)
            .map(|(n, r)| format!("{file}:{n}: skipped: {r}"))
            .collect();
        if report.skipped.len() > MAX_WARNINGS {
            warnings.push(format!(
                "{file}: {} more line(s) skipped",
                report.skipped.len() - MAX_WARNINGS
            ));
        }
        let (mut train, mut heldout) = (Vec::new(), Vec::new());
        for mut p in report.problems {
            let side = if is_heldout(&p.prompt, heldout_fraction) {
                &mut heldout
            } else {
                &mut train
            };
            p.prompt = prompt_template.replace("{question}", &p.prompt);
            side.push(p);
        }
        if train.is_empty() {
            return Err(TaskError::EmptyTrainSplit {
                path: PathBuf::from(path),
                total,
            });
        }
        Ok(JsonlTask {
            train,
            heldout,
            seed,
            warnings,
        })
    }

    /// Training problems from `train_path`, held-out problems from
    /// `heldout_path` (all of it). A training question that is also held out is
    /// dropped from training (and counted in a warning), so evaluation never
    /// sees a problem the policy trained on.
    pub fn with_heldout_file(
        train_path: &Path,
        heldout_path: &Path,
        format: DatasetFormat,
        seed: u64,
        prompt_template: &str,
    ) -> Result<Self, TaskError> {
        check_template(prompt_template)?;
        let train_report = load_jsonl(train_path, format)?;
        let held_report = load_jsonl(heldout_path, format)?;
        let total = train_report.problems.len();
        let mut warnings = Vec::new();
        for (path, report) in [(train_path, &train_report), (heldout_path, &held_report)] {
            let file = path.display();
            warnings.extend(
                report
                    .skipped
                    .iter()
                    .take(MAX_WARNINGS)
                    .map(|(n, r)| format!("{file}:{n}: skipped: {r}")),
            );
            if report.skipped.len() > MAX_WARNINGS {
                warnings.push(format!(
                    "{file}: {} more line(s) skipped",
                    report.skipped.len() - MAX_WARNINGS
                ));
            }
        }
        let held_questions: std::collections::HashSet<&str> = held_report
            .problems
            .iter()
            .map(|p| p.prompt.as_str())
            .collect();
        let mut dropped = 0usize;
        let mut train = Vec::new();
        for mut p in train_report.problems {
            if held_questions.contains(p.prompt.as_str()) {
                dropped += 1;
                continue;
            }
            p.prompt = prompt_template.replace("{question}", &p.prompt);
            train.push(p);
        }
        if dropped > 0 {
            warnings.push(format!(
                "{}: {dropped} question(s) also in {} were left out of training",
                train_path.display(),
                heldout_path.display()
            ));
        }
        if train.is_empty() {
            return Err(TaskError::EmptyTrainSplit {
                path: PathBuf::from(train_path),
                total,
            });
        }
        let heldout = held_report
            .problems
            .into_iter()
            .map(|mut p| {
                p.prompt = prompt_template.replace("{question}", &p.prompt);
                p
            })
            .collect();
        Ok(JsonlTask {
            train,
            heldout,
            seed,
            warnings,
        })
    }

    pub fn train_size(&self) -> usize {
        self.train.len()
    }
}

fn check_fraction(f: f64) -> Result<(), TaskError> {
    if !(0.0..1.0).contains(&f) {
        return Err(TaskError::Config {
            field: "heldout_fraction",
            message: format!("must be in [0, 1), got {f}"),
        });
    }
    Ok(())
}

fn check_template(t: &str) -> Result<(), TaskError> {
    if !t.contains("{question}") {
        return Err(TaskError::Config {
            field: "prompt_template",
            message: format!("must contain `{{question}}`, got {t:?}"),
        });
    }
    Ok(())
}

impl Task for JsonlTask {
    fn name(&self) -> &str {
        "jsonl"
    }

    /// Every epoch (`train_size()` consecutive indices) visits each training problem once,
    /// in an order shuffled by (seed, epoch).
    fn train_problem(&self, index: u64) -> Problem {
        let n = self.train.len() as u64;
        let epoch = index / n;
        let j = permute(index % n, n, mix(self.seed, EPOCH_STREAM, epoch));
        self.train[j as usize].clone()
    }

    fn heldout_problem(&self, index: u64) -> Problem {
        if self.heldout.is_empty() {
            return self.train_problem(index);
        }
        self.heldout[(index % self.heldout.len() as u64) as usize].clone()
    }

    fn heldout_size(&self) -> usize {
        self.heldout.len()
    }

    /// Well formed: an answer marked with `\boxed{}` or `####`. Correct: the extracted
    /// answer (falling back to the last number) matches the reference. So an unmarked
    /// response ending in the right number is correct but not well formed.
    fn verify(&self, problem: &Problem, response: &str) -> Verdict {
        match extract_answer(response) {
            Some(ex) => Verdict {
                correct: answers_match(ex.text(), &problem.answer),
                well_formed: ex.is_marked(),
            },
            None => Verdict::MALFORMED,
        }
    }

    fn warnings(&self) -> Vec<String> {
        self.warnings.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::io::Write;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::File::create(&p)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        p
    }

    const GOOD_BAD: &str = concat!(
        r#####"{"question": "Natalia sold 48 clips in April and half as many in May. How many in all?", "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\nIn all 48+24 = <<48+24=72>>72 clips.\n#### 72"}"#####,
        "\n",
        "{not json}\n",
        "\n",
        r#####"{"question": "What is 1/2 + 1/4?", "solution": "We get $\\frac{1}{2}+\\frac{1}{4}=\\boxed{\\dfrac{3}{4}}$."}"#####,
        "\n",
        r#####"{"question": "no answer"}"#####,
        "\n",
        r#####"{"problem": "Compute 2+2.", "solution": "It is 4.", "answer": "4"}"#####,
        "\n",
        r#####"[1, 2]"#####,
        "\n",
        r#####"{"question": "Q", "answer": "no marker and a very long text that goes on and on and on and on and on and on and on and on and on and on"}"#####,
        "\n",
        r#####"{"question": 5, "answer": "#### 5"}"#####,
        "\n",
        r#####"{"question": "Pay?", "answer": "He pays $1,200.\n#### 1,200"}"#####,
        "\n",
        r#####"{"question": "Empty?", "answer": "#### "}"#####,
        "\n",
    );

    #[test]
    fn a_heldout_file_is_the_evaluation_set() {
        let dir = tempfile::tempdir().unwrap();
        let line =
            |q: &str, a: u32| format!("{{\"question\": \"{q}\", \"answer\": \"#### {a}\"}}\n");
        let train = write(
            dir.path(),
            "train.jsonl",
            &(line("1+1?", 2) + &line("2+2?", 4) + &line("3+3?", 6)),
        );
        let test = write(
            dir.path(),
            "test.jsonl",
            &(line("2+2?", 4) + &line("5+5?", 10) + "{bad\n"),
        );
        let t =
            JsonlTask::with_heldout_file(&train, &test, DatasetFormat::Gsm8k, 0, "Q: {question}")
                .unwrap();
        assert_eq!(t.train_size(), 2, "2+2? is held out, so not trained on");
        assert_eq!(t.heldout_size(), 2);
        assert_eq!(t.heldout_problem(1).prompt, "Q: 5+5?");
        assert_eq!(t.heldout_problem(1).answer, "10");
        let w = t.warnings().join("\n");
        assert!(w.contains("test.jsonl:3: skipped"), "{w}");
        assert!(w.contains("1 question(s) also in"), "{w}");
        let e = JsonlTask::with_heldout_file(
            &train,
            &dir.path().join("nope.jsonl"),
            DatasetFormat::Gsm8k,
            0,
            "{question}",
        )
        .unwrap_err();
        assert!(e.to_string().contains("nope.jsonl"), "{e}");
    }

    #[test]
    fn loader_reports_line_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "mix.jsonl", GOOD_BAD);
        let r = load_jsonl(&path, DatasetFormat::Auto).unwrap();
        let ids: Vec<&str> = r.problems.iter().map(|p| p.id.as_str()).collect();
        assert_eq!(
            ids,
            ["mix.jsonl:1", "mix.jsonl:4", "mix.jsonl:6", "mix.jsonl:10"]
        );
        let answers: Vec<&str> = r.problems.iter().map(|p| p.answer.as_str()).collect();
        assert_eq!(answers, ["72", "\\frac{3}{4}", "4", "1200"]);
        let lines: Vec<usize> = r.skipped.iter().map(|(n, _)| *n).collect();
        assert_eq!(lines, [2, 5, 7, 8, 9, 11], "{:?}", r.skipped);
        assert!(r.skipped[0].1.contains("invalid JSON"));
        assert!(r.skipped[1].1.contains("solution"), "{}", r.skipped[1].1);
        assert!(r.skipped[2].1.contains("not a JSON object"));
        assert!(r.skipped[3].1.contains("boxed"), "{}", r.skipped[3].1);
        assert!(
            r.skipped[4].1.contains("not a string"),
            "{}",
            r.skipped[4].1
        );
        assert!(r.skipped[5].1.contains("####"), "{}", r.skipped[5].1);
        // Calculator annotations are gone from the GSM8K demonstration.
        assert!(!r.problems[0].demonstration.contains("<<"));
        assert!(r.problems[0].demonstration.ends_with("#### 72"));
        // A plain MATH answer gets a boxed demonstration.
        assert!(r.problems[2].demonstration.contains("\\boxed{4}"));
    }

    #[test]
    fn forced_formats() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "mix.jsonl", GOOD_BAD);
        let g = load_jsonl(&path, DatasetFormat::Gsm8k).unwrap();
        assert_eq!(g.problems.len(), 2);
        let m = load_jsonl(&path, DatasetFormat::Math).unwrap();
        // Line 1 as MATH: the "answer" is long and unboxed -> skipped.
        assert_eq!(
            m.problems.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
            ["mix.jsonl:4", "mix.jsonl:6"]
        );
    }

    #[test]
    fn demonstrations_verify() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "mix.jsonl", GOOD_BAD);
        let r = load_jsonl(&path, DatasetFormat::Auto).unwrap();
        let t = JsonlTask::from_report(r.clone(), &path, 0.0, 0, "{question}\n").unwrap();
        for p in &r.problems {
            assert_eq!(t.verify(p, &p.demonstration), Verdict::CORRECT, "{p:?}");
        }
        assert_eq!(t.warnings().len(), 6);
        assert!(
            t.warnings()[0].contains("mix.jsonl:2"),
            "{:?}",
            t.warnings()
        );
    }

    #[test]
    fn no_valid_line_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "junk.jsonl", "{bad\n{\"question\": \"q\"}\n");
        let e = load_jsonl(&path, DatasetFormat::Auto).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("junk.jsonl"), "{msg}");
        assert!(msg.contains("2 line(s) skipped"), "{msg}");
        assert!(msg.contains("line 1"), "{msg}");
        let empty = write(dir.path(), "empty.jsonl", "");
        assert!(load_jsonl(&empty, DatasetFormat::Auto)
            .unwrap_err()
            .to_string()
            .contains("empty.jsonl"));
        let missing = dir.path().join("missing.jsonl");
        let e = load_jsonl(&missing, DatasetFormat::Auto).unwrap_err();
        assert!(matches!(e, TaskError::Io { .. }));
        assert!(e.to_string().contains("missing.jsonl"));
        // Invalid UTF-8 on one line does not spoil the others.
        let mut bytes = b"\xff\xfe\n".to_vec();
        bytes.extend_from_slice(br#####"{"question": "q", "answer": "#### 3"}"#####);
        let p = dir.path().join("bin.jsonl");
        std::fs::write(&p, bytes).unwrap();
        let r = load_jsonl(&p, DatasetFormat::Auto).unwrap();
        assert_eq!(r.problems.len(), 1);
        assert_eq!(r.skipped, vec![(1, "invalid UTF-8".to_string())]);
    }

    fn many(n: usize) -> String {
        (0..n)
            .map(|i| {
                format!(
                    "{{\"question\": \"What is {i} plus 1?\", \"answer\": \"#### {}\"}}\n",
                    i + 1
                )
            })
            .collect()
    }

    #[test]
    fn split_is_stable_and_disjoint() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "many.jsonl", &many(1000));
        let a = JsonlTask::new(&path, DatasetFormat::Gsm8k, 0.1, 1, "Q: {question}\nA:").unwrap();
        let b = JsonlTask::new(&path, DatasetFormat::Gsm8k, 0.1, 2, "Q: {question}\nA:").unwrap();
        // The split does not depend on the seed.
        assert_eq!(a.heldout, b.heldout);
        assert!(
            (60..=140).contains(&a.heldout_size()),
            "{}",
            a.heldout_size()
        );
        assert_eq!(a.train_size() + a.heldout_size(), 1000);
        assert!(a.heldout_problem(0).prompt.starts_with("Q: What is "));
        // The split does not depend on the order of the file either.
        let text = many(1000);
        let mut lines: Vec<&str> = text.lines().collect();
        lines.reverse();
        let rev = write(dir.path(), "rev.jsonl", &lines.join("\n"));
        let c = JsonlTask::new(&rev, DatasetFormat::Gsm8k, 0.1, 1, "Q: {question}\nA:").unwrap();
        let ha: HashSet<String> = a.heldout.iter().map(|p| p.prompt.clone()).collect();
        let hc: HashSet<String> = c.heldout.iter().map(|p| p.prompt.clone()).collect();
        assert_eq!(ha, hc);
        // Train never yields a held-out prompt; every epoch is a permutation.
        let n = a.train_size() as u64;
        for epoch in 0..3 {
            let seen: HashSet<String> = (epoch * n..(epoch + 1) * n)
                .map(|i| a.train_problem(i).prompt)
                .collect();
            assert_eq!(seen.len() as u64, n);
            assert!(seen.is_disjoint(&ha));
        }
        // Deterministic in the seed; different seeds give different orders.
        let a2 = JsonlTask::new(&path, DatasetFormat::Gsm8k, 0.1, 1, "Q: {question}\nA:").unwrap();
        let order = |t: &JsonlTask| (0..50).map(|i| t.train_problem(i).id).collect::<Vec<_>>();
        assert_eq!(order(&a), order(&a2));
        assert_ne!(order(&a), order(&b));
        // Epochs are shuffled differently.
        let e0: Vec<String> = (0..20).map(|i| a.train_problem(i).id).collect();
        let e1: Vec<String> = (n..n + 20).map(|i| a.train_problem(i).id).collect();
        assert_ne!(e0, e1);
    }

    #[test]
    fn split_config_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "one.jsonl", &many(1));
        for f in [-0.1, 1.0, f64::NAN] {
            assert!(matches!(
                JsonlTask::new(&path, DatasetFormat::Auto, f, 0, "{question}"),
                Err(TaskError::Config {
                    field: "heldout_fraction",
                    ..
                })
            ));
        }
        assert!(matches!(
            JsonlTask::new(&path, DatasetFormat::Auto, 0.1, 0, "no placeholder"),
            Err(TaskError::Config {
                field: "prompt_template",
                ..
            })
        ));
        // A tiny file whose only problem is held out.
        let q = (0..200)
            .map(|i| format!("question {i}"))
            .find(|q| is_heldout(q, 0.5))
            .unwrap();
        let one = write(
            dir.path(),
            "held.jsonl",
            &format!("{{\"question\": \"{q}\", \"answer\": \"#### 1\"}}\n"),
        );
        let e = JsonlTask::new(&one, DatasetFormat::Auto, 0.5, 0, "{question}").unwrap_err();
        assert!(
            matches!(e, TaskError::EmptyTrainSplit { total: 1, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("held.jsonl"));
        // No held-out problems: heldout_problem still answers.
        let t = JsonlTask::new(&path, DatasetFormat::Auto, 0.0, 0, "{question}").unwrap();
        assert_eq!(t.heldout_size(), 0);
        assert_eq!(t.heldout_problem(3).answer, "1");
    }

    #[test]
    fn verify_table() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "one.jsonl", &many(1));
        let t = JsonlTask::new(&path, DatasetFormat::Auto, 0.0, 0, "{question}").unwrap();
        let p = |answer: &str| Problem {
            id: "x".into(),
            prompt: "q".into(),
            answer: normalize_answer(answer),
            demonstration: String::new(),
        };
        let (c, w, m) = (Verdict::CORRECT, Verdict::WRONG, Verdict::MALFORMED);
        let unmarked_right = Verdict {
            correct: true,
            well_formed: false,
        };
        let long = "blah ".repeat(100_000);
        let cases: Vec<(Problem, String, Verdict)> = vec![
            (p("72"), "48+24=72.\n#### 72".into(), c),
            (p("72"), "#### 72 clips".into(), c),
            (p("72"), "#### $72.00".into(), c),
            (p("72"), "The answer is \\boxed{72}.".into(), c),
            (p("72"), "#### 71".into(), w),
            (p("72"), "\\boxed{72} wait no \\boxed{73}".into(), w),
            (p("72"), "so it is 72".into(), unmarked_right),
            (p("72"), "72 or maybe 73".into(), m),
            (p("72"), "".into(), m),
            (p("72"), "no idea".into(), m),
            (p("72"), "🙂🙂🙂 #### 七十二".into(), w),
            (p("72"), format!("{long} #### 72"), c),
            (p("72"), format!("#### {}", "9".repeat(10_000)), w),
            (p("1200"), "#### 1,200".into(), c),
            (p("0.5"), "\\boxed{\\frac{1}{2}}".into(), c),
            (p("\\frac{3}{4}"), "$\\boxed{0.75}$".into(), c),
            (p("\\frac{3}{4}"), "\\boxed{\\dfrac34}".into(), c),
            (p("5"), "\\boxed{x = 5}".into(), c),
            (p("10"), "\\boxed{10\\text{ cm}}".into(), c),
            (p("\\text{(B)}"), "\\boxed{(B)}".into(), c),
            (p("(1,2)"), "\\boxed{\\left(1, 2\\right)}".into(), c),
            (p("-3"), "It is \\boxed{\u{2212}3}".into(), c),
            (p("3"), "\\boxed{\\boxed{\\boxed{3}}}".into(), c),
            (
                p("3"),
                format!("\\boxed{{{}3{}}}", "{".repeat(10_000), "}".repeat(10_000)),
                w,
            ),
        ];
        for (prob, resp, want) in &cases {
            let head: String = resp.chars().take(60).collect();
            assert_eq!(t.verify(prob, resp), *want, "{} <- {head:?}", prob.answer);
        }
    }
}
