//! Compare: the marked runs (2 to 4) overlaid on the same axes: reward,
//! held-out accuracy, mismatch_kl (log), entropy, response length, step time.
//! Each chart's title gives each run's newest value in the run's colour: the
//! `last` numbers of `jetctl compare`.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::chart::{self, Curve};
use super::placeholder;
use crate::app::App;
use crate::compare::{Source, METRICS};
use crate::fmt::{ellipsize, short_opt};
use crate::series::{ema, log10, log_floor, EMA_WEIGHT};

/// One colour per marked run, in marking order.
pub const COLORS: [Color; 4] = [Color::Yellow, Color::Cyan, Color::Magenta, Color::Green];

pub fn draw(f: &mut Frame, area: Rect, app: &App) {
    if app.marked.is_empty() {
        return placeholder(
            f,
            area,
            " compare ",
            "no runs marked: in Runs (1), m marks a run, M the runs of one name",
        );
    }
    let sources = app.compare_sources();
    let [head, body] = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(area);
    legend(f, head, app, &sources);
    let (cols, rows) = if body.width >= 120 { (3, 2) } else { (2, 3) };
    let row_areas = Layout::vertical(vec![Constraint::Ratio(1, rows); rows as usize]).split(body);
    let mut cells = Vec::new();
    for r in row_areas.iter() {
        cells.extend(
            Layout::horizontal(vec![Constraint::Ratio(1, cols); cols as usize])
                .split(*r)
                .iter()
                .copied(),
        );
    }
    for ((key, title, log), cell) in METRICS.iter().zip(cells) {
        metric_chart(f, cell, app, &sources, key, title, *log);
    }
}

/// The marked runs in their colours (and what is still loading).
fn legend(f: &mut Frame, area: Rect, app: &App, sources: &[Source]) {
    let share = (area.width as usize).saturating_sub(2) / sources.len().max(1);
    let mut spans = vec![Span::raw(" ")];
    for (i, s) in sources.iter().enumerate() {
        let loading = if s.metrics.is_empty() {
            " (loading)"
        } else {
            ""
        };
        let text = format!("■ {}{loading}", s.label);
        // Each entry its share of the line, or less when its text is shorter.
        let room = share.min(text.chars().count() + 3);
        spans.push(Span::styled(
            format!("{:<room$}", ellipsize(&text, room.saturating_sub(1))),
            Style::new().fg(COLORS[i % COLORS.len()]).bold(),
        ));
    }
    if sources.len() < 2 {
        spans.push(Span::raw("m marks another run in Runs (1)").dim());
    }
    if app.smoothing {
        spans.push(Span::styled(
            format!("EMA {EMA_WEIGHT}"),
            Style::new().fg(Color::Cyan),
        ));
    }
    f.render_widget(Paragraph::new(Line::from(spans)), area);
}

fn metric_chart(
    f: &mut Frame,
    area: Rect,
    app: &App,
    sources: &[Source],
    key: &str,
    title: &str,
    log: bool,
) {
    let raw: Vec<Vec<(f64, f64)>> = sources.iter().map(|s| s.curve(key)).collect();
    let curves: Vec<Vec<(f64, f64)>> = raw
        .iter()
        .map(|p| {
            if app.smoothing {
                ema(p, EMA_WEIGHT)
            } else {
                p.clone()
            }
        })
        .collect();
    let mut spans = vec![Span::raw(format!(
        " {title}{} ",
        if log { " (log)" } else { "" }
    ))];
    for (i, p) in raw.iter().enumerate() {
        spans.push(Span::styled(
            short_opt(p.last().map(|x| x.1)),
            Style::new().fg(COLORS[i % COLORS.len()]).bold(),
        ));
        spans.push(Span::raw(" "));
    }
    let drawn: Vec<Curve> = if log {
        // Exact zeros (the on-policy flows) sit on a floor three decades
        // under the smallest positive value of any run, as on the dashboard.
        let floor = log_floor(curves.iter().flatten().map(|p| p.1));
        curves
            .iter()
            .enumerate()
            .map(|(i, p)| Curve::line(log10(p, floor), COLORS[i % COLORS.len()]))
            .collect()
    } else {
        curves
            .iter()
            .enumerate()
            .map(|(i, p)| {
                // Evaluations are sparse: dots, so one evaluation still shows.
                if key == "heldout_accuracy" && p.len() < 3 {
                    Curve::dots(p.clone(), COLORS[i % COLORS.len()])
                } else {
                    Curve::line(p.clone(), COLORS[i % COLORS.len()])
                }
            })
            .collect()
    };
    chart::draw(f, area, Line::from(spans), &drawn, log);
}
