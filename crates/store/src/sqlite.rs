//! The embedded default: one SQLite file in WAL mode with `synchronous =
//! FULL`, so a commit has reached the disk before a call returns. All writes
//! go through a single connection (SQLite has one writer anyway; queueing
//! them in the pool avoids `SQLITE_BUSY`), reads through a few more.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use runway_core::job::NewJob;
use runway_core::runner::NewRunner;
use runway_core::{Job, JobId, JobSource, Runner, RunnerId, Timestamp};
use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::Sqlite;

use sqlx::FromRow;

use crate::common::LIVE_RUNNER;
use crate::common::{impl_batch_executor, impl_store, Statements};
use crate::group_commit::{BatchExecutor, GroupCommit, Op, Outcome};
use crate::rows::{bind_columns, Columns, JobRow, RunnerRow, JOB_COLUMNS, RUNNER_COLUMNS};
use crate::{
    Backend, Claim, Delivery, Enqueued, Expect, JobCount, JobFilter, RunnerFilter, Store,
    StoreError, StoredWorkerConfig,
};

static MIGRATOR: Migrator = sqlx::migrate!("./migrations/sqlite");

pub struct SqliteStore {
    inner: Arc<SqliteInner>,
    group: GroupCommit,
}

struct SqliteInner {
    writer: SqlitePool,
    readers: SqlitePool,
    statements: Statements,
    claim: String,
    target: String,
}

impl SqliteStore {
    /// Opens (creating if missing) the database at `url`: `sqlite://PATH`,
    /// `sqlite:PATH`, `sqlite::memory:` or a bare file path. Applies migrations.
    pub async fn open(url: &str) -> Result<SqliteStore, StoreError> {
        let (options, target) = if url.starts_with("sqlite:") {
            let options =
                SqliteConnectOptions::from_str(url).map_err(|e| StoreError::InvalidUrl {
                    url: url.to_owned(),
                    reason: e.to_string(),
                })?;
            (options, format!("SQLite database {url}"))
        } else {
            (
                SqliteConnectOptions::new().filename(url),
                format!("SQLite database {url:?}"),
            )
        };
        let options = options
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // Pages freed by retention go back to the file system
            // (`reclaim_space`). Takes effect on a new database; an older
            // one reuses its freed pages, so it stops growing all the same.
            .auto_vacuum(sqlx::sqlite::SqliteAutoVacuum::Incremental)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10))
            .foreign_keys(true);
        let open_error = |e: sqlx::Error| StoreError::Open {
            target: target.clone(),
            reason: describe_sqlx_error(&e),
        };
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.clone())
            .await
            .map_err(open_error)?;
        MIGRATOR
            .run(&writer)
            .await
            .map_err(|e| StoreError::Migrate {
                target: target.clone(),
                reason: e.to_string(),
            })?;
        let readers = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .map_err(open_error)?;
        let claim = format!(
            "UPDATE jobs SET state = 'provisioning', runner_id = ?2, lease_deadline = ?3, version = version + 1 \
             WHERE id IN (SELECT id FROM jobs WHERE state = 'queued' AND pool = ?1 \
               AND (excluded_runners = '[]' OR NOT EXISTS \
                    (SELECT 1 FROM json_each(jobs.excluded_runners) WHERE json_each.value = ?2)) \
               AND (?5 IS NULL OR NOT EXISTS (SELECT 1 FROM json_each(jobs.labels) AS l \
                    WHERE lower(l.value) NOT IN (SELECT value FROM json_each(?5)))) \
               ORDER BY enqueued_at, id LIMIT ?4) \
             RETURNING id, {JOB_COLUMNS}"
        );
        let inner = Arc::new(SqliteInner {
            writer,
            readers,
            statements: Statements::new(crate::Backend::Sqlite),
            claim,
            target,
        });
        // SQLite has one writer: a single committer batches everything.
        let group = GroupCommit::start(1, inner.clone());
        Ok(SqliteStore { inner, group })
    }

    fn reader(&self) -> &SqlitePool {
        &self.inner.readers
    }

    fn writer(&self) -> &SqlitePool {
        &self.inner.writer
    }
}

impl_batch_executor!(SqliteInner, sqlx::SqliteConnection);

/// SQLite's own words for what went wrong, without sqlx's wrapping.
pub(crate) fn describe_sqlx_error(error: &sqlx::Error) -> String {
    match error {
        sqlx::Error::Database(e) => match e.code() {
            Some(code) => format!("{} (code {code})", e.message()),
            None => e.message().to_owned(),
        },
        other => other.to_string(),
    }
}

impl_store!(SqliteStore, Sqlite, {
    fn backend(&self) -> Backend {
        Backend::Sqlite
    }

    async fn reclaim_space(&self, pages: u32) -> Result<(), StoreError> {
        sqlx::query(&format!("PRAGMA incremental_vacuum({pages})"))
            .execute(self.writer())
            .await?;
        Ok(())
    }

    async fn try_lead(
        &self,
        _name: &str,
        _silence: std::time::Duration,
    ) -> Result<Option<Box<dyn crate::Leadership>>, StoreError> {
        Ok(Some(Box::new(crate::SoleLeader)))
    }

    async fn enqueue_many(
        &self,
        jobs: &[NewJob],
        now: Timestamp,
    ) -> Result<Vec<Enqueued>, StoreError> {
        let mut transaction = self.inner.writer.begin().await?;
        let mut results = Vec::with_capacity(jobs.len());
        for job in jobs {
            results.push(self.inner.insert_job(&mut transaction, job, now).await?);
        }
        transaction.commit().await?;
        Ok(results)
    }
});
