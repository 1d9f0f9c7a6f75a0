//! The reconciler: level-triggered. Each round it observes what the
//! providers report, snapshots the store, asks the pure planner what to do,
//! applies the actions through the providers and records every outcome. It
//! assumes nothing about why it runs; running it twice in a row is harmless.

pub mod heal;
pub mod scale_set;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use runway_core::forecast::ArrivalForecast;
use runway_core::observe::{observe, wants_start, Observed, Readiness};
use runway_core::planner::{
    backoff_delay, learn_reliability, plan, recovered_reliability, Action, Backoff, Plan, Snapshot,
};
use runway_core::runner::NewRunner;
use runway_core::{JobId, RunnerEvent, RunnerId, RunnerState, Timestamp};
use runway_providers::{CreateRequest, InstanceId, InstanceState, Provider, ProviderError};
use runway_store::StoreError;

use crate::app::lease::Deposed;
use crate::app::Service;
use crate::config::{PoolConfig, PoolGithub};
use crate::github::api::GithubError;
use crate::telemetry::metrics::DeleteResult;

#[derive(Default)]
struct Health {
    consecutive_failures: u32,
    backoff: Option<Backoff>,
}

/// Why a create batch stopped before its last runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stopped {
    /// The provider (or GitHub) refused for good, or GitHub said no.
    Refused,
    /// The provider has no quota left.
    Quota,
    /// This replica can no longer show it leads: nothing more is done,
    /// records included (they are the next leader's).
    Deposed,
}

/// What one round did, for logs and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub created: u32,
    pub create_failures: u32,
    pub deleted: u32,
    pub delete_refused_busy: u32,
    pub marked_ready: u32,
    pub marked_lost: u32,
    pub orphans_deleted: u32,
    /// Runners found crashed this round, by pool.
    pub crashed: BTreeMap<String, u32>,
}

/// How many calls one provider serves at once: its creates, deletes, lists
/// and starts queue for these, and never for another provider's.
pub const CALLS_PER_PROVIDER: usize = 4;

/// How long a round waits for the provider calls it started before it goes
/// on; a call still running then finishes in the background, records its
/// own outcome and wakes the reconciler. One slow or hanging provider so
/// delays the others by this at most, not by its own timeout.
pub const CALL_WAIT: Duration = Duration::from_secs(1);

pub struct Reconciler {
    inner: Arc<Inner>,
}

/// A provider's latest list, taken by the next round that observes.
struct Listed {
    /// The round that started it: runners requested since are not judged
    /// by it (their instances may have been created after it ran).
    started_at: Timestamp,
    outcome: Result<Vec<runway_providers::Instance>, String>,
}

#[derive(Default)]
struct Listing {
    in_flight: bool,
    latest: Option<Listed>,
}

/// A provider call running for a round; `abandoned` once the round stopped
/// waiting for it (it then wakes the reconciler when done).
struct Task {
    handle: tokio::task::JoinHandle<Result<Report, StoreError>>,
    abandoned: Arc<std::sync::atomic::AtomicBool>,
}

/// The providers a round works with; a config reload replaces them whole.
struct Providers {
    by_name: BTreeMap<String, Arc<dyn Provider>>,
    /// Each provider's own bound on concurrent calls.
    lanes: BTreeMap<String, Arc<tokio::sync::Semaphore>>,
}

impl Providers {
    fn new(by_name: BTreeMap<String, Arc<dyn Provider>>, kept: Option<&Providers>) -> Providers {
        // A provider that stays keeps its lane: calls in flight still count.
        let lanes = by_name
            .keys()
            .map(|name| {
                let lane = kept
                    .and_then(|kept| kept.lanes.get(name).cloned())
                    .unwrap_or_else(|| Arc::new(tokio::sync::Semaphore::new(CALLS_PER_PROVIDER)));
                (name.clone(), lane)
            })
            .collect();
        Providers { by_name, lanes }
    }
}

struct Inner {
    service: Arc<Service>,
    providers: std::sync::RwLock<Arc<Providers>>,
    listing: Mutex<BTreeMap<String, Listing>>,
    /// Runners a task is working on: no other task touches them meanwhile.
    in_flight: Mutex<std::collections::BTreeSet<RunnerId>>,
    health: Mutex<BTreeMap<(String, String), Health>>,
    /// Reliability learnt from each offer's create outcomes, by (provider,
    /// offer key); an offer counts with the lower of this and what the
    /// provider declares.
    /// Per (provider, offer): the reliability learnt and when.
    reliability: Mutex<BTreeMap<(String, String), (f64, Timestamp)>>,
    /// The predictive pools' arrival forecasts, each with the newest job
    /// it has been fed: the store's last four weeks at its first round (a
    /// start, a new leader, a pool made predictive by a reload), then each
    /// round the jobs new since.
    forecasts: Mutex<BTreeMap<String, Learning>>,
    /// GitHub pools whose JIT requests failed: (consecutive failures, no
    /// new runner before). A refusing GitHub is asked again after a backoff,
    /// not every round.
    jit_backoff: Mutex<BTreeMap<String, (u32, Timestamp)>>,
    /// Busy runners of GitHub pools whose machine was found gone, and
    /// since when: judged only after [`COMPLETION_GRACE`].
    vanished_busy: Mutex<BTreeMap<RunnerId, Timestamp>>,
}

/// How long a busy GitHub runner whose machine is gone waits for its
/// job's completion (`JobCompleted`, the `completed` webhook) before it is
/// judged crashed: a JIT runner exits as soon as its job is done, often
/// before runway has taken the completion in, and such a runner finished,
/// it did not crash.
pub const COMPLETION_GRACE: Duration = Duration::from_secs(90);

/// A predictive pool's forecast, the settings it was made with, and the
/// newest job it has been fed (`None`: not seeded yet).
struct Learning {
    forecast: ArrivalForecast,
    horizon: Duration,
    quantile: f64,
    /// `Some` while the store's history is still being read: the forecast
    /// is not used until it is complete.
    seed: Option<Seed>,
    /// The newest job fed (once seeded).
    newest: JobId,
}

/// A forecast's first read of the store's history, newest first, a
/// bounded number of pages a round, kept compact (a few words a job)
/// until it reaches the history's start and is fed in time order.
#[derive(Default)]
struct Seed {
    /// The next page ends below this id (`None`: the newest).
    before: Option<JobId>,
    /// The newest id when the read began: later jobs are read after it.
    newest: Option<JobId>,
    done: bool,
    /// (created at, (run id, workflow index)) of the pool's jobs.
    jobs: Vec<(Timestamp, Option<(u64, u32)>)>,
    workflows: Vec<String>,
    /// Index of each name in `workflows`.
    workflow_index: std::collections::HashMap<String, u32>,
}

impl Seed {
    fn workflow(&mut self, name: String) -> u32 {
        let next = self.workflows.len() as u32;
        *self.workflow_index.entry(name).or_insert_with_key(|name| {
            self.workflows.push(name.clone());
            next
        })
    }
}

/// Jobs read a page at a time.
const JOB_PAGE: u32 = 1_000;

/// A GitHub job's workflow run (id and workflow name), from the facts
/// intake stored with it.
fn run_of(job: &runway_core::Job) -> Option<(u64, String)> {
    if job.source != runway_core::JobSource::Github {
        return None;
    }
    crate::app::intake::GithubFacts::parse(&job.payload).run()
}

/// A seed reads at most this many pages of 1,000 jobs a round, so a long
/// history spreads over rounds instead of holding one up.
const SEED_PAGES: usize = 20;

/// A runner a task works on, until dropped.
struct WorkingOn {
    inner: Arc<Inner>,
    runner: RunnerId,
}

impl Drop for WorkingOn {
    fn drop(&mut self) {
        if let Ok(mut in_flight) = self.inner.in_flight.lock() {
            in_flight.remove(&self.runner);
        }
    }
}

impl Report {
    fn merge(&mut self, other: Report) {
        self.created += other.created;
        self.create_failures += other.create_failures;
        self.deleted += other.deleted;
        self.delete_refused_busy += other.delete_refused_busy;
        self.marked_ready += other.marked_ready;
        self.marked_lost += other.marked_lost;
        self.orphans_deleted += other.orphans_deleted;
        for (pool, crashed) in other.crashed {
            *self.crashed.entry(pool).or_default() += crashed;
        }
    }
}

impl Reconciler {
    pub fn new(
        service: Arc<Service>,
        providers: BTreeMap<String, Arc<dyn Provider>>,
    ) -> Reconciler {
        Reconciler {
            inner: Arc::new(Inner {
                service,
                providers: std::sync::RwLock::new(Arc::new(Providers::new(providers, None))),
                listing: Mutex::new(BTreeMap::new()),
                in_flight: Mutex::new(std::collections::BTreeSet::new()),
                health: Mutex::new(BTreeMap::new()),
                reliability: Mutex::new(BTreeMap::new()),
                forecasts: Mutex::new(BTreeMap::new()),
                jit_backoff: Mutex::new(BTreeMap::new()),
                vanished_busy: Mutex::new(BTreeMap::new()),
            }),
        }
    }

    pub fn has_providers(&self) -> bool {
        !self.inner.providers().by_name.is_empty()
    }

    /// One round at `now`.
    pub async fn reconcile_once(&self, now: Timestamp) -> Result<(Report, Plan), StoreError> {
        self.inner.round(now).await
    }
}

impl crate::app::reload::ProviderSet for Reconciler {
    /// Works with `providers` from the next round on (a config reload).
    /// Runners of a provider that is gone are left as they are: their
    /// records stay, and nothing deletes their machines.
    fn replace_providers(&self, providers: BTreeMap<String, Arc<dyn Provider>>) {
        let next = Arc::new(Providers::new(providers, Some(&self.inner.providers())));
        match self.inner.providers.write() {
            Ok(mut current) => *current = next,
            Err(poisoned) => *poisoned.into_inner() = next,
        }
    }
}

impl Inner {
    /// The store as this leader's term sees it (`Service::leader_store`).
    fn store(&self) -> Arc<dyn runway_store::Store> {
        self.service.leader_store()
    }

    /// Where the runners runway starts reach it.
    fn runner_url(&self) -> String {
        let server = &self.service.config().server;
        server.runner_url(server.listen)
    }

    async fn round(self: &Arc<Self>, now: Timestamp) -> Result<(Report, Plan), StoreError> {
        let started = Instant::now();
        let mut report = Report::default();
        self.observe(now, &mut report).await?;
        self.learn_arrivals(now).await?;
        let snapshot = self.snapshot(now).await?;
        let plan = plan(&snapshot, now);
        let tasks = plan
            .actions
            .iter()
            .filter_map(|action| self.dispatch(action.clone(), now))
            .collect();
        report.merge(self.collect(tasks).await?);
        self.update_gauges(&snapshot, &plan).await?;
        if let Ok(mut last) = self.service.last_plan.lock() {
            *last = Some(plan.clone());
        }
        if let Ok(mut backoffs) = self.service.provider_backoffs.lock() {
            backoffs.clone_from(&snapshot.backoffs);
        }
        let duration = started.elapsed().as_secs_f64();
        self.service.metrics.reconcile_duration.observe(duration);
        for pool in &plan.pools {
            self.service.events.emit(
                "reconciliation",
                serde_json::json!({
                    "flavor": pool.pool,
                    "crashed_runners": report.crashed.get(&pool.pool).copied().unwrap_or(0),
                    "idle_runners": pool.idle,
                    "active_runners": pool.busy,
                    "duration": duration,
                }),
                now,
            );
        }
        if report != Report::default() {
            tracing::info!(target: "runway::events", event = "reconciliation", ?report);
        }
        Ok((report, plan))
    }

    /// Runs `work` as a task of its own (for `runner`, if given: skipped
    /// when a task is working on that runner already).
    fn spawn<F>(self: &Arc<Self>, runner: Option<RunnerId>, work: F) -> Option<Task>
    where
        F: std::future::Future<Output = Result<Report, StoreError>> + Send + 'static,
    {
        if let Some(id) = runner {
            let mut in_flight = self.in_flight.lock().ok()?;
            if !in_flight.insert(id) {
                return None;
            }
        }
        let abandoned = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let this = self.clone();
        let flag = abandoned.clone();
        let handle = tokio::spawn(async move {
            let outcome = work.await;
            if let Some(id) = runner {
                if let Ok(mut in_flight) = this.in_flight.lock() {
                    in_flight.remove(&id);
                }
            }
            if flag.load(std::sync::atomic::Ordering::SeqCst) {
                // Its round went on without it: what it changed wants a round.
                this.service.reconcile_wanted.notify_one();
            }
            outcome
        });
        Some(Task { handle, abandoned })
    }

    /// Waits for `tasks` up to [`CALL_WAIT`] and sums what they did; the
    /// ones still running go on in the background.
    async fn collect(&self, tasks: Vec<Task>) -> Result<Report, StoreError> {
        let deadline = tokio::time::Instant::now() + CALL_WAIT;
        let mut report = Report::default();
        let mut failure = None;
        for mut task in tasks {
            match tokio::time::timeout_at(deadline, &mut task.handle).await {
                Ok(Ok(Ok(done))) => report.merge(done),
                Ok(Ok(Err(error))) => failure = failure.or(Some(error)),
                Ok(Err(error)) => tracing::error!(%error, "a provider task panicked"),
                Err(_) => task
                    .abandoned
                    .store(true, std::sync::atomic::Ordering::SeqCst),
            }
        }
        match failure {
            Some(error) => Err(error),
            None => Ok(report),
        }
    }

    /// Marks `runner` as worked on until the guard is dropped.
    fn working_on(self: &Arc<Self>, runner: RunnerId) -> WorkingOn {
        if let Ok(mut in_flight) = self.in_flight.lock() {
            in_flight.insert(runner);
        }
        WorkingOn {
            inner: self.clone(),
            runner,
        }
    }

    /// The providers as they are now.
    fn providers(&self) -> Arc<Providers> {
        match self.providers.read() {
            Ok(providers) => providers.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// A permit of `provider`'s lane: held for the length of one call.
    async fn permit(&self, provider: &str) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let lane = self.providers().lanes.get(provider)?.clone();
        lane.acquire_owned().await.ok()
    }

    /// A permit of `provider`'s lane for a call that changes something
    /// (`operation`), once this replica has shown it still leads
    /// (`Service::may_act`), checked after the wait for the lane: a call
    /// that queued behind a hung one is dropped if the term ended meanwhile.
    async fn permit_to_act(
        &self,
        provider: &str,
        operation: &'static str,
    ) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, Deposed> {
        let permit = self.permit(provider).await;
        self.service.may_act(operation).await?;
        Ok(permit)
    }

    /// Starts a list of every provider that has none running, and waits
    /// for them as for any call.
    async fn refresh_lists(self: &Arc<Self>, now: Timestamp) -> Result<(), StoreError> {
        let mut tasks = Vec::new();
        let providers = self.providers();
        for (name, provider) in &providers.by_name {
            let Ok(mut listing) = self.listing.lock() else {
                continue;
            };
            let entry = listing.entry(name.clone()).or_default();
            if entry.in_flight {
                continue; // Still running since an earlier round.
            }
            entry.in_flight = true;
            drop(listing);
            let (this, name, provider) = (self.clone(), name.clone(), provider.clone());
            tasks.extend(self.spawn(None, async move {
                let outcome = {
                    let _permit = this.permit(&name).await;
                    provider.list().await.map_err(|e| e.to_string())
                };
                if let Ok(mut listing) = this.listing.lock() {
                    let entry = listing.entry(name).or_default();
                    entry.in_flight = false;
                    entry.latest = Some(Listed {
                        started_at: now,
                        outcome,
                    });
                }
                Ok(Report::default())
            }));
        }
        self.collect(tasks).await.map(drop)
    }

    /// Brings runner records in line with what providers report: booted
    /// instances make their runners idle, vanished ones fail (or crash, if
    /// busy). Each provider's latest list is used once; a provider whose
    /// list is still running is observed in a later round.
    async fn observe(
        self: &Arc<Self>,
        now: Timestamp,
        report: &mut Report,
    ) -> Result<(), StoreError> {
        self.refresh_lists(now).await?;
        let mut lists: BTreeMap<String, Listed> = self
            .listing
            .lock()
            .map(|mut listing| {
                listing
                    .iter_mut()
                    .filter_map(|(name, entry)| Some((name.clone(), entry.latest.take()?)))
                    .collect()
            })
            .unwrap_or_default();
        // One read of the live runners per round, after the lists were
        // taken: a record is written before its instance is created, so
        // every listed instance's record is in it. Each provider's part
        // below touches only its own runners, so the snapshot stays true.
        let runners = self.store().list_live_runners(None).await?;
        let mut tasks = Vec::new();
        let providers = self.providers();
        for (name, provider) in &providers.by_name {
            let Some(listed) = lists.remove(name) else {
                continue;
            };
            let instances = match listed.outcome {
                Ok(instances) => instances,
                Err(error) => {
                    self.provider_error(name, "list", &error);
                    continue;
                }
            };
            let judged: Vec<runway_core::Runner> = {
                let in_flight = self.in_flight.lock().map(|f| f.clone()).unwrap_or_default();
                runners
                    .iter()
                    .filter(|r| &r.provider == name && !r.state.is_terminal())
                    // Nothing is concluded about a runner a task is working
                    // on, or one requested after the list began.
                    .filter(|r| !in_flight.contains(&r.id) && r.requested_at < listed.started_at)
                    .cloned()
                    .collect()
            };
            tasks.extend(self.orphans(name, provider, &instances, &runners));
            let listing = runway_core::observe::Listing {
                started_at: listed.started_at,
                lag: self.list_lag(name),
            };
            self.observe_provider(
                name, provider, &instances, &judged, listing, now, report, &mut tasks,
            )
            .await?;
        }
        report.merge(self.collect(tasks).await?);
        Ok(())
    }

    /// Observes `runners` of provider `name` against its `instances`;
    /// provider calls it needs go to `tasks`.
    #[allow(clippy::too_many_arguments)]
    async fn observe_provider(
        self: &Arc<Self>,
        name: &str,
        provider: &Arc<dyn Provider>,
        instances: &[runway_providers::Instance],
        runners: &[runway_core::Runner],
        listing: runway_core::observe::Listing,
        now: Timestamp,
        report: &mut Report,
        tasks: &mut Vec<Task>,
    ) -> Result<(), StoreError> {
        let store = &self.store();
        let by_id: BTreeMap<&InstanceId, InstanceState> =
            instances.iter().map(|i| (&i.id, i.state)).collect();
        let registers = provider.runners_register();
        for runner in runners {
            let instance_id = match &runner.instance_id {
                Some(id) => InstanceId(id.clone()),
                None => {
                    // Its create never returned (runway stopped in
                    // between): the instance, if any, carries its name.
                    let Some(found) = instances.iter().find(|i| i.name == runner.name) else {
                        continue; // boot_timeout covers a create that never happened.
                    };
                    let started = RunnerEvent::ProvisioningStarted {
                        instance_id: found.id.0.clone(),
                    };
                    if store
                        .apply_runner_event(runner.id, &started, now)
                        .await
                        .is_err()
                    {
                        continue;
                    }
                    found.id.clone()
                }
            };
            let github = self.github_pool(&runner.pool);
            if let (Some(github), RunnerState::Busy, None) =
                (github.as_ref(), runner.state, runner.job)
            {
                self.settle_unknown_job(github, runner, now).await?;
                continue;
            }
            if runner.state == RunnerState::Terminating && by_id.contains_key(&instance_id) {
                // Terminated outside a scale-down (an ephemeral runner
                // after its job): deregister, then delete its instance.
                let (this, runner, provider, name) = (
                    self.clone(),
                    runner.clone(),
                    provider.clone(),
                    name.to_owned(),
                );
                tasks.extend(self.spawn(Some(runner.id), async move {
                    let mut report = Report::default();
                    if let Some(github) = this.github_pool(&runner.pool) {
                        if runner.busy_at.is_some() {
                            // A just-in-time runner runs one job, and GitHub
                            // removes it when that job is over: asking again
                            // would only wait on the request budget while the
                            // finished runner holds the pool's capacity.
                            this.store().set_runner_external_id(runner.id, "").await?;
                        } else if !this.release(&github, &runner, now, &mut report).await? {
                            return Ok(report);
                        }
                    }
                    let deleted = {
                        let Ok(_permit) = this.permit_to_act(&name, "delete").await else {
                            return Ok(report);
                        };
                        provider.delete(&instance_id).await
                    };
                    match deleted {
                        Ok(()) => {
                            if this
                                .store()
                                .apply_runner_event(runner.id, &RunnerEvent::Terminated, now)
                                .await
                                .is_ok()
                            {
                                report.deleted += 1;
                            }
                        }
                        Err(error) => this.provider_error(&name, "delete", &error.to_string()),
                    }
                    Ok(report)
                }));
                continue;
            }
            let observed = match by_id.get(&instance_id) {
                // Listed as ended: gone for sure, no lag to wait out.
                None if provider.seen_gone(&instance_id) => Observed::Failed,
                None => Observed::Absent,
                Some(InstanceState::Pending) => Observed::Pending,
                Some(InstanceState::Running) => Observed::Running,
                Some(InstanceState::Stopped) => Observed::Stopped,
                Some(InstanceState::Failed) => Observed::Failed,
                Some(InstanceState::Unknown) => Observed::Unknown,
            };
            if wants_start(runner, observed) {
                // Stopped, not gone (GARM's `stopped`): started again.
                let (this, provider, name, runner_name) = (
                    self.clone(),
                    provider.clone(),
                    name.to_owned(),
                    runner.name.clone(),
                );
                tasks.extend(self.spawn(Some(runner.id), async move {
                    let started = {
                        let Ok(_permit) = this.permit_to_act(&name, "start").await else {
                            return Ok(Report::default());
                        };
                        provider.start(&instance_id).await
                    };
                    match started {
                        Ok(()) => tracing::info!(runner = %runner_name, instance = %instance_id, "started a stopped instance again"),
                        Err(error) => this.provider_error(&name, "start", &error.to_string()),
                    }
                    Ok(Report::default())
                }));
                continue;
            }
            // A runner that registers itself is ready when it says so,
            // not when its machine is up. A GitHub pool's runners
            // register with GitHub, not with runway.
            let readiness = if registers && github.is_none() {
                Readiness::RunnerRegisters
            } else {
                Readiness::MachineRunning
            };
            let Some(event) = observe(runner, &instance_id.0, observed, readiness, listing) else {
                continue; // Nothing changes (or its instance is not visible yet).
            };
            if matches!(event, RunnerEvent::Crashed { .. })
                && github.is_some()
                && !self.completion_grace_over(runner.id, now)
            {
                continue; // Its completion may still be on its way.
            }
            let ready = event == RunnerEvent::Ready;
            // A runway-API job whose runner's machine is gone goes back to
            // the queue now, with the runner's crash, not at its lease's end.
            let moved = match (&event, runner.job, &github) {
                (RunnerEvent::Crashed { .. }, Some(job), None) => {
                    crate::app::jobs::holder_lost(&self.service, job, runner.id, &event, now)
                        .await?
                        .is_some()
                }
                _ => false,
            };
            if !moved
                && store
                    .apply_runner_event(runner.id, &event, now)
                    .await
                    .is_err()
            {
                continue;
            }
            if matches!(event, RunnerEvent::Crashed { .. }) {
                *report.crashed.entry(runner.pool.clone()).or_default() += 1;
            }
            if let (Some(github), false) = (github, ready) {
                // Its machine is gone: so must its registration be.
                if let Err(error) = self.deregister(&github, runner).await? {
                    tracing::debug!(runner = %runner.name, %error, "registration of a vanished runner left to GitHub");
                }
            }
            if ready {
                let installed = now.since(runner.requested_at);
                self.service
                    .metrics
                    .runner_installed(&runner.pool, installed);
                self.service.events.emit(
                    "runner_installed",
                    serde_json::json!({
                        "flavor": runner.pool,
                        "duration": installed.as_secs_f64().round() as u64,
                    }),
                    now,
                );
                report.marked_ready += 1;
            } else {
                report.marked_lost += 1;
            }
        }
        Ok(())
    }

    /// Whether busy runner `runner`, whose machine is gone, has waited
    /// [`COMPLETION_GRACE`] for its job's completion since this replica
    /// first saw it gone. Runners no longer waiting are forgotten here
    /// once their grace would be long over.
    fn completion_grace_over(&self, runner: RunnerId, now: Timestamp) -> bool {
        let Ok(mut vanished) = self.vanished_busy.lock() else {
            return true;
        };
        vanished.retain(|_, since| now.since(*since) < COMPLETION_GRACE * 4);
        let since = *vanished.entry(runner).or_insert(now);
        let over = now.since(since) >= COMPLETION_GRACE;
        if over {
            vanished.remove(&runner);
        }
        over
    }

    /// How long provider `name`'s list may lag behind its creates
    /// (`[providers.NAME] list_lag`).
    fn list_lag(&self, name: &str) -> Duration {
        self.service
            .config()
            .providers
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.list_lag)
            .unwrap_or_default()
    }

    /// The GitHub side of `pool`, if it is a GitHub pool.
    fn github_pool(&self, pool: &str) -> Option<PoolGithub> {
        self.service
            .config()
            .pool(pool)
            .and_then(|p| p.github.clone())
    }

    /// Registers `runner` with GitHub as a just-in-time runner and returns
    /// its encoded configuration; `None` (the runner recorded as failed)
    /// when GitHub or the request budget said no.
    async fn jit_config(
        &self,
        github: &PoolGithub,
        runner: &runway_core::Runner,
        labels: &[String],
        now: Timestamp,
    ) -> Result<Option<String>, StoreError> {
        let store = &self.store();
        let result = match (&github.scale_set, &self.service.github) {
            // A scale-set pool's runners register in its scale set.
            (Some(scale_set), _) => match self
                .service
                .scale_sets
                .get(&runner.pool)
                .and_then(|handle| Some((handle.id()?, handle)))
            {
                Some((id, handle)) => handle
                    .client
                    .generate_jit_config(&self.service.metrics, id, &runner.name)
                    .await
                    .map_err(|e| e.to_string()),
                None => Err(format!(
                    "scale set {scale_set:?} not found or created yet (its listener keeps trying)"
                )),
            },
            (None, Some(client)) => client
                .generate_jitconfig(
                    &self.service.metrics,
                    &github.target,
                    &runner.name,
                    labels,
                    github.runner_group_id,
                )
                .await
                .map_err(|e| e.to_string()),
            (None, None) => Err("no GitHub credentials ([github] token or App)".to_owned()),
        };
        let result = result.inspect_err(|_| self.jit_failed(&runner.pool, now));
        match result {
            Ok(jit) => {
                if let Ok(mut backoff) = self.jit_backoff.lock() {
                    backoff.remove(&runner.pool);
                }
                store
                    .set_runner_external_id(runner.id, &jit.runner_id.to_string())
                    .await?;
                Ok(Some(jit.encoded))
            }
            Err(error) => {
                tracing::warn!(pool = %runner.pool, runner = %runner.name, %error, "no JIT runner configuration; runner not started");
                let failed = RunnerEvent::Failed {
                    reason: format!("no JIT configuration: {error}"),
                };
                store.apply_runner_event(runner.id, &failed, now).await?;
                Ok(None)
            }
        }
    }

    fn jit_backing_off(&self, pool: &str, now: Timestamp) -> bool {
        self.jit_backoff
            .lock()
            .map(|backoff| backoff.get(pool).is_some_and(|(_, until)| now < *until))
            .unwrap_or(false)
    }

    fn jit_failed(&self, pool: &str, now: Timestamp) {
        if let Ok(mut backoff) = self.jit_backoff.lock() {
            let entry = backoff.entry(pool.to_owned()).or_insert((0, now));
            entry.0 += 1;
            let delay = backoff_delay(entry.0, rand::thread_rng().gen_range(0.5..=1.0));
            entry.1 = now.plus(delay);
        }
    }

    /// Removes `runner`'s GitHub registration. `Ok(true)`: gone (or never
    /// registered); `Ok(false)`: GitHub refused or could not be asked.
    async fn deregister(
        &self,
        github: &PoolGithub,
        runner: &runway_core::Runner,
    ) -> Result<Result<bool, GithubError>, StoreError> {
        let Some(github_id) = self
            .store()
            .runner_external_id(runner.id)
            .await?
            .and_then(|id| id.parse::<u64>().ok())
        else {
            return Ok(Ok(true)); // It never got a JIT configuration.
        };
        if let Err(deposed) = self.service.may_act("github_deregister").await {
            return Ok(Err(GithubError::Transport {
                operation: "deregister runner",
                message: deposed.to_string(),
            }));
        }
        let deleted = if github.scale_set.is_some() {
            // Registered in the scale set: removed through the Actions service.
            let Some(handle) = self.service.scale_sets.get(&runner.pool) else {
                return Ok(Ok(false));
            };
            handle
                .client
                .delete_runner(&self.service.metrics, github_id)
                .await
        } else {
            let Some(client) = &self.service.github else {
                return Ok(Ok(false));
            };
            client
                .delete_runner(&self.service.metrics, &github.target, github_id)
                .await
        };
        match deleted {
            Ok(_) => {
                // Asked once: an empty id means "deregistered".
                self.store().set_runner_external_id(runner.id, "").await?;
                Ok(Ok(true))
            }
            Err(error) => Ok(Err(error)),
        }
    }

    /// Deregister before delete: `true` when the instance may go. A runner
    /// GitHub says is running a job becomes busy (its job named by the
    /// job's own webhook) and keeps its instance.
    async fn release(
        &self,
        github: &PoolGithub,
        runner: &runway_core::Runner,
        now: Timestamp,
        report: &mut Report,
    ) -> Result<bool, StoreError> {
        match self.deregister(github, runner).await? {
            Ok(gone) => Ok(gone),
            Err(GithubError::RunnerBusy(_)) => {
                tracing::info!(pool = %runner.pool, runner = %runner.name, "GitHub says the runner is running a job; kept");
                self.service
                    .metrics
                    .runner_delete_requests
                    .get_or_create(&crate::telemetry::metrics::PoolResultLabels {
                        pool: runner.pool.clone(),
                        result: DeleteResult::RefusedBusy,
                    })
                    .inc();
                report.delete_refused_busy += 1;
                if let Err(error) = self
                    .store()
                    .apply_runner_event(runner.id, &RunnerEvent::RemovalRefused, now)
                    .await
                {
                    tracing::debug!(%error, runner = %runner.name, "runner changed meanwhile");
                }
                Ok(false)
            }
            Err(error) => {
                tracing::warn!(pool = %runner.pool, runner = %runner.name, %error, "cannot deregister the runner from GitHub yet; its instance is kept");
                Ok(false)
            }
        }
    }

    /// A runner GitHub kept for a job runway never heard of: once that has
    /// lasted `[github] recheck_after`, ask GitHub again; when it lets the
    /// runner go (the ephemeral runner's job is over), the runner finishes
    /// and is terminated like any other.
    async fn settle_unknown_job(
        &self,
        github: &PoolGithub,
        runner: &runway_core::Runner,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let since = runner.busy_at.unwrap_or(runner.requested_at);
        if now.since(since) < self.service.config().github.recheck_after {
            return Ok(());
        }
        if let Ok(true) = self.deregister(github, runner).await? {
            tracing::info!(runner = %runner.name, "GitHub let go of a runner whose job runway never heard of");
            self.service.finish_runner_job(runner.id, now).await;
            // Deregistered already: nothing must ever give it work again.
            let _ = self
                .store()
                .apply_runner_event(runner.id, &RunnerEvent::TerminateRequested, now)
                .await;
        }
        Ok(())
    }

    /// Deletes the instances of this installation that no live runner
    /// record accounts for: left behind by a runway that stopped between
    /// a create and its record, or whose runner ended while runway was down.
    fn orphans(
        self: &Arc<Self>,
        name: &str,
        provider: &Arc<dyn Provider>,
        instances: &[runway_providers::Instance],
        runners: &[runway_core::Runner],
    ) -> Vec<Task> {
        let live: std::collections::BTreeSet<&str> = runners
            .iter()
            .filter(|r| r.provider == name && !r.state.is_terminal())
            .flat_map(|r| [Some(r.name.as_str()), r.instance_id.as_deref()])
            .flatten()
            .collect();
        let orphans: Vec<runway_providers::Instance> = instances
            .iter()
            .filter(|i| !live.contains(i.name.as_str()) && !live.contains(i.id.0.as_str()))
            .cloned()
            .collect();
        if orphans.is_empty() {
            return Vec::new();
        }
        let (this, provider, name) = (self.clone(), provider.clone(), name.to_owned());
        self.spawn(None, async move {
            let mut report = Report::default();
            for orphan in orphans {
                let deleted = {
                    let Ok(_permit) = this.permit_to_act(&name, "delete_orphan").await else {
                        break; // Deposed: the next leader judges them again.
                    };
                    provider.delete(&orphan.id).await
                };
                match deleted {
                    Ok(()) => {
                        tracing::info!(provider = %name, instance = %orphan.id, name = %orphan.name, "deleted an instance no runner record accounts for");
                        report.orphans_deleted += 1;
                    }
                    Err(error) => this.provider_error(&name, "delete", &error.to_string()),
                }
            }
            Ok(report)
        })
        .into_iter()
        .collect()
    }

    /// How many idle runners `pool` keeps warm: `min_idle`, or with the
    /// predictive policy the arrivals expected within one boot time and a
    /// round.
    fn warm(&self, pool: &PoolConfig, now: Timestamp) -> u32 {
        let forecast = self.forecasts.lock().ok().and_then(|forecasts| {
            let learning = forecasts.get(&pool.name)?;
            learning
                .seed
                .is_none()
                .then(|| learning.forecast.explain(now))
        });
        let Some(forecast) = forecast else {
            if let Ok(mut warm) = self.service.warm.lock() {
                warm.remove(&pool.name); // Not (or no longer) predictive.
            }
            return pool.min_idle.min(pool.max_runners);
        };
        let target = forecast.jobs.max(pool.min_idle).min(pool.max_runners);
        if let Ok(mut warm) = self.service.warm.lock() {
            warm.insert(
                pool.name.clone(),
                crate::app::Warm {
                    target,
                    forecast,
                    at: now,
                },
            );
        }
        target
    }

    /// A predictive pool's forecast settings: it looks one boot time and a
    /// round ahead (its first provider's, or the first provider's, longest
    /// boot time and the scaling interval), at the pool's quantile.
    fn forecast_settings(&self, pool: &PoolConfig) -> Option<(Duration, f64)> {
        let quantile = pool.predictive_quantile()?;
        let config = self.service.config();
        let first = self.providers().by_name.keys().next().cloned();
        let boot = pool
            .providers
            .first()
            .cloned()
            .or(first)
            .and_then(|name| config.providers.iter().find(|p| p.name == name))
            .map(|p| Duration::from_secs_f64(p.boot_seconds.0.max(p.boot_seconds.1).max(0.0)))
            .unwrap_or(Duration::from_secs(150));
        Some((boot + config.scaling.interval, quantile))
    }

    /// Feeds each predictive pool's forecast the jobs routed to it since
    /// the last round, read from the store (so a leader learns every
    /// replica's arrivals, not only its own intake's), with GitHub's
    /// workflow runs. A new forecast — a start, a new leader, a pool made
    /// predictive (or retuned) by a reload — first reads the store's last
    /// four weeks, so a restart does not forget what a pool's weeks look
    /// like: at most [`SEED_PAGES`] pages a round, so a long history
    /// spreads over rounds (the pool keeps `min_idle` until it is read)
    /// instead of holding one up. Then, newest first through the id index
    /// down to the last job fed, a round reads only what is new. A PostgreSQL
    /// transaction that commits after a later id was read is missed: one
    /// arrival short in a statistical forecast.
    async fn learn_arrivals(&self, now: Timestamp) -> Result<(), StoreError> {
        let wanted: BTreeMap<String, (Duration, f64)> = self
            .service
            .config()
            .pools
            .iter()
            .filter_map(|pool| Some((pool.name.clone(), self.forecast_settings(pool)?)))
            .collect();
        let pools: Vec<String> = match self.forecasts.lock() {
            Ok(mut forecasts) => {
                forecasts.retain(|pool, learning| {
                    wanted.get(pool) == Some(&(learning.horizon, learning.quantile))
                });
                for (pool, (horizon, quantile)) in &wanted {
                    forecasts.entry(pool.clone()).or_insert_with(|| Learning {
                        forecast: ArrivalForecast::new(*horizon, *quantile),
                        horizon: *horizon,
                        quantile: *quantile,
                        seed: Some(Seed::default()),
                        newest: JobId(0),
                    });
                }
                forecasts.keys().cloned().collect()
            }
            Err(_) => return Ok(()),
        };
        for pool in pools {
            let seed = self
                .forecasts
                .lock()
                .ok()
                .and_then(|mut f| f.get_mut(&pool).and_then(|l| l.seed.take()));
            if let Some(seed) = seed {
                let seed = self.read_history(&pool, seed, now).await?;
                let Ok(mut forecasts) = self.forecasts.lock() else {
                    return Ok(());
                };
                let Some(learning) = forecasts.get_mut(&pool) else {
                    continue;
                };
                if !seed.done {
                    learning.seed = Some(seed);
                    continue;
                }
                for (at, run) in seed.jobs.iter().rev() {
                    let run = run.map(|(id, w)| (id, seed.workflows[w as usize].as_str()));
                    learning.forecast.observe_job(*at, run);
                }
                learning.newest = seed.newest.unwrap_or(JobId(0));
                tracing::info!(pool = %pool, jobs = seed.jobs.len(), "predictive forecast seeded from the store");
            }
            let after = match self.forecasts.lock() {
                Ok(forecasts) => match forecasts.get(&pool) {
                    Some(learning) => learning.newest,
                    None => continue,
                },
                Err(_) => return Ok(()),
            };
            let (seen, newest) = self.jobs_after(&pool, after).await?;
            if let Ok(mut forecasts) = self.forecasts.lock() {
                if let Some(learning) = forecasts.get_mut(&pool) {
                    for (at, run) in &seen {
                        let run = run.as_ref().map(|(id, w)| (*id, w.as_str()));
                        learning.forecast.observe_job(*at, run);
                    }
                    learning.newest = newest;
                }
            }
        }
        Ok(())
    }

    /// Reads up to [`SEED_PAGES`] more pages of `pool`'s history into
    /// `seed`, newest first, down to the forecast's history start. Walks
    /// every pool's jobs (the window of ids bounds it; a pool filter could
    /// scan the whole table for a pool with no jobs) and keeps the pool's.
    async fn read_history(
        &self,
        pool: &str,
        mut seed: Seed,
        now: Timestamp,
    ) -> Result<Seed, StoreError> {
        let since = now.minus(runway_core::forecast::HISTORY);
        for _ in 0..SEED_PAGES {
            let page = self
                .store()
                .list_jobs(&runway_store::JobFilter {
                    before: seed.before,
                    newest_first: true,
                    limit: Some(JOB_PAGE),
                    ..runway_store::JobFilter::default()
                })
                .await?;
            let Some(last) = page.last() else {
                seed.done = true;
                return Ok(seed);
            };
            seed.before = Some(last.id);
            seed.newest = seed.newest.max(page.first().map(|job| job.id));
            for job in &page {
                // Ids follow first sight: the rest is older.
                if job.created_at < since {
                    seed.done = true;
                    return Ok(seed);
                }
                if job.pool.as_deref() == Some(pool) {
                    let run = run_of(job).map(|(id, w)| (id, seed.workflow(w)));
                    seed.jobs.push((job.created_at, run));
                }
            }
            if page.len() < JOB_PAGE as usize {
                seed.done = true;
                return Ok(seed);
            }
        }
        Ok(seed)
    }

    /// `pool`'s jobs after job `after`, oldest first, with their workflow
    /// runs, and the newest id read: a range of the id key.
    #[allow(clippy::type_complexity)]
    async fn jobs_after(
        &self,
        pool: &str,
        after: JobId,
    ) -> Result<(Vec<(Timestamp, Option<(u64, String)>)>, JobId), StoreError> {
        let mut seen = Vec::new();
        let mut newest = after;
        let mut before = None;
        loop {
            let page = self
                .store()
                .list_jobs(&runway_store::JobFilter {
                    pool: Some(pool.to_owned()),
                    before,
                    after: Some(after),
                    newest_first: true,
                    limit: Some(JOB_PAGE),
                    ..runway_store::JobFilter::default()
                })
                .await?;
            let Some(last) = page.last() else { break };
            before = Some(last.id);
            newest = newest.max(page[0].id);
            seen.extend(page.iter().map(|job| (job.created_at, run_of(job))));
            if page.len() < JOB_PAGE as usize {
                break;
            }
        }
        seen.sort_by_key(|(at, _)| *at);
        Ok((seen, newest))
    }

    async fn snapshot(&self, now: Timestamp) -> Result<Snapshot, StoreError> {
        let mut pools = Vec::new();
        for pool in &self.service.config().pools {
            let allowed =
                |name: &str| pool.providers.is_empty() || pool.providers.iter().any(|p| p == name);
            let offers: Vec<runway_core::planner::Offer> = self
                .providers()
                .by_name
                .iter()
                .filter(|(name, _)| allowed(name))
                .flat_map(|(_, provider)| provider.bid(&pool.name, pool.max_runners))
                .map(|mut offer| {
                    offer.reliability = offer.reliability.min(self.learnt_reliability(
                        &offer.provider,
                        &offer.key,
                        now,
                    ));
                    offer
                })
                .collect();
            for offer in &offers {
                let labels = crate::telemetry::metrics::OfferLabels {
                    provider: offer.provider.clone(),
                    offer: offer.key.clone(),
                };
                let metrics = &self.service.metrics;
                metrics
                    .offer_price
                    .get_or_create(&labels)
                    .set(offer.price_per_hour);
                metrics
                    .offer_reliability
                    .get_or_create(&labels)
                    .set(offer.reliability);
            }
            if let Ok(mut bid) = self.service.offers.lock() {
                bid.insert(pool.name.clone(), offers.clone());
            }
            let mut snapshot =
                crate::app::explain::pool_snapshot(&self.service, pool, offers).await?;
            snapshot.policy.min_idle = self.warm(pool, now);
            pools.push(snapshot);
        }
        let backoffs = self
            .health
            .lock()
            .map(|health| {
                health
                    .values()
                    .filter_map(|h| h.backoff.clone())
                    .filter(|b| b.retry_at > now)
                    .collect()
            })
            .unwrap_or_default();
        Ok(Snapshot { pools, backoffs })
    }

    /// Runs `action` as a task of its own: a create batch, or the deletion
    /// of a runner no other task is working on.
    fn dispatch(self: &Arc<Self>, action: Action, now: Timestamp) -> Option<Task> {
        let this = self.clone();
        match action {
            Action::Create {
                pool,
                provider,
                offer,
                count,
            } => self.spawn(None, async move {
                this.create_batch(pool, provider, offer, count, now).await
            }),
            Action::Delete { pool, runner } => self.spawn(Some(runner), async move {
                this.delete(pool, runner, None, now).await
            }),
            Action::FailAndDelete {
                pool,
                runner,
                reason,
            } => self.spawn(Some(runner), async move {
                this.delete(pool, runner, Some(reason), now).await
            }),
        }
    }

    /// Creates `count` runners of `pool` through `provider`.
    async fn create_batch(
        self: Arc<Self>,
        pool: String,
        provider: String,
        offer: String,
        count: u32,
        now: Timestamp,
    ) -> Result<Report, StoreError> {
        let began = Instant::now();
        let mut report = Report::default();
        let (pool, provider, count) = (&pool, &provider, &count);
        let store = &self.store();
        let metrics = &self.service.metrics;

        let Some(backend) = self.providers().by_name.get(provider).cloned() else {
            return Ok(report);
        };
        let config = self.service.config();
        let Some(pool_config) = config.pools.iter().find(|p| &p.name == pool) else {
            return Ok(report);
        };
        if pool_config.github.is_some() && self.jit_backing_off(pool, now) {
            return Ok(report); // GitHub refused lately; asked again later.
        }
        if pool_config
            .github
            .as_ref()
            .is_some_and(|github| github.scale_set.is_some())
            && self
                .service
                .scale_sets
                .get(pool)
                .and_then(|handle| handle.id())
                .is_none()
        {
            // Its listener has not found or created the scale set yet:
            // no runner could register.
            return Ok(report);
        }
        let labels = pool_config.labels.clone();
        let launch_config = match crate::app::worker_configs::launch_config(
            &self.service,
            pool,
            provider,
            backend.offer_inputs(&offer),
        )
        .await
        {
            Ok(values) => values,
            Err(message) => {
                // No runner could boot as configured: back off like a failed create.
                self.provider_error(provider, "launch_config", &message);
                self.provider_failed(provider, &offer, &message, now);
                return Ok(report);
            }
        };
        let (mut succeeded, mut last_error) = (0u32, None);
        let mut failed = Vec::new();
        // Every runner's quota slot and record first, before any call: a
        // round that plans while this batch works sees them all (its
        // records as supply, its slots in the provider's bid), so it
        // neither asks for them again nor gives their quota to another
        // pool. A provider with no slot left stops the batch there:
        // capacity, not a failure.
        let mut batch = Vec::new();
        for _ in 0..*count {
            let suffix: u32 = rand::thread_rng().gen();
            let name = format!("{pool}-{:08x}", suffix);
            if let Err(error) = backend.reserve(&name) {
                tracing::debug!(%provider, %error, "no quota slot for another runner this round");
                break;
            }
            let created = store
                .create_runner(
                    &NewRunner {
                        name: name.clone(),
                        pool: pool.clone(),
                        provider: provider.clone(),
                        labels: labels.clone(),
                    },
                    now,
                )
                .await;
            let runner = match created {
                Ok(runner) => runner,
                Err(error) => {
                    backend.unreserve(&name);
                    for (runner, _) in &batch {
                        let runner: &runway_core::Runner = runner;
                        backend.unreserve(&runner.name);
                    }
                    return Err(error);
                }
            };
            // Nothing else concludes about it while it is created.
            let working = self.working_on(runner.id);
            batch.push((runner, working));
        }
        let mut stopped: Option<Stopped> = None;
        for (runner, _working) in batch {
            let name = runner.name.clone();
            if let Some(why) = &stopped {
                // The batch stopped before this one's turn.
                backend.unreserve(&name);
                match why {
                    // Ended if the store still takes this term's writes (a
                    // lease that ran out; a later term's store refuses).
                    Stopped::Deposed => {
                        if let Err(error) = self.never_started(&runner, now).await {
                            tracing::debug!(%error, runner = %runner.name, "a deposed leader's runner record is left to the next leader");
                        }
                    }
                    _ => self.never_started(&runner, now).await?,
                }
                continue;
            }
            let mut bootstrap = BTreeMap::from([
                ("RUNWAY_URL".to_owned(), self.runner_url()),
                ("RUNWAY_RUNNER_NAME".to_owned(), name.clone()),
                ("RUNWAY_RUNNER_LABELS".to_owned(), labels.join(",")),
                ("RUNWAY_POOL".to_owned(), pool.clone()),
            ]);
            if let Some(github) = &pool_config.github {
                if self.service.may_act("github_jit_config").await.is_err() {
                    backend.unreserve(&name);
                    stopped = Some(Stopped::Deposed);
                    if let Err(error) = self.never_started(&runner, now).await {
                        tracing::debug!(%error, runner = %runner.name, "a deposed leader's runner record is left to the next leader");
                    }
                    continue;
                }
                match self.jit_config(github, &runner, &labels, now).await? {
                    Some(encoded) => {
                        bootstrap.insert("RUNWAY_JIT_CONFIG".to_owned(), encoded);
                    }
                    None => {
                        // GitHub said no (the record is failed); the next
                        // round asks again.
                        backend.unreserve(&name);
                        report.create_failures += 1;
                        stopped = Some(Stopped::Refused);
                        continue;
                    }
                }
            }
            if backend.runners_register() && pool_config.github.is_none() {
                // One-time, bound to this record, valid while it may boot.
                let token = crate::app::tokens::new_token("rwr_");
                store
                    .create_registration_token(
                        &crate::app::tokens::token_hash(&token),
                        pool,
                        Some(runner.id),
                        now.plus(pool_config.boot_timeout),
                        now,
                    )
                    .await?;
                bootstrap.insert("RUNWAY_REGISTRATION_TOKEN".to_owned(), token);
            }
            let instance_api = if backend.uses_instance_api() {
                let base = self.runner_url();
                let token = crate::app::garm::mint(
                    &self.service,
                    &runner,
                    now.plus(pool_config.boot_timeout),
                    bootstrap.get("RUNWAY_JIT_CONFIG").map(String::as_str),
                )
                .await?;
                let metadata_url = format!("{base}{}", crate::app::garm::METADATA_PATH);
                let callback_url = format!("{base}{}", crate::app::garm::CALLBACKS_PATH);
                Some(runway_providers::InstanceApi {
                    install_wrapper: crate::app::garm::install_wrapper(
                        &metadata_url,
                        &callback_url,
                        &token,
                    ),
                    // A GitHub pool's machine installs GitHub's runner.
                    tools: match &pool_config.github {
                        Some(github) => {
                            crate::app::garm::github_tools(&self.service, &github.target, now).await
                        }
                        None => crate::app::garm::runway_tools(&base),
                    },
                    metadata_url,
                    callback_url,
                    token,
                    repo_url: pool_config
                        .github
                        .as_ref()
                        .map(|github| {
                            crate::app::garm::repo_url(
                                &self.service.config().github.api_url,
                                &github.target,
                            )
                        })
                        .unwrap_or_default(),
                })
            } else {
                None
            };
            let request = CreateRequest {
                name: name.clone(),
                pool: pool.clone(),
                offer: offer.clone(),
                labels: labels.clone(),
                bootstrap,
                launch_config: launch_config.clone(),
                instance_api,
            };
            let created = {
                let Ok(_permit) = self.permit_to_act(provider, "create").await else {
                    backend.unreserve(&name);
                    stopped = Some(Stopped::Deposed);
                    if let Err(error) = self.never_started(&runner, now).await {
                        tracing::debug!(%error, runner = %runner.name, "a deposed leader's runner record is left to the next leader");
                    }
                    continue;
                };
                backend.create(&request).await
            };
            match created {
                Ok(instance) => {
                    store
                        .apply_runner_event(
                            runner.id,
                            &RunnerEvent::ProvisioningStarted {
                                instance_id: instance.id.0.clone(),
                            },
                            now,
                        )
                        .await?;
                    metrics
                        .runners_created
                        .get_or_create(&crate::telemetry::metrics::PoolProviderLabels {
                            pool: pool.clone(),
                            provider: provider.clone(),
                        })
                        .inc();
                    succeeded += 1;
                    report.created += 1;
                    self.learn(provider, &offer, true, now);
                }
                Err(ProviderError::Quota { .. }) => {
                    // Another create took the slot (a provider that holds
                    // none ahead): capacity, not a failed launch; the offer's
                    // reliability is untouched.
                    backend.unreserve(&name);
                    metrics
                        .offer_creates
                        .get_or_create(&crate::telemetry::metrics::OfferResultLabels {
                            provider: provider.clone(),
                            offer: offer.clone(),
                            result: "quota",
                        })
                        .inc();
                    self.never_started(&runner, now).await?;
                    if let Some(github) = &pool_config.github {
                        if let Err(error) = self.deregister(github, &runner).await? {
                            tracing::warn!(runner = %runner.name, %error, "cannot deregister a runner the provider had no quota for");
                        }
                    }
                    stopped = Some(Stopped::Quota);
                }
                Err(error) => {
                    backend.unreserve(&name);
                    self.provider_error(provider, "create", &error.to_string());
                    report.create_failures += 1;
                    self.learn(provider, &offer, false, now);
                    let permanent = !error.is_retryable();
                    last_error = Some(error.to_string());
                    failed.push((runner, error.to_string()));
                    if permanent {
                        stopped = Some(Stopped::Refused); // The rest would fail the same way.
                    }
                }
            }
        }
        // A provider that delivers some of what was asked is merely
        // unreliable (the next round asks again for the rest); one
        // that delivers nothing is backed off, so the next offer wins.
        // Backed off from when the calls ended, not from the round:
        // time spent hanging must not use up the backoff.
        match (succeeded, last_error) {
            (0, Some(error)) => {
                self.provider_failed(provider, &offer, &error, now.plus(began.elapsed()))
            }
            (_, _) if succeeded > 0 => self.provider_succeeded(provider, &offer),
            _ => {}
        }
        // Only now are the failed runners' records failed: a round that
        // sees their demand uncovered also sees the offer's backoff, and
        // never asks the failing offer again in between.
        for (runner, reason) in failed {
            store
                .apply_runner_event(runner.id, &RunnerEvent::Failed { reason }, now)
                .await?;
            // Its registration would never come online.
            if let Some(github) = &pool_config.github {
                if let Err(error) = self.deregister(github, &runner).await? {
                    tracing::warn!(runner = %runner.name, %error, "cannot deregister a runner whose machine never started");
                }
            }
        }
        Ok(report)
    }

    /// Ends `runner`, whose create was never made (its batch stopped first,
    /// or the provider had no quota): terminated, as a runner that is no
    /// longer needed, not failed: nothing was tried and nothing broke.
    async fn never_started(
        &self,
        runner: &runway_core::Runner,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let store = self.store();
        for event in [RunnerEvent::TerminateRequested, RunnerEvent::Terminated] {
            match store.apply_runner_event(runner.id, &event, now).await {
                Ok(_) => {}
                Err(StoreError::RunnerTransition(_) | StoreError::RunnerNotFound(_)) => break,
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Deletes runner `runner_id` of `pool` (failing it first with
    /// `failure`, if given).
    async fn delete(
        self: Arc<Self>,
        pool: String,
        runner_id: RunnerId,
        failure: Option<String>,
        now: Timestamp,
    ) -> Result<Report, StoreError> {
        let mut report = Report::default();
        self.delete_runner(&pool, runner_id, failure, now, &mut report)
            .await?;
        Ok(report)
    }

    async fn delete_runner(
        &self,
        pool: &str,
        runner_id: RunnerId,
        failure: Option<String>,
        now: Timestamp,
        report: &mut Report,
    ) -> Result<(), StoreError> {
        let store = &self.store();
        let result_label = |result: DeleteResult| crate::telemetry::metrics::PoolResultLabels {
            pool: pool.to_owned(),
            result,
        };
        let github = self.github_pool(pool);
        let event = match (&failure, github.as_ref()) {
            // A GitHub runner fails only once GitHub has let it go: it may
            // have taken a job while we gave up on it.
            (Some(_), Some(_)) => None,
            (Some(reason), None) => Some(RunnerEvent::Failed {
                reason: reason.clone(),
            }),
            (None, _) => Some(RunnerEvent::TerminateRequested),
        };
        let current = match event {
            Some(event) => store.apply_runner_event(runner_id, &event, now).await,
            None => store
                .get_runner(runner_id)
                .await?
                .ok_or(StoreError::RunnerNotFound(runner_id)),
        };
        let mut runner = match current {
            Ok(runner) => runner,
            Err(StoreError::RunnerTransition(runway_core::RunnerTransitionError::Busy {
                ..
            })) => {
                self.service
                    .metrics
                    .runner_delete_requests
                    .get_or_create(&result_label(DeleteResult::RefusedBusy))
                    .inc();
                report.delete_refused_busy += 1;
                return Ok(());
            }
            // Changed since the snapshot (it took a job, it vanished): next round decides.
            Err(StoreError::RunnerTransition(_) | StoreError::RunnerNotFound(_)) => return Ok(()),
            Err(other) => return Err(other),
        };
        if let Some(github) = &github {
            let may_fail = matches!(
                runner.state,
                RunnerState::Requested | RunnerState::Provisioning | RunnerState::Idle
            );
            if failure.is_some() && !may_fail {
                return Ok(()); // Changed since the snapshot: next round decides.
            }
            if !self.release(github, &runner, now, report).await? {
                return Ok(()); // Busy at GitHub, or GitHub unreachable: kept.
            }
            if let Some(reason) = &failure {
                match store
                    .apply_runner_event(
                        runner.id,
                        &RunnerEvent::Failed {
                            reason: reason.clone(),
                        },
                        now,
                    )
                    .await
                {
                    Ok(failed) => runner = failed,
                    Err(StoreError::RunnerTransition(_)) => return Ok(()),
                    Err(other) => return Err(other),
                }
            }
        }
        let providers = self.providers();
        let (Some(provider), Some(instance)) = (
            providers.by_name.get(&runner.provider),
            runner.instance_id.clone(),
        ) else {
            return Ok(());
        };
        let deleted = {
            let Ok(_permit) = self.permit_to_act(&runner.provider, "delete").await else {
                return Ok(());
            };
            provider.delete(&InstanceId(instance)).await
        };
        match deleted {
            Ok(()) => {
                if runner.state == RunnerState::Terminating {
                    store
                        .apply_runner_event(runner.id, &RunnerEvent::Terminated, now)
                        .await?;
                }
                self.service
                    .metrics
                    .runner_delete_requests
                    .get_or_create(&result_label(DeleteResult::Ok))
                    .inc();
                report.deleted += 1;
            }
            Err(error) => {
                self.provider_error(&runner.provider, "delete", &error.to_string());
                self.service
                    .metrics
                    .runner_delete_requests
                    .get_or_create(&result_label(DeleteResult::Error))
                    .inc();
            }
        }
        Ok(())
    }

    async fn update_gauges(&self, snapshot: &Snapshot, plan: &Plan) -> Result<(), StoreError> {
        let runners = self.store().list_live_runners(None).await?;
        let metrics = &self.service.metrics;
        for pool in &self.service.config().pools {
            for state in RunnerState::ALL.iter().filter(|s| !s.is_terminal()) {
                let count = runners
                    .iter()
                    .filter(|r| r.pool == pool.name && r.state == *state)
                    .count();
                metrics
                    .runners
                    .get_or_create(&crate::telemetry::metrics::PoolStateLabels {
                        pool: pool.name.clone(),
                        state: state.as_str(),
                    })
                    .set(count as i64);
            }
        }
        let mut waiting: BTreeMap<(String, &'static str), i64> = BTreeMap::new();
        // The round's own snapshot says which pool each queued job is in:
        // no second read of the queue.
        let pool_of: BTreeMap<JobId, &str> = snapshot
            .pools
            .iter()
            .flat_map(|pool| {
                pool.queued
                    .iter()
                    .map(move |job| (job.id, pool.policy.name.as_str()))
            })
            .collect();
        for (job, reason) in &plan.waiting {
            let pool = pool_of.get(job).copied().unwrap_or_default().to_owned();
            *waiting.entry((pool, reason.code())).or_default() += 1;
        }
        // The jobs behind a pool's listed queue wait as its last listed one.
        for pool in &snapshot.pools {
            if let Some(reason) = crate::app::explain::beyond_listed(pool, &plan.waiting) {
                *waiting
                    .entry((pool.policy.name.clone(), reason.code()))
                    .or_default() += i64::from(pool.unlisted);
            }
        }
        metrics.jobs_waiting.clear();
        for ((pool, reason), count) in waiting {
            metrics
                .jobs_waiting
                .get_or_create(&crate::telemetry::metrics::PoolReasonLabels { pool, reason })
                .set(count);
        }
        Ok(())
    }

    fn provider_error(&self, provider: &str, operation: &str, message: &str) {
        tracing::warn!(provider, operation, error = message, "provider call failed");
        self.service
            .metrics
            .provider_errors
            .get_or_create(&crate::telemetry::metrics::ProviderOperationLabels {
                provider: provider.to_owned(),
                operation: operation.to_owned(),
            })
            .inc();
    }

    /// A create batch of `provider`'s offer `offer` delivered nothing (an
    /// empty `offer`: nothing of the provider can start): that offer backs
    /// off, so the next one wins.
    fn provider_failed(&self, provider: &str, offer: &str, message: &str, now: Timestamp) {
        if let Ok(mut health) = self.health.lock() {
            let entry = health
                .entry((provider.to_owned(), offer.to_owned()))
                .or_default();
            entry.consecutive_failures += 1;
            let delay = backoff_delay(
                entry.consecutive_failures,
                rand::thread_rng().gen_range(0.5..=1.0),
            );
            entry.backoff = Some(Backoff {
                provider: provider.to_owned(),
                offer: offer.to_owned(),
                retry_at: now.plus(delay),
                last_error: message.to_owned(),
            });
        }
    }

    /// What creates taught of an offer's reliability, as it stands at
    /// `now` (it recovers with time: `recovered_reliability`).
    fn learnt_reliability(&self, provider: &str, offer: &str, now: Timestamp) -> f64 {
        self.reliability
            .lock()
            .ok()
            .and_then(|learnt| {
                learnt
                    .get(&(provider.to_owned(), offer.to_owned()))
                    .map(|(value, at)| recovered_reliability(*value, now.since(*at)))
            })
            .unwrap_or(1.0)
    }

    fn learn(&self, provider: &str, offer: &str, succeeded: bool, now: Timestamp) {
        self.service
            .metrics
            .offer_creates
            .get_or_create(&crate::telemetry::metrics::OfferResultLabels {
                provider: provider.to_owned(),
                offer: offer.to_owned(),
                result: if succeeded { "ok" } else { "failed" },
            })
            .inc();
        if let Ok(mut learnt) = self.reliability.lock() {
            let entry = learnt
                .entry((provider.to_owned(), offer.to_owned()))
                .or_insert((1.0, now));
            let standing = recovered_reliability(entry.0, now.since(entry.1));
            *entry = (learn_reliability(standing, succeeded), now);
        }
    }

    fn provider_succeeded(&self, provider: &str, offer: &str) {
        if let Ok(mut health) = self.health.lock() {
            health.remove(&(provider.to_owned(), offer.to_owned()));
            // A provider that starts runners again is no longer failing
            // as a whole either.
            health.remove(&(provider.to_owned(), String::new()));
        }
    }
}

/// Runs the reconciler every `interval`, and at once when a job arrives,
/// until `shutdown` flips.
pub async fn run(
    reconciler: Arc<Reconciler>,
    interval: Duration,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let service = reconciler.inner.service.clone();
    let worker = crate::tasks::Worker {
        name: "reconcile",
        period: interval,
        // Another replica reconciles while this one follows.
        leader_only: true,
        first_round_at_once: false,
        wake: Some(&service.reconcile_wanted),
    };
    worker
        .run(&service.tasks, &|| service.is_leader(), shutdown, || {
            let reconciler = reconciler.clone();
            async move {
                reconciler
                    .reconcile_once(crate::clock::now())
                    .await
                    .map(|_| ())
                    .inspect_err(|_| reconciler.inner.service.metrics.store_error("reconcile"))
            }
        })
        .await
}
