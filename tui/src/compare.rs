//! Runs side by side: the metrics the Compare view overlays, and the numbers
//! `jetctl compare` prints (the same series and their summaries, so a script
//! sees what the console shows).
//!
//! A compared series comes from jetd (a run id) or from a metrics JSONL file
//! (`jetd run --metrics-out`, or a flow's file in `jetd compare --metrics-dir`).

use std::path::Path;

use serde_json::{json, Map, Value};

use crate::series::series;

/// The metrics the Compare view overlays: (key, chart title, log scale).
pub const METRICS: [(&str, &str, bool); 6] = [
    ("reward_mean", "reward", false),
    ("heldout_accuracy", "held-out accuracy", false),
    ("mismatch_kl", "mismatch_kl", true),
    ("entropy", "entropy", false),
    ("response_len_mean", "response length", false),
    ("step_s", "step time (s)", false),
];

/// Most series one comparison shows (the console's colours, a legible chart).
pub const MAX_SERIES: usize = 4;

/// One compared run or metrics file.
#[derive(Clone, Debug, PartialEq)]
pub struct Source {
    /// The run id, or the file's path as given.
    pub id: String,
    /// What legends say: `r0003 arith (fp8)`, or the file's name.
    pub label: String,
    pub flow: String,
    /// Its metrics records (SFT and RL, abandoned ones included: [`series`]
    /// keeps the live RL steps).
    pub metrics: Vec<Value>,
}

impl Source {
    /// A run of jetd with its metrics.
    pub fn run(info: &jet_proto::RunInfo, metrics: Vec<Value>) -> Source {
        Source {
            id: info.id.clone(),
            label: format!("{} {} ({})", info.id, info.name, info.flow),
            flow: info.flow.clone(),
            metrics,
        }
    }

    /// A metrics JSONL file; errors name the file and the line.
    pub fn file(path: &Path) -> Result<Source, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read metrics file {}: {e}", path.display()))?;
        let mut metrics = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let v: Value = serde_json::from_str(line).map_err(|e| {
                format!(
                    "{}: line {}: not a JSON metrics record: {e}",
                    path.display(),
                    i + 1
                )
            })?;
            if !v.is_object() {
                return Err(format!(
                    "{}: line {}: a metrics record must be a JSON object",
                    path.display(),
                    i + 1
                ));
            }
            metrics.push(v);
        }
        if !metrics.iter().any(crate::fmt::is_rl) {
            return Err(format!(
                "{}: no RL step in it (is it a `--metrics-out` file of jetd?)",
                path.display()
            ));
        }
        let flow = metrics
            .iter()
            .find_map(|m| m.get("flow").and_then(Value::as_str))
            .unwrap_or("?")
            .to_string();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.display().to_string());
        let label = match name.strip_suffix(".jsonl") {
            Some(stem) if stem == flow => flow.clone(),
            _ => format!("{name} ({flow})"),
        };
        Ok(Source {
            id: path.display().to_string(),
            label,
            flow,
            metrics,
        })
    }

    /// The live RL curve of `key`: (step, value).
    pub fn curve(&self, key: &str) -> Vec<(f64, f64)> {
        series(&self.metrics, key)
    }
}

/// Sources from the paths on a command line: a file is one source, a folder
/// (`jetd compare --metrics-dir`) gives each of its `*.jsonl` files, sorted.
pub fn from_path(path: &Path) -> Result<Vec<Source>, String> {
    if !path.is_dir() {
        return Ok(vec![Source::file(path)?]);
    }
    let mut files: Vec<_> = std::fs::read_dir(path)
        .map_err(|e| format!("cannot read folder {}: {e}", path.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!("{}: no *.jsonl metrics file in it", path.display()));
    }
    files.iter().map(|f| Source::file(f)).collect()
}

/// first, last, mean, min and max of a curve's values.
fn summary(points: &[(f64, f64)]) -> Value {
    if points.is_empty() {
        return json!({"points": 0});
    }
    let ys = points.iter().map(|p| p.1);
    let (lo, hi) = ys
        .clone()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), y| {
            (l.min(y), h.max(y))
        });
    json!({
        "points": points.len(),
        "first": points[0].1,
        "last": points[points.len() - 1].1,
        "last_step": points[points.len() - 1].0,
        "mean": ys.sum::<f64>() / points.len() as f64,
        "min": lo,
        "max": hi,
    })
}

/// What `jetctl compare --json` prints: per source, every compared metric's
/// summary and its points (the console's curves), on the RL steps of the
/// run's live line.
pub fn to_json(sources: &[Source]) -> Value {
    let runs: Vec<Value> = sources
        .iter()
        .map(|s| {
            let mut summaries = Map::new();
            let mut curves = Map::new();
            for (key, _, _) in METRICS {
                let c = s.curve(key);
                summaries.insert(key.into(), summary(&c));
                curves.insert(
                    key.into(),
                    Value::Array(c.iter().map(|(x, y)| json!([x, y])).collect()),
                );
            }
            json!({
                "id": s.id,
                "label": s.label,
                "flow": s.flow,
                "rl_steps": s.metrics.iter().filter(|m| crate::fmt::is_rl(m) && !crate::fmt::is_abandoned(m)).count(),
                "summary": summaries,
                "series": curves,
            })
        })
        .collect();
    json!({ "metrics": METRICS.iter().map(|m| m.0).collect::<Vec<_>>(), "runs": runs })
}

/// The readable table: one line per source, the numbers the view's titles show
/// (last values) and the held-out accuracy's first and last evaluation.
pub fn table(sources: &[Source]) -> String {
    use crate::fmt::{opt, short_opt};
    let head = [
        "SOURCE",
        "FLOW",
        "STEPS",
        "REWARD",
        "HELDOUT",
        "",
        "MISMATCH_KL",
        "",
        "ENTROPY",
        "RESP_LEN",
        "STEP_S",
    ];
    let sub = [
        "", "", "", "last", "first", "last", "mean", "max", "last", "last", "mean",
    ];
    let mut rows: Vec<Vec<String>> = vec![
        head.iter().map(|s| s.to_string()).collect(),
        sub.iter().map(|s| s.to_string()).collect(),
    ];
    for s in sources {
        let get = |k: &str, f: &str| {
            let c = s.curve(k);
            summary(&c).get(f).and_then(Value::as_f64)
        };
        rows.push(vec![
            s.label.clone(),
            s.flow.clone(),
            s.curve("reward_mean").len().to_string(),
            opt(get("reward_mean", "last"), 3),
            opt(get("heldout_accuracy", "first"), 3),
            opt(get("heldout_accuracy", "last"), 3),
            short_opt(get("mismatch_kl", "mean")),
            short_opt(get("mismatch_kl", "max")),
            opt(get("entropy", "last"), 3),
            opt(get("response_len_mean", "last"), 1),
            opt(get("step_s", "mean"), 2),
        ]);
    }
    let n = head.len();
    let w: Vec<usize> = (0..n)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
        let cells: Vec<String> = (0..n)
            .map(|i| {
                if i < 2 {
                    format!("{:<w$}", r[i], w = w[i])
                } else {
                    format!("{:>w$}", r[i], w = w[i])
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(flow: &str, kl: f64) -> Source {
        let metrics = (0..4)
            .map(|s| {
                let mut m = json!({"phase": "rl", "step": s, "flow": flow,
                    "reward_mean": 0.1 * s as f64, "mismatch_kl": kl, "entropy": 1.0,
                    "response_len_mean": 10.0, "step_s": 0.5});
                if s % 2 == 0 {
                    m["heldout_accuracy"] = json!(0.2 + 0.1 * s as f64);
                }
                m
            })
            .chain([json!({"phase": "rl", "step": 3, "reward_mean": 9.0, "abandoned": true})])
            .collect();
        Source {
            id: flow.into(),
            label: flow.into(),
            flow: flow.into(),
            metrics,
        }
    }

    #[test]
    fn json_has_summaries_and_points_of_the_live_line() {
        let v = to_json(&[src("fp8", 0.0), src("bf16-fp8rollout", 1e-3)]);
        let r = &v["runs"][0];
        assert_eq!(r["rl_steps"], 4);
        assert_eq!(r["summary"]["reward_mean"]["last"], 0.30000000000000004);
        assert_eq!(r["summary"]["reward_mean"]["max"], 0.30000000000000004);
        assert_eq!(r["summary"]["heldout_accuracy"]["points"], 2);
        assert_eq!(r["summary"]["heldout_accuracy"]["first"], 0.2);
        assert_eq!(
            r["series"]["heldout_accuracy"],
            json!([[0.0, 0.2], [2.0, 0.4]])
        );
        assert_eq!(v["runs"][1]["summary"]["mismatch_kl"]["mean"], 1e-3);
        let t = table(&[src("fp8", 0.0)]);
        assert!(t.lines().nth(2).unwrap().starts_with("fp8"), "{t}");
        assert!(t.contains("0.300"), "{t}");
    }

    #[test]
    fn files_and_folders() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["fp8", "bf16"] {
            let lines: Vec<String> = src(f, 0.0).metrics.iter().map(|m| m.to_string()).collect();
            std::fs::write(dir.path().join(format!("{f}.jsonl")), lines.join("\n")).unwrap();
        }
        let s = from_path(dir.path()).unwrap();
        assert_eq!(
            s.iter().map(|s| s.label.as_str()).collect::<Vec<_>>(),
            ["bf16", "fp8"]
        );
        let bad = dir.path().join("bad.jsonl");
        std::fs::write(&bad, "{\"phase\":\"rl\",\"step\":0}\n{oops\n").unwrap();
        let e = Source::file(&bad).unwrap_err();
        assert!(e.contains("bad.jsonl: line 2"), "{e}");
        let e = from_path(&dir.path().join("missing.jsonl")).unwrap_err();
        assert!(e.contains("missing.jsonl"), "{e}");
        std::fs::write(&bad, "{\"phase\":\"sft\",\"step\":0}\n").unwrap();
        assert!(Source::file(&bad).unwrap_err().contains("no RL step"));
    }
}
