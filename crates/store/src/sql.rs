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

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use runway_core::job::NewJob;
use runway_core::runner::NewRunner;
use runway_core::{Job, JobId, JobSource, JobState, Runner, RunnerId, Timestamp};
use sqlx::migrate::Migrator;
use sqlx::pool::PoolConnection;
use sqlx::{
    ColumnIndex, Database, Decode, Encode, Executor, FromRow, IntoArguments, Pool, Row, Type,
};

use crate::common::{bind_claim, bind_guarded, Statements, LIVE_RUNNER};
use crate::group_commit::{CompleteNext, Op, Outcome};
use crate::held::Held;
use crate::rows::{
    bind_columns, history_line, Columns, JobRow, RunnerRow, JOB_COLUMNS, RUNNER_COLUMNS,
};

/// A claim's runner labels as its statement takes them: a JSON list in
/// lowercase, or NULL for any.
fn claim_labels(claim: &Claim) -> Option<String> {
    claim.runner_labels.as_ref().map(|labels| {
        let lower: Vec<String> = labels.iter().map(|l| l.to_lowercase()).collect();
        crate::rows::json_list(&lower)
    })
}

/// The history line of a move of a job to `state` on `runner` at `now`
/// that the statement makes itself (a claim, a claim that starts).
fn holder_step(state: JobState, runner: RunnerId, now: Timestamp) -> String {
    history_line(Some(&runway_core::JobStep {
        at: now,
        state,
        runner: Some(runner),
        attempts: None,
        conclusion: None,
        reason: None,
    }))
}

/// What `complete_and_start_next` answers: the ended job with the runner's
/// final row (busy with the started job, or as it was left by the
/// completion), and the started job.
fn completed_next(
    ended: Job,
    started: Option<Job>,
    finished: &Runner,
    busy: Runner,
) -> (Moved, Option<Job>) {
    let runner = match &started {
        Some(next) => Runner {
            job: Some(next.id),
            ..busy
        },
        None => finished.clone(),
    };
    (
        Moved {
            job: ended,
            runner: Some(runner),
        },
        started,
    )
}

/// The history a claim that starts its job writes: claimed, then started.
fn start_steps(runner: RunnerId, now: Timestamp) -> String {
    format!(
        "{}{}",
        holder_step(JobState::Provisioning, runner, now),
        holder_step(JobState::Running, runner, now)
    )
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
    /// the claimed rows (`id, JOB_COLUMNS`).
    fn claim_statement() -> String;

    /// How the dialect claims a job that starts at once
    /// ([`Store::claim_and_start`]).
    fn claim_start_statement() -> ClaimStartSql;

    /// A guarded job change with its runner's compare-and-set and the
    /// job's log in one statement ([`crate::common::guarded_pair_postgres`]);
    /// `None` runs them as a transaction of their own statements.
    fn guarded_pair_statement() -> Option<String> {
        None
    }

    /// A completion with its runner and log, then the runner's next job
    /// started, in one statement ([`crate::common::complete_next_postgres`]);
    /// `None` writes them one after the other.
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

/// A dialect's claim that starts its job at once.
pub enum ClaimStartSql {
    /// The job and its runner in one statement
    /// ([`crate::common::claim_start_postgres`]'s parameters).
    OneStatement(String),
    /// [`Dialect::claim_statement`] that makes the job `running` at once
    /// (the same parameters, `$6` holding both history lines — claimed,
    /// started — and `$7` the start time; the version moves by two, as a
    /// claim and its accept move it), followed in the same transaction by
    /// the runner's compare-and-set. For SQLite, where a statement costs no
    /// round trip to a server, only a hop to the connection's thread.
    ThenRunner(String),
}

/// How many rows a statement changed: each sqlx backend says so in an
/// inherent method of its own result type, this names it once.
pub trait RowsAffected {
    fn rows_affected(&self) -> u64;
}

impl RowsAffected for sqlx::sqlite::SqliteQueryResult {
    fn rows_affected(&self) -> u64 {
        sqlx::sqlite::SqliteQueryResult::rows_affected(self)
    }
}

impl RowsAffected for sqlx::postgres::PgQueryResult {
    fn rows_affected(&self) -> u64 {
        sqlx::postgres::PgQueryResult::rows_affected(self)
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
            statements: Statements::new::<D>(),
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

/// `result` of a write on `connection`, which is closed rather than reused
/// when the write failed in the database ([`close_if_failed`]).
pub(crate) fn settle<DB: Database, T>(
    mut connection: PoolConnection<DB>,
    result: Result<T, StoreError>,
) -> Result<T, StoreError> {
    close_if_failed(&mut connection, &result);
    result
}

/// Marks `connection` to be closed, not reused, when `result` is a failure
/// in the database. A failed transaction can leave a connection out of
/// step with its database: after `SQLITE_FULL` or an I/O error SQLite rolls
/// the transaction back by itself, sqlx's count of open transactions does
/// not know, and its next "transaction" turns out to be a savepoint inside
/// one that never commits, so every later write on that connection would
/// be answered as done and never become durable. A new connection starts
/// clean.
pub(crate) fn close_if_failed<DB: Database, T>(
    connection: &mut PoolConnection<DB>,
    result: &Result<T, StoreError>,
) {
    if matches!(result, Err(StoreError::Database(_))) {
        tracing::warn!(
            "closing a database connection after a failed write; the next write opens a new one"
        );
        connection.close_on_drop();
    }
}

/// The database's own words for what went wrong, without sqlx's wrapping.
pub(crate) fn describe_sqlx_error(error: &sqlx::Error) -> String {
    match error {
        sqlx::Error::Database(e) => match e.code() {
            Some(code) => format!("{} (code {code})", e.message()),
            None => e.message().to_owned(),
        },
        other => other.to_string(),
    }
}

/// A query with optional conditions, each with the next `$n` parameter:
/// the caller binds the present ones in the order they were added.
/// (sqlx's `QueryBuilder` does the same, but its borrow of the builder
/// cannot be proven to end in code generic over the database.)
struct Filter {
    text: String,
    parameters: usize,
}

impl Filter {
    fn new(text: String) -> Filter {
        Filter {
            text,
            parameters: 0,
        }
    }

    /// Adds ` AND {condition} $n` when `present`.
    fn and_if(&mut self, present: bool, condition: &str) -> &mut Filter {
        if present {
            self.parameters += 1;
            self.text += &format!(" AND {condition} ${}", self.parameters);
        }
        self
    }

    fn then(&mut self, text: &str) -> &mut Filter {
        self.text += text;
        self
    }

    /// Adds `{clause} $n` when `present`.
    fn then_if(&mut self, present: bool, clause: &str) -> &mut Filter {
        if present {
            self.parameters += 1;
            self.text += &format!("{clause} ${}", self.parameters);
        }
        self
    }
}

/// The writes the group committer runs, in one transaction per batch.
impl<D: Dialect> Shared<D>
where
    for<'c> &'c mut <D::Db as Database>::Connection: Executor<'c, Database = D::Db>,
    for<'q> <D::Db as Database>::Arguments<'q>: IntoArguments<'q, D::Db>,
    for<'q> i64: Encode<'q, D::Db> + Decode<'q, D::Db> + Type<D::Db>,
    for<'q> Option<i64>: Encode<'q, D::Db>,
    for<'q> String: Decode<'q, D::Db> + Type<D::Db>,
    for<'q> &'q str: Encode<'q, D::Db> + Type<D::Db>,
    for<'q> Option<&'q str>: Encode<'q, D::Db>,
    for<'a> &'a str: ColumnIndex<<D::Db as Database>::Row>,
{
    /// Records a delivery; false if its id was already recorded.
    async fn insert_delivery(
        &self,
        connection: &mut <D::Db as Database>::Connection,
        delivery: &Delivery,
    ) -> Result<bool, StoreError> {
        let columns = Columns::from(delivery);
        let result = bind_columns(sqlx::query(&self.statements.insert_delivery), &columns)
            .execute(&mut *connection)
            .await?;
        Ok(result.rows_affected() == 1)
    }

    /// [`Dialect::enqueue_delivery_statement`]'s one statement, and the read
    /// of the stored job when there was one already (a redelivery, or the
    /// same job from another source of events).
    async fn enqueue_delivery(
        &self,
        connection: &mut <D::Db as Database>::Connection,
        sql: &str,
        job: &NewJob,
        delivery: &Delivery,
        now: Timestamp,
    ) -> Result<(Enqueued, bool), StoreError> {
        let columns = Columns::from(&job.initial(JobId(0), now));
        let delivery = Columns::from(delivery);
        // Run to its end, as every write (see `insert_job`).
        let rows = bind_columns(bind_columns(sqlx::query(sql), &columns), &delivery)
            .fetch_all(&mut *connection)
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::Corrupt("an enqueue answered no row".into()))?;
        let new_delivery = row.try_get::<i64, _>("new_delivery")? == 1;
        if row.try_get::<Option<i64>, _>("id")?.is_some() {
            let job = Job::try_from(JobRow::from_row(row)?)?;
            return Ok((Enqueued { job, created: true }, new_delivery));
        }
        let existing: JobRow = sqlx::query_as(&self.statements.job_by_external_id)
            .bind(job.source.as_str())
            .bind(job.external_id.as_str())
            .fetch_one(&mut *connection)
            .await?;
        let job = Job::try_from(existing)?;
        Ok((
            Enqueued {
                job,
                created: false,
            },
            new_delivery,
        ))
    }

    /// Inserts a job, or reads the one already stored under its key.
    pub(crate) async fn insert_job(
        &self,
        connection: &mut <D::Db as Database>::Connection,
        job: &NewJob,
        now: Timestamp,
    ) -> Result<Enqueued, StoreError> {
        let columns = Columns::from(&job.initial(JobId(0), now));
        // Every write runs to its end (fetch_all), never stopped at its
        // first row: on SQLite an autocommit statement commits when it
        // finishes, and a commit that fails (a full disk) is only reported
        // there; stopped early, the row would be answered and then lost.
        let inserted = bind_columns(sqlx::query(&self.statements.insert_job), &columns)
            .fetch_all(&mut *connection)
            .await?
            .first()
            .map(JobRow::from_row)
            .transpose()?;
        if let Some(row) = inserted {
            return Ok(Enqueued {
                job: Job::try_from(row)?,
                created: true,
            });
        }
        let existing: JobRow = sqlx::query_as(&self.statements.job_by_external_id)
            .bind(job.source.as_str())
            .bind(job.external_id.as_str())
            .fetch_one(&mut *connection)
            .await?;
        Ok(Enqueued {
            job: Job::try_from(existing)?,
            created: false,
        })
    }

    /// Runs `ops` in one transaction (a lone write in autocommit).
    pub(crate) async fn execute_batch(&self, ops: &[&Op]) -> Result<Vec<Outcome>, StoreError> {
        let mut connection = self.held.acquire().await?;
        let result = async {
            // A lone one-statement write needs no transaction: autocommit
            // saves the BEGIN and COMMIT round trips. (An enqueue with its
            // delivery is two writes, which commit together or not at all.)
            if let [op] = ops {
                if op.is_one_statement() {
                    return Ok(vec![self.execute_one(&mut connection, op).await?]);
                }
            }
            let mut transaction = sqlx::Connection::begin(&mut *connection).await?;
            let mut outcomes = Vec::with_capacity(ops.len());
            for op in ops {
                outcomes.push(self.execute_one(&mut transaction, op).await?);
            }
            transaction.commit().await?;
            Ok(outcomes)
        }
        .await;
        connection.settle(result)
    }

    /// [`Op::ClaimStart`]: one statement where the dialect has one, else
    /// the dialect's claim that starts its job and the runner's
    /// compare-and-set, in a transaction (a savepoint within a shared one):
    /// all or nothing.
    async fn claim_start(
        &self,
        connection: &mut <D::Db as Database>::Connection,
        claim: &Claim,
        (runner_version, runner_next): (i64, &Runner),
        steps: &str,
        now: Timestamp,
    ) -> Result<Outcome, StoreError> {
        let labels = claim_labels(claim);
        let lease_deadline = now.plus(claim.lease).as_millis();
        let started = |sql| {
            bind_claim(
                sqlx::query(sql),
                claim,
                (1, lease_deadline),
                labels.as_deref(),
                steps,
            )
            .bind(now.as_millis())
        };
        match &self.statements.claim_start {
            ClaimStartSql::OneStatement(sql) => {
                let columns = Columns::from(runner_next);
                // Run to its end, as every write (see `insert_job`).
                let rows = bind_columns(started(sql).bind(runner_version), &columns)
                    .fetch_all(&mut *connection)
                    .await?;
                // One row: the started job's columns (NULL when none
                // started) and the runner's stored version.
                let Some(row) = rows.first() else {
                    return Err(StoreError::Corrupt(
                        "a claim that starts answered no row".into(),
                    ));
                };
                let started: Option<i64> = row.try_get("id")?;
                if started.is_none() {
                    return Ok(Outcome::ClaimedStart(Err(row.try_get("runner_version")?)));
                }
                let job = Job::try_from(JobRow::from_row(row)?)?;
                Ok(Outcome::ClaimedStart(Ok(Box::new(job))))
            }
            ClaimStartSql::ThenRunner(sql) => {
                let mut both = sqlx::Connection::begin(&mut *connection).await?;
                let Some(claimed) = started(sql).fetch_all(&mut *both).await?.pop() else {
                    both.rollback().await?;
                    return Ok(Outcome::ClaimedStart(Err(None)));
                };
                let job = Job::try_from(JobRow::from_row(&claimed)?)?;
                let mut busy = runner_next.clone();
                busy.job = Some(job.id);
                let busy = Columns::from(&busy);
                let replaced = bind_columns(sqlx::query(&self.statements.replace_runner), &busy)
                    .bind(claim.runner.0)
                    .bind(runner_version)
                    .execute(&mut *both)
                    .await?
                    .rows_affected()
                    == 1;
                if replaced {
                    both.commit().await?;
                    Ok(Outcome::ClaimedStart(Ok(Box::new(job))))
                } else {
                    both.rollback().await?;
                    Ok(Outcome::ClaimedStart(Err(None)))
                }
            }
        }
    }

    /// [`Op::GuardedWithRunner`]: the job after the change, or `None` and
    /// nothing written when the job's guard or the runner's version does
    /// not hold. One statement where the dialect has one.
    async fn guarded_with_runner(
        &self,
        connection: &mut <D::Db as Database>::Connection,
        id: JobId,
        (change, step): (&runway_core::GuardedChange, &String),
        (runner, runner_version, runner_next): (RunnerId, i64, &Columns),
        log: Option<&(Option<i64>, String)>,
    ) -> Result<Option<Job>, StoreError> {
        if let Some(sql) = &self.statements.guarded_pair {
            let query = bind_guarded(sqlx::query_as(sql), id, change, step)
                .bind(runner.0)
                .bind(runner_version);
            let row: Option<JobRow> = bind_columns(query, runner_next)
                .bind(i64::from(log.is_some()))
                .bind(log.and_then(|(exit, _)| *exit))
                .bind(log.map(|(_, text)| text.as_str()))
                .fetch_all(&mut *connection)
                .await?
                .pop();
            return row.map(Job::try_from).transpose();
        }
        let mut both = sqlx::Connection::begin(&mut *connection).await?;
        let row: Option<JobRow> = bind_guarded(
            sqlx::query_as(&self.statements.guarded_job),
            id,
            change,
            step,
        )
        .fetch_all(&mut *both)
        .await?
        .pop();
        let Some(row) = row else {
            both.rollback().await?;
            return Ok(None);
        };
        let runner = (runner, runner_version, runner_next);
        if !self.runner_then_log(&mut both, runner, id, log).await? {
            both.rollback().await?;
            return Ok(None);
        }
        both.commit().await?;
        Ok(Some(Job::try_from(row)?))
    }

    /// The runner's compare-and-set to `columns`, then, if it held, job
    /// `id`'s log: whether it held (the caller rolls back when not).
    async fn runner_then_log(
        &self,
        connection: &mut <D::Db as Database>::Connection,
        (runner, version, columns): (RunnerId, i64, &Columns),
        id: JobId,
        log: Option<&(Option<i64>, String)>,
    ) -> Result<bool, StoreError> {
        let replaced = bind_columns(sqlx::query(&self.statements.replace_runner), columns)
            .bind(runner.0)
            .bind(version)
            .execute(&mut *connection)
            .await?
            .rows_affected()
            == 1;
        if let (true, Some((exit, text))) = (replaced, log) {
            sqlx::query(&self.statements.runner_api.put_log)
                .bind(id.0)
                .bind(*exit)
                .bind(text.as_str())
                .execute(&mut *connection)
                .await?;
        }
        Ok(replaced)
    }

    /// [`Op::CompleteNext`], for a dialect whose claim that starts a job is
    /// a statement of its own (SQLite), in the fewest statements: the guarded
    /// completion, the claim, then the runner's compare-and-set straight to
    /// its final row (busy with the claimed job, or free), then the log;
    /// anything that does not hold rolls all of it back. The runner is
    /// written once, and its compare-and-set comes after the claim, which
    /// is safe because nothing is kept unless it holds.
    async fn complete_next(
        &self,
        connection: &mut <D::Db as Database>::Connection,
        next: &CompleteNext,
    ) -> Result<Outcome, StoreError> {
        let ClaimStartSql::ThenRunner(claim_sql) = &self.statements.claim_start else {
            // A dialect whose claim writes the runner too has the one
            // statement (`Dialect::complete_next_statement`) instead.
            return Err(StoreError::Corrupt(
                "a completion with its next job was queued for a dialect that writes it in one statement".into(),
            ));
        };
        // A savepoint inside a shared transaction, a transaction of its
        // own otherwise: the completion and the start commit together.
        let mut both = sqlx::Connection::begin(&mut *connection).await?;
        let ended: Option<JobRow> = bind_guarded(
            sqlx::query_as(&self.statements.guarded_job),
            next.id,
            &next.change,
            &next.step,
        )
        .fetch_all(&mut *both)
        .await?
        .pop();
        let Some(ended) = ended else {
            both.rollback().await?;
            return Ok(Outcome::CompletedNext(None, None));
        };
        let labels = claim_labels(&next.claim);
        let lease_deadline = next.now.plus(next.claim.lease).as_millis();
        let started: Option<JobRow> = bind_claim(
            sqlx::query_as(claim_sql),
            &next.claim,
            (1, lease_deadline),
            labels.as_deref(),
            &next.steps,
        )
        .bind(next.now.as_millis())
        .fetch_all(&mut *both)
        .await?
        .pop();
        let started = started.map(Job::try_from).transpose()?;
        let final_row = match &started {
            Some(job) => Columns::from(&Runner {
                job: Some(job.id),
                ..next.busy.clone()
            }),
            None => Columns::from(&next.finished),
        };
        let runner = (next.runner, next.runner_version, &final_row);
        if !self
            .runner_then_log(&mut both, runner, next.id, next.log.as_ref())
            .await?
        {
            both.rollback().await?;
            return Ok(Outcome::CompletedNext(None, None));
        }
        both.commit().await?;
        Ok(Outcome::CompletedNext(
            Some(Box::new(Job::try_from(ended)?)),
            started.map(Box::new),
        ))
    }

    async fn execute_one(
        &self,
        connection: &mut <D::Db as Database>::Connection,
        op: &Op,
    ) -> Result<Outcome, StoreError> {
        let transaction = connection;
        Ok(match op {
            Op::Enqueue { job, delivery, now } => {
                let new_delivery = match delivery {
                    Some(delivery) => self.insert_delivery(&mut *transaction, delivery).await?,
                    None => false,
                };
                let enqueued = self.insert_job(&mut *transaction, job, *now).await?;
                Outcome::Enqueued(Box::new(enqueued), new_delivery)
            }
            Op::RecordDelivery { delivery } => {
                Outcome::Recorded(self.insert_delivery(&mut *transaction, delivery).await?)
            }
            Op::Replace {
                id,
                version,
                next,
                step,
            } => {
                let result = bind_columns(sqlx::query(&self.statements.replace_job), next)
                    .bind(id.0)
                    .bind(*version)
                    .bind(step.as_str())
                    .execute(&mut *transaction)
                    .await?;
                Outcome::Replaced(result.rows_affected() == 1)
            }
            Op::ReplaceWithRunner {
                id,
                version,
                next,
                runner,
                runner_version,
                runner_next,
                step,
            } => {
                // A savepoint inside a shared transaction, a
                // transaction of its own otherwise: either way both
                // rows change or neither does.
                let mut both = sqlx::Connection::begin(&mut *transaction).await?;
                let job = bind_columns(sqlx::query(&self.statements.replace_job), next)
                    .bind(id.0)
                    .bind(*version)
                    .bind(step.as_str())
                    .execute(&mut *both)
                    .await?;
                let replaced = job.rows_affected() == 1 && {
                    let runner =
                        bind_columns(sqlx::query(&self.statements.replace_runner), runner_next)
                            .bind(runner.0)
                            .bind(*runner_version)
                            .execute(&mut *both)
                            .await?;
                    runner.rows_affected() == 1
                };
                if replaced {
                    both.commit().await?;
                } else {
                    both.rollback().await?;
                }
                Outcome::Replaced(replaced)
            }
            Op::Guarded { id, change, step } => {
                // Run to its end, as every write (see `insert_job`).
                let row: Option<JobRow> = bind_guarded(
                    sqlx::query_as(&self.statements.guarded_job),
                    *id,
                    change,
                    step,
                )
                .fetch_all(&mut *transaction)
                .await?
                .pop();
                Outcome::Changed(row.map(Job::try_from).transpose()?.map(Box::new))
            }
            Op::ClaimStart {
                claim,
                runner_version,
                runner_next,
                steps,
                now,
            } => {
                self.claim_start(
                    transaction,
                    claim,
                    (*runner_version, runner_next),
                    steps,
                    *now,
                )
                .await?
            }
            Op::GuardedWithRunner {
                id,
                change,
                step,
                runner,
                runner_version,
                runner_next,
                log,
            } => {
                let runner_next = Columns::from(runner_next.as_ref());
                let job = self
                    .guarded_with_runner(
                        transaction,
                        *id,
                        (change, step),
                        (*runner, *runner_version, &runner_next),
                        log.as_ref(),
                    )
                    .await?;
                Outcome::Changed(job.map(Box::new))
            }
            Op::CompleteNext(next) => self.complete_next(transaction, next).await?,
            Op::Claim { claim, now } => {
                let labels = claim_labels(claim);
                let step = holder_step(JobState::Provisioning, claim.runner, *now);
                let lease_deadline = now.plus(claim.lease).as_millis();
                let rows: Vec<JobRow> = bind_claim(
                    sqlx::query_as(&self.statements.claim),
                    claim,
                    (i64::from(claim.limit), lease_deadline),
                    labels.as_deref(),
                    &step,
                )
                .fetch_all(&mut *transaction)
                .await?;
                Outcome::Claimed(
                    rows.into_iter()
                        .map(Job::try_from)
                        .collect::<Result<_, _>>()?,
                )
            }
        })
    }
}

#[async_trait]
impl<D: Dialect> Store for SqlStore<D>
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
        let mut jobs = Vec::with_capacity(ids.len());
        // A bounded statement a chunk (SQLite allows 32,766 parameters).
        for chunk in ids.chunks(500) {
            let places: Vec<String> = (1..=chunk.len()).map(|n| format!("${n}")).collect();
            let sql = format!(
                "SELECT id, {JOB_COLUMNS} FROM jobs WHERE id IN ({}) ORDER BY id",
                places.join(", ")
            );
            let mut query = sqlx::query_as::<_, JobRow>(&sql);
            for id in chunk {
                query = query.bind(id.0);
            }
            for row in query.fetch_all(self.reader()).await? {
                jobs.push(Job::try_from(row)?);
            }
        }
        jobs.sort_by_key(|job| job.id);
        Ok(jobs)
    }

    async fn get_job(&self, id: JobId) -> Result<Option<Job>, StoreError> {
        let mut connection = self.inner.held_reads().acquire().await?;
        let row = sqlx::query_as(&self.inner.statements.job_by_id)
            .bind(id.0)
            .fetch_optional(&mut *connection)
            .await
            .map_err(StoreError::from);
        let row: Option<JobRow> = connection.settle(row)?;
        row.map(Job::try_from).transpose()
    }

    async fn find_job(
        &self,
        source: JobSource,
        external_id: &str,
    ) -> Result<Option<Job>, StoreError> {
        let row: Option<JobRow> = sqlx::query_as(&self.inner.statements.job_by_external_id)
            .bind(source.as_str())
            .bind(external_id)
            .fetch_optional(self.reader())
            .await?;
        row.map(Job::try_from).transpose()
    }

    async fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<Job>, StoreError> {
        // The state is written into the statement, not bound: one of a
        // fixed set of words, and only as a literal can the planner read a
        // live state through the partial index made for it (PostgreSQL's
        // generic plans cannot), never the whole history.
        let state = match filter.state {
            Some(state) => format!(" AND state = '{}'", state.as_str()),
            None => String::new(),
        };
        let mut sql = Filter::new(format!(
            "SELECT id, {JOB_COLUMNS} FROM jobs WHERE 1 = 1{state}"
        ));
        sql.and_if(filter.pool.is_some(), "pool =")
            .and_if(filter.before.is_some(), "id <")
            .and_if(filter.after.is_some(), "id >")
            .then(if filter.newest_first {
                " ORDER BY id DESC"
            } else if filter.oldest_first {
                " ORDER BY id"
            } else {
                " ORDER BY share_tag, id"
            })
            .then_if(filter.limit.is_some(), " LIMIT");
        let mut query = sqlx::query_as::<_, JobRow>(&sql.text);
        if let Some(pool) = &filter.pool {
            query = query.bind(pool.as_str());
        }
        if let Some(before) = filter.before {
            query = query.bind(before.0);
        }
        if let Some(after) = filter.after {
            query = query.bind(after.0);
        }
        if let Some(limit) = filter.limit {
            query = query.bind(i64::from(limit));
        }
        let rows = query.fetch_all(self.reader()).await?;
        rows.into_iter().map(Job::try_from).collect()
    }

    async fn queue_times(
        &self,
        since: Timestamp,
        limit: u32,
    ) -> Result<Vec<(String, std::time::Duration)>, StoreError> {
        let rows: Vec<(String, i64)> = sqlx::query_as(&self.inner.statements.queue_times)
            .bind(since.as_millis())
            .bind(i64::from(limit))
            .fetch_all(self.reader())
            .await?;
        Ok(rows
            .into_iter()
            .map(|(pool, waited)| {
                let millis = u64::try_from(waited).unwrap_or(0);
                (pool, std::time::Duration::from_millis(millis))
            })
            .collect())
    }

    async fn live_job_counts(&self) -> Result<Vec<JobCount>, StoreError> {
        let rows: Vec<(Option<String>, String, i64)> =
            sqlx::query_as(&format!("SELECT pool, state, COUNT(*) FROM jobs WHERE {} GROUP BY pool, state ORDER BY pool, state", crate::LIVE_JOB))
                .fetch_all(self.reader())
                .await?;
        rows.into_iter()
            .map(|(pool, state, count)| {
                Ok(JobCount {
                    pool,
                    state: state
                        .parse()
                        .map_err(|e| StoreError::Corrupt(format!("job count: {e}")))?,
                    count: u64::try_from(count).unwrap_or(0),
                })
            })
            .collect()
    }

    async fn queued_count(&self, pool: &str) -> Result<u64, StoreError> {
        let (count,): (i64,) =
            sqlx::query_as("SELECT COUNT(*) FROM jobs WHERE state = 'queued' AND pool = $1")
                .bind(pool)
                .fetch_one(self.reader())
                .await?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    async fn share_counts(&self, pool: &str) -> Result<Vec<crate::ShareCount>, StoreError> {
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(&format!(
            "SELECT share_key, \
                    SUM(CASE WHEN state = 'queued' THEN 1 ELSE 0 END), \
                    SUM(CASE WHEN state = 'queued' THEN 0 ELSE 1 END) \
             FROM jobs WHERE pool = $1 AND {} GROUP BY share_key",
            crate::LIVE_JOB
        ))
        .bind(pool)
        .fetch_all(self.reader())
        .await?;
        Ok(rows
            .into_iter()
            .map(|(key, queued, active)| crate::ShareCount {
                key,
                queued: u64::try_from(queued).unwrap_or(0),
                active: u64::try_from(active).unwrap_or(0),
            })
            .collect())
    }

    async fn jobs_with_expired_leases(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> Result<Vec<Job>, StoreError> {
        let rows: Vec<JobRow> = sqlx::query_as(&self.inner.statements.expired_leases)
            .bind(now.as_millis())
            .bind(i64::from(limit))
            .fetch_all(self.reader())
            .await?;
        rows.into_iter().map(Job::try_from).collect()
    }

    async fn replace_job(&self, current: &Job, next: &Job) -> Result<bool, StoreError> {
        let op = Op::Replace {
            id: current.id,
            version: current.version,
            next: Box::new(Columns::from(next)),
            step: history_line(current.step_to(next, None).as_ref()),
        };
        match self.group.submit(op).await? {
            Outcome::Replaced(replaced) => Ok(replaced),
            _ => Err(StoreError::Corrupt(
                "group commit answered a replace with another outcome".into(),
            )),
        }
    }

    async fn apply_guarded(
        &self,
        id: JobId,
        change: &runway_core::GuardedChange,
    ) -> Result<Option<Job>, StoreError> {
        let op = Op::Guarded {
            id,
            change: change.clone(),
            step: history_line(change.step().as_ref()),
        };
        match self.group.submit(op).await? {
            Outcome::Changed(job) => Ok(job.map(|job| *job)),
            _ => Err(StoreError::Corrupt(
                "group commit answered a guarded change with another outcome".into(),
            )),
        }
    }

    async fn claim_and_start(
        &self,
        claim: &Claim,
        runner: &Runner,
        now: Timestamp,
    ) -> Result<ClaimStart, StoreError> {
        let runner_next = runway_core::moves::start_on_claim(runner, now)?;
        let op = Op::ClaimStart {
            claim: Claim {
                runner: runner.id,
                limit: 1,
                ..claim.clone()
            },
            runner_version: runner.version,
            runner_next: Box::new(runner_next.clone()),
            steps: start_steps(runner.id, now),
            now,
        };
        let stored_version = match self.group.submit(op).await? {
            Outcome::ClaimedStart(Ok(job)) => {
                let mut busy = runner_next;
                busy.job = Some(job.id);
                return Ok(ClaimStart::Started(Box::new(Moved {
                    job: *job,
                    runner: Some(busy),
                })));
            }
            Outcome::ClaimedStart(Err(version)) => version,
            _ => {
                return Err(StoreError::Corrupt(
                    "group commit answered a claim with another outcome".into(),
                ))
            }
        };
        // Nothing claimed: no job for this runner, or the runner is no
        // longer the row the decision was made on. Versions only grow, so
        // the same version means the former. Where the claim read the
        // runner's version itself (PostgreSQL), a waiting runner woken for
        // a job another took pays one statement, not two.
        if stored_version == Some(runner.version) {
            return Ok(ClaimStart::NoJob);
        }
        match self.get_runner(runner.id).await? {
            Some(fresh) if fresh.version == runner.version => Ok(ClaimStart::NoJob),
            Some(fresh) => Ok(ClaimStart::RunnerChanged(Box::new(fresh))),
            None => Err(StoreError::RunnerNotFound(runner.id)),
        }
    }

    async fn apply_guarded_with_runner(
        &self,
        id: JobId,
        change: &runway_core::GuardedChange,
        runner: (&Runner, &Runner),
        log: Option<(Option<i64>, &str)>,
    ) -> Result<Option<Moved>, StoreError> {
        let (current, next) = runner;
        let op = Op::GuardedWithRunner {
            id,
            change: change.clone(),
            step: history_line(change.step().as_ref()),
            runner: current.id,
            runner_version: current.version,
            runner_next: Box::new(next.clone()),
            log: log.map(|(exit, text)| (exit, text.to_owned())),
        };
        match self.group.submit(op).await? {
            Outcome::Changed(job) => Ok(job.map(|job| Moved {
                job: *job,
                runner: Some(next.clone()),
            })),
            _ => Err(StoreError::Corrupt(
                "group commit answered a guarded change with another outcome".into(),
            )),
        }
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
        let (current, finished) = runner;
        let Ok(busy) = runway_core::moves::start_on_claim(finished, now) else {
            // The runner stops or drains after this job: a completion only.
            return crate::complete_then_start(self, id, change, runner, log, claim, now).await;
        };
        let step = history_line(change.step().as_ref());
        let steps = start_steps(current.id, now);
        let Some(sql) = &self.inner.statements.complete_next else {
            // No one statement here: both writes as one op of the group
            // commit, so they share a transaction and its one flush.
            let op = Op::CompleteNext(Box::new(CompleteNext {
                id,
                change: change.clone(),
                step,
                runner: current.id,
                runner_version: current.version,
                finished: finished.clone(),
                log: log.map(|(exit, text)| (exit, text.to_owned())),
                claim: Claim {
                    runner: current.id,
                    limit: 1,
                    ..claim.clone()
                },
                busy: busy.clone(),
                steps,
                now,
            }));
            return match self.group.submit(op).await? {
                Outcome::CompletedNext(ended, started) => {
                    Ok(ended
                        .map(|job| completed_next(*job, started.map(|job| *job), finished, busy)))
                }
                _ => Err(StoreError::Corrupt(
                    "group commit answered a completion with another outcome".into(),
                )),
            };
        };
        let labels = claim_labels(claim);
        let (finished_columns, busy_columns) = (Columns::from(finished), Columns::from(&busy));
        let mut connection = self.inner.held.acquire().await?;
        let result = async {
            let query = bind_guarded(sqlx::query(sql), id, change, &step)
                .bind(current.id.0)
                .bind(current.version);
            let query = bind_columns(query, &finished_columns)
                .bind(i64::from(log.is_some()))
                .bind(log.and_then(|(exit, _)| exit))
                .bind(log.map(|(_, text)| text))
                .bind(claim.pool.as_str())
                .bind(now.plus(claim.lease).as_millis())
                .bind(labels.as_deref())
                .bind(steps.as_str())
                .bind(now.as_millis())
                .bind(claim.max_running_per_key.map(i64::from));
            // Run to its end, as every write (see `insert_job`).
            let rows = bind_columns(query, &busy_columns)
                .fetch_all(&mut *connection)
                .await?;
            let (mut ended, mut next) = (None, None);
            for row in &rows {
                let part: i64 = row.try_get("part")?;
                let job = Job::try_from(JobRow::from_row(row)?)?;
                if part == 0 {
                    ended = Some(job);
                } else {
                    next = Some(job);
                }
            }
            Ok::<_, StoreError>(ended.map(|job| completed_next(job, next, finished, busy)))
        }
        .await;
        connection.settle(result)
    }

    async fn enqueue_with_delivery(
        &self,
        job: &NewJob,
        delivery: Option<&Delivery>,
        now: Timestamp,
    ) -> Result<(Enqueued, bool), StoreError> {
        if let (Some(delivery), Some(sql)) = (delivery, &self.inner.statements.enqueue_delivery) {
            let mut connection = self.inner.held.acquire().await?;
            let result = self
                .inner
                .enqueue_delivery(&mut connection, sql, job, delivery, now)
                .await;
            return connection.settle(result);
        }
        let op = Op::Enqueue {
            job: job.clone(),
            delivery: delivery.cloned(),
            now,
        };
        match self.group.submit(op).await? {
            Outcome::Enqueued(enqueued, new_delivery) => Ok((*enqueued, new_delivery)),
            _ => Err(StoreError::Corrupt(
                "group commit answered an enqueue with another outcome".into(),
            )),
        }
    }

    async fn delivery_seen(&self, id: &str) -> Result<bool, StoreError> {
        let seen: Option<i64> = sqlx::query_scalar(&self.inner.statements.delivery_seen)
            .bind(id)
            .fetch_optional(self.reader())
            .await?;
        Ok(seen.is_some())
    }

    async fn record_delivery(&self, delivery: &Delivery) -> Result<bool, StoreError> {
        let op = Op::RecordDelivery {
            delivery: delivery.clone(),
        };
        match self.group.submit(op).await? {
            Outcome::Recorded(new) => Ok(new),
            _ => Err(StoreError::Corrupt(
                "group commit answered a delivery with another outcome".into(),
            )),
        }
    }

    async fn claim(&self, claim: &Claim, now: Timestamp) -> Result<Vec<Job>, StoreError> {
        let op = Op::Claim {
            claim: claim.clone(),
            now,
        };
        match self.group.submit(op).await? {
            Outcome::Claimed(mut jobs) => {
                jobs.sort_by_key(|job| (job.enqueued_at, job.id));
                Ok(jobs)
            }
            _ => Err(StoreError::Corrupt(
                "group commit answered a claim with another outcome".into(),
            )),
        }
    }

    async fn create_runner(
        &self,
        runner: &NewRunner,
        now: Timestamp,
    ) -> Result<Runner, StoreError> {
        // The id is assigned by the database; the placeholder is ignored.
        let initial = runner.initial(RunnerId(0), now);
        let columns = Columns::from(&initial);
        // Run to its end, as every write (see `insert_job`).
        let row = bind_columns(sqlx::query(&self.inner.statements.insert_runner), &columns)
            .fetch_all(self.writer())
            .await
            .and_then(|rows| {
                rows.first()
                    .map(RunnerRow::from_row)
                    .unwrap_or(Err(sqlx::Error::RowNotFound))
            });
        match row {
            Ok(row) => Runner::try_from(row),
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                Err(StoreError::DuplicateRunnerName(runner.name.clone()))
            }
            Err(e) => Err(e.into()),
        }
    }

    async fn get_runner(&self, id: RunnerId) -> Result<Option<Runner>, StoreError> {
        let mut connection = self.inner.held_reads().acquire().await?;
        let row = sqlx::query_as(&self.inner.statements.runner_by_id)
            .bind(id.0)
            .fetch_optional(&mut *connection)
            .await
            .map_err(StoreError::from);
        let row: Option<RunnerRow> = connection.settle(row)?;
        row.map(Runner::try_from).transpose()
    }

    async fn find_runner(&self, name: &str) -> Result<Option<Runner>, StoreError> {
        let row: Option<RunnerRow> = sqlx::query_as(&self.inner.statements.runner_by_name)
            .bind(name)
            .fetch_optional(self.reader())
            .await?;
        row.map(Runner::try_from).transpose()
    }

    async fn list_runners(&self, filter: &RunnerFilter) -> Result<Vec<Runner>, StoreError> {
        let mut sql = Filter::new(format!(
            "SELECT id, {RUNNER_COLUMNS} FROM runners WHERE 1 = 1"
        ));
        let state = filter.state.map(|state| state.as_str());
        sql.and_if(state.is_some(), "state =")
            .and_if(filter.pool.is_some(), "pool =")
            .then(" ORDER BY id");
        let mut query = sqlx::query_as::<_, RunnerRow>(&sql.text);
        if let Some(state) = state {
            query = query.bind(state);
        }
        if let Some(pool) = &filter.pool {
            query = query.bind(pool.as_str());
        }
        let rows = query.fetch_all(self.reader()).await?;
        rows.into_iter().map(Runner::try_from).collect()
    }

    async fn list_live_runners(&self, pool: Option<&str>) -> Result<Vec<Runner>, StoreError> {
        // The predicate is the index's own, word for word, so both
        // planners use the partial index.
        let mut sql = Filter::new(format!(
            "SELECT id, {RUNNER_COLUMNS} FROM runners WHERE {LIVE_RUNNER}"
        ));
        sql.and_if(pool.is_some(), "pool =").then(" ORDER BY id");
        let mut query = sqlx::query_as::<_, RunnerRow>(&sql.text);
        if let Some(pool) = pool {
            query = query.bind(pool);
        }
        let rows = query.fetch_all(self.reader()).await?;
        rows.into_iter().map(Runner::try_from).collect()
    }

    async fn create_registration_token(
        &self,
        token_hash: &str,
        pool: &str,
        runner: Option<RunnerId>,
        expires_at: Timestamp,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        sqlx::query(&self.inner.statements.runner_api.insert_registration)
            .bind(token_hash)
            .bind(pool)
            .bind(now.as_millis())
            .bind(expires_at.as_millis())
            .bind(runner.map(|r| r.0))
            .execute(self.writer())
            .await?;
        Ok(())
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
        let sql = &self.inner.statements.runner_api;
        let mut connection = self.writer().acquire().await?;
        let result: Result<Registration, StoreError> = async {
            let mut transaction = sqlx::Connection::begin(&mut *connection).await?;
            let redeemed: Option<(String, Option<i64>)> = sqlx::query_as(&sql.redeem_registration)
                .bind(registration_token_hash)
                .bind(now.as_millis())
                .bind(attempt_hash)
                .fetch_optional(&mut *transaction)
                .await?;
            let Some((pool, bound)) = redeemed else {
                // Used (or unknown, or expired): the same attempt again?
                let Some(attempt_hash) = attempt_hash else {
                    return Err(StoreError::InvalidToken);
                };
                let used_by: Option<i64> = sqlx::query_scalar(&sql.repeat_registration)
                    .bind(registration_token_hash)
                    .bind(now.as_millis())
                    .bind(attempt_hash)
                    .fetch_optional(&mut *transaction)
                    .await?
                    .flatten();
                let id = used_by.ok_or(StoreError::InvalidToken)?;
                let row: Option<RunnerRow> = sqlx::query_as(&self.inner.statements.runner_by_id)
                    .bind(id)
                    .fetch_optional(&mut *transaction)
                    .await?;
                let runner = row
                    .map(Runner::try_from)
                    .transpose()?
                    .ok_or(StoreError::InvalidToken)?;
                let untouched = matches!(
                    runner.state,
                    runway_core::RunnerState::Requested
                        | runway_core::RunnerState::Provisioning
                        | runway_core::RunnerState::Idle
                ) && runner.job.is_none()
                    && runner.busy_at.is_none()
                    && runner.name == name
                    && (runner.origin() != runway_core::RunnerOrigin::Registered
                        || runner.labels == labels);
                if !untouched {
                    return Err(StoreError::InvalidToken);
                }
                sqlx::query(&sql.set_runner_token)
                    .bind(runner.id.0)
                    .bind(runner_token_hash)
                    .execute(&mut *transaction)
                    .await?;
                transaction.commit().await?;
                return Ok(Registration {
                    runner,
                    repeated: true,
                });
            };
            let runner = match bound {
                // Minted for a record the reconciler created: adopt it. A
                // record that already failed (boot timeout) admits no one.
                Some(id) => {
                    let row: Option<RunnerRow> =
                        sqlx::query_as(&self.inner.statements.runner_by_id)
                            .bind(id)
                            .fetch_optional(&mut *transaction)
                            .await?;
                    let current = row
                        .map(Runner::try_from)
                        .transpose()?
                        .ok_or(StoreError::InvalidToken)?;
                    let next = if matches!(
                        current.state,
                        runway_core::RunnerState::Requested
                            | runway_core::RunnerState::Provisioning
                    ) {
                        current.apply(&runway_core::RunnerEvent::Ready, now)?
                    } else {
                        return Err(StoreError::InvalidToken);
                    };
                    let columns = Columns::from(&next);
                    let updated =
                        bind_columns(sqlx::query(&self.inner.statements.replace_runner), &columns)
                            .bind(current.id.0)
                            .bind(current.version)
                            .execute(&mut *transaction)
                            .await?;
                    if updated.rows_affected() != 1 {
                        return Err(StoreError::Contention {
                            what: format!("runner {}", current.id),
                        });
                    }
                    next
                }
                None => {
                    let new = NewRunner {
                        name: name.to_owned(),
                        pool,
                        provider: runway_core::RunnerOrigin::Registered.column().to_owned(),
                        labels: labels.to_vec(),
                    };
                    let columns = Columns::from(&new.initial(RunnerId(0), now));
                    let row =
                        bind_columns(sqlx::query(&self.inner.statements.insert_runner), &columns)
                            .fetch_one(&mut *transaction)
                            .await
                            .and_then(|row| RunnerRow::from_row(&row));
                    match row {
                        Ok(row) => Runner::try_from(row)?,
                        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                            return Err(StoreError::DuplicateRunnerName(name.to_owned()))
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
            };
            sqlx::query(&sql.set_runner_token)
                .bind(runner.id.0)
                .bind(runner_token_hash)
                .execute(&mut *transaction)
                .await?;
            sqlx::query(&sql.registered_by)
                .bind(registration_token_hash)
                .bind(runner.id.0)
                .execute(&mut *transaction)
                .await?;
            transaction.commit().await?;
            Ok(Registration {
                runner,
                repeated: false,
            })
        }
        .await;
        crate::sql::settle(connection, result)
    }

    async fn init_setting(&self, key: &str, candidate: &str) -> Result<String, StoreError> {
        let sql = &self.inner.statements.runner_api;
        sqlx::query(&sql.insert_setting)
            .bind(key)
            .bind(candidate)
            .execute(self.writer())
            .await?;
        let value: String = sqlx::query_scalar(&sql.get_setting)
            .bind(key)
            .fetch_one(self.writer())
            .await?;
        Ok(value)
    }

    async fn job_history(
        &self,
        id: JobId,
    ) -> Result<Option<Vec<runway_core::JobStep>>, StoreError> {
        let Some(job) = self.get_job(id).await? else {
            return Ok(None);
        };
        let history: Option<String> = sqlx::query_scalar("SELECT history FROM jobs WHERE id = $1")
            .bind(id.0)
            .fetch_optional(self.reader())
            .await?;
        let mut steps = vec![job.first_step()];
        steps.extend(crate::rows::parse_history(
            id,
            history.as_deref().unwrap_or(""),
        )?);
        Ok(Some(steps))
    }

    async fn set_pool_paused(
        &self,
        pool: &str,
        by: Option<&str>,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let done = match by {
            Some(by) => {
                sqlx::query(
                    "INSERT INTO pool_pauses (pool, paused_by, paused_at) VALUES ($1, $2, $3) \
                     ON CONFLICT (pool) DO NOTHING",
                )
                .bind(pool)
                .bind(by)
                .bind(now.as_millis())
                .execute(self.writer())
                .await?
            }
            None => {
                sqlx::query("DELETE FROM pool_pauses WHERE pool = $1")
                    .bind(pool)
                    .execute(self.writer())
                    .await?
            }
        };
        Ok(done.rows_affected() == 1)
    }

    async fn paused_pools(&self) -> Result<Vec<crate::PausedPool>, StoreError> {
        let rows: Vec<(String, String, i64)> =
            sqlx::query_as("SELECT pool, paused_by, paused_at FROM pool_pauses ORDER BY pool")
                .fetch_all(self.reader())
                .await?;
        Ok(rows
            .into_iter()
            .map(|(pool, by, at)| crate::PausedPool {
                pool,
                by,
                at: Timestamp::from_millis(at),
            })
            .collect())
    }

    async fn record_pool_samples(&self, samples: &[crate::PoolSample]) -> Result<(), StoreError> {
        if samples.is_empty() {
            return Ok(());
        }
        let mut connection = self.inner.held.acquire().await?;
        let result = async {
            let mut transaction = sqlx::Connection::begin(&mut *connection).await?;
            for sample in samples {
                sqlx::query(
                    "INSERT INTO pool_samples (pool, at, queued, running, booting, idle, busy, \
                       started, wait_p50_ms, wait_p95_ms, runner_seconds, cost_micros) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
                     ON CONFLICT (pool, at) DO UPDATE SET queued = excluded.queued, \
                       running = excluded.running, booting = excluded.booting, \
                       idle = excluded.idle, busy = excluded.busy, started = excluded.started, \
                       wait_p50_ms = excluded.wait_p50_ms, wait_p95_ms = excluded.wait_p95_ms, \
                       runner_seconds = excluded.runner_seconds, cost_micros = excluded.cost_micros",
                )
                .bind(sample.pool.as_str())
                .bind(sample.at.as_millis())
                .bind(sample.queued)
                .bind(sample.running)
                .bind(sample.booting)
                .bind(sample.idle)
                .bind(sample.busy)
                .bind(sample.started)
                .bind(sample.wait_p50_ms)
                .bind(sample.wait_p95_ms)
                .bind(sample.runner_seconds)
                .bind(sample.cost_micros)
                .execute(&mut *transaction)
                .await?;
                sqlx::query("DELETE FROM pool_waits WHERE pool = $1 AND at = $2")
                    .bind(sample.pool.as_str())
                    .bind(sample.at.as_millis())
                    .execute(&mut *transaction)
                    .await?;
                for (reason, jobs) in &sample.waits {
                    sqlx::query(
                        "INSERT INTO pool_waits (pool, at, reason, jobs) VALUES ($1, $2, $3, $4)",
                    )
                    .bind(sample.pool.as_str())
                    .bind(sample.at.as_millis())
                    .bind(reason.as_str())
                    .bind(*jobs)
                    .execute(&mut *transaction)
                    .await?;
                }
            }
            transaction.commit().await?;
            Ok(())
        }
        .await;
        connection.settle(result)
    }

    async fn pool_history(
        &self,
        pool: Option<&str>,
        since: Timestamp,
        bucket: Duration,
    ) -> Result<Vec<crate::PoolHistoryPoint>, StoreError> {
        let width = i64::try_from(bucket.as_millis()).unwrap_or(i64::MAX).max(1);
        // Sums, not means: PostgreSQL's sum of bigints is a numeric, cast
        // back; the means are taken here.
        let rows: Vec<(
            String,
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
            Option<i64>,
            Option<i64>,
            i64,
            i64,
        )> = sqlx::query_as(
            "SELECT pool, (at / $3) * $3 AS bucket, COUNT(*), \
                   CAST(SUM(queued) AS BIGINT), CAST(SUM(running) AS BIGINT), \
                   CAST(SUM(booting) AS BIGINT), CAST(SUM(idle) AS BIGINT), \
                   CAST(SUM(busy) AS BIGINT), CAST(SUM(started) AS BIGINT), \
                   CAST(SUM(wait_p50_ms * started) AS BIGINT), MAX(wait_p95_ms), \
                   CAST(SUM(runner_seconds) AS BIGINT), CAST(SUM(cost_micros) AS BIGINT) \
                 FROM pool_samples WHERE at >= $2 AND ($1 IS NULL OR pool = $1) \
                 GROUP BY pool, bucket ORDER BY pool, bucket",
        )
        .bind(pool)
        .bind(since.as_millis())
        .bind(width)
        .fetch_all(self.reader())
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(
                    pool,
                    at,
                    samples,
                    queued,
                    running,
                    booting,
                    idle,
                    busy,
                    started,
                    p50,
                    p95,
                    seconds,
                    cost,
                )| {
                    let mean = |sum: i64| sum as f64 / samples.max(1) as f64;
                    crate::PoolHistoryPoint {
                        pool,
                        at: Timestamp::from_millis(at),
                        samples,
                        queued: mean(queued),
                        running: mean(running),
                        booting: mean(booting),
                        idle: mean(idle),
                        busy: mean(busy),
                        started,
                        wait_p50_ms: p50
                            .filter(|_| started > 0)
                            .map(|weighted| weighted / started),
                        wait_p95_ms: p95,
                        runner_seconds: seconds,
                        cost_micros: cost,
                    }
                },
            )
            .collect())
    }

    async fn pool_waits(
        &self,
        pool: &str,
        since: Timestamp,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        Ok(sqlx::query_as(
            "SELECT reason, CAST(SUM(jobs) AS BIGINT) AS total FROM pool_waits \
             WHERE pool = $1 AND at >= $2 GROUP BY reason ORDER BY total DESC, reason",
        )
        .bind(pool)
        .bind(since.as_millis())
        .fetch_all(self.reader())
        .await?)
    }

    async fn add_audit(&self, entry: &crate::AuditEntry) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO audit (at, actor, action, target, details) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(entry.at.as_millis())
        .bind(entry.actor.as_str())
        .bind(entry.action.as_str())
        .bind(entry.target.as_str())
        .bind(entry.details.as_str())
        .execute(self.writer())
        .await?;
        Ok(())
    }

    async fn list_audit(
        &self,
        limit: u32,
        before: Option<i64>,
    ) -> Result<Vec<crate::AuditEntry>, StoreError> {
        let rows: Vec<(i64, i64, String, String, String, String)> = sqlx::query_as(
            "SELECT id, at, actor, action, target, details FROM audit \
             WHERE $1 IS NULL OR id < $1 ORDER BY id DESC LIMIT $2",
        )
        .bind(before)
        .bind(i64::from(limit))
        .fetch_all(self.reader())
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(id, at, actor, action, target, details)| crate::AuditEntry {
                    id,
                    at: Timestamp::from_millis(at),
                    actor,
                    action,
                    target,
                    details,
                },
            )
            .collect())
    }

    async fn get_setting(&self, key: &str) -> Result<Option<String>, StoreError> {
        let value: Option<String> =
            sqlx::query_scalar(&self.inner.statements.runner_api.get_setting)
                .bind(key)
                .fetch_optional(self.reader())
                .await?;
        Ok(value)
    }

    async fn put_setting(&self, key: &str, value: &str) -> Result<(), StoreError> {
        sqlx::query(&self.inner.statements.runner_api.put_setting)
            .bind(key)
            .bind(value)
            .execute(self.writer())
            .await?;
        Ok(())
    }

    async fn claim_once(
        &self,
        key: &str,
        now: Timestamp,
        forget_before: Timestamp,
    ) -> Result<bool, StoreError> {
        let sql = &self.inner.statements.runner_api;
        sqlx::query(&sql.prune_once)
            .bind(forget_before.as_millis())
            .execute(self.writer())
            .await?;
        let done = sqlx::query(&sql.claim_once)
            .bind(key)
            .bind(now.as_millis())
            .execute(self.writer())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn once_claimed(&self, key: &str) -> Result<bool, StoreError> {
        let found: Option<(i64,)> = sqlx::query_as("SELECT done_at FROM once_keys WHERE key = $1")
            .bind(key)
            .fetch_optional(self.reader())
            .await?;
        Ok(found.is_some())
    }

    async fn forget_once(&self, key: &str) -> Result<(), StoreError> {
        sqlx::query(&self.inner.statements.runner_api.forget_once)
            .bind(key)
            .execute(self.writer())
            .await?;
        Ok(())
    }

    async fn set_runner_external_id(
        &self,
        runner: RunnerId,
        external_id: &str,
    ) -> Result<(), StoreError> {
        let done = sqlx::query(&self.inner.statements.runner_api.set_external_id)
            .bind(runner.0)
            .bind(external_id)
            .execute(self.writer())
            .await?;
        if done.rows_affected() == 0 {
            return Err(StoreError::RunnerNotFound(runner));
        }
        Ok(())
    }

    async fn runner_external_id(&self, runner: RunnerId) -> Result<Option<String>, StoreError> {
        let value: Option<Option<String>> =
            sqlx::query_scalar(&self.inner.statements.runner_api.get_external_id)
                .bind(runner.0)
                .fetch_optional(self.reader())
                .await?;
        Ok(value.flatten())
    }

    async fn ended_runners_registered(&self, limit: u32) -> Result<Vec<Runner>, StoreError> {
        let sql = format!(
            "SELECT id, {RUNNER_COLUMNS} FROM runners WHERE {} ORDER BY id LIMIT $1",
            crate::common::REGISTERED_ENDED_RUNNER
        );
        let rows: Vec<RunnerRow> = sqlx::query_as(&sql)
            .bind(i64::from(limit))
            .fetch_all(self.reader())
            .await?;
        rows.into_iter().map(Runner::try_from).collect()
    }

    /// Every runner API call starts here: a held connection (one round trip).
    async fn find_runner_by_token(&self, token_hash: &str) -> Result<Option<Runner>, StoreError> {
        let mut connection = self.inner.held_reads().acquire().await?;
        let row = sqlx::query_as(&self.inner.statements.runner_api.runner_by_token)
            .bind(token_hash)
            .fetch_optional(&mut *connection)
            .await
            .map_err(StoreError::from);
        let row: Option<RunnerRow> = connection.settle(row)?;
        row.map(Runner::try_from).transpose()
    }

    async fn set_runner_token(&self, runner: RunnerId, token_hash: &str) -> Result<(), StoreError> {
        sqlx::query(&self.inner.statements.runner_api.set_runner_token)
            .bind(runner.0)
            .bind(token_hash)
            .execute(self.writer())
            .await?;
        Ok(())
    }

    async fn heartbeat_replica(
        &self,
        replica: &crate::Replica,
        forget_before: Timestamp,
    ) -> Result<(), StoreError> {
        let sql = &self.inner.statements.runner_api;
        sqlx::query(&sql.heartbeat_replica)
            .bind(replica.id.as_str())
            .bind(replica.address.as_str())
            .bind(replica.version.as_str())
            .bind(replica.started_at.as_millis())
            .bind(replica.heartbeat_at.as_millis())
            .execute(self.writer())
            .await?;
        sqlx::query(&sql.forget_replicas)
            .bind(forget_before.as_millis())
            .execute(self.writer())
            .await?;
        Ok(())
    }

    async fn replicas(&self, seen_since: Timestamp) -> Result<Vec<crate::Replica>, StoreError> {
        let rows: Vec<(String, String, String, i64, i64)> =
            sqlx::query_as(&self.inner.statements.runner_api.replicas)
                .bind(seen_since.as_millis())
                .fetch_all(self.reader())
                .await?;
        Ok(rows
            .into_iter()
            .map(
                |(id, address, version, started_at, heartbeat_at)| crate::Replica {
                    id,
                    address,
                    version,
                    started_at: Timestamp::from_millis(started_at),
                    heartbeat_at: Timestamp::from_millis(heartbeat_at),
                },
            )
            .collect())
    }

    async fn begin_term(
        &self,
        name: &str,
        replica: &str,
        now: Timestamp,
    ) -> Result<i64, StoreError> {
        // Run to its end, as every write (see `insert_job`).
        let terms: Vec<i64> = sqlx::query_scalar(&self.inner.statements.runner_api.begin_term)
            .bind(name)
            .bind(replica)
            .bind(now.as_millis())
            .fetch_all(self.writer())
            .await?;
        terms
            .first()
            .copied()
            .ok_or_else(|| StoreError::Corrupt(format!("no term for {name}")))
    }

    async fn end_term(&self, name: &str, term: i64) -> Result<(), StoreError> {
        sqlx::query(&self.inner.statements.runner_api.end_term)
            .bind(name)
            .bind(term)
            .execute(self.writer())
            .await?;
        Ok(())
    }

    async fn leader(&self, name: &str) -> Result<Option<crate::LeaderTerm>, StoreError> {
        let row: Option<(String, i64, i64)> =
            sqlx::query_as(&self.inner.statements.runner_api.leader)
                .bind(name)
                .fetch_optional(self.reader())
                .await?;
        Ok(row.map(|(replica, term, since)| crate::LeaderTerm {
            replica,
            term,
            since: Timestamp::from_millis(since),
        }))
    }

    async fn put_job_log(
        &self,
        job: JobId,
        exit_code: Option<i64>,
        log: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(&self.inner.statements.runner_api.put_log)
            .bind(job.0)
            .bind(exit_code)
            .bind(log)
            .execute(self.writer())
            .await?;
        Ok(())
    }

    async fn get_job_log(&self, job: JobId) -> Result<Option<(Option<i64>, String)>, StoreError> {
        let row: Option<(Option<i64>, String)> =
            sqlx::query_as(&self.inner.statements.runner_api.get_log)
                .bind(job.0)
                .fetch_optional(self.reader())
                .await?;
        Ok(row)
    }

    async fn add_runner_report(
        &self,
        runner: RunnerId,
        phase: &str,
        body: &str,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        sqlx::query(&self.inner.statements.runner_api.add_report)
            .bind(runner.0)
            .bind(phase)
            .bind(body)
            .bind(now.as_millis())
            .execute(self.writer())
            .await?;
        Ok(())
    }

    async fn runner_reports(&self, runner: RunnerId) -> Result<Vec<(String, String)>, StoreError> {
        let rows: Vec<(String, String)> = sqlx::query_as(&self.inner.statements.runner_api.reports)
            .bind(runner.0)
            .fetch_all(self.reader())
            .await?;
        Ok(rows)
    }

    async fn unfinished_reports(
        &self,
        from: Timestamp,
        to: Timestamp,
        limit: u32,
    ) -> Result<Vec<(RunnerId, Timestamp, String)>, StoreError> {
        let rows: Vec<(i64, i64, String)> =
            sqlx::query_as(&self.inner.statements.runner_api.unfinished_reports)
                .bind(from.as_millis())
                .bind(to.as_millis())
                .bind(i64::from(limit))
                .fetch_all(self.reader())
                .await?;
        Ok(rows
            .into_iter()
            .map(|(runner, at, body)| (RunnerId(runner), Timestamp::from_millis(at), body))
            .collect())
    }

    async fn prune(
        &self,
        what: crate::Prunable,
        before: Timestamp,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let statements = &self.inner.statements.prune[what as usize];
        let mut connection = self.writer().acquire().await?;
        let result: Result<u64, StoreError> = async {
            let mut transaction = sqlx::Connection::begin(&mut *connection).await?;
            let mut pruned = 0;
            for statement in statements {
                pruned = sqlx::query(statement)
                    .bind(before.as_millis())
                    .bind(i64::from(limit))
                    .execute(&mut *transaction)
                    .await?
                    .rows_affected();
            }
            transaction.commit().await?;
            Ok(pruned)
        }
        .await;
        crate::sql::settle(connection, result)
    }

    async fn count_rows(&self, what: crate::Prunable) -> Result<u64, StoreError> {
        let count: i64 = sqlx::query_scalar(&format!("SELECT COUNT(*) FROM {}", what.table()))
            .fetch_one(self.reader())
            .await?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    async fn create_instance_token(
        &self,
        token_hash: &str,
        runner: RunnerId,
        expires_at: Timestamp,
        jit_files: Option<&str>,
    ) -> Result<(), StoreError> {
        sqlx::query(&self.inner.statements.runner_api.insert_instance_token)
            .bind(token_hash)
            .bind(runner.0)
            .bind(expires_at.as_millis())
            .bind(jit_files)
            .execute(self.writer())
            .await?;
        Ok(())
    }

    async fn find_instance_token(
        &self,
        token_hash: &str,
    ) -> Result<Option<crate::InstanceToken>, StoreError> {
        let row: Option<(i64, i64, Option<String>, Option<i64>)> =
            sqlx::query_as(&self.inner.statements.runner_api.instance_token)
                .bind(token_hash)
                .fetch_optional(self.writer())
                .await?;
        Ok(row.map(
            |(runner, expires_at, jit_files, fetched)| crate::InstanceToken {
                runner: RunnerId(runner),
                expires_at: Timestamp::from_millis(expires_at),
                jit_files,
                token_fetched: fetched.is_some(),
            },
        ))
    }

    async fn take_instance_registration(
        &self,
        token_hash: &str,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(&self.inner.statements.runner_api.take_instance_registration)
            .bind(token_hash)
            .bind(now.as_millis())
            .execute(self.writer())
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn list_worker_configs(&self) -> Result<Vec<StoredWorkerConfig>, StoreError> {
        let sql = &self.inner.statements.worker_configs;
        let rows: Vec<(String, i64, String, i64)> =
            sqlx::query_as(&sql.list).fetch_all(self.reader()).await?;
        let pools: Vec<(String, String)> = sqlx::query_as(&sql.all_pools)
            .fetch_all(self.reader())
            .await?;
        Ok(rows
            .into_iter()
            .map(|(id, version, body, updated_at)| StoredWorkerConfig {
                pools: pools
                    .iter()
                    .filter(|(_, owner)| owner == &id)
                    .map(|(pool, _)| pool.clone())
                    .collect(),
                id,
                version,
                body,
                updated_at: Timestamp::from_millis(updated_at),
            })
            .collect())
    }

    async fn get_worker_config(&self, id: &str) -> Result<Option<StoredWorkerConfig>, StoreError> {
        let sql = &self.inner.statements.worker_configs;
        let mut transaction = self.reader().begin().await?;
        let row: Option<(String, i64, String, i64)> = sqlx::query_as(&sql.get)
            .bind(id)
            .fetch_optional(&mut *transaction)
            .await?;
        let pools: Vec<String> = sqlx::query_scalar(&sql.pools_of)
            .bind(id)
            .fetch_all(&mut *transaction)
            .await?;
        transaction.commit().await?;
        Ok(
            row.map(|(id, version, body, updated_at)| StoredWorkerConfig {
                id,
                version,
                body,
                pools,
                updated_at: Timestamp::from_millis(updated_at),
            }),
        )
    }

    async fn put_worker_config(
        &self,
        id: &str,
        body: &str,
        pools: &[String],
        expect: Expect,
        now: Timestamp,
    ) -> Result<i64, StoreError> {
        let sql = &self.inner.statements.worker_configs;
        let mut connection = self.writer().acquire().await?;
        let result: Result<i64, StoreError> = async {
            let mut transaction = sqlx::Connection::begin(&mut *connection).await?;
            let version: Option<i64> = match expect {
                Expect::Any => {
                    let inserted = sqlx::query(&sql.insert)
                        .bind(id)
                        .bind(body)
                        .bind(now.as_millis())
                        .execute(&mut *transaction)
                        .await?;
                    if inserted.rows_affected() == 1 {
                        Some(1)
                    } else {
                        sqlx::query_scalar(&sql.update_any)
                            .bind(id)
                            .bind(body)
                            .bind(now.as_millis())
                            .fetch_optional(&mut *transaction)
                            .await?
                    }
                }
                Expect::Version(expected) => {
                    let updated: Option<i64> = sqlx::query_scalar(&sql.update_if)
                        .bind(id)
                        .bind(body)
                        .bind(now.as_millis())
                        .bind(expected)
                        .fetch_optional(&mut *transaction)
                        .await?;
                    if updated.is_none() {
                        let current: Option<i64> = sqlx::query_scalar(&sql.version)
                            .bind(id)
                            .fetch_optional(&mut *transaction)
                            .await?;
                        return Err(StoreError::VersionConflict {
                            id: id.to_owned(),
                            expected,
                            current,
                        });
                    }
                    updated
                }
            };
            let version = version.ok_or_else(|| {
                StoreError::Corrupt(format!("worker configuration {id} vanished mid-write"))
            })?;
            for pool in pools {
                let owner: Option<String> = sqlx::query_scalar(&sql.pool_owner)
                    .bind(pool.as_str())
                    .fetch_optional(&mut *transaction)
                    .await?;
                if let Some(owner) = owner.filter(|owner| owner != id) {
                    return Err(StoreError::PoolTaken {
                        pool: pool.clone(),
                        owner,
                    });
                }
            }
            sqlx::query(&sql.delete_pools)
                .bind(id)
                .execute(&mut *transaction)
                .await?;
            for pool in pools {
                let inserted = sqlx::query(&sql.insert_pool)
                    .bind(pool.as_str())
                    .bind(id)
                    .execute(&mut *transaction)
                    .await;
                match inserted {
                    Ok(_) => {}
                    // Another configuration claimed it between our check and insert.
                    Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                        return Err(StoreError::PoolTaken {
                            pool: pool.clone(),
                            owner: "another configuration written at the same time".to_owned(),
                        })
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            transaction.commit().await?;
            Ok(version)
        }
        .await;
        crate::sql::settle(connection, result)
    }

    async fn delete_worker_config(&self, id: &str, expect: Expect) -> Result<bool, StoreError> {
        let sql = &self.inner.statements.worker_configs;
        let mut connection = self.writer().acquire().await?;
        let result: Result<bool, StoreError> = async {
            let mut transaction = sqlx::Connection::begin(&mut *connection).await?;
            let deleted = match expect {
                Expect::Any => {
                    sqlx::query(&sql.delete_any)
                        .bind(id)
                        .execute(&mut *transaction)
                        .await?
                }
                Expect::Version(expected) => {
                    let deleted = sqlx::query(&sql.delete_if)
                        .bind(id)
                        .bind(expected)
                        .execute(&mut *transaction)
                        .await?;
                    if deleted.rows_affected() == 0 {
                        let current: Option<i64> = sqlx::query_scalar(&sql.version)
                            .bind(id)
                            .fetch_optional(&mut *transaction)
                            .await?;
                        if current.is_some() {
                            return Err(StoreError::VersionConflict {
                                id: id.to_owned(),
                                expected,
                                current,
                            });
                        }
                    }
                    deleted
                }
            };
            // Pools go with their configuration (ON DELETE CASCADE), stated
            // here too so the outcome does not hang on a pragma.
            sqlx::query(&sql.delete_pools)
                .bind(id)
                .execute(&mut *transaction)
                .await?;
            transaction.commit().await?;
            Ok(deleted.rows_affected() == 1)
        }
        .await;
        crate::sql::settle(connection, result)
    }

    async fn replace_job_and_runner(
        &self,
        job: (&Job, &Job),
        runner: Option<(&Runner, &Runner)>,
    ) -> Result<bool, StoreError> {
        let (current, next) = job;
        let Some((runner_current, runner_next)) = runner else {
            return self.replace_job(current, next).await;
        };
        let op = Op::ReplaceWithRunner {
            id: current.id,
            version: current.version,
            next: Box::new(Columns::from(next)),
            runner: runner_current.id,
            runner_version: runner_current.version,
            runner_next: Box::new(Columns::from(runner_next)),
            step: history_line(current.step_to(next, None).as_ref()),
        };
        match self.group.submit(op).await? {
            Outcome::Replaced(replaced) => Ok(replaced),
            _ => Err(StoreError::Corrupt(
                "group commit answered a replace with another outcome".into(),
            )),
        }
    }

    async fn replace_runner(&self, current: &Runner, next: &Runner) -> Result<bool, StoreError> {
        let columns = Columns::from(next);
        let result = bind_columns(sqlx::query(&self.inner.statements.replace_runner), &columns)
            .bind(current.id.0)
            .bind(current.version)
            .execute(self.writer())
            .await?;
        Ok(result.rows_affected() == 1)
    }
}
