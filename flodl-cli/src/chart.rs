//! A small SVG line chart: axes with rounded ticks, one polyline per series, and a legend.

use std::fmt::Write as _;

/// Colours given to series in order (colour-blind friendly palette).
pub(crate) const PALETTE: [&str; 8] =
    ["#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#f0e442", "#000000"];

const WIDTH: f64 = 560.0;
const HEIGHT: f64 = 300.0;
const MARGIN_LEFT: f64 = 64.0;
const MARGIN_RIGHT: f64 = 16.0;
const MARGIN_TOP: f64 = 34.0;
const MARGIN_BOTTOM: f64 = 62.0;

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Style {
    /// A polyline through the points, with a dot on each point when there are few.
    Line,
    /// A step line: each value holds until the next point.
    Step,
    /// Dots only (discrete events).
    Dots,
}

/// One named sequence of (x, y) points.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    name: String,
    points: Vec<(f64, f64)>,
    style: Style,
}

impl Series {
    /// A series; non-finite points are dropped.
    pub(crate) fn new(name: impl Into<String>, points: Vec<(f64, f64)>, style: Style) -> Self {
        let points = points.into_iter().filter(|(x, y)| x.is_finite() && y.is_finite()).collect();
        Self { name: name.into(), points, style }
    }
}

/// A line chart with a title, axis labels and any number of series.
#[derive(Debug, Clone)]
pub(crate) struct LineChart {
    title: String,
    x_label: String,
    y_label: String,
    series: Vec<Series>,
    y_from_zero: bool,
}

impl LineChart {
    /// An empty chart.
    pub(crate) fn new(title: &str, x_label: &str, y_label: &str) -> Self {
        Self {
            title: title.to_owned(),
            x_label: x_label.to_owned(),
            y_label: y_label.to_owned(),
            series: Vec::new(),
            y_from_zero: false,
        }
    }

    /// Makes the y axis start at zero (for counts and shares).
    pub(crate) fn y_from_zero(mut self) -> Self {
        self.y_from_zero = true;
        self
    }

    /// Adds a series (series without points are kept out of the plot but listed in the legend).
    pub(crate) fn series(mut self, series: Series) -> Self {
        self.series.push(series);
        self
    }

    /// The chart as a standalone `<svg>` element.
    pub(crate) fn to_svg(&self) -> String {
        let mut svg = String::new();
        let _ = write!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" font-family="sans-serif" font-size="11">"#
        );
        let _ = write!(svg, "<title>{}</title>", escape(&self.title));
        let _ = write!(
            svg,
            r##"<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/><text x="{}" y="18" text-anchor="middle" font-size="14" font-weight="bold">{}</text>"##,
            WIDTH / 2.0,
            escape(&self.title)
        );
        match self.bounds() {
            Some(bounds) => self.draw_plot(&mut svg, bounds),
            None => {
                let _ = write!(
                    svg,
                    r##"<text x="{}" y="{}" text-anchor="middle" fill="#777777">no data</text>"##,
                    WIDTH / 2.0,
                    HEIGHT / 2.0
                );
            }
        }
        svg.push_str("</svg>");
        svg
    }

    fn bounds(&self) -> Option<Bounds> {
        let mut points = self.series.iter().flat_map(|s| s.points.iter().copied());
        let (x0, y0) = points.next()?;
        let mut b = Bounds { x_min: x0, x_max: x0, y_min: y0, y_max: y0 };
        for (x, y) in points {
            b.x_min = b.x_min.min(x);
            b.x_max = b.x_max.max(x);
            b.y_min = b.y_min.min(y);
            b.y_max = b.y_max.max(y);
        }
        if self.y_from_zero {
            b.y_min = b.y_min.min(0.0);
        }
        Some(b)
    }

    fn draw_plot(&self, svg: &mut String, bounds: Bounds) {
        let x_axis = Axis::new(bounds.x_min, bounds.x_max);
        let y_axis = Axis::new(bounds.y_min, bounds.y_max);
        let plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT;
        let plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM;
        let px = |x: f64| MARGIN_LEFT + (x - x_axis.lo) / (x_axis.hi - x_axis.lo) * plot_w;
        let py = |y: f64| MARGIN_TOP + plot_h - (y - y_axis.lo) / (y_axis.hi - y_axis.lo) * plot_h;
        let bottom = MARGIN_TOP + plot_h;
        let right = MARGIN_LEFT + plot_w;

        svg.push_str(r##"<g class="grid" stroke="#e5e5e5" stroke-width="1">"##);
        for &t in &y_axis.ticks {
            let _ = write!(
                svg,
                r#"<line x1="{MARGIN_LEFT}" y1="{0:.2}" x2="{right}" y2="{0:.2}"/>"#,
                py(t)
            );
        }
        for &t in &x_axis.ticks {
            let _ = write!(
                svg,
                r#"<line x1="{0:.2}" y1="{MARGIN_TOP}" x2="{0:.2}" y2="{bottom}"/>"#,
                px(t)
            );
        }
        svg.push_str("</g>");
        let _ = write!(
            svg,
            r##"<g class="axes" stroke="#333333" stroke-width="1"><line x1="{MARGIN_LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}"/><line x1="{MARGIN_LEFT}" y1="{MARGIN_TOP}" x2="{MARGIN_LEFT}" y2="{bottom}"/></g>"##
        );
        svg.push_str(r#"<g class="ticks">"#);
        for &t in &y_axis.ticks {
            let _ = write!(
                svg,
                r#"<text x="{}" y="{:.2}" text-anchor="end" dominant-baseline="middle">{}</text>"#,
                MARGIN_LEFT - 6.0,
                py(t),
                y_axis.label(t)
            );
        }
        for &t in &x_axis.ticks {
            let _ = write!(
                svg,
                r#"<text x="{:.2}" y="{}" text-anchor="middle">{}</text>"#,
                px(t),
                bottom + 16.0,
                x_axis.label(t)
            );
        }
        svg.push_str("</g>");
        let _ = write!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text><text x="14" y="{}" text-anchor="middle" transform="rotate(-90 14 {})">{}</text>"#,
            MARGIN_LEFT + plot_w / 2.0,
            bottom + 32.0,
            escape(&self.x_label),
            MARGIN_TOP + plot_h / 2.0,
            MARGIN_TOP + plot_h / 2.0,
            escape(&self.y_label)
        );

        for (i, s) in self.series.iter().enumerate() {
            let colour = PALETTE[i % PALETTE.len()];
            let _ = write!(svg, r#"<g class="series" data-name="{}">"#, escape(&s.name));
            let screen: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (px(x), py(y))).collect();
            let line = match s.style {
                Style::Line => screen.clone(),
                Style::Step => step_points(&screen),
                Style::Dots => Vec::new(),
            };
            if line.len() > 1 {
                svg.push_str(r#"<polyline fill="none" stroke-width="1.8" stroke=""#);
                svg.push_str(colour);
                svg.push_str(r#"" points=""#);
                for (k, (x, y)) in line.iter().enumerate() {
                    if k > 0 {
                        svg.push(' ');
                    }
                    let _ = write!(svg, "{x:.2},{y:.2}");
                }
                svg.push_str(r#""/>"#);
            }
            let dots = s.style == Style::Dots || screen.len() <= 40 || line.len() < 2;
            if dots {
                let r = if s.style == Style::Dots { 2.2 } else { 2.6 };
                for (x, y) in &screen {
                    let _ =
                        write!(svg, r#"<circle cx="{x:.2}" cy="{y:.2}" r="{r}" fill="{colour}"/>"#);
                }
            }
            svg.push_str("</g>");
        }

        svg.push_str(r#"<g class="legend">"#);
        let mut lx = MARGIN_LEFT;
        let ly = HEIGHT - 12.0;
        for (i, s) in self.series.iter().enumerate() {
            let colour = PALETTE[i % PALETTE.len()];
            let _ = write!(
                svg,
                r#"<rect x="{lx:.1}" y="{:.1}" width="12" height="4" fill="{colour}"/><text x="{:.1}" y="{ly:.1}">{}</text>"#,
                ly - 5.0,
                lx + 16.0,
                escape(&s.name)
            );
            lx += 28.0 + 6.5 * s.name.chars().count() as f64;
        }
        svg.push_str("</g>");
    }
}

/// Data extent of a chart.
#[derive(Debug, Clone, Copy)]
struct Bounds {
    x_min: f64,
    x_max: f64,
    y_min: f64,
    y_max: f64,
}

/// An axis range widened to round tick values, and those ticks.
#[derive(Debug, Clone)]
pub(crate) struct Axis {
    pub(crate) lo: f64,
    pub(crate) hi: f64,
    step: f64,
    pub(crate) ticks: Vec<f64>,
}

impl Axis {
    /// About five ticks on 1-2-5 steps that cover `[min, max]`.
    pub(crate) fn new(min: f64, max: f64) -> Self {
        let (min, max) = if max - min > f64::EPSILON * max.abs().max(1.0) {
            (min, max)
        } else {
            // A single value: a narrow window around it (98.3% must not reach 110%).
            let pad = if min == 0.0 { 1.0 } else { min.abs() * 0.02 };
            (min - pad, max + pad)
        };
        let raw = (max - min) / 5.0;
        let magnitude = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 2.5, 5.0, 10.0]
            .iter()
            .map(|m| m * magnitude)
            .find(|s| *s >= raw)
            .unwrap_or(10.0 * magnitude);
        let lo = (min / step).floor() * step;
        let hi = (max / step).ceil() * step;
        let count = ((hi - lo) / step).round() as usize;
        let ticks = (0..=count).map(|i| lo + i as f64 * step).collect();
        Self { lo, hi, step, ticks }
    }

    /// A tick label with as many decimals as the step needs.
    pub(crate) fn label(&self, v: f64) -> String {
        // The fewest decimals that show the step exactly (0.5 -> 1, 0.25 -> 2, 20 -> 0).
        let decimals = (0..=6)
            .find(|d| {
                let scaled = self.step * 10f64.powi(*d);
                (scaled - scaled.round()).abs() < 1e-6 * scaled.max(1.0)
            })
            .unwrap_or(6) as usize;
        let v = if v.abs() < self.step * 1e-9 { 0.0 } else { v };
        if v.abs() >= 1e5 { format!("{:.1}k", v / 1000.0) } else { format!("{v:.decimals$}") }
    }
}

/// Turns points into a staircase: horizontal to the next x, then vertical.
fn step_points(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(points.len() * 2);
    for (i, &(x, y)) in points.iter().enumerate() {
        if i > 0 {
            out.push((x, points[i - 1].1));
        }
        out.push((x, y));
    }
    out
}

/// Escapes text for XML content and attributes.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_ticks_cover_the_range_on_round_steps() {
        let cases = [
            (0.0, 1.0),
            (0.13, 0.98),
            (-3.2, 17.9),
            (5.0, 5.0),
            (0.0, 0.0),
            (1e3, 6.5e4),
            (98.3, 98.3),
        ];
        for (min, max) in cases {
            let axis = Axis::new(min, max);
            assert!(axis.lo <= min && axis.hi >= max, "{min}..{max} -> {axis:?}");
            assert!((3..=12).contains(&axis.ticks.len()), "{min}..{max} -> {axis:?}");
            let mantissa = axis.step / 10f64.powf(axis.step.log10().floor());
            assert!(
                [1.0, 2.0, 2.5, 5.0, 10.0].iter().any(|m| (m - mantissa).abs() < 1e-9),
                "step {} not 1-2-5",
                axis.step
            );
        }
    }

    #[test]
    fn a_single_value_gets_a_narrow_axis() {
        let axis = Axis::new(98.3, 98.3);
        assert!(axis.lo >= 95.0 && axis.hi <= 101.0, "{axis:?}");
    }

    #[test]
    fn tick_labels_use_the_decimals_of_the_step() {
        let cases = [(1.5, 3.5, "1.5"), (0.0, 1.0, "0.2"), (0.0, 1.2, "0.25"), (0.0, 100.0, "20")];
        for (min, max, want) in cases {
            let axis = Axis::new(min, max);
            let labels: Vec<String> = axis.ticks.iter().map(|t| axis.label(*t)).collect();
            assert!(labels.iter().any(|l| l == want), "{min}..{max}: {labels:?}");
        }
    }

    #[test]
    fn chart_has_one_polyline_per_multi_point_series_and_escapes_names() {
        let chart = LineChart::new("a <b>", "x", "y")
            .series(Series::new("r&0", vec![(0.0, 1.0), (1.0, 2.0), (f64::NAN, 3.0)], Style::Line))
            .series(Series::new("r1", vec![(0.0, 2.0), (2.0, 0.5)], Style::Step))
            .series(Series::new("events", vec![(0.5, 1.0)], Style::Dots));
        let svg = chart.to_svg();
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("a &lt;b&gt;") && svg.contains("r&amp;0"));
        assert!(!svg.contains("NaN"));
    }

    #[test]
    fn empty_chart_says_no_data() {
        let svg = LineChart::new("t", "x", "y").to_svg();
        assert!(svg.contains("no data") && !svg.contains("<polyline"));
    }
}
