//! Keys of the console: what each does to the [`App`] and which request it sends.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use jet_proto::{Op, RunState};

use crate::app::{Action, App, Dialog, Level, View};

/// The help overlay's lines: key, what it does, and whether it changes a run.
pub const HELP: &[(&str, &str, bool)] = &[
    ("q  Ctrl-C", "quit", false),
    ("?", "this help", false),
    ("Tab  1-5", "switch view (Shift-Tab back)", false),
    ("↑ ↓  j k  PgUp PgDn", "move the selection", false),
    ("Enter", "open the selected run (Runs)", false),
    ("m", "mark / unmark the run for Compare (2-4)", false),
    ("M", "mark the runs of its name (its flows)", false),
    ("Esc", "clear the filter, close, back to Runs", false),
    ("/", "filter runs or events (Enter keeps it)", false),
    ("s", "smoothing (EMA) of the curves", false),
    ("r", "refresh the run list", false),
    ("space", "pause / resume the run", true),
    ("c", "write a checkpoint now", true),
    ("b", "roll back to the selected checkpoint", true),
];

/// Views the Tab key cycles through.
const VIEWS: usize = View::ALL.len();

impl App {
    /// Handle one key; returns what the console loop must do.
    pub fn on_key(&mut self, key: KeyEvent) -> Option<Action> {
        if key.kind == KeyEventKind::Release {
            return None;
        }
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl && matches!(key.code, KeyCode::Char('c') | KeyCode::Char('C')) {
            return Some(Action::Quit);
        }
        if self.dialog.is_some() {
            return self.dialog_key(key.code);
        }
        if self.help {
            self.help = false;
            return (key.code == KeyCode::Char('q')).then_some(Action::Quit);
        }
        if self.filter_editing {
            self.filter_key(key.code);
            return None;
        }
        match key.code {
            KeyCode::Char('q') => return Some(Action::Quit),
            KeyCode::Char('?') => self.help = true,
            KeyCode::Tab => return self.switch((self.view.index() + 1) % VIEWS),
            KeyCode::BackTab => return self.switch((self.view.index() + VIEWS - 1) % VIEWS),
            KeyCode::Char(c @ '1'..='5') => return self.switch(c as usize - '1' as usize),
            KeyCode::Up | KeyCode::Char('k') => self.move_sel(-1),
            KeyCode::Down | KeyCode::Char('j') => self.move_sel(1),
            KeyCode::PageUp => self.move_sel(-10),
            KeyCode::PageDown => self.move_sel(10),
            KeyCode::Home | KeyCode::Char('g') => self.move_sel(-1_000_000),
            KeyCode::End | KeyCode::Char('G') => self.move_sel(1_000_000),
            KeyCode::Enter if self.view == View::Runs => {
                if let Some(id) = self.selected_run().map(|r| r.id.clone()) {
                    self.open_run(&id);
                    self.view = View::Dashboard;
                }
            }
            KeyCode::Esc => return self.escape(),
            KeyCode::Char('/') => {
                if !matches!(self.view, View::Runs | View::Events) {
                    self.view = View::Events;
                }
                self.filter_editing = true;
            }
            KeyCode::Char('s') => {
                self.smoothing = !self.smoothing;
                let on = if self.smoothing { "on" } else { "off" };
                self.flash(format!("smoothing (EMA) {on}"), Level::Info);
            }
            KeyCode::Char('r') => return Some(Action::Send(Op::Runs, "refresh".into())),
            KeyCode::Char('m') => self.mark(),
            KeyCode::Char('M') => self.mark_same_name(),
            KeyCode::Char(' ') => return self.pause_resume(),
            KeyCode::Char('c') => return self.checkpoint(),
            KeyCode::Char('b') => self.rollback(),
            _ => {}
        }
        None
    }

    fn dialog_key(&mut self, code: KeyCode) -> Option<Action> {
        match code {
            KeyCode::Char('y') | KeyCode::Char('Y') | KeyCode::Enter => {
                let Some(Dialog::Rollback { run, step }) = self.dialog.take() else {
                    return None;
                };
                self.flash(
                    format!("rollback of {run} to step {step} requested"),
                    Level::Info,
                );
                Some(Action::Send(Op::Rollback { run, step }, "rollback".into()))
            }
            KeyCode::Char('n') | KeyCode::Char('N') | KeyCode::Esc | KeyCode::Char('q') => {
                self.dialog = None;
                self.flash("rollback cancelled", Level::Info);
                None
            }
            _ => None,
        }
    }

    fn filter_key(&mut self, code: KeyCode) {
        let f = if self.view == View::Runs {
            &mut self.runs_filter
        } else {
            &mut self.events_filter
        };
        match code {
            KeyCode::Esc => {
                f.clear();
                self.filter_editing = false;
            }
            KeyCode::Enter => self.filter_editing = false,
            KeyCode::Backspace => {
                f.pop();
            }
            KeyCode::Char(c) => f.push(c),
            _ => {}
        }
        if self.view == View::Runs {
            self.runs_sel = 0;
        } else {
            self.events_sel = 0;
        }
        self.clamp();
    }

    /// Go to view `i`; a run view with no run opened opens the selected one.
    fn switch(&mut self, i: usize) -> Option<Action> {
        let to = View::ALL[i % VIEWS];
        self.filter_editing = false;
        if to == View::Compare {
            if self.marked.len() < 2 {
                self.flash(
                    "mark 2 to 4 runs in Runs (1) with m (M: the runs of one name), then press 5",
                    Level::Info,
                );
            }
            self.view = to;
            return None;
        }
        if to != View::Runs && self.run.is_none() {
            match self.selected_run().map(|r| r.id.clone()) {
                Some(id) => self.open_run(&id),
                None => self.flash(
                    "no run to show yet: submit one with `jetctl submit CONFIG`",
                    Level::Warn,
                ),
            }
        }
        let refresh = to == View::Runs && self.view != View::Runs && self.run.is_some();
        self.view = to;
        refresh.then(|| Action::Send(Op::Runs, "refresh".into()))
    }

    fn escape(&mut self) -> Option<Action> {
        self.flash = None;
        match self.view {
            View::Runs if !self.runs_filter.is_empty() => self.runs_filter.clear(),
            View::Events if !self.events_filter.is_empty() => self.events_filter.clear(),
            View::Runs => {}
            _ => return self.switch(0),
        }
        self.clamp();
        None
    }

    fn move_sel(&mut self, d: i64) {
        let sel = match self.view {
            View::Runs => &mut self.runs_sel,
            View::Events => &mut self.events_sel,
            View::Checkpoints => &mut self.ckpt_sel,
            View::Dashboard | View::Compare => return,
        };
        *sel = (*sel as i64 + d).max(0) as usize;
        self.clamp();
    }

    /// m: mark the selected run (Runs) or the opened one for Compare.
    fn mark(&mut self) {
        match self.target() {
            Some((run, _)) => self.toggle_mark(&run),
            None => self.flash("no run to mark", Level::Warn),
        }
    }

    /// M: mark the runs that have the selected run's name (the flows of one
    /// comparison share it), replacing the marks; at most four.
    fn mark_same_name(&mut self) {
        let Some(name) = self.selected_run().map(|r| r.name.clone()) else {
            return self.flash("no run to mark", Level::Warn);
        };
        let same: Vec<String> = self
            .runs
            .iter()
            .filter(|r| r.name == name)
            .map(|r| r.id.clone())
            .take(crate::app::MAX_MARKED)
            .collect();
        self.marked = same;
        self.compared.retain(|(r, _)| self.marked.contains(r));
        self.compare_asked.retain(|r| self.marked.contains(r));
        let msg = format!(
            "marked {} run(s) named {name}: {}; 5 compares them",
            self.marked.len(),
            self.marked.join(" ")
        );
        self.flash(msg, Level::Info);
    }

    /// The run a key acts on: the selected one in Runs, else the opened one.
    fn target(&self) -> Option<(String, RunState)> {
        let r = if self.view == View::Runs {
            self.selected_run()
        } else {
            self.current_run()
        };
        r.map(|r| (r.id.clone(), r.state))
    }

    fn blocked(&mut self, what: &str) -> bool {
        if self.readonly {
            self.flash(
                format!("read-only console: {what} is disabled"),
                Level::Warn,
            );
        }
        self.readonly
    }

    fn pause_resume(&mut self) -> Option<Action> {
        if self.blocked("pause/resume") {
            return None;
        }
        let Some((run, state)) = self.target() else {
            self.flash("no run selected", Level::Warn);
            return None;
        };
        match state {
            RunState::Paused => Some(Action::Send(Op::Resume { run }, "resume".into())),
            RunState::Running | RunState::Queued => {
                Some(Action::Send(Op::Pause { run }, "pause".into()))
            }
            s => {
                self.flash(
                    format!("{run} is {}: nothing to pause or resume", s.name()),
                    Level::Warn,
                );
                None
            }
        }
    }

    fn checkpoint(&mut self) -> Option<Action> {
        if self.blocked("checkpoint") {
            return None;
        }
        let Some((run, _)) = self.target() else {
            self.flash("no run selected", Level::Warn);
            return None;
        };
        self.flash(format!("checkpoint of {run} requested"), Level::Info);
        Some(Action::Send(Op::Checkpoint { run }, "checkpoint".into()))
    }

    fn rollback(&mut self) {
        if self.blocked("rollback") {
            return;
        }
        if self.view != View::Checkpoints {
            self.switch(3);
            self.flash(
                "pick a checkpoint, then press b to roll back to it",
                Level::Info,
            );
            return;
        }
        let Some(run) = self.run.clone() else { return };
        match self.selected_checkpoint() {
            None => self.flash("no checkpoint to roll back to", Level::Warn),
            Some(c) if c.health != "ok" => {
                let msg = format!(
                    "the checkpoint at step {} is {}: pick another",
                    c.step, c.health
                );
                self.flash(msg, Level::Warn)
            }
            Some(c) => self.dialog = Some(Dialog::Rollback { run, step: c.step }),
        }
    }
}

#[cfg(test)]
mod tests;
