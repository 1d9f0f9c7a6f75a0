//! The service root: configuration and store, passed explicitly to every
//! part of the server. Durable facts live in the store; nothing here is
//! state that a restart would lose.

pub mod access;
pub mod admin;

/// How often at most a replica says `store_unavailable` in the event log.
const STORE_FAILURE_EVENTS: std::time::Duration = std::time::Duration::from_secs(60);
pub mod background;
pub mod error;
pub mod explain;
pub mod garm;
pub mod history;
pub mod intake;
pub mod jobs;
pub mod lease;
pub mod live;
pub mod reload;
pub mod reports;
pub mod retention;
pub mod runners;
pub mod tokens;
pub mod waiters;
pub mod wakeups;
pub mod worker_configs;

pub use error::{AppError, ErrorKind};

use std::sync::Arc;

use runway_core::worker_config::Schemas;
use runway_core::{RunnerEvent, RunnerId, Timestamp};
use runway_store::{Expect, OpenOptions, Store, StoreError};

use crate::app::worker_configs::EvaluationCache;
use crate::clock::now;
use crate::config::worker_config::WorkerConfigDto;
use crate::config::Config;
use crate::telemetry::metrics::Metrics;

/// A predictive pool's warm pool as the reconciler last sized it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warm {
    /// Idle runners kept: the forecast, within `min_idle` and `max_runners`.
    pub target: u32,
    pub forecast: runway_core::forecast::Expected,
    pub at: Timestamp,
}

impl Warm {
    /// Why its runners are kept warm, in a sentence: the batches expected
    /// now first ("kept warm for the batch expected at 02:00 UTC (150 jobs,
    /// seen on 4 of the last 4 days like today)"), else the forecast's
    /// count; `None` when nothing is kept warm.
    pub fn why(&self) -> Option<String> {
        if self.target == 0 {
            return None;
        }
        let batches: Vec<String> = self
            .forecast
            .batches
            .iter()
            .filter(|batch| batch.warm)
            .map(|batch| {
                format!(
                    "the batch expected at {} UTC ({} jobs, {} still to come; seen on {} of the last {} {})",
                    crate::clock::hh_mm(batch.earliest),
                    batch.jobs,
                    batch.remaining,
                    batch.seen,
                    batch.of,
                    if batch.weekly { "weeks" } else { "days like today" },
                )
            })
            .collect();
        let runners = format!(
            "{} runner{} kept warm for",
            self.target,
            if self.target == 1 { " is" } else { "s are" }
        );
        Some(if batches.is_empty() {
            let jobs = self.forecast.jobs;
            format!(
                "{runners} the {jobs} job{} the forecast expects within one boot time",
                if jobs == 1 { "" } else { "s" },
            )
        } else {
            format!("{runners} {}", batches.join(" and "))
        })
    }
}

/// Each pool's access policy, compiled from its `[pools.access]` table.
pub type AccessPolicies = std::collections::HashMap<String, runway_core::access::Access>;

/// The running configuration and what is compiled from it once a load:
/// the access policies' globs are built here, not for every webhook.
struct Running {
    config: Arc<Config>,
    access: Arc<AccessPolicies>,
}

impl Running {
    fn new(config: Config) -> Running {
        let access = config
            .pools
            .iter()
            .filter_map(|pool| {
                let access = pool.access.as_ref()?;
                // Validation built it already; a policy that would not
                // build refuses every repository (fail closed).
                let built = access.build().unwrap_or_else(|_| {
                    runway_core::access::Access::new(
                        &["!*/*".to_owned()],
                        runway_core::access::Forks::Deny,
                        None,
                    )
                    .unwrap_or_default()
                });
                Some((pool.name.clone(), built))
            })
            .collect();
        Running {
            config: Arc::new(config),
            access: Arc::new(access),
        }
    }
}

pub struct Service {
    /// The running configuration and what is compiled from it; `reload`
    /// swaps both whole (`Service::config` hands out the current one).
    config: std::sync::RwLock<Running>,
    pub store: Arc<dyn Store>,
    pub metrics: Metrics,
    pub evaluations: EvaluationCache,
    /// The runners long-polling here, and which of them a job wakes.
    pub waiters: crate::app::waiters::Waiters,
    /// Asks the reconciler for a round now (a job arrived, a runner ended);
    /// a request made while a round runs gives exactly one more round.
    pub reconcile_wanted: tokio::sync::Notify,
    /// The reconciler's latest plan: its wait reasons answer "why is my job waiting?".
    pub last_plan: std::sync::Mutex<Option<runway_core::planner::Plan>>,
    /// Queued jobs by pool and wait reason in the reconciler's latest
    /// round (`runway_jobs_waiting`), for the fleet's history.
    pub waiting: std::sync::Mutex<std::collections::BTreeMap<(String, &'static str), i64>>,
    /// Per predictive pool, the warm pool the reconciler last sized and the
    /// forecast it came from.
    pub warm: std::sync::Mutex<std::collections::BTreeMap<String, Warm>>,
    /// The providers the reconciler backs off from after failures, as of
    /// its latest round (empty on a replica that does not lead).
    pub provider_backoffs: std::sync::Mutex<Vec<runway_core::planner::Backoff>>,
    /// Per pool, the offers its providers bid in the latest round, with
    /// the reliability the reconciler learnt (empty on a replica that does
    /// not lead): how bidding chose, for "why is my job waiting?".
    pub offers:
        std::sync::Mutex<std::collections::BTreeMap<String, Vec<runway_core::planner::Offer>>>,
    /// The JSON event log (`[telemetry] event_log`); disabled unless set.
    pub events: crate::telemetry::events::EventLog,
    /// The GitHub API client, when `[github]` has credentials.
    pub github: Option<Arc<crate::github::api::GithubClient>>,
    /// The scale-set pools' handles: the scale set each listener found
    /// or created, for the reconciler's JIT configurations and removals.
    pub scale_sets: crate::github::scaleset::ScaleSets,
    /// Long-polling runners as a poll read them: renewals that wait
    /// without a look read no store.
    pub renewals: crate::app::tokens::Renewals,
    /// Workflow runs' facts for access policies, looked up once per run.
    pub run_facts: crate::app::access::RunFactsCache,
    pub run_events: crate::app::access::RunEvents,
    /// What each GitHub pool's runner group admits beyond the pool's
    /// access policy, as last read from GitHub (`GET /api/v1/pools`).
    pub runner_group_warnings: std::sync::Mutex<std::collections::BTreeMap<String, Vec<String>>>,
    /// Notified when the configuration is replaced (a reload).
    pub config_replaced: tokio::sync::Notify,
    /// When this replica last wrote a `store_unavailable` event, and the
    /// failures since that it did not write one for.
    store_failures: std::sync::Mutex<(Option<std::time::Instant>, u64)>,
    /// Whether this replica leads: runs the reconciler and the GitHub
    /// healer (`background::leadership` keeps it; true unless replicas
    /// share a PostgreSQL store and another leads).
    pub leading: std::sync::atomic::AtomicBool,
    /// The status of every background worker (`GET /api/v1/tasks`).
    pub tasks: crate::tasks::Tasks,
    /// The console's live view, shared by the open tabs (`app/live.rs`).
    pub console: Arc<crate::app::live::Board>,
    /// This process among the replicas sharing the store: random per start.
    pub replica: String,
    /// When this process started, and the address it serves on (set once
    /// it listens), for the cluster view.
    pub started_at: Timestamp,
    pub address: std::sync::OnceLock<String>,
    /// The term of this replica's lead (`Store::begin_term`), 0 while it
    /// does not lead.
    pub term: std::sync::atomic::AtomicI64,
    /// How long this replica's current lead waited, once taken, for the
    /// previous holder's lease to run out (ms; 0 after a release).
    pub lead_waited_ms: std::sync::atomic::AtomicU64,
    /// The lead as this replica's own clock knows it (`may_act`), renewed
    /// by `background::leadership`.
    pub lease: std::sync::Mutex<crate::app::lease::Lease>,
    /// The store for the leader's own actions in its latest term
    /// (`Store::fenced`): once another replica has begun a later term, its
    /// writes to runners and once-keys are refused. Kept after the lead is
    /// lost, so a deposed leader's unfinished round stays fenced.
    leader_store: std::sync::RwLock<Option<Arc<dyn Store>>>,
    /// Wake-ups for the other replicas, sent by `wakeups::announcer`.
    pub outgoing: crate::app::wakeups::Outgoing,
    /// GitHub's runner downloads per target, and when they were fetched
    /// (`garm::github_tools`).
    pub runner_downloads:
        std::sync::Mutex<std::collections::BTreeMap<String, (Timestamp, Vec<serde_json::Value>)>>,
    /// The web console's key for session cookies and CSRF tokens (a
    /// store setting, shared by the replicas), read once.
    pub console_key: tokio::sync::OnceCell<Vec<u8>>,
    /// Where the config came from, for a reload (set by `run`).
    pub reload_source: std::sync::OnceLock<crate::app::reload::ReloadSource>,
}

impl Service {
    /// Opens the configured store (applying migrations) and builds the root.
    pub async fn open(config: Config) -> Result<Service, StoreError> {
        let store = Service::open_store(&config).await?;
        Ok(Service::new(config, store))
    }

    /// Opens the store `config` names, applying migrations.
    pub async fn open_store(config: &Config) -> Result<Arc<dyn Store>, StoreError> {
        let options = OpenOptions {
            max_connections: config.server.database_max_connections,
            ..OpenOptions::default()
        };
        runway_store::open(config.server.database.expose(), &options).await
    }

    pub fn new(config: Config, store: Arc<dyn Store>) -> Service {
        let job_labels =
            crate::telemetry::metrics::JobLabelSwitches::of(&config.metrics.job_labels);
        let metrics = Metrics::new().with_job_labels(job_labels);
        Service {
            store,
            waiters: crate::app::waiters::Waiters::counted(crate::app::waiters::WaiterMetrics {
                polling: metrics.runners_polling.clone(),
                woken: metrics.runners_woken.clone(),
                looks: metrics.long_poll_looks.clone(),
                spared: metrics.long_poll_looks_spared.clone(),
            }),
            metrics,
            evaluations: EvaluationCache::default(),
            reconcile_wanted: tokio::sync::Notify::new(),
            events: crate::telemetry::events::EventLog::disabled(),
            last_plan: std::sync::Mutex::new(None),
            waiting: std::sync::Mutex::default(),
            warm: std::sync::Mutex::new(std::collections::BTreeMap::new()),
            provider_backoffs: std::sync::Mutex::new(Vec::new()),
            offers: std::sync::Mutex::new(std::collections::BTreeMap::new()),
            github: match crate::github::api::GithubClient::from_config(&config.github) {
                Ok(client) => client.map(Arc::new),
                Err(error) => {
                    // Config validation parses the key first: not expected.
                    tracing::error!(%error, "no GitHub API client");
                    None
                }
            },
            scale_sets: crate::github::scaleset::ScaleSets::default(),
            renewals: Default::default(),
            run_facts: Default::default(),
            run_events: Default::default(),
            runner_group_warnings: Default::default(),
            config_replaced: tokio::sync::Notify::new(),
            store_failures: std::sync::Mutex::new((None, 0)),
            config: std::sync::RwLock::new(Running::new(config)),
            leading: std::sync::atomic::AtomicBool::new(true),
            tasks: crate::tasks::Tasks::default(),
            console: Arc::default(),
            replica: format!("{:016x}", rand::random::<u64>()),
            started_at: now(),
            address: std::sync::OnceLock::new(),
            term: std::sync::atomic::AtomicI64::new(0),
            lead_waited_ms: std::sync::atomic::AtomicU64::new(0),
            lease: std::sync::Mutex::new(crate::app::lease::Lease::Unmanaged),
            leader_store: std::sync::RwLock::new(None),
            outgoing: crate::app::wakeups::Outgoing::default(),
            runner_downloads: std::sync::Mutex::new(std::collections::BTreeMap::new()),
            reload_source: std::sync::OnceLock::new(),
            console_key: tokio::sync::OnceCell::new(),
        }
    }

    /// The configuration as it is now. Hold it for one decision: a reload
    /// may replace it between two calls.
    pub fn config(&self) -> Arc<Config> {
        match self.config.read() {
            Ok(running) => running.config.clone(),
            Err(poisoned) => poisoned.into_inner().config.clone(),
        }
    }

    /// The configuration as it is now, with each pool's access policy as
    /// compiled when it was loaded (a pool without one is absent).
    pub fn config_and_access(&self) -> (Arc<Config>, Arc<AccessPolicies>) {
        let pair = |running: &Running| (running.config.clone(), running.access.clone());
        match self.config.read() {
            Ok(running) => pair(&running),
            Err(poisoned) => pair(&poisoned.into_inner()),
        }
    }

    /// A store operation failed: counted per operation, and said in the
    /// event log as `store_unavailable` — at most once a minute, with how
    /// many failures came since the last one, so an outage is an entry, not
    /// a flood.
    pub fn store_failed(&self, operation: &str) {
        self.metrics.store_error(operation);
        let now = std::time::Instant::now();
        let said = {
            let Ok(mut last) = self.store_failures.lock() else {
                return;
            };
            let due = last
                .0
                .is_none_or(|at| now.duration_since(at) >= STORE_FAILURE_EVENTS);
            last.1 += 1;
            if due {
                let failures = last.1;
                *last = (Some(now), 0);
                Some(failures)
            } else {
                None
            }
        };
        if let Some(failures) = said {
            self.events.emit(
                "store_unavailable",
                serde_json::json!({"operation": operation, "failures": failures}),
                crate::clock::now(),
            );
        }
    }

    /// Makes `config` the running configuration (validated by the caller).
    pub fn replace_config(&self, config: Config) {
        let running = Running::new(config);
        match self.config.write() {
            Ok(mut current) => *current = running,
            Err(poisoned) => *poisoned.into_inner() = running,
        }
        self.config_replaced.notify_one();
    }

    /// Jobs may have become available in `pool` (`None`: in any pool):
    /// wakes every runner of that pool long-polling here and, through the
    /// store, on the other replicas.
    pub fn wake_runners(&self, pool: Option<&str>) {
        self.waiters.wake_all(pool);
        self.outgoing.add(runway_store::Wake::JobAvailable {
            pool: pool.map(str::to_owned),
        });
    }

    /// `job` was queued (enqueued or requeued): wakes one runner here that
    /// can take it and, through the store, one on each other replica.
    pub fn job_queued(&self, job: &runway_core::Job) {
        if job.state != runway_core::JobState::Queued {
            return;
        }
        self.waiters.job_queued(job);
        if let Some(pool) = &job.pool {
            self.outgoing.add(runway_store::Wake::JobsQueued {
                pool: pool.clone(),
                wanted: crate::app::waiters::wanted(job),
                count: 1,
            });
        }
    }

    /// Asks for a reconcile round now, of the leader wherever it runs.
    pub fn want_reconcile(&self) {
        self.reconcile_wanted.notify_one();
        self.outgoing.add(runway_store::Wake::ReconcileWanted);
    }

    /// The store the reconciler and the GitHub healer act through: fenced
    /// by this replica's latest term; the plain store before it ever led
    /// (and on SQLite, where one process owns the store).
    pub fn leader_store(&self) -> Arc<dyn Store> {
        self.leader_store
            .read()
            .ok()
            .and_then(|store| store.clone())
            .unwrap_or_else(|| self.store.clone())
    }

    /// Sets what this replica knows of its lead (`background::leadership`).
    /// This replica's lease as it stands.
    pub fn lease(&self) -> crate::app::lease::Lease {
        self.lease
            .lock()
            .map(|l| *l)
            .unwrap_or(crate::app::lease::Lease::NotHeld)
    }

    pub fn set_lease(&self, lease: crate::app::lease::Lease) {
        match self.lease.lock() {
            Ok(mut current) => *current = lease,
            Err(poisoned) => *poisoned.into_inner() = lease,
        }
    }

    /// This replica has begun leading in `term`.
    pub fn lead_in(&self, term: i64) {
        let fenced = self
            .store
            .fenced(crate::app::background::LEAD, term)
            .unwrap_or_else(|| self.store.clone());
        if let Ok(mut store) = self.leader_store.write() {
            *store = Some(fenced);
        }
        self.term.store(term, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether this replica may make a side effect outside the store now
    /// (a provider call, a GitHub or scale-set call, a retention pass):
    /// it leads, its lease runs by its own clock, and the store has begun
    /// no later term. Call it right before the call, after waiting for a
    /// provider's lane: what waited behind a hung call is dropped once the
    /// term is over. A refusal is logged and counted
    /// (`runway_fenced_calls_total`).
    pub async fn may_act(&self, operation: &'static str) -> Result<(), crate::app::lease::Deposed> {
        let outcome = self.confirm_lead().await;
        if let Err(reason) = &outcome {
            self.metrics
                .fenced_calls
                .get_or_create(&crate::telemetry::metrics::OperationReasonLabels {
                    operation,
                    reason: reason.code(),
                })
                .inc();
            tracing::warn!(operation, %reason, "not done: this replica cannot show it still leads");
        }
        outcome
    }

    /// Whether this replica leads and its lease still runs by its own
    /// clock, at this instant: what a provider asks right before a call
    /// that changes a cloud (`runway_providers::Fence`). No store read: it
    /// catches a pause or a lost lead between the reconciler's own check
    /// (`may_act`) and the call.
    pub fn may_lead_now(&self) -> Result<(), String> {
        use crate::app::lease::{Deposed, Lease};
        if crate::app::lease::unfenced() {
            return Ok(());
        }
        if !self.is_leader() {
            return Err(Deposed::NotLeading.to_string());
        }
        let lease = self.lease.lock().map(|l| *l).unwrap_or(Lease::NotHeld);
        lease
            .term_at(std::time::Instant::now())
            .map(drop)
            .map_err(|deposed| deposed.to_string())
    }

    async fn confirm_lead(&self) -> Result<(), crate::app::lease::Deposed> {
        use crate::app::lease::{Deposed, Lease};
        if crate::app::lease::unfenced() {
            return Ok(());
        }
        if !self.is_leader() {
            return Err(Deposed::NotLeading);
        }
        let lease = self.lease.lock().map(|l| *l).unwrap_or(Lease::NotHeld);
        let term = match lease.term_at(std::time::Instant::now())? {
            Some(term) => term,
            None => match self.term.load(std::sync::atomic::Ordering::SeqCst) {
                0 => return Ok(()), // Unmanaged and no term: nothing to check.
                term => term,
            },
        };
        match self.store.leader(crate::app::background::LEAD).await {
            Ok(Some(current)) if current.term == term => Ok(()),
            Ok(Some(current)) => Err(Deposed::LaterTerm {
                mine: term,
                current: current.term,
            }),
            Ok(None) => Err(Deposed::Unconfirmed("no term is recorded".into())),
            Err(error) => Err(Deposed::Unconfirmed(error.to_string())),
        }
    }

    /// Whether this replica runs the reconciler and the GitHub healer now.
    pub fn is_leader(&self) -> bool {
        self.leading.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// What the configured providers declare, for worker-configuration checks.
    pub fn schemas(&self) -> Schemas {
        self.config().schemas()
    }

    /// Whether `runner` is stopped once its job is over: a runner of an
    /// ephemeral pool that a provider of runway's made (one that registered
    /// itself, or GitHub's, is not runway's to stop).
    pub fn stops_after_its_job(&self, runner: &runway_core::Runner) -> bool {
        let ephemeral = self
            .config()
            .pool(&runner.pool)
            .is_some_and(|p| p.ephemeral);
        let provider_made = matches!(
            runner.origin(),
            runway_core::RunnerOrigin::Provisioned { .. }
        );
        ephemeral && provider_made
    }

    /// After a job's move changed its runner: a runner now stopping has its
    /// instance deleted in the reconciler's next round, which is now.
    pub fn runner_moved(&self, runner: Option<&runway_core::Runner>) {
        if matches!(runner, Some(r) if r.state == runway_core::RunnerState::Terminating) {
            self.want_reconcile();
        }
        // A runner long-polling here that takes no more work hears it now,
        // not at its poll's end (one on another replica does then).
        if let Some(runner) = runner.filter(|r| {
            r.draining || r.state == runway_core::RunnerState::Terminating || r.state.is_terminal()
        }) {
            self.waiters.wake_runner(runner.id);
        }
    }

    /// A runner's job is over: it becomes idle, and in an `ephemeral` pool a
    /// runner runway started through a provider is then terminated (the
    /// reconciler deletes its instance). Registered runners manage their own
    /// lifetime (`runway agent --once`). Bookkeeping: failures are logged.
    pub async fn finish_runner_job(&self, runner: RunnerId, now: Timestamp) {
        let finished = match self
            .store
            .apply_runner_event(runner, &RunnerEvent::JobFinished, now)
            .await
        {
            Ok(finished) => finished,
            Err(error) => {
                tracing::debug!(%error, runner = %runner, "runner bookkeeping skipped");
                return;
            }
        };
        if self.stops_after_its_job(&finished) || finished.draining {
            match self
                .store
                .apply_runner_event(runner, &RunnerEvent::TerminateRequested, now)
                .await
            {
                // Its instance is deleted in the reconciler's next round: now.
                Ok(_) => self.want_reconcile(),
                Err(error) => {
                    tracing::debug!(%error, runner = %runner, "ephemeral runner not terminated")
                }
            }
        }
    }

    /// A job was routed to a pool: wake the reconciler. (The predictive
    /// policy learns arrivals from the store, where every replica's land.)
    pub fn job_arrived(&self) {
        self.want_reconcile();
    }

    /// Writes the worker configurations of the config file into the store,
    /// replacing what is stored under the same ids: the file is the source
    /// of truth at start-up.
    pub async fn install_worker_configs(&self) -> Result<(), StoreError> {
        for config in &self.config().worker_configs {
            let body =
                serde_json::to_string(&WorkerConfigDto::from_core(config)).unwrap_or_default();
            // A restart or reload that leaves it as it was keeps its
            // version: launch configurations and the console's history
            // name versions, and a bump would say it changed.
            let stored = self.store.get_worker_config(&config.id).await?;
            let mut pools = config.pools.clone();
            pools.sort();
            if stored.is_some_and(|stored| {
                let mut stored_pools = stored.pools.clone();
                stored_pools.sort();
                stored.body == body && stored_pools == pools
            }) {
                continue;
            }
            self.store
                .put_worker_config(&config.id, &body, &config.pools, Expect::Any, now())
                .await?;
            self.evaluations.forget_all();
        }
        Ok(())
    }
}
