//! Rows as the database holds them, and their hand-written conversion to and
//! from the `core` types. Both backends use the same column names and types
//! (integers are 64-bit, times are epoch milliseconds, lists are JSON text).

use std::collections::BTreeSet;

use runway_core::{Job, JobId, Runner, RunnerId, Timestamp};
use sqlx::database::Database;
use sqlx::query::{Query, QueryAs};
use sqlx::{Encode, Type};

use crate::StoreError;

/// The columns of `jobs`, in the order [`Columns`] holds them (after the id).
pub(crate) const JOB_COLUMNS: &str =
    "source, external_id, pool, labels, state, attempts, max_attempts, \
     runner_id, lease_deadline, excluded_runners, payload, created_at, enqueued_at, started_at, \
     finished_at, conclusion, reason, version, share_key, share_weight";

pub(crate) const RUNNER_COLUMNS: &str =
    "name, pool, provider, labels, instance_id, state, job_id, \
     requested_at, provisioning_at, idle_at, busy_at, terminating_at, ended_at, reason, draining, version, \
     stock, stopped_at";

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
    share_key: String,
    share_weight: i64,
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
            share: runway_core::share::Share {
                key: row.share_key,
                weight: runway_core::share::Weight::from_millis(
                    u32::try_from(row.share_weight).unwrap_or(u32::MAX),
                ),
            },
        })
    }
}

/// A job's history step as the line the store appends to `jobs.history`;
/// empty for no step.
pub(crate) fn history_line(step: Option<&runway_core::JobStep>) -> String {
    let Some(step) = step else {
        return String::new();
    };
    let mut line = serde_json::json!({
        "at": step.at.as_millis(),
        "state": step.state.as_str(),
    });
    if let Some(runner) = step.runner {
        line["runner"] = runner.0.into();
    }
    if let Some(attempts) = step.attempts {
        line["attempts"] = attempts.into();
    }
    if let Some(conclusion) = step.conclusion {
        line["conclusion"] = conclusion.as_str().into();
    }
    if let Some(reason) = &step.reason {
        line["reason"] = reason.as_str().into();
    }
    format!("{line}\n")
}

/// The steps of a stored `jobs.history`, oldest first.
pub(crate) fn parse_history(
    id: JobId,
    text: &str,
) -> Result<Vec<runway_core::JobStep>, StoreError> {
    #[derive(serde::Deserialize)]
    struct Line {
        at: i64,
        state: String,
        runner: Option<i64>,
        attempts: Option<u32>,
        conclusion: Option<String>,
        reason: Option<String>,
    }
    let bad = |what: String| corrupt(format!("job {id}: history: {what}"));
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let line: Line = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
            Ok(runway_core::JobStep {
                at: Timestamp::from_millis(line.at),
                state: line.state.parse().map_err(|e| bad(format!("{e}")))?,
                runner: line.runner.map(RunnerId),
                attempts: line.attempts,
                conclusion: line
                    .conclusion
                    .map(|c| c.parse())
                    .transpose()
                    .map_err(|e| bad(format!("{e}")))?,
                reason: line.reason,
            })
        })
        .collect()
}

pub(crate) fn json_list<T: serde::Serialize>(items: &[T]) -> String {
    // Serialising a slice of strings or integers cannot fail.
    serde_json::to_string(items).unwrap_or_else(|_| "[]".to_owned())
}

impl From<&Job> for Columns {
    fn from(job: &Job) -> Columns {
        let excluded: Vec<i64> = job.excluded_runners.iter().map(|r| r.0).collect();
        let ms = |t: Option<Timestamp>| Value::Int(t.map(Timestamp::as_millis));
        Columns(vec![
            text(job.source.as_str()),
            text(&job.external_id),
            Value::Text(job.pool.clone()),
            text(&json_list(&job.labels)),
            text(job.state.as_str()),
            int(i64::from(job.attempts)),
            int(i64::from(job.max_attempts)),
            Value::Int(job.runner.map(|r| r.0)),
            ms(job.lease_deadline),
            text(&json_list(&excluded)),
            text(&job.payload),
            int(job.created_at.as_millis()),
            int(job.enqueued_at.as_millis()),
            ms(job.started_at),
            ms(job.finished_at),
            Value::Text(job.conclusion.map(|c| c.as_str().to_owned())),
            Value::Text(job.reason.clone()),
            int(job.version),
            text(&job.share.key),
            int(i64::from(job.share.weight.millis())),
        ])
    }
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
    draining: i64,
    version: i64,
    stock: i64,
    stopped_at: Option<i64>,
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
            draining: row.draining != 0,
            stock: row.stock != 0,
            stopped_at: at(row.stopped_at),
            version: row.version,
        })
    }
}

impl From<&crate::Delivery> for Columns {
    fn from(delivery: &crate::Delivery) -> Columns {
        Columns(vec![
            text(&delivery.id),
            text(&delivery.event),
            Value::Text(delivery.action.clone()),
            Value::Text(delivery.external_id.clone()),
            text(&delivery.outcome),
            int(delivery.received_at.as_millis()),
        ])
    }
}

impl From<&Runner> for Columns {
    fn from(runner: &Runner) -> Columns {
        let ms = |t: Option<Timestamp>| Value::Int(t.map(Timestamp::as_millis));
        Columns(vec![
            text(&runner.name),
            text(&runner.pool),
            text(&runner.provider),
            text(&json_list(&runner.labels)),
            Value::Text(runner.instance_id.clone()),
            text(runner.state.as_str()),
            Value::Int(runner.job.map(|j| j.0)),
            int(runner.requested_at.as_millis()),
            ms(runner.provisioning_at),
            ms(runner.idle_at),
            ms(runner.busy_at),
            ms(runner.terminating_at),
            ms(runner.ended_at),
            Value::Text(runner.reason.clone()),
            int(i64::from(runner.draining)),
            int(runner.version),
            int(i64::from(runner.stock)),
            ms(runner.stopped_at),
        ])
    }
}

/// One column's value, as both backends bind it (`NULL` as `None`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Int(Option<i64>),
    Text(Option<String>),
}

fn int(value: i64) -> Value {
    Value::Int(Some(value))
}

fn text(value: &str) -> Value {
    Value::Text(Some(value.to_owned()))
}

/// The values of a job's [`JOB_COLUMNS`] or a runner's [`RUNNER_COLUMNS`],
/// in that order; or a delivery's (id, event, action, external id,
/// outcome, received at), as its inserts take them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Columns(Vec<Value>);

/// A query that takes arguments: sqlx's `Query` and `QueryAs` both bind
/// the same way, and this lets one helper bind either.
pub(crate) trait Bind<'q, DB: Database>: Sized {
    fn with<T: 'q + Encode<'q, DB> + Type<DB>>(self, value: T) -> Self;
}

impl<'q, DB: Database> Bind<'q, DB> for Query<'q, DB, <DB as Database>::Arguments<'q>> {
    fn with<T: 'q + Encode<'q, DB> + Type<DB>>(self, value: T) -> Self {
        self.bind(value)
    }
}

impl<'q, DB: Database, O> Bind<'q, DB> for QueryAs<'q, DB, O, <DB as Database>::Arguments<'q>> {
    fn with<T: 'q + Encode<'q, DB> + Type<DB>>(self, value: T) -> Self {
        self.bind(value)
    }
}

/// Binds `columns`, in order, after what `query` has bound already.
pub(crate) fn bind_columns<'q, DB, Q>(query: Q, columns: &'q Columns) -> Q
where
    DB: Database,
    Q: Bind<'q, DB>,
    Option<i64>: Encode<'q, DB> + Type<DB>,
    Option<&'q str>: Encode<'q, DB> + Type<DB>,
{
    columns.0.iter().fold(query, |query, value| match value {
        Value::Int(number) => query.with(*number),
        Value::Text(text) => query.with(text.as_deref()),
    })
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
