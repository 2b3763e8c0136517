//! Overlays: the help (`?`) and the rollback confirmation.

use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::style::{Color, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph, Wrap};
use ratatui::Frame;

use crate::app::{App, Dialog};
use crate::keys::HELP;

fn centered(area: Rect, w: u16, h: u16) -> Rect {
    let [r] = Layout::vertical([Constraint::Length(h.min(area.height))])
        .flex(Flex::Center)
        .areas(area);
    let [r] = Layout::horizontal([Constraint::Length(w.min(area.width))])
        .flex(Flex::Center)
        .areas(r);
    r
}

pub fn help(f: &mut Frame, app: &App) {
    let mut lines: Vec<Line> = HELP
        .iter()
        .map(|(k, what, changes)| {
            let style = if *changes && app.readonly {
                Style::new().dim().crossed_out()
            } else {
                Style::new()
            };
            Line::from(vec![
                Span::styled(format!(" {k:<20}"), Style::new().fg(Color::Cyan).bold()),
                Span::styled(*what, style),
            ])
        })
        .collect();
    lines.push(Line::default());
    if app.readonly {
        lines.push(
            Line::from(" read-only (--readonly): keys that change a run are off").fg(Color::Yellow),
        );
    } else {
        lines.push(Line::from(" rollback asks for confirmation first").dim());
    }
    let area = centered(f.area(), 64, lines.len() as u16 + 2);
    f.render_widget(Clear, area);
    let block = Block::bordered()
        .title(" keys ")
        .title_bottom(Line::from(" any key closes ").right_aligned());
    f.render_widget(Paragraph::new(lines).block(block), area);
}

pub fn confirm(f: &mut Frame, d: &Dialog) {
    let Dialog::Rollback { run, step } = d;
    let text = vec![
        Line::from(format!("Roll back {run} to the checkpoint of step {step}?")).bold(),
        Line::default(),
        Line::from("Steps after it are abandoned (kept in the history, greyed out) and the run goes on from there."),
        Line::default(),
        Line::from(vec![
            Span::styled(" y ", Style::new().bold().fg(Color::Black).bg(Color::Red)),
            Span::raw(" roll back    "),
            Span::styled(" n ", Style::new().bold().reversed()),
            Span::raw(" / Esc cancel"),
        ])
        .centered(),
    ];
    let area = centered(f.area(), 60, 9);
    f.render_widget(Clear, area);
    let block = Block::bordered()
        .title(" confirm rollback ")
        .border_style(Style::new().fg(Color::Red));
    f.render_widget(
        Paragraph::new(text).block(block).wrap(Wrap { trim: true }),
        area,
    );
}
