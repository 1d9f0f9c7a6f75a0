//! Rows as the database holds them, and their hand-written conversion to and
//! from the `core` types. Both backends use the same column names and types
//! (integers are 64-bit, times are epoch milliseconds, lists are JSON text).

use std::collections::BTreeSet;

use runway_core::{Job, JobId, Runner, RunnerId, Timestamp};
use sqlx::database::Database;
use sqlx::query::Query;
use sqlx::{Encode, Type};

use crate::StoreError;

/// The columns of `jobs`, in the order [`bind_job`] binds them after the id.
pub(crate) const JOB_COLUMNS: &str =
    "source, external_id, pool, labels, state, attempts, max_attempts, \
     runner_id, lease_deadline, excluded_runners, payload, created_at, enqueued_at, started_at, \
     finished_at, conclusion, reason, version";

pub(crate) const RUNNER_COLUMNS: &str =
    "name, pool, provider, labels, instance_id, state, job_id, \
     requested_at, provisioning_at, idle_at, busy_at, terminating_at, ended_at, reason, version";

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct JobRow {
    id: i64,
    source: String,
    external_id: String,
    pool: Option<String>,
    labels: String,
    state: String,
    attempts: i64,
    max_attempts: i64,
    runner_id: Option<i64>,
    lease_deadline: Option<i64>,
    excluded_runners: String,
    payload: String,
    created_at: i64,
    enqueued_at: i64,
    started_at: Option<i64>,
    finished_at: Option<i64>,
    conclusion: Option<String>,
    reason: Option<String>,
    version: i64,
}

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

fn count(value: i64, column: &str) -> Result<u32, StoreError> {
    u32::try_from(value).map_err(|_| corrupt(format!("{column} = {value} is out of range")))
}

impl TryFrom<JobRow> for Job {
    type Error = StoreError;

    fn try_from(row: JobRow) -> Result<Job, StoreError> {
        let context = |what: &str| format!("job {}: {what}", row.id);
        let labels: Vec<String> = serde_json::from_str(&row.labels)
            .map_err(|e| corrupt(context(&format!("labels: {e}"))))?;
        let excluded: Vec<i64> = serde_json::from_str(&row.excluded_runners)
            .map_err(|e| corrupt(context(&format!("excluded_runners: {e}"))))?;
        Ok(Job {
            id: JobId(row.id),
            source: row
                .source
                .parse()
                .map_err(|e| corrupt(context(&format!("{e}"))))?,
            external_id: row.external_id,
            pool: row.pool,
            labels,
            state: row
                .state
                .parse()
                .map_err(|e| corrupt(context(&format!("{e}"))))?,
            attempts: count(row.attempts, "attempts")?,
            max_attempts: count(row.max_attempts, "max_attempts")?,
            runner: row.runner_id.map(RunnerId),
            lease_deadline: row.lease_deadline.map(Timestamp::from_millis),
            excluded_runners: excluded.into_iter().map(RunnerId).collect::<BTreeSet<_>>(),
            payload: row.payload,
            created_at: Timestamp::from_millis(row.created_at),
            enqueued_at: Timestamp::from_millis(row.enqueued_at),
            started_at: row.started_at.map(Timestamp::from_millis),
            finished_at: row.finished_at.map(Timestamp::from_millis),
            conclusion: row
                .conclusion
                .map(|c| c.parse())
                .transpose()
                .map_err(|e| corrupt(context(&format!("{e}"))))?,
            reason: row.reason,
            version: row.version,
        })
    }
}

/// A job flattened to the primitive column values, ready to bind.
pub(crate) struct JobColumns {
    source: &'static str,
    external_id: String,
    pool: Option<String>,
    labels: String,
    state: &'static str,
    attempts: i64,
    max_attempts: i64,
    runner_id: Option<i64>,
    lease_deadline: Option<i64>,
    excluded_runners: String,
    payload: String,
    created_at: i64,
    enqueued_at: i64,
    started_at: Option<i64>,
    finished_at: Option<i64>,
    conclusion: Option<&'static str>,
    reason: Option<String>,
    version: i64,
}

pub(crate) fn json_list<T: serde::Serialize>(items: &[T]) -> String {
    // Serialising a slice of strings or integers cannot fail.
    serde_json::to_string(items).unwrap_or_else(|_| "[]".to_owned())
}

impl From<&Job> for JobColumns {
    fn from(job: &Job) -> JobColumns {
        let excluded: Vec<i64> = job.excluded_runners.iter().map(|r| r.0).collect();
        JobColumns {
            source: job.source.as_str(),
            external_id: job.external_id.clone(),
            pool: job.pool.clone(),
            labels: json_list(&job.labels),
            state: job.state.as_str(),
            attempts: i64::from(job.attempts),
            max_attempts: i64::from(job.max_attempts),
            runner_id: job.runner.map(|r| r.0),
            lease_deadline: job.lease_deadline.map(Timestamp::as_millis),
            excluded_runners: json_list(&excluded),
            payload: job.payload.clone(),
            created_at: job.created_at.as_millis(),
            enqueued_at: job.enqueued_at.as_millis(),
            started_at: job.started_at.map(Timestamp::as_millis),
            finished_at: job.finished_at.map(Timestamp::as_millis),
            conclusion: job.conclusion.map(|c| c.as_str()),
            reason: job.reason.clone(),
            version: job.version,
        }
    }
}

/// Binds the columns of [`JOB_COLUMNS`], in order.
pub(crate) fn bind_job<'q, DB>(
    query: Query<'q, DB, <DB as Database>::Arguments<'q>>,
    job: &'q JobColumns,
) -> Query<'q, DB, <DB as Database>::Arguments<'q>>
where
    DB: Database,
    i64: Encode<'q, DB> + Type<DB>,
    Option<i64>: Encode<'q, DB> + Type<DB>,
    &'q str: Encode<'q, DB> + Type<DB>,
    Option<&'q str>: Encode<'q, DB> + Type<DB>,
{
    query
        .bind(job.source)
        .bind(job.external_id.as_str())
        .bind(job.pool.as_deref())
        .bind(job.labels.as_str())
        .bind(job.state)
        .bind(job.attempts)
        .bind(job.max_attempts)
        .bind(job.runner_id)
        .bind(job.lease_deadline)
        .bind(job.excluded_runners.as_str())
        .bind(job.payload.as_str())
        .bind(job.created_at)
        .bind(job.enqueued_at)
        .bind(job.started_at)
        .bind(job.finished_at)
        .bind(job.conclusion)
        .bind(job.reason.as_deref())
        .bind(job.version)
}

#[derive(Debug, sqlx::FromRow)]
pub(crate) struct RunnerRow {
    id: i64,
    name: String,
    pool: String,
    provider: String,
    labels: String,
    instance_id: Option<String>,
    state: String,
    job_id: Option<i64>,
    requested_at: i64,
    provisioning_at: Option<i64>,
    idle_at: Option<i64>,
    busy_at: Option<i64>,
    terminating_at: Option<i64>,
    ended_at: Option<i64>,
    reason: Option<String>,
    version: i64,
}

impl TryFrom<RunnerRow> for Runner {
    type Error = StoreError;

    fn try_from(row: RunnerRow) -> Result<Runner, StoreError> {
        let labels: Vec<String> = serde_json::from_str(&row.labels)
            .map_err(|e| corrupt(format!("runner {}: labels: {e}", row.id)))?;
        let at = |t: Option<i64>| t.map(Timestamp::from_millis);
        Ok(Runner {
            id: RunnerId(row.id),
            name: row.name,
            pool: row.pool,
            provider: row.provider,
            labels,
            instance_id: row.instance_id,
            state: row
                .state
                .parse()
                .map_err(|e| corrupt(format!("runner {}: {e}", row.id)))?,
            job: row.job_id.map(JobId),
            requested_at: Timestamp::from_millis(row.requested_at),
            provisioning_at: at(row.provisioning_at),
            idle_at: at(row.idle_at),
            busy_at: at(row.busy_at),
            terminating_at: at(row.terminating_at),
            ended_at: at(row.ended_at),
            reason: row.reason,
            version: row.version,
        })
    }
}

pub(crate) struct RunnerColumns {
    name: String,
    pool: String,
    provider: String,
    labels: String,
    instance_id: Option<String>,
    state: &'static str,
    job_id: Option<i64>,
    requested_at: i64,
    provisioning_at: Option<i64>,
    idle_at: Option<i64>,
    busy_at: Option<i64>,
    terminating_at: Option<i64>,
    ended_at: Option<i64>,
    reason: Option<String>,
    version: i64,
}

impl From<&Runner> for RunnerColumns {
    fn from(runner: &Runner) -> RunnerColumns {
        let ms = |t: Option<Timestamp>| t.map(Timestamp::as_millis);
        RunnerColumns {
            name: runner.name.clone(),
            pool: runner.pool.clone(),
            provider: runner.provider.clone(),
            labels: json_list(&runner.labels),
            instance_id: runner.instance_id.clone(),
            state: runner.state.as_str(),
            job_id: runner.job.map(|j| j.0),
            requested_at: runner.requested_at.as_millis(),
            provisioning_at: ms(runner.provisioning_at),
            idle_at: ms(runner.idle_at),
            busy_at: ms(runner.busy_at),
            terminating_at: ms(runner.terminating_at),
            ended_at: ms(runner.ended_at),
            reason: runner.reason.clone(),
            version: runner.version,
        }
    }
}

/// Binds the columns of [`RUNNER_COLUMNS`], in order.
pub(crate) fn bind_runner<'q, DB>(
    query: Query<'q, DB, <DB as Database>::Arguments<'q>>,
    runner: &'q RunnerColumns,
) -> Query<'q, DB, <DB as Database>::Arguments<'q>>
where
    DB: Database,
    i64: Encode<'q, DB> + Type<DB>,
    Option<i64>: Encode<'q, DB> + Type<DB>,
    &'q str: Encode<'q, DB> + Type<DB>,
    Option<&'q str>: Encode<'q, DB> + Type<DB>,
{
    query
        .bind(runner.name.as_str())
        .bind(runner.pool.as_str())
        .bind(runner.provider.as_str())
        .bind(runner.labels.as_str())
        .bind(runner.instance_id.as_deref())
        .bind(runner.state)
        .bind(runner.job_id)
        .bind(runner.requested_at)
        .bind(runner.provisioning_at)
        .bind(runner.idle_at)
        .bind(runner.busy_at)
        .bind(runner.terminating_at)
        .bind(runner.ended_at)
        .bind(runner.reason.as_deref())
        .bind(runner.version)
}

/// `$1, $2, …, $n`: placeholders for `n` columns starting at `first`.
pub(crate) fn placeholders(first: usize, n: usize) -> String {
    (first..first + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `col = $k, …` for an UPDATE of every column, starting at placeholder `first`.
pub(crate) fn assignments(columns: &str, first: usize) -> String {
    columns
        .split(',')
        .map(str::trim)
        .enumerate()
        .map(|(i, column)| format!("{column} = ${}", first + i))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn column_count(columns: &str) -> usize {
    columns.split(',').count()
}
