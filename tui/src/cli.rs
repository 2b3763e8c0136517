//! The command line: `jetctl` opens the console, `jetctl SUBCOMMAND` scripts jetd.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use jet_proto::{CheckpointInfo, Event, Op, RunInfo, RunState};
use serde_json::Value;

use crate::client::{socket_path, Client, ClientError};
use crate::{compare, output};

/// The Jet operator console: attaches to a running jetd.
///
/// Without a subcommand it opens the console; every console action also exists as a
/// subcommand. Exit status: 0 ok, 1 the daemon refused the request, 3 jetd not reachable.
#[derive(Parser, Debug)]
#[command(name = "jetctl", version, about)]
pub struct Cli {
    /// Socket of jetd (default: DATA_DIR/jetd.sock).
    #[arg(long, global = true, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Data directory of jetd.
    #[arg(long, global = true, value_name = "DIR", default_value = "runs")]
    pub data_dir: PathBuf,
    /// Seconds to wait for each reply.
    #[arg(long, global = true, value_name = "SECS", default_value_t = 15.0)]
    pub timeout: f64,
    /// Console only: watch, but disable every key that changes a run.
    #[arg(long)]
    pub readonly: bool,
    #[command(subcommand)]
    pub cmd: Option<Cmd>,
}

#[derive(Args, Debug, Clone, Copy)]
pub struct JsonFlag {
    /// Print the daemon's JSON result instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct RunArg {
    /// Run id (e.g. r-0003).
    pub run: String,
    #[command(flatten)]
    pub out: JsonFlag,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// List every run.
    Runs(JsonFlag),
    /// Submit a run from a TOML config (sent inline, with its absolute path).
    Submit {
        config: PathBuf,
        /// Number of RL steps.
        #[arg(long)]
        steps: Option<u64>,
        /// Precision flow: bf16, bf16-fp8rollout or fp8.
        #[arg(long)]
        flow: Option<String>,
        #[arg(long)]
        seed: Option<u64>,
        /// Name of the run (default: from the config).
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// Show one run.
    Status(RunArg),
    /// Pause a run at the next step boundary.
    ///
    /// Answers once the run is paused, checkpointed and that is durable: an
    /// acknowledged pause survives a crash of jetd. A step can take a while on
    /// a large model: raise --timeout if needed (the pause happens anyway).
    Pause(RunArg),
    /// Resume a paused run.
    Resume(RunArg),
    /// Stop a run.
    Stop(RunArg),
    /// Write a checkpoint now.
    Checkpoint(RunArg),
    /// List the checkpoints of a run.
    Checkpoints(RunArg),
    /// Restore the checkpoint of RL step S and go on from there.
    ///
    /// A computing run restores it at the next step boundary and goes on from
    /// S. A paused run stays paused, at step S: inspect it, then `jetctl
    /// resume` goes on from S. A queued run stays queued; a stopped, finished
    /// or failed run is queued again. The answer comes once the rollback and
    /// its event are durable: from then on `jetctl status` shows step S, even
    /// across a crash of jetd. The metrics after S stay in the store, marked
    /// abandoned (an older branch).
    Rollback {
        run: String,
        #[arg(long)]
        step: u64,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// Delete a run that is not computing.
    Delete(RunArg),
    /// Print the per-step metrics of a run.
    Metrics {
        run: String,
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
        /// First step.
        #[arg(long)]
        from: Option<u64>,
        /// Last step.
        #[arg(long)]
        to: Option<u64>,
    },
    /// Print the events of a run.
    Events {
        run: String,
        /// From this sequence number on.
        #[arg(long)]
        from: Option<u64>,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// Runs side by side: the numbers of the console's Compare view.
    ///
    /// Each SOURCE is a run id of jetd, a metrics JSONL file (`jetd run
    /// --metrics-out`), or a folder of them (`jetd compare --metrics-dir`: its
    /// three flows). Prints per source the last reward, the first and last
    /// held-out accuracy, mismatch_kl, entropy, response length and step time;
    /// `--json` adds every curve's points.
    Compare {
        #[arg(required = true, value_name = "SOURCE")]
        sources: Vec<String>,
        #[command(flatten)]
        out: JsonFlag,
    },
    /// Write a chart of one metric of several runs (SVG or PNG) for a report.
    ///
    /// Sources as for `compare`. The y axis is logarithmic for the mismatch
    /// metrics (exact zeros drawn on a floor, labelled) unless --scale says otherwise.
    Plot {
        #[arg(required = true, value_name = "SOURCE")]
        sources: Vec<String>,
        /// A numeric field of the metrics records, e.g. reward_mean,
        /// heldout_accuracy, mismatch_kl, entropy, response_len_mean, step_s.
        #[arg(long)]
        metric: String,
        /// The image: FILE.svg or FILE.png.
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// Width x height in pixels.
        #[arg(long, default_value = "1000x600", value_parser = parse_size)]
        size: (u32, u32),
        #[arg(long, value_enum, default_value_t = crate::plot::Scale::Auto)]
        scale: crate::plot::Scale,
    },
    /// Subscribe and print the snapshot and every push as JSON lines until jetd closes.
    Watch {
        /// Only this run (default: all runs).
        run: Option<String>,
    },
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Table,
    Csv,
    Jsonl,
}

/// Errors of a subcommand, with their exit status.
#[derive(Debug)]
pub enum CmdError {
    Client(ClientError),
    Usage(String),
}

impl CmdError {
    pub fn exit_code(&self) -> i32 {
        match self {
            CmdError::Client(ClientError::Server { .. }) => 1,
            CmdError::Client(_) => 3,
            CmdError::Usage(_) => 2,
        }
    }
}

impl std::fmt::Display for CmdError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CmdError::Client(e) => write!(f, "{e}"),
            CmdError::Usage(m) => write!(f, "{m}"),
        }
    }
}

impl From<ClientError> for CmdError {
    fn from(e: ClientError) -> Self {
        CmdError::Client(e)
    }
}

impl Cli {
    pub fn socket_path(&self) -> PathBuf {
        socket_path(self.socket.as_deref(), Some(&self.data_dir))
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout.clamp(0.05, 3600.0))
    }
}

fn parse_size(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("{s:?}: expected WIDTHxHEIGHT in pixels, like 1000x600");
    let (w, h) = s.split_once(['x', 'X']).ok_or_else(bad)?;
    Ok((
        w.trim().parse().map_err(|_| bad())?,
        h.trim().parse().map_err(|_| bad())?,
    ))
}

/// The sources of `compare` and `plot`: paths are read here; run ids are
/// asked of jetd (connecting only when there is one).
fn load_sources(cli: &Cli, args: &[String]) -> Result<Vec<compare::Source>, CmdError> {
    let mut out = Vec::new();
    let mut client: Option<(Client, Vec<RunInfo>)> = None;
    for a in args {
        let path = Path::new(a);
        if path.exists() || a.ends_with(".jsonl") || a.contains('/') {
            out.extend(compare::from_path(path).map_err(CmdError::Usage)?);
            continue;
        }
        if client.is_none() {
            let mut c = Client::connect(&cli.socket_path(), cli.timeout())?;
            let runs: Vec<RunInfo> = decode(c.request(Op::Runs)?, "runs")?;
            client = Some((c, runs));
        }
        let (c, runs) = client.as_mut().expect("connected above");
        let Some(info) = runs.iter().find(|r| r.id == *a) else {
            return Err(CmdError::Usage(format!(
                "{a}: no such run in jetd and no such file (runs: {})",
                runs.iter()
                    .map(|r| r.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        let ms: Vec<Value> = decode(
            c.request(Op::Metrics {
                run: a.clone(),
                from: None,
                to: None,
            })?,
            "metrics",
        )?;
        out.push(compare::Source::run(info, ms));
    }
    if out.len() > MAX_SOURCES {
        return Err(CmdError::Usage(format!(
            "{} sources: at most {MAX_SOURCES} fit one chart",
            out.len()
        )));
    }
    Ok(out)
}

/// Most sources `compare` and `plot` take (the colours of a legible chart).
const MAX_SOURCES: usize = 8;

/// Run one subcommand, writing its output to `out`.
pub fn run(cli: &Cli, cmd: &Cmd, out: &mut dyn Write) -> Result<(), CmdError> {
    // These two need jetd only for run ids (files are read without it).
    match cmd {
        Cmd::Compare { sources, out: j } => {
            let s = load_sources(cli, sources)?;
            let text = if j.json {
                let mut t = serde_json::to_string_pretty(&compare::to_json(&s)).unwrap_or_default();
                t.push('\n');
                t
            } else {
                compare::table(&s)
            };
            return write_out(out, &text);
        }
        Cmd::Plot {
            sources,
            metric,
            out: file,
            size,
            scale,
        } => {
            crate::plot::Format::of(file).map_err(CmdError::Usage)?;
            let s = load_sources(cli, sources)?;
            let spec = crate::plot::Spec {
                metric,
                sources: &s,
                size: *size,
                scale: *scale,
            };
            crate::plot::write(&spec, file).map_err(CmdError::Usage)?;
            return write_out(out, &format!("wrote {}\n", file.display()));
        }
        _ => {}
    }
    let config = match cmd {
        Cmd::Submit { config, .. } => Some(read_config(config)?),
        _ => None,
    };
    let mut c = Client::connect(&cli.socket_path(), cli.timeout())?;
    let text = match cmd {
        Cmd::Runs(j) => {
            let v = c.request(Op::Runs)?;
            show::<Vec<RunInfo>>(j, v, |r| output::runs_table(&r))?
        }
        Cmd::Submit {
            steps,
            flow,
            seed,
            name,
            out: j,
            ..
        } => {
            let (text, path) = config.expect("read above");
            let op = Op::Submit {
                config: Some(text),
                config_path: Some(path),
                steps: *steps,
                flow: flow.clone(),
                seed: *seed,
                name: name.clone(),
            };
            let v = c.request(op)?;
            show::<RunInfo>(j, v, |r| {
                format!(
                    "submitted {} ({}): {}, {} RL steps\n",
                    r.id, r.name, r.flow, r.steps
                )
            })?
        }
        Cmd::Status(a) => {
            let v = c.request(Op::Status { run: a.run.clone() })?;
            show::<RunInfo>(&a.out, v, |r| output::status_text(&r))?
        }
        Cmd::Pause(a) => {
            let v = c.request(Op::Pause { run: a.run.clone() })?;
            show::<RunInfo>(&a.out, v, |r| {
                format!(
                    "{}: paused at step {}; state {}\n",
                    r.id,
                    r.step,
                    r.state.name()
                )
            })?
        }
        Cmd::Resume(a) => run_op(&mut c, a, Op::Resume { run: a.run.clone() }, "resumed")?,
        Cmd::Stop(a) => run_op(&mut c, a, Op::Stop { run: a.run.clone() }, "stopped")?,
        Cmd::Delete(a) => run_op(&mut c, a, Op::Delete { run: a.run.clone() }, "deleted")?,
        Cmd::Rollback { run, step, out: j } => {
            let v = c.request(Op::Rollback {
                run: run.clone(),
                step: *step,
            })?;
            show::<RunInfo>(j, v, |r| match r.state {
                RunState::Paused => format!(
                    "{}: rolled back to step {step}; paused there (resume goes on from it)\n",
                    r.id
                ),
                s => format!("{}: rolled back to step {step}; now {}\n", r.id, s.name()),
            })?
        }
        Cmd::Checkpoint(a) => {
            let v = c.request(Op::Checkpoint { run: a.run.clone() })?;
            show::<CheckpointInfo>(&a.out, v, |k| {
                format!(
                    "{}: checkpoint at step {} ({}) in {}\n",
                    a.run, k.step, k.phase, k.path
                )
            })?
        }
        Cmd::Checkpoints(a) => {
            let v = c.request(Op::Checkpoints { run: a.run.clone() })?;
            show::<Vec<CheckpointInfo>>(&a.out, v, |k| output::checkpoints_table(&k))?
        }
        Cmd::Metrics {
            run,
            format,
            from,
            to,
        } => {
            let v = c.request(Op::Metrics {
                run: run.clone(),
                from: *from,
                to: *to,
            })?;
            let ms: Vec<Value> = decode(v, "metrics")?;
            match format {
                Format::Table => output::metrics_table(&ms),
                Format::Csv => output::metrics_csv(&ms),
                Format::Jsonl => output::metrics_jsonl(&ms),
            }
        }
        Cmd::Events { run, from, out: j } => {
            let v = c.request(Op::Events {
                run: run.clone(),
                from: *from,
            })?;
            show::<Vec<Event>>(j, v, |e| output::events_table(&e))?
        }
        Cmd::Compare { .. } | Cmd::Plot { .. } => unreachable!("answered above"),
        Cmd::Watch { run } => {
            let (snap, subs) = c.subscribe(run.clone())?;
            let line = serde_json::json!({ "snapshot": snap });
            write_out(out, &format!("{line}\n"))?;
            for p in subs {
                let line = serde_json::to_string(&p).unwrap_or_default();
                write_out(out, &format!("{line}\n"))?;
            }
            return Ok(());
        }
    };
    write_out(out, &text)
}

fn write_out(out: &mut dyn Write, s: &str) -> Result<(), CmdError> {
    out.write_all(s.as_bytes())
        .and_then(|_| out.flush())
        .map_err(|e| CmdError::Usage(format!("cannot write output: {e}")))
}

fn run_op(c: &mut Client, a: &RunArg, op: Op, what: &str) -> Result<String, CmdError> {
    let v = c.request(op)?;
    show::<RunInfo>(&a.out, v, |r| {
        format!("{}: {what}; state {}\n", r.id, r.state.name())
    })
}

fn decode<T: serde::de::DeserializeOwned>(v: Value, what: &str) -> Result<T, CmdError> {
    serde_json::from_value(v)
        .map_err(|e| ClientError::Protocol(format!("result of '{what}': {e}")).into())
}

/// With `--json` the result as the daemon sent it; otherwise decoded and formatted.
fn show<T: serde::de::DeserializeOwned>(
    j: &JsonFlag,
    v: Value,
    text: impl FnOnce(T) -> String,
) -> Result<String, CmdError> {
    if j.json {
        let mut s = serde_json::to_string_pretty(&v).unwrap_or_default();
        s.push('\n');
        Ok(s)
    } else {
        Ok(text(decode(v, "request")?))
    }
}

/// The config text and its absolute path.
fn read_config(p: &Path) -> Result<(String, String), CmdError> {
    let text = std::fs::read_to_string(p)
        .map_err(|e| CmdError::Usage(format!("cannot read config {}: {e}", p.display())))?;
    let abs = std::fs::canonicalize(p)
        .map_err(|e| CmdError::Usage(format!("cannot resolve {}: {e}", p.display())))?;
    Ok((text, abs.to_string_lossy().into_owned()))
}
