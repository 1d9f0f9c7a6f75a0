//! Stopped runners: the third kind of capacity beside cold boots and idle
//! runners (issue 60). A stopped runner was created, booted once (image,
//! tools and caches warm; no job and no job credential) and stopped. It
//! costs only its disk while stopped, and a start makes it ready in
//! `resume_seconds` instead of a cold boot. It is started for one job and
//! deleted after it, so ephemerality holds: it has never run a job before.
//!
//! [`plan`] is a pure function, per pool and round, of the stopped runners
//! there are, the demand the idle and booting runners do not cover, and the
//! arrivals expected before a runner prepared now could be ready:
//!
//! - **start** the oldest fresh stopped runners for the uncovered demand
//!   (a start beats a cold boot by `boot − resume`), within the pool's room
//!   under `max_runners` (a stopped runner counts against it only once
//!   started);
//! - **retire** stopped runners past `max_age`, so images and caches stay
//!   current (one that is needed now is started instead, if fresh ones run
//!   out: an old image beats a cold boot);
//! - **prepare** new ones up to the target: the expected arrivals within
//!   the refill horizon (one boot and a round), clamped to
//!   `[min_stopped, max_stopped]`;
//! - a stock above the target is kept for a while, not deleted at once:
//!   its preparing boot is paid already, and a stopped hour costs its disk
//!   (a few per cent of a running hour). A runner above the target that has
//!   been stopped for `surplus_after` — the time whose disk costs what a
//!   boot does (boot time × running price ÷ stopped price: 1.4 h for a
//!   150 s boot at 3 %) — goes: keeping it longer would cost more than
//!   preparing a new one when the forecast rises again. Above `max_stopped`
//!   (an operator lowered it), the oldest go at once.

use std::time::Duration;

use crate::runner::RunnerId;
use crate::time::Timestamp;

/// How a stopped runner's age is bounded when a pool does not say.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(24 * 3_600);

/// A pool's settings for stopped runners.
#[derive(Debug, Clone, PartialEq)]
pub struct StoppedPolicy {
    pub min_stopped: u32,
    /// 0: the pool keeps none (the default).
    pub max_stopped: u32,
    /// A stopped runner created longer ago than this is retired.
    pub max_age: Duration,
}

impl Default for StoppedPolicy {
    fn default() -> Self {
        StoppedPolicy {
            min_stopped: 0,
            max_stopped: 0,
            max_age: DEFAULT_MAX_AGE,
        }
    }
}

impl StoppedPolicy {
    /// Whether the pool keeps stopped runners at all.
    pub fn keeps_any(&self) -> bool {
        self.max_stopped > 0
    }
}

/// A stopped runner, ready to start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoppedRunner {
    pub id: RunnerId,
    pub created_at: Timestamp,
    /// When it was last stopped (its preparing boot done).
    pub stopped_at: Timestamp,
}

/// One pool's round, as [`plan`] reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoppedInput<'a> {
    pub policy: &'a StoppedPolicy,
    /// Stopped and ready to start, in any order.
    pub stopped: &'a [StoppedRunner],
    /// Being prepared (booting to be stopped).
    pub preparing: u32,
    /// Queued jobs that no idle, booting or starting runner will take.
    pub uncovered: u32,
    /// Runners the pool may still start under `max_runners`.
    pub room: u32,
    /// Arrivals expected before a runner prepared now is stopped and ready
    /// (one boot and a round), at the quantile the pool keeps stopped for.
    pub expected: u32,
    /// A runner above the target stopped this long is retired
    /// ([`surplus_after`]).
    pub surplus_after: Duration,
}

/// What to do with a pool's stopped capacity this round.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoppedPlan {
    /// Start these for queued jobs, oldest first.
    pub start: Vec<RunnerId>,
    /// Prepare this many new ones.
    pub prepare: u32,
    /// Delete these (aged out, or above `max_stopped`).
    pub retire: Vec<RunnerId>,
}

/// The quantile of the forecast arrivals a pool keeps stopped, when a
/// minute of a job's wait is worth `wait_value` minutes of a runner and a
/// stopped hour costs `stopped_fraction` of a running one.
///
/// The balance of [`crate::forecast::quantile_for`], with idling priced at
/// the stopped fraction: the k-th stopped runner is worth keeping for the
/// next horizon if the chance p that at least k jobs arrive in it pays for
/// its stopped time, `p × (wait_value − ½f) ≥ (1 − p) × f`, that is the
/// quantile `1 − f / (wait_value + ½f)`, clamped to [0.05, 0.99]. At 3 %
/// and the default wait value (1.75) it is 0.98: a stopped stock covers
/// nearly every burst the forecast has seen.
pub fn quantile_for(wait_value: f64, stopped_fraction: f64) -> f64 {
    let f = if stopped_fraction.is_finite() {
        stopped_fraction.clamp(0.0, 1.0)
    } else {
        1.0
    };
    if !wait_value.is_finite() || wait_value <= 0.0 {
        return 0.05;
    }
    (1.0 - f / (wait_value + f / 2.0)).clamp(0.05, 0.99)
}

/// The arrivals a stopped stock is sized for, from the forecast at the
/// stock's quantile: the largest of the recurring rate, the scheduled
/// batches expected now and the groups in progress, plus the later jobs of
/// the workflow runs in progress. Not the rate *and* the batches, as the
/// idle warm pool takes them: at a stock's high quantile the rate's own
/// sample is the days' batch windows, so the two would count one batch
/// twice (on the `scheduled` workload that prepared a second batch's stock
/// every night, retired unused).
pub fn stock_expected(expected: &crate::forecast::Expected) -> u32 {
    expected
        .rate
        .max(expected.batch)
        .max(expected.group)
        .saturating_add(expected.following)
}

/// The stock a pool aims for: the expected arrivals within the refill
/// horizon, clamped to the pool's bounds.
pub fn target(policy: &StoppedPolicy, expected: u32) -> u32 {
    if !policy.keeps_any() {
        return 0;
    }
    expected
        .max(policy.min_stopped)
        .min(policy.max_stopped.max(policy.min_stopped))
}

/// How long a stopped runner above its pool's target is kept: until its
/// disk has cost what preparing a new one does (`boot` at `price_per_hour`
/// against `stopped_price_per_hour`), at most `max_age`.
pub fn surplus_after(
    boot: Duration,
    price_per_hour: f64,
    stopped_price_per_hour: f64,
    max_age: Duration,
) -> Duration {
    if !(stopped_price_per_hour > 0.0 && price_per_hour.is_finite() && price_per_hour >= 0.0) {
        return max_age;
    }
    let seconds = boot.as_secs_f64() * price_per_hour / stopped_price_per_hour;
    if seconds.is_finite() {
        Duration::from_secs_f64(seconds.max(0.0)).min(max_age)
    } else {
        max_age
    }
}

/// Decides one pool's stopped capacity at `now` (see the module's doc).
pub fn plan(input: &StoppedInput<'_>, now: Timestamp) -> StoppedPlan {
    let mut by_age: Vec<StoppedRunner> = input.stopped.to_vec();
    by_age.sort_by_key(|r| (r.created_at, r.id));
    let aged = |r: &StoppedRunner| now.since(r.created_at) >= input.policy.max_age;
    let (old, fresh): (Vec<StoppedRunner>, Vec<StoppedRunner>) =
        by_age.into_iter().partition(|r| aged(r));
    let wanted = input.uncovered.min(input.room) as usize;
    // Fresh ones first, oldest of them first (the nearest to ageing out);
    // an aged one only when fresh ones run out.
    let start: Vec<RunnerId> = fresh
        .iter()
        .chain(old.iter().rev())
        .take(wanted)
        .map(|r| r.id)
        .collect();
    let mut retire: Vec<RunnerId> = old
        .iter()
        .map(|r| r.id)
        .filter(|id| !start.contains(id))
        .collect();
    let mut kept: Vec<RunnerId> = fresh
        .iter()
        .map(|r| r.id)
        .filter(|id| !start.contains(id))
        .collect();
    // Above max_stopped (the operator lowered it): the oldest go.
    let cap = input.policy.max_stopped.max(input.policy.min_stopped) as usize;
    let room_left = cap.saturating_sub(input.preparing as usize);
    if kept.len() > room_left {
        let surplus = kept.len() - room_left;
        retire.extend(kept.drain(..surplus));
    }
    let target = target(input.policy, input.expected);
    let have = kept.len() as u32 + input.preparing;
    if have > target {
        // Above the target: those stopped longest, once past surplus_after.
        let mut surplus = (have - target) as usize;
        let mut by_stop: Vec<&StoppedRunner> =
            fresh.iter().filter(|r| kept.contains(&r.id)).collect();
        by_stop.sort_by_key(|r| (r.stopped_at, r.id));
        for runner in by_stop {
            if surplus == 0 || now.since(runner.stopped_at) < input.surplus_after {
                break;
            }
            kept.retain(|id| *id != runner.id);
            retire.push(runner.id);
            surplus -= 1;
        }
    }
    let have = kept.len() as u32 + input.preparing;
    let prepare = target.saturating_sub(have);
    StoppedPlan {
        start,
        prepare,
        retire,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(min: u32, max: u32) -> StoppedPolicy {
        StoppedPolicy {
            min_stopped: min,
            max_stopped: max,
            max_age: Duration::from_secs(3_600),
        }
    }

    fn stopped(ids_and_ages: &[(i64, u64)], now: Timestamp) -> Vec<StoppedRunner> {
        ids_and_ages
            .iter()
            .map(|&(id, age)| StoppedRunner {
                id: RunnerId(id),
                created_at: now.minus(Duration::from_secs(age)),
                // Stopped a boot after its creation.
                stopped_at: now.minus(Duration::from_secs(age.saturating_sub(150))),
            })
            .collect()
    }

    struct Case {
        name: &'static str,
        policy: StoppedPolicy,
        stopped: &'static [(i64, u64)],
        preparing: u32,
        uncovered: u32,
        room: u32,
        expected: u32,
        start: &'static [i64],
        prepare: u32,
        retire: &'static [i64],
    }

    #[test]
    fn a_surplus_is_kept_until_its_disk_has_cost_a_boot() {
        let day = Duration::from_secs(86_400);
        let boot = Duration::from_secs(150);
        assert_eq!(surplus_after(boot, 0.10, 0.003, day).as_secs(), 5_000);
        assert_eq!(surplus_after(boot, 0.10, 0.0, day), day);
        assert_eq!(surplus_after(boot, 0.10, 0.000_001, day), day);
    }

    #[test]
    fn a_stock_counts_a_batch_once() {
        use crate::forecast::Expected;
        let expected = |rate, batch, group, following| Expected {
            rate,
            batch,
            group,
            following,
            ..Expected::default()
        };
        // Near a nightly batch the rate's sample is the batch's windows.
        assert_eq!(stock_expected(&expected(150, 150, 0, 0)), 150);
        assert_eq!(stock_expected(&expected(3, 150, 0, 0)), 150);
        assert_eq!(stock_expected(&expected(3, 0, 12, 0)), 12);
        assert_eq!(stock_expected(&expected(3, 0, 0, 8)), 11);
    }

    #[test]
    fn a_cheap_stop_keeps_a_high_quantile_and_a_dear_one_the_warm_pools() {
        assert!((quantile_for(1.75, 0.03) - 0.983).abs() < 0.001);
        assert_eq!(quantile_for(100.0, 0.0), 0.99);
        // At the running price it is the idle warm pool's balance.
        let idle = crate::forecast::quantile_for(1.75);
        assert!((quantile_for(1.75, 1.0) - idle).abs() < 1e-9);
        assert_eq!(quantile_for(f64::NAN, 0.03), 0.05);
    }

    #[test]
    fn each_round_starts_for_the_queue_refills_to_the_forecast_and_retires_the_aged() {
        let now = Timestamp::from_millis(10_000_000);
        let cases = [
            Case {
                name: "a pool without stopped runners plans nothing",
                policy: StoppedPolicy::default(),
                stopped: &[],
                preparing: 0,
                uncovered: 5,
                room: 10,
                expected: 7,
                start: &[],
                prepare: 0,
                retire: &[],
            },
            Case {
                name: "an empty stock is prepared to the forecast",
                policy: policy(0, 10),
                stopped: &[],
                preparing: 0,
                uncovered: 0,
                room: 10,
                expected: 4,
                start: &[],
                prepare: 4,
                retire: &[],
            },
            Case {
                name: "min_stopped holds without a forecast, max_stopped caps it",
                policy: policy(2, 3),
                stopped: &[],
                preparing: 1,
                uncovered: 0,
                room: 10,
                expected: 0,
                start: &[],
                prepare: 1,
                retire: &[],
            },
            Case {
                name: "the oldest fresh ones start for the queue and are replaced",
                policy: policy(0, 10),
                stopped: &[(1, 100), (2, 300), (3, 200)],
                preparing: 0,
                uncovered: 2,
                room: 10,
                expected: 3,
                start: &[2, 3],
                prepare: 2,
                retire: &[],
            },
            Case {
                name: "starts stay within max_runners' room",
                policy: policy(0, 10),
                stopped: &[(1, 100), (2, 300), (3, 200)],
                preparing: 0,
                uncovered: 3,
                room: 1,
                expected: 3,
                start: &[2],
                prepare: 1,
                retire: &[],
            },
            Case {
                name: "aged ones are retired and replaced",
                policy: policy(0, 10),
                stopped: &[(1, 100), (2, 4_000)],
                preparing: 0,
                uncovered: 0,
                room: 10,
                expected: 2,
                start: &[],
                prepare: 1,
                retire: &[2],
            },
            Case {
                name: "an aged one starts when fresh ones run out",
                policy: policy(0, 10),
                stopped: &[(1, 100), (2, 4_000), (3, 5_000)],
                preparing: 0,
                uncovered: 2,
                room: 10,
                expected: 0,
                start: &[1, 2],
                prepare: 0,
                retire: &[3],
            },
            Case {
                name: "a stock above the forecast is kept a while",
                policy: policy(0, 10),
                stopped: &[(1, 100), (2, 200), (3, 300)],
                preparing: 0,
                uncovered: 0,
                room: 10,
                expected: 1,
                start: &[],
                prepare: 0,
                retire: &[],
            },
            Case {
                name: "a surplus stopped past surplus_after goes, longest stopped first",
                policy: policy(0, 10),
                stopped: &[(1, 100), (2, 1_300), (3, 1_200), (4, 1_100)],
                preparing: 0,
                uncovered: 0,
                room: 10,
                expected: 2,
                start: &[],
                prepare: 0,
                retire: &[2, 3],
            },
            Case {
                name: "a stock above a lowered max_stopped loses its oldest",
                policy: policy(0, 2),
                stopped: &[(1, 100), (2, 200), (3, 300)],
                preparing: 1,
                uncovered: 0,
                room: 10,
                expected: 5,
                start: &[],
                prepare: 0,
                retire: &[3, 2],
            },
        ];
        for case in cases {
            let stock = stopped(case.stopped, now);
            let planned = plan(
                &StoppedInput {
                    policy: &case.policy,
                    stopped: &stock,
                    preparing: case.preparing,
                    uncovered: case.uncovered,
                    room: case.room,
                    expected: case.expected,
                    surplus_after: Duration::from_secs(1_000),
                },
                now,
            );
            let ids = |ids: &[i64]| ids.iter().map(|&id| RunnerId(id)).collect::<Vec<_>>();
            assert_eq!(planned.start, ids(case.start), "{}: start", case.name);
            assert_eq!(planned.prepare, case.prepare, "{}: prepare", case.name);
            assert_eq!(planned.retire, ids(case.retire), "{}: retire", case.name);
        }
    }
}
