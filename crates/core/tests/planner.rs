//! The planner: data-driven scenarios (expect-test) and properties over
//! arbitrary snapshots, plus convergence of a simulated world.

use std::time::Duration;

use expect_test::{expect, Expect};
use proptest::prelude::*;
use runway_core::planner::{
    decide, plan, Action, Backoff, Offer, PoolPolicy, PoolSnapshot, QueuedJob, RunnerView, Snapshot,
};
use runway_core::{JobId, RunnerId, RunnerState, Timestamp};

const MINUTE: i64 = 60_000;

fn at(minutes: i64) -> Timestamp {
    Timestamp::from_millis(minutes * MINUTE)
}

fn policy(min_idle: u32, max_runners: u32) -> PoolPolicy {
    PoolPolicy {
        min_idle,
        ..PoolPolicy::new("linux", max_runners)
    }
}

fn offer(provider: &str, capacity: u32, price: f64, reliability: f64) -> Offer {
    Offer {
        provider: provider.into(),
        key: String::new(),
        capacity,
        price_per_hour: price,
        boot_time: Duration::from_secs(150),
        reliability,
    }
}

fn jobs(count: i64) -> Vec<QueuedJob> {
    (0..count)
        .map(|i| QueuedJob {
            id: JobId(100 + i),
            enqueued_at: at(i),
            attempts: 0,
        })
        .collect()
}

fn runner(id: i64, state: RunnerState, requested: i64, idle_since: Option<i64>) -> RunnerView {
    RunnerView {
        id: RunnerId(id),
        provider: "sim".into(),
        state,
        in_doubt: false,
        requested_at: at(requested),
        idle_at: idle_since.map(at),
        ready_by: None,
    }
}

/// The plan, one line per action and per waiting job.
fn check(snapshot: Snapshot, now: Timestamp, expect: Expect) {
    let plan = plan(&snapshot, now);
    let mut lines = Vec::new();
    for summary in &plan.pools {
        lines.push(format!(
            "pool {}: queued={} idle={} booting={} busy={} want={}",
            summary.pool, summary.queued, summary.idle, summary.booting, summary.busy, summary.want
        ));
    }
    for action in &plan.actions {
        lines.push(match action {
            Action::Create {
                provider,
                offer,
                count,
                ..
            } if offer.is_empty() => format!("create {count} via {provider}"),
            Action::Create {
                provider,
                offer,
                count,
                ..
            } => format!("create {count} via {provider}/{offer}"),
            Action::Delete { runner, .. } => format!("delete runner {runner}"),
            Action::FailAndDelete { runner, reason, .. } => {
                format!("fail and delete runner {runner}: {reason}")
            }
        });
    }
    for (job, reason) in &plan.waiting {
        lines.push(format!("job {job}: {} {reason:?}", reason.code()));
    }
    expect.assert_eq(&(lines.join("\n") + "\n"));
}

fn one_pool(pool: PoolSnapshot) -> Snapshot {
    Snapshot {
        pools: vec![pool],
        backoffs: vec![],
    }
}

#[test]
fn warm_pool_is_kept_at_min_idle() {
    check(
        one_pool(PoolSnapshot {
            unlisted: 0,
            held: Vec::new(),
            policy: policy(2, 10),
            queued: vec![],
            runners: vec![runner(1, RunnerState::Idle, 0, Some(1))],
            offers: vec![offer("sim", 100, 0.1, 1.0)],
        }),
        at(30),
        expect![[r#"
            pool linux: queued=0 idle=1 booting=0 busy=0 want=2
            create 1 via sim
        "#]],
    );
}

#[test]
fn a_burst_starts_one_runner_per_job_up_to_max() {
    check(
        one_pool(PoolSnapshot {
            unlisted: 0,
            held: Vec::new(),
            policy: policy(0, 3),
            queued: jobs(5),
            runners: vec![runner(1, RunnerState::Busy, 0, None)],
            offers: vec![offer("sim", 100, 0.1, 1.0)],
        }),
        at(10),
        expect![[r#"
            pool linux: queued=5 idle=0 booting=0 busy=1 want=5
            create 2 via sim
            job 100: runner_requested RunnerRequested { provider: "sim" }
            job 101: runner_requested RunnerRequested { provider: "sim" }
            job 102: at_max_runners AtMaxRunners { max_runners: 3 }
            job 103: at_max_runners AtMaxRunners { max_runners: 3 }
            job 104: at_max_runners AtMaxRunners { max_runners: 3 }
        "#]],
    );
}

#[test]
fn idle_runners_go_longest_idle_first_only_after_the_grace_period() {
    check(
        one_pool(PoolSnapshot {
            unlisted: 0,
            held: Vec::new(),
            policy: policy(1, 10),
            queued: vec![],
            runners: vec![
                runner(1, RunnerState::Idle, 0, Some(20)),
                runner(2, RunnerState::Idle, 0, Some(2)),
                runner(3, RunnerState::Idle, 0, Some(5)),
                runner(4, RunnerState::Busy, 0, None),
                runner(5, RunnerState::Idle, 0, Some(24)),
            ],
            offers: vec![offer("sim", 100, 0.1, 1.0)],
        }),
        at(25),
        // want = 1; four idle; runners 1 and 5 are still within their grace.
        expect![[r#"
            pool linux: queued=0 idle=4 booting=0 busy=1 want=1
            delete runner 2
            delete runner 3
        "#]],
    );
}

#[test]
fn a_runner_stuck_booting_is_failed_and_replaced() {
    check(
        one_pool(PoolSnapshot {
            unlisted: 0,
            held: Vec::new(),
            policy: policy(0, 10),
            queued: jobs(2),
            runners: vec![
                runner(1, RunnerState::Provisioning, 0, None),
                runner(2, RunnerState::Provisioning, 8, None),
            ],
            offers: vec![offer("sim", 100, 0.1, 1.0)],
        }),
        at(12),
        expect![[r#"
            pool linux: queued=2 idle=0 booting=1 busy=0 want=2
            fail and delete runner 1: not ready 600s after it was requested (boot_timeout)
            create 1 via sim
            job 100: runner_booting RunnerBooting { runner: RunnerId(2), since: Timestamp(480000) }
            job 101: runner_requested RunnerRequested { provider: "sim" }
        "#]],
    );
}

/// A runner started from the pool's stock of stopped runners is booting
/// capacity like any other, and a job it is for says it is starting and
/// when it should be ready.
#[test]
fn a_started_stopped_runner_covers_a_job_and_says_when_it_is_ready() {
    check(
        one_pool(PoolSnapshot {
            unlisted: 0,
            held: Vec::new(),
            policy: policy(0, 10),
            queued: jobs(2),
            runners: vec![RunnerView {
                ready_by: Some(at(9)),
                ..runner(1, RunnerState::Provisioning, 8, None)
            }],
            offers: vec![offer("sim", 100, 0.1, 1.0)],
        }),
        at(8),
        expect![[r#"
            pool linux: queued=2 idle=0 booting=1 busy=0 want=2
            create 1 via sim
            job 100: stopped_runner_starting StoppedRunnerStarting { runner: RunnerId(1), ready_by: Timestamp(540000) }
            job 101: runner_requested RunnerRequested { provider: "sim" }
        "#]],
    );
}

#[test]
fn a_failing_provider_is_skipped_and_explained() {
    let mut snapshot = one_pool(PoolSnapshot {
        unlisted: 0,
        held: Vec::new(),
        policy: PoolPolicy {
            providers: vec!["cheap".into(), "dear".into()],
            paused: false,
            delete_surplus_boots: false,
            ..policy(0, 10)
        },
        queued: jobs(3),
        runners: vec![],
        offers: vec![offer("cheap", 100, 0.1, 0.2), offer("dear", 1, 1.0, 1.0)],
    });
    snapshot.backoffs = vec![Backoff {
        provider: "cheap".into(),
        offer: String::new(),
        retry_at: at(20),
        last_error: "quota exceeded".into(),
    }];
    check(
        snapshot,
        at(10),
        expect![[r#"
            pool linux: queued=3 idle=0 booting=0 busy=0 want=3
            create 1 via dear
            job 100: runner_requested RunnerRequested { provider: "dear" }
            job 101: provider_backoff ProviderBackoff { provider: "cheap", last_error: "quota exceeded", retry_at: Timestamp(1200000) }
            job 102: provider_backoff ProviderBackoff { provider: "cheap", last_error: "quota exceeded", retry_at: Timestamp(1200000) }
        "#]],
    );
}

#[test]
fn the_cheapest_reliable_capacity_goes_first_and_quota_splits() {
    check(
        one_pool(PoolSnapshot {
            unlisted: 0,
            held: Vec::new(),
            policy: policy(0, 10),
            queued: jobs(4),
            runners: vec![],
            // "spot" is cheaper per hour but unreliable: 0.3 / 0.25 = 1.2 > 1.0.
            offers: vec![offer("spot", 10, 0.3, 0.25), offer("ondemand", 3, 1.0, 1.0)],
        }),
        at(0),
        expect![[r#"
            pool linux: queued=4 idle=0 booting=0 busy=0 want=4
            create 3 via ondemand
            create 1 via spot
            job 100: runner_requested RunnerRequested { provider: "ondemand" }
            job 101: runner_requested RunnerRequested { provider: "ondemand" }
            job 102: runner_requested RunnerRequested { provider: "ondemand" }
            job 103: runner_requested RunnerRequested { provider: "spot" }
        "#]],
    );
}

/// The same instance type at the same price in two zones: the creates
/// are shared one by one (a zone's outage takes half of them), within the
/// provider's quota that both offers share.
#[test]
fn offers_that_tie_share_the_creates() {
    let zone = |key: &str| Offer {
        key: key.into(),
        ..offer("aws", 4, 0.096, 1.0)
    };
    check(
        one_pool(PoolSnapshot {
            unlisted: 0,
            held: Vec::new(),
            policy: policy(0, 10),
            queued: jobs(5),
            runners: vec![],
            offers: vec![
                zone("m5.large/us-east-1a/on-demand"),
                zone("m5.large/us-east-1b/on-demand"),
            ],
        }),
        at(0),
        expect![[r#"
            pool linux: queued=5 idle=0 booting=0 busy=0 want=5
            create 2 via aws/m5.large/us-east-1a/on-demand
            create 2 via aws/m5.large/us-east-1b/on-demand
            job 100: runner_requested RunnerRequested { provider: "aws" }
            job 101: runner_requested RunnerRequested { provider: "aws" }
            job 102: runner_requested RunnerRequested { provider: "aws" }
            job 103: runner_requested RunnerRequested { provider: "aws" }
            job 104: no_provider_capacity NoProviderCapacity
        "#]],
    );
}

/// Where billing is per second (`delete_surplus_boots`), runners still
/// booting beyond what the pool wants go at once, newest first; by
/// default they boot and idle out after the grace.
#[test]
fn surplus_boots_are_deleted_only_where_the_pool_says_so() {
    for delete in [false, true] {
        let runners = vec![
            runner(1, RunnerState::Provisioning, 0, None),
            runner(2, RunnerState::Provisioning, 1, None),
            runner(3, RunnerState::Requested, 2, None),
        ];
        let plan = plan(
            &one_pool(PoolSnapshot {
                unlisted: 0,
                held: Vec::new(),
                policy: PoolPolicy {
                    delete_surplus_boots: delete,
                    ..policy(0, 10)
                },
                queued: jobs(1),
                runners,
                offers: vec![offer("sim", 10, 0.1, 1.0)],
            }),
            at(3),
        );
        let deleted: Vec<i64> = plan
            .actions
            .iter()
            .filter_map(|a| match a {
                Action::Delete { runner, .. } => Some(runner.0),
                _ => None,
            })
            .collect();
        let expected: Vec<i64> = if delete { vec![3, 2] } else { vec![] };
        assert_eq!(deleted, expected, "delete_surplus_boots = {delete}");
    }
}

#[test]
fn no_capacity_and_lease_expiry_are_explained() {
    let mut queued = jobs(2);
    queued[0].attempts = 1;
    check(
        one_pool(PoolSnapshot {
            unlisted: 0,
            held: Vec::new(),
            policy: policy(0, 10),
            queued,
            runners: vec![runner(7, RunnerState::Idle, 0, Some(1))],
            offers: vec![offer("sim", 0, 0.1, 1.0)],
        }),
        at(2),
        expect![[r#"
            pool linux: queued=2 idle=1 booting=0 busy=0 want=2
            job 100: lease_expired_requeued LeaseExpiredRequeued { attempts: 1 }
            job 101: no_provider_capacity NoProviderCapacity
        "#]],
    );
}

#[test]
fn a_runner_started_for_one_job_that_takes_another_leaves_demand() {
    // Runner 1 was started for job 100 but took job 999 (now busy elsewhere):
    // job 100 is still queued, so it still creates demand.
    check(
        one_pool(PoolSnapshot {
            unlisted: 0,
            held: Vec::new(),
            policy: policy(0, 10),
            queued: jobs(1),
            runners: vec![runner(1, RunnerState::Busy, 0, None)],
            offers: vec![offer("sim", 100, 0.1, 1.0)],
        }),
        at(3),
        expect![[r#"
            pool linux: queued=1 idle=0 booting=0 busy=1 want=1
            create 1 via sim
            job 100: runner_requested RunnerRequested { provider: "sim" }
        "#]],
    );
}

#[test]
fn nothing_to_do_when_the_world_matches() {
    let snapshot = one_pool(PoolSnapshot {
        unlisted: 0,
        held: Vec::new(),
        policy: policy(1, 10),
        queued: jobs(2),
        runners: vec![
            runner(1, RunnerState::Idle, 0, Some(1)),
            runner(2, RunnerState::Provisioning, 1, None),
            runner(3, RunnerState::Idle, 0, Some(2)),
            runner(4, RunnerState::Busy, 0, None),
        ],
        offers: vec![offer("sim", 100, 0.1, 1.0)],
    });
    assert!(plan(&snapshot, at(3)).actions.is_empty());
}

// Properties over arbitrary snapshots.

fn arbitrary_pool() -> impl Strategy<Value = PoolSnapshot> {
    let state = prop::sample::select(vec![
        RunnerState::Requested,
        RunnerState::Provisioning,
        RunnerState::Idle,
        RunnerState::Busy,
        RunnerState::Terminating,
    ]);
    let runners = prop::collection::vec((state, 0i64..60, 0i64..60), 0..20);
    (
        0u32..4,
        0u32..25,
        1u32..4,
        0usize..30,
        runners,
        prop::collection::vec((0u32..8, 1u32..10, 1u32..10), 0..3),
    )
        .prop_map(
            |(min_idle, max_runners, ratio_quarter, queued, runners, offers)| PoolSnapshot {
                unlisted: 0,
                held: Vec::new(),
                policy: PoolPolicy {
                    scaling_ratio: f64::from(ratio_quarter) * 0.5,
                    ..policy(min_idle, max_runners)
                },
                queued: jobs(queued as i64),
                runners: runners
                    .into_iter()
                    .enumerate()
                    .map(|(i, (state, requested, idle))| {
                        runner(
                            i as i64 + 1,
                            state,
                            requested,
                            (state == RunnerState::Idle).then_some(idle),
                        )
                    })
                    .collect(),
                offers: offers
                    .into_iter()
                    .enumerate()
                    .map(|(i, (capacity, price, reliability))| {
                        offer(
                            &format!("p{i}"),
                            capacity,
                            f64::from(price),
                            f64::from(reliability) / 10.0,
                        )
                    })
                    .collect(),
            },
        )
}

proptest! {
    #[test]
    fn planner_invariants(pool in arbitrary_pool(), now_minutes in 0i64..90) {
        let now = at(now_minutes);
        let snapshot = one_pool(pool.clone());
        let result = plan(&snapshot, now);
        prop_assert_eq!(&result, &plan(&snapshot, now), "deterministic");
        let state_of = |id: RunnerId| pool.runners.iter().find(|r| r.id == id).map(|r| r.state);
        let mut created = 0;
        let mut deleted_idle = 0;
        for action in &result.actions {
            match action {
                Action::Delete { runner, .. } => {
                    prop_assert_eq!(state_of(*runner), Some(RunnerState::Idle), "only idle runners are deleted");
                    let view = pool.runners.iter().find(|r| r.id == *runner).unwrap();
                    prop_assert!(now.since(view.idle_at.unwrap()) > pool.policy.idle_grace);
                    deleted_idle += 1;
                }
                Action::FailAndDelete { runner, .. } => {
                    let state = state_of(*runner).unwrap();
                    prop_assert!(matches!(state, RunnerState::Requested | RunnerState::Provisioning));
                }
                Action::Create { provider, count, .. } => {
                    let capacity = pool.offers.iter().find(|o| &o.provider == provider).map(|o| o.capacity).unwrap();
                    prop_assert!(*count > 0 && *count <= capacity);
                    created += count;
                }
            }
        }
        let summary = &result.pools[0];
        let terminating = pool.runners.iter().filter(|r| r.state == RunnerState::Terminating).count() as u32;
        let live = summary.idle + summary.booting + summary.busy + terminating;
        // Never beyond max_runners (terminating instances still exist); never deleting below want.
        prop_assert!(created == 0 || live + created <= pool.policy.max_runners);
        prop_assert!(summary.idle - deleted_idle >= summary.want.min(summary.idle));
        // Every queued job is explained.
        prop_assert_eq!(result.waiting.len(), pool.queued.len());
    }

    /// The queue as a count decides exactly as the queue listed: what the
    /// simulator relies on to keep a decision's cost flat as its queue grows.
    #[test]
    fn a_counted_queue_decides_as_a_listed_one(pool in arbitrary_pool(), now_minutes in 0i64..90) {
        let now = at(now_minutes);
        let listed = one_pool(pool.clone());
        let mut counted_pool = pool.clone();
        counted_pool.unlisted = counted_pool.queued.len() as u32;
        counted_pool.queued.clear();
        let counted = one_pool(counted_pool);
        let full = plan(&listed, now);
        let decided = decide(&counted, now);
        prop_assert_eq!(&decided.actions, &full.actions);
        prop_assert_eq!(&decided.pools, &full.pools);
        prop_assert!(decided.waiting.is_empty(), "no wait reasons asked for");
        prop_assert_eq!(decide(&listed, now).actions, full.actions);
    }
}

/// A tiny world: created runners boot in one round, idle runners take
/// queued jobs, jobs run two rounds, deletes happen at once.
#[test]
fn a_simulated_world_converges() {
    let policy = PoolPolicy {
        idle_grace: Duration::from_secs(120),
        ..policy(1, 8)
    };
    let mut queued: Vec<QueuedJob> = jobs(30);
    let mut runners: Vec<(RunnerView, u32)> = Vec::new(); // (runner, rounds left on its job)
    let mut next_id = 1;
    let mut max_seen = 0;
    let mut round = 0;
    loop {
        round += 1;
        assert!(round < 200, "did not converge");
        let now = at(round);
        let snapshot = one_pool(PoolSnapshot {
            unlisted: 0,
            held: Vec::new(),
            policy: policy.clone(),
            queued: queued.clone(),
            runners: runners.iter().map(|(r, _)| r.clone()).collect(),
            offers: vec![offer("sim", 100, 0.1, 1.0)],
        });
        for action in plan(&snapshot, now).actions {
            match action {
                Action::Create { count, .. } => {
                    for _ in 0..count {
                        runners.push((runner(next_id, RunnerState::Provisioning, round, None), 0));
                        next_id += 1;
                    }
                }
                Action::Delete { runner, .. } | Action::FailAndDelete { runner, .. } => {
                    let (view, _) = runners.iter().find(|(r, _)| r.id == runner).unwrap();
                    assert_ne!(view.state, RunnerState::Busy, "never deletes a busy runner");
                    runners.retain(|(r, _)| r.id != runner);
                }
            }
        }
        max_seen = max_seen.max(runners.len());
        for (view, left) in runners.iter_mut() {
            match view.state {
                RunnerState::Provisioning => {
                    view.state = RunnerState::Idle;
                    view.idle_at = Some(now);
                }
                RunnerState::Busy if *left <= 1 => {
                    view.state = RunnerState::Idle;
                    view.idle_at = Some(now);
                }
                RunnerState::Busy => *left -= 1,
                RunnerState::Idle if !queued.is_empty() => {
                    queued.remove(0);
                    view.state = RunnerState::Busy;
                    *left = 2;
                }
                _ => {}
            }
        }
        if queued.is_empty() && runners.len() == 1 && runners[0].0.state == RunnerState::Idle {
            break;
        }
    }
    assert!(max_seen <= 8, "max_runners respected: {max_seen}");
    assert!(round < 40, "converged in {round} rounds");
}

#[test]
fn reliability_learning_tracks_outcomes() {
    use runway_core::planner::learn_reliability;
    let mut r = 1.0;
    for i in 0..20 {
        r = learn_reliability(r, i % 2 == 0);
    }
    assert!(
        (0.4..0.6).contains(&r),
        "half the creates failing drifts to about 0.5: {r}"
    );
    for _ in 0..30 {
        r = learn_reliability(r, false);
    }
    assert_eq!(r, 0.01, "never below 0.01");
    for _ in 0..30 {
        r = learn_reliability(r, true);
    }
    assert!(r > 0.99, "recovers: {r}");
}

/// One provider, several offers (an instance type and zone, spot or
/// on-demand): the planner takes the cheapest reliable one, and an offer
/// that backs off is passed over while the provider's others still serve:
/// spot first, on-demand when spot fails, with no special case.
#[test]
fn a_providers_offers_are_chosen_and_backed_off_one_by_one() {
    let keyed = |key: &str, capacity: u32, price: f64| Offer {
        key: key.into(),
        ..offer("ec2", capacity, price, 1.0)
    };
    let pool = || PoolSnapshot {
        policy: policy(0, 10),
        queued: jobs(4),
        unlisted: 0,
        held: Vec::new(),
        runners: vec![],
        offers: vec![
            keyed("m7i.large/us-east-1a/on-demand", 10, 0.10),
            keyed("m7i.large/us-east-1a/spot", 3, 0.03),
        ],
    };
    check(
        one_pool(pool()),
        at(10),
        expect![[r#"
            pool linux: queued=4 idle=0 booting=0 busy=0 want=4
            create 3 via ec2/m7i.large/us-east-1a/spot
            create 1 via ec2/m7i.large/us-east-1a/on-demand
            job 100: runner_requested RunnerRequested { provider: "ec2" }
            job 101: runner_requested RunnerRequested { provider: "ec2" }
            job 102: runner_requested RunnerRequested { provider: "ec2" }
            job 103: runner_requested RunnerRequested { provider: "ec2" }
        "#]],
    );
    let mut spot_failing = one_pool(pool());
    spot_failing.backoffs = vec![Backoff {
        provider: "ec2".into(),
        offer: "m7i.large/us-east-1a/spot".into(),
        retry_at: at(20),
        last_error: "InsufficientInstanceCapacity".into(),
    }];
    check(
        spot_failing.clone(),
        at(10),
        expect![[r#"
            pool linux: queued=4 idle=0 booting=0 busy=0 want=4
            create 4 via ec2/m7i.large/us-east-1a/on-demand
            job 100: runner_requested RunnerRequested { provider: "ec2" }
            job 101: runner_requested RunnerRequested { provider: "ec2" }
            job 102: runner_requested RunnerRequested { provider: "ec2" }
            job 103: runner_requested RunnerRequested { provider: "ec2" }
        "#]],
    );
    // The whole provider backing off (an empty offer) stops both.
    spot_failing.backoffs[0].offer = String::new();
    let plan = plan(&spot_failing, at(10));
    assert!(plan.actions.is_empty(), "{:?}", plan.actions);
}

/// A provider's offers share its quota: each says what is left of it, and
/// together they never start more than that.
#[test]
fn a_providers_offers_share_its_quota() {
    let keyed = |key: &str, price: f64| Offer {
        key: key.into(),
        ..offer("ec2", 3, price, 1.0)
    };
    let pool = PoolSnapshot {
        policy: policy(0, 10),
        queued: jobs(5),
        unlisted: 0,
        held: Vec::new(),
        runners: vec![],
        offers: vec![
            keyed("m7i.large/us-east-1a/on-demand", 0.10),
            keyed("m7i.large/us-east-1a/spot", 0.03),
            keyed("m7i.large/us-east-1b/spot", 0.04),
            Offer {
                key: String::new(),
                ..offer("other", 1, 0.50, 1.0)
            },
        ],
    };
    let plan = plan(&one_pool(pool), at(10));
    let creates: Vec<(String, String, u32)> = plan
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::Create {
                provider,
                offer,
                count,
                ..
            } => Some((provider.clone(), offer.clone(), *count)),
            _ => None,
        })
        .collect();
    assert_eq!(
        creates,
        vec![
            ("ec2".into(), "m7i.large/us-east-1a/spot".into(), 3),
            ("other".into(), String::new(), 1),
        ]
    );
}

#[test]
fn a_learnt_reliability_recovers_with_time() {
    use runway_core::planner::{recovered_reliability, RELIABILITY_HALF_LIFE};
    assert_eq!(recovered_reliability(0.8, Duration::ZERO), 0.8);
    let half = recovered_reliability(0.8, RELIABILITY_HALF_LIFE);
    assert!((half - 0.9).abs() < 1e-9, "{half}");
    let later = recovered_reliability(0.2, RELIABILITY_HALF_LIFE * 10);
    assert!(later > 0.999 && later <= 1.0, "{later}");
    assert_eq!(recovered_reliability(1.0, RELIABILITY_HALF_LIFE), 1.0);
}
