//! What a job's move does to its runner.
//!
//! A job that starts, ends or loses its lease changes its runner too; the
//! store writes both in one transaction (`Store::move_job_and_runner`), so
//! no crash leaves a running job on an idle runner or a busy runner on a
//! finished job. These are the decisions it applies: pure, given the rows
//! and the time, each returning the runner's next row (`None`: leave it).

use crate::job::{Job, JobId, JobState};
use crate::runner::{Runner, RunnerEvent, RunnerState, RunnerTransitionError};
use std::time::Duration;

use crate::time::Timestamp;

/// A runner starting `job` (an accept, or GitHub's `in_progress`): busy with
/// it. Refused when the runner cannot start a job — being scaled down
/// (terminating) or gone — so the job is not started on a runner about to
/// be stopped.
pub fn start(job: &Job, runner: &Runner, now: Timestamp) -> Result<Runner, RunnerTransitionError> {
    start_by_id(job.id, runner, now)
}

/// [`start`] by the job's id alone: what the hot path decides before it
/// has read the job (its guard checks the job in the same statement).
pub fn start_by_id(
    job: JobId,
    runner: &Runner,
    now: Timestamp,
) -> Result<Runner, RunnerTransitionError> {
    runner.apply(&RunnerEvent::JobAssigned { job }, now)
}

/// A runner that claims a job and starts it at once (the one-step start of
/// the runner API): busy, as [`start`] makes it, with the job left for the
/// store to fill in — the store picks the job in the same statement that
/// writes this row. Refused exactly when [`start`] would refuse any job.
pub fn start_on_claim(runner: &Runner, now: Timestamp) -> Result<Runner, RunnerTransitionError> {
    let mut busy = start_by_id(JobId(0), runner, now)?;
    busy.job = None;
    Ok(busy)
}

/// A job that ended (completed, cancelled, failed): its runner is free
/// again if it was busy with this job, or busy with no job named (GitHub
/// kept it for this job, whose `in_progress` never came). With
/// `terminate` (an ephemeral runner's one job is done) or on a drained
/// runner, it is asked to stop as well. A runner busy with another job is
/// left alone.
pub fn finish(job: &Job, runner: &Runner, terminate: bool, now: Timestamp) -> Option<Runner> {
    finish_by_id(job.id, runner, terminate, now)
}

/// [`finish`] by the job's id alone (see [`start_by_id`]).
pub fn finish_by_id(
    job: JobId,
    runner: &Runner,
    terminate: bool,
    now: Timestamp,
) -> Option<Runner> {
    let holding =
        runner.state == RunnerState::Busy && (runner.job == Some(job) || runner.job.is_none());
    if !holding {
        return None;
    }
    let free = runner.apply(&RunnerEvent::JobFinished, now).ok()?;
    if terminate || free.draining {
        if let Ok(stopping) = free.apply(&RunnerEvent::TerminateRequested, now) {
            return Some(stopping);
        }
    }
    Some(free)
}

/// A job whose lease expired (`before` is the job as it was): if it was
/// running, its runner stopped reporting mid-job and is marked crashed. A
/// job that was only claimed (provisioning) never made its runner busy,
/// and a runner busy with another job is not this job's to crash.
pub fn lease_expired(before: &Job, runner: &Runner, now: Timestamp) -> Option<Runner> {
    let held = before.state == JobState::Running && before.runner == Some(runner.id);
    let busy_with_it = runner.job == Some(before.id) || runner.job.is_none();
    if !held || !busy_with_it {
        return None;
    }
    let reason = format!("lease on running job {} expired", before.id);
    runner.apply(&RunnerEvent::Crashed { reason }, now).ok()
}

/// Whether a lease sweeper that has been up since `up_since` may expire
/// leases at `now`. Not until it has been up for one whole `lease`: a
/// runner's heartbeats while this process was down (restarting, or not yet
/// started) could not reach it, so a deadline that passed then says nothing
/// about the runner. Without this, a restart slower than the lease marks
/// every busy runner crashed and requeues its job although it is running
/// fine. Another replica that stayed up sweeps meanwhile.
pub fn may_expire_leases(up_since: Timestamp, lease: Duration, now: Timestamp) -> bool {
    now >= up_since.plus(lease)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{JobEvent, JobId, JobSource, NewJob};
    use crate::runner::{NewRunner, RunnerId};

    fn at(ms: i64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn runner(state: RunnerState, job: Option<i64>) -> Runner {
        let mut runner = NewRunner {
            name: "r".into(),
            pool: "p".into(),
            provider: "sim".into(),
            labels: vec![],
            stock: false,
        }
        .initial(RunnerId(7), at(0));
        runner.state = state;
        runner.job = job.map(JobId);
        runner
    }

    fn job(state: JobState, holder: Option<i64>) -> Job {
        let mut job = NewJob {
            source: JobSource::Api,
            external_id: "j".into(),
            route: crate::job::Route::Pool("p".into()),
            labels: vec![],
            payload: String::new(),
            max_attempts: 3,
            share: Default::default(),
        }
        .initial(JobId(1), at(0));
        job.state = state;
        job.runner = holder.map(RunnerId);
        job
    }

    /// One row per case: (runner state, its job) → what each decision makes of it.
    #[test]
    fn decisions_by_case() {
        use RunnerState::*;
        let cases: [(RunnerState, Option<i64>, &str, &str, &str); 7] = [
            // state, job, start, finish (ephemeral), lease expiry of a running job held by it
            (Idle, None, "busy(1)", "-", "-"),
            (Provisioning, None, "busy(1)", "-", "-"),
            (Busy, Some(1), "refused", "terminating", "crashed"),
            (Busy, None, "busy(1)", "terminating", "crashed"),
            (Busy, Some(2), "refused", "-", "-"),
            (Terminating, None, "refused", "-", "-"),
            (Terminated, None, "refused", "-", "-"),
        ];
        let show = |r: Option<Runner>| match r {
            None => "-".to_owned(),
            Some(r) if r.state == Busy => format!("busy({})", r.job.map(|j| j.0).unwrap_or(0)),
            Some(r) => r.state.as_str().to_owned(),
        };
        let running = job(JobState::Running, Some(7));
        for (state, held, started, finished, expired) in cases {
            let r = runner(state, held);
            let got_start = match start(&running, &r, at(1)) {
                Ok(next) => show(Some(next)),
                Err(_) => "refused".to_owned(),
            };
            let got_finish = show(finish(&running, &r, true, at(1)));
            let got_expiry = show(lease_expired(&running, &r, at(1)));
            assert_eq!(
                (got_start.as_str(), got_finish.as_str(), got_expiry.as_str()),
                (started, finished, expired),
                "runner {state:?} with job {held:?}"
            );
        }
    }

    /// A claim that starts at once makes of the runner what a start of the
    /// claimed job would, in every state, draining or not.
    #[test]
    fn start_on_claim_is_start_with_the_job_left_open() {
        let running = job(JobState::Running, Some(7));
        for state in RunnerState::ALL {
            for held in [None, Some(1), Some(2)] {
                for draining in [false, true] {
                    let mut r = runner(state, held);
                    r.draining = draining;
                    let direct = start(&running, &r, at(3));
                    let claimed = start_on_claim(&r, at(3)).map(|mut busy| {
                        assert_eq!(busy.job, None);
                        busy.job = Some(running.id);
                        busy
                    });
                    assert_eq!(
                        claimed.is_ok(),
                        direct.is_ok(),
                        "{state:?} {held:?} {draining}"
                    );
                    if let (Ok(claimed), Ok(direct)) = (claimed, direct) {
                        assert_eq!(claimed, direct, "{state:?} {held:?} {draining}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_finish_without_terminate_leaves_the_runner_idle() {
        let busy = runner(RunnerState::Busy, Some(1));
        let next = finish(&job(JobState::Completed, Some(7)), &busy, false, at(5)).unwrap();
        assert_eq!((next.state, next.job), (RunnerState::Idle, None));
    }

    #[test]
    fn only_a_running_job_held_by_the_runner_crashes_it() {
        let busy = runner(RunnerState::Busy, Some(1));
        // Claimed, never accepted: the runner was never busy with it.
        assert_eq!(
            lease_expired(&job(JobState::Provisioning, Some(7)), &busy, at(1)),
            None
        );
        // Held by another runner.
        assert_eq!(
            lease_expired(&job(JobState::Running, Some(8)), &busy, at(1)),
            None
        );
        let _ = JobEvent::LeaseExpired;
    }

    #[test]
    fn leases_expire_only_after_a_whole_lease_of_uptime() {
        let lease = Duration::from_secs(2);
        for (up_since, now, may) in [
            (0, 0, false),
            (0, 1_999, false),
            (0, 2_000, true),
            (0, 60_000, true),
            (10_000, 11_000, false),
        ] {
            assert_eq!(
                may_expire_leases(at(up_since), lease, at(now)),
                may,
                "up since {up_since} ms, now {now} ms"
            );
        }
    }
}

/// How long to wait before asking GitHub again to deregister a runner it
/// refused `refusals` times: `first`, doubling with each refusal, at most
/// 64 × `first` (the scale-down ADR allows a runner one or two wasted
/// deletes; doubling from `[github] recheck_after` keeps a long job to a
/// few).
pub fn deregistration_backoff(first: std::time::Duration, refusals: u32) -> std::time::Duration {
    first.saturating_mul(1 << refusals.saturating_sub(1).min(6))
}

#[cfg(test)]
mod deregistration_tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn deregistration_asks_double_their_wait_up_to_a_bound() {
        let minutes = |m: u64| Duration::from_secs(60 * m);
        let waits: Vec<Duration> = (1..=9)
            .map(|n| deregistration_backoff(minutes(5), n))
            .collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 320, 320, 320].map(minutes),);
        // A one-hour job seen from recheck_after (5 min): asks at 5, 10,
        // 20 and 40 minutes are refused, the one at 80 is taken.
        let mut at = minutes(5);
        let mut refused = 0;
        while at < minutes(60) {
            refused += 1;
            at += deregistration_backoff(minutes(5), refused);
        }
        assert_eq!(refused, 4, "not one a round (330 before)");
    }
}
