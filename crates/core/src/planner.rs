//! The scaling planner (DESIGN §8): `plan(snapshot, policies, now)`, a pure
//! function from what the store and the providers report to the actions
//! that bring each pool to the capacity its queue needs, plus the reason
//! every queued job is still waiting.
//!
//! Per pool, with Q queued jobs and I idle, P booting, B busy and T
//! terminating runners:
//!
//! ```text
//! want   = ceil(Q × scaling_ratio) + min_idle
//! create = clamp(want − I − P, 0, max_runners − I − P − B − T)
//! ```
//!
//! A terminating runner's instance exists (and costs) until its provider
//! confirms the delete, so it still counts against `max_runners`.
//!
//! Idle runners beyond `want` are deleted, longest idle first, once idle for
//! longer than `idle_grace`. A runner still booting past `boot_timeout` is
//! failed and deleted, and does not count as capacity, so it is replaced.
//! Busy runners are never deleted. Demand is level-triggered: it is the
//! queue, not a per-job reservation, so a runner started for job A that
//! takes job B leaves A queued and still creating demand.
//!
//! New runners go to the cheapest reliable offers first (price ÷
//! reliability, then boot time; offers that tie share them one by one, so
//! two zones at one price each get half), split across providers when one lacks
//! quota; providers in back-off are skipped.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::job::JobId;
use crate::runner::{RunnerId, RunnerState};
use crate::time::Timestamp;

/// A pool's scaling settings.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolPolicy {
    pub name: String,
    pub min_idle: u32,
    pub max_runners: u32,
    pub scaling_ratio: f64,
    pub idle_grace: Duration,
    pub boot_timeout: Duration,
    /// Providers the pool may use, in preference order; empty means any.
    pub providers: Vec<String>,
    /// An operator paused the pool: its queue is kept and its runners
    /// keep taking jobs, but no runner is started for it.
    pub paused: bool,
    /// Runners still booting beyond what the pool wants are deleted at
    /// once (billing per second) instead of booting and idling out.
    pub delete_surplus_boots: bool,
}

impl PoolPolicy {
    /// A pool called `name` of at most `max_runners`, with the defaults of
    /// a pool's configuration (`min_idle` 0, one runner a job, five
    /// minutes' idle grace, ten minutes to boot, any provider).
    pub fn new(name: &str, max_runners: u32) -> PoolPolicy {
        PoolPolicy {
            name: name.to_owned(),
            min_idle: 0,
            max_runners,
            scaling_ratio: 1.0,
            idle_grace: Duration::from_secs(300),
            boot_timeout: Duration::from_secs(600),
            providers: Vec::new(),
            paused: false,
            delete_surplus_boots: false,
        }
    }
}

/// A queued job as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedJob {
    pub id: JobId,
    pub enqueued_at: Timestamp,
    /// Failed attempts so far: above zero, the job was requeued by an expired lease.
    pub attempts: u32,
}

/// A queued job whose key is at its pool's cap on running jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldJob {
    pub id: JobId,
    pub key: String,
    pub max_running: u32,
}

/// Splits a pool's queue (in queue order, each job with its share key) by
/// the cap on one key's running jobs: of each key, as many jobs as it has
/// room for under `max_running` (given `active`, its jobs provisioning or
/// running) stay demand; the rest are held. Returns the indexes of the
/// jobs that stay, and the held ones.
pub fn hold_by_cap<'a>(
    queue: impl IntoIterator<Item = (JobId, &'a str)>,
    active: &std::collections::HashMap<String, u32>,
    max_running: u32,
) -> (Vec<usize>, Vec<HeldJob>) {
    let mut room: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
    let (mut stay, mut held) = (Vec::new(), Vec::new());
    for (index, (id, key)) in queue.into_iter().enumerate() {
        let left = room
            .entry(key)
            .or_insert_with(|| max_running.saturating_sub(active.get(key).copied().unwrap_or(0)));
        if *left > 0 {
            *left -= 1;
            stay.push(index);
        } else {
            held.push(HeldJob {
                id,
                key: key.to_owned(),
                max_running,
            });
        }
    }
    (stay, held)
}

/// A live runner as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerView {
    pub id: RunnerId,
    pub provider: String,
    pub state: RunnerState,
    /// Its create's outcome is unknown (`Runner::create_in_doubt`): it
    /// holds its place under `max_runners` but is not counted as booting
    /// for demand, and the reconciler, not the boot timeout, judges it.
    pub in_doubt: bool,
    pub requested_at: Timestamp,
    /// When it last became idle.
    pub idle_at: Option<Timestamp>,
    /// Started from the pool's stock of stopped runners: when it should be
    /// ready (its start plus its provider's `resume_seconds`).
    pub ready_by: Option<Timestamp>,
}

/// A provider's offer of capacity for one pool.
#[derive(Debug, Clone, PartialEq)]
pub struct Offer {
    pub provider: String,
    /// Which of the provider's offers this is (an instance type, zone and
    /// purchase option, say): a provider may offer several, each priced
    /// and backed off on its own. Empty for a provider's only offer.
    pub key: String,
    /// How many runners it can start now (quota left). A provider's offers
    /// share its quota: each says the whole of what is left, and the
    /// planner counts what earlier offers of that provider took.
    pub capacity: u32,
    pub price_per_hour: f64,
    pub boot_time: Duration,
    /// Share of recent creates that succeeded, in (0, 1].
    pub reliability: f64,
}

/// What the planner ranks offers by: price per hour of reliable capacity
/// (price ÷ reliability, reliability never taken below 0.01).
pub fn offer_cost(offer: &Offer) -> f64 {
    offer.price_per_hour / offer.reliability.clamp(0.01, 1.0)
}

/// The backoff that keeps the planner from `offer` at `now`: one of its
/// own, or one of its whole provider (an empty `Backoff::offer`).
pub fn backoff_of<'a>(
    backoffs: &'a [Backoff],
    offer: &Offer,
    now: Timestamp,
) -> Option<&'a Backoff> {
    backoffs.iter().find(|b| {
        b.provider == offer.provider
            && (b.offer.is_empty() || b.offer == offer.key)
            && b.retry_at > now
    })
}

/// A provider that failed recently and must not be asked until `retry_at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    pub provider: String,
    /// The one offer of the provider backing off (its `Offer::key`); empty:
    /// all of the provider's offers.
    pub offer: String,
    pub retry_at: Timestamp,
    pub last_error: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PoolSnapshot {
    pub policy: PoolPolicy,
    /// Queued jobs in queue order: the order they will be handed out (the
    /// store's fair-share order; arrival order for one key).
    pub queued: Vec<QueuedJob>,
    /// Queued jobs counted but not listed: they count towards demand and
    /// get no wait reason. The simulator passes its queue as a count, so
    /// a decision costs the same with a queue of ten or of a million.
    pub unlisted: u32,
    /// Listed queued jobs held back by the pool's cap on one key's running
    /// jobs (`[pools.share] max_running`): they wait for one of their key's
    /// jobs to end and count for no runner. Not in `queued`; held jobs
    /// beyond the listed queue are left out of `unlisted`.
    pub held: Vec<HeldJob>,
    /// Runners that are not terminal.
    pub runners: Vec<RunnerView>,
    pub offers: Vec<Offer>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Snapshot {
    pub pools: Vec<PoolSnapshot>,
    pub backoffs: Vec<Backoff>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Start `count` runners in `pool` through `provider`'s offer `offer`
    /// (its `Offer::key`).
    Create {
        pool: String,
        provider: String,
        offer: String,
        count: u32,
    },
    /// Delete an idle runner the pool no longer needs.
    Delete { pool: String, runner: RunnerId },
    /// Fail a runner that did not boot in time, and delete it.
    FailAndDelete {
        pool: String,
        runner: RunnerId,
        reason: String,
    },
}

/// Why a queued job has no runner yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitReason {
    /// An idle runner exists and should take it at its next poll.
    RunnerIdle { runner: RunnerId },
    /// A runner is booting for the pool's demand.
    RunnerBooting { runner: RunnerId, since: Timestamp },
    /// A stopped runner of the pool's stock is starting for it, ready by
    /// `ready_by`.
    StoppedRunnerStarting {
        runner: RunnerId,
        ready_by: Timestamp,
    },
    /// This plan starts a runner for it.
    RunnerRequested { provider: String },
    /// The pool is at `max_runners`.
    AtMaxRunners { max_runners: u32 },
    /// The providers that could start a runner are backing off.
    ProviderBackoff {
        provider: String,
        last_error: String,
        retry_at: Timestamp,
    },
    /// No provider has quota left for the pool.
    NoProviderCapacity,
    /// `scaling_ratio` below 1 starts fewer runners than queued jobs.
    ScalingRatio { scaling_ratio: String },
    /// It was requeued after its runner's lease expired; capacity is on its way.
    LeaseExpiredRequeued { attempts: u32 },
    /// An operator paused the pool: no runner is started until it resumes.
    PoolPaused,
    /// Its key (repository or submitter) has `max_running` jobs running in
    /// the pool (`[pools.share]`); it waits for one of them to end.
    KeyAtCap { key: String, max_running: u32 },
}

impl WaitReason {
    pub fn code(&self) -> &'static str {
        match self {
            WaitReason::RunnerIdle { .. } => "runner_idle",
            WaitReason::RunnerBooting { .. } => "runner_booting",
            WaitReason::StoppedRunnerStarting { .. } => "stopped_runner_starting",
            WaitReason::RunnerRequested { .. } => "runner_requested",
            WaitReason::AtMaxRunners { .. } => "at_max_runners",
            WaitReason::ProviderBackoff { .. } => "provider_backoff",
            WaitReason::NoProviderCapacity => "no_provider_capacity",
            WaitReason::ScalingRatio { .. } => "scaling_ratio",
            WaitReason::LeaseExpiredRequeued { .. } => "lease_expired_requeued",
            WaitReason::PoolPaused => "pool_paused",
            WaitReason::KeyAtCap { .. } => "key_at_cap",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct PoolSummary {
    pub pool: String,
    pub queued: u32,
    pub idle: u32,
    pub booting: u32,
    pub busy: u32,
    pub want: u32,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    pub actions: Vec<Action>,
    pub waiting: Waiting,
    pub pools: Vec<PoolSummary>,
}

/// Why each queued job waits, by job id: a vector sorted by id, not a map —
/// the planner runs on every arrival in `runway sim`, a million times a
/// simulated month, and building and dropping a map each time was a third
/// of its cost.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Waiting(Vec<(JobId, WaitReason)>);

impl Waiting {
    pub fn get(&self, job: &JobId) -> Option<&WaitReason> {
        self.0
            .binary_search_by_key(job, |(id, _)| *id)
            .ok()
            .map(|index| &self.0[index].1)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// (job, reason), by job id.
    pub fn iter(&self) -> impl Iterator<Item = (&JobId, &WaitReason)> {
        self.0.iter().map(|(id, reason)| (id, reason))
    }
}

impl std::ops::Index<&JobId> for Waiting {
    type Output = WaitReason;
    fn index(&self, job: &JobId) -> &WaitReason {
        self.get(job).expect("no wait reason for that job")
    }
}

impl IntoIterator for Waiting {
    type Item = (JobId, WaitReason);
    type IntoIter = std::vec::IntoIter<(JobId, WaitReason)>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a Waiting {
    type Item = (&'a JobId, &'a WaitReason);
    type IntoIter = Box<dyn Iterator<Item = (&'a JobId, &'a WaitReason)> + 'a>;
    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

/// [`plan`] without the wait reasons: only what to do. Its cost follows
/// runners and offers, not queued jobs (the simulator's every decision).
pub fn decide(snapshot: &Snapshot, now: Timestamp) -> Plan {
    let mut result = Plan::default();
    for pool in &snapshot.pools {
        plan_pool(pool, &snapshot.backoffs, now, false, &mut result);
    }
    result
}

/// The plan for `snapshot` at `now`.
pub fn plan(snapshot: &Snapshot, now: Timestamp) -> Plan {
    let mut result = Plan::default();
    for pool in &snapshot.pools {
        plan_pool(pool, &snapshot.backoffs, now, true, &mut result);
    }
    // FIFO order is nearly id order: this sort is close to linear. A job
    // id is in one pool only, so ids are unique.
    result.waiting.0.sort_by_key(|(id, _)| *id);
    result
}

fn is_booting(state: RunnerState) -> bool {
    matches!(state, RunnerState::Requested | RunnerState::Provisioning)
}

/// Plans one pool into `out`; with `explain`, a wait reason per listed job.
fn plan_pool(
    pool: &PoolSnapshot,
    backoffs: &[Backoff],
    now: Timestamp,
    explain: bool,
    out: &mut Plan,
) {
    let policy = &pool.policy;
    let mut idle: Vec<&RunnerView> = Vec::new();
    let mut booting: Vec<&RunnerView> = Vec::new();
    let mut busy = 0u32;
    let mut terminating = 0u32;
    let mut in_doubt = 0u32;
    for runner in &pool.runners {
        match runner.state {
            _ if runner.in_doubt => in_doubt += 1,
            RunnerState::Idle => idle.push(runner),
            state if is_booting(state) => {
                if now.since(runner.requested_at) > policy.boot_timeout {
                    out.actions.push(Action::FailAndDelete {
                        pool: policy.name.clone(),
                        runner: runner.id,
                        reason: format!(
                            "not ready {}s after it was requested (boot_timeout)",
                            policy.boot_timeout.as_secs()
                        ),
                    });
                } else {
                    booting.push(runner);
                }
            }
            RunnerState::Busy => busy += 1,
            RunnerState::Terminating => terminating += 1,
            _ => {}
        }
    }
    let queued = u32::try_from(pool.queued.len())
        .unwrap_or(u32::MAX)
        .saturating_add(pool.unlisted);
    let demand = (f64::from(queued) * policy.scaling_ratio.max(0.0)).ceil();
    let demand = if demand >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        demand as u32
    };
    let want = demand.saturating_add(policy.min_idle);
    let (i, p) = (idle.len() as u32, booting.len() as u32);
    let room = policy
        .max_runners
        .saturating_sub(i + p + busy + terminating + in_doubt);
    let needed = want.saturating_sub(i + p);
    let to_create = if policy.paused { 0 } else { needed.min(room) };

    // Allocate creates over the usable offers, cheapest reliable first.
    let allowed = |provider: &str| {
        policy.providers.is_empty() || policy.providers.iter().any(|p| p == provider)
    };
    let mut offers: Vec<&Offer> = pool
        .offers
        .iter()
        .filter(|o| {
            allowed(&o.provider) && o.capacity > 0 && backoff_of(backoffs, o, now).is_none()
        })
        .collect();
    offers.sort_by(|a, b| {
        offer_cost(a)
            .total_cmp(&offer_cost(b))
            .then(a.boot_time.cmp(&b.boot_time))
            .then(preference(policy, &a.provider).cmp(&preference(policy, &b.provider)))
    });
    let mut left = to_create;
    let mut created: Vec<String> = Vec::new();
    let mut taken: BTreeMap<&str, u32> = BTreeMap::new();
    // Offers that tie (same cost, boot time and preference: the same
    // instance type in two zones, say) share the creates one by one, so a
    // zone's outage takes half the new runners, not all of them.
    let ties = |a: &Offer, b: &Offer| {
        (offer_cost(a) - offer_cost(b)).abs() <= 1e-9 * offer_cost(a).abs().max(1.0)
            && a.boot_time == b.boot_time
            && preference(policy, &a.provider) == preference(policy, &b.provider)
    };
    let mut start = 0;
    while start < offers.len() && left > 0 {
        let mut end = start + 1;
        while end < offers.len() && ties(offers[start], offers[end]) {
            end += 1;
        }
        let group = &offers[start..end];
        let mut counts = vec![0u32; group.len()];
        loop {
            let mut placed = false;
            for (k, offer) in group.iter().enumerate() {
                if left == 0 {
                    break;
                }
                let taken = taken.entry(offer.provider.as_str()).or_default();
                if *taken < offer.capacity {
                    *taken += 1;
                    counts[k] += 1;
                    left -= 1;
                    placed = true;
                }
            }
            if !placed || left == 0 {
                break;
            }
        }
        for (offer, count) in group.iter().zip(counts) {
            if count == 0 {
                continue;
            }
            out.actions.push(Action::Create {
                pool: policy.name.clone(),
                provider: offer.provider.clone(),
                offer: offer.key.clone(),
                count,
            });
            created.extend(std::iter::repeat_n(offer.provider.clone(), count as usize));
        }
        start = end;
    }
    let unplaced = left;

    // Booting runners beyond want, where the pool says so: the newest
    // first (the oldest is closest to ready).
    let surplus_boots = (i + p).saturating_sub(want).min(p);
    if policy.delete_surplus_boots && surplus_boots > 0 {
        let mut newest: Vec<&&RunnerView> = booting.iter().collect();
        newest.sort_by_key(|r| std::cmp::Reverse((r.requested_at, r.id)));
        for runner in newest.into_iter().take(surplus_boots as usize) {
            out.actions.push(Action::Delete {
                pool: policy.name.clone(),
                runner: runner.id,
            });
        }
    }

    // Scale down: idle runners beyond want, longest idle first, past grace.
    if i > want {
        let mut candidates: Vec<&&RunnerView> = idle
            .iter()
            .filter(|r| {
                r.idle_at
                    .is_some_and(|at| now.since(at) > policy.idle_grace)
            })
            .collect();
        candidates.sort_by_key(|r| (r.idle_at, r.id));
        for runner in candidates.into_iter().take((i - want) as usize) {
            out.actions.push(Action::Delete {
                pool: policy.name.clone(),
                runner: runner.id,
            });
        }
    }

    out.pools.push(PoolSummary {
        pool: policy.name.clone(),
        queued,
        idle: i,
        booting: p,
        busy,
        want,
    });
    if !explain {
        return;
    }
    // Why each queued job waits, in queue order: idle runners first, then
    // booting ones, then runners this plan starts, then whatever blocks
    // the rest.
    let jobs: Vec<&QueuedJob> = pool.queued.iter().collect();
    let mut booting_sorted = booting.clone();
    booting_sorted.sort_by_key(|r| (r.requested_at, r.id));
    let covered_by_ratio = demand as usize;
    let blocked = blocking_reason(policy, pool, backoffs, now, unplaced, room, needed);
    out.waiting.0.reserve(jobs.len());
    for (index, job) in jobs.iter().enumerate() {
        let reason = if index < idle.len() {
            WaitReason::RunnerIdle {
                runner: idle[index].id,
            }
        } else if let Some(runner) = booting_sorted.get(index - idle.len()) {
            match runner.ready_by {
                Some(ready_by) => WaitReason::StoppedRunnerStarting {
                    runner: runner.id,
                    ready_by,
                },
                None => WaitReason::RunnerBooting {
                    runner: runner.id,
                    since: runner.requested_at,
                },
            }
        } else if let Some(provider) = created.get(index - idle.len() - booting_sorted.len()) {
            WaitReason::RunnerRequested {
                provider: provider.clone(),
            }
        } else if index >= covered_by_ratio {
            WaitReason::ScalingRatio {
                scaling_ratio: format!("{}", policy.scaling_ratio),
            }
        } else {
            blocked.clone()
        };
        let reason = match reason {
            WaitReason::RunnerIdle { .. }
            | WaitReason::RunnerBooting { .. }
            | WaitReason::StoppedRunnerStarting { .. }
            | WaitReason::RunnerRequested { .. }
                if job.attempts > 0 =>
            {
                WaitReason::LeaseExpiredRequeued {
                    attempts: job.attempts,
                }
            }
            other => other,
        };
        out.waiting.0.push((job.id, reason));
    }
    for job in &pool.held {
        out.waiting.0.push((
            job.id,
            WaitReason::KeyAtCap {
                key: job.key.clone(),
                max_running: job.max_running,
            },
        ));
    }
}

fn preference(policy: &PoolPolicy, provider: &str) -> usize {
    policy
        .providers
        .iter()
        .position(|p| p == provider)
        .unwrap_or(usize::MAX)
}

/// What keeps the pool from starting runners for the jobs beyond capacity.
fn blocking_reason(
    policy: &PoolPolicy,
    pool: &PoolSnapshot,
    backoffs: &[Backoff],
    now: Timestamp,
    unplaced: u32,
    room: u32,
    needed: u32,
) -> WaitReason {
    if policy.paused {
        return WaitReason::PoolPaused;
    }
    if needed > room {
        return WaitReason::AtMaxRunners {
            max_runners: policy.max_runners,
        };
    }
    if unplaced > 0 {
        let allowed = |provider: &str| {
            policy.providers.is_empty() || policy.providers.iter().any(|p| p == provider)
        };
        let backing_off = backoffs
            .iter()
            .filter(|b| b.retry_at > now && allowed(&b.provider))
            .filter(|b| {
                pool.offers
                    .iter()
                    .any(|o| o.provider == b.provider && (b.offer.is_empty() || b.offer == o.key))
                    || pool.offers.is_empty()
            })
            .min_by_key(|b| b.retry_at);
        if let Some(backoff) = backing_off {
            return WaitReason::ProviderBackoff {
                provider: backoff.provider.clone(),
                last_error: backoff.last_error.clone(),
                retry_at: backoff.retry_at,
            };
        }
    }
    WaitReason::NoProviderCapacity
}

/// Jittered exponential back-off after `consecutive_failures` failed
/// creates: 5 s doubling to at most 10 min, scaled by `jitter` in [0.5, 1].
pub fn backoff_delay(consecutive_failures: u32, jitter: f64) -> Duration {
    let base = Duration::from_secs(5)
        .saturating_mul(1u32 << consecutive_failures.saturating_sub(1).min(7));
    base.min(Duration::from_secs(600))
        .mul_f64(jitter.clamp(0.5, 1.0))
}

/// How long it takes a learnt reliability to win back half of what it lost
/// with no new evidence (see [`recovered_reliability`]).
pub const RELIABILITY_HALF_LIFE: Duration = Duration::from_secs(600);

/// A reliability learnt `elapsed` ago, as it stands now: what it lost
/// halves every [`RELIABILITY_HALF_LIFE`]. An offer that failed once and was
/// never tried again (an equal-priced alternative kept winning) thus
/// becomes the planner's choice again, instead of being shunned forever;
/// a fresh failure lowers it again.
pub fn recovered_reliability(learnt: f64, elapsed: Duration) -> f64 {
    let halves = elapsed.as_secs_f64() / RELIABILITY_HALF_LIFE.as_secs_f64();
    (1.0 - (1.0 - learnt) * 0.5f64.powf(halves)).clamp(0.01, 1.0)
}

/// Reliability learnt from create outcomes: an exponential moving average
/// (weight 0.2 on the newest outcome) starting from 1.0, so a provider that
/// fails half its creates drifts to about 0.5 within ten creates and
/// recovers as it succeeds again. Never below 0.01, so price still matters.
pub fn learn_reliability(previous: f64, succeeded: bool) -> f64 {
    let outcome = if succeeded { 1.0 } else { 0.0 };
    (0.8 * previous + 0.2 * outcome).clamp(0.01, 1.0)
}
