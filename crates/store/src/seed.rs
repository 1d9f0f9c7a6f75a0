//! A long history, written straight into a store: what weeks of a busy
//! organisation leave behind (finished jobs, ended runners, webhook
//! deliveries), for `runway-bench soak` and the history benchmarks. Rows are
//! inserted by set-based statements in chunks, so a million of each takes
//! seconds, not the hours the store's API would take one durable write at a
//! time. Never used by `runway serve`.

use sqlx::Connection;

use crate::{Backend, StoreError};
use runway_core::Timestamp;

/// What to write: `count` finished jobs, ended runners and deliveries, all
/// in `pool`, ending at `to`: the jobs finished evenly over the `jobs_span`
/// before it, the runners ended and the deliveries arrived over `span`
/// (retention keeps them for different times, so a steady state keeps
/// a longer history of jobs).
#[derive(Debug, Clone)]
pub struct History {
    pub pool: String,
    pub count: u64,
    pub jobs_span: std::time::Duration,
    pub span: std::time::Duration,
    pub to: Timestamp,
}

/// Rows per statement: big enough to be set-based, small enough that no
/// statement holds much memory or the writer for long.
const CHUNK: u64 = 50_000;

/// Writes `history` into the store at `url` (already migrated: open it with
/// [`crate::open`] first). Names start with `history-`, so a second call
/// with the same count collides; call it once per store.
pub async fn seed_history(url: &str, history: &History) -> Result<(), StoreError> {
    let backend = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Backend::Postgres
    } else {
        Backend::Sqlite
    };
    let statements = statements(backend, history);
    let mut start = 1;
    match backend {
        Backend::Postgres => {
            let mut connection = sqlx::PgConnection::connect(url).await?;
            while start <= history.count {
                let end = (start + CHUNK - 1).min(history.count);
                for sql in &statements {
                    sqlx::query(sql)
                        .bind(start as i64)
                        .bind(end as i64)
                        .execute(&mut connection)
                        .await?;
                }
                start = end + 1;
            }
            // What a server that has run for weeks has: statistics, a
            // visibility map (autovacuum's work), and the seeded pages
            // written out, so no catch-up vacuum or checkpoint lands in
            // the middle of a measurement.
            sqlx::query("VACUUM ANALYZE")
                .execute(&mut connection)
                .await?;
            // Superuser only; without it the checkpoint comes when it comes.
            let _ = sqlx::query("CHECKPOINT").execute(&mut connection).await;
        }
        Backend::Sqlite => {
            let path = url
                .strip_prefix("sqlite://")
                .or_else(|| url.strip_prefix("sqlite:"))
                .unwrap_or(url);
            let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
            let mut connection = sqlx::SqliteConnection::connect_with(&options).await?;
            while start <= history.count {
                let end = (start + CHUNK - 1).min(history.count);
                let mut transaction = connection.begin().await?;
                for sql in &statements {
                    sqlx::query(sql)
                        .bind(start as i64)
                        .bind(end as i64)
                        .execute(&mut *transaction)
                        .await?;
                }
                transaction.commit().await?;
                start = end + 1;
            }
            // No ANALYZE: runway's own SQLite store has no statistics
            // either, and the plans must be the ones it really runs.
            sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                .execute(&mut connection)
                .await?;
        }
    }
    Ok(())
}

/// The three inserts, each over the row numbers `$1..=$2` (`i`), with the
/// end time of row `i` at `t` (`tj` for jobs).
fn statements(backend: Backend, history: &History) -> Vec<String> {
    let series = match backend {
        Backend::Postgres => "generate_series($1::BIGINT, $2::BIGINT) AS s(i)".to_owned(),
        Backend::Sqlite => "n".to_owned(),
    };
    let with = match backend {
        Backend::Postgres => String::new(),
        Backend::Sqlite => {
            "WITH RECURSIVE n(i) AS (SELECT ?1 UNION ALL SELECT i + 1 FROM n WHERE i < ?2) "
                .to_owned()
        }
    };
    let count = history.count.max(1);
    let to = history.to.as_millis();
    let spread = |span: std::time::Duration| {
        let span = (span.as_millis() as i64).max(1);
        format!("({} + i * {span} / {count})", to - span)
    };
    let (tj, t) = (spread(history.jobs_span), spread(history.span));
    let pool = history.pool.replace('\'', "''");
    let labels = r#"'["self-hosted","linux","x64"]'"#;
    vec![
        format!(
            "{with}INSERT INTO jobs (source, external_id, pool, labels, state, attempts, max_attempts, \
             runner_id, payload, created_at, enqueued_at, started_at, finished_at, conclusion, version) \
             SELECT 'github', 'history-' || i, '{pool}', {labels}, 'completed', 0, 3, i, \
             '{{\"run_id\":' || i || ',\"workflow\":\"ci\",\"repository\":\"octo-org/history\"}}', \
             {tj} - 90000, {tj} - 90000, {tj} - 60000, {tj}, 'success', 4 FROM {series}"
        ),
        format!(
            "{with}INSERT INTO runners (name, pool, provider, labels, instance_id, state, job_id, \
             requested_at, provisioning_at, idle_at, busy_at, terminating_at, ended_at, reason, version) \
             SELECT 'history-' || i, '{pool}', 'sim', {labels}, 'history-' || i, 'terminated', i, \
             {t} - 120000, {t} - 115000, {t} - 70000, {t} - 60000, {t} - 1000, {t}, 'job done', 6 FROM {series}"
        ),
        format!(
            "{with}INSERT INTO deliveries (delivery_id, event, action, external_id, outcome, received_at) \
             SELECT 'history-' || i, 'workflow_job', 'completed', 'history-' || i, 'updated', {t} FROM {series}"
        ),
    ]
}

/// Creates schema `schema` on the PostgreSQL server at `url` and returns a
/// URL whose connections work in it (its `search_path`).
pub async fn scratch_schema(url: &str, schema: &str) -> Result<String, StoreError> {
    let mut connection = sqlx::PgConnection::connect(url).await?;
    sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
        .execute(&mut connection)
        .await?;
    let separator = if url.contains('?') { '&' } else { '?' };
    Ok(format!(
        "{url}{separator}options=-c%20search_path%3D{schema}"
    ))
}

/// Drops a schema [`scratch_schema`] made, with everything in it.
pub async fn drop_schema(url: &str, schema: &str) -> Result<(), StoreError> {
    let mut connection = sqlx::PgConnection::connect(url).await?;
    sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .execute(&mut connection)
        .await?;
    Ok(())
}
