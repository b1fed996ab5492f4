//! PNG plots: line plots (optionally with a log x axis, error bars and a dashed secondary
//! series against a right-hand axis) and grouped bar plots.
//!
//! Plotters draws into an RGB buffer with the embedded DejaVu Sans (no system font is read),
//! the `png` crate encodes it, and the file is written atomically.

use std::ops::Range;
use std::path::Path;
use std::sync::OnceLock;

use plotters::chart::DualCoordChartContext;
use plotters::coord::Shift;
use plotters::coord::ranged1d::{
    AsRangedCoord, DefaultFormatting, KeyPointHint, Ranged, ValueFormatter,
};
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};
use serde::{Deserialize, Serialize};

use crate::error::{ReportError, Result};
use crate::io::{create_dir, write_atomic};

/// Width of every plot, in pixels.
pub const PLOT_WIDTH: u32 = 800;
/// Height of every plot, in pixels.
pub const PLOT_HEIGHT: u32 = 500;

/// DejaVu Sans (Bitstream Vera / DejaVu licence, see `fonts/LICENSE`), embedded so that text
/// renders without system fonts.
static FONT_BYTES: &[u8] = include_bytes!("../fonts/DejaVuSans.ttf");

/// The family our text styles name; the embedded font is registered under it (and as
/// plotters' default `sans-serif`, for any text whose style we do not set).
const FONT: &str = "raptor-dejavu-sans";

/// Registers the embedded font with plotters, once per process.
fn ensure_font() -> Result<()> {
    static REGISTERED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    REGISTERED
        .get_or_init(|| {
            for family in [FONT, "sans-serif"] {
                register_font(family, FontStyle::Normal, FONT_BYTES)
                    .map_err(|_| "DejaVu Sans could not be parsed".to_string())?;
            }
            Ok(())
        })
        .clone()
        .map_err(ReportError::Font)
}

/// Tableau 10: distinguishable colours, cycled by series index.
const PALETTE: [RGBColor; 10] = [
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

fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// One named series of points, with optional symmetric y error bars.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// Legend entry.
    pub name: String,
    /// `(x, y)` points, drawn in this order.
    pub points: Vec<(f64, f64)>,
    /// Symmetric y error bars (e.g. CI half-widths), one per point, non-negative.
    pub err: Option<Vec<f64>>,
}

impl Series {
    /// A series without error bars.
    #[must_use]
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self {
            name: name.into(),
            points,
            err: None,
        }
    }

    /// The same series with error bars `err` (one per point).
    #[must_use]
    pub fn with_err(mut self, err: Vec<f64>) -> Self {
        self.err = Some(err);
        self
    }
}

/// A line plot: one coloured line with point markers per series, optional error bars, and an
/// optional group of series drawn dashed against a right-hand axis (e.g. ε spent over the
/// steps of a training curve). A legend is drawn when there is more than one series in all.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinePlot {
    /// Caption above the plot.
    pub title: String,
    /// Label of the x axis.
    pub x_label: String,
    /// Label of the left y axis.
    pub y_label: String,
    /// Series against the left axis.
    pub series: Vec<Series>,
    /// Logarithmic x axis (every x must then be positive).
    pub x_log: bool,
    /// Label of the right axis and the series drawn (dashed) against it.
    pub secondary: Option<(String, Vec<Series>)>,
}

/// A grouped bar plot: one bar per (category, group), one colour per group, error whiskers
/// where a group has `err`. A legend is drawn when there is more than one group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BarPlot {
    /// Caption above the plot.
    pub title: String,
    /// Label of the y axis.
    pub y_label: String,
    /// Category names along the x axis.
    pub categories: Vec<String>,
    /// One series per group: `points[i].1` is the height of the bar for `categories[i]`
    /// (the x values are ignored); `err[i]` its whisker.
    pub groups: Vec<Series>,
}

/// Checks one series: non-empty, finite points (x positive on a log axis; x not checked when
/// `check_x` is false), error bars of the right length, finite and non-negative.
fn check_series(what: &str, series: &Series, check_x: bool, x_log: bool) -> Result<()> {
    let name = format!("{what} series {:?}", series.name);
    if series.points.is_empty() {
        return Err(ReportError::Empty {
            what: format!("{name} points"),
        });
    }
    for (index, &(x, y)) in series.points.iter().enumerate() {
        if check_x && (!x.is_finite() || (x_log && x <= 0.0)) {
            return Err(ReportError::InvalidValue {
                what: if x_log {
                    format!("{name} x (log axis: must be positive)")
                } else {
                    format!("{name} x")
                },
                index,
                value: x,
            });
        }
        if !y.is_finite() {
            return Err(ReportError::InvalidValue {
                what: format!("{name} y"),
                index,
                value: y,
            });
        }
    }
    if let Some(err) = &series.err {
        if err.len() != series.points.len() {
            return Err(ReportError::LengthMismatch {
                what: format!("{name} points and err"),
                left: series.points.len(),
                right: err.len(),
            });
        }
        if let Some(index) = err.iter().position(|e| !e.is_finite() || *e < 0.0) {
            return Err(ReportError::InvalidValue {
                what: format!("{name} err (must be finite and non-negative)"),
                index,
                value: err[index],
            });
        }
    }
    Ok(())
}

fn check_all(what: &str, series: &[Series], check_x: bool, x_log: bool) -> Result<()> {
    if series.is_empty() {
        return Err(ReportError::Empty {
            what: format!("{what} series"),
        });
    }
    series
        .iter()
        .try_for_each(|s| check_series(what, s, check_x, x_log))
}

/// `(min, max)` of the values, or `None` for none.
fn extent(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values.fold(None, |acc, v| match acc {
        None => Some((v, v)),
        Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
    })
}

/// The y values a series needs visible: each point's y ± its error.
fn y_values(series: &[Series]) -> impl Iterator<Item = f64> + '_ {
    series.iter().flat_map(|s| {
        s.points.iter().enumerate().flat_map(move |(i, &(_, y))| {
            let e = s
                .err
                .as_ref()
                .and_then(|e| e.get(i))
                .copied()
                .unwrap_or(0.0);
            [y - e, y + e]
        })
    })
}

/// A linear axis range around `[lo, hi]` with a 5 % margin each side; a zero-width range
/// (one point, or all equal) is widened by 10 % of its magnitude (±1 around 0).
fn linear_range(what: &'static str, lo: f64, hi: f64) -> Result<Range<f64>> {
    let width = hi - lo;
    let (lo, hi) = if width <= 1e-12 * lo.abs().max(hi.abs()) {
        let d = if lo == 0.0 && hi == 0.0 {
            1.0
        } else {
            0.1 * lo.abs().max(hi.abs())
        };
        (lo - d, hi + d)
    } else {
        (lo - 0.05 * width, hi + 0.05 * width)
    };
    if lo.is_finite() && hi.is_finite() && hi - lo > 0.0 && (hi - lo).is_finite() {
        Ok(lo..hi)
    } else {
        Err(ReportError::OutOfRange {
            what,
            value: hi - lo,
            expected: "a data range that fits in f64",
        })
    }
}

/// A log axis range around `[lo, hi]` (both positive) with a 5 % margin in log space each
/// side; a single value gets a factor 2 each side.
fn log_range(lo: f64, hi: f64) -> Result<Range<f64>> {
    let (lo, hi) = if hi <= lo * (1.0 + 1e-12) {
        (lo / 2.0, hi * 2.0)
    } else {
        let f = (hi / lo).powf(0.05);
        (lo / f, hi * f)
    };
    if lo > 0.0 && hi.is_finite() && hi > lo {
        Ok(lo..hi)
    } else {
        Err(ReportError::OutOfRange {
            what: "log x range",
            value: hi / lo,
            expected: "a positive data range that fits in f64",
        })
    }
}

/// Tick label: integers as integers, others with up to 4 decimals (trailing zeros trimmed),
/// very large or small magnitudes in scientific notation.
fn tick(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return if v.is_finite() {
            "0".into()
        } else {
            v.to_string()
        };
    }
    let a = v.abs();
    if !(1e-3..1e6).contains(&a) {
        return format!("{v:.1e}");
    }
    let s = format!("{v:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" { "0".into() } else { s.into() }
}

/// Tick labels for an axis spanning `range`: a tick within rounding error of 0 (such as
/// `0.1 + 0.2 − 0.3`) is labelled `0`.
fn ticks_for(range: &Range<f64>) -> impl Fn(&f64) -> String + use<> {
    let zero = 1e-9 * (range.end - range.start).abs();
    move |v: &f64| {
        if v.abs() <= zero {
            "0".into()
        } else {
            tick(*v)
        }
    }
}

fn font(size: u32) -> TextStyle<'static> {
    (FONT, size).into_font().color(&BLACK)
}

/// Renders into an RGB buffer with `draw`, encodes it as PNG and writes it to `path`
/// (atomically, creating its folder when missing).
fn render(
    path: &Path,
    draw: impl FnOnce(&DrawingArea<BitMapBackend<'_>, Shift>) -> std::result::Result<(), String>,
) -> Result<()> {
    ensure_font()?;
    let draw_err = |message: String| ReportError::Draw {
        path: path.to_path_buf(),
        message,
    };
    let mut buffer = vec![0u8; PLOT_WIDTH as usize * PLOT_HEIGHT as usize * 3];
    {
        let root =
            BitMapBackend::with_buffer(&mut buffer, (PLOT_WIDTH, PLOT_HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw_err(e.to_string()))?;
        draw(&root).map_err(draw_err)?;
        root.present().map_err(|e| draw_err(e.to_string()))?;
    }
    let png_err = |source| ReportError::Png {
        path: path.to_path_buf(),
        source,
    };
    let mut bytes = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut bytes, PLOT_WIDTH, PLOT_HEIGHT);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().map_err(png_err)?;
        writer.write_image_data(&buffer).map_err(png_err)?;
        writer.finish().map_err(png_err)?;
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dir(parent)?;
    }
    write_atomic(path, &bytes)
}

/// Draws a line plot as an 800×500 PNG at `path` (see [`LinePlot`]), creating the folder when
/// missing. Axis ranges come from
/// the data (points and error bars) with a small margin; a single point or a flat series
/// gets a widened range.
///
/// # Errors
/// [`ReportError::Empty`] for no series or a series without points,
/// [`ReportError::InvalidValue`] for a NaN or infinite coordinate, a non-positive x on a log
/// axis or a negative or non-finite error bar, [`ReportError::LengthMismatch`] when `err`
/// does not have one value per point, [`ReportError::Draw`], [`ReportError::Png`] or
/// [`ReportError::Io`] when drawing, encoding or writing fails.
pub fn line_plot(path: &Path, plot: &LinePlot) -> Result<()> {
    check_all("line plot", &plot.series, true, plot.x_log)?;
    if let Some((_, secondary)) = &plot.secondary {
        check_all("line plot secondary", secondary, true, plot.x_log)?;
    }
    let all_x = plot
        .series
        .iter()
        .chain(plot.secondary.iter().flat_map(|(_, s)| s.iter()))
        .flat_map(|s| s.points.iter().map(|p| p.0));
    let Some((x_lo, x_hi)) = extent(all_x) else {
        return Err(ReportError::Empty {
            what: "line plot points".into(),
        });
    };
    let y = y_range(&plot.series)?;
    let y2 = match &plot.secondary {
        Some((_, secondary)) => Some(y_range(secondary)?),
        None => None,
    };
    if plot.x_log {
        let x = log_range(x_lo, x_hi)?;
        render(path, |root| {
            draw_line_plot(root, plot, x.log_scale(), y, y2)
        })
    } else {
        let x = linear_range("x range", x_lo, x_hi)?;
        render(path, |root| draw_line_plot(root, plot, x, y, y2))
    }
}

fn y_range(series: &[Series]) -> Result<Range<f64>> {
    match extent(y_values(series)) {
        Some((lo, hi)) => linear_range("y range", lo, hi),
        None => Err(ReportError::Empty {
            what: "line plot points".into(),
        }),
    }
}

/// Legend glyph of a line series: a short line, solid or dashed (two segments either way,
/// so both are one element type).
fn legend_line<DB: DrawingBackend>(
    colour: RGBColor,
    dashed: bool,
) -> impl Fn((i32, i32)) -> Glyph<(i32, i32), DB> {
    move |(x, y)| {
        let style = colour.stroke_width(2);
        let (end, start) = if dashed { (7, 12) } else { (10, 10) };
        EmptyElement::at((x, y))
            + PathElement::new(vec![(0, 0), (end, 0)], style)
            + PathElement::new(vec![(start, 0), (20, 0)], style)
    }
}

/// A marker anchored at a data point, drawn as two pixel-offset paths.
type Glyph<C, DB> =
    plotters::element::ComposedElement<C, DB, PathElement<(i32, i32)>, PathElement<(i32, i32)>>;

/// The vertical lines of a series' error bars, from `y − e` to `y + e` (data coordinates).
fn error_lines(series: &Series, colour: RGBColor) -> Vec<PathElement<(f64, f64)>> {
    let Some(err) = &series.err else {
        return Vec::new();
    };
    series
        .points
        .iter()
        .zip(err)
        .map(|(&(x, y), &e)| PathElement::new(vec![(x, y - e), (x, y + e)], colour.stroke_width(1)))
        .collect()
}

/// The 8-pixel caps at both ends of a series' error bars.
fn error_caps<DB: DrawingBackend>(series: &Series, colour: RGBColor) -> Vec<Glyph<(f64, f64), DB>> {
    let Some(err) = &series.err else {
        return Vec::new();
    };
    series
        .points
        .iter()
        .zip(err)
        .flat_map(|(&(x, y), &e)| [(x, y - e), (x, y + e)])
        .map(|end| {
            let style = colour.stroke_width(1);
            EmptyElement::at(end)
                + PathElement::new(vec![(-4, 0), (0, 0)], style)
                + PathElement::new(vec![(0, 0), (4, 0)], style)
        })
        .collect()
}

fn draw_line_plot<X>(
    root: &DrawingArea<BitMapBackend<'_>, Shift>,
    plot: &LinePlot,
    x: X,
    y: Range<f64>,
    y2: Option<Range<f64>>,
) -> std::result::Result<(), String>
where
    X: AsRangedCoord<Value = f64> + Clone,
    X::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let s = |e: DrawingAreaErrorKind<_>| e.to_string();
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(&plot.title, font(22))
        .margin(15)
        .x_label_area_size(50)
        .y_label_area_size(75);
    if y2.is_some() {
        builder.right_y_label_area_size(75);
    }
    let y_ticks = ticks_for(&y);
    let mut chart = builder.build_cartesian_2d(x.clone(), y).map_err(s)?;
    let x_range = chart.x_range();
    let x_ticks = ticks_for(&x_range);
    let secondary = match (&plot.secondary, y2) {
        (Some((label, series)), Some(y2)) => Some((label, series, y2)),
        _ => None,
    };
    let Some((y2_label, secondary, y2)) = secondary else {
        configure_mesh(&mut chart, &plot.x_label, &plot.y_label, &x_ticks, &y_ticks)?;
        draw_primary(&mut chart, plot)?;
        if plot.series.len() > 1 {
            let position = legend_position(&chart, &plot.series, &[]);
            legend(&mut chart, position)?;
        }
        return Ok(());
    };
    // The secondary coordinates take the right-hand label area before the primary mesh is
    // drawn, so the primary labels stay on the left.
    let y2_ticks = ticks_for(&y2);
    let mut chart = chart.set_secondary_coord(x, y2);
    configure_mesh(&mut chart, &plot.x_label, &plot.y_label, &x_ticks, &y_ticks)?;
    chart
        .configure_secondary_axes()
        .y_desc(y2_label.as_str())
        .label_style(font(13))
        .axis_desc_style(font(15))
        .y_label_formatter(&y2_ticks)
        .draw()
        .map_err(s)?;
    draw_primary(&mut chart, plot)?;
    for (j, series) in secondary.iter().enumerate() {
        let c = colour(plot.series.len() + j);
        chart
            .draw_secondary_series(error_lines(series, c))
            .map_err(s)?;
        chart
            .draw_secondary_series(error_caps(series, c))
            .map_err(s)?;
        chart
            .draw_secondary_series(DashedLineSeries::new(
                series.points.iter().copied(),
                7,
                5,
                c.stroke_width(2),
            ))
            .map_err(s)?
            .label(series.name.as_str())
            .legend(legend_line(c, true));
        chart
            .draw_secondary_series(series.points.iter().map(|&p| Circle::new(p, 3, c.filled())))
            .map_err(s)?;
    }
    if plot.series.len() + secondary.len() > 1 {
        let fractions = secondary_fractions(&chart, secondary);
        let position = legend_position(&chart, &plot.series, &fractions);
        legend(&mut chart, position)?;
    }
    Ok(())
}

/// Axis descriptions, tick labels and a light grid.
fn configure_mesh<'a, DB: DrawingBackend, X, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    x_label: &str,
    y_label: &str,
    x_ticks: &dyn Fn(&f64) -> String,
    y_ticks: &dyn Fn(&f64) -> String,
) -> std::result::Result<(), String>
where
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .label_style(font(13))
        .axis_desc_style(font(15))
        .x_label_formatter(x_ticks)
        .y_label_formatter(y_ticks)
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(210, 210, 210))
        .draw()
        .map_err(|e| e.to_string())
}

/// The primary series: error bars, a solid line and point markers each.
fn draw_primary<'a, DB: DrawingBackend + 'a, X, Y>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<X, Y>>,
    plot: &LinePlot,
) -> std::result::Result<(), String>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let s = |e: DrawingAreaErrorKind<_>| e.to_string();
    for (i, series) in plot.series.iter().enumerate() {
        let c = colour(i);
        chart.draw_series(error_lines(series, c)).map_err(s)?;
        chart.draw_series(error_caps(series, c)).map_err(s)?;
        chart
            .draw_series(LineSeries::new(
                series.points.iter().copied(),
                c.stroke_width(2),
            ))
            .map_err(s)?
            .label(series.name.as_str())
            .legend(legend_line(c, false));
        chart
            .draw_series(series.points.iter().map(|&p| Circle::new(p, 3, c.filled())))
            .map_err(s)?;
    }
    Ok(())
}

/// A rectangle in plot-area fractions: `[x0, x1] × [y0, y1]`, (0, 0) bottom left.
type Extent = [f64; 4];

/// Where a point lies in the plotting area, as fractions of its width and height.
fn fraction<DB: DrawingBackend, X, Y>(
    chart: &ChartContext<'_, DB, Cartesian2d<X, Y>>,
    point: (f64, f64),
) -> (f64, f64)
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let (px, py) = chart.backend_coord(&point);
    let (x_px, y_px) = chart.plotting_area().get_pixel_range();
    let fx = f64::from(px - x_px.start) / f64::from((x_px.end - x_px.start).max(1));
    let fy = f64::from(y_px.end - py) / f64::from((y_px.end - y_px.start).max(1));
    (fx, fy)
}

/// The extents (in plot-area fractions) of each point with its error bar.
fn point_fractions<DB: DrawingBackend, X, Y>(
    chart: &ChartContext<'_, DB, Cartesian2d<X, Y>>,
    series: &[Series],
) -> Vec<Extent>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    series
        .iter()
        .flat_map(|s| {
            s.points.iter().enumerate().map(move |(i, &(x, y))| {
                let e = s
                    .err
                    .as_ref()
                    .and_then(|e| e.get(i))
                    .copied()
                    .unwrap_or(0.0);
                let (fx, lo) = fraction(chart, (x, y - e));
                let (_, hi) = fraction(chart, (x, y + e));
                [fx, fx, lo.min(hi), lo.max(hi)]
            })
        })
        .collect()
}

fn secondary_fractions<'a, DB: DrawingBackend, X, Y, SX, SY>(
    chart: &DualCoordChartContext<'a, DB, Cartesian2d<X, Y>, Cartesian2d<SX, SY>>,
    series: &[Series],
) -> Vec<Extent>
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
    SX: Ranged<ValueType = f64>,
    SY: Ranged<ValueType = f64>,
{
    point_fractions(chart.borrow_secondary(), series)
}

/// The corner of the plotting area whose legend-sized box (35 % × 30 %) covers the fewest
/// drawn items (upper right on ties, then upper left, lower right, lower left).
fn corner_with_fewest(extents: &[Extent]) -> SeriesLabelPosition {
    let boxes: [(SeriesLabelPosition, Extent); 4] = [
        (SeriesLabelPosition::UpperRight, [0.65, 1.0, 0.7, 1.0]),
        (SeriesLabelPosition::UpperLeft, [0.0, 0.35, 0.7, 1.0]),
        (SeriesLabelPosition::LowerRight, [0.65, 1.0, 0.0, 0.3]),
        (SeriesLabelPosition::LowerLeft, [0.0, 0.35, 0.0, 0.3]),
    ];
    let covered = |b: &Extent| {
        extents
            .iter()
            .filter(|e| e[0] <= b[1] && b[0] <= e[1] && e[2] <= b[3] && b[2] <= e[3])
            .count()
    };
    let mut best = SeriesLabelPosition::UpperRight;
    let mut fewest = usize::MAX;
    for (position, b) in boxes {
        let n = covered(&b);
        if n < fewest {
            fewest = n;
            best = position;
        }
    }
    best
}

fn legend_position<DB: DrawingBackend, X, Y>(
    chart: &ChartContext<'_, DB, Cartesian2d<X, Y>>,
    series: &[Series],
    more: &[Extent],
) -> SeriesLabelPosition
where
    X: Ranged<ValueType = f64>,
    Y: Ranged<ValueType = f64>,
{
    let mut extents = point_fractions(chart, series);
    extents.extend_from_slice(more);
    corner_with_fewest(&extents)
}

/// The legend box (white background, thin border) at `position`.
fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> std::result::Result<(), String> {
    chart
        .configure_series_labels()
        .position(position)
        .label_font(font(13))
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(160, 160, 160))
        .draw()
        .map_err(|e| e.to_string())
}

/// How many categories one x label spans (1: every category is labelled), and how many
/// characters a label may have, so that labels of about 7 pixels per character do not
/// overlap.
fn label_layout(categories: &[String]) -> (usize, usize) {
    const PLOT_PX: f64 = 680.0;
    const CHAR_PX: f64 = 7.5;
    let n = categories.len().max(1);
    let per_category = PLOT_PX / n as f64;
    let longest = categories
        .iter()
        .map(|c| c.chars().count())
        .max()
        .unwrap_or(1)
        .clamp(1, 16);
    let stride = ((longest as f64 * CHAR_PX + 6.0) / per_category)
        .ceil()
        .max(1.0) as usize;
    let chars = (((stride as f64 * per_category) - 6.0) / CHAR_PX)
        .floor()
        .max(1.0) as usize;
    (stride, chars)
}

fn truncate(label: &str, chars: usize) -> String {
    if label.chars().count() <= chars {
        label.to_string()
    } else {
        let mut out: String = label.chars().take(chars.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

/// Draws a grouped bar plot as an 800×500 PNG at `path` (see [`BarPlot`]), creating the
/// folder when missing. Bars start at 0;
/// the y range covers 0 and every bar with its whisker, with a small margin away from 0. With
/// many categories only every k-th is labelled, and long names are shortened with `…`.
///
/// # Errors
/// [`ReportError::Empty`] for no categories or groups, [`ReportError::LengthMismatch`] when a
/// group does not have one point per category or `err` does not have one value per point,
/// [`ReportError::InvalidValue`] for a NaN or infinite height or a negative or non-finite
/// whisker, [`ReportError::Draw`], [`ReportError::Png`] or [`ReportError::Io`] when drawing,
/// encoding or writing fails.
pub fn bar_plot(path: &Path, plot: &BarPlot) -> Result<()> {
    if plot.categories.is_empty() {
        return Err(ReportError::Empty {
            what: "bar plot categories".into(),
        });
    }
    check_all("bar plot", &plot.groups, false, false)?;
    if let Some(group) = plot
        .groups
        .iter()
        .find(|g| g.points.len() != plot.categories.len())
    {
        return Err(ReportError::LengthMismatch {
            what: format!("bar plot categories and series {:?} points", group.name),
            left: plot.categories.len(),
            right: group.points.len(),
        });
    }
    let Some((lo, hi)) = extent(y_values(&plot.groups).chain([0.0])) else {
        return Err(ReportError::Empty {
            what: "bar plot groups".into(),
        });
    };
    let padded = linear_range("y range", lo, hi)?;
    // Bars grow from 0: no margin on the far side of 0.
    let y = if lo >= 0.0 { 0.0 } else { padded.start }..if hi <= 0.0 { 0.0 } else { padded.end };
    render(path, |root| draw_bar_plot(root, plot, y))
}

/// The x axis of a bar plot: linear over `[-0.5, n − 0.5]`, ticks only at the labelled
/// categories (their labels come from a formatter).
struct CategoryAxis {
    inner: RangedCoordf64,
    keys: Vec<f64>,
}

impl Ranged for CategoryAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.inner.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, _hint: Hint) -> Vec<f64> {
        self.keys.clone()
    }

    fn range(&self) -> Range<f64> {
        self.inner.range()
    }
}

fn draw_bar_plot(
    root: &DrawingArea<BitMapBackend<'_>, Shift>,
    plot: &BarPlot,
    y: Range<f64>,
) -> std::result::Result<(), String> {
    let s = |e: DrawingAreaErrorKind<_>| e.to_string();
    let n = plot.categories.len();
    let (stride, chars) = label_layout(&plot.categories);
    let keys: Vec<f64> = (0..n).step_by(stride).map(|i| i as f64).collect();
    let x = CategoryAxis {
        inner: (-0.5..n as f64 - 0.5).into(),
        keys,
    };
    let name_of = |v: &f64| {
        let i = v.round();
        if i >= 0.0 {
            plot.categories
                .get(i as usize)
                .map(|c| truncate(c, chars))
                .unwrap_or_default()
        } else {
            String::new()
        }
    };
    let y_ticks = ticks_for(&y);
    let mut chart = ChartBuilder::on(root)
        .caption(&plot.title, font(22))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(75)
        .build_cartesian_2d(x, y)
        .map_err(s)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(plot.y_label.as_str())
        .label_style(font(13))
        .axis_desc_style(font(15))
        .x_label_formatter(&name_of)
        .y_label_formatter(&y_ticks)
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(210, 210, 210))
        .draw()
        .map_err(s)?;
    let groups = plot.groups.len();
    let width = 0.8 / groups as f64;
    let gap = 0.06 * width;
    for (j, group) in plot.groups.iter().enumerate() {
        let c = colour(j);
        let left = |i: usize| i as f64 - 0.4 + j as f64 * width;
        chart
            .draw_series(group.points.iter().enumerate().map(|(i, &(_, h))| {
                Rectangle::new(
                    [(left(i) + gap, 0.0), (left(i) + width - gap, h)],
                    c.filled(),
                )
            }))
            .map_err(s)?
            .label(group.name.as_str())
            .legend(move |(px, py)| Rectangle::new([(px, py - 5), (px + 14, py + 5)], c.filled()));
        if let Some(err) = &group.err {
            let whisker = BLACK.stroke_width(1);
            let cap = (width - 2.0 * gap) * 0.25;
            chart
                .draw_series(group.points.iter().zip(err).enumerate().flat_map(
                    |(i, (&(_, h), &e))| {
                        let xc = left(i) + width / 2.0;
                        [
                            PathElement::new(vec![(xc, h - e), (xc, h + e)], whisker),
                            PathElement::new(vec![(xc - cap, h - e), (xc + cap, h - e)], whisker),
                            PathElement::new(vec![(xc - cap, h + e), (xc + cap, h + e)], whisker),
                        ]
                    },
                ))
                .map_err(s)?;
        }
    }
    if groups > 1 {
        let extents: Vec<Extent> = plot
            .groups
            .iter()
            .enumerate()
            .flat_map(|(j, group)| {
                let chart = &chart;
                group.points.iter().enumerate().map(move |(i, &(_, h))| {
                    let left = i as f64 - 0.4 + j as f64 * width;
                    let (x0, y0) = fraction(chart, (left, 0.0));
                    let (x1, y1) = fraction(chart, (left + width, h));
                    [x0.min(x1), x0.max(x1), y0.min(y1), y0.max(y1)]
                })
            })
            .collect();
        legend(&mut chart, corner_with_fewest(&extents))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_short_and_zero_is_zero() {
        assert_eq!(tick(1.0), "1");
        assert_eq!(tick(-2.5), "-2.5");
        assert_eq!(tick(0.123456), "0.1235");
        assert_eq!(tick(1e7), "1.0e7");
        assert_eq!(tick(-0.00001), "-1.0e-5");
        assert_eq!(tick(0.0), "0");
        let t = ticks_for(&(-1.0..1.0));
        assert_eq!(t(&(0.1 + 0.2 - 0.3)), "0");
        assert_eq!(t(&0.2), "0.2");
        let tiny = ticks_for(&(0.0..1e-12));
        assert_eq!(tiny(&5e-13), "5.0e-13");
    }

    #[test]
    fn ranges_have_margins_and_never_zero_width() {
        let r = linear_range("y", 0.0, 10.0).unwrap();
        assert!((r.start + 0.5).abs() < 1e-12 && (r.end - 10.5).abs() < 1e-12);
        let r = linear_range("y", 5.0, 5.0).unwrap();
        assert!((r.start - 4.5).abs() < 1e-12 && (r.end - 5.5).abs() < 1e-12);
        let r = linear_range("y", 0.0, 0.0).unwrap();
        assert_eq!((r.start, r.end), (-1.0, 1.0));
        assert!(linear_range("y", -f64::MAX, f64::MAX).is_err());
        let r = log_range(4.0, 4.0).unwrap();
        assert_eq!((r.start, r.end), (2.0, 8.0));
        let r = log_range(1.0, 100.0).unwrap();
        assert!((r.start - 10f64.powf(-0.1)).abs() < 1e-12);
        assert!((r.end - 10f64.powf(2.1)).abs() < 1e-9);
        assert!(log_range(f64::MIN_POSITIVE, f64::MAX).is_err());
    }

    #[test]
    fn legend_goes_to_the_emptiest_corner() {
        let at = |x: f64, y: f64| [x, x, y, y];
        assert!(matches!(
            corner_with_fewest(&[]),
            SeriesLabelPosition::UpperRight
        ));
        let rising = [at(0.1, 0.1), at(0.5, 0.5), at(0.9, 0.9)];
        assert!(matches!(
            corner_with_fewest(&rising),
            SeriesLabelPosition::UpperLeft
        ));
        let high = [at(0.1, 0.9), at(0.5, 0.95), at(0.9, 0.9)];
        assert!(matches!(
            corner_with_fewest(&high),
            SeriesLabelPosition::LowerRight
        ));
    }

    #[test]
    fn labels_thin_out_and_shorten() {
        let few: Vec<String> = (0..4).map(|i| format!("expert {i}")).collect();
        assert_eq!(label_layout(&few).0, 1);
        let many: Vec<String> = (0..64).map(|i| format!("layer {i}")).collect();
        let (stride, chars) = label_layout(&many);
        assert!(stride > 1 && chars >= "layer 63".len(), "{stride} {chars}");
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("abc", 4), "abc");
    }
}
