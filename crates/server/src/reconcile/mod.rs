//! The reconciler: level-triggered. Each round it observes what the
//! providers report, snapshots the store, asks the pure planner what to do,
//! applies the actions through the providers and records every outcome. It
//! assumes nothing about why it runs; running it twice in a row is harmless.

mod create;
mod credentials;
mod delete;
mod doubt;
mod forecasts;
mod github;
pub mod heal;
mod observe;
mod orphans;
pub mod scale_set;
mod stock;

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
use credentials::{Arming, Minted};
use forecasts::Learning;
use github::DEREGISTER_RETRY;

#[derive(Default)]
struct Health {
    consecutive_failures: u32,
    backoff: Option<Backoff>,
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
    /// Instances no live record accounts for that were kept this round:
    /// within their in-flight window, busy at GitHub, or not provably
    /// idle.
    pub orphans_kept: u32,
    /// Runners whose create's outcome became unknown, and those adopted
    /// when their instance appeared.
    pub creates_in_doubt: u32,
    pub adopted: u32,
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
    /// Runners GitHub would not deregister yet: (refusals so far, not
    /// asked again before). The scale-down ADR allows one or two wasted
    /// deletes a runner; asking every round spent hundreds on a long job.
    deregistrations: Mutex<BTreeMap<RunnerId, (u32, Timestamp)>>,
    /// Runners whose latest deregistration GitHub refused because they
    /// ran a job, and when: once a runner is told to stop after that (its
    /// job ended), GitHub is asked again at once, not after the busy wait.
    refused_busy_at: Mutex<BTreeMap<RunnerId, Timestamp>>,
    /// When runners' unfinished reports were last checked for crashes.
    reports_checked: Mutex<Option<Timestamp>>,
    /// Runners whose create's outcome is unknown, and since when this
    /// replica knows it (after a restart: since it first saw the record
    /// with no task working on it, which is never earlier than its
    /// create). Their in-flight window counts from then.
    in_doubt: Mutex<BTreeMap<RunnerId, Timestamp>>,
    /// Instances no live record accounts for, by (provider, instance), and
    /// when a list first showed each so: judged only past the in-flight
    /// window (a create that answered late may still be adopted).
    unaccounted: Mutex<BTreeMap<(String, InstanceId), Timestamp>>,
    /// When ended runners' registrations were last looked at.
    deregistrations_swept: Mutex<Option<Timestamp>>,
    /// Providers whose start of a stopped runner was refused lately, and
    /// until when the stock starts none of theirs (`stock.rs`): the queue
    /// gets cold boots meanwhile.
    starts_refused: Mutex<BTreeMap<String, Timestamp>>,
    /// Tasks running now that no runner record guards: ended runners'
    /// deregistrations (`"deregistrations"`) and each provider's orphans
    /// (`"orphans:NAME"`). One of each at a time: a slow GitHub or
    /// provider does not pile them up round after round.
    sweeping: Mutex<std::collections::BTreeSet<String>>,
}

/// How often a round checks runners' reports for crashes (a pre-job
/// report with no post-job report, `app::reports::count_crashes`).
const REPORT_CHECK: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a busy GitHub runner whose machine is gone waits for its
/// job's completion (`JobCompleted`, the `completed` webhook) before it is
/// judged crashed: a JIT runner exits as soon as its job is done, often
/// before runway has taken the completion in, and such a runner finished,
/// it did not crash.
pub const COMPLETION_GRACE: Duration = Duration::from_secs(90);

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
        self.orphans_kept += other.orphans_kept;
        self.creates_in_doubt += other.creates_in_doubt;
        self.adopted += other.adopted;
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
                deregistrations: Mutex::new(BTreeMap::new()),
                refused_busy_at: Mutex::new(BTreeMap::new()),
                reports_checked: Mutex::new(None),
                in_doubt: Mutex::new(BTreeMap::new()),
                unaccounted: Mutex::new(BTreeMap::new()),
                deregistrations_swept: Mutex::new(None),
                starts_refused: Mutex::new(BTreeMap::new()),
                sweeping: Mutex::new(std::collections::BTreeSet::new()),
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
    /// Counts, at most every [`REPORT_CHECK`], the runners that reported
    /// their job's start and never its end (the COS spec's crash).
    async fn check_reports(&self, now: Timestamp, report: &mut Report) -> Result<(), StoreError> {
        {
            let Ok(mut checked) = self.reports_checked.lock() else {
                return Ok(());
            };
            if checked.is_some_and(|at| now.since(at) < REPORT_CHECK) {
                return Ok(());
            }
            *checked = Some(now);
        }
        for (pool, crashed) in crate::app::reports::count_crashes(&self.service, now).await? {
            *report.crashed.entry(pool).or_default() += crashed;
        }
        Ok(())
    }

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
        self.check_reports(now, &mut report).await?;
        let deregistering = self.retry_deregistrations(now);
        self.learn_arrivals(now).await?;
        // The stock plans from the snapshot's queue, and what it starts is
        // booting in the snapshot the main plan reads: both see the same
        // jobs, so none that arrived between them gets a cold boot while
        // a stopped runner waits.
        let mut snapshot = self.snapshot(now).await?;
        let stocking = self.stock(now, &mut snapshot).await?;
        let plan = plan(&snapshot, now);
        let tasks = plan
            .actions
            .iter()
            .filter_map(|action| self.dispatch(action.clone(), now))
            .chain(deregistering)
            .chain(stocking)
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

    /// Runs `work` as a task of its own unless one of the same `kind` runs.
    fn sweep<F>(self: &Arc<Self>, kind: String, work: F) -> Option<Task>
    where
        F: std::future::Future<Output = Result<Report, StoreError>> + Send + 'static,
    {
        if !self.sweeping.lock().ok()?.insert(kind.clone()) {
            return None; // The last one still runs.
        }
        let this = self.clone();
        self.spawn(None, async move {
            let outcome = work.await;
            if let Ok(mut sweeping) = this.sweeping.lock() {
                sweeping.remove(&kind);
            }
            outcome
        })
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
                this.create_batch(pool, provider, offer, count, false, now)
                    .await
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

    async fn update_gauges(&self, snapshot: &Snapshot, plan: &Plan) -> Result<(), StoreError> {
        // Counted from three columns of the live rows: a round no longer
        // decodes every live runner a third time for its gauges.
        let counts = self.store().live_runner_counts().await?;
        let metrics = &self.service.metrics;
        for pool in &self.service.config().pools {
            for state in RunnerState::ALL.iter().filter(|s| !s.is_terminal()) {
                let count: u64 = counts
                    .iter()
                    .filter(|c| c.pool == pool.name && c.state == *state)
                    .map(|c| c.count)
                    .sum();
                metrics
                    .runners
                    .get_or_create(&crate::telemetry::metrics::PoolStateLabels {
                        pool: pool.name.clone(),
                        state: state.as_str(),
                    })
                    .set(i64::try_from(count).unwrap_or(i64::MAX));
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
        for ((pool, reason), count) in &waiting {
            metrics
                .jobs_waiting
                .get_or_create(&crate::telemetry::metrics::PoolReasonLabels {
                    pool: pool.clone(),
                    reason,
                })
                .set(*count);
        }
        if let Ok(mut kept) = self.service.waiting.lock() {
            *kept = waiting;
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
                    .inspect_err(|_| reconciler.inner.service.store_failed("reconcile"))
            }
        })
        .await
}
