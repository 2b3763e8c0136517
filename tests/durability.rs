//! Acknowledged means durable: the reproduction of issue 14 (pause, rollback,
//! kill -9 at once, restart: the rollback must still be there), rollback on a
//! paused run, run ids across crashes, and (ignored) the acknowledgement
//! latency that flushing before the reply costs.

mod reliability;

use std::time::{Duration, Instant};

use reliability::{config, live, reference_metrics, Client, Daemon};
use serde_json::json;

#[test]
fn a_rollback_acknowledged_on_a_paused_run_survives_kill9() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let cfg = config(12, 12, 2);
    let reference = reference_metrics(&cfg, tmp.path());

    let d = Daemon::start(&data);
    let mut c = Client::connect(&d);
    let run = c.submit(&cfg);
    c.wait_for(&run, "RL step 7", |s| s["step"].as_u64().unwrap() >= 7);
    c.ok(json!({"op": "pause", "run": run}));
    let paused = c.wait_for(&run, "paused", |s| s["state"] == "paused");
    assert!(paused["step"].as_u64().unwrap() >= 7);

    // The reproduction: the reply says ok, then the daemon dies at once.
    let rb = c.ok(json!({"op": "rollback", "run": run, "step": 4}));
    d.kill9();
    let d = Daemon::start(&data);
    let mut c = Client::connect(&d);
    let s = c.status(&run);
    assert_eq!(
        (s["state"].as_str(), s["step"].as_u64()),
        (Some("paused"), Some(4)),
        "after kill -9 the acknowledged rollback is still there: {s}"
    );
    assert_eq!(rb["state"], "paused", "a paused run stays paused: {rb}");
    assert_eq!(rb["step"], 4, "the reply shows the restored step: {rb}");
    let events = c.ok(json!({"op": "events", "run": run}));
    assert!(
        events
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["kind"] == "rollback" && e["step"] == 4),
        "the rollback's event was recorded: {events}"
    );

    // Paused, rolled back again: status shows the step as soon as it is acknowledged.
    let rb = c.ok(json!({"op": "rollback", "run": run, "step": 2}));
    assert_eq!(
        (rb["state"].as_str(), rb["step"].as_u64()),
        (Some("paused"), Some(2))
    );
    let s = c.status(&run);
    assert_eq!(
        (s["state"].as_str(), s["step"].as_u64()),
        (Some("paused"), Some(2))
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        c.status(&run)["state"],
        "paused",
        "it does not compute until resumed"
    );

    // Resumed, it goes on from step 2 and replays the uninterrupted run bit for bit.
    c.ok(json!({"op": "resume", "run": run}));
    c.wait_for(&run, "finished", |s| s["state"] == "finished");
    let m = c.ok(json!({"op": "metrics", "run": run}));
    assert_eq!(live(&m), reference);
}

#[test]
fn run_ids_stay_short_and_sequential_across_crashes() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let cfg = config(400, 1, 0);
    let mut ids = vec![];
    for _ in 0..5 {
        let d = Daemon::start(&data);
        let mut c = Client::connect(&d);
        ids.push(c.submit(&cfg));
        d.kill9();
    }
    assert_eq!(ids, ["r0001", "r0002", "r0003", "r0004", "r0005"]);
    // A deleted run's id is not handed out again.
    let d = Daemon::start(&data);
    let mut c = Client::connect(&d);
    for id in &ids {
        if c.status(id)["state"] != "paused" {
            let r = c.req(json!({"op": "pause", "run": id}));
            assert!(r["ok"] == true || r["error"]["code"] == "bad_state", "{r}");
        }
    }
    c.wait_for("r0005", "paused", |s| s["state"] == "paused");
    c.ok(json!({"op": "delete", "run": "r0005"}));
    d.kill9();
    let d = Daemon::start(&data);
    let mut c = Client::connect(&d);
    assert_eq!(
        c.req(json!({"op": "status", "run": "r0005"}))["error"]["code"],
        "unknown_run"
    );
    assert_eq!(c.submit(&cfg), "r0006");
}

/// The figure in the README: median acknowledgement latency of a mutating
/// request (flushed before the reply) next to a read-only one, while the
/// daemon computes another run. Prints; asserts nothing about time.
///
///     cargo test -p jet-backend --test durability -- --ignored --nocapture ack_latency
#[test]
#[ignore]
fn ack_latency() {
    let tmp = tempfile::tempdir().unwrap();
    let d = Daemon::start(&tmp.path().join("data"));
    let mut c = Client::connect(&d);
    let busy = c.submit(&config(100_000, 1, 0));
    c.wait_for(&busy, "computing", |s| s["state"] == "running");
    // A second run stays queued behind the first: pause/resume only touch its record.
    let run = c.submit(&config(1, 1, 0));
    let n = 300;
    let (mut read, mut write) = (vec![], vec![]);
    for _ in 0..n {
        let t = Instant::now();
        c.ok(json!({"op": "status", "run": run}));
        read.push(t.elapsed());
        for op in ["pause", "resume"] {
            let t = Instant::now();
            c.ok(json!({"op": op, "run": run}));
            write.push(t.elapsed());
        }
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1e3
    };
    let p99 = |v: &Vec<Duration>| v[v.len() * 99 / 100].as_secs_f64() * 1e3;
    let (r, w) = (median(&mut read), median(&mut write));
    println!(
        "ack latency over {n} rounds: status (read-only) median {r:.3} ms p99 {:.3} ms; \
         pause/resume (flushed) median {w:.3} ms p99 {:.3} ms; flushing adds {:.3} ms",
        p99(&read),
        p99(&write),
        w - r
    );
}
