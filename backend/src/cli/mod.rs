//! The `jetd` command line.

mod compare;
mod run;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use jet_kernels::Flow;

#[derive(Parser, Debug)]
#[command(
    name = "jetd",
    version,
    about = "Jet: on-policy FP8 reinforcement learning for LLMs"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run one RL job in the foreground (SFT warm-up if configured, then GRPO).
    Run(RunArgs),
    /// Run the three precision flows on one seed and print the comparison table.
    Compare(CompareArgs),
    /// The daemon: runs submitted jobs, persists them, serves jetctl.
    Serve(ServeArgs),
    /// Measure the CUDA path on random weights of a model shape.
    Bench(crate::bench::BenchArgs),
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Data directory (store, checkpoints, socket).
    #[arg(long, default_value = "runs")]
    pub data_dir: PathBuf,
    /// Unix socket path (default: DATA_DIR/jetd.sock).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Also listen on TCP at this address (e.g. 127.0.0.1:7070); needs --token-file.
    #[arg(long, requires = "token_file")]
    pub tcp: Option<String>,
    /// File holding the token every TCP connection must present.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// GPUs for `device = "cuda"` runs: all, none, or CUDA device numbers like
    /// 0,1. One run computes on each at a time.
    #[arg(long, default_value = "all")]
    pub gpus: crate::daemon::GpuChoice,
    /// Serve Prometheus metrics (GET /metrics) on this address, e.g.
    /// 127.0.0.1:9464. Off by default; it needs no token, so keep it on loopback
    /// or a trusted network.
    #[arg(long)]
    pub metrics_addr: Option<String>,
}

/// Options shared by `run` and `compare`.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// Run config (TOML); `tiny-arith` or no value means the embedded default.
    pub config: Option<PathBuf>,
    /// Number of RL steps (the SFT warm-up still runs first).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Random seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// cpu or cuda.
    #[arg(long)]
    pub device: Option<String>,
    /// Data directory (final models are saved under it).
    #[arg(long, default_value = "runs")]
    pub data_dir: PathBuf,
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub common: Common,
    /// Precision flow: bf16, bf16-fp8rollout or fp8 (f32 for debugging).
    #[arg(long)]
    pub flow: Option<Flow>,
    /// Write one JSON object per step to this file.
    #[arg(long)]
    pub metrics_out: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct CompareArgs {
    #[command(flatten)]
    pub common: Common,
    /// Also write every flow's metrics as JSONL into this folder (FLOW.jsonl).
    #[arg(long)]
    pub metrics_dir: Option<PathBuf>,
    /// Print the summary as one JSON object (per flow: the table's columns, the
    /// held-out accuracy at each evaluation and the per-length buckets) instead
    /// of the tables.
    #[arg(long)]
    pub json: bool,
}

pub fn dispatch(cli: Cli) -> anyhow::Result<()> {
    match cli.cmd {
        Command::Run(a) => run::run(a),
        Command::Compare(a) => compare::compare(a),
        Command::Bench(a) => crate::bench::bench(a),
        Command::Serve(a) => crate::daemon::serve(crate::daemon::ServeOptions {
            data_dir: a.data_dir,
            socket: a.socket,
            tcp: a.tcp,
            token_file: a.token_file,
            gpus: a.gpus,
            metrics_addr: a.metrics_addr,
        }),
    }
}
