//! `--plot DIR`: SVG charts of a comparison, drawn with `plotters`:
//! `timeline.svg` (runners and queued jobs over time, per policy),
//! `queue_cdf.svg` (the queue-time distribution per policy) and
//! `cost_vs_p95.svg` and `cost_vs_mean_wait.svg` (one point per policy, the
//! oracle and the reactive policy marked).

use std::path::Path;

use plotters::prelude::*;

use crate::engine::Outcome;
use crate::report::{quantile_s, Summary};

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PlotError(String);

fn failed(error: impl std::fmt::Display) -> PlotError {
    PlotError(error.to_string())
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

fn color(index: usize) -> RGBColor {
    COLORS[index % COLORS.len()]
}

pub fn write_all(dir: &Path, outcomes: &[Outcome], summaries: &[Summary]) -> Result<(), PlotError> {
    std::fs::create_dir_all(dir).map_err(failed)?;
    timeline(&dir.join("timeline.svg"), outcomes)?;
    queue_cdf(&dir.join("queue_cdf.svg"), outcomes)?;
    cost_vs_wait(
        &dir.join("cost_vs_p95.svg"),
        summaries,
        |s| s.queue_p95_s,
        "p95 queue time",
    )?;
    cost_vs_wait(
        &dir.join("cost_vs_mean_wait.svg"),
        summaries,
        |s| s.queue_mean_s,
        "mean queue time",
    )?;
    Ok(())
}

fn timeline(path: &Path, outcomes: &[Outcome]) -> Result<(), PlotError> {
    let root = SVGBackend::new(path, (1000, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(failed)?;
    let (top, bottom) = root.split_vertically(350);
    let days = outcomes
        .iter()
        .flat_map(|o| o.timeline.last())
        .map(|(t, _, _)| *t as f64 / 86_400_000.0)
        .fold(0.0f64, f64::max)
        .max(1e-3);
    for (area, title, pick) in [(&top, "runners", 1usize), (&bottom, "queued jobs", 2usize)] {
        let value =
            |sample: &(i64, u32, u32)| f64::from(if pick == 1 { sample.1 } else { sample.2 });
        let most = outcomes
            .iter()
            .flat_map(|o| o.timeline.iter().map(value))
            .fold(1.0f64, f64::max);
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..days, 0.0..most * 1.05)
            .map_err(failed)?;
        chart
            .configure_mesh()
            .x_desc("days")
            .draw()
            .map_err(failed)?;
        for (i, outcome) in outcomes.iter().enumerate() {
            let points = outcome
                .timeline
                .iter()
                .map(|s| (s.0 as f64 / 86_400_000.0, value(s)));
            policy_line(&mut chart, points, i, &outcome.policy)?;
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(failed)?;
    }
    root.present().map_err(failed)
}

/// One policy's line, in its colour, named in the legend.
fn policy_line<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<
        'a,
        DB,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
    points: impl IntoIterator<Item = (f64, f64)>,
    i: usize,
    policy: &str,
) -> Result<(), PlotError> {
    chart
        .draw_series(LineSeries::new(points, color(i)))
        .map_err(failed)?
        .label(policy)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color(i)));
    Ok(())
}

fn queue_cdf(path: &Path, outcomes: &[Outcome]) -> Result<(), PlotError> {
    let root = SVGBackend::new(path, (900, 550)).into_drawing_area();
    root.fill(&WHITE).map_err(failed)?;
    // Up to the largest p99, so one starved policy does not flatten the rest.
    let right = outcomes
        .iter()
        .map(|o| quantile_s(&o.queue_ms, 0.99))
        .fold(1.0f64, f64::max);
    let mut chart = ChartBuilder::on(&root)
        .caption("queue time distribution", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..right, 0.0..1.0)
        .map_err(failed)?;
    chart
        .configure_mesh()
        .x_desc("queue time (s)")
        .y_desc("share of jobs")
        .draw()
        .map_err(failed)?;
    for (i, outcome) in outcomes.iter().enumerate() {
        let n = outcome.queue_ms.len().max(1) as f64;
        // 200 points along the x axis.
        let points = (0..=200).map(|step| {
            let x = right * f64::from(step) / 200.0;
            let below = outcome
                .queue_ms
                .partition_point(|ms| (*ms as f64) / 1000.0 <= x);
            (x, below as f64 / n)
        });
        policy_line(&mut chart, points, i, &outcome.policy)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(failed)?;
    root.present().map_err(failed)
}

/// One point per policy on the cost-versus-wait plane, the oracle (the
/// floor) and the reactive policy (`runway`) marked: a policy is as good
/// as it is close to the oracle's point.
fn cost_vs_wait(
    path: &Path,
    summaries: &[Summary],
    wait: fn(&Summary) -> f64,
    what: &str,
) -> Result<(), PlotError> {
    let root = SVGBackend::new(path, (900, 550)).into_drawing_area();
    root.fill(&WHITE).map_err(failed)?;
    // Policies whose wait is off the scale (a starved static pool) are
    // drawn at the right edge.
    let mut waits: Vec<f64> = summaries.iter().map(wait).collect();
    waits.sort_by(f64::total_cmp);
    let right = waits
        .get(waits.len().saturating_sub(2))
        .copied()
        .unwrap_or(1.0)
        .max(1.0)
        * 1.3;
    let top = summaries.iter().map(|s| s.cost).fold(1.0f64, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("cost versus {what}"), ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..right, 0.0..top)
        .map_err(failed)?;
    chart
        .configure_mesh()
        .x_desc(format!("{what} (s)"))
        .y_desc("cost")
        .draw()
        .map_err(failed)?;
    for (i, summary) in summaries.iter().enumerate() {
        let at = (wait(summary).min(right * 0.98), summary.cost);
        let (label, size) = match summary.policy.as_str() {
            "oracle" => ("oracle (floor)".to_owned(), 9),
            "runway" => ("runway (reactive)".to_owned(), 9),
            other => (other.to_owned(), 5),
        };
        chart
            .draw_series(std::iter::once(Circle::new(at, size, color(i).filled())))
            .map_err(failed)?;
        chart
            .draw_series(std::iter::once(Text::new(
                label,
                at,
                ("sans-serif", 13).into_font().color(&color(i)),
            )))
            .map_err(failed)?;
    }
    root.present().map_err(failed)
}

/// `--tune --plot DIR`: `tune.svg`, every setting of a sweep on the
/// cost-versus-mean-wait plane, the frontier joined by a line, the oracle
/// (the floor) and the reactive policy marked, the pick ringed.
pub fn tune(path: &Path, tuning: &crate::tune::Tuning) -> Result<(), PlotError> {
    let root = SVGBackend::new(path, (900, 550)).into_drawing_area();
    root.fill(&WHITE).map_err(failed)?;
    let points = &tuning.points;
    let right = points.iter().map(|p| p.mean_wait_s).fold(1.0f64, f64::max) * 1.15;
    let low = points.iter().map(|p| p.cost).fold(f64::INFINITY, f64::min);
    let high = points.iter().map(|p| p.cost).fold(0.0f64, f64::max);
    let margin = ((high - low) * 0.1).max(high * 0.01).max(1e-6);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "cost versus mean queue time, by setting",
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..right, (low - margin).max(0.0)..high + margin)
        .map_err(failed)?;
    chart
        .configure_mesh()
        .x_desc("mean queue time (s)")
        .y_desc("cost")
        .draw()
        .map_err(failed)?;
    let mut frontier: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| p.on_frontier)
        .map(|p| (p.mean_wait_s, p.cost))
        .collect();
    frontier.sort_by(|a, b| a.0.total_cmp(&b.0));
    chart
        .draw_series(LineSeries::new(frontier, color(0).stroke_width(2)))
        .map_err(failed)?;
    for point in points {
        let at = (point.mean_wait_s, point.cost);
        let (label, style, size) = match (point.policy.as_str(), point.quantile) {
            ("oracle", _) => ("oracle (floor)".to_owned(), color(2), 8),
            ("runway", _) => ("reactive".to_owned(), color(1), 8),
            (_, Some(q)) => (format!("q {q}"), color(0), 4),
            (other, None) => (other.to_owned(), color(7), 4),
        };
        // The label beside its dot, not on it.
        let element = EmptyElement::at(at)
            + Circle::new((0, 0), size, style.filled())
            + Text::new(
                label,
                (size + 3, -size - 8),
                ("sans-serif", 12).into_font().color(&style),
            );
        chart
            .draw_series(std::iter::once(element))
            .map_err(failed)?;
    }
    if let Some(pick) = &tuning.pick {
        chart
            .draw_series(std::iter::once(Circle::new(
                (pick.mean_wait_s, pick.cost),
                12,
                color(3).stroke_width(2),
            )))
            .map_err(failed)?;
    }
    root.present().map_err(failed)
}
