//! runway's durable store.
//!
//! # What do we store?
//!
//! - **jobs**: every job runway has heard of, one row per (source, external
//!   id), in whatever state the job state machine of `runway_core::job` has
//!   put it. The rows of state `queued` form one FIFO queue per pool, ordered
//!   by `enqueued_at` (then id). A claim binds a job to a runner under a lease
//!   deadline; the lease sweeper puts jobs whose deadline passed back at the
//!   tail.
//! - **runners**: every runner runway created or saw, with its pool,
//!   provider, provider instance id, bound job and the time of each
//!   transition of the runner state machine.
//!
//! Everything else (pool configuration, provider caches, metrics) is rebuilt
//! at start-up.
//!
//! # How changes are made
//!
//! Every change except enqueue and claim is *read, decide, compare-and-set*:
//! the store reads the row, [`runway_core`] decides the next value, and the
//! store writes it only if the row's `version` is still the one it read. So
//! the state machine has one definition, in `core`, and concurrent writers
//! (several replicas on PostgreSQL) never overwrite each other's transitions.
//! Claims are a single statement (`FOR UPDATE SKIP LOCKED` on PostgreSQL, the
//! single writer connection on SQLite) because they are the contended path.
//!
//! Time is always a parameter (`now`); no statement reads a clock.

mod common;
mod group_commit;
mod held;
mod postgres;
mod rows;
pub mod seed;
mod sql;
mod sqlite;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use runway_core::job::NewJob;
use runway_core::runner::NewRunner;
use runway_core::{
    Conclusion, Job, JobEvent, JobId, JobSource, JobState, JobTransitionError, Runner, RunnerEvent,
    RunnerId, RunnerState, RunnerTransitionError, Timestamp,
};

pub use common::{queue_times, FINISHED_JOB, LIVE_JOB, LIVE_RUNNER, REGISTERED_ENDED_RUNNER};
pub use postgres::{PostgresDialect, PostgresStore};
pub use sql::{Dialect, SqlStore};
pub use sqlite::{SqliteDialect, SqliteStore};

/// How many times a read-decide-write loses a race before we give up. Each
/// loss means another writer made progress on the same row, so this is only
/// reached under pathological contention.
const MAX_COMPARE_AND_SET_ATTEMPTS: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("invalid database URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("cannot open {target}: {reason}")]
    Open { target: String, reason: String },
    #[error("cannot migrate {target}: {reason}")]
    Migrate { target: String, reason: String },
    #[error("{target} is not ready: {reason}")]
    NotReady { target: String, reason: String },
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("stored row is corrupt: {0}")]
    Corrupt(String),
    #[error("job {0} not found")]
    JobNotFound(JobId),
    #[error("runner {0} not found")]
    RunnerNotFound(RunnerId),
    #[error("a runner named {0:?} already exists")]
    DuplicateRunnerName(String),
    #[error(transparent)]
    JobTransition(#[from] JobTransitionError),
    #[error(transparent)]
    RunnerTransition(#[from] RunnerTransitionError),
    #[error("worker configuration {id:?} is at version {current:?}, not the expected {expected}")]
    VersionConflict {
        id: String,
        expected: i64,
        current: Option<i64>,
    },
    #[error("pool {pool:?} already belongs to worker configuration {owner:?}")]
    PoolTaken { pool: String, owner: String },
    #[error("the token is unknown, used or expired")]
    InvalidToken,
    #[error("the store is shut down")]
    Closed,
    #[error("{what} kept changing under us ({MAX_COMPARE_AND_SET_ATTEMPTS} attempts); try again")]
    Contention { what: String },
}

impl StoreError {
    /// Whether a fenced store refused the write: its leadership term is
    /// over (`Store::fenced`).
    pub fn is_fenced(&self) -> bool {
        matches!(self, StoreError::Database(sqlx::Error::Database(error))
            if error.code().as_deref() == Some("RW001"))
    }

    /// Whether the same call may succeed if simply made again later.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Database(error) => matches!(
                error,
                sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed
            ),
            StoreError::Contention { .. } | StoreError::NotReady { .. } => true,
            _ => false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The outcome of an enqueue: the stored job, and whether this call created
/// it (false when the same (source, external id) was already stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enqueued {
    pub job: Job,
    pub created: bool,
}

/// A runner asking for up to `limit` jobs of `pool`, under a lease of
/// `lease` from the moment of the claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub pool: String,
    pub runner: RunnerId,
    pub limit: u32,
    pub lease: Duration,
    /// Only jobs whose labels are all among these (case-insensitively);
    /// `None` takes any job of the pool.
    pub runner_labels: Option<Vec<String>>,
    /// Passes over a job whose share key already has this many jobs
    /// provisioning or running in the pool; `None` for no cap. Two claims
    /// on PostgreSQL at the same moment may each take a key's last place.
    pub max_running_per_key: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobFilter {
    pub state: Option<JobState>,
    pub pool: Option<String>,
    /// At most this many; `None` for all.
    pub limit: Option<u32>,
    /// Newest (highest id) first instead of queue order (oldest `enqueued_at` first).
    pub newest_first: bool,
    /// Oldest (lowest id) first instead of queue order, when not
    /// `newest_first`: a listing read back towards newer jobs (`after`).
    pub oldest_first: bool,
    /// Only jobs with an id below this one: the cursor of a newest-first listing.
    pub before: Option<JobId>,
    /// Only jobs with an id above this one: what is new since a listing
    /// (ids follow insertion; on PostgreSQL a transaction that commits
    /// late can land below an id already read).
    pub after: Option<JobId>,
}

/// One webhook delivery, recorded for deduplication and analysis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// `X-GitHub-Delivery`: unique per delivery, the same on a redelivery.
    pub id: String,
    pub event: String,
    pub action: Option<String>,
    /// The job the delivery was about, if any.
    pub external_id: Option<String>,
    pub outcome: String,
    pub received_at: Timestamp,
}

/// A worker configuration as stored: its JSON body is parsed and checked by
/// the caller; the store keeps versions and pool ownership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredWorkerConfig {
    pub id: String,
    pub version: i64,
    pub body: String,
    pub pools: Vec<String>,
    pub updated_at: Timestamp,
}

/// The precondition of a worker-configuration write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Write whatever is stored (or create).
    Any,
    /// Only if the stored version is this one.
    Version(i64),
}

/// The prefix of the once-key that marks a runner's crash counted.
pub const CRASH_KEY: &str = "runner_crashed:";

/// The once-key ([`Store::claim_once`]) that marks `runner`'s crash as
/// counted, whoever saw it first (the reconciler, or a pre-job report
/// with no post-job report): a crash is counted once.
pub fn crash_key(runner: RunnerId) -> String {
    format!("{CRASH_KEY}{}", runner.0)
}

/// What retention prunes: finished rows of one kind, oldest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Prunable {
    /// Completed, failed, cancelled and unroutable jobs (with their logs),
    /// by when they finished.
    FinishedJobs,
    /// Terminated, failed and crashed runners (with their reports and
    /// instance tokens), by when they ended.
    EndedRunners,
    /// Webhook deliveries, by when they arrived.
    Deliveries,
    /// The output of finished jobs, by when the job finished.
    JobLogs,
    /// What runners and their machines reported, by when.
    RunnerReports,
    /// Once-keys (work done once, such as a redelivery), by when.
    OnceKeys,
    /// GARM instance tokens, by when they expired.
    InstanceTokens,
    /// The audit trail, by when.
    Audit,
    /// The fleet's sampled history (`PoolSample`), by its minute.
    PoolHistory,
}

impl Prunable {
    pub const ALL: [Prunable; 9] = [
        Prunable::FinishedJobs,
        Prunable::EndedRunners,
        Prunable::Deliveries,
        Prunable::JobLogs,
        Prunable::RunnerReports,
        Prunable::OnceKeys,
        Prunable::InstanceTokens,
        Prunable::Audit,
        Prunable::PoolHistory,
    ];

    /// The table whose rows it deletes (and counts).
    pub fn table(self) -> &'static str {
        match self {
            Prunable::FinishedJobs => "jobs",
            Prunable::EndedRunners => "runners",
            Prunable::Deliveries => "deliveries",
            Prunable::JobLogs => "job_logs",
            Prunable::RunnerReports => "runner_reports",
            Prunable::OnceKeys => "once_keys",
            Prunable::InstanceTokens => "instance_tokens",
            Prunable::Audit => "audit",
            Prunable::PoolHistory => "pool_samples",
        }
    }
}

/// What redeeming a registration token made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub runner: Runner,
    /// The same attempt asked again (its first answer was lost): the
    /// runner registered then, now with the new runner token.
    pub repeated: bool,
}

/// A GARM instance token's record (only its hash is stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceToken {
    pub runner: RunnerId,
    pub expires_at: Timestamp,
    /// The runner's JIT configuration files (JSON object of file name to
    /// base64 contents), for a GitHub pool's runner.
    pub jit_files: Option<String>,
    /// Whether its one registration token was handed out.
    pub token_fetched: bool,
}

/// One share key's live jobs in a pool (`Store::share_counts`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareCount {
    pub key: String,
    pub queued: u64,
    /// Provisioning or running: what the cap on a key's running jobs counts.
    pub active: u64,
}

impl ShareCount {
    /// Each key's jobs provisioning or running: what the cap on a key's
    /// running jobs counts (`runway_core::planner::hold_by_cap`).
    pub fn active_by_key(counts: &[ShareCount]) -> std::collections::HashMap<String, u32> {
        counts
            .iter()
            .map(|c| (c.key.clone(), u32::try_from(c.active).unwrap_or(u32::MAX)))
            .collect()
    }
}

/// How many jobs a pool has in one state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobCount {
    pub pool: Option<String>,
    pub state: JobState,
    pub count: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunnerFilter {
    pub state: Option<RunnerState>,
    pub pool: Option<String>,
}

/// What a job's move does to its runner: given the job before and after
/// the event, the runner's current row and the time, its next row (`None`
/// leaves it as it is), or an error that refuses the whole move. A pure
/// decision: no I/O, time passed in.
pub type RunnerChange<'a> = &'a (dyn Fn(&Job, &Job, &Runner, Timestamp) -> Result<Option<Runner>, StoreError>
         + Send
         + Sync);

/// The result of [`Store::move_job_and_runner`]: the job as stored, and its
/// runner as stored (changed or not), if it has a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    pub job: Job,
    pub runner: Option<Runner>,
}

/// [`Store::complete_and_start_next`] as two writes: the completion, then,
/// if it applied and the runner can start a job, a claim that starts one.
pub(crate) async fn complete_then_start<S: Store + ?Sized>(
    store: &S,
    id: JobId,
    change: &runway_core::GuardedChange,
    runner: (&Runner, &Runner),
    log: Option<(Option<i64>, &str)>,
    claim: &Claim,
    now: Timestamp,
) -> Result<Option<(Moved, Option<Job>)>, StoreError> {
    let Some(done) = store
        .apply_guarded_with_runner(id, change, runner, log)
        .await?
    else {
        return Ok(None);
    };
    if runway_core::moves::start_on_claim(runner.1, now).is_err() {
        return Ok(Some((done, None)));
    }
    match store.claim_and_start(claim, runner.1, now).await? {
        ClaimStart::Started(next) => Ok(Some((
            Moved {
                job: done.job,
                runner: next.runner,
            },
            Some(next.job),
        ))),
        ClaimStart::NoJob | ClaimStart::RunnerChanged(_) => Ok(Some((done, None))),
    }
}

/// What [`Store::claim_and_start`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimStart {
    /// A job started on the runner: both rows as stored.
    Started(Box<Moved>),
    /// No queued job the runner can serve; nothing changed.
    NoJob,
    /// The runner changed since the caller read it; nothing was written.
    /// Its row as stored now.
    RunnerChanged(Box<Runner>),
}

/// One job [`Store::expire_leases`] moved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredLease {
    /// The job as it was.
    pub was: Job,
    /// The job as stored now: queued again, or failed at `max_attempts`.
    pub job: Job,
    /// Its runner as stored now, if it has a record.
    pub runner: Option<Runner>,
    /// Whether this sweep marked that runner crashed.
    pub runner_crashed: bool,
}

/// Connection settings that are not part of the URL.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// PostgreSQL pool size (SQLite always has one writer and a few readers).
    pub max_connections: u32,
    /// How long to wait for the database at start-up before giving up.
    pub connect_timeout: Duration,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            max_connections: 16,
            connect_timeout: Duration::from_secs(5),
        }
    }
}

/// Held by the one replica that leads (runs the reconciler and the GitHub
/// healer). Dropping it gives up the lead.
#[async_trait]
pub trait Leadership: Send + Sync {
    /// Whether the lead is still held: on PostgreSQL, whether the session
    /// holding the advisory lock is alive.
    async fn still_held(&mut self) -> bool;

    /// Whether no other process can have held the lead while this one
    /// did not (SQLite: one process owns the file). A shared lead's new
    /// holder waits out the lease a previous holder may still believe it
    /// has before its first side effect outside the store.
    fn exclusive(&self) -> bool {
        false
    }
}

/// A wake-up one replica sends the others through the store: a job may be
/// waiting for their long-polling runners, or the leader should reconcile.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Wake {
    /// A job may be waiting in `pool`; `None`: in any pool (wake every
    /// long-polling runner).
    JobAvailable {
        pool: Option<String>,
    },
    /// `count` jobs were queued in `pool`, each wanting `wanted`: a replica
    /// wakes up to `count` of its runners of that pool that can take one
    /// (not every runner of the pool, who would all pay a claim for it).
    JobsQueued {
        pool: String,
        wanted: Wanted,
        count: u32,
    },
    ReconcileWanted,
}

/// What a queued job asks of a runner, as a wake-up carries it: its
/// labels, lowercase, and the runners it excluded (it declined them).
#[derive(
    Debug,
    Clone,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
pub struct Wanted {
    pub labels: Vec<String>,
    pub excluded: Vec<i64>,
}

/// [`Wake::JobsQueued`] on the wire: `queued ` and this as JSON.
#[derive(serde::Serialize, serde::Deserialize)]
struct QueuedWire {
    pool: String,
    labels: Vec<String>,
    excluded: Vec<i64>,
    count: u32,
}

/// Longest text a wake-up is sent as; a longer one of jobs queued in a
/// pool wakes the whole pool instead (a NOTIFY payload holds at most 8,000
/// bytes, and the sender's replica name goes with it).
const WAKE_TEXT_MAX: usize = 6_000;

/// Longest pool name a wake-up names; a longer one wakes every pool (a
/// NOTIFY payload holds at most 8,000 bytes).
const WAKE_POOL_MAX: usize = 1024;

impl Wake {
    /// A job may be waiting in `pool`.
    pub fn job_in(pool: &str) -> Wake {
        Wake::JobAvailable {
            pool: Some(pool.to_owned()),
        }
    }

    /// A job may be waiting in any pool.
    pub fn job_anywhere() -> Wake {
        Wake::JobAvailable { pool: None }
    }

    /// The kind of wake-up, for metrics: `job` or `reconcile`.
    pub fn kind(&self) -> &'static str {
        match self {
            Wake::JobAvailable { .. } | Wake::JobsQueued { .. } => "job",
            Wake::ReconcileWanted => "reconcile",
        }
    }

    /// The wake-up as text: `job`, `job <pool>` (the pool is the rest, spaces
    /// and all), `queued <JSON: pool, labels, excluded, count>` or
    /// `reconcile`. Jobs queued with more labels or exclusions than a
    /// notification holds are sent as `job <pool>` (every runner of the
    /// pool looks), a pool name too long as `job` (every runner looks).
    pub fn encode(&self) -> String {
        match self {
            Wake::JobAvailable { pool: Some(pool) } if pool.len() <= WAKE_POOL_MAX => {
                format!("job {pool}")
            }
            Wake::JobsQueued { pool, .. } if pool.len() > WAKE_POOL_MAX => {
                Wake::job_anywhere().encode()
            }
            Wake::JobsQueued {
                pool,
                wanted,
                count,
            } => {
                let wire = QueuedWire {
                    pool: pool.clone(),
                    labels: wanted.labels.clone(),
                    excluded: wanted.excluded.clone(),
                    count: *count,
                };
                match serde_json::to_string(&wire) {
                    Ok(json) if json.len() < WAKE_TEXT_MAX => format!("queued {json}"),
                    _ => Wake::job_in(pool).encode(),
                }
            }
            other => other.kind().to_owned(),
        }
    }

    /// [`Wake::encode`]'s text back; `None` for anything else.
    pub fn parse(text: &str) -> Option<Wake> {
        match text {
            "job" => Some(Wake::job_anywhere()),
            "reconcile" => Some(Wake::ReconcileWanted),
            _ => {
                if let Some(json) = text.strip_prefix("queued ") {
                    let wire: QueuedWire = serde_json::from_str(json).ok()?;
                    return Some(Wake::JobsQueued {
                        pool: wire.pool,
                        wanted: Wanted {
                            labels: wire.labels,
                            excluded: wire.excluded,
                        },
                        count: wire.count,
                    });
                }
                text.strip_prefix("job ").map(Wake::job_in)
            }
        }
    }
}

/// What a [`WakeListener`] heard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heard {
    /// `wake`, announced by the replica `from`.
    Wake { from: String, wake: Wake },
    /// The listening connection was lost (it reconnects on the next call):
    /// wake-ups may have been missed meanwhile.
    Lost,
}

/// Wake-ups announced by other replicas (`Store::listen`).
#[async_trait]
pub trait WakeListener: Send {
    async fn next(&mut self) -> Result<Heard, StoreError>;
}

/// A pool an operator paused: no runner is started for it until resumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PausedPool {
    pub pool: String,
    /// The name of the token that paused it.
    pub by: String,
    pub at: Timestamp,
}

/// One pool at one minute: the fleet's history, sampled by the leader
/// (the console's charts). A bounded time series: one row a pool a
/// minute, pruned by `[retention] pool_history`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSample {
    pub pool: String,
    /// The minute the sample stands for (its start).
    pub at: Timestamp,
    /// Jobs queued, and jobs provisioning or running.
    pub queued: i64,
    pub running: i64,
    /// Runners requested or provisioning, idle, busy.
    pub booting: i64,
    pub idle: i64,
    pub busy: i64,
    /// Jobs that started in the minute, and their queue times' median and
    /// 95th percentile (none without a start).
    pub started: i64,
    pub wait_p50_ms: Option<i64>,
    pub wait_p95_ms: Option<i64>,
    /// Runner time paid for in the minute (every live runner, booting
    /// included), and its price in millionths of the providers' currency.
    pub runner_seconds: i64,
    pub cost_micros: i64,
    /// Queued jobs by the reason they wait (the planner's code).
    pub waits: Vec<(String, i64)>,
}

/// Pool samples merged into one bucket of a chart.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolHistoryPoint {
    pub pool: String,
    /// The bucket's start.
    pub at: Timestamp,
    /// How many minute samples it merges.
    pub samples: i64,
    /// Means over the bucket's samples.
    pub queued: f64,
    pub running: f64,
    pub booting: f64,
    pub idle: f64,
    pub busy: f64,
    pub started: i64,
    /// The samples' medians weighted by their starts; the highest 95th
    /// percentile (a bucket's own cannot be had from its samples').
    pub wait_p50_ms: Option<i64>,
    pub wait_p95_ms: Option<i64>,
    pub runner_seconds: i64,
    pub cost_micros: i64,
}

/// One entry of the audit trail: who changed what, when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEntry {
    /// Its place in the trail; 0 for an entry not yet stored.
    pub id: i64,
    pub at: Timestamp,
    /// The name of the admin token (or `signal` for a SIGHUP reload).
    pub actor: String,
    /// What was done: `job.cancel`, `runner.drain`, `pool.pause`, `config.reload`…
    pub action: String,
    /// What it was done to: `job 12`, `runner 3`, `pool linux`, `config`.
    pub target: String,
    /// JSON: the outcome and anything the action adds.
    pub details: String,
}

/// A replica sharing the store, as its heartbeat recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    pub id: String,
    pub address: String,
    pub version: String,
    pub started_at: Timestamp,
    pub heartbeat_at: Timestamp,
}

/// The latest leader of a name and its term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderTerm {
    /// Empty once the term's holder released it (`Store::end_term`): it
    /// stopped making side effects before it let go of the lock.
    pub replica: String,
    pub term: i64,
    pub since: Timestamp,
}

/// SQLite: one process owns the file, so it always leads.
pub struct SoleLeader;

#[async_trait]
impl Leadership for SoleLeader {
    async fn still_held(&mut self) -> bool {
        true
    }

    fn exclusive(&self) -> bool {
        true
    }
}

/// The durable job and runner store. See the crate docs for what it holds.
///
/// Implementations provide the primitive operations; the state transitions
/// (`apply_job_event`, `expire_leases`, …) are provided on top of them and
/// are the same for every backend.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    fn backend(&self) -> Backend;

    /// Whether the database answers and every migration has been applied.
    async fn check_ready(&self) -> Result<(), StoreError>;

    /// Tries to become the leader for `name` among the processes sharing
    /// this store; `None` while another holds it.
    /// The lead is lost if its holder says nothing (`Leadership::still_held`)
    /// for `silence`: a paused or cut-off leader cannot block the others.
    async fn try_lead(
        &self,
        name: &str,
        silence: Duration,
    ) -> Result<Option<Box<dyn Leadership>>, StoreError>;

    /// This store for the leader of `name` in `term`: its writes to runners
    /// and once-keys are refused (`StoreError::is_fenced`) once a later
    /// term has begun, checked in the writing transaction. `None` where one
    /// process owns the store (SQLite): there is no one to fence out.
    fn fenced(&self, name: &str, term: i64) -> Option<Arc<dyn Store>> {
        let _ = (name, term);
        None
    }

    /// Records `replica` as alive now (insert or update) and forgets the
    /// replicas not heard from since `forget_before`.
    async fn heartbeat_replica(
        &self,
        replica: &Replica,
        forget_before: Timestamp,
    ) -> Result<(), StoreError>;

    /// The replicas heard from since `seen_since`, oldest first.
    async fn replicas(&self, seen_since: Timestamp) -> Result<Vec<Replica>, StoreError>;

    /// Starts a new term of leadership for `name`, held by `replica`: one
    /// more than the last (1 for the first). Called by a replica that has
    /// just taken the lead (`try_lead`); the term fences its actions.
    async fn begin_term(
        &self,
        name: &str,
        replica: &str,
        now: Timestamp,
    ) -> Result<i64, StoreError>;

    /// Records that `term` of `name` was given up by its holder, which
    /// makes no side effect from here on (a graceful shutdown): the next
    /// holder need not wait out its lease. No change when a later term
    /// has begun.
    async fn end_term(&self, name: &str, term: i64) -> Result<(), StoreError>;

    /// The latest leader of `name` and its term, if there was one.
    async fn leader(&self, name: &str) -> Result<Option<LeaderTerm>, StoreError>;

    /// Tells the other replicas sharing this store about `wakes`, as
    /// replica `from`. A no-op where one process owns the store (SQLite).
    async fn announce(&self, from: &str, wakes: &[Wake]) -> Result<(), StoreError> {
        let _ = (from, wakes);
        Ok(())
    }

    /// Listens for the wake-ups replicas announce; `None` where one process
    /// owns the store (SQLite).
    async fn listen(&self) -> Result<Option<Box<dyn WakeListener>>, StoreError> {
        Ok(None)
    }

    /// Stores a new job, or returns the one already stored under the same
    /// (source, external id). Durable when it returns.
    async fn enqueue(&self, job: &NewJob, now: Timestamp) -> Result<Enqueued, StoreError> {
        Ok(self.enqueue_with_delivery(job, None, now).await?.0)
    }

    /// [`Store::enqueue`], recording `delivery` in the same transaction, so
    /// a delivery is never marked seen without its job, nor the reverse.
    /// The flag says whether the delivery was new (false for a redelivery,
    /// and when there is no delivery).
    async fn enqueue_with_delivery(
        &self,
        job: &NewJob,
        delivery: Option<&Delivery>,
        now: Timestamp,
    ) -> Result<(Enqueued, bool), StoreError>;

    /// Whether a delivery with this id was recorded.
    async fn delivery_seen(&self, id: &str) -> Result<bool, StoreError>;

    /// Records a delivery; false if one with the same id was already recorded.
    async fn record_delivery(&self, delivery: &Delivery) -> Result<bool, StoreError>;

    /// [`Store::enqueue`] for many jobs in one transaction; results in input order.
    async fn enqueue_many(
        &self,
        jobs: &[NewJob],
        now: Timestamp,
    ) -> Result<Vec<Enqueued>, StoreError>;

    /// Takes up to `claim.limit` of the oldest queued jobs of the pool that
    /// have not excluded the runner, binding them to it under a lease, in one
    /// statement. Concurrent claims never return the same job.
    async fn claim(&self, claim: &Claim, now: Timestamp) -> Result<Vec<Job>, StoreError>;

    /// A claim that starts its job at once (the one-step start of the
    /// runner API): the oldest queued job of `claim.pool` that the runner
    /// can serve becomes `running` on it under `claim.lease` (what a claim
    /// and its accept would make of it, both in its history), and the
    /// runner becomes busy with it ([`runway_core::moves::start_on_claim`],
    /// refused before anything is written when the runner cannot start a
    /// job) — in one transaction, one statement on PostgreSQL. `runner` is
    /// the caller's view of the runner; if the stored row has moved on,
    /// nothing is written and the fresh row is returned to decide again.
    /// `claim.runner` and `claim.limit` are taken as `runner.id` and 1.
    async fn claim_and_start(
        &self,
        claim: &Claim,
        runner: &Runner,
        now: Timestamp,
    ) -> Result<ClaimStart, StoreError>;

    /// Applies `change` to job `id` and writes `runner.1` over `runner.0`
    /// (if the stored runner still has `runner.0`'s version) and, given, the
    /// job's log (exit code, text), all in one transaction — one statement
    /// on PostgreSQL: the hot path of a move of a job and its runner whose
    /// decision needs no read (an accept, a completion). `None`, and nothing
    /// written, when the job's guard or the runner's version does not hold;
    /// the caller then takes the general path
    /// ([`Store::move_job_and_runner`]), where the state machine decides.
    async fn apply_guarded_with_runner(
        &self,
        id: JobId,
        change: &runway_core::GuardedChange,
        runner: (&Runner, &Runner),
        log: Option<(Option<i64>, &str)>,
    ) -> Result<Option<Moved>, StoreError>;

    /// A holder's completion and its runner's next job in one write: what
    /// [`Store::apply_guarded_with_runner`] writes for `change` (the job
    /// ended, the runner moved from `runner.0` to `runner.1`, the log
    /// stored), then, if `runner.1` can start a job
    /// ([`runway_core::moves::start_on_claim`]), what
    /// [`Store::claim_and_start`] writes for `claim` from `runner.1`: the
    /// oldest job the runner can serve running on it, the runner busy with
    /// it. Returns the ended job with the runner's final row, and the
    /// started job if there was one; `None`, with nothing written, when the
    /// completion's guard or the runner's version does not hold (the caller
    /// takes the general path). One statement on PostgreSQL, one
    /// transaction of the group commit on SQLite: either way a runner that
    /// works through a queue pays one commit a job, and the completion and
    /// the start land together. This default writes the two one after the
    /// other (each is a whole move: a crash between them leaves the runner
    /// idle after its finished job).
    async fn complete_and_start_next(
        &self,
        id: JobId,
        change: &runway_core::GuardedChange,
        runner: (&Runner, &Runner),
        log: Option<(Option<i64>, &str)>,
        claim: &Claim,
        now: Timestamp,
    ) -> Result<Option<(Moved, Option<Job>)>, StoreError> {
        complete_then_start(self, id, change, runner, log, claim, now).await
    }

    async fn get_job(&self, id: JobId) -> Result<Option<Job>, StoreError>;

    /// The stored ones of `ids`, in id order (missing ones left out).
    async fn get_jobs(&self, ids: &[JobId]) -> Result<Vec<Job>, StoreError>;

    /// Job `id`'s history, oldest first, starting with the step that
    /// created it; `None` when there is no such job.
    async fn job_history(&self, id: JobId)
        -> Result<Option<Vec<runway_core::JobStep>>, StoreError>;

    /// Pauses (`Some(by)`) or resumes (`None`) `pool`; true when that
    /// changed something.
    async fn set_pool_paused(
        &self,
        pool: &str,
        by: Option<&str>,
        now: Timestamp,
    ) -> Result<bool, StoreError>;

    /// Every paused pool.
    async fn paused_pools(&self) -> Result<Vec<PausedPool>, StoreError>;

    /// Records each pool's sample of one minute, with its wait reasons
    /// (a sample already recorded for that pool and minute is replaced).
    async fn record_pool_samples(&self, samples: &[PoolSample]) -> Result<(), StoreError>;

    /// The samples since `since` (of `pool`, or of every pool), merged
    /// into buckets of `bucket` (aligned to multiples of it), by pool then
    /// time. Reads the bounded series, never the jobs' history.
    async fn pool_history(
        &self,
        pool: Option<&str>,
        since: Timestamp,
        bucket: Duration,
    ) -> Result<Vec<PoolHistoryPoint>, StoreError>;

    /// Job-minutes waited since `since` in `pool`, by wait reason, most
    /// first.
    async fn pool_waits(
        &self,
        pool: &str,
        since: Timestamp,
    ) -> Result<Vec<(String, i64)>, StoreError>;

    /// Appends `entry` to the audit trail (its id is given by the store).
    async fn add_audit(&self, entry: &AuditEntry) -> Result<(), StoreError>;

    /// The audit trail, newest first: at most `limit` entries older than
    /// the entry `before` (all, without it).
    async fn list_audit(
        &self,
        limit: u32,
        before: Option<i64>,
    ) -> Result<Vec<AuditEntry>, StoreError>;

    async fn find_job(
        &self,
        source: JobSource,
        external_id: &str,
    ) -> Result<Option<Job>, StoreError>;

    async fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<Job>, StoreError>;

    /// How long each job that started at or after `since` waited in its
    /// queue (`started_at - enqueued_at`), with its pool: at most `limit`,
    /// newest first. Read through the `started_at` index, so the cost
    /// follows the window, not the history.
    async fn queue_times(
        &self,
        since: Timestamp,
        limit: u32,
    ) -> Result<Vec<(String, Duration)>, StoreError>;

    /// Live job counts (queued, provisioning, running) per (pool, state),
    /// for status pages: read through the state index, so their cost
    /// follows live work, not history.
    async fn live_job_counts(&self) -> Result<Vec<JobCount>, StoreError>;

    /// How many jobs wait in `pool`'s queue (read through the queue's
    /// index: the reconciler asks once per round for a pool whose queue is
    /// deeper than it lists).
    async fn queued_count(&self, pool: &str) -> Result<u64, StoreError>;

    /// Each share key with live jobs in `pool`: its queued and its
    /// provisioning or running jobs. Reads live rows only.
    async fn share_counts(&self, pool: &str) -> Result<Vec<ShareCount>, StoreError>;

    /// Jobs whose lease deadline is at or before `now`, earliest first.
    async fn jobs_with_expired_leases(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> Result<Vec<Job>, StoreError>;

    /// Writes `next` over `current` if the stored row still has
    /// `current.version`; false if someone else changed it first.
    async fn replace_job(&self, current: &Job, next: &Job) -> Result<bool, StoreError>;

    /// Applies `change` to job `id` in one statement if its guard holds;
    /// the job after it, or `None` (nothing written) if it does not.
    async fn apply_guarded(
        &self,
        id: JobId,
        change: &runway_core::GuardedChange,
    ) -> Result<Option<Job>, StoreError>;

    /// Writes a job and its runner in one transaction: both only if each
    /// stored row still has the version of its `current`; false, and
    /// nothing written, otherwise. `None` for the runner is
    /// [`Store::replace_job`].
    async fn replace_job_and_runner(
        &self,
        job: (&Job, &Job),
        runner: Option<(&Runner, &Runner)>,
    ) -> Result<bool, StoreError>;

    async fn create_runner(&self, runner: &NewRunner, now: Timestamp)
        -> Result<Runner, StoreError>;

    async fn get_runner(&self, id: RunnerId) -> Result<Option<Runner>, StoreError>;

    async fn find_runner(&self, name: &str) -> Result<Option<Runner>, StoreError>;

    async fn list_runners(&self, filter: &RunnerFilter) -> Result<Vec<Runner>, StoreError>;

    /// The live (not terminal) runners, of `pool` if given, oldest first.
    /// Read through the `runners_live` partial index, so its cost follows
    /// live runners, not every runner ever recorded: what runs per round
    /// or per request uses this, never [`Store::list_runners`].
    async fn list_live_runners(&self, pool: Option<&str>) -> Result<Vec<Runner>, StoreError>;

    /// Compare-and-set for runners, as [`Store::replace_job`].
    async fn replace_runner(&self, current: &Runner, next: &Runner) -> Result<bool, StoreError>;

    /// Stores a one-time registration token (its hash) for `pool`; bound to
    /// `runner` when the reconciler minted it for a record it created.
    async fn create_registration_token(
        &self,
        token_hash: &str,
        pool: &str,
        runner: Option<RunnerId>,
        expires_at: Timestamp,
        now: Timestamp,
    ) -> Result<(), StoreError>;

    /// Redeems a registration token and, in one transaction, creates the
    /// runner it admits (or, for a bound token, marks the bound record
    /// ready), with its own token (hash). `InvalidToken` when the
    /// registration token is unknown, used or expired, or its bound record
    /// is no longer waiting for its runner.
    ///
    /// `attempt_hash` (the hash of a key the registering agent made for
    /// this one registration) makes the registration repeatable: the same
    /// token and attempt asked again while the token is unexpired, and the
    /// runner it registered is still idle with no job ever, name and
    /// labels the same, give that runner again with `runner_token_hash` as
    /// its token (the earlier one, whose answer was lost, no longer works).
    async fn register_runner(
        &self,
        registration_token_hash: &str,
        attempt_hash: Option<&str>,
        name: &str,
        labels: &[String],
        runner_token_hash: &str,
        now: Timestamp,
    ) -> Result<Registration, StoreError>;

    /// The installation-wide value of `key`: `candidate` the first time it
    /// is asked (stored then), the stored value ever after, whichever
    /// replica asks first (ids of the installation, say).
    async fn init_setting(&self, key: &str, candidate: &str) -> Result<String, StoreError>;

    async fn find_runner_by_token(&self, token_hash: &str) -> Result<Option<Runner>, StoreError>;

    /// Gives runner `runner` the token (hash) it authenticates with,
    /// replacing any it had: for a runner that does not register itself
    /// (a GitHub pool's just-in-time runner), the report token it is
    /// started with.
    async fn set_runner_token(&self, runner: RunnerId, token_hash: &str) -> Result<(), StoreError>;

    /// An installation-wide value (a cursor, say), if one was stored.
    async fn get_setting(&self, key: &str) -> Result<Option<String>, StoreError>;

    /// Stores (replacing) an installation-wide value.
    async fn put_setting(&self, key: &str, value: &str) -> Result<(), StoreError>;

    /// Claims `key` for something to be done at most once: true for the
    /// first caller (in any process sharing the store), false ever after,
    /// until the claim is older than `forget_before` and pruned.
    async fn claim_once(
        &self,
        key: &str,
        now: Timestamp,
        forget_before: Timestamp,
    ) -> Result<bool, StoreError>;

    /// Gives up a claim (the thing could not be done after all).
    async fn forget_once(&self, key: &str) -> Result<(), StoreError>;

    /// Whether `key` was claimed with [`Store::claim_once`] and not yet
    /// forgotten or pruned.
    async fn once_claimed(&self, key: &str) -> Result<bool, StoreError>;

    /// Records the id a runner has at its job source (GitHub's runner id).
    async fn set_runner_external_id(
        &self,
        runner: RunnerId,
        external_id: &str,
    ) -> Result<(), StoreError>;

    async fn runner_external_id(&self, runner: RunnerId) -> Result<Option<String>, StoreError>;

    /// Up to `limit` ended runners whose external id (GitHub's runner id)
    /// is still set, by id: registrations not yet let go, asked about
    /// again until GitHub answers. Reads only such rows (an index of them).
    async fn ended_runners_registered(&self, limit: u32) -> Result<Vec<Runner>, StoreError>;

    /// Stores (replacing) the output tail and exit code a runner reported.
    async fn put_job_log(
        &self,
        job: JobId,
        exit_code: Option<i64>,
        log: &str,
    ) -> Result<(), StoreError>;

    async fn get_job_log(&self, job: JobId) -> Result<Option<(Option<i64>, String)>, StoreError>;

    /// Stores a validated report of a runner (`phase` pre-job or post-job).
    async fn add_runner_report(
        &self,
        runner: RunnerId,
        phase: &str,
        body: &str,
        now: Timestamp,
    ) -> Result<(), StoreError>;

    /// A runner's reports, oldest first, as (phase, body).
    async fn runner_reports(&self, runner: RunnerId) -> Result<Vec<(String, String)>, StoreError>;

    /// Pre-job reports made in `[from, to)` whose runner sent no post-job
    /// report and has no crash counted yet (no once-key
    /// [`crash_key`]`(runner)`), oldest first, at most `limit`:
    /// `(runner, reported at, body)`. The COS spec's crash: a runner that
    /// reached pre-job and never post-job.
    async fn unfinished_reports(
        &self,
        from: Timestamp,
        to: Timestamp,
        limit: u32,
    ) -> Result<Vec<(RunnerId, Timestamp, String)>, StoreError>;

    /// Deletes up to `limit` rows of `what` older than `before` (never a
    /// live job or runner), oldest first, in one short transaction; returns
    /// how many went.
    async fn prune(&self, what: Prunable, before: Timestamp, limit: u32)
        -> Result<u64, StoreError>;

    /// How many rows `what`'s table holds.
    async fn count_rows(&self, what: Prunable) -> Result<u64, StoreError>;

    /// Gives back to the file system up to `pages` pages freed by pruning
    /// (SQLite in incremental auto-vacuum mode); a no-op elsewhere.
    async fn reclaim_space(&self, pages: u32) -> Result<(), StoreError>;

    /// Records a GARM instance token (by its hash) for `runner`.
    async fn create_instance_token(
        &self,
        token_hash: &str,
        runner: RunnerId,
        expires_at: Timestamp,
        jit_files: Option<&str>,
    ) -> Result<(), StoreError>;

    async fn find_instance_token(
        &self,
        token_hash: &str,
    ) -> Result<Option<InstanceToken>, StoreError>;

    /// Marks the token's one registration token handed out: `false` when
    /// it was already.
    async fn take_instance_registration(
        &self,
        token_hash: &str,
        now: Timestamp,
    ) -> Result<bool, StoreError>;

    async fn list_worker_configs(&self) -> Result<Vec<StoredWorkerConfig>, StoreError>;

    async fn get_worker_config(&self, id: &str) -> Result<Option<StoredWorkerConfig>, StoreError>;

    /// Creates or replaces a worker configuration and its pools atomically;
    /// returns the new version. Refused with `VersionConflict` when `expect`
    /// names another version, and with `PoolTaken` when another
    /// configuration owns one of `pools`.
    async fn put_worker_config(
        &self,
        id: &str,
        body: &str,
        pools: &[String],
        expect: Expect,
        now: Timestamp,
    ) -> Result<i64, StoreError>;

    /// Deletes a worker configuration; false if there was none.
    async fn delete_worker_config(&self, id: &str, expect: Expect) -> Result<bool, StoreError>;

    /// Applies `event` to the job through the core state machine and stores
    /// the result, retrying if the row changes underneath.
    async fn apply_job_event(
        &self,
        id: JobId,
        event: &JobEvent,
        now: Timestamp,
    ) -> Result<Job, StoreError> {
        // The hot path (a holder's accept, heartbeat, completion) is one
        // statement; anything its guard does not cover reads the row and
        // lets the state machine decide.
        if let Some(change) = event.guarded(now) {
            if let Some(job) = self.apply_guarded(id, &change).await? {
                return Ok(job);
            }
        }
        for _ in 0..MAX_COMPARE_AND_SET_ATTEMPTS {
            let current = self.get_job(id).await?.ok_or(StoreError::JobNotFound(id))?;
            let next = current.apply(event, now)?;
            if self.replace_job(&current, &next).await? {
                return Ok(next);
            }
        }
        Err(StoreError::Contention {
            what: format!("job {id}"),
        })
    }

    async fn apply_runner_event(
        &self,
        id: RunnerId,
        event: &RunnerEvent,
        now: Timestamp,
    ) -> Result<Runner, StoreError> {
        for _ in 0..MAX_COMPARE_AND_SET_ATTEMPTS {
            let current = self
                .get_runner(id)
                .await?
                .ok_or(StoreError::RunnerNotFound(id))?;
            let next = current.apply(event, now)?;
            if self.replace_runner(&current, &next).await? {
                return Ok(next);
            }
        }
        Err(StoreError::Contention {
            what: format!("runner {id}"),
        })
    }

    /// Applies `event` to a job and, in the same transaction, what `change`
    /// decides for its runner: a change that moves a job and a runner
    /// together is never half made, whatever crashes when. `runner` names
    /// the runner; `None` takes the job's runner after the event, else
    /// before it (the holder whose lease expired). `change` is given the
    /// job before and after the event and the runner's current row, and
    /// returns its next row (`None`: leave it) or an error, which refuses
    /// the whole move. A runner record that does not exist is left out.
    /// Retried on the fresh rows when either changed underneath.
    async fn move_job_and_runner(
        &self,
        id: JobId,
        event: &JobEvent,
        runner: Option<RunnerId>,
        change: RunnerChange<'_>,
        now: Timestamp,
    ) -> Result<Moved, StoreError> {
        for _ in 0..MAX_COMPARE_AND_SET_ATTEMPTS {
            let current = self.get_job(id).await?.ok_or(StoreError::JobNotFound(id))?;
            let next = current.apply(event, now)?;
            let runner_id = runner.or(next.runner).or(current.runner);
            let runner_now = match runner_id {
                Some(runner_id) => self.get_runner(runner_id).await?,
                None => None,
            };
            let runner_next = match &runner_now {
                Some(runner_now) => change(&current, &next, runner_now, now)?,
                None => None,
            };
            // A runner left as it is is still compared: the decision to
            // leave it was made on this version of it.
            let pair = runner_now
                .as_ref()
                .map(|now| (now, runner_next.as_ref().unwrap_or(now)));
            if self.replace_job_and_runner((&current, &next), pair).await? {
                return Ok(Moved {
                    job: next,
                    runner: runner_next.or(runner_now),
                });
            }
        }
        Err(StoreError::Contention {
            what: format!("job {id} and its runner"),
        })
    }

    /// Extends the holder's lease to `now + lease`.
    async fn keepalive(
        &self,
        id: JobId,
        runner: RunnerId,
        lease: Duration,
        now: Timestamp,
    ) -> Result<Job, StoreError> {
        let event = JobEvent::Keepalive {
            runner,
            lease_deadline: now.plus(lease),
        };
        self.apply_job_event(id, &event, now).await
    }

    async fn accept(&self, id: JobId, runner: RunnerId, now: Timestamp) -> Result<Job, StoreError> {
        self.apply_job_event(id, &JobEvent::Accept { runner }, now)
            .await
    }

    async fn decline(
        &self,
        id: JobId,
        runner: RunnerId,
        now: Timestamp,
    ) -> Result<Job, StoreError> {
        self.apply_job_event(id, &JobEvent::Decline { runner }, now)
            .await
    }

    async fn complete(
        &self,
        id: JobId,
        runner: RunnerId,
        conclusion: Conclusion,
        now: Timestamp,
    ) -> Result<Job, StoreError> {
        self.apply_job_event(id, &JobEvent::Complete { runner, conclusion }, now)
            .await
    }

    async fn cancel(&self, id: JobId, reason: &str, now: Timestamp) -> Result<Job, StoreError> {
        let event = JobEvent::Cancel {
            reason: reason.to_owned(),
        };
        self.apply_job_event(id, &event, now).await
    }

    /// Puts every job whose lease expired by `now` back at the tail of its
    /// queue (`attempts + 1`), or fails it at `max_attempts`, and marks the
    /// runner of a job that was running as crashed — each job with its
    /// runner in one transaction (`runway_core::moves::lease_expired`).
    /// Returns what it changed. A job whose lease was extended meanwhile is
    /// left alone.
    async fn expire_leases(&self, now: Timestamp) -> Result<Vec<ExpiredLease>, StoreError> {
        const BATCH: u32 = 500;
        let crash = |before: &Job, _: &Job, runner: &Runner, now: Timestamp| {
            Ok(runway_core::moves::lease_expired(before, runner, now))
        };
        let mut changed = Vec::new();
        loop {
            let expired = self.jobs_with_expired_leases(now, BATCH).await?;
            let batch_len = expired.len();
            for was in expired {
                match self
                    .move_job_and_runner(was.id, &JobEvent::LeaseExpired, None, &crash, now)
                    .await
                {
                    Ok(moved) => {
                        let runner_crashed = was.state == JobState::Running
                            && matches!(&moved.runner, Some(r) if r.state == RunnerState::Crashed
                                && Some(r.id) == was.runner
                                && r.ended_at == Some(now));
                        changed.push(ExpiredLease {
                            was,
                            job: moved.job,
                            runner: moved.runner,
                            runner_crashed,
                        });
                    }
                    // Changed since it was read (a keepalive, a completion,
                    // another sweeper): not expired after all.
                    Err(StoreError::JobTransition(_)) => {}
                    Err(other) => return Err(other),
                }
            }
            if batch_len < BATCH as usize {
                return Ok(changed);
            }
        }
    }
}

/// Opens the store named by `url`, creating the SQLite file if needed, and
/// applies pending migrations.
///
/// `postgres://…` and `postgresql://…` open PostgreSQL; `sqlite://PATH`,
/// `sqlite:PATH` or a bare file path open SQLite.
pub async fn open(url: &str, options: &OpenOptions) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(PostgresStore::open(url, None, options).await?))
    } else {
        Ok(Arc::new(SqliteStore::open(url).await?))
    }
}

/// The URL with any password replaced, safe to log and print.
pub fn redact_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::{Wake, Wanted};

    #[test]
    fn wakeups_read_back_as_they_were_written() {
        let long = "p".repeat(2000);
        for (wake, text) in [
            (Wake::job_anywhere(), "job"),
            (Wake::job_in("linux x64"), "job linux x64"),
            (Wake::ReconcileWanted, "reconcile"),
        ] {
            assert_eq!(wake.encode(), text);
            assert_eq!(Wake::parse(text), Some(wake));
        }
        // A name too long for a notification wakes every pool.
        assert_eq!(Wake::job_in(&long).encode(), "job");

        // Jobs queued: what they want and how many, as JSON.
        let queued = Wake::JobsQueued {
            pool: "linux x64".into(),
            wanted: Wanted {
                labels: vec!["self-hosted".into(), "gpu".into()],
                excluded: vec![7, 9],
            },
            count: 3,
        };
        let text = queued.encode();
        assert_eq!(
            text,
            r#"queued {"pool":"linux x64","labels":["self-hosted","gpu"],"excluded":[7,9],"count":3}"#
        );
        assert_eq!(Wake::parse(&text), Some(queued));
        // Too much to send: every runner of the pool looks; of a pool with
        // too long a name, every runner.
        let many = Wake::JobsQueued {
            pool: "linux".into(),
            wanted: Wanted {
                labels: vec!["l".repeat(100); 100],
                excluded: vec![],
            },
            count: 1,
        };
        assert_eq!(many.encode(), "job linux");
        let nameless = Wake::JobsQueued {
            pool: long.clone(),
            wanted: Wanted::default(),
            count: 1,
        };
        assert_eq!(nameless.encode(), "job");
        for garbage in ["queued", "queued {", r#"queued {"pool":"p"}"#, "queued []"] {
            assert_eq!(Wake::parse(garbage), None, "{garbage:?}");
        }
        for garbage in ["", "jobs", "reconcile now", "JOB"] {
            assert_eq!(Wake::parse(garbage), None, "{garbage:?}");
        }
    }
}
