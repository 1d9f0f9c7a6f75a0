//! The embedded default: one SQLite file in WAL mode with `synchronous =
//! FULL`, so a commit has reached the disk before a call returns. All writes
//! go through a single connection (SQLite has one writer anyway; queueing
//! them in the pool avoids `SQLITE_BUSY`), reads through a few more.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use runway_core::job::NewJob;
use runway_core::Timestamp;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

use crate::common::{runner_assignments_with_job, GUARD, GUARDED_SET, LOG_UPSERT};
use crate::common::{ClaimForm, ClaimStartSql};
use crate::conn::describe_sqlx_error;
use crate::group_commit::{BatchExecutor, GroupCommit, Op, Outcome};
use crate::rows::{assignments, column_count, JOB_COLUMNS, RUNNER_COLUMNS};
use crate::sql::{Dialect, Shared, SqlStore};
use crate::{Backend, Enqueued, Leadership, StoreError};

static MIGRATOR: Migrator = sqlx::migrate!("./migrations/sqlite");

/// The SQLite store.
pub type SqliteStore = SqlStore<SqliteDialect>;

/// SQLite's ways: one process owns the file, so it always leads and has
/// no one to wake or fence; JSON lists are read with `json_each`.
pub struct SqliteDialect;

impl SqlStore<SqliteDialect> {
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
        // No ping before a connection is handed out: a SQLite connection is
        // a file, not a socket that can die idle, and sqlx's ping is a hop
        // to the connection's thread and back.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .test_before_acquire(false)
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
            .test_before_acquire(false)
            .connect_with(options)
            .await
            .map_err(open_error)?;
        // No writer connection kept aside: the single one is also taken
        // straight from its pool by writes outside the group commit, which
        // would wait on one kept here. Two of the four readers are kept for
        // the hot path's reads (crate::held).
        let inner = Arc::new(Shared::new(writer, readers, target, 0, Some(2)));
        // SQLite has one writer: a single committer batches everything.
        let group = GroupCommit::start(1, inner.clone());
        Ok(SqliteStore { inner, group })
    }
}

#[async_trait]
impl BatchExecutor for Shared<SqliteDialect> {
    async fn execute(&self, ops: &[&Op]) -> Result<Vec<Outcome>, StoreError> {
        self.execute_batch(ops).await
    }
}

/// The ids a claim takes: up to `?4` queued jobs of pool `?1` that runner
/// `?2` may take (labels `?5`, the cap on a share key's running jobs `?7`),
/// in fair-share order.
const CLAIMABLE: &str = "SELECT id FROM jobs WHERE state = 'queued' AND pool = ?1 \
     AND (excluded_runners = '[]' OR NOT EXISTS \
          (SELECT 1 FROM json_each(jobs.excluded_runners) WHERE json_each.value = ?2)) \
     AND (?5 IS NULL OR NOT EXISTS (SELECT 1 FROM json_each(jobs.labels) AS l \
          WHERE lower(l.value) NOT IN (SELECT value FROM json_each(?5)))) \
     AND (?7 IS NULL OR (SELECT count(*) FROM jobs AS r WHERE r.pool = jobs.pool \
          AND r.share_key = jobs.share_key AND r.state IN ('provisioning', 'running')) < ?7) \
     ORDER BY share_tag, id LIMIT ?4";

/// [`CLAIMABLE`] with its parameters numbered from `$first` (`?1` is
/// `$first`). In `$n` style only: SQLite numbers a `$n` by its first
/// appearance, so in a statement that also has `?n`, a `$n` and a `?m`
/// can share a slot.
fn claimable_from(first: usize) -> String {
    (1..=7).fold(CLAIMABLE.to_owned(), |sql, n| {
        sql.replace(&format!("?{n}"), &format!("${}", first + n - 1))
    })
}

/// The claim: the [`CLAIMABLE`] jobs, for runner `?2` under a lease ending
/// at `?3` (history `?6`), each set as `set` says.
fn claim(set: &str) -> String {
    format!(
        "UPDATE jobs SET {set}, runner_id = ?2, lease_deadline = ?3, history = history || ?6 \
         WHERE id IN ({CLAIMABLE}) RETURNING id, {JOB_COLUMNS}"
    )
}

/// A claim that starts its job, and its runner's compare-and-set, as one
/// script: one hop to the connection's thread instead of five (begin, the
/// claim, the runner, commit; or, with nothing queued, begin, the claim,
/// rollback and a read of the runner). Parameters and answer as
/// `common::claim_start_postgres`: the claim's `$1`–`$7`, the start time
/// `$8`, the version the runner must still have `$9`, its next columns
/// `$10`…; one row, the started job's columns (NULL when none started) and
/// the runner's version as stored.
///
/// All or nothing under a savepoint (a transaction of its own when the
/// group commit runs it alone, nested in the batch's otherwise; a failed
/// write closes the connection, which rolls back what it left open). The
/// runner is written first, busy with the claimable job, only if it is
/// still the row decided on and there is such a job; the job starts only
/// if that write did (`changes()`, the rows the statement before wrote),
/// and the answer shows it only if it did.
fn claim_start_script() -> String {
    let start = start_job(
        &claimable_from(1),
        "id = $2 AND version = $9",
        10,
        (2, 3, 6, 8),
    );
    format!(
        "SAVEPOINT claim_start; {start}; \
         SELECT job.*, (SELECT version FROM runners WHERE id = $2) AS runner_version \
           FROM (SELECT 1) AS one LEFT JOIN \
           (SELECT id, {JOB_COLUMNS} FROM jobs WHERE changes() = 1 \
             AND id = (SELECT job_id FROM runners WHERE id = $2)) AS job ON 1; \
         RELEASE claim_start"
    )
}

/// SQLite: [`crate::common::guarded_pair_postgres`] as one script (the same parameters,
/// the same answer), one hop to the connection's thread instead of five
/// (begin, the job, the runner, the log, commit). All or nothing under a
/// savepoint (a transaction of its own alone, nested in a group commit's
/// batch; a failed write closes the connection, which rolls back what it
/// left open). Each step writes only if the one before did
/// (`changes()`), so nothing is written unless both rows were as expected.
fn guarded_pair_script() -> String {
    let log = 17 + column_count(RUNNER_COLUMNS);
    format!(
        "SAVEPOINT guarded_pair; {end}{log}RELEASE guarded_pair",
        end = end_job(""),
        log = log_step(&format!("${log} = 1 AND "), log + 1, log + 2),
    )
}

/// SQLite: a completion that starts the runner's next job, as one script
/// (one hop instead of six). Parameters: `common::guarded_job`'s `$1`–`$14`, the
/// runner's id (`$15`) and the version it must still have (`$16`), its
/// columns finished (`$17`…) and busy (the job NULL: the claimed one is
/// written), then the claim's seven and the start time, and with `log` the
/// exit code and the text. `claimable` selects the job to start, its
/// parameters numbered from the claim's first. Under a savepoint, each
/// step only if the one before wrote (`changes()`): the runner finished
/// while the job's guard holds, the job ended, its log, the runner busy
/// with the next claimable job, that job started. Rows: the ended job
/// (`part` 0) and the started one (`part` 1), none when nothing held.
fn complete_next_script(claimable: &str, log: bool) -> String {
    let busy = 17 + column_count(RUNNER_COLUMNS);
    let claim = busy + column_count(RUNNER_COLUMNS);
    let log = match log {
        true => log_step("", claim + 8, claim + 9),
        false => String::new(),
    };
    format!(
        "SAVEPOINT complete_next; {end}{log}{start} RETURNING 1 AS part, id, {JOB_COLUMNS}; \
         RELEASE complete_next",
        end = end_job("0 AS part, "),
        start = start_job(
            claimable,
            "changes() = 1 AND id = $15",
            busy,
            (15, claim + 2, claim + 5, claim + 7),
        ),
    )
}

/// A SQLite script's completion steps: runner `$15`'s compare-and-set
/// (version `$16`) to its columns from `$17`, only while job `$1`'s guard
/// holds; then, only if that wrote, the job's guarded change, returning
/// `part` (a column or nothing) and the job.
fn end_job(part: &str) -> String {
    format!(
        "UPDATE runners SET {runner} WHERE id = $15 AND version = $16 \
           AND EXISTS (SELECT 1 FROM jobs WHERE id = $1 AND {GUARD}); \
         UPDATE jobs SET {GUARDED_SET} WHERE changes() = 1 AND id = $1 AND {GUARD} \
           RETURNING {part}id, {JOB_COLUMNS}; ",
        runner = assignments(RUNNER_COLUMNS, 17),
    )
}

/// A SQLite script's log step: job `$1`'s log (`$exit`, `$text`), only if
/// `when` (a condition and `AND`, or nothing) and the step before wrote.
fn log_step(when: &str, exit: usize, text: usize) -> String {
    format!(
        "INSERT INTO job_logs (job_id, exit_code, log) SELECT $1, ${exit}, ${text} \
         WHERE {when}changes() = 1 {LOG_UPSERT}; "
    )
}

/// A SQLite script's start steps: runner `$runner` busy (its columns from
/// `$busy`, the job the first `claimable` one) where `guard` holds and a
/// job is claimable; then, only if that wrote, that job started under the
/// lease ending `$lease`, with the history `$steps`, at `$now`. No `;` at
/// the end: the caller may return the started job.
fn start_job(
    claimable: &str,
    guard: &str,
    busy: usize,
    (runner, lease, steps, now): (usize, usize, usize, usize),
) -> String {
    format!(
        "WITH next AS MATERIALIZED ({claimable}) \
         UPDATE runners SET {busy} WHERE {guard} AND EXISTS (SELECT 1 FROM next); \
         UPDATE jobs SET state = 'running', runner_id = ${runner}, lease_deadline = ${lease}, \
           started_at = ${now}, history = history || ${steps}, version = version + 2 \
           WHERE changes() = 1 AND state = 'queued' \
           AND id = (SELECT job_id FROM runners WHERE id = ${runner})",
        busy = runner_assignments_with_job(busy, "(SELECT id FROM next)"),
    )
}

#[async_trait]
impl Dialect for SqliteDialect {
    type Db = sqlx::Sqlite;
    const BACKEND: Backend = Backend::Sqlite;

    fn migrator() -> &'static Migrator {
        &MIGRATOR
    }

    /// One statement for every form: SQLite plans a statement once, with
    /// no statistics, and evaluates the labels' and the cap's subqueries
    /// only where `?5` and `?7` are not NULL.
    fn claim_statement(_form: ClaimForm) -> String {
        claim("state = 'provisioning', version = version + 1")
    }

    fn guarded_pair_statement() -> String {
        guarded_pair_script()
    }

    fn claim_start_statement(_form: ClaimForm) -> ClaimStartSql {
        // The completion's claim comes after its 16 parameters and the
        // runner's columns twice.
        let first = 17 + 2 * column_count(RUNNER_COLUMNS);
        let complete_next = |log| complete_next_script(&claimable_from(first), log);
        ClaimStartSql::Script {
            script: claim_start_script(),
            complete_next: (complete_next(true), complete_next(false)),
        }
    }

    async fn reclaim_space(store: &SqliteStore, pages: u32) -> Result<(), StoreError> {
        sqlx::query(&format!("PRAGMA incremental_vacuum({pages})"))
            .execute(store.writer())
            .await?;
        Ok(())
    }

    async fn try_lead(
        _store: &SqliteStore,
        _name: &str,
        _silence: Duration,
    ) -> Result<Option<Box<dyn Leadership>>, StoreError> {
        Ok(Some(Box::new(crate::SoleLeader)))
    }

    async fn enqueue_many(
        store: &SqliteStore,
        jobs: &[NewJob],
        now: Timestamp,
    ) -> Result<Vec<Enqueued>, StoreError> {
        let mut connection = store.inner.writer.acquire().await?;
        let result: Result<Vec<Enqueued>, StoreError> = async {
            let mut transaction = sqlx::Connection::begin(&mut *connection).await?;
            let mut results = Vec::with_capacity(jobs.len());
            for job in jobs {
                results.push(store.inner.insert_job(&mut transaction, job, now).await?);
            }
            transaction.commit().await?;
            Ok(results)
        }
        .await;
        crate::conn::settle(connection, result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every statement of the hot path's scripts finds its rows by key or
    /// through an index, never by reading a whole table: a start or a
    /// completion costs the same with a long history as with none.
    #[tokio::test]
    async fn the_scripts_read_no_whole_table() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("runway.db").display());
        let store = SqliteStore::open(&url).await.expect("open");
        let first = 17 + 2 * column_count(RUNNER_COLUMNS);
        let scripts = [
            claim_start_script(),
            guarded_pair_script(),
            complete_next_script(&claimable_from(first), true),
            complete_next_script(&claimable_from(first), false),
        ];
        let mut planned = 0;
        for script in &scripts {
            for statement in script.split(';').map(str::trim) {
                if statement.is_empty()
                    || statement.starts_with("SAVEPOINT")
                    || statement.starts_with("RELEASE")
                {
                    continue;
                }
                let plan: Vec<(i64, i64, i64, String)> =
                    sqlx::query_as(&format!("EXPLAIN QUERY PLAN {statement}"))
                        .fetch_all(store.writer())
                        .await
                        .expect("plan");
                for (_, _, _, detail) in &plan {
                    let whole = ["jobs", "runners", "job_logs"].iter().any(|table| {
                        detail.starts_with(&format!("SCAN {table}")) && !detail.contains("USING")
                    });
                    assert!(!whole, "{statement}\n{plan:?}");
                }
                planned += 1;
            }
        }
        assert_eq!(planned, 3 + 3 + 5 + 4, "every statement was planned");
    }
}
