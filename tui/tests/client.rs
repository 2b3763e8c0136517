//! The client against a fake jetd: hello check, replies matched by id while pushes
//! interleave, the subscription iterator, and the error messages a user sees.

mod common;

use std::time::Duration;

use common::{daemon, err, ok, serve, Answer, HELLO};
use jet_proto::{Op, Push, RunInfo};
use jet_tui::client::{Client, ClientError};
use serde_json::json;

const T: Duration = Duration::from_secs(5);

#[test]
fn no_socket_means_not_running() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jetd.sock");
    let e = Client::connect(&path, T).err().unwrap();
    assert_eq!(
        e.to_string(),
        format!("jetd is not running (no socket at {})", path.display())
    );
}

#[test]
fn stale_socket_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jetd.sock");
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    let e = Client::connect(&path, T).err().unwrap();
    assert_eq!(e, ClientError::Refused(path.clone()));
    assert!(
        e.to_string().contains("stale socket") && e.to_string().contains("connection refused"),
        "{e}"
    );
}

#[test]
fn protocol_version_is_checked() {
    let f = serve(
        r#"{"hello":{"protocol":2,"server":"jetd 0.9.0","auth_required":false}}"#,
        |_| Answer::Silence,
    );
    let e = Client::connect(&f.socket, T).err().unwrap();
    assert_eq!(
        e,
        ClientError::Version {
            server: 2,
            server_name: "jetd 0.9.0".into()
        }
    );
    assert!(
        e.to_string()
            .starts_with("jetd 0.9.0 speaks protocol 2, this jetctl speaks protocol 1"),
        "{e}"
    );
}

#[test]
fn something_else_on_the_socket() {
    let f = serve("SSH-2.0-OpenSSH_9.6", |_| Answer::Silence);
    let e = Client::connect(&f.socket, T).err().unwrap();
    assert_eq!(
        e.to_string(),
        "the server sent no jetd hello (got: SSH-2.0-OpenSSH_9.6)"
    );
    let f = serve(
        r#"{"hello":{"protocol":1,"server":"jetd","auth_required":true}}"#,
        |_| Answer::Silence,
    );
    assert_eq!(
        Client::connect(&f.socket, T).err().unwrap(),
        ClientError::AuthRequired
    );
}

#[test]
fn replies_match_ids_while_pushes_interleave() {
    let f = serve(HELLO, |req| {
        let gpu = r#"{"push":"gpu","gpus":[]}"#.to_string();
        match req.op {
            Op::Runs => Answer::Lines(vec![
                gpu,
                ok(req.id + 100, json!("a reply to someone else")),
                ok(req.id, json!([common::run_info("r-0001", "running")])),
            ]),
            Op::Subscribe { .. } => Answer::Lines(vec![
                r#"{"push":"resync","reason":"early"}"#.into(),
                ok(req.id, json!({"runs": [], "gpus": null})),
                r#"{"push":"run","run":RUN}"#.replace("RUN", &common::run_info("r-0001", "paused").to_string()),
                "this is not json".into(),
                r#"{"push":"gpu","gpus":[{"index":0,"name":"H100","util_pct":50,"mem_used_mib":1,"mem_total_mib":2,"power_w":100.0,"temp_c":40}]}"#.into(),
            ]),
            Op::Stop { .. } => Answer::Hangup,
            _ => Answer::Silence,
        }
    });
    let mut c = Client::connect(&f.socket, T).unwrap();
    assert_eq!(c.server(), "jetd 0.1.0");
    let runs: Vec<RunInfo> = c.call(Op::Runs).unwrap();
    assert_eq!(runs[0].id, "r-0001");
    let (snap, subs) = c.subscribe(None).unwrap();
    assert!(snap.gpus.is_none() && snap.runs.is_empty());
    let pushes: Vec<Push> = subs.take(4).collect();
    assert!(
        matches!(pushes[0], Push::Gpu { ref gpus } if gpus.is_empty()),
        "the push that came before the runs reply"
    );
    assert!(matches!(pushes[1], Push::Resync { .. }));
    assert!(matches!(pushes[2], Push::Run { ref run } if run.state == jet_proto::RunState::Paused));
    assert!(
        matches!(pushes[3], Push::Gpu { ref gpus } if gpus[0].util_pct == 50),
        "bad lines are skipped"
    );
    // The server hangs up: the request fails and the subscription ends.
    assert_eq!(
        c.request(Op::Stop {
            run: "r-0001".into()
        })
        .unwrap_err(),
        ClientError::Closed
    );
    assert_eq!(c.subscribe(None).err().unwrap(), ClientError::Closed);
}

#[test]
fn server_errors_carry_the_message() {
    let f = daemon();
    let mut c = Client::connect(&f.socket, T).unwrap();
    let e = c.request(Op::Status { run: "nope".into() }).unwrap_err();
    assert_eq!(
        e,
        ClientError::Server {
            code: "unknown_run".into(),
            message: "no run named 'nope'".into()
        }
    );
    assert_eq!(e.to_string(), "no run named 'nope'");
    // The connection is still good afterwards.
    let r: RunInfo = c
        .call(Op::Status {
            run: "r-0003".into(),
        })
        .unwrap();
    assert_eq!(r.state, jet_proto::RunState::Running);
}

#[test]
fn a_silent_server_times_out() {
    let f = serve(HELLO, |_| Answer::Silence);
    let mut c = Client::connect(&f.socket, Duration::from_millis(300)).unwrap();
    let t0 = std::time::Instant::now();
    let e = c.request(Op::Runs).unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert_eq!(e.to_string(), "jetd did not answer 'runs' within 0.3 s");
}

#[test]
fn a_hello_that_never_comes_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jetd.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&path).unwrap(); // accepts (backlog), says nothing
    let e = Client::connect(&path, Duration::from_millis(200))
        .err()
        .unwrap();
    assert!(matches!(e, ClientError::NoHello(_)), "{e}");
}

#[test]
fn malformed_requests_get_server_codes() {
    // Sanity of the fake itself against the proto crate's parser.
    let f = serve(HELLO, |req| {
        Answer::Lines(vec![err(req.id, "bad_state", "run r-0001 is finished")])
    });
    let mut c = Client::connect(&f.socket, T).unwrap();
    let e = c
        .request(Op::Pause {
            run: "r-0001".into(),
        })
        .unwrap_err();
    assert_eq!(e.to_string(), "run r-0001 is finished");
}
