//! Charts drawn on the server as inline SVG: no script, no third-party
//! asset, and text a test can read. Pure functions of the points given.
//!
//! A chart's `<svg>` carries `data-points` (the buckets that hold data)
//! and each series' `<path>` its own `data-series` and `data-points`; a
//! bucket without data is a gap in the line, not a zero.

use std::fmt::Write as _;

use runway_core::Timestamp;

/// One line of a chart: a value per bucket, `None` where nothing was
/// sampled.
pub struct Series<'a> {
    pub name: &'a str,
    pub color: &'a str,
    pub values: Vec<Option<f64>>,
}

const WIDTH: f64 = 560.0;
const HEIGHT: f64 = 180.0;
const LEFT: f64 = 56.0;
const RIGHT: f64 = 8.0;
const TOP: f64 = 24.0;
const BOTTOM: f64 = 22.0;

/// A line chart of `series` over the buckets starting at `starts` (one
/// value per bucket in each series), its y axis labelled by `label`.
pub fn line_chart(
    title: &str,
    starts: &[Timestamp],
    series: &[Series<'_>],
    label: impl Fn(f64) -> String,
) -> String {
    let buckets = starts.len();
    let max = series
        .iter()
        .flat_map(|s| s.values.iter().flatten())
        .fold(0.0_f64, |max, v| max.max(*v));
    let top = nice_ceiling(max);
    let plot_w = WIDTH - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |i: usize| {
        if buckets <= 1 {
            LEFT + plot_w / 2.0
        } else {
            LEFT + plot_w * i as f64 / (buckets - 1) as f64
        }
    };
    let y = |v: f64| TOP + plot_h * (1.0 - (v / top).clamp(0.0, 1.0));
    let with_data = (0..buckets)
        .filter(|i| {
            series
                .iter()
                .any(|s| s.values.get(*i).copied().flatten().is_some())
        })
        .count();
    let mut svg = String::new();
    let _ = write!(
        svg,
        "<svg class=\"chart\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         role=\"img\" aria-label=\"{}\" data-points=\"{with_data}\" data-buckets=\"{buckets}\">",
        escape(title)
    );
    let _ = write!(
        svg,
        "<title>{0}</title><text x=\"{LEFT}\" y=\"14\" font-size=\"12\" font-weight=\"600\" fill=\"#1d232b\">{0}</text>",
        escape(title)
    );
    // The legend, right-aligned on the title's line.
    let mut legend_x = WIDTH - RIGHT;
    for s in series.iter().rev() {
        let _ = write!(
            svg,
            "<text x=\"{legend_x:.1}\" y=\"14\" font-size=\"11\" text-anchor=\"end\" fill=\"{}\">■ {}</text>",
            escape(s.color),
            escape(s.name)
        );
        legend_x -= 18.0 + 7.0 * s.name.chars().count() as f64;
    }
    // Grid: zero, half and the top, labelled.
    for fraction in [0.0, 0.5, 1.0] {
        let value = top * fraction;
        let at = y(value);
        let _ = write!(
            svg,
            "<line x1=\"{LEFT}\" x2=\"{}\" y1=\"{at:.1}\" y2=\"{at:.1}\" stroke=\"#dde2e8\"/>\
             <text x=\"{}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"end\" fill=\"#66707c\">{}</text>",
            WIDTH - RIGHT,
            LEFT - 4.0,
            at + 3.0,
            escape(&label(value))
        );
    }
    if let (Some(first), Some(last)) = (starts.first(), starts.last()) {
        let _ = write!(
            svg,
            "<text x=\"{LEFT}\" y=\"{}\" font-size=\"10\" fill=\"#66707c\">{}</text>\
             <text x=\"{}\" y=\"{}\" font-size=\"10\" text-anchor=\"end\" fill=\"#66707c\">{}</text>",
            HEIGHT - 6.0,
            clock(*first, *last),
            WIDTH - RIGHT,
            HEIGHT - 6.0,
            clock(*last, *first)
        );
    }
    for s in series {
        let (d, points) = path(&s.values[..s.values.len().min(buckets)], &x, &y);
        let _ = write!(
            svg,
            "<path class=\"series\" data-series=\"{}\" data-points=\"{points}\" d=\"{}\" fill=\"none\" \
             stroke=\"{}\" stroke-width=\"1.6\"/>",
            escape(s.name),
            d,
            escape(s.color)
        );
        // A lone point draws no line: a dot shows it.
        if points == 1 {
            if let Some((i, v)) = s
                .values
                .iter()
                .enumerate()
                .find_map(|(i, v)| v.map(|v| (i, v)))
            {
                let _ = write!(
                    svg,
                    "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2\" fill=\"{}\"/>",
                    x(i),
                    y(v),
                    escape(s.color)
                );
            }
        }
    }
    svg.push_str("</svg>");
    svg
}

/// A sparkline: one small line of `values` (gaps where `None`), no axes.
pub fn sparkline(name: &str, values: &[Option<f64>]) -> String {
    const W: f64 = 120.0;
    const H: f64 = 24.0;
    let top = nice_ceiling(values.iter().flatten().fold(0.0_f64, |m, v| m.max(*v)));
    let n = values.len();
    let x = |i: usize| {
        if n <= 1 {
            W / 2.0
        } else {
            W * i as f64 / (n - 1) as f64
        }
    };
    let y = |v: f64| 1.0 + (H - 2.0) * (1.0 - (v / top).clamp(0.0, 1.0));
    let (d, points) = path(values, &x, &y);
    format!(
        "<svg class=\"sparkline\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" role=\"img\" \
         aria-label=\"{}\" data-points=\"{points}\"><path d=\"{}\" fill=\"none\" stroke=\"#1f6feb\" \
         stroke-width=\"1.4\"/></svg>",
        escape(name),
        d
    )
}

/// An SVG path through `values` at (`x(i)`, `y(v)`), lifting the pen
/// over each `None`; and how many points it draws.
fn path(
    values: &[Option<f64>],
    x: &dyn Fn(usize) -> f64,
    y: &dyn Fn(f64) -> f64,
) -> (String, usize) {
    let mut d = String::new();
    let mut points = 0;
    let mut pen_down = false;
    for (i, value) in values.iter().enumerate() {
        match value {
            Some(v) => {
                let _ = write!(
                    d,
                    "{}{:.1} {:.1} ",
                    if pen_down { "L" } else { "M" },
                    x(i),
                    y(*v)
                );
                pen_down = true;
                points += 1;
            }
            None => pen_down = false,
        }
    }
    (d.trim_end().to_owned(), points)
}

/// The smallest of 1, 2 or 5 × a power of ten at or above `max` (1 for
/// nothing), so the axis reads in round numbers.
pub fn nice_ceiling(max: f64) -> f64 {
    if max.is_nan() || max <= 0.0 {
        return 1.0;
    }
    let power = 10f64.powf(max.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * power)
        .find(|c| *c >= max * (1.0 - 1e-9))
        .unwrap_or(10.0 * power)
}

/// A duration of `seconds` as an axis reads it: "40 s", "5 min", "2 h".
pub fn axis_duration(seconds: f64) -> String {
    match seconds {
        s if s < 120.0 => format!("{s:.0} s"),
        s if s < 7_200.0 => format!("{:.0} min", s / 60.0),
        s => format!("{:.0} h", s / 3_600.0),
    }
}

/// `at` as "HH:MM" (UTC), with the date when the chart spans days.
fn clock(at: Timestamp, other: Timestamp) -> String {
    let span_days = (at.as_millis() - other.as_millis()).abs() > 24 * 3600 * 1000 - 1;
    let time = crate::clock::hh_mm(at);
    // rfc3339: YYYY-MM-DDTHH:MM:SS…
    match crate::clock::rfc3339(at).get(5..10) {
        Some(date) if span_days => format!("{date} {time}"),
        _ => time,
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minutes(n: i64) -> Vec<Timestamp> {
        (0..n).map(|m| Timestamp::from_millis(m * 60_000)).collect()
    }

    #[test]
    fn a_chart_draws_each_present_point_and_leaves_gaps() {
        let svg = line_chart(
            "Queued <jobs>",
            &minutes(5),
            &[
                Series {
                    name: "queued",
                    color: "#c00",
                    values: vec![Some(1.0), Some(4.0), None, Some(2.0), Some(3.0)],
                },
                Series {
                    name: "running",
                    color: "#0c0",
                    values: vec![None, None, None, None, Some(1.0)],
                },
            ],
            |v| format!("{v}"),
        );
        assert!(
            svg.contains("data-points=\"4\" data-buckets=\"5\""),
            "{svg}"
        );
        assert!(
            svg.contains("data-series=\"queued\" data-points=\"4\""),
            "{svg}"
        );
        assert!(
            svg.contains("data-series=\"running\" data-points=\"1\""),
            "{svg}"
        );
        // Two segments for queued: a gap at the third bucket.
        let queued = svg
            .split("data-series=\"queued\"")
            .nth(1)
            .unwrap_or_default();
        let d = queued
            .split("d=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or_default();
        assert_eq!(d.matches('M').count(), 2, "{d}");
        assert_eq!(d.matches('L').count(), 2, "{d}");
        // The title is escaped; the axis tops at a round 5.
        assert!(svg.contains("Queued &lt;jobs&gt;"), "{svg}");
        assert!(svg.contains(">5<"), "{svg}");
        // The lone running point is drawn as a dot.
        assert!(svg.contains("<circle"), "{svg}");
    }

    #[test]
    fn axes_top_at_round_numbers() {
        for (max, top) in [
            (0.0, 1.0),
            (0.3, 0.5),
            (1.0, 1.0),
            (7.0, 10.0),
            (12.0, 20.0),
            (560.0, 1000.0),
            (0.011, 0.02),
        ] {
            assert!(
                (nice_ceiling(max) - top).abs() < 1e-9,
                "{max} → {}",
                nice_ceiling(max)
            );
        }
    }

    #[test]
    fn axis_durations_are_short() {
        assert_eq!(axis_duration(0.0), "0 s");
        assert_eq!(axis_duration(50.0), "50 s");
        assert_eq!(axis_duration(600.0), "10 min");
        assert_eq!(axis_duration(10_000.0), "3 h");
    }

    #[test]
    fn a_sparkline_counts_its_points() {
        let svg = sparkline("queued", &[Some(1.0), None, Some(3.0)]);
        assert!(svg.contains("data-points=\"2\""), "{svg}");
    }
}
