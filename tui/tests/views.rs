//! Snapshot tests of every view at 80x24 and 160x48, fed with a recorded session
//! (tests/fixtures/session.jsonl: hello, the subscribe snapshot of r-0003, pushes).

use jet_tui::app::{App, ConnState, Dialog, View};
use jet_tui::replay::replay;
use ratatui::backend::TestBackend;
use ratatui::Terminal;

const SESSION: &str = include_str!("fixtures/session.jsonl");

fn session(readonly: bool) -> App {
    let mut app = App::new("runs/jetd.sock", readonly);
    app.open_run("r-0003");
    replay(&mut app, SESSION).expect("fixture replays");
    app
}

fn render(app: &App, w: u16, h: u16) -> String {
    let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
    t.draw(|f| jet_tui::ui::draw(f, app)).unwrap();
    t.backend().to_string()
}

fn both_sizes(name: &str, app: &App) {
    insta::assert_snapshot!(format!("{name}_80x24"), render(app, 80, 24));
    insta::assert_snapshot!(format!("{name}_160x48"), render(app, 160, 48));
}

#[test]
fn runs_view() {
    let mut app = session(false);
    app.view = View::Runs;
    app.runs_sel = 2;
    both_sizes("runs", &app);
}

#[test]
fn dashboard_view() {
    let mut app = session(false);
    app.view = View::Dashboard;
    both_sizes("dashboard", &app);
}

#[test]
fn dashboard_smoothed_without_gpu() {
    let mut app = session(false);
    app.view = View::Dashboard;
    app.smoothing = true;
    app.gpus = None;
    insta::assert_snapshot!("dashboard_ema_nogpu_80x24", render(&app, 80, 24));
}

#[test]
fn events_view() {
    let mut app = session(false);
    app.view = View::Events;
    both_sizes("events", &app);
}

#[test]
fn events_filtered() {
    let mut app = session(false);
    app.view = View::Events;
    app.events_filter = "alarm".into();
    insta::assert_snapshot!("events_filtered_80x24", render(&app, 80, 24));
}

#[test]
fn checkpoints_view() {
    let mut app = session(false);
    app.view = View::Checkpoints;
    app.ckpt_sel = 2;
    both_sizes("checkpoints", &app);
}

#[test]
fn rollback_dialog() {
    let mut app = session(false);
    app.view = View::Checkpoints;
    app.ckpt_sel = 2;
    app.dialog = Some(Dialog::Rollback {
        run: "r-0003".into(),
        step: 40,
    });
    insta::assert_snapshot!("rollback_dialog_80x24", render(&app, 80, 24));
}

#[test]
fn help_overlay_readonly() {
    let mut app = session(true);
    app.view = View::Dashboard;
    app.help = true;
    insta::assert_snapshot!("help_readonly_80x24", render(&app, 80, 24));
}

#[test]
fn reconnecting_before_any_data() {
    let mut app = App::new("runs/jetd.sock", false);
    app.conn = ConnState::Reconnecting {
        in_s: 3,
        reason: "jetd is not running (no socket at runs/jetd.sock)".into(),
    };
    insta::assert_snapshot!("reconnecting_80x24", render(&app, 80, 24));
    app.view = View::Dashboard;
    insta::assert_snapshot!("reconnecting_dashboard_80x24", render(&app, 80, 24));
}

#[test]
fn alarms_are_red() {
    use ratatui::style::Color;
    let mut app = session(false);
    app.view = View::Events;
    let mut t = Terminal::new(TestBackend::new(80, 24)).unwrap();
    t.draw(|f| jet_tui::ui::draw(f, &app)).unwrap();
    let buf = t.backend().buffer();
    // Row 3 is the newest event (a warn), row 4 the alarm at step 64.
    let row = |y: u16| {
        (0..80)
            .map(|x| buf[(x, y)].symbol().to_string())
            .collect::<String>()
    };
    assert!(row(4).contains("alarm"), "{}", row(4));
    let r = row(4);
    let x = r[..r.find("alarm").unwrap()].chars().count() as u16;
    assert_eq!(buf[(x, 4)].fg, Color::Red);
}

#[test]
fn tiny_terminal_does_not_panic() {
    let app = session(false);
    for view in View::ALL {
        let mut app = app.clone();
        app.view = view;
        app.help = true;
        for (w, h) in [(1, 1), (10, 5), (40, 12), (80, 24), (300, 100)] {
            render(&app, w, h);
        }
    }
}

/// Metrics of `steps` RL steps in the shape jetd stores them: the three flows
/// of one comparison, each with its own curves (closed forms, no randomness).
fn flow_metrics(flow: &str, steps: u64) -> serde_json::Value {
    let (gain, kl) = match flow {
        "bf16" => (0.010, 0.0),
        "fp8" => (0.011, 0.0),
        _ => (0.004, 8e-4),
    };
    let ms: Vec<serde_json::Value> = (0..steps)
        .map(|s| {
            let x = s as f64;
            let mut m = serde_json::json!({
                "phase": "rl", "step": s, "flow": flow, "branch": 0, "abandoned": false,
                "reward_mean": 0.2 + gain * x + 0.03 * (x * 0.7).sin(),
                "mismatch_kl": kl * (1.0 + 0.5 * (x * 0.3).sin()),
                "entropy": 0.9 - 0.004 * x,
                "response_len_mean": 40.0 + 0.2 * x,
                "step_s": if flow == "bf16" { 1.2 } else { 0.9 } + 0.05 * (x * 0.5).cos(),
            });
            if s % 10 == 0 || s + 1 == steps {
                m["heldout_accuracy"] = serde_json::json!(0.3 + gain * x);
            }
            m
        })
        .collect();
    serde_json::Value::Array(ms)
}

fn comparing() -> App {
    let mut app = session(false);
    app.view = View::Compare;
    for (run, flow) in [
        ("r-0001", "bf16"),
        ("r-0002", "fp8"),
        ("r-0003", "bf16-fp8rollout"),
    ] {
        app.toggle_mark(run);
        app.apply_result(&format!("compare {run}"), Ok(flow_metrics(flow, 40)));
    }
    app.flash = None;
    app
}

#[test]
fn compare_view() {
    both_sizes("compare", &comparing());
}

#[test]
fn runs_view_shows_the_marks() {
    let mut app = comparing();
    app.view = View::Runs;
    insta::assert_snapshot!("runs_marked_80x24", render(&app, 80, 24));
}

#[test]
fn compare_view_before_marks_and_data() {
    let mut app = session(false);
    app.view = View::Compare;
    insta::assert_snapshot!("compare_nothing_marked_80x24", render(&app, 80, 24));
    app.toggle_mark("r-0002");
    app.flash = None;
    // Marked, metrics not fetched yet: the legend says so, the charts wait.
    insta::assert_snapshot!("compare_one_loading_80x24", render(&app, 80, 24));
    for (w, h) in [(1, 1), (10, 5), (40, 12), (300, 100)] {
        render(&comparing(), w, h);
    }
}
