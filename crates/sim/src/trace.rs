//! Workload input: a trace file (JSON lines or CSV, documented in
//! `docs/sim.md`) or a synthetic workload with a seed.

use std::f64::consts::PI;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;

/// One job of a workload.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceJob {
    /// Milliseconds since the start of the workload.
    pub arrival_ms: i64,
    pub duration_ms: i64,
    pub labels: Vec<String>,
    pub repo: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TraceError {
    #[error("line {line}: {message}")]
    Line { line: usize, message: String },
    #[error("the trace has no jobs")]
    Empty,
    #[error("unknown workload {0:?}; one of poisson, diurnal, bursty, mixed")]
    UnknownWorkload(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonJob {
    arrival_s: f64,
    duration_s: f64,
    labels: Vec<String>,
    #[serde(default)]
    repo: Option<String>,
}

fn seconds(value: f64, what: &str) -> Result<i64, String> {
    if (0.0..1e12).contains(&value) {
        Ok((value * 1000.0).round() as i64)
    } else {
        Err(format!("{what}: {value} is not a number of seconds ≥ 0"))
    }
}

/// Parses a trace: JSON lines (`{"arrival_s": …, "duration_s": …,
/// "labels": […], "repo": …}`) or CSV with the header
/// `arrival_s,duration_s,labels,repo` and labels separated by `;`. Blank
/// lines and lines starting with `#` are skipped. Jobs come back sorted by
/// arrival (stable, so equal arrivals keep their order).
pub fn parse(text: &str) -> Result<Vec<TraceJob>, TraceError> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
        .peekable();
    let csv = matches!(lines.peek(), Some((_, first)) if !first.starts_with('{'));
    let mut jobs = Vec::new();
    if csv {
        let Some((line, header)) = lines.next() else {
            return Err(TraceError::Empty);
        };
        let columns: Vec<&str> = header.split(',').map(str::trim).collect();
        if columns.len() < 3 || columns[..3] != ["arrival_s", "duration_s", "labels"] {
            return Err(TraceError::Line {
                line,
                message: "a CSV trace starts with the header arrival_s,duration_s,labels,repo"
                    .into(),
            });
        }
        for (line, text) in lines {
            let fields: Vec<&str> = text.split(',').map(str::trim).collect();
            let bad = |message: String| TraceError::Line { line, message };
            if fields.len() < 3 || fields.len() > 4 {
                return Err(bad(format!(
                    "expected 3 or 4 fields, found {}",
                    fields.len()
                )));
            }
            let number = |i: usize, what: &str| {
                fields[i]
                    .parse::<f64>()
                    .map_err(|_| format!("{what}: {:?} is not a number", fields[i]))
                    .and_then(|v| seconds(v, what))
                    .map_err(&bad)
            };
            jobs.push(TraceJob {
                arrival_ms: number(0, "arrival_s")?,
                duration_ms: number(1, "duration_s")?,
                labels: fields[2]
                    .split(';')
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(str::to_owned)
                    .collect(),
                repo: fields
                    .get(3)
                    .filter(|r| !r.is_empty())
                    .map(|r| (*r).to_owned()),
            });
        }
    } else {
        for (line, text) in lines {
            let job: JsonJob = serde_json::from_str(text).map_err(|e| TraceError::Line {
                line,
                message: e.to_string(),
            })?;
            let bad = |message: String| TraceError::Line { line, message };
            jobs.push(TraceJob {
                arrival_ms: seconds(job.arrival_s, "arrival_s").map_err(bad)?,
                duration_ms: seconds(job.duration_s, "duration_s").map_err(bad)?,
                labels: job.labels,
                repo: job.repo,
            });
        }
    }
    if jobs.is_empty() {
        return Err(TraceError::Empty);
    }
    jobs.sort_by_key(|j| j.arrival_ms);
    Ok(jobs)
}

/// A synthetic workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub kind: WorkloadKind,
    pub days: u32,
    /// About this many jobs in all.
    pub jobs: u64,
    pub seed: u64,
    /// The label sets of the pools jobs go to (one chosen per job, or per
    /// burst); a mixture across pools when there are several.
    pub pools: Vec<Vec<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadKind {
    /// Arrivals at a constant rate.
    Poisson,
    /// A daily cycle (busy working hours, quiet nights) and a weekly one
    /// (quiet weekends).
    Diurnal,
    /// Matrix builds: bursts of 2–16 jobs at once, the bursts on a daily cycle.
    Bursty,
    /// A third of each, across the pools.
    Mixed,
}

impl std::str::FromStr for WorkloadKind {
    type Err = TraceError;
    fn from_str(name: &str) -> Result<WorkloadKind, TraceError> {
        match name {
            "poisson" => Ok(WorkloadKind::Poisson),
            "diurnal" => Ok(WorkloadKind::Diurnal),
            "bursty" => Ok(WorkloadKind::Bursty),
            "mixed" => Ok(WorkloadKind::Mixed),
            other => Err(TraceError::UnknownWorkload(other.to_owned())),
        }
    }
}

const DAY_S: f64 = 86_400.0;

/// Relative arrival intensity at `t` seconds (mean 1 over a week): weekdays
/// peak at 14:00, nights are a fifth of the peak, weekends a quarter.
fn diurnal_intensity(t: f64) -> f64 {
    let day = (t / DAY_S).floor() as i64;
    let hour = (t % DAY_S) / 3600.0;
    let daily = 0.6 + 0.5 * (2.0 * PI * (hour - 8.0) / 24.0).sin().max(-0.8);
    let weekly = if day.rem_euclid(7) >= 5 { 0.25 } else { 1.0 };
    daily * weekly
}

/// The most `diurnal_intensity` reaches (for thinning).
const DIURNAL_PEAK: f64 = 1.1;
/// Mean of `diurnal_intensity` over a week (0.6 + 0.5 × E[max(sin, −0.8)]
/// ≈ 0.6 + 0.5 × 0.0345, times (5 + 2 × 0.25) / 7).
fn diurnal_mean() -> f64 {
    // Numerically, once: a week at one-minute steps.
    let steps = 7 * 24 * 60;
    (0..steps)
        .map(|m| diurnal_intensity(f64::from(m) * 60.0))
        .sum::<f64>()
        / f64::from(steps)
}

/// A job duration: log-normal around a median of 4 minutes (most CI jobs
/// are short; a few run for an hour), capped at 3 hours.
fn duration_s(rng: &mut StdRng) -> f64 {
    let normal = standard_normal(rng);
    (240.0 * (0.9 * normal).exp()).clamp(10.0, 3.0 * 3600.0)
}

fn standard_normal(rng: &mut StdRng) -> f64 {
    // Box–Muller.
    let u1: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (2.0 * PI * u2).cos()
}

fn exponential(rng: &mut StdRng, mean: f64) -> f64 {
    let u: f64 = rng.gen_range(f64::MIN_POSITIVE..1.0);
    -mean * u.ln()
}

impl Workload {
    /// The jobs, sorted by arrival; the same seed gives the same jobs.
    pub fn generate(&self) -> Vec<TraceJob> {
        let mut rng = StdRng::seed_from_u64(self.seed);
        let horizon = f64::from(self.days.max(1)) * DAY_S;
        let pools = if self.pools.is_empty() {
            vec![vec!["self-hosted".to_owned()]]
        } else {
            self.pools.clone()
        };
        let mut jobs = Vec::with_capacity(usize::try_from(self.jobs).unwrap_or(0));
        let kinds: &[WorkloadKind] = match self.kind {
            WorkloadKind::Mixed => &[
                WorkloadKind::Poisson,
                WorkloadKind::Diurnal,
                WorkloadKind::Bursty,
            ],
            ref one => std::slice::from_ref(one),
        };
        let share = self.jobs as f64 / kinds.len() as f64;
        for (k, kind) in kinds.iter().enumerate() {
            // Mixed: each kind goes to its own pool where there are several.
            let pool_of = |rng: &mut StdRng| -> Vec<String> {
                if self.kind == WorkloadKind::Mixed && pools.len() > 1 {
                    pools[k % pools.len()].clone()
                } else {
                    pools[rng.gen_range(0..pools.len())].clone()
                }
            };
            let rate = share / horizon; // jobs per second, on average
            match kind {
                WorkloadKind::Poisson | WorkloadKind::Mixed => {
                    let mut t = exponential(&mut rng, 1.0 / rate);
                    while t < horizon {
                        let labels = pool_of(&mut rng);
                        jobs.push(job(t, duration_s(&mut rng), labels));
                        t += exponential(&mut rng, 1.0 / rate);
                    }
                }
                WorkloadKind::Diurnal => {
                    // Thinning: candidates at the peak rate, kept in
                    // proportion to the intensity at their time.
                    let mean = diurnal_mean();
                    let peak_rate = rate * DIURNAL_PEAK / mean;
                    let mut t = exponential(&mut rng, 1.0 / peak_rate);
                    while t < horizon {
                        if rng.gen::<f64>() * DIURNAL_PEAK < diurnal_intensity(t) {
                            let labels = pool_of(&mut rng);
                            jobs.push(job(t, duration_s(&mut rng), labels));
                        }
                        t += exponential(&mut rng, 1.0 / peak_rate);
                    }
                }
                WorkloadKind::Bursty => {
                    // Bursts of 2..=16 jobs (mean 9), on the daily cycle.
                    let mean = diurnal_mean();
                    let burst_rate = rate / 9.0;
                    let peak_rate = burst_rate * DIURNAL_PEAK / mean;
                    let mut t = exponential(&mut rng, 1.0 / peak_rate);
                    while t < horizon {
                        if rng.gen::<f64>() * DIURNAL_PEAK < diurnal_intensity(t) {
                            let size = rng.gen_range(2..=16);
                            let labels = pool_of(&mut rng);
                            for i in 0..size {
                                // A matrix fans out within a second.
                                let at = t + f64::from(i) * 0.05;
                                jobs.push(job(at, duration_s(&mut rng), labels.clone()));
                            }
                        }
                        t += exponential(&mut rng, 1.0 / peak_rate);
                    }
                }
            }
        }
        jobs.sort_by_key(|j| j.arrival_ms);
        jobs
    }
}

fn job(arrival_s: f64, duration_s: f64, labels: Vec<String>) -> TraceJob {
    TraceJob {
        arrival_ms: (arrival_s * 1000.0).round() as i64,
        duration_ms: (duration_s * 1000.0).round() as i64,
        labels,
        repo: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_and_csv_read_the_same() {
        let json = "{\"arrival_s\": 12.5, \"duration_s\": 340, \"labels\": [\"self-hosted\",\"large\"], \"repo\": \"org/x\"}\n\n# a comment\n{\"arrival_s\": 3, \"duration_s\": 60, \"labels\": [\"self-hosted\"]}\n";
        let csv = "arrival_s,duration_s,labels,repo\n12.5,340,self-hosted;large,org/x\n3,60,self-hosted,\n";
        let from_json = parse(json).unwrap();
        assert_eq!(from_json, parse(csv).unwrap());
        assert_eq!(from_json[0].arrival_ms, 3_000, "sorted by arrival");
        assert_eq!(from_json[1].labels, ["self-hosted", "large"]);
        assert_eq!(from_json[1].repo.as_deref(), Some("org/x"));
    }

    #[test]
    fn bad_traces_name_the_line() {
        assert_eq!(
            parse("{\"arrival_s\": -1, \"duration_s\": 1, \"labels\": []}").unwrap_err(),
            TraceError::Line {
                line: 1,
                message: "arrival_s: -1 is not a number of seconds ≥ 0".into()
            }
        );
        let error = parse("arrival_s,duration_s,labels\n1,x,a\n")
            .unwrap_err()
            .to_string();
        assert_eq!(error, "line 2: duration_s: \"x\" is not a number");
        assert!(
            parse("{\"arrival_s\": 1, \"duration_s\": 1, \"labels\": [], \"extra\": 1}")
                .unwrap_err()
                .to_string()
                .contains("unknown field")
        );
        assert_eq!(parse("# nothing\n"), Err(TraceError::Empty));
    }

    #[test]
    fn workloads_are_seeded_and_about_the_size_asked() {
        for kind in ["poisson", "diurnal", "bursty", "mixed"] {
            let workload = Workload {
                kind: kind.parse().unwrap(),
                days: 7,
                jobs: 20_000,
                seed: 3,
                pools: vec![vec!["a".into()], vec!["b".into()]],
            };
            let jobs = workload.generate();
            assert_eq!(jobs, workload.generate(), "{kind}: same seed, same jobs");
            let n = jobs.len() as f64;
            assert!((n - 20_000.0).abs() < 2_000.0, "{kind}: {n} jobs");
            assert!(jobs.windows(2).all(|w| w[0].arrival_ms <= w[1].arrival_ms));
            assert!(jobs.iter().all(|j| j.arrival_ms < 7 * 86_400_000));
        }
    }

    #[test]
    fn diurnal_days_are_busier_than_nights() {
        let jobs = Workload {
            kind: WorkloadKind::Diurnal,
            days: 14,
            jobs: 50_000,
            seed: 1,
            pools: vec![],
        }
        .generate();
        let hour = |j: &TraceJob| (j.arrival_ms / 3_600_000) % 24;
        let afternoon = jobs.iter().filter(|j| (12..16).contains(&hour(j))).count();
        let night = jobs.iter().filter(|j| (0..4).contains(&hour(j))).count();
        assert!(afternoon > 3 * night, "{afternoon} vs {night}");
    }
}
