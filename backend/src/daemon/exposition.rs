//! Prometheus text exposition (format 0.0.4) of what jetd knows: per run its
//! newest live RL step (gauges labelled `run` and `flow`), its newest
//! evaluation, its phase times, its progress, its alarms (counters), and the
//! latest GPU samples. Rendering is a pure function of that data, so it is
//! tested without a daemon; `metrics_http` serves it.

use std::collections::BTreeMap;
use std::fmt::Write;

use jet_proto::{GpuSample, RunInfo};
use serde_json::Value;

/// Fields of a metrics record that are not exported as `jet_rl_*` gauges:
/// bookkeeping, labels, and the phase times (exported as `jet_phase_seconds`).
const NOT_GAUGES: [&str; 8] = [
    "step",
    "branch",
    "abandoned",
    "phase",
    "flow",
    "rollout_s",
    "train_s",
    "step_s",
];
/// Phase-time fields and the `phase` label each gets.
const PHASE_TIMES: [(&str, &str); 3] = [
    ("rollout_s", "rollout"),
    ("train_s", "train"),
    ("step_s", "step"),
];

/// What the exposition shows of one run.
#[derive(Clone, Debug, Default)]
pub struct RunView {
    pub info: Option<RunInfo>,
    /// Its newest live metrics records, newest first (SFT and RL).
    pub newest: Vec<Value>,
    /// Alarm events by kind (`alarm.nan` counts as `nan`).
    pub alarms: BTreeMap<String, u64>,
}

/// One metric family: all its samples are written together under one
/// HELP/TYPE, as the format requires.
struct Family {
    name: String,
    help: String,
    kind: &'static str,
    samples: Vec<(String, f64)>,
}

#[derive(Default)]
struct Families(Vec<Family>);

impl Families {
    fn add(&mut self, name: &str, kind: &'static str, help: &str, labels: String, v: f64) {
        let name = metric_name(name);
        let fam = match self.0.iter().position(|f| f.name == name) {
            Some(i) => &mut self.0[i],
            None => {
                self.0.push(Family {
                    name,
                    help: help.to_string(),
                    kind,
                    samples: Vec::new(),
                });
                self.0.last_mut().expect("just pushed")
            }
        };
        fam.samples.push((labels, v));
    }

    fn gauge(&mut self, name: &str, help: &str, labels: String, v: f64) {
        self.add(name, "gauge", help, labels, v);
    }

    fn render(&self) -> String {
        let mut out = String::new();
        for f in &self.0 {
            let _ = writeln!(out, "# HELP {} {}", f.name, escape_help(&f.help));
            let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
            for (labels, v) in &f.samples {
                let _ = writeln!(out, "{}{} {}", f.name, labels, number(*v));
            }
        }
        out
    }
}

/// `{k="v",...}` with values escaped per the exposition format.
pub fn labels(pairs: &[(&str, &str)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let body: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
        .collect();
    format!("{{{}}}", body.join(","))
}

/// A label value: backslash, double quote and line feed are escaped.
pub fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// HELP text: backslash and line feed are escaped.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A metric name from a field name: characters outside `[a-zA-Z0-9_:]`
/// become `_` (a record's keys are ours, but a name must never break a line).
fn metric_name(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A sample value as Prometheus parses it (Go's ParseFloat): `NaN`, `+Inf`,
/// `-Inf`, plain decimals for everyday magnitudes, exponents otherwise (Rust's
/// Display never uses an exponent, so 1e-300 would be 300 digits).
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v == 0.0 || (1e-4..1e15).contains(&v.abs()) {
        format!("{v}")
    } else {
        format!("{v:e}")
    }
}

/// The exposition of `runs` and the latest GPU samples (None: no GPU here).
pub fn render(runs: &[RunView], gpus: Option<&[GpuSample]>) -> String {
    let mut f = Families::default();
    f.gauge(
        "jet_build_info",
        "jetd's version and protocol (value 1).",
        labels(&[
            ("version", env!("CARGO_PKG_VERSION")),
            ("protocol", &jet_proto::PROTOCOL_VERSION.to_string()),
        ]),
        1.0,
    );
    for r in runs {
        let Some(info) = &r.info else { continue };
        let l = labels(&[("run", &info.id), ("flow", &info.flow)]);
        f.gauge(
            "jet_run_info",
            "A run's name, state and device (value 1).",
            labels(&[
                ("run", &info.id),
                ("flow", &info.flow),
                ("name", &info.name),
                ("state", info.state.name()),
                ("device", &info.device),
            ]),
            1.0,
        );
        f.gauge(
            "jet_run_running",
            "1 while the run is running, else 0.",
            l.clone(),
            (info.state == jet_proto::RunState::Running) as u8 as f64,
        );
        f.gauge(
            "jet_run_rl_step",
            "RL steps done.",
            l.clone(),
            info.step as f64,
        );
        f.gauge(
            "jet_run_rl_steps",
            "RL steps planned.",
            l.clone(),
            info.steps as f64,
        );
        f.gauge(
            "jet_run_sft_step",
            "SFT warm-up steps done.",
            l.clone(),
            info.sft_step as f64,
        );
        f.gauge(
            "jet_run_sft_steps",
            "SFT warm-up steps planned.",
            l.clone(),
            info.sft_steps as f64,
        );
        f.gauge(
            "jet_mismatch_kl_alarm",
            "The run's alarm threshold of mismatch_kl.",
            l.clone(),
            info.mismatch_kl_alarm,
        );
        step_gauges(&mut f, r, info, &l);
        for (kind, n) in &r.alarms {
            f.add(
                "jet_alarms_total",
                "counter",
                "Alarm events of the run, by kind.",
                labels(&[("run", &info.id), ("flow", &info.flow), ("kind", kind)]),
                *n as f64,
            );
        }
    }
    gpu_gauges(&mut f, gpus);
    f.render()
}

/// The newest live RL record's numbers, its phase times, the newest
/// evaluation (held-out accuracy, pass@k), and the newest SFT record's loss.
fn step_gauges(f: &mut Families, r: &RunView, info: &RunInfo, l: &str) {
    let rl = r.newest.iter().find(|m| m["phase"] == "rl");
    if let Some(m) = rl {
        f.gauge(
            "jet_rl_step",
            "RL step of the newest record (0-based, as in the metrics).",
            l.to_string(),
            m["step"].as_f64().unwrap_or(0.0),
        );
        for (k, v) in m.as_object().into_iter().flatten() {
            if NOT_GAUGES.contains(&k.as_str()) || is_eval_field(k) {
                continue;
            }
            if let Some(v) = v.as_f64() {
                f.gauge(
                    &format!("jet_rl_{k}"),
                    &format!("`{k}` of the newest live RL step (see DESIGN.md)."),
                    l.to_string(),
                    v,
                );
            }
        }
        for (field, phase) in PHASE_TIMES {
            if let Some(v) = m[field].as_f64() {
                f.gauge(
                    "jet_phase_seconds",
                    "Seconds of the newest live RL step, by phase (step: all of it).",
                    labels(&[("run", &info.id), ("flow", &info.flow), ("phase", phase)]),
                    v,
                );
            }
        }
    }
    // Evaluations happen every `eval_every` steps: the newest one that has.
    match r
        .newest
        .iter()
        .find(|m| m["phase"] == "rl" && m["heldout_accuracy"].is_number())
    {
        Some(m) => {
            for (k, v) in m.as_object().into_iter().flatten() {
                if let (true, Some(v)) = (is_eval_field(k), v.as_f64()) {
                    f.gauge(
                        &format!("jet_eval_{k}"),
                        &format!("`{k}` of the newest evaluation on held-out problems."),
                        l.to_string(),
                        v,
                    );
                }
            }
            f.gauge(
                "jet_eval_step",
                "RL step of the newest evaluation.",
                l.to_string(),
                m["step"].as_f64().unwrap_or(0.0),
            );
        }
        None => {
            if let Some(h) = info.heldout_accuracy {
                f.gauge(
                    "jet_eval_heldout_accuracy",
                    "`heldout_accuracy` of the newest evaluation on held-out problems.",
                    l.to_string(),
                    h,
                );
            }
        }
    }
    if let Some(m) = r.newest.iter().find(|m| m["phase"] == "sft") {
        for k in ["loss", "grad_norm", "lr", "step_s"] {
            if let Some(v) = m[k].as_f64() {
                f.gauge(
                    &format!("jet_sft_{k}"),
                    &format!("`{k}` of the newest SFT warm-up step."),
                    l.to_string(),
                    v,
                );
            }
        }
    }
}

/// Fields only evaluation steps carry.
fn is_eval_field(k: &str) -> bool {
    k.starts_with("heldout_") || k.starts_with("pass_at_")
}

fn gpu_gauges(f: &mut Families, gpus: Option<&[GpuSample]>) {
    let gpus = gpus.unwrap_or(&[]);
    f.gauge(
        "jet_gpus",
        "GPUs NVML reports (0 without NVIDIA's driver).",
        String::new(),
        gpus.len() as f64,
    );
    for g in gpus {
        let index = g.index.to_string();
        let ordinal = g.ordinal.map(|o| o.to_string()).unwrap_or_default();
        let l = labels(&[
            ("gpu", &index),
            ("name", &g.name),
            ("ordinal", &ordinal),
            ("run", g.run.as_deref().unwrap_or("")),
        ]);
        let mib = (1u64 << 20) as f64;
        let samples = [
            (
                "jet_gpu_utilization_percent",
                "GPU utilisation (NVML), percent.",
                g.util_pct as f64,
            ),
            (
                "jet_gpu_memory_used_bytes",
                "GPU memory in use.",
                g.mem_used_mib as f64 * mib,
            ),
            (
                "jet_gpu_memory_total_bytes",
                "GPU memory in all.",
                g.mem_total_mib as f64 * mib,
            ),
            ("jet_gpu_power_watts", "GPU power draw.", g.power_w),
            (
                "jet_gpu_temperature_celsius",
                "GPU temperature.",
                g.temp_c as f64,
            ),
        ];
        for (name, help, v) in samples {
            f.gauge(name, help, l.clone(), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jet_proto::RunState;
    use serde_json::json;

    fn info(id: &str, name: &str) -> RunInfo {
        RunInfo {
            id: id.into(),
            name: name.into(),
            state: RunState::Running,
            flow: "fp8".into(),
            step: 3,
            steps: 10,
            sft_step: 5,
            sft_steps: 5,
            reward_mean: Some(0.5),
            heldout_accuracy: Some(0.25),
            last_alarm: None,
            mismatch_kl_alarm: 0.01,
            created_unix: 0,
            message: None,
            device: "cpu".into(),
            gpu: None,
        }
    }

    /// The sample lines of `text` as (name with labels, value).
    fn samples(text: &str) -> Vec<(String, String)> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                let (k, v) = l.rsplit_once(' ').unwrap();
                (k.to_string(), v.to_string())
            })
            .collect()
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape_label("x\ny"), "x\\ny");
        assert_eq!(
            labels(&[("run", "r1"), ("name", "say \"hi\"\n")]),
            r#"{run="r1",name="say \"hi\"\n"}"#
        );
        assert_eq!(metric_name("jet_eval_pass@4"), "jet_eval_pass_4");
    }

    #[test]
    fn numbers_parse_back() {
        for v in [0.0, 1.0, 0.25, 1e-10, 3.5e20, -2.0, 7.0e-4, 1234.5] {
            assert_eq!(number(v).parse::<f64>().unwrap(), v, "{}", number(v));
        }
        assert_eq!(number(1e-300), "1e-300");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(f64::NEG_INFINITY), "-Inf");
    }

    #[test]
    fn runs_steps_evals_alarms_and_gpus() {
        let run = RunView {
            info: Some(info("r0001", "tiny \"arith\"")),
            newest: vec![
                json!({"phase": "rl", "step": 2, "flow": "fp8", "reward_mean": 0.5,
                       "mismatch_kl": 0.0, "rollout_s": 0.1, "train_s": 0.3, "step_s": 0.45,
                       "branch": 0, "abandoned": false}),
                json!({"phase": "rl", "step": 1, "flow": "fp8", "reward_mean": 0.4,
                       "heldout_accuracy": 0.3, "pass_at_4": 0.6}),
                json!({"phase": "sft", "step": 4, "flow": "fp8", "loss": 1.5}),
            ],
            alarms: BTreeMap::from([("nan".to_string(), 2)]),
        };
        let gpu = GpuSample {
            index: 0,
            name: "H100".into(),
            util_pct: 50,
            mem_used_mib: 2,
            mem_total_mib: 4,
            power_w: 100.5,
            temp_c: 40,
            ordinal: Some(0),
            run: Some("r0001".into()),
        };
        let text = render(&[run], Some(&[gpu]));
        let s = samples(&text);
        let get = |k: &str| {
            s.iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("no {k} in\n{text}"))
        };
        let l = r#"{run="r0001",flow="fp8"}"#;
        assert_eq!(get(&format!("jet_rl_reward_mean{l}")), "0.5");
        assert_eq!(get(&format!("jet_rl_mismatch_kl{l}")), "0");
        assert_eq!(get(&format!("jet_rl_step{l}")), "2");
        assert_eq!(
            get(r#"jet_phase_seconds{run="r0001",flow="fp8",phase="train"}"#),
            "0.3"
        );
        assert_eq!(
            get(r#"jet_phase_seconds{run="r0001",flow="fp8",phase="step"}"#),
            "0.45"
        );
        // The newest evaluation, not the newest step (which has none).
        assert_eq!(get(&format!("jet_eval_heldout_accuracy{l}")), "0.3");
        assert_eq!(get(&format!("jet_eval_pass_at_4{l}")), "0.6");
        assert_eq!(get(&format!("jet_eval_step{l}")), "1");
        assert_eq!(get(&format!("jet_sft_loss{l}")), "1.5");
        assert_eq!(
            get(r#"jet_alarms_total{run="r0001",flow="fp8",kind="nan"}"#),
            "2"
        );
        assert!(text.contains("name=\"tiny \\\"arith\\\"\",state=\"running\""));
        assert_eq!(
            get(r#"jet_gpu_memory_total_bytes{gpu="0",name="H100",ordinal="0",run="r0001"}"#),
            "4194304"
        );
        assert_eq!(get("jet_gpus"), "1");
        // Bookkeeping is not exported; every family has one HELP and one TYPE,
        // before its samples, and its samples are contiguous.
        assert!(!text.contains("jet_rl_branch") && !text.contains("jet_rl_step_s"));
        let mut seen = std::collections::HashSet::new();
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                current = rest.split(' ').next().unwrap().to_string();
                assert!(seen.insert(current.clone()), "family {current} twice");
            } else if !line.starts_with('#') {
                let name = line.split(['{', ' ']).next().unwrap();
                assert_eq!(name, current, "{line} outside its family");
            }
        }
    }

    #[test]
    fn no_gpu_and_no_steps_yet() {
        let run = RunView {
            info: Some(info("r0002", "q")),
            ..RunView::default()
        };
        let text = render(&[run], None);
        assert!(text.contains("jet_gpus 0\n"), "{text}");
        assert!(text.contains("jet_run_rl_step{run=\"r0002\",flow=\"fp8\"} 3"));
        // Without an evaluation in the window: the record's last held-out accuracy.
        assert!(text.contains("jet_eval_heldout_accuracy{run=\"r0002\",flow=\"fp8\"} 0.25"));
        assert!(!text.contains("jet_rl_reward_mean"));
    }
}
