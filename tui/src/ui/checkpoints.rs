//! Checkpoints of the opened run, newest first, with the metrics at their step and
//! their health; `b` rolls back to the selected one after a confirmation.

use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Color, Style, Stylize};
use ratatui::text::Line;
use ratatui::widgets::{Block, Cell, Row, Table, TableState};
use ratatui::Frame;

use super::placeholder;
use crate::app::App;
use crate::fmt::{bytes, num, opt, short_opt, utc};

pub fn draw(f: &mut Frame, area: Rect, app: &App) {
    let Some(id) = app.run.as_deref() else {
        return placeholder(
            f,
            area,
            " checkpoints ",
            "no run opened: pick one in Runs (1) and press Enter",
        );
    };
    let cks = app.visible_checkpoints();
    let wide = area.width >= 110;
    let rows = cks.iter().map(|c| {
        let m = if c.phase == "rl" {
            app.metrics_at(c.step)
        } else {
            None
        };
        let at = |k: &str| m.and_then(|m| num(m, k));
        let health = if c.health == "ok" {
            Style::new().fg(Color::Green)
        } else {
            Style::new().fg(Color::Red).bold()
        };
        let right = |s: String| Cell::from(Line::from(s).right_aligned());
        let mut cells = vec![
            right(c.step.to_string()),
            Cell::from(c.phase.clone()),
            Cell::from(c.health.clone()).style(health),
            right(opt(c.reward_mean.or(at("reward_mean")), 3)),
            right(opt(c.heldout_accuracy.or(at("heldout_accuracy")), 3)),
            right(short_opt(at("mismatch_kl"))),
            right(opt(at("entropy"), 3)),
        ];
        if wide {
            cells.push(right(opt(at("response_len_mean"), 1)));
            cells.push(right(bytes(c.bytes)));
            cells.push(Cell::from(utc(c.unix_ms)));
            cells.push(Cell::from(c.path.clone()).dim());
        } else {
            cells.push(Cell::from(utc(c.unix_ms)[5..16].to_string()));
        }
        Row::new(cells)
    });
    let mut head = vec![
        "STEP", "PHASE", "HEALTH", "REWARD", "HELDOUT", "MIS_KL", "ENTROPY",
    ];
    let mut widths = vec![
        Constraint::Length(5),
        Constraint::Length(5),
        Constraint::Length(6),
        Constraint::Length(6),
        Constraint::Length(7),
        Constraint::Length(7),
        Constraint::Length(7),
    ];
    if wide {
        head.extend(["RESP_LEN", "SIZE", "WRITTEN (UTC)", "PATH"]);
        widths.extend([
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(19),
            Constraint::Fill(1),
        ]);
    } else {
        head.push("WRITTEN (UTC)");
        widths.push(Constraint::Fill(1));
    }
    let hint = if app.readonly {
        Line::from(" read-only: rollback disabled ").fg(Color::Yellow)
    } else {
        Line::from(" b roll back to the selected checkpoint · c checkpoint now ").dim()
    };
    let block = Block::bordered()
        .title(format!(" checkpoints of {id} ({}) ", cks.len()))
        .title_bottom(hint.right_aligned());
    let t = Table::new(rows, widths)
        .header(Row::new(head).style(Style::new().bold().underlined()))
        .block(block)
        .row_highlight_style(Style::new().bg(Color::DarkGray).bold())
        .highlight_symbol("▶ ");
    let mut state = TableState::default().with_selected((!cks.is_empty()).then_some(app.ckpt_sel));
    f.render_stateful_widget(t, area, &mut state);
}
