//! Drawing: one function from [`App`] to a frame. Each view is its own module.

mod chart;
mod checkpoints;
mod compare;
mod dashboard;
mod events;
mod overlay;
mod runs;

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use crate::app::{App, ConnState, Level, View};

/// Draw the whole console.
pub fn draw(f: &mut Frame, app: &App) {
    let [top, body, status] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(f.area());
    tabs(f, top, app);
    match app.view {
        View::Runs => runs::draw(f, body, app),
        View::Dashboard => dashboard::draw(f, body, app),
        View::Events => events::draw(f, body, app),
        View::Checkpoints => checkpoints::draw(f, body, app),
        View::Compare => compare::draw(f, body, app),
    }
    status_line(f, status, app);
    if app.help {
        overlay::help(f, app);
    }
    if let Some(d) = &app.dialog {
        overlay::confirm(f, d);
    }
}

fn tabs(f: &mut Frame, area: Rect, app: &App) {
    let mut spans = vec![
        Span::styled(" jetctl ", Style::new().bold().reversed()),
        Span::raw(" "),
    ];
    for v in View::ALL {
        let label = format!(" {} {} ", v.index() + 1, v.title());
        let style = if v == app.view {
            Style::new().bold().fg(Color::Black).bg(Color::Cyan)
        } else {
            Style::new()
        };
        spans.push(Span::styled(label, style));
    }
    let left = Line::from(spans);
    let right = match app.current_run() {
        Some(r) => format!("{} {} ", r.id, r.name),
        None => app
            .run
            .clone()
            .map(|id| format!("{id} "))
            .unwrap_or_default(),
    };
    let w = (right.chars().count() as u16).min(area.width.saturating_sub(left.width() as u16));
    let [l, r] = Layout::horizontal([Constraint::Min(0), Constraint::Length(w)]).areas(area);
    f.render_widget(Paragraph::new(left), l);
    f.render_widget(
        Paragraph::new(crate::fmt::ellipsize(&right, w as usize)).bold(),
        r,
    );
}

fn status_line(f: &mut Frame, area: Rect, app: &App) {
    let conn = match &app.conn {
        ConnState::Connecting => Span::styled("◌ connecting", Style::new().fg(Color::Yellow)),
        ConnState::Connected { server } => {
            Span::styled(format!("● {server}"), Style::new().fg(Color::Green))
        }
        ConnState::Reconnecting { in_s, .. } => Span::styled(
            format!("○ reconnecting in {in_s} s"),
            Style::new().fg(Color::Red).bold(),
        ),
    };
    let mut spans = vec![Span::raw(" "), conn, Span::raw("  ")];
    match (&app.flash, &app.conn) {
        (Some((msg, level)), _) => spans.push(Span::styled(msg.clone(), level_style(*level))),
        (None, ConnState::Reconnecting { reason, .. }) => {
            spans.push(Span::styled(reason.clone(), Style::new().dim()))
        }
        _ if app.filter_editing => {
            spans.push(Span::raw("typing a filter: Enter keeps it, Esc clears it"))
        }
        _ => {}
    }
    let hint = if app.readonly {
        " read-only · ? help "
    } else {
        " ? help "
    };
    let [l, r] = Layout::horizontal([
        Constraint::Min(0),
        Constraint::Length(hint.chars().count() as u16),
    ])
    .areas(area);
    f.render_widget(
        Paragraph::new(Line::from(spans)).style(Style::new().bg(Color::Black)),
        l,
    );
    let hint_style = if app.readonly {
        Style::new().fg(Color::Yellow)
    } else {
        Style::new().dim()
    };
    f.render_widget(Paragraph::new(hint).style(hint_style.bg(Color::Black)), r);
}

pub(crate) fn level_style(level: Level) -> Style {
    match level {
        Level::Info => Style::new().fg(Color::Cyan),
        Level::Warn => Style::new().fg(Color::Yellow),
        Level::Error => Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
    }
}

/// Style of an event level (`info`, `warn`, `alarm`).
pub(crate) fn event_style(level: &str) -> Style {
    match level {
        "alarm" | "error" => Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        "warn" => Style::new().fg(Color::Yellow),
        _ => Style::new(),
    }
}

/// Style of a run state.
pub(crate) fn state_style(state: jet_proto::RunState) -> Style {
    use jet_proto::RunState::*;
    match state {
        Running => Style::new().fg(Color::Green),
        Paused | Queued => Style::new().fg(Color::Yellow),
        Failed => Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        Stopped | Finished => Style::new().fg(Color::Gray),
    }
}

/// A message in the middle of an empty view.
pub(crate) fn placeholder(f: &mut Frame, area: Rect, title: &str, msg: &str) {
    let block = ratatui::widgets::Block::bordered().title(title.to_string());
    let inner = block.inner(area);
    f.render_widget(block, area);
    let y = inner.y + inner.height / 2;
    let line = Rect {
        y,
        height: 1.min(inner.height),
        ..inner
    };
    f.render_widget(Paragraph::new(msg.to_string()).centered().dim(), line);
}

/// The hint line under a table: the filter, or what the keys do.
pub(crate) fn filter_line(app: &App, filter: &str) -> Line<'static> {
    if app.filter_editing {
        Line::from(vec![
            Span::styled(" / ", Style::new().reversed()),
            Span::raw(format!("{filter}▏")),
        ])
    } else if !filter.is_empty() {
        Line::from(vec![
            Span::styled(" filter: ", Style::new().dim()),
            Span::raw(format!("{filter} ")),
        ])
    } else {
        Line::default()
    }
}
