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
    /// The workflow run the job belongs to (GitHub's `run_id`).
    pub run_id: Option<u64>,
    /// The workflow's name (GitHub's `workflow_name`).
    pub workflow: Option<String>,
    /// A later job of its run (one with `needs:`): it arrives this many
    /// milliseconds after the run's earlier jobs have finished (see
    /// `docs/sim.md`), wherever the simulation puts them.
    pub started_after_ms: Option<i64>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TraceError {
    #[error("line {line}: {message}")]
    Line { line: usize, message: String },
    #[error("the trace has no jobs")]
    Empty,
    #[error("unknown workload {0:?}; one of poisson, diurnal, bursty, mixed, monorepo, scheduled, fanout, changing")]
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
    #[serde(default)]
    run_id: Option<u64>,
    #[serde(default)]
    workflow: Option<String>,
    #[serde(default)]
    started_after: Option<f64>,
}

/// The CSV columns, in their documented order; the first three are
/// required, the others optional (a row may stop after any of them).
const COLUMNS: [&str; 7] = [
    "arrival_s",
    "duration_s",
    "labels",
    "repo",
    "run_id",
    "workflow",
    "started_after",
];

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
    // The line each job came from, for errors found after parsing.
    let mut lines_of = Vec::new();
    if csv {
        let Some((line, header)) = lines.next() else {
            return Err(TraceError::Empty);
        };
        let columns: Vec<&str> = header.split(',').map(str::trim).collect();
        if columns.len() < 3 || columns[..] != COLUMNS[..columns.len().min(COLUMNS.len())] {
            return Err(TraceError::Line {
                line,
                message: format!(
                    "a CSV trace starts with the header {} (the last four optional)",
                    COLUMNS.join(",")
                ),
            });
        }
        for (line, text) in lines {
            let fields: Vec<&str> = text.split(',').map(str::trim).collect();
            let bad = |message: String| TraceError::Line { line, message };
            if fields.len() < 3 || fields.len() > columns.len() {
                return Err(bad(format!(
                    "expected 3 to {} fields, found {}",
                    columns.len(),
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
            let text_at = |i: usize| {
                fields
                    .get(i)
                    .filter(|r| !r.is_empty())
                    .map(|r| (*r).to_owned())
            };
            let run_id = match text_at(4) {
                None => None,
                Some(id) => Some(
                    id.parse::<u64>()
                        .map_err(|_| bad(format!("run_id: {id:?} is not a whole number")))?,
                ),
            };
            let started_after_ms = match text_at(6) {
                None => None,
                Some(_) => Some(number(6, "started_after")?),
            };
            lines_of.push(line);
            jobs.push(TraceJob {
                arrival_ms: number(0, "arrival_s")?,
                duration_ms: number(1, "duration_s")?,
                labels: fields[2]
                    .split(';')
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(str::to_owned)
                    .collect(),
                repo: text_at(3),
                run_id,
                workflow: text_at(5),
                started_after_ms,
            });
        }
    } else {
        for (line, text) in lines {
            let job: JsonJob = serde_json::from_str(text).map_err(|e| TraceError::Line {
                line,
                message: e.to_string(),
            })?;
            let bad = |message: String| TraceError::Line { line, message };
            lines_of.push(line);
            jobs.push(TraceJob {
                arrival_ms: seconds(job.arrival_s, "arrival_s").map_err(bad)?,
                duration_ms: seconds(job.duration_s, "duration_s").map_err(bad)?,
                labels: job.labels,
                repo: job.repo,
                run_id: job.run_id,
                workflow: job.workflow,
                started_after_ms: job
                    .started_after
                    .map(|s| seconds(s, "started_after"))
                    .transpose()
                    .map_err(bad)?,
            });
        }
    }
    if jobs.is_empty() {
        return Err(TraceError::Empty);
    }
    if let Some(line) = jobs
        .iter()
        .zip(&lines_of)
        .find(|(job, _)| job.started_after_ms.is_some() && job.run_id.is_none())
        .map(|(_, line)| *line)
    {
        return Err(TraceError::Line {
            line,
            message: "started_after needs the job's run_id (it follows its run's earlier jobs)"
                .into(),
        });
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
    /// A monorepo's CI: weekday office-hour pushes, each a workflow run
    /// whose first job plans and then fans out 1–24 jobs (`needs:`), a
    /// nightly batch of 40 jobs at 02:00 on weekdays, quiet weekends.
    Monorepo,
    /// Scheduled workflows whose start drifts (GitHub's `schedule` starts
    /// late under load): 150 jobs at 02:00–02:15 on weekdays, 60 at
    /// 06:30–06:40 every day, 200 at 04:00–04:15 on Sundays, each queued
    /// over a few minutes (each from the repository `org/NAME` of its
    /// workflow, so the report shows each one's waits); office-hour pushes
    /// (`org/app`) otherwise, quiet nights and weekends, and a holiday
    /// (days 9 and 23) with no pushes.
    Scheduled,
    /// Fan-outs without workflow runs (a trace from another system):
    /// groups of 2–30 jobs a few seconds apart, each repository with its
    /// own sizes, on office hours, quiet nights and weekends; only arrival
    /// times, labels and `repo` are known.
    Fanout,
    /// A schedule that changes: a 100-job batch at 01:00–01:15 on weekdays
    /// that stops after day 13, a 120-job one at 03:30–03:45 every day from
    /// day 10; office-hour pushes otherwise.
    Changing,
}

impl std::str::FromStr for WorkloadKind {
    type Err = TraceError;
    fn from_str(name: &str) -> Result<WorkloadKind, TraceError> {
        match name {
            "poisson" => Ok(WorkloadKind::Poisson),
            "diurnal" => Ok(WorkloadKind::Diurnal),
            "bursty" => Ok(WorkloadKind::Bursty),
            "mixed" => Ok(WorkloadKind::Mixed),
            "monorepo" => Ok(WorkloadKind::Monorepo),
            "scheduled" => Ok(WorkloadKind::Scheduled),
            "fanout" => Ok(WorkloadKind::Fanout),
            "changing" => Ok(WorkloadKind::Changing),
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
/// Relative push intensity of the monorepo workload at `t` seconds:
/// weekdays 08:00–19:00 on a hump peaking mid-afternoon with a lunch dip,
/// a trickle at night, weekends at a twentieth of a weekday.
fn office_intensity(t: f64) -> f64 {
    let day = (t / DAY_S).floor() as i64;
    let hour = (t % DAY_S) / 3600.0;
    let office = if (8.0..19.0).contains(&hour) {
        let hump = (PI * (hour - 8.0) / 11.0).sin();
        if (12.0..13.0).contains(&hour) {
            0.6 * hump
        } else {
            hump
        }
    } else {
        0.0
    };
    let level = 0.02 + office;
    if day.rem_euclid(7) >= 5 {
        0.05 * level
    } else {
        level
    }
}

/// Mean of `intensity` over a week, at one-minute steps.
fn weekly_mean(intensity: fn(f64) -> f64) -> f64 {
    let steps = 7 * 24 * 60;
    (0..steps)
        .map(|m| intensity(f64::from(m) * 60.0))
        .sum::<f64>()
        / f64::from(steps)
}

/// Arrival times of a Poisson process whose rate follows `intensity`
/// (mean `rate` per second over a week), by thinning.
fn thinned(
    rng: &mut StdRng,
    horizon: f64,
    rate: f64,
    intensity: fn(f64) -> f64,
    peak: f64,
) -> Vec<f64> {
    let peak_rate = rate * peak / weekly_mean(intensity);
    let mut times = Vec::new();
    let mut t = exponential(rng, 1.0 / peak_rate);
    while t < horizon {
        if rng.gen::<f64>() * peak < intensity(t) {
            times.push(t);
        }
        t += exponential(rng, 1.0 / peak_rate);
    }
    times
}

/// The nightly batch: this many jobs at 02:00 on weekdays.
const BATCH_JOBS: u32 = 40;

/// The monorepo workload's jobs (see [`WorkloadKind::Monorepo`]).
fn monorepo(rng: &mut StdRng, horizon: f64, jobs: f64, labels: &[Vec<String>]) -> Vec<TraceJob> {
    let mut out = Vec::new();
    let mut run_id = 0u64;
    let days = (horizon / DAY_S).ceil() as i64;
    let weekdays = (0..days).filter(|d| d % 7 < 5).count() as f64;
    let pick = |rng: &mut StdRng| labels[rng.gen_range(0..labels.len())].clone();
    // The nightly batch: one run, its jobs queued within two seconds.
    for day in (0..days).filter(|d| d % 7 < 5) {
        run_id += 1;
        let at = day as f64 * DAY_S + 2.0 * 3600.0;
        let pool = pick(rng);
        for _ in 0..BATCH_JOBS {
            let mut one = job(
                at + rng.gen_range(0.0..2.0),
                4.0 * duration_s(rng),
                pool.clone(),
            );
            one.run_id = Some(run_id);
            one.workflow = Some("nightly".into());
            out.push(one);
        }
    }
    // Pushes: a plan job, then a fan-out of 1–24 (most runs small).
    // A plan job and a fan-out of 1 + ⌊24u²⌋ (capped at 24): 9.5 on average.
    let mean_run = 1.0 + 8.5;
    let push_rate = ((jobs - weekdays * f64::from(BATCH_JOBS)).max(0.0) / mean_run) / horizon;
    for push in thinned(rng, horizon, push_rate, office_intensity, 1.03) {
        run_id += 1;
        let pool = pick(rng);
        let plan_s = rng.gen_range(40.0..120.0);
        let mut plan = job(push, plan_s, pool.clone());
        plan.run_id = Some(run_id);
        plan.workflow = Some("ci".into());
        out.push(plan);
        let fan_out = 1 + (24.0 * rng.gen::<f64>().powi(2)).floor().min(23.0) as u32;
        // Without waiting, the fan-out is queued 3 s after the plan ends.
        let after = 3.0;
        for i in 0..fan_out {
            let at = push + plan_s + after + f64::from(i) * 0.02;
            let mut one = job(at, duration_s(rng), pool.clone());
            one.run_id = Some(run_id);
            one.workflow = Some("ci".into());
            one.started_after_ms = Some((after * 1000.0) as i64);
            out.push(one);
        }
    }
    out.retain(|j| (j.arrival_ms as f64) < horizon * 1000.0);
    out
}

/// A scheduled workflow: `jobs` jobs queued over `over_s` (a range of
/// seconds) from a start that drifts up to `drift_s` after `at_s` (seconds
/// into the day), on the days `on` says, each `length` times a usual job.
struct Schedule {
    name: &'static str,
    jobs: u32,
    at_s: f64,
    drift_s: f64,
    over_s: (f64, f64),
    length: f64,
    on: fn(i64) -> bool,
}

fn weekday(day: i64) -> bool {
    day.rem_euclid(7) < 5
}

/// The runs of `schedules` over `days` days (one run id each, from
/// `run_id`), and office-hour pushes for the rest of `jobs` (one job each,
/// none on `holidays`).
#[allow(clippy::too_many_arguments)]
fn scheduled(
    rng: &mut StdRng,
    horizon: f64,
    jobs: f64,
    labels: &[Vec<String>],
    schedules: &[Schedule],
    holidays: &[i64],
) -> Vec<TraceJob> {
    let mut out = Vec::new();
    let days = (horizon / DAY_S).ceil() as i64;
    let pick = |rng: &mut StdRng| labels[rng.gen_range(0..labels.len())].clone();
    let mut run_id = 0u64;
    for day in 0..days {
        for schedule in schedules.iter().filter(|s| (s.on)(day)) {
            run_id += 1;
            let start = day as f64 * DAY_S + schedule.at_s + rng.gen_range(0.0..=schedule.drift_s);
            let over = rng.gen_range(schedule.over_s.0..=schedule.over_s.1);
            let pool = pick(rng);
            for _ in 0..schedule.jobs {
                let mut one = job(
                    start + rng.gen_range(0.0..over),
                    schedule.length * duration_s(rng),
                    pool.clone(),
                );
                one.repo = Some(format!("org/{}", schedule.name));
                one.run_id = Some(run_id);
                one.workflow = Some(schedule.name.into());
                out.push(one);
            }
        }
    }
    let pushes = (jobs - out.len() as f64).max(0.0);
    for at in thinned(rng, horizon, pushes / horizon, office_intensity, 1.03) {
        if holidays.contains(&((at / DAY_S).floor() as i64)) {
            continue;
        }
        let mut one = job(at, duration_s(rng), pick(rng));
        one.repo = Some("org/app".into());
        out.push(one);
    }
    out
}

/// The fan-out workload's groups (see [`WorkloadKind::Fanout`]).
fn fanouts(rng: &mut StdRng, horizon: f64, jobs: f64, labels: &[Vec<String>]) -> Vec<TraceJob> {
    // (repository, smallest and largest group, share of the groups)
    const REPOS: [(&str, u32, u32, f64); 4] = [
        ("org/web", 2, 6, 0.4),
        ("org/matrix", 10, 14, 0.25),
        ("org/monolith", 20, 30, 0.15),
        ("org/tools", 2, 30, 0.2),
    ];
    let mean: f64 = REPOS
        .iter()
        .map(|(_, lo, hi, share)| share * f64::from(lo + hi) / 2.0)
        .sum();
    let mut out = Vec::new();
    for start in thinned(rng, horizon, jobs / mean / horizon, office_intensity, 1.03) {
        let mut pick = rng.gen::<f64>();
        let (repo, lo, hi, _) = REPOS
            .iter()
            .find(|(_, _, _, share)| {
                pick -= share;
                pick < 0.0
            })
            .copied()
            .unwrap_or(REPOS[0]);
        let pool = labels[rng.gen_range(0..labels.len())].clone();
        let mut at = start;
        for _ in 0..rng.gen_range(lo..=hi) {
            let mut one = job(at, duration_s(rng), pool.clone());
            one.repo = Some(repo.into());
            out.push(one);
            // The next one a few seconds on.
            at += exponential(rng, 3.0);
        }
    }
    out
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
        let total = self.jobs as f64;
        let special = match self.kind {
            WorkloadKind::Monorepo => Some(monorepo(&mut rng, horizon, total, &pools)),
            WorkloadKind::Scheduled => Some(scheduled(
                &mut rng,
                horizon,
                total,
                &pools,
                &[
                    Schedule {
                        name: "nightly",
                        jobs: 150,
                        at_s: 2.0 * 3600.0,
                        drift_s: 900.0,
                        over_s: (60.0, 240.0),
                        length: 4.0,
                        on: weekday,
                    },
                    Schedule {
                        name: "daily",
                        jobs: 60,
                        at_s: 6.5 * 3600.0,
                        drift_s: 600.0,
                        over_s: (60.0, 120.0),
                        length: 1.0,
                        on: |_| true,
                    },
                    Schedule {
                        name: "weekly",
                        jobs: 200,
                        at_s: 4.0 * 3600.0,
                        drift_s: 900.0,
                        over_s: (180.0, 360.0),
                        length: 2.0,
                        on: |day| day.rem_euclid(7) == 6,
                    },
                ],
                &[9, 23],
            )),
            WorkloadKind::Fanout => Some(fanouts(&mut rng, horizon, total, &pools)),
            WorkloadKind::Changing => Some(scheduled(
                &mut rng,
                horizon,
                total,
                &pools,
                &[
                    Schedule {
                        name: "old-nightly",
                        jobs: 100,
                        at_s: 3600.0,
                        drift_s: 900.0,
                        over_s: (60.0, 180.0),
                        length: 2.0,
                        on: |day| weekday(day) && day <= 13,
                    },
                    Schedule {
                        name: "new-nightly",
                        jobs: 120,
                        at_s: 3.5 * 3600.0,
                        drift_s: 900.0,
                        over_s: (60.0, 180.0),
                        length: 2.0,
                        on: |day| day >= 10,
                    },
                ],
                &[],
            )),
            _ => None,
        };
        if let Some(mut jobs) = special {
            jobs.retain(|j| (j.arrival_ms as f64) < horizon * 1000.0);
            jobs.sort_by_key(|j| j.arrival_ms);
            return jobs;
        }
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
                WorkloadKind::Poisson
                | WorkloadKind::Mixed
                | WorkloadKind::Monorepo
                | WorkloadKind::Scheduled
                | WorkloadKind::Fanout
                | WorkloadKind::Changing => {
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
                    let mean = weekly_mean(diurnal_intensity);
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
                    let mean = weekly_mean(diurnal_intensity);
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
        run_id: None,
        workflow: None,
        started_after_ms: None,
    }
}

#[cfg(test)]
mod tests;
