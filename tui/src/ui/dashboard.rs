//! Dashboard of the opened run: reward with held-out accuracy, mismatch_kl (log)
//! against its alarm, entropy, response length; phase timing per step; GPUs; alarms.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};
use ratatui::Frame;

use super::chart::{self, Curve};
use super::{event_style, placeholder, state_style};
use crate::app::App;
use crate::fmt::{ellipsize, num, opt, short, short_opt};
use crate::series::{abandoned, ema, log10, log_floor, series, EMA_WEIGHT};

pub fn draw(f: &mut Frame, area: Rect, app: &App) {
    let Some(id) = app.run.as_deref() else {
        return placeholder(
            f,
            area,
            " dashboard ",
            "no run opened: pick one in Runs (1) and press Enter",
        );
    };
    let [head, body] = Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(area);
    header(f, head, app, id);
    let wide = body.width >= 120 && body.height >= 30;
    let (charts, side) = if wide {
        let [c, s] = Layout::horizontal([Constraint::Percentage(68), Constraint::Percentage(32)])
            .areas(body);
        (c, s)
    } else {
        let [c, s] =
            Layout::vertical([Constraint::Percentage(65), Constraint::Percentage(35)]).areas(body);
        (c, s)
    };
    draw_charts(f, charts, app);
    let gpu_h = gpu_height(app, wide);
    if wide {
        let [t, g, a] = Layout::vertical([
            Constraint::Min(8),
            Constraint::Length(gpu_h),
            Constraint::Length(10),
        ])
        .areas(side);
        timing(f, t, app);
        gpus(f, g, app, true);
        alarms(f, a, app);
    } else {
        let [t, right] =
            Layout::horizontal([Constraint::Percentage(55), Constraint::Percentage(45)])
                .areas(side);
        let [g, a] = Layout::vertical([Constraint::Length(gpu_h), Constraint::Min(0)]).areas(right);
        timing(f, t, app);
        gpus(f, g, app, false);
        alarms(f, a, app);
    }
}

fn header(f: &mut Frame, area: Rect, app: &App, id: &str) {
    let Some(r) = app.current_run() else {
        f.render_widget(
            Paragraph::new(format!(" {id}: waiting for the snapshot")).dim(),
            area,
        );
        return;
    };
    let mut spans = vec![
        Span::raw(" "),
        Span::styled(
            r.state.name(),
            state_style(r.state).add_modifier(Modifier::BOLD),
        ),
        Span::raw(format!("  {}", r.flow)),
    ];
    // Where it computes, when the line has room for it (80 columns do not).
    if area.width >= 100 {
        spans.push(Span::raw(format!(" on {}", crate::fmt::device(r))));
    }
    spans.push(Span::raw(format!("  step {}/{}", r.step, r.steps)));
    if r.sft_steps > 0 {
        spans.push(Span::raw(format!("  sft {}/{}", r.sft_step, r.sft_steps)).dim());
    }
    spans.push(Span::raw(format!(
        "  reward {}  held-out {}",
        opt(r.reward_mean, 3),
        opt(r.heldout_accuracy, 3)
    )));
    if app.smoothing {
        spans.push(Span::styled(
            format!("  EMA {EMA_WEIGHT}"),
            Style::new().fg(Color::Cyan),
        ));
    }
    f.render_widget(Paragraph::new(Line::from(spans)), area);
}

fn smooth(app: &App, p: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    if app.smoothing {
        ema(&p, EMA_WEIGHT)
    } else {
        p
    }
}

fn last(p: &[(f64, f64)]) -> Option<f64> {
    p.last().map(|x| x.1)
}

fn draw_charts(f: &mut Frame, area: Rect, app: &App) {
    let [top, bottom] =
        Layout::vertical([Constraint::Ratio(1, 2), Constraint::Ratio(1, 2)]).areas(area);
    let [a, b] = Layout::horizontal([Constraint::Ratio(1, 2), Constraint::Ratio(1, 2)]).areas(top);
    let [c, d] =
        Layout::horizontal([Constraint::Ratio(1, 2), Constraint::Ratio(1, 2)]).areas(bottom);
    let ms = &app.metrics;

    let reward = smooth(app, series(ms, "reward_mean"));
    let held = smooth(app, series(ms, "heldout_accuracy"));
    let gone = abandoned(ms, "reward_mean");
    let mut title = vec![
        Span::raw(" reward "),
        Span::styled(opt(last(&reward), 3), Style::new().fg(Color::Yellow).bold()),
        Span::raw(" held-out "),
        Span::styled(opt(last(&held), 3), Style::new().fg(Color::Cyan).bold()),
    ];
    if !gone.is_empty() && a.width >= 44 {
        title.push(Span::styled(" abandoned", Style::new().fg(Color::DarkGray)));
    }
    title.push(Span::raw(" "));
    let curves = [
        Curve::dots(gone, Color::DarkGray),
        Curve::line(reward, Color::Yellow),
        Curve::line(held, Color::Cyan),
    ];
    chart::draw(f, a, Line::from(title), &curves, false);

    kl_chart(f, b, app);

    let ent = smooth(app, series(ms, "entropy"));
    let title = Line::from(vec![
        Span::raw(" entropy "),
        Span::styled(short_opt(last(&ent)), Style::new().fg(Color::Green).bold()),
        Span::raw(" "),
    ]);
    chart::draw(f, c, title, &[Curve::line(ent, Color::Green)], false);

    let len = smooth(app, series(ms, "response_len_mean"));
    let title = Line::from(vec![
        Span::raw(" response length "),
        Span::styled(short_opt(last(&len)), Style::new().fg(Color::Blue).bold()),
        Span::raw(" "),
    ]);
    chart::draw(f, d, title, &[Curve::line(len, Color::Blue)], false);
}

fn kl_chart(f: &mut Frame, area: Rect, app: &App) {
    let alarm = app.current_run().map_or(0.0, |r| r.mismatch_kl_alarm);
    let raw = series(&app.metrics, "mismatch_kl");
    let kl = smooth(app, raw.clone());
    let now = last(&raw);
    let over = alarm > 0.0 && now.is_some_and(|v| v > alarm);
    // Zeros (exactly on-policy) sit on a floor three decades under the smallest value.
    let floor = log_floor(kl.iter().map(|p| p.1).chain([alarm]));
    let mut curves = vec![];
    if alarm > 0.0 && !kl.is_empty() {
        let (x0, x1) = crate::series::x_range(&[&kl]);
        curves.push(Curve::line(
            vec![(x0, alarm.log10()), (x1, alarm.log10())],
            Color::Red,
        ));
    }
    curves.push(Curve::line(log10(&kl, floor), Color::Magenta));
    let value_style = if over {
        Style::new().fg(Color::Red).bold()
    } else {
        Style::new().fg(Color::Magenta).bold()
    };
    let title = Line::from(vec![
        Span::raw(" mismatch_kl "),
        Span::styled(short_opt(now), value_style),
        Span::raw(" alarm "),
        Span::styled(short(alarm), Style::new().fg(Color::Red)),
        Span::raw(" (log) "),
    ]);
    chart::draw(f, area, title, &curves, true);
}

/// Phase time of the newest steps: rollout █, train ▓, other ░, to one scale.
fn timing(f: &mut Frame, area: Rect, app: &App) {
    let block = Block::bordered().title(" phase time per step ");
    let inner = block.inner(area);
    f.render_widget(block, area);
    let steps: Vec<&serde_json::Value> = app
        .metrics
        .iter()
        .filter(|m| {
            crate::fmt::is_rl(m) && !crate::fmt::is_abandoned(m) && num(m, "step_s").is_some()
        })
        .collect();
    let Some(lastm) = steps.last() else {
        f.render_widget(Paragraph::new("no steps yet").dim(), inner);
        return;
    };
    let (roll, train, step_s) = (
        num(lastm, "rollout_s"),
        num(lastm, "train_s"),
        num(lastm, "step_s"),
    );
    let other = match (roll, train, step_s) {
        (Some(r), Some(t), Some(s)) => Some((s - r - t).max(0.0)),
        _ => None,
    };
    let tps = |k| num(lastm, k).map_or_else(|| "-".into(), |x| format!("{} tok/s", short(x)));
    let secs = |x: Option<f64>| x.map_or_else(|| "-".into(), |x| format!("{x:.2}s"));
    let mut lines = vec![
        Line::from(vec![
            Span::styled("█ rollout ", Style::new().fg(Color::Cyan)),
            Span::raw(format!("{} {}", secs(roll), tps("rollout_tokens_per_s"))),
        ]),
        Line::from(vec![
            Span::styled("▓ train ", Style::new().fg(Color::Magenta)),
            Span::raw(format!("{} {}  ", secs(train), tps("train_tokens_per_s"))),
            Span::styled("░ other ", Style::new().fg(Color::Gray)),
            Span::raw(secs(other)),
        ]),
    ];
    lines.extend(kv_line(lastm));
    let rows = (inner.height as usize).saturating_sub(lines.len());
    let shown = &steps[steps.len().saturating_sub(rows)..];
    let max = shown
        .iter()
        .filter_map(|m| num(m, "step_s"))
        .fold(0.0, f64::max)
        .max(1e-9);
    let bar_w = (inner.width as usize).saturating_sub(12);
    for m in shown {
        let s = num(m, "step_s").unwrap_or(0.0);
        let r = num(m, "rollout_s").unwrap_or(0.0).min(s);
        let t = num(m, "train_s").unwrap_or(0.0).min(s - r);
        let cells = |x: f64| ((x / max) * bar_w as f64).round() as usize;
        let (cr, ct) = (cells(r), cells(t));
        let co = cells(s).saturating_sub(cr + ct);
        lines.push(Line::from(vec![
            Span::raw(format!("{:>4} ", crate::fmt::step_of(m).unwrap_or(0))).dim(),
            Span::styled("█".repeat(cr), Style::new().fg(Color::Cyan)),
            Span::styled("▓".repeat(ct), Style::new().fg(Color::Magenta)),
            Span::styled("░".repeat(co), Style::new().fg(Color::Gray)),
            Span::raw(format!(" {s:.2}s")),
        ]));
    }
    f.render_widget(Paragraph::new(lines), inner);
}

/// The rollout's KV cache (GPU runs): GiB of pages at peak over the pool, and
/// the sequences preempted for want of a page (yellow: a larger
/// `rollout.kv_cache_gib` would speed the rollout).
fn kv_line(m: &serde_json::Value) -> Option<Line<'static>> {
    let (peak, pool) = (num(m, "kv_peak_gib")?, num(m, "kv_pool_gib")?);
    let mut spans = vec![Span::raw(format!("  KV {peak:.1}/{pool:.1} GiB"))];
    match num(m, "rollout_preemptions") {
        Some(n) if n > 0.0 => spans.push(Span::styled(
            format!("  {n:.0} preempted"),
            Style::new().fg(Color::Yellow),
        )),
        _ => spans.push(Span::raw("  none preempted").dim()),
    }
    Some(Line::from(spans))
}

fn gpu_height(app: &App, wide: bool) -> u16 {
    let n = app.gpus.as_ref().map_or(1, |g| g.len().max(1)) as u16;
    2 + if wide { 2 * n } else { n }
}

fn gpus(f: &mut Frame, area: Rect, app: &App, wide: bool) {
    let block = Block::bordered().title(" GPU ");
    let inner = block.inner(area);
    f.render_widget(block, area);
    let Some(gs) = app.gpus.as_ref().filter(|g| !g.is_empty()) else {
        f.render_widget(Paragraph::new("no GPU").dim(), inner);
        return;
    };
    let hot = |p: u32| if p >= 85 { Color::Red } else { Color::Reset };
    // Every line drops the power or none does, so the columns stay aligned.
    let run_w = gs
        .iter()
        .map(|g| g.run.as_deref().map_or(4, str::len))
        .max()
        .unwrap_or(0);
    let mut lines = vec![];
    for g in gs {
        let mem_pct = (g.mem_used_mib * 100)
            .checked_div(g.mem_total_mib)
            .unwrap_or(0);
        // NVML numbers the GPUs as nvidia-smi does; jetd's (CUDA's) number, when
        // it differs, follows in parentheses. Then the run computing on it.
        let label = match g.ordinal {
            Some(o) if o != g.index => format!("{} (cuda {o})", g.index),
            _ => g.index.to_string(),
        };
        let run = g.run.as_deref().unwrap_or("idle");
        if wide {
            let room = (inner.width as usize).saturating_sub(label.len() + run.len() + 3);
            lines.push(Line::from(vec![
                Span::raw(format!("{label} {} ", ellipsize(&g.name, room))).bold(),
                Span::styled(run.to_string(), run_style(g.run.is_some())),
            ]));
            lines.push(Line::from(format!(
                "  util {:>3}%  mem {:.1}/{:.1} GiB  {:.0} W  {}°C",
                g.util_pct,
                g.mem_used_mib as f64 / 1024.0,
                g.mem_total_mib as f64 / 1024.0,
                g.power_w,
                g.temp_c
            )));
        } else {
            // The power goes first when the line is too narrow for the run.
            let head = format!("{label} util {:>3}% mem {:>2}% ", g.util_pct, mem_pct);
            let power = format!("{:.0}W ", g.power_w);
            let temp = format!("{}°C ", g.temp_c);
            let fits =
                head.len() + power.len() + temp.chars().count() + run_w <= inner.width as usize;
            lines.push(Line::from(vec![
                Span::raw(head),
                Span::raw(if fits { power } else { String::new() }),
                Span::styled(temp, Style::new().fg(hot(g.temp_c))),
                Span::styled(run.to_string(), run_style(g.run.is_some())),
            ]));
        }
    }
    f.render_widget(Paragraph::new(lines), inner);
}

fn run_style(busy: bool) -> Style {
    if busy {
        Style::new().fg(Color::Green)
    } else {
        Style::new().dim()
    }
}

/// Latest alarms and warnings, newest first.
fn alarms(f: &mut Frame, area: Rect, app: &App) {
    let block = Block::bordered().title(" latest alarms ");
    let inner = block.inner(area);
    f.render_widget(block, area);
    let evs: Vec<_> = app
        .events
        .iter()
        .rev()
        .filter(|e| e.level == "alarm" || e.level == "warn")
        .collect();
    if evs.is_empty() {
        f.render_widget(Paragraph::new("no alarms").dim(), inner);
        return;
    }
    let lines: Vec<Line> = evs
        .iter()
        .take(inner.height as usize)
        .map(|e| {
            let step = e.step.map_or_else(|| "   -".into(), |s| format!("{s:>4}"));
            Line::from(vec![
                Span::raw(format!("{step} ")).dim(),
                Span::styled(e.message.clone(), event_style(&e.level)),
            ])
        })
        .collect();
    f.render_widget(Paragraph::new(lines), inner);
}
