//! The waiters' unit tests.

use super::*;
use runway_core::job::NewJob;
use runway_core::{JobId, Timestamp};
use std::future::Future;

fn job(pool: &str, labels: &[&str]) -> Job {
    NewJob::api("j", pool, labels).initial(JobId(1), Timestamp::from_millis(0))
}

fn labels(labels: &[&str]) -> Vec<String> {
    labels.iter().map(|l| (*l).to_owned()).collect()
}

/// Whether `waiting` has been woken, without waiting.
fn woken(waiting: &Waiting<'_>) -> bool {
    let mut woken = Box::pin(waiting.woken());
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    woken.as_mut().poll(&mut context).is_ready()
}

/// How many waiters of `pool` were woken, as the metric counts them.
fn woken_in(waiters: &Waiters, pool: &str) -> u64 {
    waiters
        .metrics
        .woken
        .get_or_create(&PoolLabel {
            pool: pool.to_owned(),
        })
        .get()
}

#[test]
fn jobs_another_replica_queued_wake_as_many_runners_that_can_take_them() {
    let waiters = Waiters::default();
    let linux = labels(&["self-hosted", "linux"]);
    let excluded = waiters.enter("default", RunnerId(1), None);
    let windows = waiters.enter("default", RunnerId(2), Some(&labels(&["windows"])));
    let first = waiters.enter("default", RunnerId(3), Some(&linux));
    let second = waiters.enter("default", RunnerId(4), None);
    let third = waiters.enter("default", RunnerId(5), Some(&linux));
    let elsewhere = waiters.enter("other", RunnerId(6), None);
    // Two jobs that want `Linux` and declined runner 1.
    let wanted = Wanted {
        labels: vec!["Linux".into()],
        excluded: vec![1],
    };
    waiters.jobs_queued("default", &wanted, 2);
    assert!(woken(&first) && woken(&second));
    assert!(!woken(&excluded) && !woken(&windows) && !woken(&third) && !woken(&elsewhere));
    assert_eq!(woken_in(&waiters, "default"), 2);
    // More jobs than runners that can take them: each such runner once.
    waiters.jobs_queued("default", &wanted, 5);
    assert!(woken(&third) && !woken(&excluded) && !woken(&windows));
    assert_eq!(woken_in(&waiters, "default"), 3);
    // A wake-up of the whole pool wakes and counts each of its runners.
    waiters.wake_all(Some("default"));
    assert!(woken(&excluded) && woken(&windows) && !woken(&elsewhere));
    assert_eq!(woken_in(&waiters, "default"), 8);
    assert_eq!(woken_in(&waiters, "other"), 0);
}

#[test]
fn a_job_wakes_the_longest_waiting_runner_that_can_take_it() {
    let waiters = Waiters::default();
    let linux = labels(&["self-hosted", "Linux"]);
    let gpu = labels(&["self-hosted", "linux", "gpu"]);
    let mut first = waiters.enter("default", RunnerId(1), Some(&linux));
    let second = waiters.enter("default", RunnerId(2), Some(&gpu));
    let third = waiters.enter("default", RunnerId(3), Some(&gpu));
    let elsewhere = waiters.enter("other", RunnerId(4), None);

    // Labels compare without case; only the first is woken.
    assert!(waiters.job_queued(&job("default", &["LINUX"])));
    assert!(woken(&first));
    assert!(!woken(&second) && !woken(&third) && !woken(&elsewhere));

    // The first is woken and has not looked again: a second job wakes
    // the next waiter that can take it.
    assert!(waiters.job_queued(&job("default", &["linux"])));
    assert!(woken(&second));
    // Only the gpu runners can take a gpu job, and the second is busy
    // looking: the third.
    assert!(waiters.job_queued(&job("default", &["gpu"])));
    assert!(woken(&third));
    // Everyone who could is woken: nobody left to wake.
    assert!(!waiters.job_queued(&job("default", &["gpu"])));
    // Once looking again, a waiter can be woken again.
    let mut second = second;
    second.looking();
    assert!(waiters.job_queued(&job("default", &["gpu"])));
    assert!(woken(&second));
    // Nobody takes a job of a pool nobody waits in, or a label nobody
    // has; a job no longer queued wakes nobody.
    assert!(!waiters.job_queued(&job("empty", &["linux"])));
    first.looking();
    assert!(!waiters.job_queued(&job("default", &["arm64"])));
    let mut running = job("default", &["linux"]);
    running.state = JobState::Running;
    assert!(!waiters.job_queued(&running));
}

#[test]
fn the_gauge_counts_the_waiters_of_each_pool() {
    let gauge = Family::<PoolLabel, Gauge>::default();
    let waiters = Waiters::counted(WaiterMetrics {
        polling: gauge.clone(),
        ..WaiterMetrics::default()
    });
    let of = |pool: &str| {
        gauge
            .get_or_create(&PoolLabel {
                pool: pool.to_owned(),
            })
            .get()
    };
    let a = waiters.enter("default", RunnerId(1), None);
    let b = waiters.enter("default", RunnerId(2), None);
    let c = waiters.enter("other", RunnerId(3), None);
    assert_eq!((of("default"), of("other")), (2, 1));
    drop(a);
    drop(c);
    assert_eq!((of("default"), of("other")), (1, 0));
    drop(b);
    assert_eq!(of("default"), 0);
}

#[test]
fn a_job_never_wakes_the_runner_it_excluded() {
    let waiters = Waiters::default();
    let declined = waiters.enter("default", RunnerId(1), None);
    let other = waiters.enter("default", RunnerId(2), None);
    let mut requeued = job("default", &["linux"]);
    requeued.excluded_runners.insert(RunnerId(1));
    assert!(waiters.job_queued(&requeued));
    assert!(!woken(&declined));
    assert!(woken(&other));
}

#[test]
fn a_waiter_that_leaves_before_its_wakeup_is_settled_passes_it_on() {
    let waiters = Waiters::default();
    let leaving = waiters.enter("default", RunnerId(1), None);
    let mut staying = waiters.enter("default", RunnerId(2), None);
    // Woken, gone without looking.
    assert!(waiters.job_queued(&job("default", &["linux"])));
    assert!(!woken(&staying));
    drop(leaving);
    assert!(woken(&staying), "the job still needs a runner");
    assert_eq!(waiters.waiting(), 1);

    // Woken, looked, gone before the look settled (its claim failed,
    // its runner is draining).
    let mut next = waiters.enter("default", RunnerId(3), None);
    staying.looking();
    staying.settled();
    assert!(waiters.job_queued(&job("default", &["linux"])));
    staying.looking();
    drop(staying);
    assert!(woken(&next), "passed on");

    // A look that settled passes nothing on.
    let last = waiters.enter("default", RunnerId(4), None);
    next.looking();
    next.settled();
    drop(next);
    assert!(!woken(&last));
    drop(last);
    assert_eq!(waiters.waiting(), 0, "pools nobody waits in are forgotten");
    assert!(lock(&waiters.pools).by_runner.is_empty(), "nor runners");
}

#[test]
fn a_wakeup_of_a_pool_or_of_every_pool_wakes_all_their_waiters() {
    let waiters = Waiters::default();
    let a = waiters.enter("default", RunnerId(1), None);
    let b = waiters.enter("default", RunnerId(2), None);
    let c = waiters.enter("other", RunnerId(3), None);
    waiters.wake_all(Some("default"));
    assert!(woken(&a) && woken(&b));
    assert!(!woken(&c));
    waiters.wake_all(None);
    assert!(woken(&b) && woken(&c));
    // A wake-up of everyone is passed on by nobody.
    drop(a);
    assert!(!woken(&b));
}

/// A poll whose look found nothing, as `jobs::claim` makes it.
fn poll_finding_nothing(waiters: &Waiters, runner: i64, labels: Option<&[String]>) -> bool {
    let mut waiting = waiters.enter("default", RunnerId(runner), labels);
    let spared = waiting.known_empty();
    if !spared {
        waiting.looking();
        waiting.found_nothing();
    }
    spared
}

#[test]
fn a_runner_whose_look_found_nothing_is_spared_the_next_until_a_wakeup() {
    let waiters = Waiters::default();
    let linux = labels(&["linux"]);
    assert!(
        !poll_finding_nothing(&waiters, 1, Some(&linux)),
        "the first poll looks"
    );
    assert!(
        poll_finding_nothing(&waiters, 1, Some(&linux)),
        "nothing changed"
    );
    assert!(poll_finding_nothing(&waiters, 1, Some(&linux)));
    // Other labels, or another runner, are not what was looked for.
    assert!(!poll_finding_nothing(&waiters, 1, Some(&labels(&["gpu"]))));
    assert!(!poll_finding_nothing(&waiters, 2, Some(&linux)));
    // A job queued in another pool changes nothing here.
    waiters.job_queued(&job("other", &["linux"]));
    assert!(poll_finding_nothing(&waiters, 2, Some(&linux)));
    // A job queued in the pool, even one nobody waited for, and any
    // wake-up of the pool or of every pool: the next poll looks.
    waiters.job_queued(&job("default", &["arm64"]));
    assert!(!poll_finding_nothing(&waiters, 2, Some(&linux)));
    assert!(poll_finding_nothing(&waiters, 2, Some(&linux)));
    waiters.wake_all(Some("default"));
    assert!(!poll_finding_nothing(&waiters, 2, Some(&linux)));
    waiters.wake_all(None);
    assert!(!poll_finding_nothing(&waiters, 2, Some(&linux)));
    waiters.jobs_queued(
        "default",
        &Wanted {
            labels: vec!["linux".into()],
            excluded: vec![],
        },
        1,
    );
    assert!(!poll_finding_nothing(&waiters, 2, Some(&linux)));
    // The runner itself changed (it drains): it looks.
    assert!(poll_finding_nothing(&waiters, 2, Some(&linux)));
    waiters.wake_runner(RunnerId(2));
    assert!(!poll_finding_nothing(&waiters, 2, Some(&linux)));
}

#[test]
fn a_look_that_raced_a_wakeup_spares_nothing() {
    let waiters = Waiters::default();
    // A job queued while the look was in flight: the look may have
    // missed it, and the waiter was woken.
    let mut waiting = waiters.enter("default", RunnerId(1), None);
    waiting.looking();
    waiters.job_queued(&job("default", &["linux"]));
    waiting.found_nothing();
    drop(waiting);
    assert!(!poll_finding_nothing(&waiters, 1, None));
    // A look that took a job, or a poll that never looked, spares
    // nothing either.
    let mut waiting = waiters.enter("default", RunnerId(3), None);
    waiting.looking();
    waiting.settled();
    drop(waiting);
    assert!(!poll_finding_nothing(&waiters, 3, None));
    drop(waiters.enter("default", RunnerId(4), None));
    assert!(!poll_finding_nothing(&waiters, 4, None));
}

#[test]
fn what_runners_found_is_forgotten_once_stale() {
    let waiters = Waiters::default();
    for runner in 0..(2 * FOUND_NOTHING_PRUNE as i64) {
        poll_finding_nothing(&waiters, runner, None);
        if runner % 1_000 == 0 {
            waiters.wake_all(None);
        }
    }
    let remembered = lock(&waiters.pools).found_nothing.len();
    assert!(
        remembered < FOUND_NOTHING_PRUNE,
        "stale looks pruned, {remembered} kept"
    );
}

#[test]
fn a_look_left_unsettled_spares_nothing_and_passes_its_wakeup_on() {
    let waiters = Waiters::default();
    let mut waiting = waiters.enter("default", RunnerId(1), None);
    let other = waiters.enter("default", RunnerId(2), None);
    waiting.looking();
    waiting.found_nothing();
    // Woken for a job; the next look ends neither way (its runner
    // changed under it) and the poll is given up.
    assert!(waiters.job_queued(&job("default", &["linux"])));
    waiting.looking();
    drop(waiting);
    assert!(woken(&other), "the job still needs a runner");
    drop(other);
    // Its runner changed (woken as itself, the pool's epoch unmoved): a
    // look that then ends neither way leaves nothing to spare the next.
    assert!(!poll_finding_nothing(&waiters, 3, None));
    let mut waiting = waiters.enter("default", RunnerId(3), None);
    assert!(waiting.known_empty());
    waiters.wake_runner(RunnerId(3));
    waiting.looking();
    drop(waiting);
    assert!(
        !poll_finding_nothing(&waiters, 3, None),
        "nothing is known of it"
    );
}

#[test]
fn a_changed_runner_wakes_its_own_polls_only_while_they_wait() {
    let waiters = Waiters::default();
    let first = waiters.enter("default", RunnerId(1), None);
    let second = waiters.enter("other", RunnerId(1), None);
    let bystander = waiters.enter("default", RunnerId(2), None);
    waiters.wake_runner(RunnerId(1));
    assert!(woken(&first) && woken(&second), "both of its polls");
    assert!(!woken(&bystander));
    drop((first, second));
    // Gone, it is forgotten: a later change of it wakes nobody.
    let again = waiters.enter("default", RunnerId(3), None);
    waiters.wake_runner(RunnerId(1));
    assert!(!woken(&bystander) && !woken(&again));
    drop((bystander, again));
    assert!(lock(&waiters.pools).by_runner.is_empty());
}

/// The per-pool count of woken waiters agrees with the waiters themselves.
fn woken_counts_agree(waiters: &Waiters) {
    let pools = lock(&waiters.pools);
    for (pool, slots) in &pools.waiting {
        let woken = slots
            .values()
            .filter(|slot| *lock(&slot.woken) != Woken::No)
            .count();
        assert_eq!(pools.woken.get(pool).copied().unwrap_or(0), woken, "{pool}");
    }
}

#[test]
fn quiet_pools_are_those_whose_waiters_are_all_unwoken() {
    let waiters = Waiters::default();
    let quiet = |waiters: &Waiters| {
        woken_counts_agree(waiters);
        let mut pools = waiters.quiet_pools();
        pools.sort();
        pools
    };
    let mut first = waiters.enter("a", RunnerId(1), None);
    let second = waiters.enter("a", RunnerId(2), None);
    let other = waiters.enter("b", RunnerId(3), None);
    assert_eq!(quiet(&waiters), ["a", "b"]);
    assert!(waiters.job_queued(&job("a", &["linux"])));
    assert_eq!(quiet(&waiters), ["b"], "a waiter of a is woken");
    first.looking();
    first.settled();
    assert_eq!(quiet(&waiters), ["a", "b"], "it looked");
    waiters.wake_runner(RunnerId(3));
    assert_eq!(quiet(&waiters), ["a"]);
    drop(other);
    assert_eq!(quiet(&waiters), ["a"], "b's woken waiter left");
    waiters.wake_all(None);
    waiters.wake_all(Some("a"));
    assert_eq!(quiet(&waiters), Vec::<String>::new());
    let third = waiters.enter("b", RunnerId(4), None);
    assert!(waiters.wake_for(&job("b", &["gpu"])));
    assert_eq!(quiet(&waiters), Vec::<String>::new());
    drop(second);
    first.looking();
    assert_eq!(quiet(&waiters), ["a"]);
    drop((first, third));
    assert_eq!(quiet(&waiters), Vec::<String>::new());
    assert!(lock(&waiters.pools).woken.is_empty());
}

/// A renewal's labels are compared with the remembered lowercase ones
/// without being lowercased first; the answer is the same as comparing
/// their lowercase copies.
#[test]
fn labels_compare_as_their_lowercase_copies() {
    /// Remembered, and given.
    type Labels<'a> = Option<&'a [&'a str]>;
    let cases: [(Labels, Labels); 12] = [
        (None, None),
        (None, Some(&[])),
        (Some(&[]), Some(&[])),
        (Some(&["linux"]), Some(&["linux"])),
        (Some(&["linux"]), Some(&["Linux"])),
        (Some(&["linux"]), Some(&["LINUX", "x64"])),
        (Some(&["linux", "x64"]), Some(&["x64", "linux"])),
        (Some(&["linux"]), Some(&["linu"])),
        (Some(&["größe"]), Some(&["GRÖSSE"])),
        (Some(&["größe"]), Some(&["Größe"])),
        (Some(&["σοφός"]), Some(&["ΣΟΦΌΣ"])),
        (Some(&["ǆ"]), Some(&["ǅ"])),
    ];
    for (remembered, given) in cases {
        let remembered: Option<Vec<String>> =
            remembered.map(|l| l.iter().map(|l| l.to_lowercase()).collect());
        let given: Option<Vec<String>> = given.map(labels);
        let expected = remembered
            == given
                .as_ref()
                .map(|l| l.iter().map(|l| l.to_lowercase()).collect::<Vec<_>>());
        assert_eq!(
            same_labels(remembered.as_deref(), given.as_deref()),
            expected,
            "{remembered:?} against {given:?}"
        );
    }
}

/// A spared poll shares its runner's remembered labels instead of copying
/// them again.
#[test]
fn a_spared_poll_shares_the_remembered_labels() {
    let waiters = Waiters::default();
    let mixed = labels(&["Self-Hosted", "linux"]);
    assert!(!poll_finding_nothing(&waiters, 1, Some(&mixed)));
    let remembered = lock(&waiters.pools).found_nothing[&RunnerId(1)]
        .labels
        .clone()
        .expect("labels");
    assert_eq!(&*remembered, ["self-hosted", "linux"]);
    let waiting = waiters.enter("default", RunnerId(1), Some(&mixed));
    assert!(waiting.known_empty());
    let shared = waiting.slot.serves.labels.clone().expect("labels");
    assert!(Arc::ptr_eq(&remembered, &shared));
}
