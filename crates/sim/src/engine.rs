//! The discrete-event engine: a virtual clock in milliseconds, jobs arriving
//! from a trace, runners that boot, take jobs, finish them and are deleted,
//! and a policy asked what to create and delete.
//!
//! The cloud is modelled as the `sim` provider models it: each create fails
//! with the provider's `fail_rate`, otherwise the instance is ready after a
//! boot time drawn uniformly from the provider's `boot_seconds`; a quota
//! (`max_instances`) and a price per hour. A ready runner takes the oldest
//! queued job of its pool at once (as a long-polling runner does); an
//! ephemeral runner is deleted when its job is done.
//!
//! A job marked `started_after` in a workflow run arrives `started_after`
//! after the jobs of its run that had ended before it in the trace have
//! ended here — wherever this simulation put them — so a run whose first
//! job waited for a runner also queues its later jobs later, as GitHub does
//! with `needs:`. Every other job arrives at its trace time.
//!
//! A provider that keeps stopped runners (`resume_seconds`) prepares them
//! (a boot at the running price), keeps them stopped at its stopped price
//! and off its quota, and starts one for a job: ready `resume_seconds`
//! later. What the engine shares with the policies is in `crate::model`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use runway_core::routing::{route, PoolLabels, RouteDecision, RoutingPolicy};

use crate::trace::TraceJob;

pub use crate::model::{
    Decision, Policy, PoolModel, PoolView, ProviderModel, QueuedJob, RunnerPhase, Runners, Setup,
    SimRunner,
};

/// What one policy did with one workload.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub policy: String,
    pub jobs: u64,
    pub unroutable: u64,
    /// Queue time of every started job, in milliseconds, sorted.
    pub queue_ms: Vec<i64>,
    pub runner_hours: f64,
    pub idle_runner_hours: f64,
    pub cost: f64,
    pub delete_requests: u64,
    pub refused_deletes: u64,
    pub failed_creates: u64,
    pub runners_created: u64,
    /// Hours runners spent stopped, and what those hours cost (included in
    /// `cost`; `runner_hours` counts running hours only).
    pub stopped_hours: f64,
    pub stopped_cost: f64,
    /// Stopped runners prepared, and started.
    pub runners_prepared: u64,
    pub starts: u64,
    /// Jobs that never started (a policy that never gives the pool a
    /// runner); counted in `queue_ms` with their wait until the end.
    pub unfinished: u64,
    /// When the last job finished.
    pub end_ms: i64,
    /// (time, runners, queued) sampled at every tick, all pools together.
    pub timeline: Vec<(i64, u32, u32)>,
    /// The fair-share keys (the trace's `repo`; `""` for a job without),
    /// and each one's queue times in milliseconds, sorted.
    pub keys: Vec<String>,
    pub waits_by_key: Vec<Vec<i64>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    Ready {
        pool: usize,
        runner: u64,
    },
    Finish {
        pool: usize,
        runner: u64,
        job: usize,
    },
    /// A later job of a workflow run, released by its earlier jobs' end.
    Arrive {
        job: usize,
    },
    Delayed {
        pool: usize,
        job: usize,
    },
    /// Arrivals came within a second of the last reaction: react now.
    React {
        pool: usize,
    },
}

/// The workflow runs of a trace. A `started_after` job follows the jobs
/// of its run that, in the trace, had ended before it arrived: it arrives
/// `started_after` after the last of them ends here. Those jobs are a
/// prefix of the run's jobs in order of trace end, so a run is a pointer
/// into that order (how far all have ended) and its followers sorted by
/// how long a prefix they wait for.
#[derive(Default)]
struct Runs {
    /// Per job: its run and its place in the run's end order.
    place: Vec<Option<(usize, usize)>>,
    /// Per job: whether it waits for earlier jobs of its run.
    follows: Vec<bool>,
    runs: Vec<Run>,
}

#[derive(Default)]
struct Run {
    /// Per job of the run, in order of trace end: whether it has ended.
    ended: Vec<bool>,
    /// The first `done` jobs in end order have ended.
    done: usize,
    /// (jobs in end order it waits for, job), sorted; `next` is the first
    /// not yet released.
    followers: Vec<(usize, usize)>,
    next: usize,
}

impl Runs {
    fn of(jobs: &[TraceJob]) -> Runs {
        let mut members: std::collections::HashMap<u64, Vec<usize>> =
            std::collections::HashMap::new();
        for (index, job) in jobs.iter().enumerate() {
            if let Some(run) = job.run_id {
                members.entry(run).or_default().push(index);
            }
        }
        let mut runs = Runs {
            place: vec![None; jobs.len()],
            follows: vec![false; jobs.len()],
            runs: Vec::with_capacity(members.len()),
        };
        let mut members: Vec<Vec<usize>> = members.into_values().collect();
        members.sort_unstable_by_key(|m| m[0]);
        for mut member in members {
            let key = |i: &usize| {
                let job = &jobs[*i];
                (job.arrival_ms + job.duration_ms.max(0), job.arrival_ms, *i)
            };
            member.sort_unstable_by_key(key);
            let id = runs.runs.len();
            let mut run = Run {
                ended: vec![false; member.len()],
                ..Run::default()
            };
            for (order, &index) in member.iter().enumerate() {
                runs.place[index] = Some((id, order));
                let job = &jobs[index];
                if job.started_after_ms.is_none() {
                    continue;
                }
                // Ended before it arrived: an earlier end, or the same end
                // by a job that arrived earlier (never itself).
                let waits_for = member.partition_point(|k| {
                    let (end, arrival, _) = key(k);
                    (end, arrival) < (job.arrival_ms, job.arrival_ms)
                });
                if waits_for > 0 {
                    runs.follows[index] = true;
                    run.followers.push((waits_for, index));
                }
            }
            run.followers.sort_unstable();
            runs.runs.push(run);
        }
        runs
    }

    /// `job` has ended: the following jobs its end releases.
    fn finished(&mut self, job: usize) -> Vec<usize> {
        let Some((id, order)) = self.place[job] else {
            return Vec::new();
        };
        let run = &mut self.runs[id];
        run.ended[order] = true;
        while run.done < run.ended.len() && run.ended[run.done] {
            run.done += 1;
        }
        let mut released = Vec::new();
        while let Some(&(waits_for, follower)) = run.followers.get(run.next) {
            if waits_for > run.done {
                break;
            }
            released.push(follower);
            run.next += 1;
        }
        released
    }
}

/// Arrival-triggered reactions run at most this often per pool.
const REACTION_GAP_MS: i64 = 1_000;

/// A pool's queue in fair-share order, as `runway serve` serves it
/// (`runway_core::share`, every key of weight 1): a job's start tag is the
/// pool's virtual time or its key's last queued tag plus one, whichever is
/// later; the lowest tag goes next. Keys are the trace's `repo`; with none
/// (or one) the order is arrival order.
#[derive(Default)]
struct FairQueue {
    /// (tag in thousandths, arrival sequence, job) of the queued jobs.
    order: BTreeSet<(i64, u64, usize)>,
    /// Each key's highest queued tag and its number of queued jobs.
    keys: HashMap<u32, (i64, u32)>,
    /// Tags of the jobs handed out and not yet finished (how many each).
    busy: BTreeMap<i64, u32>,
    /// The tag each queued or busy job got.
    tags: HashMap<usize, i64>,
    sequence: u64,
}

impl FairQueue {
    fn push(&mut self, job: usize, key: u32) {
        let thousandths = |tag: Option<i64>| tag.map(|t| t as f64 / 1000.0);
        let served = thousandths(self.busy.keys().next_back().copied());
        let head = thousandths(self.order.first().map(|(tag, _, _)| *tag));
        let last = thousandths(self.keys.get(&key).map(|(last, _)| *last));
        let tag = runway_core::share::next_tag(served, head, last, runway_core::share::Weight::ONE);
        let tag = (tag * 1000.0).round() as i64;
        self.sequence += 1;
        self.order.insert((tag, self.sequence, job));
        self.tags.insert(job, tag);
        let entry = self.keys.entry(key).or_insert((tag, 0));
        entry.0 = entry.0.max(tag);
        entry.1 += 1;
    }

    /// The next job to hand out, now busy.
    fn pop(&mut self, key_of: impl Fn(usize) -> u32) -> Option<usize> {
        let (tag, _, job) = self.order.pop_first()?;
        *self.busy.entry(tag).or_default() += 1;
        let key = key_of(job);
        if let Some(entry) = self.keys.get_mut(&key) {
            entry.1 -= 1;
            if entry.1 == 0 {
                self.keys.remove(&key);
            }
        }
        Some(job)
    }

    fn finished(&mut self, job: usize) {
        if let Some(tag) = self.tags.remove(&job) {
            if let Some(count) = self.busy.get_mut(&tag) {
                *count -= 1;
                if *count == 0 {
                    self.busy.remove(&tag);
                }
            }
        }
    }
}

#[derive(Default)]
struct PoolState {
    fair: FairQueue,
    queued: VecDeque<QueuedJob>,
    runners: Runners,
    /// Idle runners by (idle since, id): the newest idle takes a job.
    idle: BTreeSet<(i64, u64)>,
    /// When the policy last reacted to an arrival, and whether a reaction
    /// is already scheduled.
    last_reaction_ms: Option<i64>,
    reaction_scheduled: bool,
}

struct World<'a> {
    /// Each job's fair-share key (an index into `Outcome::keys`).
    key_of: Vec<u32>,
    /// Whether the trace has more than one key: with one, fair share is
    /// arrival order, and the pools' queues are served front first
    /// without the tags' bookkeeping (a third of a month's run).
    fair_share: bool,
    setup: &'a Setup,
    jobs: &'a [TraceJob],
    pools: Vec<PoolState>,
    live: Vec<u32>,
    events: BinaryHeap<Reverse<(i64, u64, Event)>>,
    sequence: u64,
    next_runner: u64,
    rng: StdRng,
    started: Vec<bool>,
    runs: Runs,
    out: Outcome,
    remaining: u64,
    /// Timeline samples are thinned to about this many.
    sample_every: i64,
    last_sample: i64,
}

/// At most this many timeline samples.
const SAMPLES: i64 = 2_000;

impl World<'_> {
    fn push(&mut self, at: i64, event: Event) {
        self.sequence += 1;
        self.events.push(Reverse((at, self.sequence, event)));
    }

    fn view(&self, pool: usize) -> PoolView<'_> {
        PoolView {
            index: pool,
            model: &self.setup.pools[pool],
            setup: self.setup,
            queued: &self.pools[pool].queued,
            runners: &self.pools[pool].runners,
            live: &self.live,
        }
    }

    /// Runner-hours, idle hours and cost of a runner leaving at `now`.
    fn retire(&mut self, runner: &SimRunner, now: i64) {
        let model = &self.setup.providers[runner.provider];
        let stopped_now = if runner.phase == RunnerPhase::Stopped {
            (now - runner.idle_since_ms).max(0)
        } else {
            0
        };
        let stopped = (runner.stopped_ms + stopped_now) as f64 / 3_600_000.0;
        let hours = ((now - runner.created_ms).max(0) as f64 / 3_600_000.0 - stopped).max(0.0);
        self.out.runner_hours += hours;
        self.out.stopped_hours += stopped;
        self.out.stopped_cost += stopped * model.stopped_price_per_hour;
        self.out.cost += hours * model.price_per_hour + stopped * model.stopped_price_per_hour;
        if runner.phase == RunnerPhase::Idle {
            self.out.idle_runner_hours += (now - runner.idle_since_ms).max(0) as f64 / 3_600_000.0;
        }
        if runner.phase != RunnerPhase::Stopped {
            self.live[runner.provider] = self.live[runner.provider].saturating_sub(1);
        }
    }

    /// Starts a stopped runner: running (and against its provider's quota)
    /// again, ready in `resume_seconds`.
    fn start(&mut self, pool: usize, id: u64, now: i64) {
        let Some(runner) = self.pools[pool].runners.get(&id) else {
            return;
        };
        let model = &self.setup.providers[runner.provider];
        let (Some(resume), RunnerPhase::Stopped) = (model.resume_seconds, runner.phase) else {
            return;
        };
        if self.live[runner.provider] >= model.max_instances {
            self.out.failed_creates += 1;
            return;
        }
        self.live[runner.provider] += 1;
        self.out.starts += 1;
        let runner = self.pools[pool].runners.get_mut(&id).expect("present");
        runner.stopped_ms += (now - runner.idle_since_ms).max(0);
        runner.phase = RunnerPhase::Resuming;
        // Its boot timeout runs from the start, not from its creation.
        runner.idle_since_ms = now;
        let at = now + (resume.max(0.0) * 1000.0).round() as i64;
        self.push(at, Event::Ready { pool, runner: id });
    }

    fn apply(&mut self, pool: usize, decision: Decision, now: i64) {
        for id in decision.delete {
            let state = &mut self.pools[pool];
            let Some(runner) = state.runners.get(&id) else {
                continue;
            };
            self.out.delete_requests += 1;
            if runner.phase == RunnerPhase::Busy {
                self.out.refused_deletes += 1;
                continue;
            }
            let runner = state.runners.remove(&id).expect("present");
            state.idle.remove(&(runner.idle_since_ms, id));
            self.retire(&runner, now);
        }
        for id in decision.start {
            self.start(pool, id, now);
        }
        let creates = decision
            .create
            .into_iter()
            .map(|c| (c, RunnerPhase::Booting));
        let prepares = decision
            .prepare
            .into_iter()
            .filter(|(provider, _)| self.setup.providers[*provider].resume_seconds.is_some())
            .map(|c| (c, RunnerPhase::Preparing));
        for ((provider, count), phase) in creates.chain(prepares).collect::<Vec<_>>() {
            let model = &self.setup.providers[provider];
            for _ in 0..count {
                if self.live[provider] >= model.max_instances {
                    self.out.failed_creates += 1;
                    break;
                }
                if self.rng.gen_bool(model.fail_rate.clamp(0.0, 1.0)) {
                    self.out.failed_creates += 1;
                    continue;
                }
                let (low, high) = model.boot_seconds;
                let boot = if high > low {
                    self.rng.gen_range(low..=high)
                } else {
                    low
                };
                let id = self.next_runner;
                self.next_runner += 1;
                self.live[provider] += 1;
                self.out.runners_created += 1;
                if phase == RunnerPhase::Preparing {
                    self.out.runners_prepared += 1;
                }
                self.pools[pool].runners.push(SimRunner {
                    id,
                    provider,
                    created_ms: now,
                    phase,
                    idle_since_ms: now,
                    stopped_ms: 0,
                });
                self.push(
                    now + (boot * 1000.0).round() as i64,
                    Event::Ready { pool, runner: id },
                );
            }
        }
    }

    /// Gives queued jobs to idle runners, newest idle first.
    fn dispatch(&mut self, pool: usize, now: i64) {
        loop {
            let state = &mut self.pools[pool];
            if state.queued.is_empty() {
                return;
            }
            let Some(&(since, id)) = state.idle.iter().next_back() else {
                return;
            };
            state.idle.remove(&(since, id));
            // The fair-share order's next, taken out of the policy's view
            // of the queue (near its front: tags follow arrival but for
            // the keys that arrive behind a long queue).
            let queued = if self.fair_share {
                let key_of = &self.key_of;
                let next = state.fair.pop(|job| key_of[job]).expect("not empty");
                let at = state
                    .queued
                    .iter()
                    .position(|q| q.job == next)
                    .expect("queued");
                state.queued.remove(at).expect("queued")
            } else {
                state.queued.pop_front().expect("not empty")
            };
            let runner = state.runners.get_mut(&id).expect("idle runner exists");
            self.out.idle_runner_hours += (now - runner.idle_since_ms).max(0) as f64 / 3_600_000.0;
            runner.phase = RunnerPhase::Busy;
            self.started[queued.job] = true;
            self.out.queue_ms.push(now - queued.arrival_ms);
            self.out.waits_by_key[self.key_of[queued.job] as usize].push(now - queued.arrival_ms);
            let duration = self.jobs[queued.job].duration_ms;
            self.push(
                now + duration,
                Event::Finish {
                    pool,
                    runner: id,
                    job: queued.job,
                },
            );
        }
    }

    /// A prepared runner is ready: stopped, off its provider's quota.
    fn stop(&mut self, pool: usize, id: u64, now: i64) {
        if let Some(runner) = self.pools[pool].runners.get_mut(&id) {
            runner.phase = RunnerPhase::Stopped;
            runner.idle_since_ms = now;
            self.live[runner.provider] = self.live[runner.provider].saturating_sub(1);
        }
    }

    fn become_idle(&mut self, pool: usize, id: u64, now: i64) {
        if let Some(runner) = self.pools[pool].runners.get_mut(&id) {
            runner.phase = RunnerPhase::Idle;
            runner.idle_since_ms = now;
            self.pools[pool].idle.insert((now, id));
        }
    }

    fn react(&mut self, policy: &mut dyn Policy, pool: usize, now: i64) {
        self.pools[pool].last_reaction_ms = Some(now);
        let queued = !self.pools[pool].queued.is_empty();
        let decision = policy.on_arrival(&self.view(pool), queued, now);
        self.apply(pool, decision, now);
        self.dispatch(pool, now);
    }

    /// A job arrives at `now`: queued in its pool (or, unroutable, over at
    /// once), offered to an idle runner, and shown to the policy.
    fn arrive(
        &mut self,
        policy: &mut dyn Policy,
        routes: &[Option<usize>],
        index: usize,
        now: i64,
    ) {
        let Some(pool) = routes[index] else {
            self.release(index, now);
            return;
        };
        self.pools[pool].queued.push_back(QueuedJob {
            job: index,
            arrival_ms: now,
        });
        if self.fair_share {
            self.pools[pool].fair.push(index, self.key_of[index]);
        }
        self.dispatch(pool, now);
        policy.observe_arrival(pool, &self.jobs[index], now);
        let state = &self.pools[pool];
        match state.last_reaction_ms {
            Some(last) if now - last < REACTION_GAP_MS => {
                if !state.reaction_scheduled {
                    self.pools[pool].reaction_scheduled = true;
                    self.push(last + REACTION_GAP_MS, Event::React { pool });
                }
            }
            _ => self.react(policy, pool, now),
        }
        if let Some(delay) = policy.arrival_delay_ms() {
            self.push(now + delay, Event::Delayed { pool, job: index });
        }
    }

    /// `job` is over: the later jobs of its run it was the last to hold
    /// back arrive `started_after` from now.
    fn release(&mut self, job: usize, now: i64) {
        for following in self.runs.finished(job) {
            let after = self.jobs[following].started_after_ms.unwrap_or(0).max(0);
            self.push(now + after, Event::Arrive { job: following });
        }
    }

    fn sample(&mut self, now: i64) {
        if now - self.last_sample < self.sample_every {
            return;
        }
        self.last_sample = now;
        let runners = self.live.iter().sum();
        let queued = self.pools.iter().map(|p| p.queued.len() as u32).sum();
        self.out.timeline.push((now, runners, queued));
    }
}

/// Runs `jobs` (sorted by arrival) through `policy` on `setup`.
pub fn run(setup: &Setup, jobs: &[TraceJob], policy: &mut dyn Policy) -> Outcome {
    run_counting(setup, jobs, policy, &AtomicU64::new(0))
}

/// [`run`], adding one to `arrived` per job that has arrived (for a
/// progress bar on another thread).
pub fn run_counting(
    setup: &Setup,
    jobs: &[TraceJob],
    policy: &mut dyn Policy,
    arrived: &AtomicU64,
) -> Outcome {
    let pool_labels: Vec<PoolLabels> = setup
        .pools
        .iter()
        .map(|p| PoolLabels {
            name: p.policy.name.clone(),
            labels: p.labels.clone(),
        })
        .collect();
    let routing = RoutingPolicy {
        default_pool: setup.default_pool.clone(),
        required_labels: setup.required_labels.clone(),
    };
    // Route once: the same for every policy.
    let routes: Vec<Option<usize>> = jobs
        .iter()
        .map(|job| match route(&job.labels, &pool_labels, &routing) {
            RouteDecision::Pool(name) => setup.pools.iter().position(|p| p.policy.name == name),
            _ => None,
        })
        .collect();
    let mut arrivals: Vec<Vec<i64>> = vec![Vec::new(); setup.pools.len()];
    for (job, pool) in jobs.iter().zip(&routes) {
        if let Some(pool) = pool {
            arrivals[*pool].push(job.arrival_ms);
        }
    }
    policy.foresee(&arrivals);
    drop(arrivals);
    let span = jobs.last().map_or(0, |j| j.arrival_ms).max(1);
    let mut keys: Vec<String> = Vec::new();
    let mut key_index: HashMap<&str, u32> = HashMap::new();
    let key_of: Vec<u32> = jobs
        .iter()
        .map(|job| {
            let key = job.repo.as_deref().unwrap_or_default();
            *key_index.entry(key).or_insert_with(|| {
                keys.push(key.to_owned());
                (keys.len() - 1) as u32
            })
        })
        .collect();
    let key_count = keys.len();
    let mut world = World {
        key_of,
        fair_share: key_count > 1,
        setup,
        jobs,
        pools: (0..setup.pools.len())
            .map(|_| PoolState::default())
            .collect(),
        live: vec![0; setup.providers.len()],
        events: BinaryHeap::new(),
        sequence: 0,
        next_runner: 1,
        rng: StdRng::seed_from_u64(setup.seed),
        started: vec![false; jobs.len()],
        runs: Runs::of(jobs),
        out: Outcome {
            policy: policy.name(),
            jobs: 0,
            unroutable: routes.iter().filter(|r| r.is_none()).count() as u64,
            queue_ms: Vec::with_capacity(jobs.len()),
            runner_hours: 0.0,
            idle_runner_hours: 0.0,
            cost: 0.0,
            delete_requests: 0,
            refused_deletes: 0,
            failed_creates: 0,
            runners_created: 0,
            stopped_hours: 0.0,
            stopped_cost: 0.0,
            runners_prepared: 0,
            starts: 0,
            unfinished: 0,
            end_ms: 0,
            timeline: Vec::new(),
            keys,
            waits_by_key: vec![Vec::new(); key_count],
        },
        remaining: routes.iter().filter(|r| r.is_some()).count() as u64,
        sample_every: (span / SAMPLES).max(1),
        last_sample: i64::MIN / 2,
    };
    let interval = i64::try_from(setup.interval.as_millis())
        .unwrap_or(10_000)
        .max(1);
    let mut next_tick = 0i64;
    let mut next_job = 0usize;
    while next_job < jobs.len() && world.runs.follows[next_job] {
        next_job += 1;
    }
    let mut now = 0i64;
    // A policy that never serves a pool must not run forever: a week after
    // the last arrival, what has not started is given up.
    let give_up = span + 7 * 86_400_000;
    // Ticks go on until every routed job is done (and at least once).
    while world.remaining > 0 || now == 0 {
        if now > give_up {
            break;
        }
        let next_event = world.events.peek().map(|Reverse((at, _, _))| *at);
        let next_arrival = jobs.get(next_job).map(|j| j.arrival_ms);
        let soonest = [Some(next_tick), next_event, next_arrival]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(next_tick);
        now = soonest;
        if next_event == Some(now) {
            let Some(Reverse((_, _, event))) = world.events.pop() else {
                continue;
            };
            match event {
                Event::Ready { pool, runner } => {
                    let phase = world.pools[pool].runners.get(&runner).map(|r| r.phase);
                    match phase {
                        Some(RunnerPhase::Booting | RunnerPhase::Resuming) => {
                            world.become_idle(pool, runner, now);
                            world.dispatch(pool, now);
                        }
                        Some(RunnerPhase::Preparing) => world.stop(pool, runner, now),
                        _ => {}
                    }
                }
                Event::Finish { pool, runner, job } => {
                    if world.fair_share {
                        world.pools[pool].fair.finished(job);
                    }
                    world.release(job, now);
                    world.remaining -= 1;
                    world.out.jobs += 1;
                    world.out.end_ms = now;
                    if world.setup.pools[pool].ephemeral {
                        if let Some(done) = world.pools[pool].runners.remove(&runner) {
                            world.out.delete_requests += 1;
                            world.retire(&done, now);
                        }
                    } else {
                        world.become_idle(pool, runner, now);
                        world.dispatch(pool, now);
                    }
                }
                Event::Arrive { job } => {
                    world.arrive(policy, &routes, job, now);
                    arrived.fetch_add(1, Ordering::Relaxed);
                }
                Event::React { pool } => {
                    world.pools[pool].reaction_scheduled = false;
                    world.react(policy, pool, now);
                }
                Event::Delayed { pool, job } => {
                    let still_queued = !world.started[job];
                    let decision = policy.on_delayed(&world.view(pool), still_queued, now);
                    if let Some(after) = decision.retry_after_ms {
                        world.push(now + after.max(1), Event::Delayed { pool, job });
                    }
                    world.apply(pool, decision, now);
                    world.dispatch(pool, now);
                }
            }
            continue;
        }
        if next_arrival == Some(now) {
            let index = next_job;
            next_job += 1;
            while next_job < jobs.len() && world.runs.follows[next_job] {
                next_job += 1;
            }
            world.arrive(policy, &routes, index, now);
            arrived.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        // A reconcile tick.
        for pool in 0..setup.pools.len() {
            let decision = policy.decide(&world.view(pool), now);
            world.apply(pool, decision, now);
            world.dispatch(pool, now);
        }
        world.sample(now);
        next_tick = now + interval;
    }
    if world.remaining > 0 {
        world.out.end_ms = now;
        world.out.unfinished = world.remaining;
        for pool in &world.pools {
            for queued in &pool.queued {
                world.out.queue_ms.push(now - queued.arrival_ms);
                world.out.waits_by_key[world.key_of[queued.job] as usize]
                    .push(now - queued.arrival_ms);
            }
        }
    }
    // Whatever still exists is paid for until the end.
    let end = world.out.end_ms;
    for pool in 0..world.pools.len() {
        let runners: Vec<SimRunner> = std::mem::take(&mut world.pools[pool].runners).0;
        for runner in runners {
            world.retire(&runner, end.max(runner.created_ms));
        }
    }
    world.out.queue_ms.sort_unstable();
    for waits in &mut world.out.waits_by_key {
        waits.sort_unstable();
    }
    world.out
}
