//! `jetctl plot`: one metric of several runs over RL steps, written as SVG or
//! PNG for a report (plotters; PNG encoded with the `png` crate from plotters'
//! RGB buffer). Text in PNGs needs a font: plotters' `ab_glyph` renderer with
//! the Ubuntu Light face that `epaint_default_fonts` ships, so no system font
//! (and no fontconfig) is needed.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::compare::Source;

/// Line colours, one per series (colour-blind friendly: Okabe and Ito).
const COLORS: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
    RGBColor(240, 228, 66),
];

/// Image formats, by the output's extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Svg,
    Png,
}

impl Format {
    pub fn of(path: &Path) -> Result<Format, String> {
        match path
            .extension()
            .map(|e| e.to_string_lossy().to_lowercase())
            .as_deref()
        {
            Some("svg") => Ok(Format::Svg),
            Some("png") => Ok(Format::Png),
            _ => Err(format!(
                "--out {}: the file name must end in .svg or .png",
                path.display()
            )),
        }
    }
}

/// The y axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scale {
    /// Log for the mismatch metrics (which span decades), linear otherwise.
    Auto,
    Linear,
    Log,
}

/// What to draw.
pub struct Spec<'a> {
    pub metric: &'a str,
    pub sources: &'a [Source],
    pub size: (u32, u32),
    pub scale: Scale,
}

/// A labelled curve: (legend label, (step, value) points).
type Labelled = (String, Vec<(f64, f64)>);

/// The curves to draw, or an error naming what is missing.
fn curves(spec: &Spec) -> Result<Vec<Labelled>, String> {
    let out: Vec<_> = spec
        .sources
        .iter()
        .map(|s| (s.label.clone(), s.curve(spec.metric)))
        .collect();
    if out.iter().all(|(_, p)| p.is_empty()) {
        let mut fields: Vec<String> = spec
            .sources
            .iter()
            .flat_map(|s| s.metrics.iter())
            .filter(|m| crate::fmt::is_rl(m))
            .flat_map(|m| m.as_object().into_iter().flat_map(|o| o.iter()))
            .filter(|(_, v)| v.is_number())
            .map(|(k, _)| k.clone())
            .collect();
        fields.sort();
        fields.dedup();
        let ids: Vec<&str> = spec.sources.iter().map(|s| s.id.as_str()).collect();
        return Err(format!(
            "--metric {}: no RL step of {} has it (numeric fields: {})",
            spec.metric,
            ids.join(", "),
            fields.join(", ")
        ));
    }
    Ok(out)
}

/// Write the chart to `out` (format by its extension).
pub fn write(spec: &Spec, out: &Path) -> Result<(), String> {
    let format = Format::of(out)?;
    let (w, h) = spec.size;
    if !(100..=8000).contains(&w) || !(100..=8000).contains(&h) {
        return Err(format!(
            "--size {w}x{h}: each side must be 100 to 8000 pixels"
        ));
    }
    let curves = curves(spec)?;
    register_font();
    let fail = |e: String| format!("drawing {}: {e}", out.display());
    match format {
        Format::Svg => {
            let mut text = String::new();
            {
                let root = SVGBackend::with_string(&mut text, (w, h)).into_drawing_area();
                draw(root, spec, &curves).map_err(fail)?;
            }
            std::fs::write(out, text).map_err(|e| format!("cannot write {}: {e}", out.display()))
        }
        Format::Png => {
            let mut rgb = vec![0u8; w as usize * h as usize * 3];
            {
                let root = BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area();
                draw(root, spec, &curves).map_err(fail)?;
            }
            write_png(out, w, h, &rgb)
        }
    }
}

fn write_png(out: &Path, w: u32, h: u32, rgb: &[u8]) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("cannot write {}: {e}", out.display());
    let file = std::fs::File::create(out).map_err(|e| err(&e))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut wr = enc.write_header().map_err(|e| err(&e))?;
    wr.write_image_data(rgb).map_err(|e| err(&e))?;
    wr.finish().map_err(|e| err(&e))
}

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The bytes are a valid TrueType font shipped by the crate; should that
        // ever fail, text drawing reports it as an error (no panic).
        let _ = plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            epaint_default_fonts::UBUNTU_LIGHT,
        );
    });
}

/// Log scale for values spanning decades: the mismatch metrics by default.
fn log_scale(spec: &Spec) -> bool {
    match spec.scale {
        Scale::Log => true,
        Scale::Linear => false,
        Scale::Auto => spec.metric.starts_with("mismatch_"),
    }
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    spec: &Spec,
    curves: &[Labelled],
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let all: Vec<(f64, f64)> = curves.iter().flat_map(|c| c.1.iter().copied()).collect();
    let (x0, x1) = crate::series::x_range(&[&all]);
    let title = format!("{} over RL steps", spec.metric);
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(&title, ("sans-serif", 26))
        .margin(18)
        .x_label_area_size(48)
        .y_label_area_size(84);
    if log_scale(spec) {
        // A log axis has no zero: exact zeros (the on-policy flows' mismatch)
        // are drawn on a floor three decades under the smallest positive value,
        // and the axis title says so.
        let smallest = all
            .iter()
            .map(|p| p.1)
            .filter(|v| *v > 0.0)
            .fold(f64::INFINITY, f64::min);
        let floor = if smallest.is_finite() {
            10f64.powf(smallest.log10().floor() - 3.0)
        } else {
            1e-9
        };
        let top = all.iter().map(|p| p.1).fold(floor * 10.0, f64::max) * 2.0;
        let mut chart = builder
            .build_cartesian_2d(x0..x1, (floor..top).log_scale())
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc("RL step")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_desc(format!("{} (log; 0 drawn at {floor:.0e})", spec.metric))
            .y_label_formatter(&|v| format!("{v:.0e}"))
            .label_style(("sans-serif", 15))
            .draw()
            .map_err(e)?;
        for (i, (label, pts)) in curves.iter().enumerate() {
            let pts: Vec<(f64, f64)> = pts.iter().map(|&(x, y)| (x, y.max(floor))).collect();
            series(&mut chart, i, label, pts).map_err(e)?;
        }
        legend(&mut chart).map_err(e)?;
    } else {
        let (lo, hi) = crate::series::bounds(&[&all]).unwrap_or((0.0, 1.0));
        let mut chart = builder.build_cartesian_2d(x0..x1, lo..hi).map_err(e)?;
        chart
            .configure_mesh()
            .x_desc("RL step")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_desc(spec.metric)
            .label_style(("sans-serif", 15))
            .draw()
            .map_err(e)?;
        for (i, (label, pts)) in curves.iter().enumerate() {
            series(&mut chart, i, label, pts.clone()).map_err(e)?;
        }
        legend(&mut chart).map_err(e)?;
    }
    root.present().map_err(e)
}

/// One curve: a line, with dots where points are few (evaluations), so a
/// curve of one point still shows.
fn series<'a, DB: DrawingBackend + 'a, X, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    i: usize,
    label: &str,
    pts: Vec<(f64, f64)>,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let color = COLORS[i % COLORS.len()];
    let dots = pts.len() <= 60;
    chart
        .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3)));
    if dots {
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
    }
    Ok(())
}

fn legend<'a, DB: DrawingBackend + 'a, X, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font(("sans-serif", 16))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
}
