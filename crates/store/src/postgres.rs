//! PostgreSQL, for several replicas sharing one database. Claims use
//! `FOR UPDATE SKIP LOCKED`, so concurrent claimers on any replica never
//! block each other and never take the same job.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use runway_core::job::NewJob;
use runway_core::{Job, JobId, Timestamp};
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection};

use crate::common::{ClaimForm, ClaimStartSql};
use crate::conn::describe_sqlx_error;
use crate::group_commit::{BatchExecutor, GroupCommit, Op, Outcome};
use crate::held::PING_AFTER_IDLE;
use crate::rows::{JobRow, JOB_COLUMNS};
use crate::sql::{Dialect, Shared, SqlStore};
use crate::{
    redact_url, Backend, Enqueued, Leadership, OpenOptions, Store, StoreError, Wake, WakeListener,
};

static MIGRATOR: Migrator = sqlx::migrate!("./migrations/postgres");

/// The PostgreSQL store.
pub type PostgresStore = SqlStore<PostgresDialect>;

/// PostgreSQL's ways: claims with `FOR UPDATE SKIP LOCKED`, leadership by
/// advisory lock, wake-ups by NOTIFY, fencing by a session setting, bulk
/// enqueue by `UNNEST`.
pub struct PostgresDialect;

/// Columns a new job sets; the rest take their defaults, which are exactly
/// the initial values `NewJob::initial` gives them. The queued jobs' fair-
/// share tags are computed here, a batch at a time (migration 0025): per
/// (pool, key), the later of the pool's virtual time and the key's last
/// queued tag plus one step, then one step of 1/weight per further job of
/// the key, in the batch's order, as the trigger would tag them row by
/// row. A job whose insert conflicts still took its step (a gap in its
/// key's tags, no reordering).
static ENQUEUE_MANY: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH input AS (\
           SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], \
             $6::bigint[], $7::text[], $8::bigint[], $9::bigint[], $10::bigint[], $11::text[], \
             $12::text[], $13::bigint[]) WITH ORDINALITY AS i(source, external_id, pool, labels, \
             state, max_attempts, payload, created_at, enqueued_at, finished_at, reason, \
             share_key, share_weight, ord)), \
         stepped AS (\
           SELECT input.*, \
             sum(1000.0 / greatest(share_weight, 1)) OVER keyed \
               - first_value(1000.0 / greatest(share_weight, 1)) OVER keyed AS after_first, \
             first_value(1000.0 / greatest(share_weight, 1)) OVER keyed AS first_step \
           FROM input WINDOW keyed AS (PARTITION BY pool, share_key ORDER BY ord \
             ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)), \
         bases AS (\
           SELECT k.pool, k.share_key, greatest(\
             (SELECT share_tag FROM jobs WHERE pool = k.pool AND state = 'provisioning' \
               ORDER BY share_tag DESC LIMIT 1), \
             (SELECT share_tag FROM jobs WHERE pool = k.pool AND state = 'running' \
               ORDER BY share_tag DESC LIMIT 1), \
             (SELECT share_tag FROM jobs WHERE pool = k.pool AND state = 'queued' \
               ORDER BY share_tag LIMIT 1), \
             0) AS served, \
             (SELECT share_tag FROM jobs WHERE pool = k.pool AND share_key = k.share_key \
               AND state = 'queued' ORDER BY share_tag DESC LIMIT 1) AS last \
           FROM (SELECT DISTINCT pool, share_key FROM input WHERE state = 'queued') AS k) \
         INSERT INTO jobs (source, external_id, pool, labels, state, max_attempts, payload, \
           created_at, enqueued_at, finished_at, reason, share_key, share_weight, share_tag) \
         SELECT s.source, s.external_id, s.pool, s.labels, s.state, s.max_attempts, s.payload, \
           s.created_at, s.enqueued_at, s.finished_at, s.reason, s.share_key, s.share_weight, \
           CASE WHEN s.state = 'queued' \
             THEN greatest(b.served, b.last + s.first_step) + s.after_first ELSE 0 END \
         FROM stepped AS s LEFT JOIN bases AS b \
           ON b.pool = s.pool AND b.share_key = s.share_key \
         ORDER BY s.ord \
         ON CONFLICT (source, external_id) DO NOTHING RETURNING id, {JOB_COLUMNS}"
    )
});

static FIND_MANY: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT id, {JOB_COLUMNS} FROM jobs \
         WHERE (source, external_id) IN (SELECT * FROM UNNEST($1::text[], $2::text[]))"
    )
});

impl SqlStore<PostgresDialect> {
    /// Connects to `url` and applies migrations. With `schema`, every table
    /// lives in that schema (created if missing) instead of the URL's default;
    /// the test suite gives each test its own.
    pub async fn open(
        url: &str,
        schema: Option<&str>,
        options: &OpenOptions,
    ) -> Result<PostgresStore, StoreError> {
        let target = format!("PostgreSQL database {}", redact_url(url));
        let mut connect = PgConnectOptions::from_str(url).map_err(|e| StoreError::InvalidUrl {
            url: redact_url(url),
            reason: e.to_string(),
        })?;
        let open_error = |e: sqlx::Error| StoreError::Open {
            target: target.clone(),
            reason: describe_sqlx_error(&e),
        };
        // One direct connection first: a pool only reports "timed out" when
        // the server is unreachable, this says why (refused, bad password, …).
        let mut connection = tokio_timeout(options, connect.connect())
            .await
            .map_err(open_error)?;
        if let Some(schema) = schema {
            sqlx::query(&format!(
                "CREATE SCHEMA IF NOT EXISTS \"{}\"",
                schema.replace('"', "")
            ))
            .execute(&mut connection)
            .await
            .map_err(open_error)?;
            connect = connect.options([("search_path", schema)]);
        }
        connection.close().await.map_err(open_error)?;
        let pool = pool_options(options.max_connections, options.connect_timeout)
            .connect_with(connect)
            .await
            .map_err(open_error)?;
        MIGRATOR.run(&pool).await.map_err(|e| StoreError::Migrate {
            target: target.clone(),
            reason: e.to_string(),
        })?;
        // Half the pool may wait checked out for the hot path's next read
        // or write (crate::held); the other half is always there for the rest.
        let keep = (options.max_connections / 2) as usize;
        let inner = Arc::new(Shared::new(pool.clone(), pool, target, keep, None));
        // Measured (BENCHMARKS.md): on PostgreSQL the server already overlaps
        // WAL flushes of concurrent connections, and the extra hop and
        // BEGIN/COMMIT of shared transactions cost more than they save.
        let group = GroupCommit::direct(inner.clone());
        Ok(PostgresStore { inner, group })
    }

    /// Drops `schema` and everything in it. For tests.
    pub async fn drop_schema(url: &str, schema: &str) -> Result<(), StoreError> {
        let mut connection = PgConnectOptions::from_str(url)?.connect().await?;
        sqlx::query(&format!(
            "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
            schema.replace('"', "")
        ))
        .execute(&mut connection)
        .await?;
        connection.close().await?;
        Ok(())
    }

    /// Closes the pool, waiting for connections in use to be returned.
    pub async fn close(&self) {
        self.inner.writer.close().await;
    }

    fn pool(&self) -> &PgPool {
        &self.inner.writer
    }
}

#[async_trait]
impl BatchExecutor for Shared<PostgresDialect> {
    async fn execute(&self, ops: &[&Op]) -> Result<Vec<Outcome>, StoreError> {
        self.execute_batch(ops).await
    }
}

async fn tokio_timeout<T>(
    options: &OpenOptions,
    future: impl std::future::Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    match tokio::time::timeout(options.connect_timeout, future).await {
        Ok(result) => result,
        Err(_) => Err(sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {:?}", options.connect_timeout),
        ))),
    }
}

/// The advisory lock's session; closing it releases the lock.
struct PgLeadership {
    connection: sqlx::PgConnection,
}

#[async_trait]
impl Leadership for PgLeadership {
    async fn still_held(&mut self) -> bool {
        sqlx::query("SELECT 1")
            .execute(&mut self.connection)
            .await
            .is_ok()
    }
}

/// The options of every pool of the store: `max_connections` at most,
/// waiting up to `acquire_timeout` for one, and a ping only for a
/// connection idle longer than [`PING_AFTER_IDLE`]. (sqlx's default pings
/// before *every* acquire: a round trip to the server before each
/// statement.) One in steady use has just answered; one the server dropped
/// meanwhile fails its statement and is closed, as it would if it died
/// between a ping and the statement.
fn pool_options(max_connections: u32, acquire_timeout: Duration) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(acquire_timeout)
        .test_before_acquire(false)
        .before_acquire(|connection, metadata| {
            Box::pin(async move {
                if metadata.idle_for > PING_AFTER_IDLE {
                    connection.ping().await?;
                }
                Ok(true)
            })
        })
}

/// The NOTIFY channel of the schema a connection works in: replicas of one
/// store share it, tests in other schemas of the same database do not.
const WAKE_CHANNEL: &str = "SELECT 'runway_wake_' || md5(current_schema())";

struct PgWakeListener {
    listener: sqlx::postgres::PgListener,
}

#[async_trait]
impl WakeListener for PgWakeListener {
    async fn next(&mut self) -> Result<crate::Heard, StoreError> {
        loop {
            let Some(notification) = self.listener.try_recv().await? else {
                return Ok(crate::Heard::Lost);
            };
            // "<replica> <wake>"; anything else is not ours to act on.
            let mut parts = notification.payload().splitn(2, ' ');
            let from = parts.next().unwrap_or_default();
            if let Some(wake) = parts.next().and_then(crate::Wake::parse) {
                return Ok(crate::Heard::Wake {
                    from: from.to_owned(),
                    wake,
                });
            }
        }
    }
}

fn key(job: &Job) -> (&'static str, String) {
    (job.source.as_str(), job.external_id.clone())
}

/// The queued jobs a claim takes, locked: up to `$4` (the literal 1 in the
/// form for claims of one) of pool `$1` that runner `$2` did not decline,
/// whose labels the runner's (`$5`, a JSON list in lowercase; in the form
/// for runners without labels `$5` is NULL and any job's labels do) all
/// cover and whose share key has fewer than `$7` jobs provisioning or
/// running (in the form without a cap `$7` is NULL), in the pool's
/// fair-share order (`share_tag`, migration 0021); rows another claimer
/// holds are skipped, not waited for. [`crate::common::ClaimForms`] says why
/// each form says only what its claims need; a parameter a form leaves
/// out is still checked to be NULL (or 1), so a form can never serve a
/// claim it was not made for. The cover is one jsonb containment of the
/// job's labels, lowercased as JSON text, in the runner's: the labels are
/// written as plain JSON strings, whose escapes hold no letter to
/// lowercase, so that is each label lowercased; and a subplan per label
/// would be set up again each execution. The chained completion's claim,
/// `runway_start_next` (migrations 0019, 0021, 0028), repeats this
/// selection in PL/pgSQL: a change here is a migration there too (the
/// conformance cases on labels and declines run both).
fn next_queued(form: ClaimForm) -> String {
    let labels = match form.labelled {
        true => "lower(labels)::jsonb <@ $5::jsonb",
        false => "$5::text IS NULL",
    };
    let cap = match form.capped {
        true => {
            "(SELECT count(*) FROM jobs AS r WHERE r.pool = jobs.pool \
             AND r.share_key = jobs.share_key AND r.state IN ('provisioning', 'running')) < $7::bigint"
        }
        false => "$7::bigint IS NULL",
    };
    let (limit, one) = match form.one {
        true => ("1", "$4::bigint = 1"),
        false => ("$4", "true"),
    };
    format!(
        "SELECT id FROM jobs WHERE state = 'queued' AND pool = $1 \
         AND (excluded_runners = '[]' OR NOT (excluded_runners::jsonb @> to_jsonb($2::bigint))) \
         AND {labels} AND {cap} AND {one} \
         ORDER BY share_tag, id LIMIT {limit} \
         FOR UPDATE SKIP LOCKED"
    )
}

#[async_trait]
impl Dialect for PostgresDialect {
    type Db = sqlx::Postgres;
    const BACKEND: Backend = Backend::Postgres;

    fn migrator() -> &'static Migrator {
        &MIGRATOR
    }

    fn claim_statement(form: ClaimForm) -> String {
        format!(
            "WITH next AS ({}) \
             UPDATE jobs SET state = 'provisioning', runner_id = $2, lease_deadline = $3, \
               history = jobs.history || $6, version = jobs.version + 1 \
             FROM next WHERE jobs.id = next.id \
             RETURNING jobs.id, {}",
            next_queued(form),
            crate::common::qualified("jobs", JOB_COLUMNS)
        )
    }

    /// Every start claims one job (`$4` is bound 1).
    fn claim_start_statement(form: ClaimForm) -> ClaimStartSql {
        let form = ClaimForm { one: true, ..form };
        ClaimStartSql::OneStatement(crate::common::claim_start_postgres(&next_queued(form)))
    }

    fn guarded_pair_statement() -> String {
        crate::common::guarded_pair_postgres()
    }

    fn complete_next_statement() -> Option<String> {
        Some(crate::common::complete_next_postgres())
    }

    fn enqueue_delivery_statement() -> Option<String> {
        Some(crate::common::enqueue_delivery_postgres())
    }

    /// PostgreSQL's autovacuum makes deleted rows' space reusable.
    async fn reclaim_space(_store: &PostgresStore, _pages: u32) -> Result<(), StoreError> {
        Ok(())
    }

    /// One NOTIFY per wake-up on the schema's channel, in one statement.
    async fn announce(store: &PostgresStore, from: &str, wakes: &[Wake]) -> Result<(), StoreError> {
        if wakes.is_empty() {
            return Ok(());
        }
        let payloads: Vec<String> = wakes
            .iter()
            .map(|wake| format!("{from} {}", wake.encode()))
            .collect();
        sqlx::query(&format!(
            "SELECT pg_notify(({WAKE_CHANNEL}), payload) FROM UNNEST($1::text[]) AS p(payload)"
        ))
        .bind(&payloads)
        .execute(store.pool())
        .await?;
        Ok(())
    }

    /// LISTEN on a connection of its own (sqlx reconnects it after a loss).
    async fn listen(store: &PostgresStore) -> Result<Option<Box<dyn WakeListener>>, StoreError> {
        let mut listener = sqlx::postgres::PgListener::connect_with(store.pool()).await?;
        let channel: String = sqlx::query_scalar(WAKE_CHANNEL)
            .fetch_one(&mut listener)
            .await?;
        listener.listen(&channel).await?;
        Ok(Some(Box::new(PgWakeListener { listener })))
    }

    /// The same store on a small pool of its own whose sessions carry the
    /// fence `NAME:TERM` (`runway.fence`): migration 0013's trigger refuses
    /// their writes to runners and once-keys, in the writing transaction,
    /// once `term` is no longer the current term of `name`.
    fn fenced(store: &PostgresStore, name: &str, term: i64) -> Option<Arc<dyn Store>> {
        let fence = format!("{name}:{term}");
        let pool = pool_options(4, store.inner.writer.options().get_acquire_timeout())
            .after_connect(move |connection, _| {
                let fence = fence.clone();
                Box::pin(async move {
                    sqlx::query("SELECT set_config('runway.fence', $1, false)")
                        .bind(fence)
                        .execute(connection)
                        .await
                        .map(|_| ())
                })
            })
            .connect_lazy_with((*store.inner.writer.connect_options()).clone());
        let inner = Arc::new(Shared::new(
            pool.clone(),
            pool,
            store.inner.target.clone(),
            2,
            None,
        ));
        let group = GroupCommit::direct(inner.clone());
        Some(Arc::new(PostgresStore { inner, group }))
    }

    /// A session-level advisory lock on a connection of its own, keyed by
    /// the schema and `name` (tests share a database, each in a schema).
    /// The session ending releases it: the process dying, or (through
    /// `idle_session_timeout`) the holder staying silent for `silence`, as
    /// a paused or partitioned leader does; `still_held` speaks often
    /// enough to keep it.
    async fn try_lead(
        store: &PostgresStore,
        name: &str,
        silence: Duration,
    ) -> Result<Option<Box<dyn Leadership>>, StoreError> {
        let mut connection = store.writer().acquire().await?.detach();
        // PostgreSQL 14 and later; before, a paused leader keeps the lead
        // until it resumes (or its host dies and TCP keepalive notices).
        if let Err(error) = sqlx::query("SELECT set_config('idle_session_timeout', $1, false)")
            .bind(format!("{}ms", silence.as_millis().max(1)))
            .execute(&mut connection)
            .await
        {
            tracing::warn!(%error, "cannot bound the leader's silence (idle_session_timeout needs PostgreSQL 14)");
        }
        let locked: bool = sqlx::query_scalar(
            "SELECT pg_try_advisory_lock(hashtext(current_schema() || ':' || $1)::bigint)",
        )
        .bind(name)
        .fetch_one(&mut connection)
        .await?;
        if !locked {
            let _ = connection.close().await;
            return Ok(None);
        }
        Ok(Some(Box::new(PgLeadership { connection })))
    }

    async fn enqueue_many(
        store: &PostgresStore,
        jobs: &[NewJob],
        now: Timestamp,
    ) -> Result<Vec<Enqueued>, StoreError> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let initial: Vec<Job> = jobs.iter().map(|job| job.initial(JobId(0), now)).collect();
        let column = |f: &dyn Fn(&Job) -> Option<String>| initial.iter().map(f).collect::<Vec<_>>();
        let number = |f: &dyn Fn(&Job) -> Option<i64>| initial.iter().map(f).collect::<Vec<_>>();
        let sources = column(&|j| Some(j.source.as_str().to_owned()));
        let external_ids = column(&|j| Some(j.external_id.clone()));
        let inserted: Vec<JobRow> = sqlx::query_as(&ENQUEUE_MANY)
            .bind(&sources)
            .bind(&external_ids)
            .bind(column(&|j| j.pool.clone()))
            .bind(column(&|j| Some(crate::rows::json_list(&j.labels))))
            .bind(column(&|j| Some(j.state.as_str().to_owned())))
            .bind(number(&|j| Some(i64::from(j.max_attempts))))
            .bind(column(&|j| Some(j.payload.clone())))
            .bind(number(&|j| Some(j.created_at.as_millis())))
            .bind(number(&|j| Some(j.enqueued_at.as_millis())))
            .bind(number(&|j| j.finished_at.map(Timestamp::as_millis)))
            .bind(column(&|j| j.reason.clone()))
            .bind(column(&|j| Some(j.share.key.clone())))
            .bind(number(&|j| Some(i64::from(j.share.weight.millis()))))
            .fetch_all(store.pool())
            .await?;
        let mut created: HashMap<(&'static str, String), Job> = HashMap::new();
        for row in inserted {
            let job = Job::try_from(row)?;
            created.insert(key(&job), job);
        }
        let mut existing: HashMap<(&'static str, String), Job> = HashMap::new();
        if created.len() < jobs.len() {
            let rows: Vec<JobRow> = sqlx::query_as(&FIND_MANY)
                .bind(&sources)
                .bind(&external_ids)
                .fetch_all(store.pool())
                .await?;
            for row in rows {
                let job = Job::try_from(row)?;
                existing.insert(key(&job), job);
            }
        }
        let mut results = Vec::with_capacity(jobs.len());
        for job in &initial {
            // The first occurrence of a new key created it; any repeat did not.
            let result = match created.remove(&key(job)) {
                Some(stored) => {
                    existing.insert(key(job), stored.clone());
                    Enqueued {
                        job: stored,
                        created: true,
                    }
                }
                None => {
                    let stored = existing.get(&key(job)).cloned().ok_or_else(|| {
                        StoreError::Corrupt(format!(
                            "job {} conflicted but is not stored",
                            job.external_id
                        ))
                    })?;
                    Enqueued {
                        job: stored,
                        created: false,
                    }
                }
            };
            results.push(result);
        }
        Ok(results)
    }
}
