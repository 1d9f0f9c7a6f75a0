//! The store itself, written once over sqlx for both backends: every
//! method whose SQL and Rust are the same on SQLite and PostgreSQL lives
//! here as generic code over the backend's [`Dialect`]; what differs (the
//! claim statement, leadership, wake-ups, bulk enqueue, space reclaim)
//! is the dialect's, in `sqlite.rs` and `postgres.rs`.
//!
//! The `where` clauses say what the shared code asks of a sqlx database:
//! that its connections and pools execute queries, and that it reads and
//! writes 64-bit integers and text, the only column types runway uses
//! (see `rows.rs`).

/// An `impl` (`[$head]`) under the one `where` clause every
/// generic impl of the store carries: what the shared code asks of a sqlx
/// database (above). The files of this module write their methods inside
/// `sql_store_methods!` (for [`SqlStore`]; `store_trait_methods!` for its
/// `Store` impl) or `shared_methods!` (for
/// [`Shared`]), so the clause is written once; those take only items, so
/// rustfmt formats them.
macro_rules! sql_impl {
    ([$($head:tt)*] $($methods:tt)*) => {
        $($head)*
        where
            for<'c> &'c mut <D::Db as Database>::Connection: Executor<'c, Database = D::Db>,
            for<'q> <D::Db as Database>::Arguments<'q>: IntoArguments<'q, D::Db>,
            for<'q> i64: Encode<'q, D::Db> + Decode<'q, D::Db> + Type<D::Db>,
            for<'q> Option<i64>: Encode<'q, D::Db>,
            // Tuples of columns, read by position.
            usize: ColumnIndex<<D::Db as Database>::Row>,
            for<'q> String: Decode<'q, D::Db> + Type<D::Db>,
            for<'q> &'q str: Encode<'q, D::Db> + Type<D::Db>,
            for<'q> Option<&'q str>: Encode<'q, D::Db>,
            for<'a> &'a str: ColumnIndex<<D::Db as Database>::Row>,
        {
            $($methods)*
        }
    };
}

macro_rules! sql_store_methods {
    ($($methods:tt)*) => {
        sql_impl!([impl<D: Dialect> SqlStore<D>] $($methods)*);
    };
}

macro_rules! store_trait_methods {
    ($($methods:tt)*) => {
        sql_impl!([#[async_trait] impl<D: Dialect> Store for SqlStore<D>] $($methods)*);
    };
}

macro_rules! shared_methods {
    ($($methods:tt)*) => {
        sql_impl!([impl<D: Dialect> Shared<D>] $($methods)*);
    };
}

mod claims;
mod filter;
mod history;
mod queue;
mod reports;
mod runners;
mod terms;
mod worker_configs;
mod writes;

use claims::{claim_labels, completed_next, holder_step, start_steps};
use filter::Filter;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use runway_core::job::NewJob;
use runway_core::runner::NewRunner;
use runway_core::{Job, JobId, JobSource, JobState, Runner, RunnerId, Timestamp};
use sqlx::migrate::Migrator;
use sqlx::{
    ColumnIndex, Database, Decode, Encode, Executor, FromRow, IntoArguments, Pool, Row, Type,
};

use crate::common::{
    bind_claim, bind_guarded, ClaimForm, ClaimForms, ClaimStartSql, DialectSql, Statements,
    LIVE_RUNNER,
};
use crate::conn::{describe_sqlx_error, RowsAffected};
use crate::group_commit::{CompleteNext, Op, Outcome};
use crate::held::Held;
use crate::rows::{
    bind_columns, history_line, Columns, JobRow, RunnerRow, JOB_COLUMNS, RUNNER_COLUMNS,
};

/// Rows of `(group, state, COUNT(*))` with their states parsed: the live
/// job and runner counts. A state the store does not know is corrupt.
fn parse_counts<G, S>(
    rows: Vec<(G, String, i64)>,
    what: &str,
) -> Result<Vec<(G, S, u64)>, StoreError>
where
    S: std::str::FromStr,
    S::Err: std::fmt::Display,
{
    rows.into_iter()
        .map(|(group, state, count)| {
            let state = state
                .parse()
                .map_err(|e| StoreError::Corrupt(format!("{what} count: {e}")))?;
            Ok((group, state, u64::try_from(count).unwrap_or(0)))
        })
        .collect()
}

use crate::{
    Backend, Claim, ClaimStart, Delivery, Enqueued, Expect, JobCount, JobFilter, Leadership, Moved,
    Registration, RunnerFilter, Store, StoreError, StoredWorkerConfig, Wake, WakeListener,
};

/// What one SQL backend does its own way. Implemented by
/// [`crate::sqlite::SqliteDialect`] and [`crate::postgres::PostgresDialect`];
/// everything else is [`SqlStore`]'s, shared.
#[async_trait]
pub trait Dialect: Sized + Send + Sync + 'static {
    /// The sqlx database type.
    type Db: Database<QueryResult: RowsAffected>;
    const BACKEND: Backend;

    /// The backend's embedded migrations.
    fn migrator() -> &'static Migrator;

    /// Takes up to `$4` queued jobs of pool `$1` for runner `$2` under a
    /// lease ending at `$3`, in the pool's fair-share order; `$5` is the
    /// runner's labels (a JSON list, lowercase) or NULL, `$6` the history
    /// line, `$7` the cap on a share key's running jobs or NULL. Returns
    /// the claimed rows (`id, JOB_COLUMNS`). In `form`, for the claims it
    /// serves ([`ClaimForms`] says why there are forms; a dialect may give
    /// one statement for all).
    fn claim_statement(form: ClaimForm) -> String;

    /// How the dialect claims a job that starts at once
    /// ([`Store::claim_and_start`]), in `form`.
    fn claim_start_statement(form: ClaimForm) -> ClaimStartSql;

    /// A guarded job change with its runner's compare-and-set and the job's
    /// log in one statement or script (`common::guarded_pair_postgres`,
    /// `sqlite::guarded_pair_script`).
    fn guarded_pair_statement() -> String;

    /// A completion with its runner and log, then the runner's next job
    /// started, in one statement ([`crate::common::complete_next_postgres`]);
    /// `None`: the group commit runs the dialect's script.
    fn complete_next_statement() -> Option<String> {
        None
    }

    /// A job and the delivery that brought it, each inserted unless already
    /// stored, in one statement ([`crate::common::enqueue_delivery_postgres`]:
    /// the job's columns `$1`…, then the delivery's six; one row, the
    /// delivery's `new_delivery` count and the job's columns, NULL when the
    /// job was stored already); `None` writes them in a transaction.
    fn enqueue_delivery_statement() -> Option<String> {
        None
    }

    async fn reclaim_space(store: &SqlStore<Self>, pages: u32) -> Result<(), StoreError>;

    async fn try_lead(
        store: &SqlStore<Self>,
        name: &str,
        silence: Duration,
    ) -> Result<Option<Box<dyn Leadership>>, StoreError>;

    async fn enqueue_many(
        store: &SqlStore<Self>,
        jobs: &[NewJob],
        now: Timestamp,
    ) -> Result<Vec<Enqueued>, StoreError>;

    /// See [`Store::announce`]: nothing to do where one process owns the store.
    async fn announce(
        store: &SqlStore<Self>,
        from: &str,
        wakes: &[Wake],
    ) -> Result<(), StoreError> {
        let _ = (store, from, wakes);
        Ok(())
    }

    /// See [`Store::listen`].
    async fn listen(store: &SqlStore<Self>) -> Result<Option<Box<dyn WakeListener>>, StoreError> {
        let _ = store;
        Ok(None)
    }

    /// See [`Store::fenced`].
    fn fenced(store: &SqlStore<Self>, name: &str, term: i64) -> Option<Arc<dyn Store>> {
        let _ = (store, name, term);
        None
    }
}

/// A store on one SQL backend: [`crate::SqliteStore`] or [`crate::PostgresStore`].
pub struct SqlStore<D: Dialect> {
    pub(crate) inner: Arc<Shared<D>>,
    pub(crate) group: crate::group_commit::GroupCommit,
}

/// What a store's methods and its group committer share.
pub(crate) struct Shared<D: Dialect> {
    /// Every write, and on PostgreSQL every read too.
    pub writer: Pool<D::Db>,
    /// Reads; on SQLite a pool of its own beside the single writer.
    pub readers: Pool<D::Db>,
    pub statements: Statements,
    /// The store's description in errors ("SQLite database …").
    pub target: String,
    /// Some of the writer's connections, kept checked out between the hot
    /// path's writes ([`crate::held`]).
    pub held: Held<D::Db>,
    /// The same for the hot path's reads, where they have a pool of their
    /// own; `None` where reads and writes share one (PostgreSQL).
    held_reads: Option<Held<D::Db>>,
}

impl<D: Dialect> Shared<D> {
    /// `keep` connections at most held for writes, and, where `readers` is
    /// a pool of its own, `keep_reads` for reads.
    pub fn new(
        writer: Pool<D::Db>,
        readers: Pool<D::Db>,
        target: String,
        keep: usize,
        keep_reads: Option<usize>,
    ) -> Shared<D> {
        Shared {
            held: Held::new(writer.clone(), keep),
            held_reads: keep_reads.map(|keep| Held::new(readers.clone(), keep)),
            writer,
            readers,
            statements: Statements::new(DialectSql {
                backend: D::BACKEND,
                claim: ClaimForms::new(D::claim_statement),
                claim_start: ClaimForms::new(D::claim_start_statement),
                guarded_pair: D::guarded_pair_statement(),
                complete_next: D::complete_next_statement(),
                enqueue_delivery: D::enqueue_delivery_statement(),
            }),
            target,
        }
    }

    /// Where the hot path's reads take their connection.
    pub fn held_reads(&self) -> &Held<D::Db> {
        self.held_reads.as_ref().unwrap_or(&self.held)
    }
}

impl<D: Dialect> SqlStore<D> {
    pub(crate) fn reader(&self) -> &Pool<D::Db> {
        &self.inner.readers
    }

    pub(crate) fn writer(&self) -> &Pool<D::Db> {
        &self.inner.writer
    }
}

store_trait_methods!(
    fn backend(&self) -> Backend {
        D::BACKEND
    }

    async fn reclaim_space(&self, pages: u32) -> Result<(), StoreError> {
        D::reclaim_space(self, pages).await
    }

    async fn try_lead(
        &self,
        name: &str,
        silence: Duration,
    ) -> Result<Option<Box<dyn Leadership>>, StoreError> {
        D::try_lead(self, name, silence).await
    }

    async fn enqueue_many(
        &self,
        jobs: &[NewJob],
        now: Timestamp,
    ) -> Result<Vec<Enqueued>, StoreError> {
        D::enqueue_many(self, jobs, now).await
    }

    async fn announce(&self, from: &str, wakes: &[Wake]) -> Result<(), StoreError> {
        D::announce(self, from, wakes).await
    }

    async fn listen(&self) -> Result<Option<Box<dyn WakeListener>>, StoreError> {
        D::listen(self).await
    }

    fn fenced(&self, name: &str, term: i64) -> Option<Arc<dyn Store>> {
        D::fenced(self, name, term)
    }

    async fn check_ready(&self) -> Result<(), StoreError> {
        let applied: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations WHERE success")
                .fetch_one(self.reader())
                .await
                .map_err(|e| StoreError::NotReady {
                    target: self.inner.target.clone(),
                    reason: describe_sqlx_error(&e),
                })?;
        let expected = D::migrator().iter().count() as i64;
        if applied < expected {
            return Err(StoreError::NotReady {
                target: self.inner.target.clone(),
                reason: format!("{applied} of {expected} migrations applied"),
            });
        }
        Ok(())
    }

    async fn get_jobs(&self, ids: &[JobId]) -> Result<Vec<Job>, StoreError> {
        self.get_jobs(ids).await
    }

    async fn get_job(&self, id: JobId) -> Result<Option<Job>, StoreError> {
        self.get_job(id).await
    }

    async fn find_job(
        &self,
        source: JobSource,
        external_id: &str,
    ) -> Result<Option<Job>, StoreError> {
        self.find_job(source, external_id).await
    }

    async fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<Job>, StoreError> {
        self.list_jobs(filter).await
    }

    async fn queue_times(
        &self,
        since: Timestamp,
        limit: u32,
    ) -> Result<Vec<(String, std::time::Duration)>, StoreError> {
        self.queue_times(since, limit).await
    }

    async fn live_job_counts(&self) -> Result<Vec<JobCount>, StoreError> {
        self.live_job_counts().await
    }

    async fn queued_count(&self, pool: &str) -> Result<u64, StoreError> {
        self.queued_count(pool).await
    }

    async fn share_counts(&self, pool: &str) -> Result<Vec<crate::ShareCount>, StoreError> {
        self.share_counts(pool).await
    }

    async fn jobs_with_expired_leases(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> Result<Vec<Job>, StoreError> {
        self.jobs_with_expired_leases(now, limit).await
    }

    async fn replace_job(&self, current: &Job, next: &Job) -> Result<bool, StoreError> {
        self.replace_job(current, next).await
    }

    async fn apply_guarded(
        &self,
        id: JobId,
        change: &runway_core::GuardedChange,
    ) -> Result<Option<Job>, StoreError> {
        self.apply_guarded(id, change).await
    }

    async fn claim_and_start(
        &self,
        claim: &Claim,
        runner: &Runner,
        now: Timestamp,
    ) -> Result<ClaimStart, StoreError> {
        self.claim_and_start(claim, runner, now).await
    }

    async fn apply_guarded_with_runner(
        &self,
        id: JobId,
        change: &runway_core::GuardedChange,
        runner: (&Runner, &Runner),
        log: Option<(Option<i64>, &str)>,
    ) -> Result<Option<Moved>, StoreError> {
        self.apply_guarded_with_runner(id, change, runner, log)
            .await
    }

    async fn complete_and_start_next(
        &self,
        id: JobId,
        change: &runway_core::GuardedChange,
        runner: (&Runner, &Runner),
        log: Option<(Option<i64>, &str)>,
        claim: &Claim,
        now: Timestamp,
    ) -> Result<Option<(Moved, Option<Job>)>, StoreError> {
        self.complete_and_start_next(id, change, runner, log, claim, now)
            .await
    }

    async fn enqueue_with_delivery(
        &self,
        job: &NewJob,
        delivery: Option<&Delivery>,
        now: Timestamp,
    ) -> Result<(Enqueued, bool), StoreError> {
        self.enqueue_with_delivery(job, delivery, now).await
    }

    async fn delivery_seen(&self, id: &str) -> Result<bool, StoreError> {
        self.delivery_seen(id).await
    }

    async fn record_delivery(&self, delivery: &Delivery) -> Result<bool, StoreError> {
        self.record_delivery(delivery).await
    }

    async fn claim(&self, claim: &Claim, now: Timestamp) -> Result<Vec<Job>, StoreError> {
        self.claim(claim, now).await
    }

    async fn create_runner(
        &self,
        runner: &NewRunner,
        now: Timestamp,
    ) -> Result<Runner, StoreError> {
        self.create_runner(runner, now).await
    }

    async fn get_runner(&self, id: RunnerId) -> Result<Option<Runner>, StoreError> {
        self.get_runner(id).await
    }

    async fn find_runner(&self, name: &str) -> Result<Option<Runner>, StoreError> {
        self.find_runner(name).await
    }

    async fn list_runners(&self, filter: &RunnerFilter) -> Result<Vec<Runner>, StoreError> {
        self.list_runners(filter).await
    }

    async fn live_runner_counts(&self) -> Result<Vec<crate::RunnerCount>, StoreError> {
        self.live_runner_counts().await
    }

    async fn list_live_runners(&self, pool: Option<&str>) -> Result<Vec<Runner>, StoreError> {
        self.list_live_runners(pool).await
    }

    async fn create_registration_token(
        &self,
        token_hash: &str,
        pool: &str,
        runner: Option<RunnerId>,
        expires_at: Timestamp,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.create_registration_token(token_hash, pool, runner, expires_at, now)
            .await
    }

    async fn register_runner(
        &self,
        registration_token_hash: &str,
        attempt_hash: Option<&str>,
        name: &str,
        labels: &[String],
        runner_token_hash: &str,
        now: Timestamp,
    ) -> Result<Registration, StoreError> {
        self.register_runner(
            registration_token_hash,
            attempt_hash,
            name,
            labels,
            runner_token_hash,
            now,
        )
        .await
    }

    async fn init_setting(&self, key: &str, candidate: &str) -> Result<String, StoreError> {
        self.init_setting(key, candidate).await
    }

    async fn job_history(
        &self,
        id: JobId,
    ) -> Result<Option<Vec<runway_core::JobStep>>, StoreError> {
        self.job_history(id).await
    }

    async fn set_pool_paused(
        &self,
        pool: &str,
        by: Option<&str>,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        self.set_pool_paused(pool, by, now).await
    }

    async fn paused_pools(&self) -> Result<Vec<crate::PausedPool>, StoreError> {
        self.paused_pools().await
    }

    async fn record_pool_samples(&self, samples: &[crate::PoolSample]) -> Result<(), StoreError> {
        self.record_pool_samples(samples).await
    }

    async fn pool_history(
        &self,
        pool: Option<&str>,
        since: Timestamp,
        bucket: Duration,
    ) -> Result<Vec<crate::PoolHistoryPoint>, StoreError> {
        self.pool_history(pool, since, bucket).await
    }

    async fn pool_waits(
        &self,
        pool: &str,
        since: Timestamp,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        self.pool_waits(pool, since).await
    }

    async fn add_audit(&self, entry: &crate::AuditEntry) -> Result<(), StoreError> {
        self.add_audit(entry).await
    }

    async fn list_audit(
        &self,
        limit: u32,
        before: Option<i64>,
    ) -> Result<Vec<crate::AuditEntry>, StoreError> {
        self.list_audit(limit, before).await
    }

    async fn get_setting(&self, key: &str) -> Result<Option<String>, StoreError> {
        self.get_setting(key).await
    }

    async fn put_setting(&self, key: &str, value: &str) -> Result<(), StoreError> {
        self.put_setting(key, value).await
    }

    async fn claim_once(
        &self,
        key: &str,
        now: Timestamp,
        forget_before: Timestamp,
    ) -> Result<bool, StoreError> {
        self.claim_once(key, now, forget_before).await
    }

    async fn once_claimed(&self, key: &str) -> Result<bool, StoreError> {
        self.once_claimed(key).await
    }

    async fn forget_once(&self, key: &str) -> Result<(), StoreError> {
        self.forget_once(key).await
    }

    async fn set_runner_external_id(
        &self,
        runner: RunnerId,
        external_id: &str,
    ) -> Result<(), StoreError> {
        self.set_runner_external_id(runner, external_id).await
    }

    async fn runner_external_id(&self, runner: RunnerId) -> Result<Option<String>, StoreError> {
        self.runner_external_id(runner).await
    }

    async fn ended_runners_registered(&self, limit: u32) -> Result<Vec<Runner>, StoreError> {
        self.ended_runners_registered(limit).await
    }

    async fn find_runner_by_token(&self, token_hash: &str) -> Result<Option<Runner>, StoreError> {
        self.find_runner_by_token(token_hash).await
    }

    async fn set_runner_token(&self, runner: RunnerId, token_hash: &str) -> Result<(), StoreError> {
        self.set_runner_token(runner, token_hash).await
    }

    async fn heartbeat_replica(
        &self,
        replica: &crate::Replica,
        forget_before: Timestamp,
    ) -> Result<(), StoreError> {
        self.heartbeat_replica(replica, forget_before).await
    }

    async fn replicas(&self, seen_since: Timestamp) -> Result<Vec<crate::Replica>, StoreError> {
        self.replicas(seen_since).await
    }

    async fn begin_term(
        &self,
        name: &str,
        replica: &str,
        now: Timestamp,
    ) -> Result<i64, StoreError> {
        self.begin_term(name, replica, now).await
    }

    async fn end_term(&self, name: &str, term: i64) -> Result<(), StoreError> {
        self.end_term(name, term).await
    }

    async fn leader(&self, name: &str) -> Result<Option<crate::LeaderTerm>, StoreError> {
        self.leader(name).await
    }

    async fn put_job_log(
        &self,
        job: JobId,
        exit_code: Option<i64>,
        log: &str,
    ) -> Result<(), StoreError> {
        self.put_job_log(job, exit_code, log).await
    }

    async fn get_job_log(&self, job: JobId) -> Result<Option<(Option<i64>, String)>, StoreError> {
        self.get_job_log(job).await
    }

    async fn add_runner_report(
        &self,
        runner: RunnerId,
        phase: &str,
        body: &str,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.add_runner_report(runner, phase, body, now).await
    }

    async fn runner_reports(&self, runner: RunnerId) -> Result<Vec<(String, String)>, StoreError> {
        self.runner_reports(runner).await
    }

    async fn unfinished_reports(
        &self,
        from: Timestamp,
        to: Timestamp,
        limit: u32,
    ) -> Result<Vec<(RunnerId, Timestamp, String)>, StoreError> {
        self.unfinished_reports(from, to, limit).await
    }

    async fn prune(
        &self,
        what: crate::Prunable,
        before: Timestamp,
        limit: u32,
    ) -> Result<u64, StoreError> {
        self.prune(what, before, limit).await
    }

    async fn count_rows(&self, what: crate::Prunable) -> Result<u64, StoreError> {
        self.count_rows(what).await
    }

    async fn create_instance_token(
        &self,
        token_hash: &str,
        runner: RunnerId,
        expires_at: Timestamp,
        jit_files: Option<&str>,
    ) -> Result<(), StoreError> {
        self.create_instance_token(token_hash, runner, expires_at, jit_files)
            .await
    }

    async fn find_instance_token(
        &self,
        token_hash: &str,
    ) -> Result<Option<crate::InstanceToken>, StoreError> {
        self.find_instance_token(token_hash).await
    }

    async fn take_instance_registration(
        &self,
        token_hash: &str,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        self.take_instance_registration(token_hash, now).await
    }

    async fn arm_instance_tokens(
        &self,
        runner: RunnerId,
        expires_at: Timestamp,
        jit_files: Option<&str>,
    ) -> Result<u64, StoreError> {
        self.arm_instance_tokens(runner, expires_at, jit_files)
            .await
    }

    async fn list_worker_configs(&self) -> Result<Vec<StoredWorkerConfig>, StoreError> {
        self.list_worker_configs().await
    }

    async fn get_worker_config(&self, id: &str) -> Result<Option<StoredWorkerConfig>, StoreError> {
        self.get_worker_config(id).await
    }

    async fn put_worker_config(
        &self,
        id: &str,
        body: &str,
        pools: &[String],
        expect: Expect,
        now: Timestamp,
    ) -> Result<i64, StoreError> {
        self.put_worker_config(id, body, pools, expect, now).await
    }

    async fn delete_worker_config(&self, id: &str, expect: Expect) -> Result<bool, StoreError> {
        self.delete_worker_config(id, expect).await
    }

    async fn replace_job_and_runner(
        &self,
        job: (&Job, &Job),
        runner: Option<(&Runner, &Runner)>,
    ) -> Result<bool, StoreError> {
        self.replace_job_and_runner(job, runner).await
    }

    async fn replace_runner(&self, current: &Runner, next: &Runner) -> Result<bool, StoreError> {
        self.replace_runner(current, next).await
    }
);
