//! The Jet wire protocol: newline-delimited JSON over a Unix socket (mode 0600,
//! in the data dir) or, when enabled, TCP with a token.
//!
//! - On connect the server sends one [`Hello`] line (protocol version).
//! - A client sends [`Request`] lines; each carries an `id` that the [`Reply`]
//!   echoes. Errors are replies with `ok: false` and an [`ErrorBody`].
//! - `subscribe` answers with a [`Snapshot`] and then pushes [`Push`] lines
//!   (no `id`) until the connection closes. A client that falls behind gets a
//!   `resync` push instead of the lines it missed, and should subscribe again.
//!
//! Frames longer than [`MAX_FRAME`] bytes are refused.

pub mod fields;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Version of this protocol; bumped on any incompatible change.
pub const PROTOCOL_VERSION: u32 = 1;
/// Largest accepted line, in bytes (a submitted config travels inline).
pub const MAX_FRAME: usize = 1 << 20;
/// File name of the socket inside the data dir.
pub const SOCKET_NAME: &str = "jetd.sock";

/// The first line the server sends.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub hello: HelloBody,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HelloBody {
    pub protocol: u32,
    pub server: String,
    /// True when this connection must send `auth` first (TCP).
    #[serde(default)]
    pub auth_required: bool,
}

/// A client request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub id: u64,
    #[serde(flatten)]
    pub op: Op,
}

/// What a request asks for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Present the token (TCP connections).
    Auth {
        token: String,
    },
    /// Submit a run: TOML text inline, or a path the daemon can read.
    Submit {
        #[serde(default)]
        config: Option<String>,
        #[serde(default)]
        config_path: Option<String>,
        /// Overrides: RL steps, flow, seed.
        #[serde(default)]
        steps: Option<u64>,
        #[serde(default)]
        flow: Option<String>,
        #[serde(default)]
        seed: Option<u64>,
        #[serde(default)]
        name: Option<String>,
    },
    Runs,
    Status {
        run: String,
    },
    /// Pause at the next step boundary.
    Pause {
        run: String,
    },
    Resume {
        run: String,
    },
    Stop {
        run: String,
    },
    Checkpoint {
        run: String,
    },
    Checkpoints {
        run: String,
    },
    /// Restore the checkpoint of RL step `step` and go on from there.
    Rollback {
        run: String,
        step: u64,
    },
    Delete {
        run: String,
    },
    Metrics {
        run: String,
        #[serde(default)]
        from: Option<u64>,
        #[serde(default)]
        to: Option<u64>,
    },
    Events {
        run: String,
        #[serde(default)]
        from: Option<u64>,
    },
    /// Snapshot then live deltas; `run` absent means every run (and GPU samples).
    Subscribe {
        #[serde(default)]
        run: Option<String>,
    },
}

/// The answer to one request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reply {
    pub id: u64,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// Stable code: bad_frame, too_large, unknown_op, bad_request, unknown_run,
    /// bad_config, bad_state, no_checkpoint, bad_checkpoint, unauthorized, internal.
    pub code: String,
    pub message: String,
}

impl Reply {
    pub fn ok(id: u64, result: Value) -> Reply {
        Reply {
            id,
            ok: true,
            result: Some(result),
            error: None,
        }
    }
    pub fn err(id: u64, code: &str, message: impl Into<String>) -> Reply {
        Reply {
            id,
            ok: false,
            result: None,
            error: Some(ErrorBody {
                code: code.into(),
                message: message.into(),
            }),
        }
    }
}

/// State of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    Queued,
    Running,
    Paused,
    Stopped,
    Finished,
    Failed,
}

impl RunState {
    pub fn name(self) -> &'static str {
        match self {
            RunState::Queued => "queued",
            RunState::Running => "running",
            RunState::Paused => "paused",
            RunState::Stopped => "stopped",
            RunState::Finished => "finished",
            RunState::Failed => "failed",
        }
    }
    /// A run in this state will not compute again unless resumed or rolled back.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunState::Stopped | RunState::Finished | RunState::Failed
        )
    }
}

/// A run as listed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    pub id: String,
    pub name: String,
    pub state: RunState,
    pub flow: String,
    /// RL steps done and planned; SFT warm-up steps done and planned.
    pub step: u64,
    pub steps: u64,
    pub sft_step: u64,
    pub sft_steps: u64,
    pub reward_mean: Option<f64>,
    pub heldout_accuracy: Option<f64>,
    pub last_alarm: Option<String>,
    /// Alarm threshold of `mismatch_kl` (for the console's chart).
    pub mismatch_kl_alarm: f64,
    pub created_unix: u64,
    #[serde(default)]
    pub message: Option<String>,
    /// `cpu` or `cuda` (the run config's `run.device`); older daemons: `cpu`.
    #[serde(default = "cpu")]
    pub device: String,
    /// The GPU (CUDA device number of this jetd) the run computes on, or last
    /// computed on; None for CPU runs and GPU runs that have not started.
    #[serde(default)]
    pub gpu: Option<u32>,
}

fn cpu() -> String {
    "cpu".into()
}

/// One event of a run (state changes, checkpoints, alarms, rollbacks).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Sequence number within the run.
    pub seq: u64,
    pub unix_ms: u64,
    /// info, warn or alarm.
    pub level: String,
    /// e.g. state, checkpoint, rollback, alarm.collapse, alarm.mismatch, alarm.nan.
    pub kind: String,
    pub message: String,
    /// RL step it concerns, if any.
    pub step: Option<u64>,
}

/// One entry of the checkpoint catalog.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckpointInfo {
    /// RL steps done when it was taken (SFT checkpoints: 0 with `phase = "sft"`).
    pub step: u64,
    pub phase: String,
    pub path: String,
    /// ok or bad (a hash did not match on load).
    pub health: String,
    pub heldout_accuracy: Option<f64>,
    pub reward_mean: Option<f64>,
    pub unix_ms: u64,
    pub bytes: u64,
}

/// One GPU sample (NVML), per device.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuSample {
    pub index: u32,
    pub name: String,
    pub util_pct: u32,
    pub mem_used_mib: u64,
    pub mem_total_mib: u64,
    pub power_w: f64,
    pub temp_c: u32,
    /// The CUDA device number jetd gives this GPU (`--gpus`, `RunInfo::gpu`);
    /// None when this jetd does not serve it. NVML's `index` may differ.
    #[serde(default)]
    pub ordinal: Option<u32>,
    /// The run computing on it now, if any.
    #[serde(default)]
    pub run: Option<String>,
}

/// The first answer to `subscribe`: what the store holds now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub runs: Vec<RunInfo>,
    /// Metrics (one JSON object per step, see DESIGN.md) of the subscribed run.
    #[serde(default)]
    pub metrics: Vec<Value>,
    #[serde(default)]
    pub events: Vec<Event>,
    #[serde(default)]
    pub checkpoints: Vec<CheckpointInfo>,
    /// None: no GPU on this machine.
    #[serde(default)]
    pub gpus: Option<Vec<GpuSample>>,
}

/// A live delta after the snapshot.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "push", rename_all = "snake_case")]
pub enum Push {
    Metrics {
        run: String,
        metrics: Value,
    },
    Event {
        run: String,
        event: Event,
    },
    Run {
        run: RunInfo,
    },
    Checkpoint {
        run: String,
        checkpoint: CheckpointInfo,
    },
    Gpu {
        gpus: Vec<GpuSample>,
    },
    /// The client fell behind and lines were dropped: subscribe again.
    Resync {
        reason: String,
    },
}

/// Parse one request line, with the error code the reply should carry.
pub fn parse_request(line: &str) -> Result<Request, (Option<u64>, &'static str, String)> {
    if line.len() > MAX_FRAME {
        return Err((
            None,
            "too_large",
            format!(
                "frame of {} bytes exceeds the limit of {MAX_FRAME}",
                line.len()
            ),
        ));
    }
    let v: Value =
        serde_json::from_str(line).map_err(|e| (None, "bad_frame", format!("not JSON: {e}")))?;
    let obj = v.as_object().ok_or((
        None,
        "bad_frame",
        "a request must be a JSON object".to_string(),
    ))?;
    let id = match obj.get("id") {
        Some(Value::Number(n)) if n.as_u64().is_some() => n.as_u64(),
        Some(_) => {
            return Err((
                None,
                "bad_request",
                "field 'id' must be a non-negative integer".into(),
            ))
        }
        None => return Err((None, "bad_request", "missing field 'id'".into())),
    };
    let op = match obj.get("op") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err((id, "bad_request", "field 'op' must be a string".into())),
        None => return Err((id, "bad_request", "missing field 'op'".into())),
    };
    if fields::fields(&op).is_none() {
        return Err((id, "unknown_op", format!("unknown op '{op}'")));
    }
    if let Some(m) = fields::wrong_field(&op, obj) {
        return Err((id, "bad_request", m));
    }
    serde_json::from_value::<Request>(v).map_err(|e| (id, "bad_request", format!("op '{op}': {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        let r = Request {
            id: 7,
            op: Op::Rollback {
                run: "r1".into(),
                step: 20,
            },
        };
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(s, r#"{"id":7,"op":"rollback","run":"r1","step":20}"#);
        assert_eq!(parse_request(&s).unwrap(), r);
        let m = parse_request(r#"{"id":1,"op":"metrics","run":"a"}"#).unwrap();
        assert_eq!(
            m.op,
            Op::Metrics {
                run: "a".into(),
                from: None,
                to: None
            }
        );
    }

    #[test]
    fn bad_frames_get_codes() {
        assert_eq!(parse_request("{").unwrap_err().1, "bad_frame");
        assert_eq!(parse_request("[1]").unwrap_err().1, "bad_frame");
        assert_eq!(
            parse_request(r#"{"op":"runs"}"#).unwrap_err().1,
            "bad_request"
        );
        assert_eq!(
            parse_request(r#"{"id":-1,"op":"runs"}"#).unwrap_err().1,
            "bad_request"
        );
        let e = parse_request(r#"{"id":3,"op":"explode"}"#).unwrap_err();
        assert_eq!((e.0, e.1), (Some(3), "unknown_op"));
        let e = parse_request(r#"{"id":4,"op":"rollback","run":"x"}"#).unwrap_err();
        assert_eq!((e.0, e.1), (Some(4), "bad_request"));
        assert!(e.2.contains("step"), "{}", e.2);
        let big = format!(
            r#"{{"id":1,"op":"runs","pad":"{}"}}"#,
            "x".repeat(MAX_FRAME)
        );
        assert_eq!(parse_request(&big).unwrap_err().1, "too_large");
    }

    /// The field table matches the request types: every op with every field
    /// set parses; each field with a wrong type is named in the error.
    #[test]
    fn every_wrong_field_is_named() {
        for (op, fs) in fields::FIELDS {
            let mut ok = serde_json::json!({"id": 9, "op": op});
            for (f, k) in *fs {
                ok[*f] = match k {
                    fields::Kind::Str | fields::Kind::OptStr => "x".into(),
                    fields::Kind::U64 | fields::Kind::OptU64 => 3.into(),
                };
            }
            let r = parse_request(&ok.to_string()).unwrap_or_else(|e| panic!("{ok}: {e:?}"));
            // Exhaustive: a new op fails to compile here until it is in the table.
            let name = match r.op {
                Op::Auth { .. } => "auth",
                Op::Submit { .. } => "submit",
                Op::Runs => "runs",
                Op::Status { .. } => "status",
                Op::Pause { .. } => "pause",
                Op::Resume { .. } => "resume",
                Op::Stop { .. } => "stop",
                Op::Checkpoint { .. } => "checkpoint",
                Op::Checkpoints { .. } => "checkpoints",
                Op::Rollback { .. } => "rollback",
                Op::Delete { .. } => "delete",
                Op::Metrics { .. } => "metrics",
                Op::Events { .. } => "events",
                Op::Subscribe { .. } => "subscribe",
            };
            assert_eq!(name, *op);
            // Every field the type serializes is in the table.
            let back = serde_json::to_value(&r).unwrap();
            for k in back.as_object().unwrap().keys() {
                assert!(
                    k == "id" || k == "op" || fs.iter().any(|(f, _)| f == k),
                    "{op}: field {k} is not in the table"
                );
            }
            for (f, _) in *fs {
                for bad in [
                    serde_json::json!(true),
                    serde_json::json!([1]),
                    serde_json::json!(-1),
                ] {
                    let mut req = ok.clone();
                    req[*f] = bad;
                    let e = parse_request(&req.to_string()).unwrap_err();
                    assert_eq!((e.0, e.1), (Some(9), "bad_request"));
                    assert!(
                        e.2.contains(&format!("'{f}'")) && e.2.contains(op),
                        "{}",
                        e.2
                    );
                }
            }
        }
        let e = parse_request(r#"{"id":1,"op":"rollback","run":"r1","step":"ten"}"#).unwrap_err();
        assert_eq!(
            e.2,
            "op 'rollback': field 'step' must be a non-negative integer, not a string"
        );
        // Optional fields take null; required ones do not.
        assert!(parse_request(r#"{"id":1,"op":"metrics","run":"a","from":null}"#).is_ok());
        let e = parse_request(r#"{"id":1,"op":"status","run":null}"#).unwrap_err();
        assert!(e.2.contains("field 'run' must be a string"), "{}", e.2);
    }

    #[test]
    fn records_of_older_daemons_still_parse() {
        // A RunInfo and a GpuSample as protocol 1 sent them before the GPU fields.
        let r: RunInfo = serde_json::from_str(
            r#"{"id":"r0001","name":"t","state":"running","flow":"fp8","step":1,"steps":2,
                "sft_step":0,"sft_steps":0,"reward_mean":null,"heldout_accuracy":null,
                "last_alarm":null,"mismatch_kl_alarm":0.01,"created_unix":0}"#,
        )
        .unwrap();
        assert_eq!((r.device.as_str(), r.gpu), ("cpu", None));
        let g: GpuSample = serde_json::from_str(
            r#"{"index":0,"name":"H100","util_pct":1,"mem_used_mib":2,"mem_total_mib":3,
                "power_w":4.0,"temp_c":5}"#,
        )
        .unwrap();
        assert_eq!((g.ordinal, g.run), (None, None));
    }

    #[test]
    fn pushes_are_tagged() {
        let p = Push::Resync {
            reason: "slow".into(),
        };
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            r#"{"push":"resync","reason":"slow"}"#
        );
    }
}
