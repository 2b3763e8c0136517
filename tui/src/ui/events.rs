//! Events of the opened run, newest first; alarms highlighted; `/` filters.

use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Color, Style, Stylize};
use ratatui::text::Line;
use ratatui::widgets::{Block, Cell, Row, Table, TableState};
use ratatui::Frame;

use super::{event_style, filter_line, placeholder};
use crate::app::App;
use crate::fmt::{utc, utc_time};

pub fn draw(f: &mut Frame, area: Rect, app: &App) {
    let Some(id) = app.run.as_deref() else {
        return placeholder(
            f,
            area,
            " events ",
            "no run opened: pick one in Runs (1) and press Enter",
        );
    };
    let evs = app.visible_events();
    let wide = area.width >= 110;
    let rows = evs.iter().map(|e| {
        let time = if wide {
            utc(e.unix_ms)
        } else {
            utc_time(e.unix_ms)
        };
        let style = event_style(&e.level);
        Row::new(vec![
            Cell::from(Line::from(e.seq.to_string()).right_aligned()).dim(),
            Cell::from(time),
            Cell::from(e.level.clone()).style(style),
            Cell::from(e.kind.clone()).style(style),
            Cell::from(
                Line::from(e.step.map_or_else(String::new, |s| s.to_string())).right_aligned(),
            ),
            Cell::from(e.message.clone()).style(style),
        ])
    });
    let widths = [
        Constraint::Length(4),
        Constraint::Length(if wide { 19 } else { 8 }),
        Constraint::Length(5),
        Constraint::Length(if wide { 16 } else { 14 }),
        Constraint::Length(4),
        Constraint::Fill(1),
    ];
    let count = if app.events_filter.is_empty() {
        format!("{}", evs.len())
    } else {
        format!("{} of {}", evs.len(), app.events.len())
    };
    let mut block = Block::bordered()
        .title(format!(" events of {id} ({count}) "))
        .title_bottom(filter_line(app, &app.events_filter));
    if !app.filter_editing && app.events_filter.is_empty() {
        block = block.title_bottom(
            Line::from(" / filter · times in UTC ")
                .dim()
                .right_aligned(),
        );
    }
    let head = Row::new(["SEQ", "TIME", "LEVEL", "KIND", "STEP", "MESSAGE"])
        .style(Style::new().bold().underlined());
    let t = Table::new(rows, widths)
        .header(head)
        .block(block)
        .row_highlight_style(Style::new().bg(Color::DarkGray))
        .highlight_symbol("▶");
    let mut state =
        TableState::default().with_selected((!evs.is_empty()).then_some(app.events_sel));
    f.render_stateful_widget(t, area, &mut state);
}
