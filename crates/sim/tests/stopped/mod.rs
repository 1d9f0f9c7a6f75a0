//! Stopped runners in the simulator (issue 60): prepared once, stopped at
//! the provider's stopped price and off its quota, started for one job in
//! `resume_seconds`, and what the policies that use them gain.

use std::time::Duration;

use runway_core::stopped::StoppedPolicy;
use runway_sim::report::{compare, Summary};
use runway_sim::{run, Setup, TraceJob, WorkloadKind};

use super::{run_job, setup, workload};

const BOOT: f64 = 150.0;
const RESUME: f64 = 20.0;

/// The setting: boot 150 s, resume 20 s, a stopped hour at 3 % of
/// a running one.
fn stopping(max_runners: u32, min_stopped: u32, max_stopped: u32) -> Setup {
    let mut setup = setup(max_runners, (BOOT, BOOT));
    setup.providers[0].resume_seconds = Some(RESUME);
    setup.providers[0].stopped_price_per_hour = 0.003;
    setup.pools[0].stopped = StoppedPolicy {
        min_stopped,
        max_stopped,
        max_age: Duration::from_secs(24 * 3_600),
    };
    setup
}

fn job_at(arrival_s: f64, duration_s: f64) -> TraceJob {
    TraceJob {
        run_id: None,
        workflow: None,
        ..run_job(arrival_s, duration_s, 0, None)
    }
}

#[test]
fn a_stopped_runner_serves_a_job_in_its_resume_time_and_costs_its_disk_while_stopped() {
    let setup = stopping(10, 2, 2);
    // One job an hour in: the stock of two was prepared at the start.
    let jobs = vec![job_at(3_600.0, 600.0)];
    let mut policy = runway_sim::policy::by_name("runway+stopped", 1).unwrap();
    let outcome = run(&setup, &jobs, policy.as_mut());
    assert_eq!(outcome.jobs, 1);
    assert_eq!(outcome.starts, 1, "{outcome:?}");
    // Started on the arrival's reaction, ready RESUME later.
    let wait_s = outcome.queue_ms[0] as f64 / 1000.0;
    assert!(
        (RESUME..=RESUME + 1.0).contains(&wait_s),
        "waited {wait_s} s"
    );
    // Two prepared at first, one more to replace the started one.
    assert_eq!(outcome.runners_prepared, 3, "{outcome:?}");
    // Running hours: three preparing boots, one resume and the job (the
    // ephemeral runner is deleted after it); the rest is stopped time.
    let running = (3.0 * BOOT + RESUME + 600.0) / 3_600.0;
    assert!(
        (outcome.runner_hours - running).abs() < 0.01,
        "{} running hours, expected {running}",
        outcome.runner_hours
    );
    let expected_cost = running * 0.10 + outcome.stopped_hours * 0.003;
    assert!((outcome.cost - expected_cost).abs() < 1e-6, "{outcome:?}");
    assert!(outcome.stopped_hours > 1.9, "{outcome:?}");
}

#[test]
fn stopped_runners_do_not_count_against_max_runners_until_started() {
    // One runner at a time, five kept stopped: a burst of three is served
    // one after the other, each by a started stopped runner.
    let setup = stopping(1, 5, 5);
    let jobs: Vec<TraceJob> = (0..3).map(|_| job_at(3_600.0, 60.0)).collect();
    let mut policy = runway_sim::policy::by_name("runway+stopped", 1).unwrap();
    let outcome = run(&setup, &jobs, policy.as_mut());
    assert_eq!(outcome.jobs, 3);
    assert_eq!(outcome.starts, 3, "{outcome:?}");
    assert_eq!(
        outcome.runners_created - outcome.runners_prepared,
        0,
        "no cold boot"
    );
    let waits: Vec<f64> = outcome
        .queue_ms
        .iter()
        .map(|&ms| ms as f64 / 1000.0)
        .collect();
    // The second waits for the first's job and its own resume.
    assert!(waits[2] >= 2.0 * (60.0 + RESUME) - 2.0, "{waits:?}");
}

#[test]
fn stopped_runners_past_their_age_are_replaced() {
    let mut setup = stopping(10, 2, 2);
    setup.pools[0].stopped.max_age = Duration::from_secs(3_600);
    // Nothing arrives for three and a half hours, then one job.
    let jobs = vec![job_at(12_600.0, 60.0)];
    let mut policy = runway_sim::policy::by_name("runway+stopped", 1).unwrap();
    let outcome = run(&setup, &jobs, policy.as_mut());
    // Two at first, and two more each hour: 2 + 3 × 2, and the started one's replacement.
    assert_eq!(outcome.runners_prepared, 9, "{outcome:?}");
    assert_eq!(outcome.starts, 1);
}

#[test]
fn a_provider_that_cannot_stop_is_never_asked_to() {
    let mut setup = stopping(10, 2, 2);
    setup.providers[0].resume_seconds = None;
    let jobs = vec![job_at(600.0, 60.0)];
    let mut policy = runway_sim::policy::by_name("predictive+stopped", 1).unwrap();
    let outcome = run(&setup, &jobs, policy.as_mut());
    assert_eq!((outcome.runners_prepared, outcome.starts), (0, 0));
    assert_eq!(outcome.stopped_hours, 0.0);
    assert_eq!(outcome.jobs, 1);
}

fn summaries(setup: &Setup, jobs: &[TraceJob]) -> Vec<Summary> {
    let names: Vec<String> = ["runway", "predictive", "predictive+stopped"]
        .iter()
        .map(|n| n.to_string())
        .collect();
    let outcomes = compare(setup, jobs, &names).unwrap();
    let mut summaries: Vec<Summary> = outcomes.iter().map(Summary::of).collect();
    runway_sim::report::relate(&mut summaries);
    summaries
}

/// Predictive with stopped runners against reactive and predictive
/// without them, on a week of a workload: mean wait at most a quarter of
/// reactive's, and (`p95_goal`) the 95th percentile at most 0.3 of it.
fn stopped_beats_idle(kind: WorkloadKind, p95_goal: bool) {
    let setup = stopping(200, 0, 200);
    let jobs = workload(kind, 7, 6_000, 3);
    let summaries = summaries(&setup, &jobs);
    let [reactive, warm, stopped] = &summaries[..] else {
        panic!("three summaries");
    };
    let ratio = |s: &Summary, r: &Summary| s.queue_p95_s / r.queue_p95_s.max(0.001);
    let show = format!("{reactive:?}\n{warm:?}\n{stopped:?}");
    assert_eq!(reactive.starts, 0, "{show}");
    assert!(stopped.starts > 0, "{show}");
    assert!(
        stopped.queue_mean_s < warm.queue_mean_s,
        "stopped waits less than idle warm: {show}"
    );
    assert!(stopped.wait_vs_runway.unwrap() <= 0.25, "{show}");
    if p95_goal {
        assert!(ratio(stopped, reactive) <= 0.3, "{show}");
    }
}

#[test]
fn stopped_runners_cut_the_waits_of_the_diurnal_workload() {
    stopped_beats_idle(WorkloadKind::Diurnal, true);
}

#[test]
fn stopped_runners_cut_the_waits_of_the_bursty_workload() {
    // Not the p95 yet: bursts of up to 16 in a second outrun a stock the
    // first week's forecast sizes (docs/sim.md, "Results: stopped runners").
    stopped_beats_idle(WorkloadKind::Bursty, false);
}
