//! `jetd compare`: the three flows on one seed, side by side (the small-scale
//! version of the paper's table).

use std::fs::File;
use std::io::{BufWriter, Write};

use anyhow::Context;
use jet_kernels::Flow;

use super::run::{drive, load_config};
use super::CompareArgs;

struct Row {
    flow: Flow,
    heldout_first: Option<f64>,
    heldout_final: Option<f64>,
    kl_mean: f64,
    kl_max: f64,
    diff_max: f64,
    rollout_s: f64,
    train_s: f64,
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
                }
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
    let f = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.3}"));
    println!("{}", "-".repeat(104));
    println!(
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
    println!(
        "{:<16} {:>9} {:>9} {:>14} {:>14} {:>12} {:>11} {:>10}",
        "", "", "final", "mean", "max", "", "total", "total"
    );
    for r in &rows {
        println!(
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
    Ok(())
}
