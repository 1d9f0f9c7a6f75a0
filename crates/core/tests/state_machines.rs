//! Property tests: random event sequences against the job and runner state
//! machines, checking the invariants the rest of runway relies on.

use proptest::prelude::*;
use runway_core::job::{NewJob, Route};
use runway_core::runner::NewRunner;
use runway_core::{
    Conclusion, Job, JobEvent, JobId, JobSource, JobState, JobTransitionError, RunnerEvent,
    RunnerId, RunnerState, RunnerTransitionError, Timestamp,
};

fn new_job(max_attempts: u32) -> Job {
    new_job_routed(max_attempts, Route::Pool("default".into()))
}

fn new_job_routed(max_attempts: u32, route: Route) -> Job {
    NewJob {
        source: JobSource::Api,
        external_id: "ext-1".into(),
        route,
        labels: vec!["self-hosted".into()],
        payload: "{}".into(),
        max_attempts,
        share: Default::default(),
    }
    .initial(JobId(1), Timestamp::from_millis(0))
}

fn runner_id() -> impl Strategy<Value = RunnerId> {
    (1i64..4).prop_map(RunnerId)
}

fn conclusion() -> impl Strategy<Value = Conclusion> {
    prop::sample::select(Conclusion::ALL.to_vec())
}

/// Events with lease deadlines relative to the moment they are applied.
#[derive(Debug, Clone)]
enum Step {
    Claim(RunnerId, i64),
    Keepalive(RunnerId, i64),
    Accept(RunnerId),
    Decline(RunnerId),
    Complete(RunnerId, Conclusion),
    ExternalStart(RunnerId),
    ExternalComplete(Conclusion),
    Cancel,
    LeaseExpired,
    HolderLost(RunnerId),
    Release,
    GiveUp,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (runner_id(), 1i64..5_000).prop_map(|(r, d)| Step::Claim(r, d)),
        2 => (runner_id(), 1i64..5_000).prop_map(|(r, d)| Step::Keepalive(r, d)),
        3 => runner_id().prop_map(Step::Accept),
        2 => runner_id().prop_map(Step::Decline),
        1 => (runner_id(), conclusion()).prop_map(|(r, c)| Step::Complete(r, c)),
        1 => runner_id().prop_map(Step::ExternalStart),
        1 => conclusion().prop_map(Step::ExternalComplete),
        1 => Just(Step::Cancel),
        4 => Just(Step::LeaseExpired),
        2 => runner_id().prop_map(Step::HolderLost),
        1 => Just(Step::Release),
        1 => Just(Step::GiveUp),
    ]
}

fn event(step: &Step, now: Timestamp) -> JobEvent {
    match step.clone() {
        Step::Claim(runner, d) => JobEvent::Claim {
            runner,
            lease_deadline: Timestamp::from_millis(now.as_millis() + d),
        },
        Step::Keepalive(runner, d) => JobEvent::Keepalive {
            runner,
            lease_deadline: Timestamp::from_millis(now.as_millis() + d),
        },
        Step::Accept(runner) => JobEvent::Accept { runner },
        Step::Decline(runner) => JobEvent::Decline { runner },
        Step::Complete(runner, conclusion) => JobEvent::Complete { runner, conclusion },
        Step::ExternalStart(runner) => JobEvent::ExternalStart { runner },
        Step::ExternalComplete(conclusion) => JobEvent::ExternalComplete {
            conclusion,
            runner: None,
        },
        Step::Cancel => JobEvent::Cancel {
            reason: "test".into(),
        },
        Step::LeaseExpired => JobEvent::LeaseExpired,
        Step::HolderLost(runner) => JobEvent::HolderLost { runner },
        Step::Release => JobEvent::Release {
            pool: "default".into(),
            share: Default::default(),
        },
        Step::GiveUp => JobEvent::GiveUp {
            reason: "test".into(),
        },
    }
}

/// The runner event a generated step `choice` stands for (the `i`-th
/// step; `job` names the job of an assignment): 0–9 the lifecycle every
/// runner meets, 10–13 the stock's (stop, stopped, start) and a drain.
fn runner_event(choice: u8, i: usize, job: i64) -> RunnerEvent {
    match choice {
        0 => RunnerEvent::ProvisioningStarted {
            instance_id: format!("i-{i}"),
        },
        1 => RunnerEvent::Ready,
        2 => RunnerEvent::JobAssigned { job: JobId(job) },
        3 => RunnerEvent::JobFinished,
        4 => RunnerEvent::TerminateRequested,
        5 => RunnerEvent::Terminated,
        6 => RunnerEvent::Failed {
            reason: "boot timeout".into(),
        },
        7 => RunnerEvent::RemovalRefused,
        8 => RunnerEvent::CreateInDoubt {
            reason: "create timed out".into(),
        },
        10 => RunnerEvent::StopRequested,
        11 => RunnerEvent::Stopped,
        12 => RunnerEvent::StartRequested,
        13 => RunnerEvent::DrainRequested,
        _ => RunnerEvent::Crashed {
            reason: "lost".into(),
        },
    }
}

proptest! {
    /// The store applies accept, heartbeat and complete as one conditional
    /// UPDATE built from `JobEvent::guarded`: wherever its guard holds, that
    /// must be exactly what the state machine does; where it does not, the
    /// store falls back to `Job::apply`.
    #[test]
    fn a_guarded_change_is_the_state_machine_wherever_its_guard_holds(
        max_attempts in 1u32..5,
        steps in prop::collection::vec((step(), 0i64..3_000), 1..40),
        probes in prop::collection::vec(step(), 1..8),
    ) {
        let mut job = new_job(max_attempts);
        let mut now = Timestamp::from_millis(0);
        for (step, advance) in steps {
            now = Timestamp::from_millis(now.as_millis() + advance);
            for probe in &probes {
                let event = event(probe, now);
                if let Some(change) = event.guarded(now) {
                    match change.applied_to(&job) {
                        Some(guarded) => prop_assert_eq!(job.apply(&event, now), Ok(guarded)),
                        None => prop_assert!(!change.holds_for(&job)),
                    }
                }
            }
            if let Ok(next) = job.apply(&event(&step, now), now) {
                job = next;
            }
        }
    }
}

#[test]
fn the_hot_path_events_have_guards_that_hold_on_the_usual_path() {
    let runner = RunnerId(7);
    let mut now = Timestamp::from_millis(1_000);
    let mut job = new_job(3);
    let claim = JobEvent::Claim {
        runner,
        lease_deadline: now.plus(std::time::Duration::from_secs(60)),
    };
    assert_eq!(
        claim.guarded(now),
        None,
        "a claim reads the queue, not one row"
    );
    job = job.apply(&claim, now).expect("claim");
    for event in [
        JobEvent::Accept { runner },
        JobEvent::Keepalive {
            runner,
            lease_deadline: now.plus(std::time::Duration::from_secs(120)),
        },
        JobEvent::Complete {
            runner,
            conclusion: Conclusion::Success,
        },
    ] {
        now = now.plus(std::time::Duration::from_secs(1));
        let change = event.guarded(now).expect("a hot-path event has a guard");
        let guarded = change
            .applied_to(&job)
            .expect("the guard holds on the usual path");
        assert_eq!(Ok(guarded.clone()), job.apply(&event, now));
        job = guarded;
    }
    assert_eq!(job.state, JobState::Completed);
    // A stranger's completion does not satisfy the guard: the store reads
    // the row and the state machine refuses it.
    let stranger = JobEvent::Complete {
        runner: RunnerId(8),
        conclusion: Conclusion::Success,
    };
    assert!(stranger
        .guarded(now)
        .and_then(|c| c.applied_to(&job))
        .is_none());
}

proptest! {
    #[test]
    fn job_invariants_hold_under_any_event_sequence(
        max_attempts in 1u32..5,
        held in any::<bool>(),
        steps in prop::collection::vec((step(), 0i64..3_000), 1..60),
    ) {
        // A job starts queued in its pool, or held without one (issue 58).
        let mut job = if held {
            new_job_routed(max_attempts, Route::Held { reason: "facts unknown".into() })
        } else {
            new_job(max_attempts)
        };
        let mut now = Timestamp::from_millis(0);
        prop_assert!(job.invariant_violations().is_empty());
        for (step, advance) in steps {
            now = Timestamp::from_millis(now.as_millis() + advance);
            let event = event(&step, now);
            let result = job.apply(&event, now);
            if job.state.is_terminal() {
                // A terminal job never moves again.
                let is_terminal_error = matches!(result, Err(JobTransitionError::Terminal { .. }));
                prop_assert!(is_terminal_error, "terminal job accepted {:?}", event);
                continue;
            }
            let Ok(next) = result else { continue };
            prop_assert!(next.invariant_violations().is_empty(), "{:?}", next.invariant_violations());
            // Attempts only grow; declined runners stay excluded.
            prop_assert!(next.attempts >= job.attempts);
            prop_assert!(next.excluded_runners.is_superset(&job.excluded_runners));
            prop_assert_eq!(next.version, job.version + 1);
            prop_assert!(next.enqueued_at >= job.enqueued_at);
            // Only the holder may act for a held job.
            if let JobEvent::Accept { runner } | JobEvent::Decline { runner }
                | JobEvent::Keepalive { runner, .. } | JobEvent::Complete { runner, .. } = &event
            {
                prop_assert!(job.is_held_by(*runner));
            }
            // A claimed job is bound to exactly the claiming runner, never an excluded one.
            if let JobEvent::Claim { runner, .. } = &event {
                prop_assert_eq!(next.runner, Some(*runner));
                prop_assert!(!job.excluded_runners.contains(runner));
            }
            // A holder that stops before it accepted (silent, or its
            // machine gone) is a decline: excluded, no attempt counted
            // (GitLab router proposal). Once running, it is an attempt.
            if matches!(event, JobEvent::LeaseExpired | JobEvent::HolderLost { .. }) {
                let holder = job.runner.expect("a held job has a runner");
                if job.state == JobState::Provisioning {
                    prop_assert_eq!(next.attempts, job.attempts);
                    prop_assert_eq!(next.state, JobState::Queued);
                    prop_assert!(next.excluded_runners.contains(&holder));
                } else {
                    prop_assert_eq!(next.attempts, job.attempts + 1);
                    prop_assert!(!next.excluded_runners.contains(&holder) || job.excluded_runners.contains(&holder));
                }
            }
            // A job moves off a runner only by going back to the queue or finishing.
            if job.runner.is_some() && next.runner != job.runner {
                let external_start = matches!(event, JobEvent::ExternalStart { .. });
                prop_assert!(next.state == JobState::Queued || external_start);
            }
            // A held job is claimed by nothing and started by nothing: it
            // is released to a pool, given up, cancelled or ended by GitHub.
            if job.state == JobState::Held {
                let leaves = matches!(event, JobEvent::Release { .. } | JobEvent::GiveUp { .. }
                    | JobEvent::Cancel { .. } | JobEvent::ExternalComplete { .. });
                prop_assert!(leaves, "a held job moved by {:?}", event);
                prop_assert!(next.runner.is_none() && next.started_at.is_none());
            }
            job = next;
        }
    }

    #[test]
    fn runner_invariants_hold_and_busy_runners_are_never_terminated(
        steps in prop::collection::vec(0u8..10, 1..40),
    ) {
        let mut runner = NewRunner {
            name: "default-1".into(),
            pool: "default".into(),
            provider: "sim".into(),
            labels: vec![], stock: false,
        }
        .initial(RunnerId(1), Timestamp::from_millis(0));
        let mut job_counter = 0;
        for (i, choice) in steps.into_iter().enumerate() {
            let now = Timestamp::from_millis(i as i64 * 1_000);
            job_counter += 1;
            let event = runner_event(choice, i, job_counter);
            let result = runner.apply(&event, now);
            if runner.state.is_terminal() {
                let is_terminal_error = matches!(result, Err(RunnerTransitionError::Terminal { .. }));
                prop_assert!(is_terminal_error);
                continue;
            }
            if runner.state == RunnerState::Busy && event == RunnerEvent::TerminateRequested {
                // Busy with a known job: refused as busy; busy with a job
                // not yet known (removal refused): refused all the same.
                let refused = match runner.job {
                    Some(_) => matches!(result, Err(RunnerTransitionError::Busy { .. })),
                    None => result.is_err(),
                };
                prop_assert!(refused);
            }
            if matches!(event, RunnerEvent::CreateInDoubt { .. }) {
                // Only a create not yet answered can be in doubt.
                let requested = runner.state == RunnerState::Requested && runner.instance_id.is_none();
                prop_assert_eq!(result.is_ok(), requested);
            }
            let Ok(next) = result else { continue };
            prop_assert!(next.invariant_violations().is_empty(), "{:?}", next.invariant_violations());
            // In doubt until an instance is known or it leaves `requested`.
            prop_assert!(!next.create_in_doubt() || (next.state == RunnerState::Requested && next.instance_id.is_none()));
            if matches!(event, RunnerEvent::ProvisioningStarted { .. }) {
                prop_assert!(!next.create_in_doubt());
            }
            prop_assert_eq!(next.version, runner.version + 1);
            runner = next;
        }
    }
}

proptest! {
    /// Stopped runners (issue 60): whatever events come, in any order, a
    /// runner of the stock never takes a job, never becomes idle and is
    /// never busy before it is started; stopping and stopped are stock
    /// states only; a runner that has ever been busy or idle is never
    /// stopped; and every step keeps the invariants.
    #[test]
    fn a_stock_runner_takes_no_job_until_it_is_started(
        steps in prop::collection::vec(0u8..14, 1..40),
    ) {
        let mut runner = NewRunner {
            name: "default-1".into(),
            pool: "default".into(),
            provider: "sim".into(),
            labels: vec![],
            stock: true,
        }
        .initial(RunnerId(1), Timestamp::from_millis(0));
        for (i, choice) in steps.into_iter().enumerate() {
            let now = Timestamp::from_millis(i as i64 * 1_000);
            let event = runner_event(choice, i, i as i64);
            let result = runner.apply(&event, now);
            if runner.stock {
                let takes_work = matches!(
                    event,
                    RunnerEvent::Ready | RunnerEvent::JobAssigned { .. } | RunnerEvent::RemovalRefused
                );
                prop_assert!(!(takes_work && result.is_ok()), "{:?} accepted {:?}", runner, event);
            }
            let stops = matches!(event, RunnerEvent::StopRequested | RunnerEvent::Stopped);
            if runner.busy_at.is_some() || runner.idle_at.is_some() {
                prop_assert!(!(stops && result.is_ok()), "{:?} stopped after work", runner);
            }
            let Ok(next) = result else { continue };
            prop_assert!(next.invariant_violations().is_empty(), "{:?}", next.invariant_violations());
            if event == RunnerEvent::StartRequested {
                prop_assert!(!next.stock && next.state == RunnerState::Provisioning);
                prop_assert_eq!(next.requested_at, now);
            }
            runner = next;
        }
    }
}

#[test]
fn a_stock_runner_is_stopped_started_and_runs_one_job() {
    let at = Timestamp::from_millis;
    let stock = NewRunner {
        name: "default-1".into(),
        pool: "default".into(),
        provider: "sim".into(),
        labels: vec![],
        stock: true,
    }
    .initial(RunnerId(1), at(0));
    let stopped = stock
        .apply(
            &RunnerEvent::ProvisioningStarted {
                instance_id: "i-1".into(),
            },
            at(1),
        )
        .and_then(|r| r.apply(&RunnerEvent::StopRequested, at(150)))
        .and_then(|r| r.apply(&RunnerEvent::Stopped, at(160)))
        .expect("booted once and stopped");
    assert_eq!(
        (stopped.state, stopped.stopped_at),
        (RunnerState::Stopped, Some(at(160)))
    );
    assert!(stopped
        .apply(&RunnerEvent::JobAssigned { job: JobId(1) }, at(170))
        .is_err());
    let done = stopped
        .apply(&RunnerEvent::StartRequested, at(3_600))
        .and_then(|r| r.apply(&RunnerEvent::Ready, at(3_620)))
        .and_then(|r| r.apply(&RunnerEvent::JobAssigned { job: JobId(1) }, at(3_621)))
        .and_then(|r| r.apply(&RunnerEvent::JobFinished, at(3_700)))
        .and_then(|r| r.apply(&RunnerEvent::TerminateRequested, at(3_701)))
        .and_then(|r| r.apply(&RunnerEvent::Terminated, at(3_710)))
        .expect("started, one job, deleted");
    assert_eq!(done.state, RunnerState::Terminated);
    assert!(!done.stock);
    // A stopped runner past its age is retired without ever starting.
    let retired = stopped
        .apply(&RunnerEvent::TerminateRequested, at(90_000))
        .expect("a stopped runner can be deleted");
    assert_eq!(retired.state, RunnerState::Terminating);
}

#[test]
fn decline_requeues_at_the_tail_and_excludes_the_runner() {
    let job = new_job(3);
    let (r1, r2) = (RunnerId(1), RunnerId(2));
    let at = Timestamp::from_millis;
    let claimed = job
        .apply(
            &JobEvent::Claim {
                runner: r1,
                lease_deadline: at(120_000),
            },
            at(10),
        )
        .expect("a queued job can be claimed");
    let declined = claimed
        .apply(&JobEvent::Decline { runner: r1 }, at(20))
        .expect("holder may decline");
    assert_eq!(declined.state, JobState::Queued);
    assert_eq!(declined.enqueued_at, at(20));
    assert_eq!(declined.runner, None);
    assert_eq!(
        declined.apply(
            &JobEvent::Claim {
                runner: r1,
                lease_deadline: at(1_000)
            },
            at(30)
        ),
        Err(JobTransitionError::RunnerExcluded {
            job: JobId(1),
            runner: r1
        })
    );
    let reclaimed = declined
        .apply(
            &JobEvent::Claim {
                runner: r2,
                lease_deadline: at(1_000),
            },
            at(30),
        )
        .expect("another runner may take it");
    assert_eq!(
        reclaimed.apply(&JobEvent::Accept { runner: r1 }, at(40)),
        Err(JobTransitionError::NotHolder {
            job: JobId(1),
            runner: r1
        })
    );
}

#[test]
fn a_silent_provisioning_holder_is_a_decline_and_a_silent_running_one_an_attempt() {
    let at = Timestamp::from_millis;
    let mut job = new_job(2);
    let claim = |job: &Job, runner: i64, now: i64| {
        job.apply(
            &JobEvent::Claim {
                runner: RunnerId(runner),
                lease_deadline: at(now + 100),
            },
            at(now),
        )
        .expect("claimable")
    };
    job = claim(&job, 7, 0);
    assert!(matches!(
        job.apply(&JobEvent::LeaseExpired, at(99)),
        Err(JobTransitionError::LeaseNotExpired { .. })
    ));
    // Silent while provisioning: back to the queue as if it declined.
    job = job
        .apply(&JobEvent::LeaseExpired, at(100))
        .expect("expired at the deadline");
    assert_eq!(
        (job.state, job.attempts, job.enqueued_at),
        (JobState::Queued, 0, at(100))
    );
    assert!(job.excluded_runners.contains(&RunnerId(7)));
    assert!(matches!(
        job.apply(
            &JobEvent::Claim {
                runner: RunnerId(7),
                lease_deadline: at(300)
            },
            at(200)
        ),
        Err(JobTransitionError::RunnerExcluded { .. })
    ));
    // Declines never fail a job, however many.
    for runner in 8..20 {
        job = claim(&job, runner, 200 + runner);
        job = job
            .apply(&JobEvent::LeaseExpired, at(400 + runner))
            .expect("expired");
        assert_eq!((job.state, job.attempts), (JobState::Queued, 0));
    }
    // Silent once running: an attempt, failed at max_attempts.
    for (runner, attempts) in [(30, 1), (31, 2)] {
        job = claim(&job, runner, 1_000 * runner);
        job = job
            .apply(
                &JobEvent::Accept {
                    runner: RunnerId(runner),
                },
                at(1_000 * runner + 1),
            )
            .expect("holder accepts");
        job = job
            .apply(&JobEvent::LeaseExpired, at(1_000 * runner + 100))
            .expect("a running job's lease expires too");
        assert_eq!(job.attempts, attempts);
        assert!(!job.excluded_runners.contains(&RunnerId(runner)));
    }
    assert_eq!(job.state, JobState::Failed);
    assert_eq!(
        job.reason.as_deref(),
        Some("lease expired 2 times (max_attempts = 2)")
    );
    assert!(job.invariant_violations().is_empty());
}

#[test]
fn a_lost_holder_requeues_at_once_and_only_its_holder_can_be_lost() {
    let at = Timestamp::from_millis;
    let runner = RunnerId(7);
    let accepted = |job: &Job, now: i64| {
        job.apply(
            &JobEvent::Claim {
                runner,
                lease_deadline: at(now + 10_000),
            },
            at(now),
        )
        .expect("claimable")
        .apply(&JobEvent::Accept { runner }, at(now + 5))
        .expect("holder accepts")
    };
    let job = accepted(&new_job(2), 0);
    assert!(matches!(
        job.apply(
            &JobEvent::HolderLost {
                runner: RunnerId(8)
            },
            at(10)
        ),
        Err(JobTransitionError::NotHolder { .. })
    ));
    let requeued = job
        .apply(&JobEvent::HolderLost { runner }, at(10))
        .expect("long before the lease's deadline");
    assert_eq!(
        (
            requeued.state,
            requeued.attempts,
            requeued.runner,
            requeued.enqueued_at
        ),
        (JobState::Queued, 1, None, at(10))
    );
    assert!(matches!(
        requeued.apply(&JobEvent::HolderLost { runner }, at(11)),
        Err(JobTransitionError::NotHolder { .. })
    ));
    let failed = accepted(&requeued, 20)
        .apply(&JobEvent::HolderLost { runner }, at(30))
        .expect("lost again");
    assert_eq!((failed.state, failed.attempts), (JobState::Failed, 2));
    assert_eq!(
        failed.reason.as_deref(),
        Some("runner lost 2 times (max_attempts = 2)")
    );
    // Lost before it accepted: a decline, no attempt.
    let declined = new_job(2)
        .apply(
            &JobEvent::Claim {
                runner,
                lease_deadline: at(10_000),
            },
            at(0),
        )
        .expect("claimable")
        .apply(&JobEvent::HolderLost { runner }, at(5))
        .expect("lost while provisioning");
    assert_eq!((declined.state, declined.attempts), (JobState::Queued, 0));
    assert!(declined.excluded_runners.contains(&runner));
}

#[test]
fn github_events_converge_without_a_lease() {
    let at = Timestamp::from_millis;
    let job = new_job(3);
    let running = job
        .apply(
            &JobEvent::ExternalStart {
                runner: RunnerId(9),
            },
            at(5),
        )
        .expect("GitHub may start a queued job");
    assert_eq!(running.lease_deadline, None);
    assert!(matches!(
        running.apply(&JobEvent::LeaseExpired, at(10_000)),
        Err(JobTransitionError::InvalidState { .. })
    ));
    let done = job
        .apply(
            &JobEvent::ExternalComplete {
                conclusion: Conclusion::Success,
                runner: None,
            },
            at(6),
        )
        .expect("completed may arrive before in_progress");
    assert_eq!(done.state, JobState::Completed);
}

#[test]
fn unroutable_jobs_are_terminal_from_the_start() {
    let job = NewJob {
        source: JobSource::Github,
        external_id: "42".into(),
        route: Route::Unroutable {
            reason: "no pool serves labels [gpu]".into(),
        },
        labels: vec!["gpu".into()],
        payload: "{}".into(),
        max_attempts: 3,
        share: Default::default(),
    }
    .initial(JobId(2), Timestamp::from_millis(1));
    assert_eq!(job.state, JobState::Unroutable);
    assert!(job.invariant_violations().is_empty());
    assert!(matches!(
        job.apply(
            &JobEvent::Cancel { reason: "x".into() },
            Timestamp::from_millis(2)
        ),
        Err(JobTransitionError::Terminal { .. })
    ));
}

#[test]
fn a_busy_runner_refuses_termination() {
    let at = Timestamp::from_millis;
    let runner = NewRunner {
        name: "r".into(),
        pool: "p".into(),
        provider: "sim".into(),
        labels: vec![],
        stock: false,
    }
    .initial(RunnerId(3), at(0));
    let busy = runner
        .apply(
            &RunnerEvent::ProvisioningStarted {
                instance_id: "i-1".into(),
            },
            at(1),
        )
        .and_then(|r| r.apply(&RunnerEvent::Ready, at(2)))
        .and_then(|r| r.apply(&RunnerEvent::JobAssigned { job: JobId(5) }, at(3)))
        .expect("requested → provisioning → idle → busy");
    assert_eq!(
        busy.apply(&RunnerEvent::TerminateRequested, at(4)),
        Err(RunnerTransitionError::Busy {
            runner: RunnerId(3),
            job: JobId(5)
        })
    );
    let terminated = busy
        .apply(&RunnerEvent::JobFinished, at(5))
        .and_then(|r| r.apply(&RunnerEvent::TerminateRequested, at(6)))
        .and_then(|r| r.apply(&RunnerEvent::Terminated, at(7)))
        .expect("idle runners can be terminated");
    assert_eq!(
        (terminated.state, terminated.ended_at),
        (RunnerState::Terminated, Some(at(7)))
    );
    assert!(terminated.invariant_violations().is_empty());
}

#[test]
fn a_runner_that_registered_before_its_create_returned_keeps_its_state() {
    let at = Timestamp::from_millis;
    let runner = NewRunner {
        name: "r".into(),
        pool: "p".into(),
        provider: "process".into(),
        labels: vec![],
        stock: false,
    }
    .initial(RunnerId(4), at(0));
    let started = RunnerEvent::ProvisioningStarted {
        instance_id: "i-1".into(),
    };
    let busy = runner
        .apply(&RunnerEvent::Ready, at(1))
        .and_then(|r| r.apply(&RunnerEvent::JobAssigned { job: JobId(9) }, at(2)))
        .and_then(|r| r.apply(&started, at(3)))
        .expect("the create's answer arrives after the runner took a job");
    assert_eq!(busy.state, RunnerState::Busy);
    assert_eq!(busy.instance_id.as_deref(), Some("i-1"));
    assert!(
        busy.apply(&started, at(4)).is_err(),
        "an instance is recorded once"
    );
}
