//! Runs: every run with state, flow, step, reward and last alarm; details of the
//! selected one below. Enter opens it.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Cell, Paragraph, Row, Table, TableState, Wrap};
use ratatui::Frame;

use super::{filter_line, state_style};
use crate::app::App;
use crate::fmt::{device, opt, utc};
use crate::output::progress;

pub fn draw(f: &mut Frame, area: Rect, app: &App) {
    // The table as tall as its rows; then the details; then, when there is room for
    // every run, their progress bars.
    let n = app.visible_runs().len() as u16;
    let [table_area, rest] =
        Layout::vertical([Constraint::Max((n + 4).max(6)), Constraint::Min(8)]).areas(area);
    if rest.height >= 8 + n + 2 && n > 0 {
        let [details, bars] =
            Layout::vertical([Constraint::Length(8), Constraint::Min(0)]).areas(rest);
        detail(f, details, app);
        progress_bars(f, bars, app);
    } else {
        detail(f, rest, app);
    }
    table(f, table_area, app);
}

/// One bar per run: RL steps done of planned (the SFT warm-up while it runs).
fn progress_bars(f: &mut Frame, area: Rect, app: &App) {
    let block = Block::bordered().title(" progress ");
    let inner = block.inner(area);
    f.render_widget(block, area);
    let bar_w = (inner.width as usize).saturating_sub(40).max(4);
    let lines: Vec<Line> = app
        .visible_runs()
        .iter()
        .map(|r| {
            let (done, all) = if r.step == 0 && r.sft_step < r.sft_steps {
                (r.sft_step, r.sft_steps)
            } else {
                (r.step, r.steps)
            };
            let frac = if all == 0 {
                0.0
            } else {
                (done as f64 / all as f64).min(1.0)
            };
            let full = (frac * bar_w as f64).round() as usize;
            Line::from(vec![
                Span::raw(format!("{:<8}", crate::fmt::ellipsize(&r.id, 8))),
                Span::styled("█".repeat(full), state_style(r.state)),
                Span::styled("░".repeat(bar_w - full), Style::new().dim()),
                Span::raw(format!(" {:>4.0}% {:>9} ", frac * 100.0, progress(r))),
                Span::styled(r.state.name(), state_style(r.state)),
            ])
        })
        .collect();
    f.render_widget(Paragraph::new(lines), inner);
}

fn table(f: &mut Frame, area: Rect, app: &App) {
    let runs = app.visible_runs();
    let wide = area.width >= 110;
    let mut head = vec!["ID", "NAME", "STATE", "FLOW", "DEVICE", "STEP", "REWARD"];
    let mut widths = vec![
        Constraint::Length(8),
        Constraint::Fill(1),
        Constraint::Length(8),
        Constraint::Length(15),
        Constraint::Length(6),
        Constraint::Length(9),
        Constraint::Length(6),
    ];
    if wide {
        head.extend(["HELDOUT", "CREATED (UTC)"]);
        widths.extend([Constraint::Length(7), Constraint::Length(16)]);
    }
    head.push("LAST ALARM");
    widths.push(Constraint::Fill(1));
    let rows = runs.iter().map(|r| {
        let opened = app.run.as_deref() == Some(r.id.as_str());
        // A run marked for Compare: a dot in its Compare colour.
        let mark = app.marked.iter().position(|m| *m == r.id);
        let id = Line::from(vec![
            Span::raw(format!("{}{}", r.id, if opened { "*" } else { "" })),
            match mark {
                Some(i) => Span::styled(
                    "●",
                    Style::new().fg(super::compare::COLORS[i % super::compare::COLORS.len()]),
                ),
                None => Span::raw(""),
            },
        ]);
        let mut cells = vec![
            Cell::from(id),
            Cell::from(r.name.clone()),
            Cell::from(r.state.name()).style(state_style(r.state)),
            Cell::from(r.flow.clone()),
            Cell::from(device(r)),
            Cell::from(Line::from(progress(r)).right_aligned()),
            Cell::from(Line::from(opt(r.reward_mean, 3)).right_aligned()),
        ];
        if wide {
            cells.push(Cell::from(
                Line::from(opt(r.heldout_accuracy, 3)).right_aligned(),
            ));
            cells.push(Cell::from(utc(r.created_unix * 1000)[..16].to_string()));
        }
        let alarm = r.last_alarm.clone().unwrap_or_default();
        cells.push(Cell::from(alarm).style(Style::new().fg(Color::Red)));
        Row::new(cells)
    });
    let title = format!(" runs ({}) ", runs.len());
    let mut block = Block::bordered()
        .title(title)
        .title_bottom(filter_line(app, &app.runs_filter));
    let connected = matches!(app.conn, crate::app::ConnState::Connected { .. });
    if runs.is_empty() && !connected {
        block = block.title_bottom(Line::from(" waiting for jetd ").dim());
    } else if runs.is_empty() {
        block = block
            .title_bottom(Line::from(" no runs: submit one with `jetctl submit CONFIG` ").dim());
    } else if !app.filter_editing && app.runs_filter.is_empty() {
        block = block.title_bottom(
            Line::from(" Enter open · m mark · 5 compare · / filter ")
                .dim()
                .right_aligned(),
        );
    }
    let t = Table::new(rows, widths)
        .header(Row::new(head).style(Style::new().bold().underlined()))
        .block(block)
        .column_spacing(1)
        .row_highlight_style(Style::new().bg(Color::DarkGray).bold())
        .highlight_symbol("▶");
    let mut state = TableState::default().with_selected((!runs.is_empty()).then_some(app.runs_sel));
    f.render_stateful_widget(t, area, &mut state);
}

fn detail(f: &mut Frame, area: Rect, app: &App) {
    let block = Block::bordered().title(" selected run ");
    let Some(r) = app.selected_run() else {
        f.render_widget(block, area);
        return;
    };
    let key = |k: &str| Span::styled(format!("{k:<9}"), Style::new().dim());
    let mut lines = vec![
        Line::from(vec![
            key("run"),
            Span::raw(format!("{}  {}", r.id, r.name)).bold(),
        ]),
        Line::from(vec![
            key("state"),
            Span::styled(r.state.name(), state_style(r.state)),
            Span::raw(format!(
                "  flow {}  on {}  created {} UTC",
                r.flow,
                device(r),
                &utc(r.created_unix * 1000)[..16]
            )),
        ]),
        Line::from(vec![
            key("progress"),
            Span::raw(format!(
                "RL {}/{}  SFT {}/{}",
                r.step, r.steps, r.sft_step, r.sft_steps
            )),
        ]),
        Line::from(vec![
            key("reward"),
            Span::raw(format!(
                "{}  held-out {}  mismatch_kl alarm {}",
                opt(r.reward_mean, 4),
                opt(r.heldout_accuracy, 4),
                r.mismatch_kl_alarm
            )),
        ]),
    ];
    if let Some(a) = &r.last_alarm {
        lines.push(Line::from(vec![
            key("alarm"),
            Span::styled(a.clone(), Style::new().fg(Color::Red)),
        ]));
    }
    if let Some(m) = &r.message {
        lines.push(Line::from(vec![key("message"), Span::raw(m.clone())]));
    }
    f.render_widget(
        Paragraph::new(lines)
            .block(block)
            .wrap(Wrap { trim: false }),
        area,
    );
}
