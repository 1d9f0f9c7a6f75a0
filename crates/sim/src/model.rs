//! What the simulator's engine and its policies share: the providers and
//! pools modelled (`Setup`), the runners of a pool and their phases, what
//! a policy sees of one pool (`PoolView`) and decides (`Decision`), and the
//! `Policy` trait itself. The engine (`crate::engine`) runs them.

use std::collections::VecDeque;
use std::time::Duration;

use runway_core::planner::PoolPolicy;

use crate::trace::TraceJob;

/// A provider as the simulator sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderModel {
    pub name: String,
    /// Boot time in seconds, uniform between the two.
    pub boot_seconds: (f64, f64),
    pub fail_rate: f64,
    pub price_per_hour: f64,
    pub max_instances: u32,
    /// How long a stopped runner takes to be ready once started; `None`:
    /// the provider cannot keep stopped runners.
    pub resume_seconds: Option<f64>,
    /// What a stopped runner costs an hour (its disk).
    pub stopped_price_per_hour: f64,
}

impl ProviderModel {
    pub fn mean_boot(&self) -> Duration {
        Duration::from_secs_f64(((self.boot_seconds.0 + self.boot_seconds.1) / 2.0).max(0.0))
    }

    /// The longest boot time.
    pub fn longest_boot(&self) -> Duration {
        Duration::from_secs_f64(self.boot_seconds.0.max(self.boot_seconds.1).max(0.0))
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct PoolModel {
    /// Scaling settings, exactly as `runway serve` reads them.
    pub policy: PoolPolicy,
    pub labels: Vec<String>,
    pub ephemeral: bool,
    /// The quantile of the forecast arrivals the predictive policy keeps
    /// warm: the pool's `forecast_quantile`, or what its `wait_value` gives
    /// (`runway_core::forecast::quantile_for`).
    pub forecast_quantile: f64,
    /// Stopped runners: `min_stopped`, `max_stopped`, `stopped_max_age`.
    pub stopped: runway_core::stopped::StoppedPolicy,
    /// The quantile of the forecast arrivals kept stopped
    /// (`runway_core::stopped::quantile_for`).
    pub stopped_quantile: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Setup {
    pub pools: Vec<PoolModel>,
    pub providers: Vec<ProviderModel>,
    /// The reconcile interval (`[scaling] interval`).
    pub interval: Duration,
    pub default_pool: Option<String>,
    pub required_labels: Vec<String>,
    /// Seeds the providers' randomness (the same for every policy).
    pub seed: u64,
}

impl Setup {
    /// Indexes of the providers `pool` may use, in preference order.
    pub fn providers_of(&self, pool: &PoolModel) -> Vec<usize> {
        if pool.policy.providers.is_empty() {
            (0..self.providers.len()).collect()
        } else {
            pool.policy
                .providers
                .iter()
                .filter_map(|name| self.providers.iter().position(|p| &p.name == name))
                .collect()
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunnerPhase {
    Booting,
    Idle,
    Busy,
    /// Booting once, to be stopped when ready (no job, no credential).
    Preparing,
    /// Stopped: paid at the provider's stopped price, not against quotas.
    Stopped,
    /// Started from stopped, ready in the provider's `resume_seconds`.
    Resuming,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SimRunner {
    pub id: u64,
    pub provider: usize,
    pub created_ms: i64,
    pub phase: RunnerPhase,
    /// When it last became idle (meaningful while idle), stopped (while
    /// stopped) or was started (while resuming).
    pub idle_since_ms: i64,
    /// Time spent stopped before its current phase.
    pub stopped_ms: i64,
}

/// A pool's runners, by id. Ids only grow, so a vector kept in id order
/// finds one by binary search and is walked fast by the planner's snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Runners(pub(crate) Vec<SimRunner>);

impl Runners {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn values(&self) -> std::slice::Iter<'_, SimRunner> {
        self.0.iter()
    }

    pub fn get(&self, id: &u64) -> Option<&SimRunner> {
        self.0
            .binary_search_by_key(id, |r| r.id)
            .ok()
            .map(|i| &self.0[i])
    }

    pub(crate) fn get_mut(&mut self, id: &u64) -> Option<&mut SimRunner> {
        let index = self.0.binary_search_by_key(id, |r| r.id).ok()?;
        Some(&mut self.0[index])
    }

    pub(crate) fn remove(&mut self, id: &u64) -> Option<SimRunner> {
        let index = self.0.binary_search_by_key(id, |r| r.id).ok()?;
        Some(self.0.remove(index))
    }

    /// Adds a runner whose id is above every other's.
    pub fn push(&mut self, runner: SimRunner) {
        debug_assert!(self.0.last().is_none_or(|last| last.id < runner.id));
        self.0.push(runner);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueuedJob {
    pub job: usize,
    pub arrival_ms: i64,
}

/// What a policy sees of one pool.
pub struct PoolView<'a> {
    pub index: usize,
    pub model: &'a PoolModel,
    pub setup: &'a Setup,
    pub queued: &'a VecDeque<QueuedJob>,
    pub runners: &'a Runners,
    /// Live instances per provider (against their quotas).
    pub live: &'a [u32],
}

impl PoolView<'_> {
    pub fn count(&self, phase: RunnerPhase) -> u32 {
        self.runners.values().filter(|r| r.phase == phase).count() as u32
    }

    /// Creates `n` runners on the first allowed providers with quota left.
    pub fn create_in_preference_order(&self, mut n: u32) -> Vec<(usize, u32)> {
        let mut out = Vec::new();
        for provider in self.setup.providers_of(self.model) {
            if n == 0 {
                break;
            }
            let left = self.setup.providers[provider]
                .max_instances
                .saturating_sub(self.live[provider]);
            let take = left.min(n);
            if take > 0 {
                out.push((provider, take));
                n -= take;
            }
        }
        out
    }

    /// Prepares `n` stopped runners on the first allowed providers that can
    /// stop one and have quota left for its preparing boot.
    pub fn prepare_in_preference_order(&self, mut n: u32) -> Vec<(usize, u32)> {
        let mut out = Vec::new();
        for provider in self.setup.providers_of(self.model) {
            let model = &self.setup.providers[provider];
            if n == 0 {
                break;
            }
            if model.resume_seconds.is_none() {
                continue;
            }
            let take = model
                .max_instances
                .saturating_sub(self.live[provider])
                .min(n);
            if take > 0 {
                out.push((provider, take));
                n -= take;
            }
        }
        out
    }

    /// Runners that count against `max_runners`: all but the stopped and
    /// those being prepared to stop.
    pub fn running(&self) -> u32 {
        self.runners
            .values()
            .filter(|r| !matches!(r.phase, RunnerPhase::Preparing | RunnerPhase::Stopped))
            .count() as u32
    }

    /// Idle runners, longest idle first.
    pub fn idle_longest_first(&self) -> Vec<&SimRunner> {
        let mut idle: Vec<&SimRunner> = self
            .runners
            .values()
            .filter(|r| r.phase == RunnerPhase::Idle)
            .collect();
        idle.sort_by_key(|r| (r.idle_since_ms, r.id));
        idle
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decision {
    /// (provider index, how many).
    pub create: Vec<(usize, u32)>,
    /// Runners to delete; a busy one is refused (and counted).
    pub delete: Vec<u64>,
    /// (provider index, how many) to prepare: boot once, then stop.
    pub prepare: Vec<(usize, u32)>,
    /// Stopped runners to start.
    pub start: Vec<u64>,
    /// From `on_delayed`: ask again this much later (a message returned
    /// to its queue).
    pub retry_after_ms: Option<i64>,
}

/// A scaling policy, asked at every reconcile tick and, if it reacts to
/// them, at job arrivals.
pub trait Policy {
    fn name(&self) -> String;

    /// Decides for one pool at `now` (every tick).
    fn decide(&mut self, view: &PoolView<'_>, now: i64) -> Decision;

    /// Told once, before the run, every arrival to come, per pool
    /// (milliseconds, ascending). Only a policy with perfect foresight (the
    /// oracle) listens; the others learn arrivals as they happen.
    fn foresee(&mut self, _arrivals: &[Vec<i64>]) {}

    /// Every arrival, in time order (what a forecast learns from).
    fn observe_arrival(&mut self, _pool: usize, _job: &TraceJob, _now: i64) {}

    /// Reacts to arrivals in `view`'s pool (`queued`: a job of the pool is
    /// waiting). Like `runway serve`'s reconciler woken by an arrival, it
    /// runs at most once a second per pool: arrivals within a second of a
    /// reaction wake one more, a second after it. Default: nothing until
    /// the next tick.
    fn on_arrival(&mut self, _view: &PoolView<'_>, _queued: bool, _now: i64) -> Decision {
        Decision::default()
    }

    /// How long after an arrival `on_delayed` runs (a webhook queue's delay).
    fn arrival_delay_ms(&self) -> Option<i64> {
        None
    }

    /// `arrival_delay_ms` after an arrival; `still_queued` says whether that
    /// job is still waiting.
    fn on_delayed(&mut self, _view: &PoolView<'_>, _still_queued: bool, _now: i64) -> Decision {
        Decision::default()
    }
}

impl<P: Policy + ?Sized> Policy for Box<P> {
    fn name(&self) -> String {
        (**self).name()
    }
    fn foresee(&mut self, arrivals: &[Vec<i64>]) {
        (**self).foresee(arrivals)
    }
    fn decide(&mut self, view: &PoolView<'_>, now: i64) -> Decision {
        (**self).decide(view, now)
    }
    fn observe_arrival(&mut self, pool: usize, job: &TraceJob, now: i64) {
        (**self).observe_arrival(pool, job, now)
    }
    fn on_arrival(&mut self, view: &PoolView<'_>, queued: bool, now: i64) -> Decision {
        (**self).on_arrival(view, queued, now)
    }
    fn arrival_delay_ms(&self) -> Option<i64> {
        (**self).arrival_delay_ms()
    }
    fn on_delayed(&mut self, view: &PoolView<'_>, still_queued: bool, now: i64) -> Decision {
        (**self).on_delayed(view, still_queued, now)
    }
}
