//! `jetctl plot` on metrics files (no jetd needed): the SVG parses as XML with
//! one line per source and their labels; the PNG decodes to the asked size
//! and has the series' colours; bad input gets an error naming it.

use std::path::Path;
use std::process::Command;

use serde_json::json;

fn jetctl(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_jetctl"))
        .args(args)
        .output()
        .unwrap()
}

/// A `jetd run --metrics-out` file of `steps` RL steps (and one SFT step).
fn metrics_file(dir: &Path, flow: &str, kl: f64, steps: u64) -> String {
    let mut lines = vec![json!({"phase": "sft", "step": 0, "flow": flow, "loss": 2.0}).to_string()];
    for s in 0..steps {
        let mut m = json!({"phase": "rl", "step": s, "flow": flow,
            "reward_mean": 0.1 + 0.05 * s as f64, "mismatch_kl": kl * (1.0 + s as f64),
            "entropy": 1.0 - 0.01 * s as f64, "step_s": 0.5});
        if s % 5 == 0 {
            m["heldout_accuracy"] = json!(0.2 + 0.01 * s as f64);
        }
        lines.push(m.to_string());
    }
    let p = dir.join(format!("{flow}.jsonl"));
    std::fs::write(&p, lines.join("\n") + "\n").unwrap();
    p.display().to_string()
}

#[test]
fn svg_and_png_charts_decode() {
    let tmp = tempfile::tempdir().unwrap();
    let fp8 = metrics_file(tmp.path(), "fp8", 0.0, 20);
    let off = metrics_file(tmp.path(), "bf16-fp8rollout", 1e-3, 20);

    let svg = tmp.path().join("reward.svg");
    let out = jetctl(&[
        "plot",
        &fp8,
        &off,
        "--metric",
        "reward_mean",
        "--out",
        svg.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&svg).unwrap();
    let doc = roxmltree::Document::parse(&text).expect("the SVG is well-formed XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    assert_eq!(
        (root.attribute("width"), root.attribute("height")),
        (Some("1000"), Some("600"))
    );
    let lines = doc
        .descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .count();
    assert!(lines >= 2, "a line per source, {lines} polylines");
    let texts: Vec<&str> = doc.descendants().filter_map(|n| n.text()).collect();
    for want in [
        "fp8",
        "bf16-fp8rollout",
        "reward_mean over RL steps",
        "RL step",
    ] {
        assert!(
            texts.iter().any(|t| t.contains(want)),
            "no text {want:?} in {texts:?}"
        );
    }

    // A folder (`jetd compare --metrics-dir`) is its flows; mismatch on a log axis.
    let png = tmp.path().join("kl.png");
    let dir = tmp.path().to_str().unwrap();
    let out = jetctl(&[
        "plot",
        dir,
        "--metric",
        "mismatch_kl",
        "--out",
        png.to_str().unwrap(),
        "--size",
        "640x400",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dec = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&png).unwrap()));
    let mut reader = dec.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (640, 400));
    assert_eq!(info.color_type, png::ColorType::Rgb);
    let px: Vec<[u8; 3]> = buf[..info.buffer_size()]
        .chunks(3)
        .map(|c| [c[0], c[1], c[2]])
        .collect();
    // The first two series' colours (plot.rs) are drawn; the rest is mostly white.
    for c in [[0u8, 114, 178], [213, 94, 0]] {
        assert!(
            px.iter().filter(|p| **p == c).count() > 50,
            "colour {c:?} drawn"
        );
    }
    let white = px.iter().filter(|p| **p == [255, 255, 255]).count();
    assert!(white > px.len() / 2, "a white background");
    // Text is rendered (dark anti-aliased pixels beyond the lines' colours).
    assert!(
        px.iter()
            .filter(|p| p[0] < 100 && p[1] < 100 && p[2] < 100)
            .count()
            > 200
    );
}

#[test]
fn bad_input_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let fp8 = metrics_file(tmp.path(), "fp8", 0.0, 3);
    let cases: [(&[&str], &str); 4] = [
        (
            &["plot", &fp8, "--metric", "reward_mean", "--out", "x.gif"],
            "must end in .svg or .png",
        ),
        (
            &["plot", &fp8, "--metric", "nope", "--out", "x.svg"],
            "--metric nope: no RL step",
        ),
        (
            &[
                "plot",
                "missing.jsonl",
                "--metric",
                "reward_mean",
                "--out",
                "x.svg",
            ],
            "missing.jsonl",
        ),
        (
            &[
                "plot",
                &fp8,
                "--metric",
                "reward_mean",
                "--out",
                "x.svg",
                "--size",
                "10x10",
            ],
            "100 to 8000",
        ),
    ];
    for (args, want) in cases {
        let out = jetctl(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    assert!(!Path::new("x.svg").exists() && !Path::new("x.gif").exists());
    let out = jetctl(&["compare", &fp8, "--json"]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["runs"][0]["summary"]["reward_mean"]["last"], 0.2);
}
