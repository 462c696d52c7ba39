//! Pictures of a simulation, as PNG and SVG: a person should look at a picture, not read numbers.
//!
//! - `fill_unallocated`: unallocated GPU share against arrived workload, one line per policy
//!   (median over seeds) — the figure of the ATC'23 paper;
//! - `fill_fragmented`: the fragmented GPU share against arrived workload;
//! - `replay_utilisation`: cpu, memory and GPU utilisation and GPU fragmentation over time;
//! - `*_latency`: placement decision latency per policy (median and p99, log scale);
//! - `spread_100`: each seed's unallocated GPU share at 100 % arrived per policy, with the
//!   median and the min–max range; `mix_spread_100` the same, one panel per workload mix.
//!
//! Every policy has its own colour and marker ([`style`]); `ring` and `fgd` come first in the
//! legend and are drawn thicker. Value axes are fitted to every plotted value ([`y_range`]).
//!
//! Text is drawn with DejaVu Sans, shipped in `assets/fonts/` and compiled in, so plots render
//! the same on a machine without system fonts.

use std::ops::Range;
use std::path::Path;
use std::sync::Once;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::element::ComposedElement;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};

use super::fill::FillRun;
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

/// Twenty distinguishable colours: one per policy (the first two for `ring` and `fgd`).
const PALETTE: [RGBColor; 20] = [
    RGBColor(214, 39, 40),   // red: ring
    RGBColor(31, 119, 180),  // blue: fgd
    RGBColor(44, 160, 44),   // green
    RGBColor(255, 127, 14),  // orange
    RGBColor(148, 103, 189), // purple
    RGBColor(140, 86, 75),   // brown
    RGBColor(227, 119, 194), // pink
    RGBColor(90, 90, 90),    // dark grey
    RGBColor(188, 189, 34),  // olive
    RGBColor(23, 190, 207),  // cyan
    RGBColor(0, 0, 128),     // navy
    RGBColor(128, 0, 0),     // maroon
    RGBColor(0, 128, 128),   // teal
    RGBColor(0, 0, 0),       // black
    RGBColor(170, 110, 40),  // ochre
    RGBColor(0, 190, 100),   // jade
    RGBColor(255, 200, 0),   // gold
    RGBColor(100, 140, 255), // cornflower
    RGBColor(240, 50, 230),  // magenta
    RGBColor(200, 120, 120), // rose
];

/// Marker shapes, cycled beside the colours.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marker {
    Circle,
    Square,
    TriangleUp,
    Diamond,
    TriangleDown,
    Plus,
    Hexagon,
    Star,
}

const MARKERS: [Marker; 8] = [
    Marker::Circle,
    Marker::Square,
    Marker::TriangleUp,
    Marker::Diamond,
    Marker::TriangleDown,
    Marker::Plus,
    Marker::Hexagon,
    Marker::Star,
];

/// How one series is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Style {
    pub color: RGBColor,
    pub marker: Marker,
    /// Line width in pixels.
    pub width: u32,
}

fn highlighted(policy: &str) -> bool {
    policy == "ring" || policy == "fgd"
}

/// The order series are listed in: `ring`, then `fgd`, then the others as given.
pub fn legend_order<S: AsRef<str>>(policies: &[S]) -> Vec<usize> {
    let rank = |p: &str| match p {
        "ring" => 0,
        "fgd" => 1,
        _ => 2,
    };
    let mut order: Vec<usize> = (0..policies.len()).collect();
    order.sort_by_key(|&i| rank(policies[i].as_ref()));
    order
}

/// The style of the series at position `i` of [`legend_order`]: its own colour (up to 20
/// series; then colours repeat with another marker), a marker, and a thick line for `ring` and
/// `fgd`.
pub fn style(i: usize, policy: &str) -> Style {
    let marker = MARKERS[(i + i / PALETTE.len()) % MARKERS.len()];
    Style {
        color: PALETTE[i % PALETTE.len()],
        marker,
        width: if highlighted(policy) { 4 } else { 2 },
    }
}

fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// The corners of a marker of half-size `r` pixels around (0, 0).
fn marker_points(marker: Marker, r: i32) -> Vec<(i32, i32)> {
    let round = |n: usize, radius: f64, turn: f64| -> Vec<(i32, i32)> {
        (0..n)
            .map(|k| {
                let a = turn + std::f64::consts::TAU * k as f64 / n as f64;
                (
                    (radius * a.cos()).round() as i32,
                    (radius * a.sin()).round() as i32,
                )
            })
            .collect()
    };
    let t = (r / 3).max(1);
    match marker {
        Marker::Circle => round(12, f64::from(r), 0.0),
        Marker::Square => vec![(-r, -r), (r, -r), (r, r), (-r, r)],
        Marker::TriangleUp => vec![(0, -r - 1), (r + 1, r), (-r - 1, r)],
        Marker::TriangleDown => vec![(0, r + 1), (r + 1, -r), (-r - 1, -r)],
        Marker::Diamond => vec![(0, -r - 1), (r + 1, 0), (0, r + 1), (-r - 1, 0)],
        Marker::Plus => vec![
            (-t, -r - 1),
            (t, -r - 1),
            (t, -t),
            (r + 1, -t),
            (r + 1, t),
            (t, t),
            (t, r + 1),
            (-t, r + 1),
            (-t, t),
            (-r - 1, t),
            (-r - 1, -t),
            (-t, -t),
        ],
        Marker::Hexagon => round(6, f64::from(r) + 0.5, 0.0),
        Marker::Star => (0..10)
            .map(|k| {
                let radius = if k % 2 == 0 {
                    f64::from(r) + 1.5
                } else {
                    f64::from(r) * 0.5
                };
                let a = -std::f64::consts::FRAC_PI_2 + std::f64::consts::TAU * k as f64 / 10.0;
                (
                    (radius * a.cos()).round() as i32,
                    (radius * a.sin()).round() as i32,
                )
            })
            .collect(),
    }
}

/// A filled marker shape with its outline, at a data point.
type MarkerElement<C, DB> = ComposedElement<C, DB, Polygon<(i32, i32)>, PathElement<(i32, i32)>>;

/// A marker at a data point, outlined.
fn marker_at<C, DB: DrawingBackend>(at: C, style: Style, radius: i32) -> MarkerElement<C, DB> {
    let points = marker_points(style.marker, radius);
    let mut outline = points.clone();
    outline.push(points[0]);
    EmptyElement::at(at)
        + Polygon::new(points, style.color.filled())
        + PathElement::new(outline, BLACK.mix(0.6).stroke_width(1))
}

/// A legend entry: the series' marker, filled with its colour, at the pixel `(x, y)` (an
/// element with no backend type, as a legend entry must be).
fn legend_glyph((x, y): (i32, i32), style: Style) -> Polygon<(i32, i32)> {
    Polygon::new(
        marker_points(style.marker, 5)
            .into_iter()
            .map(|(dx, dy)| (x + 10 + dx, y + dy))
            .collect::<Vec<_>>(),
        style.color.filled(),
    )
}

/// A value axis that shows every one of `values` (non-finite ones ignored), with a margin of
/// 6 % of their span (at least 0.5) on each side; never below 0 when no value is.
pub fn y_range(values: impl IntoIterator<Item = f64>) -> Range<f64> {
    let (lo, hi) = values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if lo > hi {
        return 0.0..1.0;
    }
    let margin = ((hi - lo) * 0.06).max(0.5);
    let bottom = if lo >= 0.0 {
        (lo - margin).max(0.0)
    } else {
        lo - margin
    };
    bottom..hi + margin
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// The `fill` plots.
pub fn fill_plots(
    dir: &Path,
    summaries: &[FillSummary],
    runs: &[FillRun],
    end_pct: u32,
) -> Result<(), PlotError> {
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
    both!(
        dir,
        "spread_100",
        (1000, 600),
        draw_spread_page,
        "Unallocated GPU at 100 % arrived, per seed (dots), median (bar), min–max (line)",
        summaries,
        runs
    )?;
    let latencies: Vec<(String, LatencySummary)> = summaries
        .iter()
        .map(|s| (s.policy.clone(), s.latency.clone()))
        .collect();
    both!(dir, "fill_latency", (1000, 550), draw_latency, &latencies)
}

/// `mix_spread_100`: the per-seed spread at 100 % arrived of each mix, one panel per mix.
pub fn mix_spread_plot(
    dir: &Path,
    mixes: &[(&str, &[FillSummary], &[FillRun])],
) -> Result<(), PlotError> {
    let columns = mixes.len().clamp(1, 3);
    let rows = mixes.len().div_ceil(columns).max(1);
    let size = (420 * columns as u32, 60 + 420 * rows as u32);
    both!(dir, "mix_spread_100", size, draw_mix_spread, mixes, columns)
}

fn draw_mix_spread<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    mixes: &[(&str, &[FillSummary], &[FillRun])],
    columns: usize,
) -> Result<(), String> {
    root.fill(&WHITE).map_err(err)?;
    let (title, body) = root.split_vertically(50);
    title
        .draw_text(
            "Unallocated GPU at 100 % arrived per workload mix: seeds (dots), median (bar)",
            &("sans-serif", 22).into_text_style(&title),
            (12, 12),
        )
        .map_err(err)?;
    let rows = mixes.len().div_ceil(columns).max(1);
    let panels = body.split_evenly((rows, columns));
    for (panel, (mix, summaries, runs)) in panels.iter().zip(mixes) {
        draw_spread(panel, mix, summaries, runs, 16)?;
    }
    Ok(())
}

fn draw_spread_page<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    summaries: &[FillSummary],
    runs: &[FillRun],
) -> Result<(), String> {
    root.fill(&WHITE).map_err(err)?;
    draw_spread(root, title, summaries, runs, 20)
}

/// Each seed's unallocated % at 100 % arrived, per policy in legend order.
pub fn seed_values(summaries: &[FillSummary], runs: &[FillRun]) -> Vec<(String, Vec<f64>)> {
    let names: Vec<&str> = summaries.iter().map(|s| s.policy.as_str()).collect();
    legend_order(&names)
        .into_iter()
        .map(|i| {
            let values = runs
                .iter()
                .filter(|r| r.policy == names[i])
                .filter_map(|r| r.at(100).map(|p| p.unallocated_pct))
                .collect();
            (names[i].to_string(), values)
        })
        .collect()
}

fn draw_spread<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    summaries: &[FillSummary],
    runs: &[FillRun],
    title_size: u32,
) -> Result<(), String> {
    // One row per policy, first at the top, values along x: names stay readable.
    let columns = seed_values(summaries, runs);
    let n = columns.len().max(1);
    let range = y_range(columns.iter().flat_map(|(_, v)| v.iter().copied()));
    let names: Vec<String> = columns.iter().map(|(p, _)| p.clone()).collect();
    let longest = names.iter().map(|p| p.chars().count()).max().unwrap_or(4) as u32;
    let row = |i: usize| n as f64 - i as f64 - 0.5;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", title_size))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(20 + 8 * longest)
        .build_cartesian_2d(range, 0.0..n as f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(n * 2 + 1)
        .y_label_formatter(&|y| {
            let k = y.floor() as usize;
            if (y - k as f64 - 0.5).abs() < 0.26 && k < n {
                names.get(n - 1 - k).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .x_desc("unallocated GPU % at 100 % arrived")
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    for (i, (policy, values)) in columns.iter().enumerate() {
        if values.is_empty() {
            continue;
        }
        let st = style(i, policy);
        let y = row(i);
        let spread = super::report::Spread::of(values);
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(spread.min, y), (spread.max, y)],
                st.color.mix(0.5).stroke_width(1),
            )))
            .map_err(err)?;
        // Seeds one above the other (in seed order) so equal values stay visible.
        let k = values.len();
        chart
            .draw_series(values.iter().enumerate().map(|(j, &v)| {
                let dy = if k > 1 {
                    0.25 - 0.5 * j as f64 / (k - 1) as f64
                } else {
                    0.0
                };
                marker_at((v, y + dy), st, 3)
            }))
            .map_err(err)?;
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(spread.median, y - 0.35), (spread.median, y + 0.35)],
                st.color.stroke_width(st.width.max(3)),
            )))
            .map_err(err)?;
    }
    Ok(())
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
    let ideal: Vec<(f64, f64)> = if fragmented {
        Vec::new()
    } else {
        (from..=end_pct)
            .map(|x| (f64::from(x), (100.0 - f64::from(x)).max(0.0)))
            .collect()
    };
    let series: Vec<(&str, Vec<(f64, f64)>)> = {
        let names: Vec<&str> = summaries.iter().map(|s| s.policy.as_str()).collect();
        legend_order(&names)
            .into_iter()
            .map(|i| {
                let points = summaries[i]
                    .curve
                    .iter()
                    .filter(|p| p.arrived_pct >= from && p.arrived_pct <= end_pct)
                    .map(|p| (f64::from(p.arrived_pct), value(p)))
                    .collect();
                (names[i], points)
            })
            .collect()
    };
    let range = y_range(
        series
            .iter()
            .flat_map(|(_, points)| points.iter())
            .chain(ideal.iter())
            .map(|&(_, y)| y),
    );
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
        .build_cartesian_2d(f64::from(from)..f64::from(end_pct), range)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("arrived workload (% of cluster GPU capacity)")
        .y_desc(y_desc)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    let draw = |chart: &mut ChartContext<'_, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
                i: usize,
                policy: &str,
                points: &[(f64, f64)],
                label: bool|
     -> Result<(), String> {
        let st = style(i, policy);
        let line = chart
            .draw_series(LineSeries::new(
                points.to_vec(),
                st.color.stroke_width(st.width),
            ))
            .map_err(err)?;
        if label {
            line.label(policy.to_string())
                .legend(move |at| legend_glyph(at, st));
        }
        // A marker every 10 points of arrived workload, staggered so they do not pile up.
        let offset = (i % 5) as u32 * 2;
        chart
            .draw_series(
                points
                    .iter()
                    .filter(|(x, _)| (*x as u32).saturating_sub(from + offset) % 10 == 0)
                    .filter(|(x, _)| *x as u32 >= from + offset)
                    .map(|&p| marker_at(p, st, 4)),
            )
            .map_err(err)?;
        Ok(())
    };
    for (i, (policy, points)) in series.iter().enumerate() {
        draw(&mut chart, i, policy, points, true)?;
    }
    if !ideal.is_empty() {
        chart
            .draw_series(LineSeries::new(ideal, BLACK.mix(0.35).stroke_width(1)))
            .map_err(err)?
            .label("nothing refused (100 − arrived)")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 24, y)], BLACK.mix(0.35)));
    }
    // `ring` and `fgd` once more, on top of the others.
    for (i, (policy, points)) in series.iter().enumerate() {
        if highlighted(policy) {
            draw(&mut chart, i, policy, points, false)?;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn y_range_covers_every_value() {
        let cases: [&[f64]; 6] = [
            &[40.0, 5.66, 5.48, 12.9, 0.0],
            &[5.7, 5.7, 5.7],
            &[-3.0, 2.0],
            &[0.01, 99.9, 130.0],
            &[f64::NAN, 7.0, f64::INFINITY, 6.5],
            &[],
        ];
        for values in cases {
            let r = y_range(values.iter().copied());
            assert!(r.start < r.end, "{values:?}: {r:?}");
            for &v in values.iter().filter(|v| v.is_finite()) {
                assert!(r.start < v || (v == 0.0 && r.start == 0.0), "{v} in {r:?}");
                assert!(v < r.end, "{v} in {r:?}");
            }
            if values.iter().all(|&v| !v.is_finite() || v >= 0.0) {
                assert!(r.start >= 0.0, "{values:?}: {r:?}");
            }
        }
        // The old fixed top (the curves' maximum after 70 % arrived × 1.1) clipped the curves
        // at 60 % arrived, where nothing is refused yet and 40 % is unallocated.
        let r = y_range([40.2, 12.0, 5.5]);
        assert!(r.end > 40.2 && r.start < 5.5);
    }

    #[test]
    fn every_policy_has_its_own_look_and_ring_and_fgd_lead() {
        let policies = [
            "random",
            "fgd-exact",
            "ring-seed001",
            "linear-best-fit",
            "first-fit",
            "balance",
            "least-requested",
            "most-balanced",
            "dot-product",
            "gpu-clustering",
            "gpu-packing",
            "best-fit",
            "fgd",
            "ring",
            "extra-1",
            "extra-2",
        ];
        let order = legend_order(&policies);
        assert_eq!(policies[order[0]], "ring");
        assert_eq!(policies[order[1]], "fgd");
        assert_eq!(policies[order[2]], "random", "the others keep their order");
        let styles: Vec<Style> = order
            .iter()
            .enumerate()
            .map(|(i, &p)| style(i, policies[p]))
            .collect();
        for (i, a) in styles.iter().enumerate() {
            for b in &styles[i + 1..] {
                assert_ne!(a.color, b.color, "16 policies, 16 colours");
            }
        }
        assert!(styles[0].width > styles[2].width && styles[1].width > styles[2].width);
        // Past the palette, colour and marker together still differ.
        let far: Vec<(RGBColor, Marker)> = (0..40)
            .map(|i| {
                let s = style(i, "x");
                (s.color, s.marker)
            })
            .collect();
        for (i, a) in far.iter().enumerate() {
            assert!(!far[i + 1..].contains(a), "style {i} repeats");
        }
        for m in MARKERS {
            assert!(marker_points(m, 4).len() >= 3);
        }
    }
}
