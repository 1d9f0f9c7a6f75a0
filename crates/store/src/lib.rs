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
mod conn;
mod group_commit;
mod held;
mod model;
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
    Conclusion, Job, JobEvent, JobId, JobSource, JobState, Runner, RunnerEvent, RunnerId,
    RunnerState, Timestamp,
};

pub use common::{
    queue_times, ClaimForm, FINISHED_JOB, LIVE_JOB, LIVE_RUNNER, REGISTERED_ENDED_RUNNER,
};
pub use model::*;
pub use postgres::{PostgresDialect, PostgresStore};
pub use sql::{Dialect, SqlStore};
pub use sqlite::{SqliteDialect, SqliteStore};

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

    /// Live runner counts per (pool, provider, state), for gauges and the
    /// console's minute samples: read as three columns of the live rows
    /// through the live index and counted, not
    /// decoded into runners (a SQL `GROUP BY` has SQLite scan the
    /// `(pool, state)` index over every runner ever).
    async fn live_runner_counts(&self) -> Result<Vec<RunnerCount>, StoreError>;

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
    ///
    /// The runner answered is the row as stored, its token's write
    /// included (which moves its version, as [`Store::set_runner_token`]).
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
    /// started with. Moves the runner's version on: a write guarded by the
    /// version a caller read before (a start's compare-and-set) no longer
    /// holds, so a runner remembered by its old token cannot act on it.
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

    /// Arms `runner`'s instance tokens for a start of its stopped machine:
    /// valid until `expires_at`, with `jit_files` (a GitHub pool's JIT
    /// configuration minted for this start). How many it armed.
    async fn arm_instance_tokens(
        &self,
        runner: RunnerId,
        expires_at: Timestamp,
        jit_files: Option<&str>,
    ) -> Result<u64, StoreError>;

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
