//! What the store reads and writes, apart from the [`crate::Store`] trait
//! itself: its errors, the values its methods take and answer, leadership
//! and wake-ups.

use std::time::Duration;

use async_trait::async_trait;
use runway_core::{
    Job, JobId, JobState, JobTransitionError, Runner, RunnerId, RunnerState, RunnerTransitionError,
    Timestamp,
};

/// How many times a read-decide-write loses a race before we give up. Each
/// loss means another writer made progress on the same row, so this is only
/// reached under pathological contention.
pub(crate) const MAX_COMPARE_AND_SET_ATTEMPTS: usize = 32;

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

impl Claim {
    /// A claim of up to `limit` jobs of `pool` for `runner`: jobs of any
    /// labels, with no cap a share key.
    pub fn of_pool(
        pool: impl Into<String>,
        runner: RunnerId,
        limit: u32,
        lease: Duration,
    ) -> Claim {
        Claim {
            pool: pool.into(),
            runner,
            limit,
            lease,
            runner_labels: None,
            max_running_per_key: None,
        }
    }
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

/// How many live runners of one provider a pool has in one state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerCount {
    pub pool: String,
    pub provider: String,
    pub state: RunnerState,
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
    /// Runners of the pool's stock that are stopped.
    pub stopped: i64,
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
    pub stopped: f64,
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
