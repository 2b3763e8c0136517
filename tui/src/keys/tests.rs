use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use jet_proto::Op;

use crate::app::{Action, App, Dialog, Level, View};
use crate::replay::replay;

const SESSION: &str = include_str!("../../tests/fixtures/session.jsonl");

fn app(readonly: bool) -> App {
    let mut a = App::new("runs/jetd.sock", readonly);
    a.open_run("r-0003");
    replay(&mut a, SESSION).unwrap();
    a
}

fn key(c: KeyCode) -> KeyEvent {
    KeyEvent::new(c, KeyModifiers::NONE)
}

fn ch(c: char) -> KeyEvent {
    key(KeyCode::Char(c))
}

#[test]
fn quit_keys() {
    let mut a = app(false);
    assert_eq!(a.on_key(ch('q')), Some(Action::Quit));
    assert_eq!(
        a.on_key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)),
        Some(Action::Quit)
    );
    // Ctrl-C quits even from a dialog or while typing a filter; q types into a filter.
    a.view = View::Events;
    a.on_key(ch('/'));
    assert_eq!(a.on_key(ch('q')), None);
    assert_eq!(a.events_filter, "q");
    assert_eq!(
        a.on_key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)),
        Some(Action::Quit)
    );
}

#[test]
fn readonly_blocks_every_change() {
    let mut a = app(true);
    a.view = View::Dashboard;
    assert_eq!(a.on_key(ch(' ')), None);
    assert_eq!(
        a.flash,
        Some((
            "read-only console: pause/resume is disabled".into(),
            Level::Warn
        ))
    );
    assert_eq!(a.on_key(ch('c')), None);
    a.view = View::Checkpoints;
    assert_eq!(a.on_key(ch('b')), None);
    assert_eq!(a.dialog, None);
    // Watching still works.
    assert_eq!(a.on_key(ch('s')), None);
    assert!(a.smoothing);
    assert_eq!(a.on_key(key(KeyCode::Tab)), None);
    assert_eq!(a.view, View::Compare);
    assert_eq!(
        a.on_key(key(KeyCode::Tab)),
        Some(Action::Send(Op::Runs, "refresh".into()))
    );
    assert_eq!(a.view, View::Runs);
}

#[test]
fn space_pauses_a_running_run_and_resumes_a_paused_one() {
    let mut a = app(false);
    a.view = View::Dashboard;
    assert_eq!(
        a.on_key(ch(' ')),
        Some(Action::Send(
            Op::Pause {
                run: "r-0003".into()
            },
            "pause".into()
        ))
    );
    // In Runs, space acts on the selected run: r-0002 is paused.
    a.view = View::Runs;
    a.on_key(key(KeyCode::Down));
    assert_eq!(a.selected_run().unwrap().id, "r-0002");
    assert_eq!(
        a.on_key(ch(' ')),
        Some(Action::Send(
            Op::Resume {
                run: "r-0002".into()
            },
            "resume".into()
        ))
    );
    a.on_key(key(KeyCode::Up));
    assert_eq!(a.on_key(ch(' ')), None, "r-0001 is finished");
    assert_eq!(a.flash.as_ref().unwrap().1, Level::Warn);
}

#[test]
fn checkpoint_key_sends_checkpoint() {
    let mut a = app(false);
    a.view = View::Dashboard;
    assert_eq!(
        a.on_key(ch('c')),
        Some(Action::Send(
            Op::Checkpoint {
                run: "r-0003".into()
            },
            "checkpoint".into()
        ))
    );
}

#[test]
fn rollback_needs_confirmation() {
    let mut a = app(false);
    a.view = View::Dashboard;
    // Outside Checkpoints, b goes there first.
    assert_eq!(a.on_key(ch('b')), None);
    assert_eq!(a.view, View::Checkpoints);
    assert_eq!(a.dialog, None);
    // Newest first: 60, 50, 40, ...
    assert_eq!(a.selected_checkpoint().unwrap().step, 60);
    a.on_key(key(KeyCode::Down));
    a.on_key(key(KeyCode::Down));
    assert_eq!(a.on_key(ch('b')), None, "b alone sends nothing");
    assert_eq!(
        a.dialog,
        Some(Dialog::Rollback {
            run: "r-0003".into(),
            step: 40
        })
    );
    // Other keys are swallowed by the dialog.
    assert_eq!(a.on_key(ch('q')), None);
    assert_eq!(a.dialog, None, "q cancels the dialog, it does not quit");
    a.on_key(ch('b'));
    assert_eq!(a.on_key(ch('x')), None);
    assert!(a.dialog.is_some());
    assert_eq!(a.on_key(ch('n')), None);
    assert_eq!(a.dialog, None);
    a.on_key(ch('b'));
    assert_eq!(
        a.on_key(ch('y')),
        Some(Action::Send(
            Op::Rollback {
                run: "r-0003".into(),
                step: 40
            },
            "rollback".into()
        ))
    );
    assert_eq!(a.dialog, None);
}

#[test]
fn rollback_refuses_a_bad_checkpoint() {
    let mut a = app(false);
    a.view = View::Checkpoints;
    a.on_key(key(KeyCode::Down));
    a.on_key(key(KeyCode::Down));
    a.on_key(key(KeyCode::Down));
    a.on_key(key(KeyCode::Down));
    assert_eq!(a.selected_checkpoint().unwrap().step, 20);
    a.on_key(ch('b'));
    assert_eq!(a.dialog, None);
    assert!(a.flash.as_ref().unwrap().0.contains("is bad"));
}

#[test]
fn views_switch_with_tab_digits_and_esc() {
    let mut a = App::new("s", false);
    replay(
        &mut a,
        SESSION
            .lines()
            .take(2)
            .collect::<Vec<_>>()
            .join("\n")
            .as_str(),
    )
    .unwrap();
    a.run = None;
    assert_eq!(a.view, View::Runs);
    // A run view with nothing opened opens the selected run.
    a.on_key(key(KeyCode::Down));
    a.on_key(key(KeyCode::Down));
    assert_eq!(a.on_key(ch('2')), None);
    assert_eq!(
        (a.view, a.run.as_deref()),
        (View::Dashboard, Some("r-0003"))
    );
    a.on_key(key(KeyCode::Tab));
    assert_eq!(a.view, View::Events);
    a.on_key(key(KeyCode::BackTab));
    assert_eq!(a.view, View::Dashboard);
    a.on_key(ch('4'));
    assert_eq!(a.view, View::Checkpoints);
    assert_eq!(
        a.on_key(key(KeyCode::Esc)),
        Some(Action::Send(Op::Runs, "refresh".into()))
    );
    assert_eq!(a.view, View::Runs);
    // Enter opens the selected run.
    a.on_key(key(KeyCode::Home));
    a.on_key(key(KeyCode::Enter));
    assert_eq!(
        (a.view, a.run.as_deref()),
        (View::Dashboard, Some("r-0001"))
    );
    assert!(
        a.metrics.is_empty(),
        "another run's data is dropped until its snapshot comes"
    );
}

#[test]
fn help_overlay_and_filter() {
    let mut a = app(false);
    a.on_key(ch('?'));
    assert!(a.help);
    assert_eq!(
        a.on_key(ch(' ')),
        None,
        "a key closes help and does nothing else"
    );
    assert!(!a.help);
    a.view = View::Dashboard;
    a.on_key(ch('/'));
    assert_eq!(a.view, View::Events);
    for c in "ALARM".chars() {
        a.on_key(ch(c));
    }
    a.on_key(key(KeyCode::Enter));
    assert!(!a.filter_editing);
    let shown: Vec<u64> = a.visible_events().iter().map(|e| e.seq).collect();
    assert_eq!(
        shown,
        vec![15, 14, 8, 7],
        "alarm.* kinds and alarm levels, newest first"
    );
    a.on_key(key(KeyCode::Esc));
    assert!(a.events_filter.is_empty());
    assert_eq!(a.view, View::Events);
}

#[test]
fn pushes_update_and_rollback_marks_abandoned() {
    let a = app(false);
    let r = a.current_run().unwrap();
    assert_eq!(r.step, 66);
    assert_eq!(a.gpus.as_ref().unwrap()[0].util_pct, 92);
    assert_eq!(a.events.len(), 15);
    // A step of a newer branch abandons the old line from that step on.
    let mut a = a;
    let m = serde_json::json!({"phase":"rl","step":61,"branch":2,"reward_mean":0.7});
    a.apply_push(jet_proto::Push::Metrics {
        run: "r-0003".into(),
        metrics: m,
    });
    let live = crate::series::series(&a.metrics, "reward_mean");
    assert_eq!(live.last().unwrap(), &(61.0, 0.7));
    // Pushes about another run touch only the run table.
    let before = a.metrics.len();
    let m = serde_json::json!({"phase":"rl","step":1,"branch":0});
    a.apply_push(jet_proto::Push::Metrics {
        run: "r-0001".into(),
        metrics: m,
    });
    assert_eq!(a.metrics.len(), before);
}

#[test]
fn marks_choose_the_runs_compare_fetches_and_follows() {
    let mut a = app(false);
    a.view = View::Runs;
    a.runs_sel = 0;
    a.on_key(ch('m'));
    a.runs_sel = 1;
    a.on_key(ch('m'));
    assert_eq!(a.marked, ["r-0001", "r-0002"]);
    // Nothing is fetched outside the Compare view; the opened run is subscribed.
    assert!(a.compare_fetches().is_empty());
    assert_eq!(a.subscription(), Some("r-0003".into()));
    assert_eq!(a.on_key(ch('5')), None);
    assert_eq!(a.view, View::Compare);
    // Comparing subscribes to every run and asks for each marked run's metrics once.
    assert_eq!(a.subscription(), None);
    let f = a.compare_fetches();
    assert_eq!(
        f.iter().map(|(_, l)| l.as_str()).collect::<Vec<_>>(),
        ["compare r-0001", "compare r-0002"]
    );
    assert!(matches!(&f[0].0, Op::Metrics { run, from: None, to: None } if run == "r-0001"));
    assert!(a.compare_fetches().is_empty());
    // The answers, then a live push of a marked run extends its curve.
    let step = |s: u64, r: f64| serde_json::json!({"phase": "rl", "step": s, "reward_mean": r});
    a.apply_result("compare r-0001", Ok(serde_json::json!([step(0, 0.1)])));
    a.apply_push(jet_proto::Push::Metrics {
        run: "r-0001".into(),
        metrics: step(1, 0.2),
    });
    let s = a.compare_sources();
    assert_eq!(s[0].curve("reward_mean"), [(0.0, 0.1), (1.0, 0.2)]);
    assert!(s[1].metrics.is_empty(), "r-0002's answer has not come");
    // m toggles; a fifth mark is refused; M marks the runs of one name.
    a.view = View::Runs;
    a.on_key(ch('m'));
    assert_eq!(a.marked, ["r-0001"]);
    for i in 1..5 {
        a.runs_sel = i;
        a.on_key(ch('m'));
    }
    assert_eq!(a.marked.len(), 4);
    assert_eq!(a.flash.as_ref().map(|f| f.1), Some(Level::Warn));
    a.runs_sel = 3;
    a.on_key(ch('M'));
    assert_eq!(a.marked, ["r-0004"]);
    assert!(a.compared.is_empty(), "data of unmarked runs is dropped");
}
