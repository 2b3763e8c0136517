//! One line chart over steps, linear or log10 on the y axis.

use ratatui::layout::Rect;
use ratatui::style::{Color, Style, Stylize};
use ratatui::symbols::Marker;
use ratatui::text::Line;
use ratatui::widgets::{Axis, Block, Chart, Dataset, GraphType};
use ratatui::Frame;

use crate::fmt::short;
use crate::series::{bounds, x_range};

pub struct Curve {
    pub points: Vec<(f64, f64)>,
    pub color: Color,
    /// Dots instead of a line (sparse or abandoned points).
    pub dots: bool,
}

impl Curve {
    pub fn line(points: Vec<(f64, f64)>, color: Color) -> Curve {
        Curve {
            points,
            color,
            dots: false,
        }
    }
    pub fn dots(points: Vec<(f64, f64)>, color: Color) -> Curve {
        Curve {
            points,
            color,
            dots: true,
        }
    }
}

/// Draw `curves` in a bordered box titled `title`. With `log`, the y values are
/// log10 already and the axis is labelled in decades.
pub fn draw(f: &mut Frame, area: Rect, title: Line<'_>, curves: &[Curve], log: bool) {
    let block = Block::bordered().title(title);
    let sets: Vec<&[(f64, f64)]> = curves.iter().map(|c| c.points.as_slice()).collect();
    let Some((mut lo, mut hi)) = bounds(&sets) else {
        let inner = block.inner(area);
        f.render_widget(block, area);
        if inner.height > 0 {
            let msg = ratatui::widgets::Paragraph::new("no data yet")
                .centered()
                .dim();
            f.render_widget(
                msg,
                Rect {
                    y: inner.y + inner.height / 2,
                    height: 1,
                    ..inner
                },
            );
        }
        return;
    };
    let (x0, x1) = x_range(&sets);
    let ylabels: Vec<Line> = if log {
        lo = lo.floor();
        hi = hi.ceil().max(lo + 1.0);
        let decades = (hi - lo) as usize;
        let rows = area
            .height
            .saturating_sub(if area.height >= 10 { 4 } else { 2 }) as usize;
        let step = if decades * 2 <= rows { 1 } else { decades };
        (0..=decades)
            .step_by(step)
            .map(|d| Line::from(format!("1e{}", lo as i64 + d as i64)))
            .collect()
    } else {
        let mut v = vec![Line::from(short(lo))];
        if area.height >= 10 {
            v.push(Line::from(short((lo + hi) / 2.0)));
        }
        v.push(Line::from(short(hi)));
        v
    };
    // Short charts give the x axis's two rows to the curve (the header shows the step).
    let xlabels: Vec<Line> = if area.height < 10 {
        vec![]
    } else if area.width >= 60 {
        vec![
            format!("{x0:.0}"),
            format!("{:.0}", (x0 + x1) / 2.0),
            format!("{x1:.0}"),
        ]
    } else {
        vec![format!("{x0:.0}"), format!("{x1:.0}")]
    }
    .into_iter()
    .map(Line::from)
    .collect();
    let datasets = curves
        .iter()
        .map(|c| {
            Dataset::default()
                .marker(if c.dots { Marker::Dot } else { Marker::Braille })
                .graph_type(if c.dots {
                    GraphType::Scatter
                } else {
                    GraphType::Line
                })
                .style(Style::new().fg(c.color))
                .data(&c.points)
        })
        .collect();
    let chart = Chart::new(datasets)
        .block(block)
        .legend_position(None)
        .x_axis(
            Axis::default()
                .bounds([x0, x1])
                .labels(xlabels)
                .style(Style::new().dim()),
        )
        .y_axis(
            Axis::default()
                .bounds([lo, hi])
                .labels(ylabels)
                .style(Style::new().dim()),
        );
    f.render_widget(chart, area);
}
