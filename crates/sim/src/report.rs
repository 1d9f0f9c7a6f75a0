//! What `runway sim` prints: one summary per policy, as a table, JSON or CSV.
//! Numbers are rounded to fixed places, so the same inputs give
//! byte-identical output.

use serde::Serialize;

use std::sync::atomic::AtomicU64;

use crate::engine::{run_counting, Outcome, Setup};
use crate::policy::{by_name, UnknownPolicy};
use crate::trace::TraceJob;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub policy: String,
    pub jobs: u64,
    pub queue_p50_s: f64,
    pub queue_p95_s: f64,
    pub queue_p99_s: f64,
    pub queue_max_s: f64,
    pub queue_mean_s: f64,
    pub runner_hours: f64,
    pub idle_runner_hours: f64,
    pub cost: f64,
    pub delete_requests: u64,
    pub failed_creates: u64,
    /// Hours runners spent stopped (their cost is in `cost`), and stopped
    /// runners started for a job.
    pub stopped_hours: f64,
    pub starts: u64,
    /// Jobs no runner ever started (the policy starved their pool).
    pub unfinished: u64,
    /// Jobs no pool serves (not simulated).
    pub unroutable: u64,
    /// Mean wait as a fraction of the reactive policy's (`runway`), and
    /// of the oracle's, and cost as a fraction of the reactive policy's:
    /// when those policies were run beside it ([`relate`]).
    pub wait_vs_runway: Option<f64>,
    pub wait_vs_oracle: Option<f64>,
    pub cost_vs_runway: Option<f64>,
    /// With more than one fair-share key (the trace's `repo`): Jain's
    /// fairness index of the keys' mean waits (1: every key waits alike;
    /// 1/n: one key does all the waiting), and each key's waits, most
    /// jobs first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fairness: Option<f64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<KeyWait>,
}

/// One fair-share key's queue times.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyWait {
    pub key: String,
    pub jobs: u64,
    pub queue_p50_s: f64,
    pub queue_p95_s: f64,
    pub queue_mean_s: f64,
}

fn mean_s(sorted_ms: &[i64]) -> f64 {
    // Folded from +0.0: an empty f64 sum is -0.0.
    sorted_ms.iter().fold(0.0, |sum, &ms| sum + ms as f64) / sorted_ms.len().max(1) as f64 / 1000.0
}

/// Each key's waits (most jobs first, then by key) and Jain's index of
/// their means; nothing for one key or none.
fn per_key(outcome: &Outcome) -> (Option<f64>, Vec<KeyWait>) {
    let mut keys: Vec<KeyWait> = outcome
        .keys
        .iter()
        .zip(&outcome.waits_by_key)
        .filter(|(_, waits)| !waits.is_empty())
        .map(|(key, waits)| KeyWait {
            key: key.clone(),
            jobs: waits.len() as u64,
            queue_p50_s: round(quantile_s(waits, 0.5), 1),
            queue_p95_s: round(quantile_s(waits, 0.95), 1),
            queue_mean_s: round(mean_s(waits), 1),
        })
        .collect();
    if keys.len() < 2 {
        return (None, Vec::new());
    }
    keys.sort_by(|a, b| b.jobs.cmp(&a.jobs).then_with(|| a.key.cmp(&b.key)));
    let means: Vec<f64> = outcome
        .waits_by_key
        .iter()
        .filter(|waits| !waits.is_empty())
        .map(|waits| mean_s(waits))
        .collect();
    // Every key served at once is as fair as it gets.
    let index = runway_core::share::jain_index(&means).unwrap_or(1.0);
    (Some(round(index, 3)), keys)
}

/// Fills each summary's figures relative to the `runway` (reactive) and
/// `oracle` (perfect foresight) policies among them.
pub fn relate(summaries: &mut [Summary]) {
    let find = |name: &str| summaries.iter().find(|s| s.policy == name).cloned();
    let (reactive, oracle) = (find("runway"), find("oracle"));
    let ratio = |value: f64, base: f64| (base > 0.0).then(|| round(value / base, 2));
    for summary in summaries.iter_mut() {
        if let Some(reactive) = &reactive {
            summary.wait_vs_runway = ratio(summary.queue_mean_s, reactive.queue_mean_s);
            summary.cost_vs_runway = ratio(summary.cost, reactive.cost);
        }
        if let Some(oracle) = &oracle {
            summary.wait_vs_oracle = ratio(summary.queue_mean_s, oracle.queue_mean_s);
        }
    }
}

/// The `q` quantile (nearest rank) of sorted milliseconds, in seconds.
pub fn quantile_s(sorted_ms: &[i64], q: f64) -> f64 {
    if sorted_ms.is_empty() {
        return 0.0;
    }
    let rank = (q * sorted_ms.len() as f64).ceil() as usize;
    sorted_ms[rank.clamp(1, sorted_ms.len()) - 1] as f64 / 1000.0
}

fn round(value: f64, places: i32) -> f64 {
    let scale = 10f64.powi(places);
    (value * scale).round() / scale
}

impl Summary {
    pub fn of(outcome: &Outcome) -> Summary {
        let q = |p| round(quantile_s(&outcome.queue_ms, p), 1);
        let (fairness, keys) = per_key(outcome);
        Summary {
            policy: outcome.policy.clone(),
            jobs: outcome.jobs,
            queue_p50_s: q(0.50),
            queue_p95_s: q(0.95),
            queue_p99_s: q(0.99),
            queue_max_s: q(1.0),
            queue_mean_s: round(mean_s(&outcome.queue_ms), 1),
            runner_hours: round(outcome.runner_hours, 1),
            idle_runner_hours: round(outcome.idle_runner_hours, 1),
            cost: round(outcome.cost, 2),
            delete_requests: outcome.delete_requests,
            failed_creates: outcome.failed_creates,
            stopped_hours: round(outcome.stopped_hours, 1),
            starts: outcome.starts,
            unfinished: outcome.unfinished,
            unroutable: outcome.unroutable,
            wait_vs_runway: None,
            wait_vs_oracle: None,
            cost_vs_runway: None,
            fairness,
            keys,
        }
    }
}

/// Runs every named policy on the same setup and jobs, side by side (one
/// thread each; each run is independent and seeded, so the order of
/// threads changes nothing).
pub fn compare(
    setup: &Setup,
    jobs: &[TraceJob],
    policies: &[String],
) -> Result<Vec<Outcome>, UnknownPolicy> {
    compare_counting(setup, jobs, policies, &AtomicU64::new(0))
}

/// [`compare`], counting arrivals over all policies into `arrived`.
pub fn compare_counting(
    setup: &Setup,
    jobs: &[TraceJob],
    policies: &[String],
    arrived: &AtomicU64,
) -> Result<Vec<Outcome>, UnknownPolicy> {
    let mut built = Vec::new();
    for name in policies {
        built.push(by_name(name, setup.pools.len())?);
    }
    let outcomes = std::thread::scope(|scope| {
        let handles: Vec<_> = built
            .into_iter()
            .map(|mut policy| {
                scope.spawn(move || run_counting(setup, jobs, policy.as_mut(), arrived))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a simulation thread panicked"))
            .collect()
    });
    Ok(outcomes)
}

/// The columns of every format, in order (the JSON keys, too).
pub const COLUMNS: [&str; 17] = [
    "policy",
    "jobs",
    "queue_p50_s",
    "queue_p95_s",
    "queue_p99_s",
    "queue_max_s",
    "runner_hours",
    "idle_runner_hours",
    "cost",
    "delete_requests",
    "failed_creates",
    "queue_mean_s",
    "wait_vs_runway",
    "wait_vs_oracle",
    "cost_vs_runway",
    "stopped_hours",
    "starts",
];

fn cells(s: &Summary) -> Vec<String> {
    vec![
        s.policy.clone(),
        s.jobs.to_string(),
        format!("{:.1}", s.queue_p50_s),
        format!("{:.1}", s.queue_p95_s),
        format!("{:.1}", s.queue_p99_s),
        format!("{:.1}", s.queue_max_s),
        format!("{:.1}", s.runner_hours),
        format!("{:.1}", s.idle_runner_hours),
        format!("{:.2}", s.cost),
        s.delete_requests.to_string(),
        s.failed_creates.to_string(),
        format!("{:.1}", s.queue_mean_s),
        relative(s.wait_vs_runway),
        relative(s.wait_vs_oracle),
        relative(s.cost_vs_runway),
        format!("{:.1}", s.stopped_hours),
        s.starts.to_string(),
    ]
}

/// A ratio, or `-` where there is nothing to compare with (the policy was
/// not run, or its figure is zero).
fn relative(ratio: Option<f64>) -> String {
    ratio.map_or_else(|| "-".to_owned(), |r| format!("{r:.2}"))
}

pub fn table(summaries: &[Summary]) -> String {
    let rows: Vec<Vec<String>> = summaries.iter().map(cells).collect();
    let widths: Vec<usize> = (0..COLUMNS.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].len())
                .chain([COLUMNS[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (c, cell) in cells.iter().enumerate() {
            if c == 0 {
                text.push_str(&format!("{cell:<w$}", w = widths[c]));
            } else {
                text.push_str(&format!("  {cell:>w$}", w = widths[c]));
            }
        }
        text.trim_end().to_owned() + "\n"
    };
    let mut out = line(COLUMNS.to_vec());
    for row in &rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    let unfinished: Vec<String> = summaries
        .iter()
        .filter(|s| s.unfinished > 0)
        .map(|s| format!("{} left {} jobs never started", s.policy, s.unfinished))
        .collect();
    if !unfinished.is_empty() {
        out.push_str(&format!("note: {}\n", unfinished.join("; ")));
    }
    // What the warm pools bought: their idling against the reactive
    // policy's waits.
    if let Some(base) = summaries.iter().find(|s| s.policy == "runway") {
        for s in summaries
            .iter()
            .filter(|s| s.policy.starts_with("predictive"))
        {
            out.push_str(&format!(
                "bought: {} idled {:.1} runner-hours ({:.0}% of its runner-hours) for {:.1} s less mean wait than runway, at {:.2}× its cost\n",
                s.policy,
                s.idle_runner_hours,
                100.0 * s.idle_runner_hours / s.runner_hours.max(f64::MIN_POSITIVE),
                base.queue_mean_s - s.queue_mean_s,
                s.cost / base.cost.max(f64::MIN_POSITIVE),
            ));
        }
    }
    // Fair share across the trace's repositories, where it has several:
    // the index per policy, then the waits of the busiest keys.
    let fair: Vec<String> = summaries
        .iter()
        .filter_map(|s| s.fairness.map(|f| format!("{} {f:.3}", s.policy)))
        .collect();
    if !fair.is_empty() {
        out.push_str(&format!(
            "fairness (Jain's index of the repositories' mean waits; 1 = alike): {}
",
            fair.join(", ")
        ));
        for s in summaries.iter().filter(|s| !s.keys.is_empty()) {
            let shown: Vec<String> = s
                .keys
                .iter()
                .take(5)
                .map(|k| {
                    format!(
                        "{} ({} jobs) p50 {:.1}s p95 {:.1}s",
                        if k.key.is_empty() { "(none)" } else { &k.key },
                        k.jobs,
                        k.queue_p50_s,
                        k.queue_p95_s
                    )
                })
                .collect();
            let more = s.keys.len().saturating_sub(5);
            out.push_str(&format!(
                "  {}: {}{}
",
                s.policy,
                shown.join("; "),
                if more > 0 {
                    format!("; {more} more")
                } else {
                    String::new()
                }
            ));
        }
    }
    if let Some(s) = summaries.first().filter(|s| s.unroutable > 0) {
        out.push_str(&format!(
            "note: {} jobs had labels no pool serves and were left out\n",
            s.unroutable
        ));
    }
    out
}

pub fn csv(summaries: &[Summary]) -> String {
    let mut out = COLUMNS.join(",") + "\n";
    for s in summaries {
        out.push_str(&(cells(s).join(",") + "\n"));
    }
    out
}

pub fn json(summaries: &[Summary]) -> String {
    let value = serde_json::json!({ "policies": summaries });
    serde_json::to_string_pretty(&value).unwrap_or_default() + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let ms: Vec<i64> = (1..=100).map(|s| s * 1000).collect();
        assert_eq!(quantile_s(&ms, 0.5), 50.0);
        assert_eq!(quantile_s(&ms, 0.95), 95.0);
        assert_eq!(quantile_s(&ms, 1.0), 100.0);
        assert_eq!(quantile_s(&[], 0.5), 0.0);
        assert_eq!(quantile_s(&[7_000], 0.01), 7.0);
    }
}
