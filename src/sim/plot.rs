//! Pictures of a simulation, as PNG and SVG: a person should look at a picture, not read numbers.
//!
//! - `fill_unallocated`: unallocated GPU share against arrived workload, one line per policy
//!   (median over seeds) — the figure of the ATC'23 paper;
//! - `fill_fragmented`: the fragmented GPU share against arrived workload;
//! - `replay_utilisation`: cpu, memory and GPU utilisation and GPU fragmentation over time;
//! - `*_latency`: placement decision latency per policy (median and p99, log scale).
//!
//! Text is drawn with DejaVu Sans, shipped in `assets/fonts/` and compiled in, so plots render
//! the same on a machine without system fonts.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use super::replay::ReplayRun;
use super::report::{FillSummary, LatencySummary, ReplaySummary};

static FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
static REGISTER: Once = Once::new();

/// A plot that could not be drawn or written.
#[derive(Debug, thiserror::Error)]
#[error("cannot draw {path}: {message}")]
pub struct PlotError {
    pub path: String,
    pub message: String,
}

fn register() {
    REGISTER.call_once(|| {
        // The font is compiled in and known to parse; a failure would only lose the text.
        let _ = register_font("sans-serif", FontStyle::Normal, FONT);
    });
}

/// Draws one picture twice, `NAME.png` and `NAME.svg`.
macro_rules! both {
    ($dir:expr, $name:expr, $size:expr, $draw:ident, $($arg:expr),*) => {{
        register();
        let png = $dir.join(format!("{}.png", $name));
        let svg = $dir.join(format!("{}.svg", $name));
        let fail = |path: &Path, e: String| PlotError { path: path.display().to_string(), message: e };
        {
            let root = BitMapBackend::new(&png, $size).into_drawing_area();
            $draw(&root, $($arg),*).map_err(|e| fail(&png, e))?;
            root.present().map_err(|e| fail(&png, e.to_string()))?;
        }
        {
            let root = SVGBackend::new(&svg, $size).into_drawing_area();
            $draw(&root, $($arg),*).map_err(|e| fail(&svg, e))?;
            root.present().map_err(|e| fail(&svg, e.to_string()))?;
        }
        Ok::<(), PlotError>(())
    }};
}

fn color(i: usize) -> RGBColor {
    // Distinguishable colours; more policies than colours reuse them with a different style.
    const COLORS: [RGBColor; 10] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
        RGBColor(188, 189, 34),
        RGBColor(23, 190, 207),
    ];
    COLORS[i % COLORS.len()]
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// The `fill` plots.
pub fn fill_plots(dir: &Path, summaries: &[FillSummary], end_pct: u32) -> Result<(), PlotError> {
    both!(
        dir,
        "fill_unallocated",
        (1000, 650),
        draw_fill_curve,
        summaries,
        end_pct,
        false
    )?;
    both!(
        dir,
        "fill_fragmented",
        (1000, 650),
        draw_fill_curve,
        summaries,
        end_pct,
        true
    )?;
    let latencies: Vec<(String, LatencySummary)> = summaries
        .iter()
        .map(|s| (s.policy.clone(), s.latency.clone()))
        .collect();
    both!(dir, "fill_latency", (1000, 550), draw_latency, &latencies)
}

/// The `replay` plots.
pub fn replay_plots(
    dir: &Path,
    summaries: &[ReplaySummary],
    runs: &[ReplayRun],
) -> Result<(), PlotError> {
    both!(
        dir,
        "replay_utilisation",
        (1100, 1000),
        draw_utilisation,
        runs
    )?;
    let latencies: Vec<(String, LatencySummary)> = summaries
        .iter()
        .map(|s| (s.policy.clone(), s.latency.clone()))
        .collect();
    both!(dir, "replay_latency", (1000, 550), draw_latency, &latencies)
}

fn draw_fill_curve<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    summaries: &[FillSummary],
    end_pct: u32,
    fragmented: bool,
) -> Result<(), String> {
    root.fill(&WHITE).map_err(err)?;
    let from = end_pct.saturating_sub(70).min(60);
    let value = |p: &super::report::CurvePoint| {
        if fragmented {
            p.fragmented_pct
        } else {
            p.unallocated_pct
        }
    };
    let top = summaries
        .iter()
        .flat_map(|s| s.curve.iter().filter(|p| p.arrived_pct >= from.max(70)))
        .map(value)
        .fold(5.0f64, f64::max)
        * 1.1;
    let (title, y_desc) = if fragmented {
        (
            "Fragmented GPU vs arrived workload (median over seeds)",
            "fragmented GPU (% of capacity)",
        )
    } else {
        (
            "Unallocated GPU vs arrived workload (median over seeds)",
            "unallocated GPU (% of capacity)",
        )
    };
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(f64::from(from)..f64::from(end_pct), 0.0..top)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("arrived workload (% of cluster GPU capacity)")
        .y_desc(y_desc)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    if !fragmented {
        let ideal: Vec<(f64, f64)> = (from..=end_pct)
            .map(|x| (f64::from(x), (100.0 - f64::from(x)).max(0.0)))
            .collect();
        chart
            .draw_series(LineSeries::new(ideal, BLACK.mix(0.35).stroke_width(1)))
            .map_err(err)?
            .label("nothing refused (100 − arrived)")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.mix(0.35)));
    }
    for (i, s) in summaries.iter().enumerate() {
        let c = color(i);
        let width = if s.policy == "ring" || s.policy == "fgd" {
            3
        } else {
            2
        };
        let points: Vec<(f64, f64)> = s
            .curve
            .iter()
            .filter(|p| p.arrived_pct >= from)
            .map(|p| (f64::from(p.arrived_pct), value(p)))
            .collect();
        chart
            .draw_series(LineSeries::new(points, c.stroke_width(width)))
            .map_err(err)?
            .label(s.policy.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], c.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(err)?;
    Ok(())
}

fn draw_latency<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    latencies: &[(String, LatencySummary)],
) -> Result<(), String> {
    root.fill(&WHITE).map_err(err)?;
    let n = latencies.len().max(1);
    let low = latencies
        .iter()
        .map(|(_, l)| l.p50_us)
        .fold(f64::INFINITY, f64::min)
        .clamp(0.01, 1.0)
        / 2.0;
    let high = latencies.iter().map(|(_, l)| l.p99_us).fold(1.0, f64::max) * 2.0;
    let names: Vec<String> = latencies.iter().map(|(n, _)| n.clone()).collect();
    let mut chart = ChartBuilder::on(root)
        .caption(
            "Placement decision latency per policy (median and p99)",
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..n as f64, (low..high).log_scale())
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - i as f64 - 0.5).abs() < 0.26 {
                names.get(i).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("µs per decision (log scale)")
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    let bar = |i: usize, left: f64, right: f64, v: f64, c: RGBColor| {
        Rectangle::new(
            [(i as f64 + left, low), (i as f64 + right, v.max(low))],
            c.filled(),
        )
    };
    chart
        .draw_series(
            latencies
                .iter()
                .enumerate()
                .map(|(i, (_, l))| bar(i, 0.15, 0.5, l.p50_us, color(0))),
        )
        .map_err(err)?
        .label("median")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], color(0).filled()));
    chart
        .draw_series(
            latencies
                .iter()
                .enumerate()
                .map(|(i, (_, l))| bar(i, 0.5, 0.85, l.p99_us, color(1))),
        )
        .map_err(err)?
        .label("p99")
        .legend(|(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], color(1).filled()));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(err)?;
    Ok(())
}

fn draw_utilisation<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    runs: &[ReplayRun],
) -> Result<(), String> {
    root.fill(&WHITE).map_err(err)?;
    let (title, body) = root.split_vertically(40);
    title
        .draw_text(
            "Replay: utilisation and GPU fragmentation over time",
            &("sans-serif", 22).into_text_style(&title),
            (12, 8),
        )
        .map_err(err)?;
    let panels = body.split_evenly((4, 1));
    let end_h = runs
        .iter()
        .flat_map(|r| r.timeline.last())
        .map(|p| p.time as f64 / 3600.0)
        .fold(1.0, f64::max);
    type Pick = fn(&super::replay::TimelinePoint) -> f64;
    let series: [(&str, Pick); 4] = [
        ("cpu allocated %", |p| p.cpu_pct),
        ("memory allocated %", |p| p.memory_pct),
        ("GPU allocated %", |p| p.gpu_pct),
        ("GPU fragmented %", |p| p.fragmented_pct),
    ];
    for (k, (panel, (label, pick))) in panels.iter().zip(series).enumerate() {
        let top = runs
            .iter()
            .flat_map(|r| r.timeline.iter().map(pick))
            .fold(1.0f64, f64::max)
            .min(100.0)
            * 1.05;
        let mut chart = ChartBuilder::on(panel)
            .margin(8)
            .x_label_area_size(if k == 3 { 35 } else { 20 })
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..end_h, 0.0..top)
            .map_err(err)?;
        let mut mesh = chart.configure_mesh();
        mesh.y_desc(label).label_style(("sans-serif", 12));
        if k == 3 {
            mesh.x_desc("hours from the trace's start");
        }
        mesh.draw().map_err(err)?;
        for (i, run) in runs.iter().enumerate() {
            let c = color(i);
            let points: Vec<(f64, f64)> = run
                .timeline
                .iter()
                .map(|p| (p.time as f64 / 3600.0, pick(p)))
                .collect();
            let s = chart
                .draw_series(LineSeries::new(points, c.stroke_width(2)))
                .map_err(err)?;
            if k == 0 {
                s.label(run.policy.clone()).legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], c.stroke_width(3))
                });
            }
        }
        if k == 0 {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK.mix(0.4))
                .label_font(("sans-serif", 12))
                .position(SeriesLabelPosition::LowerRight)
                .draw()
                .map_err(err)?;
        }
    }
    Ok(())
}
