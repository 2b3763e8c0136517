//! `jetd compare`: the three flows on one seed, side by side (the small-scale
//! version of the paper's table), then the same flows per response-length
//! bucket (see `rl::by_length` for the buckets): mismatch and accuracy summed
//! over the RL steps, to show whether long responses drift further.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write};

use anyhow::Context;
use jet_kernels::Flow;
use serde::Serialize;

use super::run::{drive, load_config};
use super::CompareArgs;
use crate::rl::by_length::{merge, LengthBucket};

#[derive(Serialize)]
struct Row {
    #[serde(serialize_with = "flow_name")]
    flow: Flow,
    heldout_first: Option<f64>,
    heldout_final: Option<f64>,
    #[serde(rename = "mismatch_kl_mean")]
    kl_mean: f64,
    #[serde(rename = "mismatch_kl_max")]
    kl_max: f64,
    #[serde(rename = "mismatch_abs_prob_diff_max")]
    diff_max: f64,
    #[serde(rename = "rollout_s_total")]
    rollout_s: f64,
    #[serde(rename = "train_s_total")]
    train_s: f64,
    /// (RL step, held-out accuracy) at each evaluation.
    heldout: Vec<(u64, f64)>,
    /// Per response-length bucket, over all RL steps.
    by_length: Vec<LengthBucket>,
}

fn flow_name<S: serde::Serializer>(f: &Flow, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(f.name())
}

pub(super) fn compare(a: CompareArgs) -> anyhow::Result<()> {
    let cfg = load_config(&a.common)?;
    if let Some(d) = &a.metrics_dir {
        std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    let mut rows = Vec::new();
    for flow in Flow::PAPER {
        eprintln!("== {flow} ==");
        let mut out = match &a.metrics_dir {
            Some(d) => Some(BufWriter::new(File::create(
                d.join(format!("{flow}.jsonl")),
            )?)),
            None => None,
        };
        let mut r = Row {
            flow,
            heldout_first: None,
            heldout_final: None,
            kl_mean: 0.0,
            kl_max: 0.0,
            diff_max: 0.0,
            rollout_s: 0.0,
            train_s: 0.0,
            heldout: Vec::new(),
            by_length: Vec::new(),
        };
        let mut n = 0usize;
        drive(cfg.clone(), Some(flow), |t, m| {
            if let Some(o) = out.as_mut() {
                writeln!(o, "{}", m.to_json_line())?;
            }
            if m.phase == "rl" {
                eprintln!("{}", m.progress_line(t.rl_total()));
                if let Some(h) = m.heldout_accuracy {
                    r.heldout_first.get_or_insert(h);
                    r.heldout_final = Some(h);
                    r.heldout.push((m.step, h));
                }
                merge(&mut r.by_length, &m.mismatch_by_length);
                let kl = m.mismatch_kl.unwrap_or(0.0);
                r.kl_mean += kl;
                r.kl_max = r.kl_max.max(kl);
                r.diff_max = r.diff_max.max(m.mismatch_abs_prob_diff_max.unwrap_or(0.0));
                r.rollout_s += m.rollout_s.unwrap_or(0.0);
                r.train_s += m.train_s;
                n += 1;
            }
            Ok(())
        })?;
        r.kl_mean /= n.max(1) as f64;
        rows.push(r);
    }
    if a.json {
        let v = serde_json::json!({ "config": cfg.source, "steps": cfg.run.steps, "flows": rows });
        println!("{v}");
        return Ok(());
    }
    print!("{}", flows_table(&rows));
    print!("{}", buckets_table(&rows));
    Ok(())
}

// The tables are built as Strings (`let _ = writeln!`: writing to a String
// cannot fail) so that tests can read them.
fn flows_table(rows: &[Row]) -> String {
    let mut out = String::new();
    let f = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.3}"));
    let _ = writeln!(out, "{}", "-".repeat(104));
    let _ = writeln!(
        out,
        "{:<16} {:>9} {:>9} {:>14} {:>14} {:>12} {:>11} {:>10}",
        "flow",
        "heldout@0",
        "heldout",
        "mismatch_kl",
        "mismatch_kl",
        "|dp| max",
        "rollout s",
        "train s"
    );
    let _ = writeln!(
        out,
        "{:<16} {:>9} {:>9} {:>14} {:>14} {:>12} {:>11} {:>10}",
        "", "", "final", "mean", "max", "", "total", "total"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<16} {:>9} {:>9} {:>14.3e} {:>14.3e} {:>12.3e} {:>11.1} {:>10.1}",
            r.flow.name(),
            f(r.heldout_first),
            f(r.heldout_final),
            r.kl_mean,
            r.kl_max,
            r.diff_max,
            r.rollout_s,
            r.train_s
        );
    }
    out
}

/// The bucket table: one line per flow and response-length bucket.
fn buckets_table(rows: &[Row]) -> String {
    let mut out = String::new();
    out.push('\n');
    let _ = writeln!(
        out,
        "per response length (tokens, with the stop token), over all RL steps"
    );
    let _ = writeln!(
        out,
        "{:<16} {:>10} {:>10} {:>10} {:>14} {:>12} {:>9}",
        "flow", "length", "responses", "tokens", "mismatch_kl", "|dp| max", "accuracy"
    );
    for r in rows {
        for b in &r.by_length {
            let _ = writeln!(
                out,
                "{:<16} {:>10} {:>10} {:>10} {:>14.3e} {:>12.3e} {:>9.3}",
                r.flow.name(),
                format!("{}-{}", b.lo, b.hi - 1),
                b.responses,
                b.tokens,
                b.kl_mean,
                b.diff_max,
                b.accuracy
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(flow: Flow, kl: f64) -> Row {
        Row {
            flow,
            heldout_first: Some(0.25),
            heldout_final: None,
            kl_mean: kl,
            kl_max: kl,
            diff_max: 0.5,
            rollout_s: 1.0,
            train_s: 2.0,
            heldout: vec![(0, 0.25)],
            by_length: vec![
                LengthBucket {
                    lo: 0,
                    hi: 16,
                    responses: 3,
                    tokens: 30,
                    correct: 1,
                    kl_mean: kl,
                    diff_max: 0.5,
                    accuracy: 1.0 / 3.0,
                },
                LengthBucket {
                    lo: 256,
                    hi: 512,
                    responses: 2,
                    tokens: 600,
                    correct: 0,
                    kl_mean: 2.0 * kl,
                    diff_max: 0.75,
                    accuracy: 0.0,
                },
            ],
        }
    }

    #[test]
    fn bucket_table_has_a_line_per_flow_and_bucket() {
        let rows = [row(Flow::Fp8, 0.0), row(Flow::Bf16Fp8Rollout, 1e-3)];
        let t = buckets_table(&rows);
        let lines: Vec<Vec<&str>> = t
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .filter(|w| w.len() == 7 && w[0] != "flow")
            .collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert_eq!(
            lines[0],
            ["fp8", "0-15", "3", "30", "0.000e0", "5.000e-1", "0.333"]
        );
        assert_eq!(
            lines[3],
            [
                "bf16-fp8rollout",
                "256-511",
                "2",
                "600",
                "2.000e-3",
                "7.500e-1",
                "0.000"
            ]
        );
        let f = flows_table(&rows);
        assert!(f.contains("bf16-fp8rollout"), "{f}");
    }

    #[test]
    fn json_names_the_fields() {
        let v = serde_json::to_value(row(Flow::Fp8, 0.0)).unwrap();
        assert_eq!(v["flow"], "fp8");
        assert_eq!(v["mismatch_kl_mean"], 0.0);
        assert_eq!(v["heldout_final"], serde_json::Value::Null);
        assert_eq!(v["heldout"][0], serde_json::json!([0, 0.25]));
        assert_eq!(v["by_length"][1]["lo"], 256);
        assert_eq!(v["by_length"][1]["tokens"], 600);
    }
}
