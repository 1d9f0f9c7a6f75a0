//! The statements and method bodies both backends share. The SQL is written
//! once with `$n` placeholders: PostgreSQL's own, and sqlx's SQLite driver
//! binds a `$n` parameter to argument `n` just as it does `?n` (sqlx-sqlite
//! `arguments.rs`), so the same text runs on both, unrewritten.

use crate::rows::{assignments, column_count, placeholders, JobRow, JOB_COLUMNS, RUNNER_COLUMNS};
use runway_core::{JobId, Timestamp};

/// A runner row that is live: the `runners_live` index's predicate
/// (migration 0009), kept identical so the index serves the query.
pub const LIVE_RUNNER: &str = "state NOT IN ('terminated', 'failed', 'crashed')";

/// A live job (queued, provisioning or running): what status pages count.
pub const LIVE_JOB: &str = "state IN ('queued', 'provisioning', 'running')";

/// A finished job: the predicate of the `jobs_finished` index (migration
/// 0011), kept identical so the index serves the pruner.
pub const FINISHED_JOB: &str = "state IN ('completed', 'failed', 'cancelled', 'unroutable')";

/// An ended runner: the predicate of the `runners_ended` index.
const ENDED_RUNNER: &str = "state IN ('terminated', 'failed', 'crashed')";

/// The statements that prune one [`crate::Prunable`], run in order in one
/// transaction, each bound to (cutoff, limit); the last one's count is the
/// number pruned. Dependent rows go first, by the same selection.
/// On SQLite the selections name their partial index: without statistics
/// its planner prefers the state index and sorts every finished row.
pub(crate) fn prune_statements(what: crate::Prunable, backend: crate::Backend) -> Vec<String> {
    use crate::Prunable as P;
    let (jobs_index, runners_index) = match backend {
        crate::Backend::Sqlite => (" INDEXED BY jobs_finished", " INDEXED BY runners_ended"),
        crate::Backend::Postgres => ("", ""),
    };
    let jobs = format!(
        "SELECT id FROM jobs{jobs_index} WHERE {FINISHED_JOB} AND finished_at < $1 ORDER BY finished_at, id LIMIT $2"
    );
    let runners = format!(
        "SELECT id FROM runners{runners_index} WHERE {ENDED_RUNNER} AND ended_at < $1 ORDER BY ended_at, id LIMIT $2"
    );
    match what {
        P::FinishedJobs => vec![
            format!("DELETE FROM job_logs WHERE job_id IN ({jobs})"),
            format!("DELETE FROM jobs WHERE id IN ({jobs})"),
        ],
        P::EndedRunners => vec![
            format!("DELETE FROM runner_reports WHERE runner_id IN ({runners})"),
            format!("DELETE FROM instance_tokens WHERE runner_id IN ({runners})"),
            format!("DELETE FROM runners WHERE id IN ({runners})"),
        ],
        P::Deliveries => vec![
            "DELETE FROM deliveries WHERE delivery_id IN \
             (SELECT delivery_id FROM deliveries WHERE received_at < $1 ORDER BY received_at LIMIT $2)"
                .to_owned(),
        ],
        // The logs still kept: the job_logs table is what retention keeps
        // small, so reading it is bounded.
        P::JobLogs => vec![format!(
            "DELETE FROM job_logs WHERE job_id IN (SELECT l.job_id FROM job_logs l \
             JOIN jobs j ON j.id = l.job_id WHERE j.{FINISHED_JOB} AND j.finished_at < $1 LIMIT $2)"
        )],
        P::RunnerReports => vec![
            "DELETE FROM runner_reports WHERE id IN \
             (SELECT id FROM runner_reports WHERE reported_at < $1 ORDER BY reported_at, id LIMIT $2)"
                .to_owned(),
        ],
        P::OnceKeys => vec![
            "DELETE FROM once_keys WHERE key IN \
             (SELECT key FROM once_keys WHERE done_at < $1 ORDER BY done_at LIMIT $2)"
                .to_owned(),
        ],
        P::InstanceTokens => vec![
            "DELETE FROM instance_tokens WHERE token_hash IN \
             (SELECT token_hash FROM instance_tokens WHERE expires_at < $1 ORDER BY expires_at LIMIT $2)"
                .to_owned(),
        ],
    }
}

pub(crate) struct Statements {
    pub insert_job: String,
    pub job_by_id: String,
    pub job_by_external_id: String,
    pub replace_job: String,
    /// A [`runway_core::GuardedChange`] in one statement (see `guarded_job`).
    pub guarded_job: String,
    pub expired_leases: String,
    pub insert_runner: String,
    pub runner_by_id: String,
    pub runner_by_name: String,
    pub replace_runner: String,
    pub insert_delivery: String,
    pub delivery_seen: String,
    pub worker_configs: WorkerConfigStatements,
    pub runner_api: RunnerApiStatements,
    /// Per [`crate::Prunable`], in `Prunable::ALL` order.
    pub prune: [Vec<String>; 7],
}

pub(crate) struct RunnerApiStatements {
    pub insert_registration: String,
    pub redeem_registration: String,
    pub set_runner_token: String,
    pub runner_by_token: String,
    pub insert_setting: String,
    pub get_setting: String,
    pub put_setting: String,
    pub set_external_id: String,
    pub claim_once: String,
    pub prune_once: String,
    pub forget_once: String,
    pub get_external_id: String,
    pub put_log: String,
    pub get_log: String,
    pub add_report: String,
    pub reports: String,
    pub insert_instance_token: String,
    pub instance_token: String,
    pub take_instance_registration: String,
    pub heartbeat_replica: String,
    pub forget_replicas: String,
    pub replicas: String,
    pub begin_term: String,
    pub leader: String,
}

impl RunnerApiStatements {
    fn new() -> RunnerApiStatements {
        RunnerApiStatements {
            insert_registration: "INSERT INTO registration_tokens (token_hash, pool, created_at, expires_at, runner_id) VALUES ($1, $2, $3, $4, $5)".into(),
            redeem_registration: "UPDATE registration_tokens SET used_at = $2 \
                 WHERE token_hash = $1 AND used_at IS NULL AND expires_at > $2 RETURNING pool, runner_id"
                    .into(),
            set_runner_token: "UPDATE runners SET token_hash = $2 WHERE id = $1".into(),
            runner_by_token: format!("SELECT id, {RUNNER_COLUMNS} FROM runners WHERE token_hash = $1"),
            insert_setting: "INSERT INTO settings (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING".into(),
            get_setting: "SELECT value FROM settings WHERE key = $1".into(),
            put_setting: "INSERT INTO settings (key, value) VALUES ($1, $2) \
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value"
                    .into(),
            set_external_id: "UPDATE runners SET external_id = $2 WHERE id = $1".into(),
            claim_once: "INSERT INTO once_keys (key, done_at) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING".into(),
            prune_once: "DELETE FROM once_keys WHERE done_at < $1".into(),
            forget_once: "DELETE FROM once_keys WHERE key = $1".into(),
            get_external_id: "SELECT external_id FROM runners WHERE id = $1".into(),
            put_log: "INSERT INTO job_logs (job_id, exit_code, log) VALUES ($1, $2, $3) \
                 ON CONFLICT (job_id) DO UPDATE SET exit_code = excluded.exit_code, log = excluded.log"
                    .into(),
            get_log: "SELECT exit_code, log FROM job_logs WHERE job_id = $1".into(),
            add_report: "INSERT INTO runner_reports (runner_id, phase, body, reported_at) VALUES ($1, $2, $3, $4)".into(),
            reports: "SELECT phase, body FROM runner_reports WHERE runner_id = $1 ORDER BY id".into(),
            insert_instance_token: "INSERT INTO instance_tokens (token_hash, runner_id, expires_at, jit_files) VALUES ($1, $2, $3, $4)".into(),
            instance_token: "SELECT runner_id, expires_at, jit_files, token_fetched_at FROM instance_tokens WHERE token_hash = $1".into(),
            take_instance_registration: "UPDATE instance_tokens SET token_fetched_at = $2 WHERE token_hash = $1 AND token_fetched_at IS NULL".into(),
            heartbeat_replica: "INSERT INTO replicas (id, address, version, started_at, heartbeat_at) VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (id) DO UPDATE SET address = excluded.address, version = excluded.version, \
                 heartbeat_at = excluded.heartbeat_at"
                    .into(),
            forget_replicas: "DELETE FROM replicas WHERE heartbeat_at < $1".into(),
            replicas: "SELECT id, address, version, started_at, heartbeat_at FROM replicas \
                 WHERE heartbeat_at >= $1 ORDER BY started_at, id"
                    .into(),
            begin_term: "INSERT INTO leader_terms (name, term, replica, since) VALUES ($1, 1, $2, $3) \
                 ON CONFLICT (name) DO UPDATE SET term = leader_terms.term + 1, \
                 replica = excluded.replica, since = excluded.since RETURNING term"
                    .into(),
            leader: "SELECT replica, term, since FROM leader_terms WHERE name = $1".into(),
        }
    }
}

pub(crate) struct WorkerConfigStatements {
    pub list: String,
    pub get: String,
    pub all_pools: String,
    pub pools_of: String,
    pub insert: String,
    pub update_any: String,
    pub update_if: String,
    pub version: String,
    pub delete_pools: String,
    pub insert_pool: String,
    pub pool_owner: String,
    pub delete_any: String,
    pub delete_if: String,
}

impl WorkerConfigStatements {
    fn new() -> WorkerConfigStatements {
        WorkerConfigStatements {
            list: "SELECT id, version, body, updated_at FROM worker_configs ORDER BY id".to_owned(),
            get: "SELECT id, version, body, updated_at FROM worker_configs WHERE id = $1"
                .to_owned(),
            all_pools: "SELECT pool, config_id FROM worker_config_pools ORDER BY pool".to_owned(),
            pools_of: "SELECT pool FROM worker_config_pools WHERE config_id = $1 ORDER BY pool"
                .to_owned(),
            insert:
                "INSERT INTO worker_configs (id, version, body, updated_at) VALUES ($1, 1, $2, $3) \
                 ON CONFLICT (id) DO NOTHING"
                    .to_owned(),
            update_any:
                "UPDATE worker_configs SET version = version + 1, body = $2, updated_at = $3 \
                 WHERE id = $1 RETURNING version"
                    .to_owned(),
            update_if:
                "UPDATE worker_configs SET version = version + 1, body = $2, updated_at = $3 \
                 WHERE id = $1 AND version = $4 RETURNING version"
                    .to_owned(),
            version: "SELECT version FROM worker_configs WHERE id = $1".to_owned(),
            delete_pools: "DELETE FROM worker_config_pools WHERE config_id = $1".to_owned(),
            insert_pool: "INSERT INTO worker_config_pools (pool, config_id) VALUES ($1, $2)"
                .to_owned(),
            pool_owner: "SELECT config_id FROM worker_config_pools WHERE pool = $1".to_owned(),
            delete_any: "DELETE FROM worker_configs WHERE id = $1".to_owned(),
            delete_if: "DELETE FROM worker_configs WHERE id = $1 AND version = $2".to_owned(),
        }
    }
}

impl Statements {
    pub fn new(backend: crate::Backend) -> Statements {
        let job_count = column_count(JOB_COLUMNS);
        let runner_count = column_count(RUNNER_COLUMNS);
        let select_job = format!("SELECT id, {JOB_COLUMNS} FROM jobs");
        let select_runner = format!("SELECT id, {RUNNER_COLUMNS} FROM runners");
        let statements = [
            format!(
                "INSERT INTO jobs ({JOB_COLUMNS}) VALUES ({}) \
                 ON CONFLICT (source, external_id) DO NOTHING RETURNING id, {JOB_COLUMNS}",
                placeholders(1, job_count)
            ),
            format!("{select_job} WHERE id = $1"),
            format!("{select_job} WHERE source = $1 AND external_id = $2"),
            format!(
                "UPDATE jobs SET {} WHERE id = ${} AND version = ${}",
                assignments(JOB_COLUMNS, 1),
                job_count + 1,
                job_count + 2
            ),
            format!(
                "{select_job} WHERE lease_deadline IS NOT NULL AND lease_deadline <= $1 \
                 ORDER BY lease_deadline, id LIMIT $2"
            ),
            format!(
                "INSERT INTO runners ({RUNNER_COLUMNS}) VALUES ({}) RETURNING id, {RUNNER_COLUMNS}",
                placeholders(1, runner_count)
            ),
            format!("{select_runner} WHERE id = $1"),
            format!("{select_runner} WHERE name = $1"),
            format!(
                "UPDATE runners SET {} WHERE id = ${} AND version = ${}",
                assignments(RUNNER_COLUMNS, 1),
                runner_count + 1,
                runner_count + 2
            ),
            "INSERT INTO deliveries (delivery_id, event, action, external_id, outcome, received_at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (delivery_id) DO NOTHING"
                .to_owned(),
            "SELECT CAST(1 AS BIGINT) FROM deliveries WHERE delivery_id = $1".to_owned(),
            guarded_job(),
        ];
        let [insert_job, job_by_id, job_by_external_id, replace_job, expired_leases, insert_runner, runner_by_id, runner_by_name, replace_runner, insert_delivery, delivery_seen, guarded_job] =
            statements;
        Statements {
            worker_configs: WorkerConfigStatements::new(),
            runner_api: RunnerApiStatements::new(),
            prune: crate::Prunable::ALL.map(|what| prune_statements(what, backend)),
            insert_job,
            job_by_id,
            job_by_external_id,
            replace_job,
            guarded_job,
            expired_leases,
            insert_runner,
            runner_by_id,
            runner_by_name,
            replace_runner,
            insert_delivery,
            delivery_seen,
        }
    }
}

/// A guarded job change as one UPDATE: the guard in the WHERE clause, each
/// optional assignment behind a 0/1 flag (bound by `bind_guarded`), the new
/// row returned, no row when the guard does not hold.
fn guarded_job() -> String {
    format!(
        "UPDATE jobs SET state = $2, \
         lease_deadline = CASE WHEN $3 = 1 THEN $4 ELSE lease_deadline END, \
         started_at = CASE WHEN $5 = 1 THEN $6 ELSE started_at END, \
         finished_at = CASE WHEN $7 = 1 THEN $8 ELSE finished_at END, \
         conclusion = CASE WHEN $7 = 1 THEN $9 ELSE conclusion END, \
         reason = CASE WHEN $7 = 1 THEN NULL ELSE reason END, \
         version = version + 1 \
         WHERE id = $1 AND state = $10 AND runner_id = $11 \
         AND ($12 = 0 OR (lease_deadline IS NOT NULL AND lease_deadline <= $13)) \
         RETURNING id, {JOB_COLUMNS}"
    )
}

/// Binds a guarded change to [`guarded_job`]'s parameters.
pub(crate) fn bind_guarded<'q, DB>(
    query: sqlx::query::QueryAs<'q, DB, JobRow, <DB as sqlx::Database>::Arguments<'q>>,
    id: JobId,
    change: &'q runway_core::GuardedChange,
) -> sqlx::query::QueryAs<'q, DB, JobRow, <DB as sqlx::Database>::Arguments<'q>>
where
    DB: sqlx::Database,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<i64>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<&'q str>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let set = &change.set;
    let flag = |on: bool| i64::from(on);
    query
        .bind(id.0)
        .bind(set.state.as_str())
        .bind(flag(set.lease_deadline.is_some()))
        .bind(set.lease_deadline.flatten().map(Timestamp::as_millis))
        .bind(flag(set.started_at.is_some()))
        .bind(set.started_at.map(Timestamp::as_millis))
        .bind(flag(set.finished.is_some()))
        .bind(set.finished.map(|(at, _)| at.as_millis()))
        .bind(set.finished.map(|(_, conclusion)| conclusion.as_str()))
        .bind(change.state.as_str())
        .bind(change.runner.0)
        .bind(flag(change.lease_at_most.is_some()))
        .bind(change.lease_at_most.map(Timestamp::as_millis))
}

/// Expands to `impl Store for $store`: the backend-specific methods given in
/// the braces plus the ones whose bodies are the same on both backends. The
/// type provides `reader()` and `writer()` pools and a `statements` field;
/// `$db` is the sqlx database type. (A macro inside an `#[async_trait]` impl
/// would not be rewritten by it, hence the whole impl here.)
macro_rules! impl_store {
    ($store:ty, $db:ty, { $($backend_specific:tt)* }) => {
        #[async_trait]
        impl Store for $store {
        $($backend_specific)*
        async fn check_ready(&self) -> Result<(), StoreError> {
            // `MIGRATOR` is the backend module's own embedded migrations.
            let applied: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM _sqlx_migrations WHERE success")
                .fetch_one(self.reader())
                .await
                .map_err(|e| StoreError::NotReady {
                    target: self.inner.target.clone(),
                    reason: crate::sqlite::describe_sqlx_error(&e),
                })?;
            let expected = MIGRATOR.iter().count() as i64;
            if applied < expected {
                return Err(StoreError::NotReady {
                    target: self.inner.target.clone(),
                    reason: format!("{applied} of {expected} migrations applied"),
                });
            }
            Ok(())
        }

        async fn get_job(&self, id: JobId) -> Result<Option<Job>, StoreError> {
            let row: Option<JobRow> = sqlx::query_as(&self.inner.statements.job_by_id)
                .bind(id.0)
                .fetch_optional(self.reader())
                .await?;
            row.map(Job::try_from).transpose()
        }

        async fn find_job(&self, source: JobSource, external_id: &str) -> Result<Option<Job>, StoreError> {
            let row: Option<JobRow> = sqlx::query_as(&self.inner.statements.job_by_external_id)
                .bind(source.as_str())
                .bind(external_id)
                .fetch_optional(self.reader())
                .await?;
            row.map(Job::try_from).transpose()
        }

        async fn list_jobs(&self, filter: &JobFilter) -> Result<Vec<Job>, StoreError> {
            let mut query = sqlx::QueryBuilder::<$db>::new(format!("SELECT id, {JOB_COLUMNS} FROM jobs WHERE 1 = 1"));
            if let Some(state) = filter.state {
                query.push(" AND state = ").push_bind(state.as_str());
            }
            if let Some(pool) = &filter.pool {
                query.push(" AND pool = ").push_bind(pool.as_str());
            }
            if let Some(before) = filter.before {
                query.push(" AND id < ").push_bind(before.0);
            }
            if filter.newest_first {
                query.push(" ORDER BY id DESC");
            } else {
                query.push(" ORDER BY enqueued_at, id");
            }
            if let Some(limit) = filter.limit {
                query.push(" LIMIT ").push_bind(i64::from(limit));
            }
            let rows: Vec<JobRow> = query.build_query_as().fetch_all(self.reader()).await?;
            rows.into_iter().map(Job::try_from).collect()
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

        async fn jobs_with_expired_leases(&self, now: Timestamp, limit: u32) -> Result<Vec<Job>, StoreError> {
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
            };
            match self.group.submit(op).await? {
                Outcome::Replaced(replaced) => Ok(replaced),
                _ => Err(StoreError::Corrupt("group commit answered a replace with another outcome".into())),
            }
        }

        async fn apply_guarded(&self, id: JobId, change: &runway_core::GuardedChange) -> Result<Option<Job>, StoreError> {
            let op = Op::Guarded { id, change: change.clone() };
            match self.group.submit(op).await? {
                Outcome::Changed(job) => Ok(job.map(|job| *job)),
                _ => Err(StoreError::Corrupt("group commit answered a guarded change with another outcome".into())),
            }
        }

        async fn enqueue_with_delivery(
            &self,
            job: &NewJob,
            delivery: Option<&Delivery>,
            now: Timestamp,
        ) -> Result<(Enqueued, bool), StoreError> {
            let op = Op::Enqueue {
                job: job.clone(),
                delivery: delivery.cloned(),
                now,
            };
            match self.group.submit(op).await? {
                Outcome::Enqueued(enqueued, new_delivery) => Ok((*enqueued, new_delivery)),
                _ => Err(StoreError::Corrupt("group commit answered an enqueue with another outcome".into())),
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
                _ => Err(StoreError::Corrupt("group commit answered a delivery with another outcome".into())),
            }
        }

        async fn claim(&self, claim: &Claim, now: Timestamp) -> Result<Vec<Job>, StoreError> {
            let op = Op::Claim { claim: claim.clone(), now };
            match self.group.submit(op).await? {
                Outcome::Claimed(mut jobs) => {
                    jobs.sort_by_key(|job| (job.enqueued_at, job.id));
                    Ok(jobs)
                }
                _ => Err(StoreError::Corrupt("group commit answered a claim with another outcome".into())),
            }
        }

        async fn create_runner(&self, runner: &NewRunner, now: Timestamp) -> Result<Runner, StoreError> {
            // The id is assigned by the database; the placeholder is ignored.
            let initial = runner.initial(RunnerId(0), now);
            let columns = Columns::from(&initial);
            let row = bind_columns(sqlx::query(&self.inner.statements.insert_runner), &columns)
                .fetch_one(self.writer())
                .await
                .and_then(|row| RunnerRow::from_row(&row));
            match row {
                Ok(row) => Runner::try_from(row),
                Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                    Err(StoreError::DuplicateRunnerName(runner.name.clone()))
                }
                Err(e) => Err(e.into()),
            }
        }

        async fn get_runner(&self, id: RunnerId) -> Result<Option<Runner>, StoreError> {
            let row: Option<RunnerRow> = sqlx::query_as(&self.inner.statements.runner_by_id)
                .bind(id.0)
                .fetch_optional(self.reader())
                .await?;
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
            let mut query =
                sqlx::QueryBuilder::<$db>::new(format!("SELECT id, {RUNNER_COLUMNS} FROM runners WHERE 1 = 1"));
            if let Some(state) = filter.state {
                query.push(" AND state = ").push_bind(state.as_str());
            }
            if let Some(pool) = &filter.pool {
                query.push(" AND pool = ").push_bind(pool.as_str());
            }
            query.push(" ORDER BY id");
            let rows: Vec<RunnerRow> = query.build_query_as().fetch_all(self.reader()).await?;
            rows.into_iter().map(Runner::try_from).collect()
        }

        async fn list_live_runners(&self, pool: Option<&str>) -> Result<Vec<Runner>, StoreError> {
            // The predicate is the index's own, word for word, so both
            // planners use the partial index.
            let mut query = sqlx::QueryBuilder::<$db>::new(format!(
                "SELECT id, {RUNNER_COLUMNS} FROM runners WHERE {LIVE_RUNNER}"
            ));
            if let Some(pool) = pool {
                query.push(" AND pool = ").push_bind(pool);
            }
            query.push(" ORDER BY id");
            let rows: Vec<RunnerRow> = query.build_query_as().fetch_all(self.reader()).await?;
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
            name: &str,
            labels: &[String],
            runner_token_hash: &str,
            now: Timestamp,
        ) -> Result<Runner, StoreError> {
            let sql = &self.inner.statements.runner_api;
            let mut transaction = self.writer().begin().await?;
            let redeemed: Option<(String, Option<i64>)> = sqlx::query_as(&sql.redeem_registration)
                .bind(registration_token_hash)
                .bind(now.as_millis())
                .fetch_optional(&mut *transaction)
                .await?;
            let (pool, bound) = redeemed.ok_or(StoreError::InvalidToken)?;
            let runner = match bound {
                // Minted for a record the reconciler created: adopt it. A
                // record that already failed (boot timeout) admits no one.
                Some(id) => {
                    let row: Option<RunnerRow> = sqlx::query_as(&self.inner.statements.runner_by_id)
                        .bind(id)
                        .fetch_optional(&mut *transaction)
                        .await?;
                    let current = row.map(Runner::try_from).transpose()?.ok_or(StoreError::InvalidToken)?;
                    let next = if matches!(current.state, runway_core::RunnerState::Requested | runway_core::RunnerState::Provisioning) {
                        current.apply(&runway_core::RunnerEvent::Ready, now)?
                    } else {
                        return Err(StoreError::InvalidToken);
                    };
                    let columns = Columns::from(&next);
                    let updated = bind_columns(sqlx::query(&self.inner.statements.replace_runner), &columns)
                        .bind(current.id.0)
                        .bind(current.version)
                        .execute(&mut *transaction)
                        .await?;
                    if updated.rows_affected() != 1 {
                        return Err(StoreError::Contention { what: format!("runner {}", current.id) });
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
                    let row = bind_columns(sqlx::query(&self.inner.statements.insert_runner), &columns)
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
            transaction.commit().await?;
            Ok(runner)
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

        async fn get_setting(&self, key: &str) -> Result<Option<String>, StoreError> {
            let value: Option<String> = sqlx::query_scalar(&self.inner.statements.runner_api.get_setting)
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

        async fn claim_once(&self, key: &str, now: Timestamp, forget_before: Timestamp) -> Result<bool, StoreError> {
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

        async fn forget_once(&self, key: &str) -> Result<(), StoreError> {
            sqlx::query(&self.inner.statements.runner_api.forget_once)
                .bind(key)
                .execute(self.writer())
                .await?;
            Ok(())
        }

        async fn set_runner_external_id(&self, runner: RunnerId, external_id: &str) -> Result<(), StoreError> {
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
            let value: Option<Option<String>> = sqlx::query_scalar(&self.inner.statements.runner_api.get_external_id)
                .bind(runner.0)
                .fetch_optional(self.reader())
                .await?;
            Ok(value.flatten())
        }

        async fn find_runner_by_token(&self, token_hash: &str) -> Result<Option<Runner>, StoreError> {
            let row: Option<RunnerRow> = sqlx::query_as(&self.inner.statements.runner_api.runner_by_token)
                .bind(token_hash)
                .fetch_optional(self.reader())
                .await?;
            row.map(Runner::try_from).transpose()
        }

        async fn heartbeat_replica(&self, replica: &crate::Replica, forget_before: Timestamp) -> Result<(), StoreError> {
            let sql = &self.inner.statements.runner_api;
            sqlx::query(&sql.heartbeat_replica)
                .bind(&replica.id)
                .bind(&replica.address)
                .bind(&replica.version)
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
            let rows: Vec<(String, String, String, i64, i64)> = sqlx::query_as(&self.inner.statements.runner_api.replicas)
                .bind(seen_since.as_millis())
                .fetch_all(self.reader())
                .await?;
            Ok(rows
                .into_iter()
                .map(|(id, address, version, started_at, heartbeat_at)| crate::Replica {
                    id,
                    address,
                    version,
                    started_at: Timestamp::from_millis(started_at),
                    heartbeat_at: Timestamp::from_millis(heartbeat_at),
                })
                .collect())
        }

        async fn begin_term(&self, name: &str, replica: &str, now: Timestamp) -> Result<i64, StoreError> {
            let term: i64 = sqlx::query_scalar(&self.inner.statements.runner_api.begin_term)
                .bind(name)
                .bind(replica)
                .bind(now.as_millis())
                .fetch_one(self.writer())
                .await?;
            Ok(term)
        }

        async fn leader(&self, name: &str) -> Result<Option<crate::LeaderTerm>, StoreError> {
            let row: Option<(String, i64, i64)> = sqlx::query_as(&self.inner.statements.runner_api.leader)
                .bind(name)
                .fetch_optional(self.reader())
                .await?;
            Ok(row.map(|(replica, term, since)| crate::LeaderTerm {
                replica,
                term,
                since: Timestamp::from_millis(since),
            }))
        }

        async fn put_job_log(&self, job: JobId, exit_code: Option<i64>, log: &str) -> Result<(), StoreError> {
            sqlx::query(&self.inner.statements.runner_api.put_log)
                .bind(job.0)
                .bind(exit_code)
                .bind(log)
                .execute(self.writer())
                .await?;
            Ok(())
        }

        async fn get_job_log(&self, job: JobId) -> Result<Option<(Option<i64>, String)>, StoreError> {
            let row: Option<(Option<i64>, String)> = sqlx::query_as(&self.inner.statements.runner_api.get_log)
                .bind(job.0)
                .fetch_optional(self.reader())
                .await?;
            Ok(row)
        }

        async fn add_runner_report(&self, runner: RunnerId, phase: &str, body: &str, now: Timestamp) -> Result<(), StoreError> {
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

        async fn prune(&self, what: crate::Prunable, before: Timestamp, limit: u32) -> Result<u64, StoreError> {
            let statements = &self.inner.statements.prune[what as usize];
            let mut transaction = self.writer().begin().await?;
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

        async fn find_instance_token(&self, token_hash: &str) -> Result<Option<crate::InstanceToken>, StoreError> {
            let row: Option<(i64, i64, Option<String>, Option<i64>)> =
                sqlx::query_as(&self.inner.statements.runner_api.instance_token)
                    .bind(token_hash)
                    .fetch_optional(self.writer())
                    .await?;
            Ok(row.map(|(runner, expires_at, jit_files, fetched)| crate::InstanceToken {
                runner: RunnerId(runner),
                expires_at: Timestamp::from_millis(expires_at),
                jit_files,
                token_fetched: fetched.is_some(),
            }))
        }

        async fn take_instance_registration(&self, token_hash: &str, now: Timestamp) -> Result<bool, StoreError> {
            let done = sqlx::query(&self.inner.statements.runner_api.take_instance_registration)
                .bind(token_hash)
                .bind(now.as_millis())
                .execute(self.writer())
                .await?;
            Ok(done.rows_affected() == 1)
        }

        async fn list_worker_configs(&self) -> Result<Vec<StoredWorkerConfig>, StoreError> {
            let sql = &self.inner.statements.worker_configs;
            let rows: Vec<(String, i64, String, i64)> = sqlx::query_as(&sql.list).fetch_all(self.reader()).await?;
            let pools: Vec<(String, String)> = sqlx::query_as(&sql.all_pools).fetch_all(self.reader()).await?;
            Ok(rows
                .into_iter()
                .map(|(id, version, body, updated_at)| StoredWorkerConfig {
                    pools: pools.iter().filter(|(_, owner)| owner == &id).map(|(pool, _)| pool.clone()).collect(),
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
            let row: Option<(String, i64, String, i64)> =
                sqlx::query_as(&sql.get).bind(id).fetch_optional(&mut *transaction).await?;
            let pools: Vec<String> = sqlx::query_scalar(&sql.pools_of).bind(id).fetch_all(&mut *transaction).await?;
            transaction.commit().await?;
            Ok(row.map(|(id, version, body, updated_at)| StoredWorkerConfig {
                id,
                version,
                body,
                pools,
                updated_at: Timestamp::from_millis(updated_at),
            }))
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
            let mut transaction = self.writer().begin().await?;
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
                        let current: Option<i64> =
                            sqlx::query_scalar(&sql.version).bind(id).fetch_optional(&mut *transaction).await?;
                        return Err(StoreError::VersionConflict {
                            id: id.to_owned(),
                            expected,
                            current,
                        });
                    }
                    updated
                }
            };
            let version = version.ok_or_else(|| StoreError::Corrupt(format!("worker configuration {id} vanished mid-write")))?;
            for pool in pools {
                let owner: Option<String> =
                    sqlx::query_scalar(&sql.pool_owner).bind(pool).fetch_optional(&mut *transaction).await?;
                if let Some(owner) = owner.filter(|owner| owner != id) {
                    return Err(StoreError::PoolTaken { pool: pool.clone(), owner });
                }
            }
            sqlx::query(&sql.delete_pools).bind(id).execute(&mut *transaction).await?;
            for pool in pools {
                let inserted = sqlx::query(&sql.insert_pool).bind(pool).bind(id).execute(&mut *transaction).await;
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

        async fn delete_worker_config(&self, id: &str, expect: Expect) -> Result<bool, StoreError> {
            let sql = &self.inner.statements.worker_configs;
            let mut transaction = self.writer().begin().await?;
            let deleted = match expect {
                Expect::Any => sqlx::query(&sql.delete_any).bind(id).execute(&mut *transaction).await?,
                Expect::Version(expected) => {
                    let deleted = sqlx::query(&sql.delete_if).bind(id).bind(expected).execute(&mut *transaction).await?;
                    if deleted.rows_affected() == 0 {
                        let current: Option<i64> =
                            sqlx::query_scalar(&sql.version).bind(id).fetch_optional(&mut *transaction).await?;
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
            sqlx::query(&sql.delete_pools).bind(id).execute(&mut *transaction).await?;
            transaction.commit().await?;
            Ok(deleted.rows_affected() == 1)
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
            };
            match self.group.submit(op).await? {
                Outcome::Replaced(replaced) => Ok(replaced),
                _ => Err(StoreError::Corrupt("group commit answered a replace with another outcome".into())),
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
    };
}

pub(crate) use impl_store;

/// Expands to the group-commit executor of a backend's inner state: runs a
/// batch of writes in one transaction on the `writer` pool. `$inner` has
/// `writer`, `statements` and `claim` (the backend's claim statement, with
/// parameters pool, runner, lease deadline, limit).
macro_rules! impl_batch_executor {
    ($inner:ty, $connection:ty) => {
        impl $inner {
            /// Records a delivery; false if its id was already recorded.
            async fn insert_delivery(
                &self,
                connection: &mut $connection,
                delivery: &Delivery,
            ) -> Result<bool, StoreError> {
                let result = sqlx::query(&self.statements.insert_delivery)
                    .bind(delivery.id.as_str())
                    .bind(delivery.event.as_str())
                    .bind(delivery.action.as_deref())
                    .bind(delivery.external_id.as_deref())
                    .bind(delivery.outcome.as_str())
                    .bind(delivery.received_at.as_millis())
                    .execute(&mut *connection)
                    .await?;
                Ok(result.rows_affected() == 1)
            }

            /// Inserts a job, or reads the one already stored under its key.
            async fn insert_job(
                &self,
                connection: &mut $connection,
                job: &NewJob,
                now: Timestamp,
            ) -> Result<Enqueued, StoreError> {
                let columns = Columns::from(&job.initial(JobId(0), now));
                let inserted = bind_columns(sqlx::query(&self.statements.insert_job), &columns)
                    .fetch_optional(&mut *connection)
                    .await?
                    .map(|row| JobRow::from_row(&row))
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
        }

        #[async_trait]
        impl BatchExecutor for $inner {
            async fn execute(&self, ops: &[&Op]) -> Result<Vec<Outcome>, StoreError> {
                // A lone write is one statement (an enqueue may add a read):
                // autocommit saves the BEGIN and COMMIT round trips.
                if let [op] = ops {
                    let mut connection = self.writer.acquire().await?;
                    return Ok(vec![self.execute_one(&mut connection, op).await?]);
                }
                let mut transaction = self.writer.begin().await?;
                let mut outcomes = Vec::with_capacity(ops.len());
                for op in ops {
                    outcomes.push(self.execute_one(&mut transaction, op).await?);
                }
                transaction.commit().await?;
                Ok(outcomes)
            }
        }

        impl $inner {
            async fn execute_one(
                &self,
                connection: &mut $connection,
                op: &Op,
            ) -> Result<Outcome, StoreError> {
                let transaction = connection;
                Ok(match op {
                    Op::Enqueue { job, delivery, now } => {
                        let new_delivery = match delivery {
                            Some(delivery) => {
                                self.insert_delivery(&mut *transaction, delivery).await?
                            }
                            None => false,
                        };
                        let enqueued = self.insert_job(&mut *transaction, job, *now).await?;
                        Outcome::Enqueued(Box::new(enqueued), new_delivery)
                    }
                    Op::RecordDelivery { delivery } => {
                        Outcome::Recorded(self.insert_delivery(&mut *transaction, delivery).await?)
                    }
                    Op::Replace { id, version, next } => {
                        let result = bind_columns(sqlx::query(&self.statements.replace_job), next)
                            .bind(id.0)
                            .bind(*version)
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
                    } => {
                        // A savepoint inside a shared transaction, a
                        // transaction of its own otherwise: either way both
                        // rows change or neither does.
                        let mut both = sqlx::Connection::begin(&mut *transaction).await?;
                        let job = bind_columns(sqlx::query(&self.statements.replace_job), next)
                            .bind(id.0)
                            .bind(*version)
                            .execute(&mut *both)
                            .await?;
                        let replaced = job.rows_affected() == 1 && {
                            let runner = bind_columns(
                                sqlx::query(&self.statements.replace_runner),
                                runner_next,
                            )
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
                    Op::Guarded { id, change } => {
                        let row: Option<JobRow> = crate::common::bind_guarded(
                            sqlx::query_as(&self.statements.guarded_job),
                            *id,
                            change,
                        )
                        .fetch_optional(&mut *transaction)
                        .await?;
                        Outcome::Changed(row.map(Job::try_from).transpose()?.map(Box::new))
                    }
                    Op::Claim { claim, now } => {
                        let rows: Vec<JobRow> = sqlx::query_as(&self.claim)
                            .bind(claim.pool.as_str())
                            .bind(claim.runner.0)
                            .bind(now.plus(claim.lease).as_millis())
                            .bind(i64::from(claim.limit))
                            .bind(claim.runner_labels.as_ref().map(|labels| {
                                let lower: Vec<String> =
                                    labels.iter().map(|l| l.to_lowercase()).collect();
                                crate::rows::json_list(&lower)
                            }))
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
    };
}

pub(crate) use impl_batch_executor;
