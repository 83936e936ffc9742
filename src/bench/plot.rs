//! Rendering benchmark figures to SVG.
//!
//! This module owns turning already-measured numbers into a picture: line panels
//! (optionally log-scaled on either axis) and stacked-bar panels, stacked vertically
//! into one SVG document. It does no measuring, and no I/O other than writing the one
//! file asked for; the document is built in memory and written only once rendering
//! has succeeded, so a failed render leaves no partial file behind.
//!
//! Input is treated defensively: non-finite points (and non-positive ones on a log
//! axis) are skipped, degenerate ranges are widened, and every failure comes back as
//! an `Err(String)` rather than a panic.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// One line of a line panel.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text for this line.
    pub label: String,
    /// `(x, y)` points, drawn in the order given.
    pub points: Vec<(f64, f64)>,
}

/// One stacked bar: a label on the x axis and (segment label, value) pairs stacked bottom-up.
#[derive(Debug, Clone, PartialEq)]
pub struct StackedBar {
    /// Text under the bar on the x axis.
    pub label: String,
    /// `(segment label, value)` pairs, stacked bottom-up in the order given.
    pub segments: Vec<(String, f64)>,
}

/// One chart of a figure.
#[derive(Debug, Clone, PartialEq)]
pub enum Panel {
    /// A line chart with one line per series.
    Lines {
        /// Caption above the chart.
        title: String,
        /// X axis description.
        x_label: String,
        /// Y axis description.
        y_label: String,
        /// Log-scale the x axis (points with `x <= 0` are skipped).
        log_x: bool,
        /// Log-scale the y axis (points with `y <= 0` are skipped).
        log_y: bool,
        /// The lines, coloured by index.
        series: Vec<Series>,
    },
    /// A stacked bar chart; segments are coloured by label, consistently across bars.
    Bars {
        /// Caption above the chart.
        title: String,
        /// Y axis description.
        y_label: String,
        /// The bars, left to right.
        bars: Vec<StackedBar>,
    },
}

/// Width of every panel, in pixels.
const PANEL_WIDTH: u32 = 800;
/// Height of every panel, in pixels.
const PANEL_HEIGHT: u32 = 360;
/// Width of the strip right of each chart that holds its legend, in pixels.
const LEGEND_WIDTH: u32 = 170;
/// Vertical distance between legend entries, in pixels.
const LEGEND_ROW: i32 = 18;
/// Most panels one figure may hold (keeps the document height well inside `u32`/`i32`).
const MAX_PANELS: usize = 1000;

/// Colour cycle (Tableau 10): series index / segment-label index `i` gets `PALETTE[i % 10]`.
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

fn colour(index: usize) -> RGBColor {
    PALETTE[index % PALETTE.len()]
}

/// Renders the panels stacked vertically (each ~800x360 px) into one SVG file at `path`.
pub fn render_svg(path: &Path, panels: &[Panel]) -> Result<(), String> {
    if panels.is_empty() {
        return Err("render_svg: no panels to render".to_string());
    }
    if panels.len() > MAX_PANELS {
        return Err(format!(
            "render_svg: {} panels is more than the {MAX_PANELS} one figure may hold",
            panels.len()
        ));
    }
    // Bounded by MAX_PANELS above, so this cannot overflow.
    let height = PANEL_HEIGHT * panels.len() as u32;

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (PANEL_WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let areas = root.split_evenly((panels.len(), 1));
        for (index, (panel, area)) in panels.iter().zip(areas.iter()).enumerate() {
            draw_panel(area, panel).map_err(|e| format!("render_svg: panel {index}: {e}"))?;
        }
        root.present().map_err(draw_err)?;
    }
    std::fs::write(path, svg).map_err(|e| format!("render_svg: writing {}: {e}", path.display()))
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

fn draw_err<E: std::fmt::Display>(e: E) -> String {
    format!("drawing failed: {e}")
}

fn draw_panel(area: &Area<'_>, panel: &Panel) -> Result<(), String> {
    match panel {
        Panel::Lines {
            title,
            x_label,
            y_label,
            log_x,
            log_y,
            series,
        } => draw_lines(area, title, x_label, y_label, *log_x, *log_y, series),
        Panel::Bars {
            title,
            y_label,
            bars,
        } => draw_bars(area, title, y_label, bars),
    }
}

/// A line's label and the points of it that can be drawn on the chosen axes.
struct Cleaned<'s> {
    label: &'s str,
    points: Vec<(f64, f64)>,
}

fn draw_lines(
    area: &Area<'_>,
    title: &str,
    x_label: &str,
    y_label: &str,
    log_x: bool,
    log_y: bool,
    series: &[Series],
) -> Result<(), String> {
    let cleaned: Vec<Cleaned<'_>> = series
        .iter()
        .map(|s| Cleaned {
            label: &s.label,
            points: s
                .points
                .iter()
                .copied()
                .filter(|&(x, y)| {
                    x.is_finite() && y.is_finite() && (!log_x || x > 0.0) && (!log_y || y > 0.0)
                })
                .collect(),
        })
        .collect();
    let xs = cleaned.iter().flat_map(|c| c.points.iter().map(|p| p.0));
    let ys = cleaned.iter().flat_map(|c| c.points.iter().map(|p| p.1));
    let x_range = axis_range(xs, log_x, false).map_err(|e| format!("x axis: {e}"))?;
    let y_range = axis_range(ys, log_y, true).map_err(|e| format!("y axis: {e}"))?;
    let labels = AxisLabels {
        title,
        x_label,
        y_label,
    };
    match (log_x, log_y) {
        (false, false) => line_chart(area, &labels, x_range, y_range, &cleaned),
        (true, false) => line_chart(area, &labels, x_range.log_scale(), y_range, &cleaned),
        (false, true) => line_chart(area, &labels, x_range, y_range.log_scale(), &cleaned),
        (true, true) => line_chart(
            area,
            &labels,
            x_range.log_scale(),
            y_range.log_scale(),
            &cleaned,
        ),
    }
}

struct AxisLabels<'s> {
    title: &'s str,
    x_label: &'s str,
    y_label: &'s str,
}

fn line_chart<X, Y>(
    area: &Area<'_>,
    labels: &AxisLabels<'_>,
    x_spec: X,
    y_spec: Y,
    series: &[Cleaned<'_>],
) -> Result<(), String>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let (plot_area, legend_area) = split_panel(area, labels.title)?;
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(12)
        .margin_right(24)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x_spec, y_spec)
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .x_desc(labels.x_label)
        .y_desc(labels.y_label)
        .draw()
        .map_err(draw_err)?;
    for (index, line) in series.iter().enumerate() {
        let color = colour(index);
        chart
            .draw_series(LineSeries::new(
                line.points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(draw_err)?;
        // Markers, so a single point (or a sparse line) is still visible.
        chart
            .draw_series(
                line.points
                    .iter()
                    .map(|&p| Circle::new(p, 3, color.filled())),
            )
            .map_err(draw_err)?;
    }
    let entries: Vec<&str> = series.iter().map(|line| line.label).collect();
    draw_legend(&legend_area, &entries, Swatch::Line)
}

/// One drawn segment: colour index (by segment label) and its rectangle in data coordinates.
struct Segment {
    label_index: usize,
    x0: f64,
    x1: f64,
    y0: f64,
    y1: f64,
}

/// Half the width of a bar, in x-axis units (bars sit at 0, 1, 2, ...).
const BAR_HALF_WIDTH: f64 = 0.35;

fn draw_bars(
    area: &Area<'_>,
    title: &str,
    y_label: &str,
    bars: &[StackedBar],
) -> Result<(), String> {
    // Segment labels in first-seen order; the index picks the colour, so the same label
    // gets the same colour in every bar.
    let mut segment_labels: Vec<&str> = Vec::new();
    let mut label_index: HashMap<&str, usize> = HashMap::new();
    let mut segments: Vec<Segment> = Vec::new();
    let (mut lowest, mut highest) = (0.0_f64, 0.0_f64);
    for (i, bar) in bars.iter().enumerate() {
        let centre = i as f64;
        let (mut up, mut down) = (0.0_f64, 0.0_f64);
        for (label, value) in &bar.segments {
            let index = *label_index.entry(label.as_str()).or_insert_with(|| {
                segment_labels.push(label.as_str());
                segment_labels.len() - 1
            });
            if !value.is_finite() || *value == 0.0 {
                continue;
            }
            // Positive values stack up from zero, negative ones down from zero.
            let (y0, y1) = if *value > 0.0 {
                let base = up;
                up += value;
                (base, up)
            } else {
                let base = down;
                down += value;
                (base, down)
            };
            segments.push(Segment {
                label_index: index,
                x0: centre - BAR_HALF_WIDTH,
                x1: centre + BAR_HALF_WIDTH,
                y0,
                y1,
            });
        }
        lowest = lowest.min(down);
        highest = highest.max(up);
    }
    if !lowest.is_finite() || !highest.is_finite() || !(highest - lowest).is_finite() {
        return Err("bar totals overflow f64".to_string());
    }
    let y_range = if highest > lowest {
        let pad = (highest - lowest) * 0.05;
        let low = if lowest < 0.0 { lowest - pad } else { 0.0 };
        let high = if highest > 0.0 { highest + pad } else { 0.0 };
        low..high
    } else {
        0.0..1.0
    };
    let x_range = -0.5..(bars.len().max(1) as f64 - 0.5);

    let bar_labels: Vec<&str> = bars.iter().map(|b| b.label.as_str()).collect();
    let format_x = |v: &f64| -> String {
        let nearest = v.round();
        if (v - nearest).abs() > 1e-6 || nearest < 0.0 {
            return String::new();
        }
        bar_labels
            .get(nearest as usize)
            .map(|s| s.to_string())
            .unwrap_or_default()
    };

    let (plot_area, legend_area) = split_panel(area, title)?;
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(12)
        .margin_right(24)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x_range, y_range)
        .map_err(draw_err)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len().max(1))
        .x_label_formatter(&format_x)
        .y_desc(y_label)
        .draw()
        .map_err(draw_err)?;
    for index in 0..segment_labels.len() {
        let color = colour(index);
        chart
            .draw_series(
                segments
                    .iter()
                    .filter(|s| s.label_index == index)
                    .map(|s| Rectangle::new([(s.x0, s.y0), (s.x1, s.y1)], color.filled())),
            )
            .map_err(draw_err)?;
    }
    draw_legend(&legend_area, &segment_labels, Swatch::Block)
}

/// Draws the panel title across the whole panel and splits what is left into the chart
/// area (left) and the legend strip (right).
fn split_panel<'a>(area: &Area<'a>, title: &str) -> Result<(Area<'a>, Area<'a>), String> {
    let body = area
        .titled(title, ("sans-serif", 20).into_font())
        .map_err(draw_err)?;
    let width = body.dim_in_pixel().0;
    let chart_width = width.saturating_sub(LEGEND_WIDTH).max(1);
    Ok(body.split_horizontally(chart_width))
}

/// What a legend entry's colour sample looks like.
#[derive(Clone, Copy)]
enum Swatch {
    /// A short line, for line series.
    Line,
    /// A filled square, for bar segments.
    Block,
}

/// Draws `labels` top-down in `area`, entry `i` in `colour(i)`; entries that do not fit
/// are summarised as "+N more" so the legend never spills into the next panel.
fn draw_legend(area: &Area<'_>, labels: &[&str], swatch: Swatch) -> Result<(), String> {
    if labels.is_empty() {
        return Ok(());
    }
    let height = i32::try_from(area.dim_in_pixel().1).unwrap_or(i32::MAX);
    let top = 20;
    let rows = usize::try_from(((height - top - 10) / LEGEND_ROW).max(1)).unwrap_or(1);
    let (shown, hidden) = if labels.len() > rows {
        (
            rows.saturating_sub(1),
            labels.len() - rows.saturating_sub(1),
        )
    } else {
        (labels.len(), 0)
    };
    let text_style =
        TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    let mut y = top;
    for (index, label) in labels.iter().take(shown).enumerate() {
        let color = colour(index);
        match swatch {
            Swatch::Line => area.draw(&PathElement::new(
                vec![(6, y), (28, y)],
                color.stroke_width(2),
            )),
            Swatch::Block => area.draw(&Rectangle::new([(10, y - 6), (22, y + 6)], color.filled())),
        }
        .map_err(draw_err)?;
        area.draw(&Text::new(label.to_string(), (34, y), text_style.clone()))
            .map_err(draw_err)?;
        y += LEGEND_ROW;
    }
    if hidden > 0 {
        area.draw(&Text::new(format!("+{hidden} more"), (34, y), text_style))
            .map_err(draw_err)?;
    }
    Ok(())
}

/// The axis range covering `values` (already filtered: finite, and positive on a log axis).
///
/// No values gives a default range; a single value (or all-equal values) is widened to a
/// non-zero span. Log ranges are widened to whole decades so the axis always has ticks.
/// `pad` adds 5% headroom on a linear axis.
fn axis_range(
    values: impl Iterator<Item = f64>,
    log: bool,
    pad: bool,
) -> Result<Range<f64>, String> {
    let mut bounds: Option<(f64, f64)> = None;
    for v in values {
        bounds = Some(match bounds {
            None => (v, v),
            Some((lo, hi)) => (lo.min(v), hi.max(v)),
        });
    }
    let Some((lo, hi)) = bounds else {
        return Ok(if log { 1.0..10.0 } else { 0.0..1.0 });
    };
    let range = if log {
        if lo <= 0.0 {
            return Err(format!("log axis needs positive values, got {lo}"));
        }
        let mut low = decade(lo, f64::floor).unwrap_or(lo);
        let mut high = decade(hi, f64::ceil).unwrap_or(hi);
        if high <= low {
            if (low * 10.0).is_finite() {
                high = low * 10.0;
            } else {
                low /= 10.0;
            }
        }
        low..high
    } else {
        let span = hi - lo;
        if !span.is_finite() {
            return Err(format!("values from {lo} to {hi} span more than f64 holds"));
        }
        let magnitude = lo.abs().max(hi.abs());
        if span <= magnitude * 1e-12 {
            let half = if magnitude == 0.0 {
                1.0
            } else {
                magnitude * 0.1
            };
            (lo - half)..(hi + half)
        } else if pad {
            let extra = span * 0.05;
            (lo - extra)..(hi + extra)
        } else {
            lo..hi
        }
    };
    // On a log axis the ratio must be finite too: plotters' log tick search loops on the
    // number of decades, and an infinite ratio would make that loop effectively endless.
    let ok = range.start.is_finite()
        && range.end.is_finite()
        && range.end > range.start
        && (!log || (range.start > 0.0 && (range.end / range.start).is_finite()));
    if ok {
        Ok(range)
    } else {
        Err(format!("cannot build an axis for values from {lo} to {hi}"))
    }
}

/// `10^round(log10(v))` with `round` = floor or ceil, when that is a usable positive finite number.
fn decade(v: f64, round: fn(f64) -> f64) -> Option<f64> {
    let d = 10f64.powf(round(v.log10()));
    (d.is_finite() && d > 0.0).then_some(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(label: &str, points: &[(f64, f64)]) -> Series {
        Series {
            label: label.to_string(),
            points: points.to_vec(),
        }
    }

    fn lines(title: &str, log_x: bool, log_y: bool, series: Vec<Series>) -> Panel {
        Panel::Lines {
            title: title.to_string(),
            x_label: "payload bytes".to_string(),
            y_label: "latency us".to_string(),
            log_x,
            log_y,
            series,
        }
    }

    fn bar(label: &str, segments: &[(&str, f64)]) -> StackedBar {
        StackedBar {
            label: label.to_string(),
            segments: segments.iter().map(|(l, v)| (l.to_string(), *v)).collect(),
        }
    }

    /// Renders into a fresh temp dir; returns the SVG text on success.
    fn render(panels: &[Panel]) -> Result<String, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let path = dir.path().join("figure.svg");
        render_svg(&path, panels)?;
        std::fs::read_to_string(&path).map_err(|e| e.to_string())
    }

    fn assert_svg(svg: &str, needles: &[&str]) {
        assert!(
            svg.starts_with("<svg"),
            "not an SVG: {}",
            &svg[..svg.len().min(80)]
        );
        for needle in needles {
            assert!(svg.contains(needle), "SVG lacks {needle:?}");
        }
    }

    #[test]
    fn renders_lines_and_bars_with_titles_and_legends() {
        let panels = vec![
            lines(
                "Latency vs payload",
                true,
                true,
                vec![
                    series("inproc", &[(64.0, 1.5), (1024.0, 3.0), (65536.0, 40.0)]),
                    series("tcp", &[(64.0, 20.0), (1024.0, 25.0), (65536.0, 300.0)]),
                ],
            ),
            lines(
                "Throughput",
                false,
                false,
                vec![series(
                    "msgs-per-sec",
                    &[(1.0, 1000.0), (2.0, 1900.0), (4.0, 3500.0)],
                )],
            ),
            Panel::Bars {
                title: "Time breakdown".to_string(),
                y_label: "ms".to_string(),
                bars: vec![
                    bar("alpha", &[("encode", 1.0), ("send", 2.0), ("decode", 0.5)]),
                    bar("beta", &[("encode", 1.5), ("decode", 0.7), ("send", 1.0)]),
                ],
            },
        ];
        let svg = render(&panels).expect("render");
        assert_svg(
            &svg,
            &[
                "Latency vs payload",
                "Throughput",
                "Time breakdown",
                "inproc",
                "tcp",
                "msgs-per-sec",
                "encode",
                "send",
                "decode",
                "alpha",
                "beta",
                "payload bytes",
                "latency us",
            ],
        );
        // 800 px wide, three 360 px panels.
        assert!(svg.contains("width=\"800\""), "width missing");
        assert!(svg.contains("height=\"1080\""), "height missing");
    }

    #[test]
    fn same_segment_label_same_colour_across_bars() {
        let panel = Panel::Bars {
            title: "Colours".to_string(),
            y_label: "ms".to_string(),
            bars: vec![
                bar("a", &[("x", 1.0), ("y", 1.0)]),
                bar("b", &[("y", 2.0), ("x", 3.0)]),
            ],
        };
        let svg = render(&[panel]).expect("render");
        // Label "x" is first seen, so it takes palette colour 0, "y" colour 1 — in both bars
        // (twice each as bar rectangles, plus once as the legend swatch).
        let first = "fill=\"#1F77B4\"";
        let second = "fill=\"#FF7F0E\"";
        assert!(
            svg.matches(first).count() >= 3,
            "colour 0 used {} times",
            svg.matches(first).count()
        );
        assert!(
            svg.matches(second).count() >= 3,
            "colour 1 used {} times",
            svg.matches(second).count()
        );
    }

    #[test]
    fn long_legends_are_summarised_not_spilled() {
        let many: Vec<Series> = (0..40)
            .map(|i| {
                series(
                    &format!("series-{i}"),
                    &[(1.0, f64::from(i)), (2.0, f64::from(i) + 1.0)],
                )
            })
            .collect();
        let svg = render(&[lines("Crowded", false, false, many)]).expect("render");
        assert_svg(&svg, &["Crowded", "series-0", "series-1", "more"]);
        assert!(
            !svg.contains("series-39"),
            "legend should have been cut short"
        );
    }

    #[test]
    fn empty_panel_list_is_an_error() {
        let err = render(&[]).expect_err("empty list must fail");
        assert!(err.contains("no panels"), "{err}");
    }

    #[test]
    fn unwritable_path_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("no-such-dir").join("figure.svg");
        let panel = lines("t", false, false, vec![series("s", &[(1.0, 2.0)])]);
        let err = render_svg(&path, &[panel]).expect_err("missing directory must fail");
        assert!(err.contains("writing"), "{err}");
    }

    #[test]
    fn lines_with_no_points_draw_an_empty_titled_chart() {
        let svg = render(&[
            lines(
                "Nothing yet",
                false,
                false,
                vec![series("empty-series", &[])],
            ),
            lines("No series at all", true, true, vec![]),
        ])
        .expect("empty lines panels are Ok");
        assert_svg(&svg, &["Nothing yet", "No series at all", "empty-series"]);
    }

    #[test]
    fn non_finite_points_are_skipped() {
        let svg = render(&[lines(
            "Odd values",
            false,
            false,
            vec![
                series(
                    "mixed",
                    &[
                        (f64::NAN, 1.0),
                        (1.0, f64::INFINITY),
                        (2.0, 3.0),
                        (f64::NEG_INFINITY, 2.0),
                        (3.0, 4.0),
                    ],
                ),
                series("all-bad", &[(f64::NAN, f64::NAN), (f64::INFINITY, 1.0)]),
            ],
        )])
        .expect("render");
        assert_svg(&svg, &["Odd values", "mixed", "all-bad"]);
        assert!(!svg.contains("NaN"), "NaN leaked into the SVG");
        assert!(!svg.contains("inf"), "inf leaked into the SVG");
    }

    #[test]
    fn single_point_and_all_equal_values_render() {
        for log in [false, true] {
            let svg = render(&[
                lines("One point", log, log, vec![series("solo", &[(5.0, 7.0)])]),
                lines(
                    "Flat",
                    log,
                    log,
                    vec![series("flat", &[(2.0, 3.0), (2.0, 3.0), (2.0, 3.0)])],
                ),
                lines("Zeros", false, false, vec![series("zero", &[(0.0, 0.0)])]),
            ])
            .expect("render");
            assert_svg(&svg, &["One point", "solo", "Flat", "flat", "Zeros"]);
            assert!(!svg.contains("NaN"), "NaN leaked into the SVG (log={log})");
        }
    }

    #[test]
    fn log_axes_skip_non_positive_values() {
        let svg = render(&[
            lines(
                "Log with junk",
                true,
                true,
                vec![series(
                    "some-positive",
                    &[
                        (0.0, 1.0),
                        (-3.0, 2.0),
                        (10.0, -1.0),
                        (10.0, 0.0),
                        (100.0, 5.0),
                        (1000.0, 50.0),
                    ],
                )],
            ),
            lines(
                "Log all non-positive",
                true,
                false,
                vec![series("none-positive", &[(0.0, 1.0), (-1.0, 2.0)])],
            ),
        ])
        .expect("render");
        assert_svg(
            &svg,
            &["Log with junk", "some-positive", "Log all non-positive"],
        );
        assert!(!svg.contains("NaN"), "NaN leaked into the SVG");
    }

    #[test]
    fn extreme_magnitudes_do_not_panic() {
        // Either outcome is fine; what matters is no panic.
        let _ = render(&[lines(
            "Huge span",
            false,
            false,
            vec![series(
                "huge",
                &[(-f64::MAX, -f64::MAX), (f64::MAX, f64::MAX)],
            )],
        )]);
        let err = render(&[lines(
            "Tiny and huge on log",
            true,
            true,
            vec![series(
                "edges",
                &[(f64::MIN_POSITIVE, 5e-324), (f64::MAX, f64::MAX)],
            )],
        )])
        .expect_err("a log axis of infinite ratio must fail");
        assert!(err.contains("axis"), "{err}");
        let svg = render(&[lines(
            "Wide but finite on log",
            true,
            true,
            vec![series("wide", &[(1e-150, 1e-150), (1e150, 1e150)])],
        )])
        .expect("wide log range renders");
        assert_svg(&svg, &["Wide but finite on log", "wide"]);
        let svg = render(&[lines(
            "Huge but equal",
            false,
            false,
            vec![series("big", &[(1e300, 1e300)])],
        )])
        .expect("huge equal values render");
        assert_svg(&svg, &["Huge but equal", "big"]);
    }

    #[test]
    fn bar_edge_cases_render() {
        let svg = render(&[
            Panel::Bars {
                title: "No bars".to_string(),
                y_label: "ms".to_string(),
                bars: vec![],
            },
            Panel::Bars {
                title: "Odd bars".to_string(),
                y_label: "ms".to_string(),
                bars: vec![
                    bar("only-nan", &[("nan-seg", f64::NAN)]),
                    bar("zeros", &[("zero-seg", 0.0)]),
                    bar("mixed-sign", &[("up", 2.0), ("down", -1.0)]),
                    bar("empty", &[]),
                ],
            },
            Panel::Bars {
                title: "All zero".to_string(),
                y_label: "ms".to_string(),
                bars: vec![bar("z", &[("zero-seg", 0.0)])],
            },
        ])
        .expect("render");
        assert_svg(
            &svg,
            &[
                "No bars",
                "Odd bars",
                "All zero",
                "up",
                "down",
                "mixed-sign",
                "only-nan",
            ],
        );
        assert!(!svg.contains("NaN"), "NaN leaked into the SVG");
    }

    #[test]
    fn bar_totals_overflowing_is_an_error() {
        let err = render(&[Panel::Bars {
            title: "Overflow".to_string(),
            y_label: "ms".to_string(),
            bars: vec![bar("big", &[("a", f64::MAX), ("b", f64::MAX)])],
        }])
        .expect_err("overflowing totals must fail");
        assert!(err.contains("overflow"), "{err}");
    }

    #[test]
    fn axis_range_is_never_empty() {
        for (values, log) in [
            (vec![], false),
            (vec![], true),
            (vec![3.0], false),
            (vec![3.0], true),
            (vec![0.0, 0.0], false),
            (vec![1000.0, 1000.0], true),
            (vec![-2.0, 5.0], false),
        ] {
            let r = axis_range(values.iter().copied(), log, true).expect("range");
            assert!(r.end > r.start, "{values:?} log={log} gave {r:?}");
            if log {
                assert!(r.start > 0.0, "{values:?} gave {r:?}");
            }
        }
        assert!(axis_range([0.0].into_iter(), true, false).is_err());
        assert!(axis_range([-f64::MAX, f64::MAX].into_iter(), false, false).is_err());
    }
}
