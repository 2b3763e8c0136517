//! `jetd run`: one run in the foreground.

use std::fs::File;
use std::io::{BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use jet_kernels::Flow;

use super::{Common, RunArgs};
use crate::config::RunConfig;
use crate::model::save_model;
use crate::trainer::{StepMetrics, Trainer};

/// Load the config and apply the command-line overrides.
pub(super) fn load_config(c: &Common) -> anyhow::Result<RunConfig> {
    let mut cfg = match &c.config {
        None => RunConfig::tiny_arith(),
        Some(p) if p.as_os_str() == "tiny-arith" => RunConfig::tiny_arith(),
        Some(p) => RunConfig::from_file(p)?,
    };
    if let Some(s) = c.steps {
        cfg.run.steps = s;
    }
    if let Some(s) = c.seed {
        cfg.run.seed = s;
    }
    if let Some(d) = &c.device {
        cfg.run.device = d.clone();
        cfg.validate()?;
    }
    Ok(cfg)
}

/// Run to the end, calling `on_step` after each step. Returns the trainer.
pub(crate) fn drive(
    cfg: RunConfig,
    flow: Option<Flow>,
    mut on_step: impl FnMut(&Trainer, &StepMetrics) -> anyhow::Result<()>,
) -> anyhow::Result<Trainer> {
    let mut t = Trainer::new(cfg, flow)?;
    // Skipped dataset lines and the like: said once, before the first step.
    for w in t.task.warnings() {
        eprintln!("jetd: warning: {w}");
    }
    while let Some(m) = t.next_step() {
        let m = m?;
        on_step(&t, &m)?;
    }
    Ok(t)
}

fn run_name(cfg: &RunConfig, flow: Flow) -> String {
    let stem = Path::new(&cfg.source)
        .file_stem()
        .map(|s| {
            s.to_string_lossy()
                .trim_matches(|c| c == '<' || c == '>')
                .replace(' ', "-")
        })
        .unwrap_or_else(|| "run".into());
    format!("{stem}-{flow}-seed{}", cfg.run.seed)
}

pub(super) fn run(a: RunArgs) -> anyhow::Result<()> {
    let cfg = load_config(&a.common)?;
    let flow = a.flow.unwrap_or(cfg.run.flow.0);
    let name = run_name(&cfg, flow);
    let mut out = match &a.metrics_out {
        Some(p) => Some(BufWriter::new(
            File::create(p).with_context(|| format!("cannot create {}", p.display()))?,
        )),
        None => None,
    };
    let tty = std::io::stderr().is_terminal();
    eprintln!(
        "jetd run: {} ({} flow, seed {}, device {})",
        cfg.source, flow, cfg.run.seed, cfg.run.device
    );
    let mut t = drive(cfg, Some(flow), |t, m| {
        let total = if m.phase == "sft" {
            t.sft_total()
        } else {
            t.rl_total()
        };
        let line = m.progress_line(total);
        if tty {
            let done = (m.step + 1) as f64 / total.max(1) as f64;
            let bar = "#".repeat((done * 20.0) as usize);
            eprint!("\r\x1b[2K[{bar:<20}] {line}");
            if m.step + 1 == total {
                eprintln!();
            }
        } else {
            eprintln!("{line}");
        }
        if let Some(o) = out.as_mut() {
            writeln!(o, "{}", m.to_json_line())?;
            o.flush()?;
        }
        Ok(())
    })?;
    let dir: PathBuf = a.common.data_dir.join(&name).join("final");
    t.sync_host()?;
    save_model(&dir, &t.model_cfg, &t.weights)
        .with_context(|| format!("saving the final model to {}", dir.display()))?;
    t.tokenizer
        .save(&dir.join("tokenizer.json"))
        .map_err(|e| anyhow::anyhow!("saving the tokenizer: {e}"))?;
    eprintln!(
        "done: {} RL steps, last held-out accuracy {}; model saved to {}",
        t.progress.rl_steps_done,
        t.last_heldout.map_or("-".into(), |v| format!("{v:.3}")),
        dir.display()
    );
    Ok(())
}
