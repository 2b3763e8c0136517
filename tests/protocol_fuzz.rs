//! Protocol fuzz against a real `jetd serve`: a few hundred thousand frames
//! (random bytes, JSON-ish token soup, truncated requests, nesting past
//! serde's depth limit, every field of every request with a wrong type,
//! valid requests on real and unknown runs, oversized frames) over several
//! connections at once, while idle clients hold half-sent lines and slow
//! clients send without reading. Every frame gets exactly one answer, in
//! order, with the code (and, where there is one, the field) it should
//! name; the daemon never crashes; its memory stays bounded.
//!
//!     cargo test -p jet-backend --test protocol_fuzz -- --nocapture
//!     JET_FUZZ_FRAMES=2000000 JET_FUZZ_SEED=N ...

mod reliability;

use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::mpsc::{sync_channel, TrySendError};
use std::time::{Duration, Instant};

use jet_proto::fields::{Kind, FIELDS};
use jet_proto::MAX_FRAME;
use reliability::{config, Client, Daemon, Rng};
use serde_json::{json, Value};

/// What the answer to one frame must be.
#[derive(Debug)]
enum Expect {
    Ok {
        id: u64,
    },
    /// An error; `id` echoed when the frame had a usable one, `code` when
    /// known, and its message names each of `names`.
    Err {
        id: Option<u64>,
        code: Option<&'static str>,
        names: Vec<String>,
    },
    /// Any answer (random bytes may happen to spell anything).
    Any,
}

const CODES: [&str; 10] = [
    "bad_frame",
    "too_large",
    "unknown_op",
    "bad_request",
    "unknown_run",
    "bad_config",
    "bad_state",
    "no_checkpoint",
    "bad_checkpoint",
    "unauthorized",
];

fn check(reply: &Value, e: &Expect, frame: &[u8]) {
    let ctx = || {
        format!(
            "frame {:?} -> {reply}",
            String::from_utf8_lossy(&frame[..frame.len().min(300)])
        )
    };
    assert!(
        reply["id"].is_u64() && reply["ok"].is_boolean(),
        "{}",
        ctx()
    );
    if reply["ok"] == false {
        let code = reply["error"]["code"].as_str().unwrap_or("");
        // "internal" would be a daemon bug: user input never causes one.
        assert!(CODES.contains(&code), "{}", ctx());
        assert!(reply["error"]["message"].is_string(), "{}", ctx());
    }
    match e {
        Expect::Any => {}
        Expect::Ok { id } => {
            assert_eq!(
                (reply["ok"].as_bool(), reply["id"].as_u64()),
                (Some(true), Some(*id)),
                "{}",
                ctx()
            );
        }
        Expect::Err { id, code, names } => {
            assert_eq!(reply["ok"], false, "{}", ctx());
            if let Some(id) = id {
                assert_eq!(reply["id"].as_u64(), Some(*id), "{}", ctx());
            }
            if let Some(c) = code {
                assert_eq!(reply["error"]["code"], *c, "{}", ctx());
            }
            let msg = reply["error"]["message"].as_str().unwrap();
            for n in names {
                assert!(msg.contains(n.as_str()), "message names {n}: {}", ctx());
            }
        }
    }
}

/// Values of the wrong JSON type for a field of `kind`.
fn wrong_value(rng: &mut Rng, kind: Kind) -> Value {
    let any = [
        json!(true),
        json!([1, "a"]),
        json!({"a": 1}),
        json!(1.5),
        json!(-7),
        json!("s"),
        json!(null),
        json!(18446744073709551615u64),
        json!(""),
    ];
    loop {
        let v = &any[rng.below(any.len() as u64) as usize];
        let fits = match kind {
            Kind::Str => v.is_string(),
            Kind::OptStr => v.is_string() || v.is_null(),
            Kind::U64 => v.is_u64(),
            Kind::OptU64 => v.is_u64() || v.is_null(),
        };
        if !fits {
            return v.clone();
        }
    }
}

fn right_value(rng: &mut Rng, kind: Kind, run: &str) -> Value {
    match kind {
        Kind::Str | Kind::OptStr => json!(run),
        Kind::U64 | Kind::OptU64 => json!(rng.below(50)),
    }
}

/// A valid request for op `i` of FIELDS on `run`.
fn valid(rng: &mut Rng, i: usize, id: u64, run: &str) -> Value {
    let (op, fs) = FIELDS[i];
    let mut r = json!({"id": id, "op": op});
    for &(f, k) in fs {
        r[f] = right_value(rng, k, run);
    }
    r
}

/// One frame (no newline) and what its answer must be.
fn frame(rng: &mut Rng, id: u64, real: &str) -> (Vec<u8>, Expect) {
    let unknown = format!("r{}", 900_000 + rng.below(1000));
    match rng.below(100) {
        // Random bytes.
        0..=24 => {
            let n = 1 + rng.below(200) as usize;
            let b = (0..n)
                .map(|_| match rng.next() as u8 {
                    b'\n' => b' ',
                    x => x,
                })
                .collect();
            (b, Expect::Any)
        }
        // JSON-ish token soup.
        25..=39 => {
            const T: [&str; 16] = [
                "{",
                "}",
                "[",
                "]",
                ":",
                ",",
                "\"id\"",
                "\"op\"",
                "\"run\"",
                "\"step\"",
                "1",
                "-1",
                "\"status\"",
                "null",
                "true",
                "\"\\u0000\"",
            ];
            let n = 1 + rng.below(40);
            let s: String = (0..n).map(|_| rng.pick(&T)).collect();
            (s.into_bytes(), Expect::Any)
        }
        // A valid request cut short.
        40..=54 => {
            let i = rng.below(FIELDS.len() as u64) as usize;
            let s = valid(rng, i, id, &unknown).to_string();
            let cut = 1 + rng.below(s.len() as u64 - 1) as usize;
            let e = Expect::Err {
                id: None,
                code: Some("bad_frame"),
                names: vec![],
            };
            (s.as_bytes()[..cut].to_vec(), e)
        }
        // Each field of each request with a wrong type (or missing, when required).
        55..=74 => {
            let with_fields: Vec<usize> = (0..FIELDS.len())
                .filter(|&i| !FIELDS[i].1.is_empty())
                .collect();
            let i = rng.pick(&with_fields);
            let (op, fs) = FIELDS[i];
            let mut r = valid(rng, i, id, &unknown);
            let (f, k) = fs[rng.below(fs.len() as u64) as usize];
            if matches!(k, Kind::Str | Kind::U64) && rng.below(4) == 0 {
                r.as_object_mut().unwrap().remove(f);
            } else {
                r[f] = wrong_value(rng, k);
            }
            let e = Expect::Err {
                id: Some(id),
                code: Some("bad_request"),
                names: vec![op.to_string(), f.to_string()],
            };
            (r.to_string().into_bytes(), e)
        }
        // The id or op with a wrong type.
        75..=79 => {
            if rng.below(2) == 0 {
                let r = json!({"id": wrong_value(rng, Kind::U64), "op": "runs"});
                let e = Expect::Err {
                    id: None,
                    code: Some("bad_request"),
                    names: vec!["'id'".into()],
                };
                (r.to_string().into_bytes(), e)
            } else {
                let r = json!({"id": id, "op": wrong_value(rng, Kind::Str)});
                let e = Expect::Err {
                    id: Some(id),
                    code: Some("bad_request"),
                    names: vec!["'op'".into()],
                };
                (r.to_string().into_bytes(), e)
            }
        }
        // Nesting, past serde's depth limit (128) or not.
        80..=84 => {
            let d = 1 + rng.below(3000) as usize;
            let s = format!(
                "{{\"id\":{id},\"op\":\"status\",\"run\":{}{}}}",
                "[".repeat(d),
                "]".repeat(d)
            );
            let e = Expect::Err {
                id: None,
                code: None,
                names: vec![],
            };
            (s.into_bytes(), e)
        }
        // Valid reads of the real run and of an unknown one.
        85..=94 => {
            let reads = ["runs", "status", "checkpoints", "metrics", "events"];
            let op = rng.pick(&reads);
            let i = FIELDS.iter().position(|(o, _)| *o == op).unwrap();
            if op != "runs" && rng.below(3) == 0 {
                let e = Expect::Err {
                    id: Some(id),
                    code: Some("unknown_run"),
                    names: vec![unknown.clone()],
                };
                (valid(rng, i, id, &unknown).to_string().into_bytes(), e)
            } else {
                (
                    valid(rng, i, id, real).to_string().into_bytes(),
                    Expect::Ok { id },
                )
            }
        }
        // Valid commands on unknown runs; a submit with a broken config; an unknown op.
        _ => {
            let cmds = [
                "pause",
                "resume",
                "stop",
                "checkpoint",
                "rollback",
                "delete",
            ];
            match rng.below(3) {
                0 => {
                    let cmd = rng.pick(&cmds);
                    let i = FIELDS.iter().position(|(o, _)| *o == cmd).unwrap();
                    let e = Expect::Err {
                        id: Some(id),
                        code: Some("unknown_run"),
                        names: vec![unknown.clone()],
                    };
                    (valid(rng, i, id, &unknown).to_string().into_bytes(), e)
                }
                1 => {
                    let cfg = format!("[run]\nsteps = \"x{}\"\n", rng.below(1000));
                    let r = json!({"id": id, "op": "submit", "config": cfg});
                    let e = Expect::Err {
                        id: Some(id),
                        code: Some("bad_config"),
                        names: vec!["steps".into()],
                    };
                    (r.to_string().into_bytes(), e)
                }
                _ => {
                    let r = json!({"id": id, "op": format!("op{}", rng.below(100))});
                    let e = Expect::Err {
                        id: Some(id),
                        code: Some("unknown_op"),
                        names: vec![],
                    };
                    (r.to_string().into_bytes(), e)
                }
            }
        }
    }
}

/// Send `n` frames on one connection (a writer thread) while checking every
/// answer in order (this thread).
fn fuzz_connection(socket: &Path, real: String, seed: u64, n: usize) -> usize {
    let s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut rd = BufReader::new(s.try_clone().unwrap());
    let mut hello = String::new();
    rd.read_line(&mut hello).unwrap();
    let (tx, rx) = sync_channel::<(Vec<u8>, Expect)>(4096);
    let writer = std::thread::spawn(move || {
        let mut wr = BufWriter::new(s);
        let mut rng = Rng(seed);
        for id in 1..=n as u64 {
            let (mut f, e) = frame(&mut rng, id, &real);
            // A blank line gets no answer: the daemon skips it.
            if String::from_utf8_lossy(&f).trim().is_empty() {
                continue;
            }
            f.push(b'\n');
            wr.write_all(&f).unwrap();
            f.pop();
            match tx.try_send((f, e)) {
                Ok(()) => {}
                Err(TrySendError::Full(x)) => {
                    // Far ahead of the answers: let the daemon see what is buffered.
                    wr.flush().unwrap();
                    tx.send(x).unwrap();
                }
                Err(TrySendError::Disconnected(_)) => panic!("reader gone"),
            }
        }
        wr.flush().unwrap();
    });
    let mut answered = 0;
    let mut line = String::new();
    for (f, e) in rx {
        loop {
            line.clear();
            let got = rd.read_line(&mut line).unwrap();
            assert!(
                got > 0,
                "connection closed with answers missing (the daemon died?)"
            );
            let v: Value =
                serde_json::from_str(&line).unwrap_or_else(|err| panic!("{line:?}: {err}"));
            if v.get("push").is_none() {
                check(&v, &e, &f);
                break;
            }
        }
        answered += 1;
    }
    writer.join().unwrap();
    answered
}

#[test]
fn fuzzed_frames_all_get_answers_and_memory_stays_bounded() {
    let frames: usize = std::env::var("JET_FUZZ_FRAMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300_000);
    let seed: u64 = std::env::var("JET_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(jet_backend::store::now_ms);
    eprintln!("fuzz: seed {seed} (JET_FUZZ_SEED={seed} replays the frames), {frames} frames");
    let t0 = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let mut d = Daemon::start(&tmp.path().join("data"));
    let mut c = Client::connect(&d);
    // A real run with metrics, events and checkpoints for the reads to hit.
    // JET_FUZZ_RUN_STEPS makes its answers larger (the slow clients' too).
    let steps = std::env::var("JET_FUZZ_RUN_STEPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let real = c.submit(&config(4, steps, 20));
    c.wait_for(&real, "finished", |s| s["state"] == "finished");

    // Idle clients: connected, some holding half a request, silent throughout.
    let mut idle: Vec<UnixStream> = (0..64)
        .map(|_| UnixStream::connect(d.socket()).unwrap())
        .collect();
    for (i, s) in idle.iter_mut().enumerate() {
        if i % 2 == 0 {
            s.write_all(format!("{{\"id\":{i},\"op\":\"runs\"").as_bytes())
                .unwrap();
        }
    }
    // Slow clients: send many requests and read nothing until the end.
    const SLOW: u64 = 3000;
    let slow: Vec<_> = (0..4)
        .map(|_| {
            let s = UnixStream::connect(d.socket()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
            let mut wr = s.try_clone().unwrap();
            let req = format!("{{\"id\":7,\"op\":\"metrics\",\"run\":\"{real}\"}}\n");
            let w = std::thread::spawn(move || {
                for _ in 0..SLOW {
                    wr.write_all(req.as_bytes()).unwrap();
                }
            });
            (s, w)
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let rss_before = d.rss_kib();
    eprintln!(
        "fuzz: RSS with the slow clients stalled: {:.1} MiB",
        rss_before as f64 / 1024.0
    );

    // The frames, in two halves over 4 connections each (memory between halves).
    let conns = 4;
    let mut answered = 0;
    let mut rss_mid = 0;
    for half in 0..2 {
        let per = frames / 2 / conns;
        let hs: Vec<_> = (0..conns)
            .map(|k| {
                let (sock, real) = (d.socket(), real.clone());
                let s = seed.wrapping_add((half * conns + k) as u64 * 0x1000_0001);
                std::thread::spawn(move || fuzz_connection(&sock, real, s, per))
            })
            .collect();
        for h in hs {
            answered += h.join().unwrap();
        }
        if half == 0 {
            rss_mid = d.rss_kib();
        }
        assert!(d.alive(), "jetd crashed; log:\n{}", d.log());
    }

    // Oversized frames: refused, one answer each, then the connection goes on.
    let mut big = Client::connect(&d);
    let mut rng = Rng(seed ^ 0xb16);
    for _ in 0..16 {
        let n = MAX_FRAME + 1 + rng.below(MAX_FRAME as u64) as usize;
        let f = format!("{{\"id\":1,\"op\":\"runs\",\"pad\":\"{}\"}}", "x".repeat(n));
        let r = big.raw(&f);
        assert_eq!(r["error"]["code"], "too_large", "{r}");
    }
    assert_eq!(big.ok(json!({"op": "runs"})).as_array().unwrap().len(), 1);
    // 64 MiB without a newline, then the client hangs up.
    {
        let mut s = UnixStream::connect(d.socket()).unwrap();
        let chunk = vec![b'['; 1 << 20];
        for _ in 0..64 {
            s.write_all(&chunk).unwrap();
        }
    }

    // The slow clients read at last: every answer is there.
    for (s, w) in slow {
        let mut rd = BufReader::new(s);
        let mut l = String::new();
        rd.read_line(&mut l).unwrap(); // hello
        for i in 0..SLOW {
            l.clear();
            rd.read_line(&mut l).unwrap();
            let v: Value =
                serde_json::from_str(&l).unwrap_or_else(|e| panic!("slow answer {i}: {l:?}: {e}"));
            assert_eq!(v["ok"], true, "{v}");
        }
        // Its last requests went out once the daemon could take them again.
        w.join().unwrap();
    }
    // The idle clients finish their half-sent requests and are answered.
    for (i, s) in idle.iter_mut().enumerate() {
        if i % 2 == 0 {
            s.write_all(b"}\n").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut buf = vec![0u8; 4096];
            let mut got = Vec::new();
            while got.iter().filter(|&&b| b == b'\n').count() < 2 {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "idle client {i} was dropped");
                got.extend_from_slice(&buf[..n]);
            }
            let second = String::from_utf8_lossy(&got)
                .lines()
                .nth(1)
                .unwrap()
                .to_string();
            let v: Value = serde_json::from_str(&second).unwrap();
            assert_eq!(
                (v["id"].as_u64(), v["ok"].as_bool()),
                (Some(i as u64), Some(true)),
                "{v}"
            );
        }
    }
    drop(idle);
    std::thread::sleep(Duration::from_millis(200));
    let rss_after = d.rss_kib();
    assert!(d.alive(), "jetd crashed; log:\n{}", d.log());
    assert_eq!(c.ok(json!({"op": "runs"})).as_array().unwrap().len(), 1);
    assert!(
        !d.log().contains("panicked"),
        "a panic in jetd:\n{}",
        d.log()
    );
    let mib = |k: u64| k as f64 / 1024.0;
    eprintln!(
        "fuzz: {answered} frames answered (+16 oversized, 64 MiB unterminated, {} slow-client \
         requests, 64 idle clients), crashes 0; RSS before {:.1} MiB, after half {:.1} MiB, \
         after {:.1} MiB; {:.1} s; seed {seed}",
        4 * SLOW,
        mib(rss_before),
        mib(rss_mid),
        mib(rss_after),
        t0.elapsed().as_secs_f64()
    );
    assert!(
        answered >= frames * 99 / 100,
        "{answered} of {frames} frames answered"
    );
    // Bounded: the second half (as many frames again) does not grow it, and
    // the whole is within a fixed margin of where it started.
    assert!(
        rss_after <= rss_mid + 16 * 1024,
        "RSS grew by {:.1} MiB over the second half",
        mib(rss_after.saturating_sub(rss_mid))
    );
    assert!(
        rss_after <= rss_before + 64 * 1024,
        "RSS grew from {:.1} to {:.1} MiB",
        mib(rss_before),
        mib(rss_after)
    );
}
