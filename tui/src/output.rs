//! Text output of the scriptable subcommands: readable tables, CSV and JSONL.

use jet_proto::{CheckpointInfo, Event, RunInfo};
use serde_json::Value;

use crate::fmt::{bytes, device, num, opt, short_opt, utc};

/// A plain text table: columns separated by two spaces, numbers right-aligned.
struct Table {
    head: Vec<&'static str>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(cols: &[(&'static str, bool)]) -> Table {
        Table {
            head: cols.iter().map(|c| c.0).collect(),
            right: cols.iter().map(|c| c.1).collect(),
            rows: vec![],
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn render(&self) -> String {
        let n = self.head.len();
        let mut w: Vec<usize> = self.head.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (i, c) in r.iter().enumerate().take(n) {
                w[i] = w[i].max(c.chars().count());
            }
        }
        let line = |cells: Vec<&str>| {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                let pad = w[i] - c.chars().count();
                let last = i + 1 == n;
                if i > 0 {
                    s.push_str("  ");
                }
                if self.right[i] {
                    s.push_str(&" ".repeat(pad));
                    s.push_str(c);
                } else {
                    s.push_str(c);
                    if !last {
                        s.push_str(&" ".repeat(pad));
                    }
                }
            }
            s.push('\n');
            s
        };
        let mut out = line(self.head.clone());
        for r in &self.rows {
            out.push_str(&line(r.iter().map(String::as_str).collect()));
        }
        out
    }
}

pub fn runs_table(runs: &[RunInfo]) -> String {
    if runs.is_empty() {
        return "no runs\n".into();
    }
    let mut t = Table::new(&[
        ("ID", false),
        ("NAME", false),
        ("STATE", false),
        ("FLOW", false),
        ("DEVICE", false),
        ("STEP", true),
        ("REWARD", true),
        ("HELDOUT", true),
        ("LAST ALARM", false),
    ]);
    for r in runs {
        t.row(vec![
            r.id.clone(),
            r.name.clone(),
            r.state.name().into(),
            r.flow.clone(),
            device(r),
            progress(r),
            opt(r.reward_mean, 3),
            opt(r.heldout_accuracy, 3),
            r.last_alarm.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    t.render()
}

/// `64/200`, or `sft 12/20` while the warm-up runs.
pub fn progress(r: &RunInfo) -> String {
    if r.step == 0 && r.sft_steps > 0 && r.sft_step < r.sft_steps {
        format!("sft {}/{}", r.sft_step, r.sft_steps)
    } else {
        format!("{}/{}", r.step, r.steps)
    }
}

pub fn status_text(r: &RunInfo) -> String {
    let mut s = String::new();
    let mut kv = |k: &str, v: String| s.push_str(&format!("{k:<17} {v}\n"));
    kv("id", r.id.clone());
    kv("name", r.name.clone());
    kv("state", r.state.name().into());
    kv("flow", r.flow.clone());
    kv("device", device(r));
    kv("rl step", format!("{}/{}", r.step, r.steps));
    kv("sft step", format!("{}/{}", r.sft_step, r.sft_steps));
    kv("reward mean", opt(r.reward_mean, 4));
    kv("heldout accuracy", opt(r.heldout_accuracy, 4));
    kv("mismatch_kl alarm", format!("{}", r.mismatch_kl_alarm));
    kv(
        "last alarm",
        r.last_alarm.clone().unwrap_or_else(|| "-".into()),
    );
    kv("created", utc(r.created_unix * 1000) + " UTC");
    if let Some(m) = &r.message {
        kv("message", m.clone());
    }
    s
}

pub fn checkpoints_table(cks: &[CheckpointInfo]) -> String {
    if cks.is_empty() {
        return "no checkpoints\n".into();
    }
    let mut t = Table::new(&[
        ("STEP", true),
        ("PHASE", false),
        ("HEALTH", false),
        ("REWARD", true),
        ("HELDOUT", true),
        ("SIZE", true),
        ("WRITTEN (UTC)", false),
        ("PATH", false),
    ]);
    for c in cks {
        t.row(vec![
            c.step.to_string(),
            c.phase.clone(),
            c.health.clone(),
            opt(c.reward_mean, 3),
            opt(c.heldout_accuracy, 3),
            bytes(c.bytes),
            utc(c.unix_ms),
            c.path.clone(),
        ]);
    }
    t.render()
}

pub fn events_table(evs: &[Event]) -> String {
    if evs.is_empty() {
        return "no events\n".into();
    }
    let mut t = Table::new(&[
        ("SEQ", true),
        ("TIME (UTC)", false),
        ("LEVEL", false),
        ("KIND", false),
        ("STEP", true),
        ("MESSAGE", false),
    ]);
    for e in evs {
        t.row(vec![
            e.seq.to_string(),
            utc(e.unix_ms),
            e.level.clone(),
            e.kind.clone(),
            e.step.map_or_else(|| "-".into(), |s| s.to_string()),
            e.message.clone(),
        ]);
    }
    t.render()
}

/// The readable metrics table: the columns an operator looks at first.
pub fn metrics_table(ms: &[Value]) -> String {
    if ms.is_empty() {
        return "no metrics\n".into();
    }
    let mut t = Table::new(&[
        ("PHASE", false),
        ("STEP", true),
        ("BR", true),
        ("REWARD", true),
        ("ACC", true),
        ("HELDOUT", true),
        ("MISMATCH_KL", true),
        ("ENTROPY", true),
        ("RESP_LEN", true),
        ("LOSS", true),
        ("STEP_S", true),
        ("", false),
    ]);
    for m in ms {
        t.row(vec![
            m.get("phase")
                .and_then(Value::as_str)
                .unwrap_or("rl")
                .to_string(),
            m.get("step").map_or_else(|| "-".into(), |s| s.to_string()),
            m.get("branch")
                .map_or_else(|| "-".into(), |s| s.to_string()),
            opt(num(m, "reward_mean"), 3),
            opt(num(m, "accuracy"), 3),
            opt(num(m, "heldout_accuracy"), 3),
            short_opt(num(m, "mismatch_kl")),
            opt(num(m, "entropy"), 3),
            opt(num(m, "response_len_mean"), 1),
            opt(num(m, "loss"), 4),
            opt(num(m, "step_s"), 2),
            if crate::fmt::is_abandoned(m) {
                "abandoned".into()
            } else {
                String::new()
            },
        ]);
    }
    t.render()
}

/// Column order of the CSV: these first (when present), then the rest sorted.
const CSV_FIRST: &[&str] = &[
    "phase",
    "step",
    "branch",
    "abandoned",
    "flow",
    "reward_mean",
    "reward_std",
    "accuracy",
    "heldout_accuracy",
    "response_len_mean",
    "entropy",
    "loss",
    "grad_norm",
    "clip_frac",
    "lr",
    "mismatch_kl",
    "mismatch_abs_prob_diff_mean",
    "mismatch_abs_prob_diff_max",
    "token_mult_prob_error",
    "rollout_s",
    "train_s",
    "step_s",
    "rollout_tokens_per_s",
    "train_tokens_per_s",
];

/// Metrics as CSV: one header line with the union of all fields, one line per step;
/// absent fields are empty, strings quoted when needed (RFC 4180).
pub fn metrics_csv(ms: &[Value]) -> String {
    let mut rest: Vec<String> = vec![];
    let mut first: Vec<&str> = vec![];
    for key in CSV_FIRST {
        if ms.iter().any(|m| m.get(*key).is_some()) {
            first.push(key);
        }
    }
    for m in ms {
        if let Some(o) = m.as_object() {
            for k in o.keys() {
                if !CSV_FIRST.contains(&k.as_str()) && !rest.contains(k) {
                    rest.push(k.clone());
                }
            }
        }
    }
    rest.sort();
    let cols: Vec<&str> = first
        .into_iter()
        .chain(rest.iter().map(String::as_str))
        .collect();
    let mut out = cols
        .iter()
        .map(|c| csv_field(c))
        .collect::<Vec<_>>()
        .join(",");
    out.push('\n');
    for m in ms {
        let cells: Vec<String> = cols
            .iter()
            .map(|c| m.get(*c).map_or_else(String::new, csv_value))
            .collect();
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

fn csv_value(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => csv_field(s),
        Value::Bool(_) | Value::Number(_) => v.to_string(),
        other => csv_field(&other.to_string()),
    }
}

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// Metrics as JSON lines, one object per step, as the store holds them.
pub fn metrics_jsonl(ms: &[Value]) -> String {
    let mut out = String::new();
    for m in ms {
        out.push_str(&m.to_string());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample() -> Vec<Value> {
        vec![
            json!({"phase":"sft","step":1,"loss":2.1,"lr":1e-5,"branch":0,"abandoned":false}),
            json!({"phase":"rl","step":1,"flow":"fp8","reward_mean":0.5,"mismatch_kl":0.0,
                   "branch":0,"abandoned":false,"note":"a,b \"q\"","zeta":[1,2]}),
            json!({"phase":"rl","step":2,"flow":"fp8","reward_mean":0.625,"heldout_accuracy":0.6,
                   "mismatch_kl":1.5e-7,"branch":1,"abandoned":true}),
        ]
    }

    #[test]
    fn csv_has_union_of_columns_in_stable_order() {
        let csv = metrics_csv(&sample());
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], "phase,step,branch,abandoned,flow,reward_mean,heldout_accuracy,loss,lr,mismatch_kl,note,zeta");
        assert_eq!(lines[1], "sft,1,0,false,,,,2.1,0.00001,,,");
        assert_eq!(
            lines[2],
            "rl,1,0,false,fp8,0.5,,,,0.0,\"a,b \"\"q\"\"\",\"[1,2]\""
        );
        assert_eq!(lines[3], "rl,2,1,true,fp8,0.625,0.6,,,1.5e-7,,");
        assert_eq!(lines.len(), 4);
    }

    #[test]
    fn jsonl_is_one_object_per_line() {
        let ms = sample();
        let out = metrics_jsonl(&ms);
        let back: Vec<Value> = out
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(back, ms);
        assert!(out.ends_with('\n'));
    }

    #[test]
    fn table_marks_abandoned_steps() {
        let t = metrics_table(&sample());
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].starts_with("PHASE  STEP  BR  REWARD"),
            "{}",
            lines[0]
        );
        assert!(lines[3].ends_with("abandoned"), "{}", lines[3]);
        assert!(lines[3].contains("1.5e-7"), "{}", lines[3]);
        assert_eq!(metrics_table(&[]), "no metrics\n");
    }
}
