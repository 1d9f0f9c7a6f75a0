//! The policies `runway sim` compares: runway's own (the production
//! planner, `runway_core::planner::plan`, and the predictive warm pool on
//! top of it) and baselines modelled on the other systems' documented
//! behaviour. Every baseline reads the pool's settings: `min_idle`,
//! `max_runners`, `scaling_ratio`, `idle_grace` mean what the system's own
//! nearest setting means.

use std::time::Duration;

use runway_core::forecast::ArrivalForecast;
use runway_core::planner::{decide, Action, Offer, PoolSnapshot, RunnerView, Snapshot};
use runway_core::{RunnerId, RunnerState, Timestamp};

use crate::engine::{Decision, Policy, PoolView, RunnerPhase};
use crate::trace::TraceJob;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown policy {0:?}; one of oracle, runway[+stopped], predictive[:QUANTILE][+stopped], static:N, arc, taskcluster, lambda, gitlab, reactive-prespawn")]
pub struct UnknownPolicy(pub String);

/// Builds a policy from its command-line name.
pub fn by_name(name: &str, pools: usize) -> Result<Box<dyn Policy + Send>, UnknownPolicy> {
    let unknown = || UnknownPolicy(name.to_owned());
    let (name, stopped) = match name.strip_suffix("+stopped") {
        Some(base) => (base, true),
        None => (name, false),
    };
    let (base, argument) = match name.split_once(':') {
        Some((base, argument)) => (base, Some(argument)),
        None => (name, None),
    };
    if stopped && !matches!(base, "runway" | "predictive") {
        return Err(unknown());
    }
    Ok(match (base, argument) {
        ("runway", None) => Box::new(Runway {
            stopped,
            ..Runway::default()
        }),
        ("predictive", quantile) => {
            let quantile = match quantile {
                None => None,
                Some(text) => Some(
                    text.parse::<f64>()
                        .ok()
                        .filter(|q| *q > 0.0 && *q <= 1.0)
                        .ok_or_else(unknown)?,
                ),
            };
            if stopped {
                Box::new(Predictive::with_stopped(pools, quantile))
            } else {
                Box::new(Predictive::new(pools, quantile))
            }
        }
        ("static", Some(n)) => Box::new(Static(n.parse().map_err(|_| unknown())?)),
        ("arc", None) => Box::new(Arc),
        ("taskcluster", None) => Box::new(Taskcluster),
        ("lambda", None) => Box::new(Lambda::default()),
        ("gitlab", None) => Box::new(Gitlab),
        ("reactive-prespawn", None) => Box::new(ReactivePrespawn),
        ("oracle", None) => Box::new(Oracle::default()),
        _ => return Err(unknown()),
    })
}

/// The policies `--policy all` compares.
pub const ALL: [&str; 9] = [
    "oracle",
    "runway",
    "predictive",
    "static:10",
    "arc",
    "taskcluster",
    "lambda",
    "gitlab",
    "reactive-prespawn",
];

/// The planner's state of a runner that counts as the pool's capacity;
/// `None` for stopped ones and those being prepared to stop, which the
/// stopped layer ([`crate::stopped::decision`]) plans for instead.
fn state_of(phase: RunnerPhase) -> Option<RunnerState> {
    match phase {
        RunnerPhase::Booting | RunnerPhase::Resuming => Some(RunnerState::Provisioning),
        RunnerPhase::Idle => Some(RunnerState::Idle),
        RunnerPhase::Busy => Some(RunnerState::Busy),
        RunnerPhase::Preparing | RunnerPhase::Stopped => None,
    }
}

/// The planner's view of a simulated pool: what `runway serve` builds from
/// the store and the providers' bids, built from the simulator's state.
pub fn snapshot(view: &PoolView<'_>, min_idle: u32) -> Snapshot {
    let mut input = PlannerInput::default();
    input.fill(view, min_idle);
    input.snapshot
}

/// A snapshot kept between calls, refilled in place: a million plans
/// over a month must not allocate a million runner lists.
#[derive(Default)]
pub struct PlannerInput {
    snapshot: Snapshot,
    /// The provider index each runner slot's name was written for.
    slot_providers: Vec<usize>,
}

impl PlannerInput {
    pub fn fill(&mut self, view: &PoolView<'_>, min_idle: u32) -> &Snapshot {
        if self.snapshot.pools.is_empty() {
            self.snapshot.pools.push(PoolSnapshot {
                unlisted: 0,
                held: Vec::new(),
                policy: view.model.policy.clone(),
                queued: Vec::new(),
                runners: Vec::new(),
                offers: Vec::new(),
            });
        }
        let pool = &mut self.snapshot.pools[0];
        if pool.policy.name != view.model.policy.name {
            pool.policy = view.model.policy.clone();
        }
        pool.policy.min_idle = min_idle;
        pool.offers.clear();
        for index in view.setup.providers_of(view.model) {
            let provider = &view.setup.providers[index];
            let capacity = provider
                .max_instances
                .saturating_sub(view.live[index])
                .min(pool.policy.max_runners);
            if capacity > 0 {
                pool.offers.push(Offer {
                    provider: provider.name.clone(),
                    key: String::new(),
                    capacity,
                    price_per_hour: provider.price_per_hour,
                    boot_time: provider.mean_boot(),
                    reliability: (1.0 - provider.fail_rate).clamp(0.01, 1.0),
                });
            }
        }
        // The queue as a count: a decision must not cost more as the queue
        // grows (no wait reasons are asked for here).
        pool.queued.clear();
        pool.unlisted = u32::try_from(view.queued.len()).unwrap_or(u32::MAX);
        let mut kept = 0;
        for runner in view.runners.values() {
            let Some(state) = state_of(runner.phase) else {
                continue;
            };
            let fresh = RunnerView {
                id: RunnerId(runner.id as i64),
                provider: String::new(),
                state,
                in_doubt: false,
                // A started stopped runner was asked for at its start.
                requested_at: Timestamp::from_millis(if runner.phase == RunnerPhase::Resuming {
                    runner.idle_since_ms
                } else {
                    runner.created_ms
                }),
                idle_at: (runner.phase == RunnerPhase::Idle)
                    .then(|| Timestamp::from_millis(runner.idle_since_ms)),
                ready_by: None,
            };
            if kept == pool.runners.len() {
                pool.runners.push(RunnerView {
                    provider: view.setup.providers[runner.provider].name.clone(),
                    ..fresh
                });
                self.slot_providers.push(runner.provider);
            } else {
                let slot = &mut pool.runners[kept];
                let provider = std::mem::take(&mut slot.provider);
                *slot = RunnerView { provider, ..fresh };
                if self.slot_providers[kept] != runner.provider {
                    slot.provider.clear();
                    slot.provider
                        .push_str(&view.setup.providers[runner.provider].name);
                    self.slot_providers[kept] = runner.provider;
                }
            }
            kept += 1;
        }
        pool.runners.truncate(kept);
        self.slot_providers.truncate(kept);
        &self.snapshot
    }
}

/// The planner's actions as a simulator decision.
pub fn decision_of(view: &PoolView<'_>, actions: &[Action]) -> Decision {
    let mut decision = Decision::default();
    for action in actions {
        match action {
            Action::Create {
                provider, count, ..
            } => {
                if let Some(index) = view
                    .setup
                    .providers
                    .iter()
                    .position(|p| &p.name == provider)
                {
                    decision.create.push((index, *count));
                }
            }
            Action::Delete { runner, .. } | Action::FailAndDelete { runner, .. } => {
                decision.delete.push(runner.0 as u64);
            }
        }
    }
    decision
}

/// The production planner's decision; with `stopped`, the pool's stopped
/// capacity planned first (`runway_core::stopped::plan`, `expected`
/// arrivals within the refill horizon): the jobs the runners it starts will
/// take are not cold-booted for.
fn runway_decision(
    input: &mut PlannerInput,
    view: &PoolView<'_>,
    min_idle: u32,
    stopped: Option<u32>,
    now: i64,
) -> Decision {
    input.fill(view, min_idle);
    let filled = input.snapshot.pools[0].runners.len();
    let layer = stopped.map(|expected| crate::stopped::decision(view, expected, now));
    if let Some(layer) = &layer {
        // What it starts is booting from the planner's view: capacity for
        // the queue, and against max_runners.
        let pool = &mut input.snapshot.pools[0];
        for &id in &layer.start {
            let provider = view
                .runners
                .get(&id)
                .map(|r| view.setup.providers[r.provider].name.clone())
                .unwrap_or_default();
            pool.runners.push(RunnerView {
                id: RunnerId(id as i64),
                provider,
                state: RunnerState::Provisioning,
                in_doubt: false,
                requested_at: Timestamp::from_millis(now),
                idle_at: None,
                ready_by: None,
            });
        }
    }
    let planned = decide(&input.snapshot, Timestamp::from_millis(now));
    // The slots past the filled ones are this round's only (the next
    // fill reuses the filled ones in place).
    input.snapshot.pools[0].runners.truncate(filled);
    let mut decision = decision_of(view, &planned.actions);
    if let Some(layer) = layer {
        decision.start = layer.start;
        decision.prepare = layer.prepare;
        decision.delete.extend(layer.delete);
    }
    decision
}

/// runway: the production planner with the pool's configuration, run every
/// `[scaling] interval` and as soon as a job arrives that found no runner
/// (as `runway serve`'s reconciler is woken by an arrival).
#[derive(Default)]
pub struct Runway {
    /// One per pool.
    inputs: Vec<PlannerInput>,
    /// `runway+stopped`: keeps the pools' `min_stopped` stopped runners
    /// (no forecast) and starts them for queued jobs.
    pub stopped: bool,
}

fn input_of(inputs: &mut Vec<PlannerInput>, pool: usize) -> &mut PlannerInput {
    if inputs.len() <= pool {
        inputs.resize_with(pool + 1, PlannerInput::default);
    }
    &mut inputs[pool]
}

impl Policy for Runway {
    fn name(&self) -> String {
        if self.stopped {
            "runway+stopped".into()
        } else {
            "runway".into()
        }
    }

    fn decide(&mut self, view: &PoolView<'_>, now: i64) -> Decision {
        let input = input_of(&mut self.inputs, view.index);
        let stopped = self.stopped.then_some(0);
        runway_decision(input, view, view.model.policy.min_idle, stopped, now)
    }

    fn on_arrival(&mut self, view: &PoolView<'_>, queued: bool, now: i64) -> Decision {
        if queued {
            self.decide(view, now)
        } else {
            Decision::default()
        }
    }
}

/// oracle: perfect foresight, the floor the other policies are measured
/// against. It knows every arrival and, at each tick, starts the runners
/// the arrivals of the next boot time and tick need, so each is ready
/// before its job arrives; it keeps no runner no known arrival needs.
/// Within max_runners and quotas, like every policy. It boots for the
/// provider's longest boot time (it knows arrivals, not the boot-time
/// draws), and decides at ticks, so a runner may wait idle up to one
/// tick plus the boot-time spread: close to the floor, not exactly it.
#[derive(Default)]
pub struct Oracle {
    /// Per pool, ascending.
    arrivals: Vec<Vec<i64>>,
}

impl Policy for Oracle {
    fn name(&self) -> String {
        "oracle".into()
    }

    fn foresee(&mut self, arrivals: &[Vec<i64>]) {
        self.arrivals = arrivals.to_vec();
    }

    fn decide(&mut self, view: &PoolView<'_>, now: i64) -> Decision {
        let Some(arrivals) = self.arrivals.get(view.index) else {
            return Decision::default();
        };
        let boot_ms = view
            .setup
            .providers_of(view.model)
            .iter()
            .map(|&p| view.setup.providers[p].longest_boot().as_millis() as i64)
            .max()
            .unwrap_or(0);
        let interval_ms = i64::try_from(view.setup.interval.as_millis()).unwrap_or(10_000);
        // Arrivals a runner started now or before must serve: up to one
        // boot time and one tick ahead (those after, a later tick starts
        // for). Counted by binary search: the cost does not grow with the
        // trace.
        let from = arrivals.partition_point(|&at| at < now);
        let to = arrivals.partition_point(|&at| at < now + boot_ms + interval_ms);
        let upcoming = u32::try_from(to - from).unwrap_or(u32::MAX);
        let want = upcoming.saturating_add(view.queued.len() as u32);
        let idle = view.count(RunnerPhase::Idle);
        let supply = idle + view.count(RunnerPhase::Booting);
        let mut decision = Decision::default();
        if want > supply {
            let room = view
                .model
                .policy
                .max_runners
                .saturating_sub(view.runners.len() as u32);
            decision.create = view.create_in_preference_order((want - supply).min(room));
        } else {
            let surplus = (supply - want).min(idle) as usize;
            decision.delete = view
                .idle_longest_first()
                .into_iter()
                .take(surplus)
                .map(|r| r.id)
                .collect();
        }
        decision
    }
}

/// predictive: runway's planner with a forecast-driven warm pool — as many
/// idle runners as the arrivals expected within one (longest) boot time and
/// a round, at the pool's forecast quantile (from its `wait_value`,
/// `runway_core::forecast`; learnt online from the arrivals so far), or at
/// the quantile `predictive:Q` names; never fewer than `min_idle`, never
/// more than `max_runners`.
///
/// `predictive+stopped`: where the pool keeps stopped runners, the warm pool
/// is stopped instead of idle: as many stopped as the arrivals expected
/// within the refill horizon at the pool's stopped quantile, started for
/// queued jobs, and idle runners only to `min_idle`.
pub struct Predictive {
    /// `None`: each pool's from its `wait_value`.
    quantile: Option<f64>,
    stopped: bool,
    forecasts: Vec<Option<ArrivalForecast>>,
    inputs: Vec<PlannerInput>,
}

impl Predictive {
    pub fn new(pools: usize, quantile: Option<f64>) -> Predictive {
        Predictive {
            quantile,
            stopped: false,
            forecasts: vec![None; pools],
            inputs: Vec::new(),
        }
    }

    /// The same, with stopped runners where a pool keeps them.
    pub fn with_stopped(pools: usize, quantile: Option<f64>) -> Predictive {
        Predictive {
            stopped: true,
            ..Predictive::new(pools, quantile)
        }
    }

    fn warm(&mut self, view: &PoolView<'_>, now: i64) -> u32 {
        let expected = self.forecast(view).expected(Timestamp::from_millis(now));
        expected
            .max(view.model.policy.min_idle)
            .min(view.model.policy.max_runners)
    }

    /// With stopped runners: (idle runners to keep, arrivals to keep
    /// stopped for).
    fn stopped_warm(&mut self, view: &PoolView<'_>, now: i64) -> (u32, u32) {
        let quantile = view.model.stopped_quantile;
        let expected = runway_core::stopped::stock_expected(
            &self
                .forecast(view)
                .explain_at(Timestamp::from_millis(now), quantile),
        );
        (view.model.policy.min_idle, expected)
    }

    fn forecast(&mut self, view: &PoolView<'_>) -> &mut ArrivalForecast {
        // A runner started now is ready within the longest boot time; the
        // next chance to start one is a round away.
        let boot = view
            .setup
            .providers_of(view.model)
            .first()
            .map(|p| view.setup.providers[*p].longest_boot())
            .unwrap_or(Duration::from_secs(150));
        let horizon = boot + view.setup.interval;
        let quantile = self.quantile.unwrap_or(view.model.forecast_quantile);
        self.forecasts[view.index].get_or_insert_with(|| ArrivalForecast::new(horizon, quantile))
    }
}

impl Policy for Predictive {
    fn name(&self) -> String {
        let base = match self.quantile {
            None => "predictive".to_owned(),
            Some(quantile) => format!("predictive:{quantile}"),
        };
        if self.stopped {
            format!("{base}+stopped")
        } else {
            base
        }
    }

    fn decide(&mut self, view: &PoolView<'_>, now: i64) -> Decision {
        let (warm, stopped) = if self.stopped && view.model.stopped.keeps_any() {
            let (warm, expected) = self.stopped_warm(view, now);
            (warm, Some(expected))
        } else {
            (self.warm(view, now), None)
        };
        runway_decision(
            input_of(&mut self.inputs, view.index),
            view,
            warm,
            stopped,
            now,
        )
    }

    fn observe_arrival(&mut self, pool: usize, job: &TraceJob, now: i64) {
        // Forecasts are made on the first decision for a pool (they need its
        // boot time); arrivals before that are not lost, as a pool is
        // decided for at the very first tick.
        if let Some(Some(forecast)) = self.forecasts.get_mut(pool) {
            let run = job
                .run_id
                .map(|id| (id, job.workflow.as_deref().unwrap_or_default()));
            let key = job.repo.as_deref().unwrap_or_default();
            forecast.observe_job(Timestamp::from_millis(now), run, key);
        }
    }

    fn on_arrival(&mut self, view: &PoolView<'_>, _queued: bool, now: i64) -> Decision {
        // Refill the warm pool at once, as runway serve does on an arrival.
        self.decide(view, now)
    }
}

/// `static:N`: a fixed pool of N runners, replaced when one ends, never
/// scaled (the self-hosted runners most teams start with).
pub struct Static(pub u32);

impl Policy for Static {
    fn name(&self) -> String {
        format!("static:{}", self.0)
    }

    fn decide(&mut self, view: &PoolView<'_>, _now: i64) -> Decision {
        let have = view.runners.len() as u32;
        Decision {
            create: view.create_in_preference_order(self.0.saturating_sub(have)),
            ..Decision::default()
        }
    }
}

/// arc: actions-runner-controller with runner scale sets
/// (actions/actions-runner-controller, `docs/gha-runner-scale-set-controller`:
/// the listener receives "job assigned" messages and patches the
/// EphemeralRunnerSet to `desired = min(minRunners + assigned jobs,
/// maxRunners)`; runners are ephemeral; on scale-down the controller
/// deletes pending runners first, then idle ones). `minRunners` is the
/// pool's `min_idle`, `maxRunners` its `max_runners`; the listener reacts
/// at once to each job.
pub struct Arc;

impl Arc {
    fn target(view: &PoolView<'_>) -> Decision {
        let policy = &view.model.policy;
        let assigned = view.queued.len() as u32 + view.count(RunnerPhase::Busy);
        let desired = (policy.min_idle + assigned).min(policy.max_runners);
        let have = view.runners.len() as u32;
        if desired > have {
            return Decision {
                create: view.create_in_preference_order(desired - have),
                ..Decision::default()
            };
        }
        let mut surplus = (have - desired) as usize;
        let mut delete = Vec::new();
        for phase in [RunnerPhase::Booting, RunnerPhase::Idle] {
            for runner in view.runners.values().filter(|r| r.phase == phase) {
                if surplus == 0 {
                    break;
                }
                delete.push(runner.id);
                surplus -= 1;
            }
        }
        Decision {
            delete,
            ..Decision::default()
        }
    }
}

impl Policy for Arc {
    fn name(&self) -> String {
        "arc".into()
    }
    fn decide(&mut self, view: &PoolView<'_>, _now: i64) -> Decision {
        Arc::target(view)
    }
    fn on_arrival(&mut self, view: &PoolView<'_>, _queued: bool, _now: i64) -> Decision {
        Arc::target(view)
    }
}

/// taskcluster: the worker-manager estimator (taskcluster/taskcluster,
/// `services/worker-manager/src/estimator.js`): `desired = max(minCapacity,
/// min(max(0, pending − idle) × scalingRatio + existing, maxCapacity))`,
/// the difference to `existing` requested each provisioning loop; workers
/// shut themselves down after `afterIdleSeconds` idle. `minCapacity` is
/// `min_idle`, `maxCapacity` `max_runners`, `scalingRatio` the pool's,
/// `afterIdleSeconds` its `idle_grace`.
pub struct Taskcluster;

impl Policy for Taskcluster {
    fn name(&self) -> String {
        "taskcluster".into()
    }

    fn decide(&mut self, view: &PoolView<'_>, now: i64) -> Decision {
        let policy = &view.model.policy;
        let pending = view.queued.len() as f64;
        let idle = f64::from(view.count(RunnerPhase::Idle));
        let existing = view.runners.len() as f64;
        let desired = ((pending - idle).max(0.0) * policy.scaling_ratio + existing)
            .min(f64::from(policy.max_runners))
            .max(f64::from(policy.min_idle));
        let create = (desired.ceil() - existing).max(0.0) as u32;
        let grace = i64::try_from(policy.idle_grace.as_millis()).unwrap_or(i64::MAX);
        let mut keep = view.runners.len() as u32;
        let delete = view
            .idle_longest_first()
            .into_iter()
            .filter(|r| now - r.idle_since_ms > grace)
            .filter(|_| {
                // A worker shuts down when idle long enough, down to minCapacity.
                let go = keep > policy.min_idle;
                keep -= u32::from(go);
                go
            })
            .map(|r| r.id)
            .collect();
        Decision {
            create: view.create_in_preference_order(create),
            delete,
            ..Decision::default()
        }
    }
}

/// lambda: philips-labs/terraform-aws-github-runner. Each `workflow_job`
/// webhook is put on an SQS queue with `delay_webhook_event` (default 30 s);
/// the scale-up Lambda then checks the job is still queued
/// (`enable_job_queued_check`) and starts one runner if fewer than
/// `runners_maximum_count` exist. The scale-down Lambda runs on
/// `scale_down_schedule_expression` (default every 5 minutes) and removes
/// idle runners that have run at least `minimum_running_time_in_minutes`
/// (default 5), keeping `idle_config`'s count (here `min_idle`). A scale-up
/// refused because the maximum is reached returns the message to the queue,
/// to be tried again after the same delay. With ephemeral runners, a runner
/// started for job A can take job B first; B's own check then finds B
/// started, and A waits with no runner coming (the module's `job_retry`,
/// which would look again, is off by default) — the simulator reports such
/// jobs as never started.
#[derive(Default)]
pub struct Lambda {
    /// Per pool: when the scale-down Lambda runs next.
    next_sweep_ms: Vec<i64>,
}

const LAMBDA_DELAY_MS: i64 = 30_000;
const LAMBDA_SWEEP_MS: i64 = 5 * 60_000;
const LAMBDA_MINIMUM_RUNNING_MS: i64 = 5 * 60_000;

impl Policy for Lambda {
    fn name(&self) -> String {
        "lambda".into()
    }

    fn decide(&mut self, view: &PoolView<'_>, now: i64) -> Decision {
        if self.next_sweep_ms.len() <= view.index {
            self.next_sweep_ms.resize(view.index + 1, 0);
        }
        if now < self.next_sweep_ms[view.index] {
            return Decision::default();
        }
        self.next_sweep_ms[view.index] = now + LAMBDA_SWEEP_MS;
        let policy = &view.model.policy;
        let mut decision = Decision::default();
        // idle_config: keep min_idle runners.
        let have = view.runners.len() as u32;
        if have < policy.min_idle {
            decision.create = view.create_in_preference_order(policy.min_idle - have);
        }
        let mut idle = view.count(RunnerPhase::Idle);
        for runner in view.idle_longest_first() {
            if idle <= policy.min_idle {
                break;
            }
            if now - runner.created_ms >= LAMBDA_MINIMUM_RUNNING_MS {
                decision.delete.push(runner.id);
                idle -= 1;
            }
        }
        decision
    }

    fn arrival_delay_ms(&self) -> Option<i64> {
        Some(LAMBDA_DELAY_MS)
    }

    fn on_delayed(&mut self, view: &PoolView<'_>, still_queued: bool, _now: i64) -> Decision {
        let policy = &view.model.policy;
        if !still_queued {
            return Decision::default();
        }
        if (view.runners.len() as u32) < policy.max_runners {
            Decision {
                create: view.create_in_preference_order(1),
                ..Decision::default()
            }
        } else {
            Decision {
                retry_after_ms: Some(LAMBDA_DELAY_MS),
                ..Decision::default()
            }
        }
    }
}

/// gitlab: GitLab Runner's taskscaler (gitlab-org/fleeting/taskscaler,
/// `[[runners.autoscaler.policy]]`): keep `idle_count` instances idle, or
/// `scale_factor` × in-use if more (capped by `scale_factor_limit`), never
/// more than `max_instances`; instances idle beyond `idle_time` above that
/// count are removed. A job is "in use" once a runner asked for it, so a
/// queued job counts. `idle_count` is `min_idle`, `idle_time` `idle_grace`,
/// `max_instances` `max_runners`; `scale_factor` is 0.5 (a documented
/// example), `scale_factor_limit` `max_runners`.
pub struct Gitlab;

const GITLAB_SCALE_FACTOR: f64 = 0.5;

impl Policy for Gitlab {
    fn name(&self) -> String {
        "gitlab".into()
    }

    fn decide(&mut self, view: &PoolView<'_>, now: i64) -> Decision {
        let policy = &view.model.policy;
        let in_use = view.count(RunnerPhase::Busy) + view.queued.len() as u32;
        let idle_target = policy
            .min_idle
            .max((GITLAB_SCALE_FACTOR * f64::from(in_use)).ceil() as u32)
            .min(policy.max_runners);
        let wanted = (in_use + idle_target).min(policy.max_runners);
        let have = view.runners.len() as u32;
        let grace = i64::try_from(policy.idle_grace.as_millis()).unwrap_or(i64::MAX);
        let mut delete = Vec::new();
        let mut idle = view.count(RunnerPhase::Idle) + view.count(RunnerPhase::Booting);
        for runner in view.idle_longest_first() {
            if idle <= idle_target || have - delete.len() as u32 <= wanted {
                break;
            }
            if now - runner.idle_since_ms > grace {
                delete.push(runner.id);
                idle -= 1;
            }
        }
        Decision {
            create: view.create_in_preference_order(wanted.saturating_sub(have)),
            delete,
            ..Decision::default()
        }
    }
}

/// reactive-prespawn: the original reactive-scheduling spec (canonical's
/// GitHub runner operator, "reactive spawning"): jobs go to a per-flavor
/// queue that is consumed on each reconcile interval, one new runner per
/// queued job not yet covered by a booting one, up to the flavor's maximum,
/// plus a fixed pre-spawned idle set (`min_idle`) kept topped up. Runners
/// are ephemeral; idle pre-spawned runners are never removed.
pub struct ReactivePrespawn;

impl Policy for ReactivePrespawn {
    fn name(&self) -> String {
        "reactive-prespawn".into()
    }

    fn decide(&mut self, view: &PoolView<'_>, _now: i64) -> Decision {
        let policy = &view.model.policy;
        let queued = view.queued.len() as u32;
        let booting = view.count(RunnerPhase::Booting);
        let idle = view.count(RunnerPhase::Idle);
        let reactive = queued.saturating_sub(booting);
        let prespawn = policy
            .min_idle
            .saturating_sub(idle + booting.saturating_sub(queued));
        let room = policy.max_runners.saturating_sub(view.runners.len() as u32);
        Decision {
            create: view.create_in_preference_order((reactive + prespawn).min(room)),
            ..Decision::default()
        }
    }
}
