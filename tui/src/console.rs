//! The interactive console: terminal setup (restored on exit and on panic), the
//! link to jetd (reconnects by itself, re-subscribes), and the event loop, which
//! blocks on one channel fed by the input thread and the connection's reader.

use std::collections::HashMap;
use std::io::{stdout, IsTerminal, Stdout};
use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use crossterm::event::Event as TermEvent;
use crossterm::execute;
use crossterm::terminal::{
    disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen,
};
use jet_proto::{Op, Push, Request, Snapshot};
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;

use crate::app::{Action, App, ConnState, Level};
use crate::client::{Conn, Incoming};

/// What the loop waits for.
enum Msg {
    Term(TermEvent),
    /// A line of connection number `gen`.
    /// Boxed: a run record makes a line far larger than a key press.
    Net(u64, Box<Incoming>),
}

const MAX_BACKOFF: Duration = Duration::from_secs(5);

enum Pending {
    Subscribe,
    Action(String),
}

/// The connection to jetd, replaced whenever it drops or the opened run changes.
struct Link {
    path: PathBuf,
    timeout: Duration,
    conn: Option<Conn>,
    gen: u64,
    next_id: u64,
    pending: HashMap<u64, Pending>,
    /// The run the live connection is subscribed to.
    sub: Option<Option<String>>,
    retry_at: Option<Instant>,
    backoff: Duration,
}

impl Link {
    fn connect(&mut self, app: &mut App, tx: &Sender<Msg>) {
        self.gen += 1;
        let gen = self.gen;
        self.pending.clear();
        self.sub = None;
        self.retry_at = None;
        match Conn::open(&self.path, self.timeout, tx.clone(), move |m| {
            Msg::Net(gen, Box::new(m))
        }) {
            Ok(c) => {
                app.conn = ConnState::Connected {
                    server: c.hello.server.clone(),
                };
                self.conn = Some(c);
                self.backoff = Duration::from_secs(1);
                self.subscribe(app);
            }
            Err(e) => self.down(app, e.to_string()),
        }
    }

    fn down(&mut self, app: &mut App, reason: String) {
        self.conn = None;
        self.sub = None;
        self.pending.clear();
        self.retry_at = Some(Instant::now() + self.backoff);
        app.flash = None; // the status line shows why the link is down
        app.conn = ConnState::Reconnecting {
            in_s: self.backoff.as_secs().max(1),
            reason,
        };
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    fn send(&mut self, app: &mut App, op: Op, pending: Pending) {
        let Some(conn) = self.conn.as_mut() else {
            if let Pending::Action(label) = pending {
                app.flash(
                    format!("{label}: not connected to jetd, not sent"),
                    Level::Error,
                );
            }
            return;
        };
        let id = self.next_id;
        self.next_id += 1;
        match conn.send(&Request { id, op }) {
            Ok(()) => {
                self.pending.insert(id, pending);
            }
            Err(e) => self.down(app, e.to_string()),
        }
    }

    fn subscribe(&mut self, app: &mut App) {
        let run = app.subscription();
        self.sub = Some(run.clone());
        // A new subscription may have missed pushes: the compared runs'
        // metrics are asked for again on it.
        app.compare_asked.clear();
        self.send(app, Op::Subscribe { run }, Pending::Subscribe);
    }

    fn on_net(&mut self, app: &mut App, gen: u64, m: Incoming) {
        if gen != self.gen {
            return; // a connection we already left
        }
        match m {
            Incoming::Reply(r) => {
                let result = if r.ok {
                    Ok(r.result.unwrap_or_default())
                } else {
                    Err(r.error.unwrap_or(jet_proto::ErrorBody {
                        code: "internal".into(),
                        message: "failed".into(),
                    }))
                };
                match self.pending.remove(&r.id) {
                    Some(Pending::Subscribe) => {
                        match result.map(serde_json::from_value::<Snapshot>) {
                            Ok(Ok(s)) => app.apply_snapshot(s),
                            Ok(Err(e)) => {
                                app.flash(format!("bad snapshot from jetd: {e}"), Level::Error)
                            }
                            Err(e) => app.flash(format!("subscribe: {}", e.message), Level::Error),
                        }
                    }
                    Some(Pending::Action(label)) => app.apply_result(&label, result),
                    None => {}
                }
            }
            Incoming::Push(Push::Resync { .. }) => self.subscribe(app),
            Incoming::Push(p) => app.apply_push(p),
            Incoming::Bad(_) => {}
            Incoming::Closed(reason) => {
                let why = reason.map_or_else(
                    || "jetd closed the connection".to_string(),
                    |r| format!("connection lost: {r}"),
                );
                self.down(app, why);
            }
        }
    }
}

/// Open the console; returns when the operator quits.
pub fn run(path: PathBuf, readonly: bool, timeout: Duration) -> Result<()> {
    if !stdout().is_terminal() {
        bail!("the console needs a terminal; use a subcommand for scripts (see `jetctl --help`)");
    }
    let mut app = App::new(path.display().to_string(), readonly);
    let mut term = setup().context("cannot set up the terminal")?;
    let (tx, rx) = mpsc::channel();
    let itx = tx.clone();
    std::thread::Builder::new()
        .name("input".into())
        .spawn(move || {
            while let Ok(ev) = crossterm::event::read() {
                if itx.send(Msg::Term(ev)).is_err() {
                    break;
                }
            }
        })?;
    let mut link = Link {
        path,
        // The UI waits for the hello: never long, whatever --timeout says.
        timeout: timeout.min(Duration::from_secs(3)),
        conn: None,
        gen: 0,
        next_id: 1,
        pending: HashMap::new(),
        sub: None,
        retry_at: None,
        backoff: Duration::from_secs(1),
    };
    link.connect(&mut app, &tx);
    let res = event_loop(&mut term, &mut app, &mut link, &tx, &rx);
    restore();
    res
}

fn event_loop(
    term: &mut Terminal<CrosstermBackend<Stdout>>,
    app: &mut App,
    link: &mut Link,
    tx: &Sender<Msg>,
    rx: &mpsc::Receiver<Msg>,
) -> Result<()> {
    let mut dirty = true;
    loop {
        // The opened run changed, or Compare needs every run's pushes:
        // subscribe anew on a fresh connection.
        if link.conn.is_some() && link.sub.as_ref() != Some(&app.subscription()) {
            if let Some(c) = link.conn.take() {
                c.close();
            }
            link.connect(app, tx);
            dirty = true;
        }
        if link.conn.is_some() {
            for (op, label) in app.compare_fetches() {
                link.send(app, op, Pending::Action(label));
            }
        }
        if dirty {
            term.draw(|f| crate::ui::draw(f, app))?;
            dirty = false;
        }
        let wait = link.retry_at.map_or(Duration::from_secs(3600), |t| {
            t.saturating_duration_since(Instant::now())
                .min(Duration::from_secs(1))
        });
        let first = match rx.recv_timeout(wait) {
            Ok(m) => Some(m),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => return Ok(()),
        };
        let batch = first
            .into_iter()
            .chain(std::iter::from_fn(|| rx.try_recv().ok()))
            .take(2000);
        for msg in batch {
            dirty = true;
            match msg {
                Msg::Term(TermEvent::Key(k)) => match app.on_key(k) {
                    Some(Action::Quit) => return Ok(()),
                    Some(Action::Send(op, label)) => link.send(app, op, Pending::Action(label)),
                    None => {}
                },
                Msg::Term(_) => {} // resize and the rest: redraw
                Msg::Net(gen, m) => link.on_net(app, gen, *m),
            }
        }
        if let Some(at) = link.retry_at {
            let left = at.saturating_duration_since(Instant::now());
            if left.is_zero() {
                link.connect(app, tx);
            } else if let ConnState::Reconnecting { in_s, .. } = &mut app.conn {
                *in_s = left.as_secs_f64().ceil() as u64;
            }
            dirty = true;
        }
    }
}

fn setup() -> std::io::Result<Terminal<CrosstermBackend<Stdout>>> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        restore();
        hook(info);
    }));
    enable_raw_mode()?;
    execute!(stdout(), EnterAlternateScreen)?;
    let mut t = Terminal::new(CrosstermBackend::new(stdout()))?;
    t.hide_cursor()?;
    t.clear()?;
    Ok(t)
}

/// Put the terminal back as it was (also from the panic hook).
pub fn restore() {
    let _ = disable_raw_mode();
    let _ = execute!(stdout(), LeaveAlternateScreen, crossterm::cursor::Show);
}
