//! The statements both backends share. The SQL is written
//! once with `$n` placeholders: PostgreSQL's own, and sqlx's SQLite driver
//! binds a `$n` parameter to argument `n` just as it does `?n` (sqlx-sqlite
//! `arguments.rs`), so the same text runs on both, unrewritten.

use crate::rows::{assignments, column_count, placeholders, Bind, JOB_COLUMNS, RUNNER_COLUMNS};
use crate::CRASH_KEY;
use runway_core::{JobId, Timestamp};

/// A runner row that is live: the `runners_live` index's predicate
/// (migration 0009), kept identical so the index serves the query.
pub const LIVE_RUNNER: &str = "state NOT IN ('terminated', 'failed', 'crashed')";

/// A live job (queued, provisioning or running): what status pages count.
pub const LIVE_JOB: &str = "state IN ('queued', 'provisioning', 'running')";

/// A finished job: the predicate of the `jobs_finished` index (migration
/// 0011), kept identical so the index serves the pruner.
pub const FINISHED_JOB: &str = "state IN ('completed', 'failed', 'cancelled', 'unroutable')";

/// Each job started at or after `$1` with its pool and queue time
/// (`started_at - enqueued_at`), newest first, at most `$2`. It reads the
/// window, not the history, without an index of every job's start (which
/// each start and completion would write): a job started since the cutoff
/// is either live (the live jobs, few) or finished since the cutoff, as it
/// finished after it started (a range of `jobs_finished`). On SQLite the
/// finished part names its index: without statistics its planner prefers
/// the state index, which holds every finished job.
pub fn queue_times(backend: crate::Backend) -> String {
    let finished_index = match backend {
        crate::Backend::Sqlite => " INDEXED BY jobs_finished",
        crate::Backend::Postgres => "",
    };
    format!(
        "SELECT pool, started_at - enqueued_at FROM ( \
         SELECT pool, started_at, enqueued_at FROM jobs WHERE {LIVE_JOB} AND started_at >= $1 \
         UNION ALL \
         SELECT pool, started_at, enqueued_at FROM jobs{finished_index} \
         WHERE {FINISHED_JOB} AND finished_at >= $1 AND started_at >= $1) AS window_jobs \
         WHERE pool IS NOT NULL ORDER BY started_at DESC LIMIT $2"
    )
}

/// An ended runner whose registration at its job source was not let go:
/// the predicate of the `runners_registered_ended` index.
pub const REGISTERED_ENDED_RUNNER: &str =
    "external_id <> '' AND state IN ('terminated', 'failed', 'crashed')";

/// An ended runner: the predicate of the `runners_ended` index.
const ENDED_RUNNER: &str = "state IN ('terminated', 'failed', 'crashed')";

/// Deletes up to `$2` rows of `table` whose `at` is before `$1`, oldest
/// first by `order` (the order its index keeps), by their `key`.
fn oldest(table: &str, key: &str, at: &str, order: &str) -> String {
    format!(
        "DELETE FROM {table} WHERE {key} IN \
         (SELECT {key} FROM {table} WHERE {at} < $1 ORDER BY {order} LIMIT $2)"
    )
}

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
        P::Deliveries => vec![oldest(
            "deliveries",
            "delivery_id",
            "received_at",
            "received_at",
        )],
        // The logs still kept: the job_logs table is what retention keeps
        // small, so reading it is bounded.
        P::JobLogs => vec![format!(
            "DELETE FROM job_logs WHERE job_id IN (SELECT l.job_id FROM job_logs l \
             JOIN jobs j ON j.id = l.job_id WHERE j.{FINISHED_JOB} AND j.finished_at < $1 LIMIT $2)"
        )],
        P::RunnerReports => vec![oldest(
            "runner_reports",
            "id",
            "reported_at",
            "reported_at, id",
        )],
        P::OnceKeys => vec![oldest("once_keys", "key", "done_at", "done_at")],
        P::Audit => vec![oldest("audit", "id", "at", "at, id")],
        P::PoolHistory => {
            // An hour's rollup goes once every minute of it is past; the
            // minutes go last, and their count is the one returned.
            let hours =
                "SELECT pool, at FROM pool_hours WHERE at <= $1 - 3600000 ORDER BY at LIMIT $2";
            let minutes = "SELECT pool, at FROM pool_samples WHERE at < $1 ORDER BY at LIMIT $2";
            vec![
                format!("DELETE FROM pool_wait_hours WHERE (pool, at) IN ({hours})"),
                format!("DELETE FROM pool_hours WHERE (pool, at) IN ({hours})"),
                format!("DELETE FROM pool_waits WHERE (pool, at) IN ({minutes})"),
                format!("DELETE FROM pool_samples WHERE (pool, at) IN ({minutes})"),
            ]
        }
        P::InstanceTokens => vec![oldest(
            "instance_tokens",
            "token_hash",
            "expires_at",
            "expires_at",
        )],
    }
}

/// A dialect's claim that starts its job at once.
pub enum ClaimStartSql {
    /// The job and its runner in one statement
    /// ([`claim_start_postgres`]'s parameters).
    OneStatement(String),
    /// Statements sent as one script (one hop to the connection's thread:
    /// SQLite, where a statement costs no round trip to a server, only
    /// that hop) that answer as [`ClaimStartSql::OneStatement`] does, with
    /// the same parameters; `complete_next` the completion that starts the
    /// runner's next job as a script too (`sqlite::complete_next_script`), with
    /// its log and without.
    Script {
        script: String,
        complete_next: (String, String),
    },
}

impl ClaimStartSql {
    /// `sqlite::complete_next_script` with a log or without, where the dialect
    /// has it.
    pub fn complete_next_script(&self, with_log: bool) -> Option<&str> {
        match self {
            ClaimStartSql::Script { complete_next, .. } => Some(match with_log {
                true => &complete_next.0,
                false => &complete_next.1,
            }),
            ClaimStartSql::OneStatement(_) => None,
        }
    }
}

/// Which form of a claim's statement serves a claim: whether it carries
/// runner labels (`$5` not NULL), a cap on a share key's running jobs
/// (`$7` not NULL), and a limit of one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimForm {
    pub labelled: bool,
    pub capped: bool,
    pub one: bool,
}

impl ClaimForm {
    /// The form that serves `claim`.
    pub fn of(claim: &crate::Claim) -> ClaimForm {
        ClaimForm {
            labelled: claim.runner_labels.is_some(),
            capped: claim.max_running_per_key.is_some(),
            one: claim.limit == 1,
        }
    }

    fn index(self) -> usize {
        usize::from(self.labelled) | usize::from(self.capped) << 1 | usize::from(self.one) << 2
    }

    fn from_index(index: usize) -> ClaimForm {
        ClaimForm {
            labelled: index & 1 != 0,
            capped: index & 2 != 0,
            one: index & 4 != 0,
        }
    }
}

/// A claim's statement in each of its forms ([`ClaimForm`]). PostgreSQL
/// plans a prepared statement with its arguments five times, then keeps a
/// generic plan only if that does not look dearer. A generic plan cannot
/// fold `$5 IS NULL OR …` (a runner without labels) or the cap's subquery
/// (costed for every row it might read) away, and it costs `LIMIT $4` as a
/// tenth of the rows; so one statement for every claim looked dearer than
/// its custom plans and was planned again at each execution (0.1–0.3 ms of
/// a claim). Each form says only what its claims need, so its generic plan
/// costs what its custom ones do and is kept.
pub(crate) struct ClaimForms<T>([T; 8]);

impl<T> ClaimForms<T> {
    /// Every form, from the dialect's `form`.
    pub fn new(form: impl Fn(ClaimForm) -> T) -> ClaimForms<T> {
        ClaimForms(std::array::from_fn(|index| {
            form(ClaimForm::from_index(index))
        }))
    }

    /// The form for `claim`.
    pub fn of(&self, claim: &crate::Claim) -> &T {
        &self.0[ClaimForm::of(claim).index()]
    }
}

/// What each dialect writes its own way (the SQL dialect's
/// statements), handed to [`Statements::new`].
pub(crate) struct DialectSql {
    pub backend: crate::Backend,
    pub claim: ClaimForms<String>,
    pub claim_start: ClaimForms<ClaimStartSql>,
    pub guarded_pair: String,
    pub complete_next: Option<String>,
    pub enqueue_delivery: Option<String>,
}

pub(crate) struct Statements {
    /// The dialect's claim (the dialect\'s `claim_statement`).
    pub claim: ClaimForms<String>,
    /// the dialect\'s `claim_start_statement`.
    pub claim_start: ClaimForms<ClaimStartSql>,
    /// the dialect\'s `guarded_pair_statement`.
    pub guarded_pair: String,
    /// the dialect\'s `complete_next_statement`.
    pub complete_next: Option<String>,
    /// the dialect\'s `enqueue_delivery_statement`.
    pub enqueue_delivery: Option<String>,
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
    pub prune: [Vec<String>; 9],
    /// [`queue_times`] for the dialect.
    pub queue_times: String,
}

pub(crate) struct RunnerApiStatements {
    pub insert_registration: String,
    pub redeem_registration: String,
    pub registered_by: String,
    pub repeat_registration: String,
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
    pub unfinished_reports: String,
    pub insert_instance_token: String,
    pub instance_token: String,
    pub take_instance_registration: String,
    pub arm_instance_tokens: String,
    pub heartbeat_replica: String,
    pub forget_replicas: String,
    pub replicas: String,
    pub begin_term: String,
    pub leader: String,
    pub end_term: String,
}

impl RunnerApiStatements {
    fn new() -> RunnerApiStatements {
        RunnerApiStatements {
            insert_registration: "INSERT INTO registration_tokens (token_hash, pool, created_at, expires_at, runner_id) VALUES ($1, $2, $3, $4, $5)".into(),
            redeem_registration: "UPDATE registration_tokens SET used_at = $2, attempt_hash = $3 \
                 WHERE token_hash = $1 AND used_at IS NULL AND expires_at > $2 RETURNING pool, runner_id"
                    .into(),
            registered_by: "UPDATE registration_tokens SET used_by = $2 WHERE token_hash = $1".into(),
            repeat_registration: "SELECT used_by FROM registration_tokens \
                 WHERE token_hash = $1 AND used_at IS NOT NULL AND expires_at > $2 \
                 AND attempt_hash = $3 AND used_by IS NOT NULL"
                .into(),
            set_runner_token: "UPDATE runners SET token_hash = $2, version = version + 1 WHERE id = $1"
                .into(),
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
            put_log: format!("INSERT INTO job_logs (job_id, exit_code, log) VALUES ($1, $2, $3) {LOG_UPSERT}"),
            get_log: "SELECT exit_code, log FROM job_logs WHERE job_id = $1".into(),
            add_report: "INSERT INTO runner_reports (runner_id, phase, body, reported_at) VALUES ($1, $2, $3, $4)".into(),
            reports: "SELECT phase, body FROM runner_reports WHERE runner_id = $1 ORDER BY id".into(),
            // A range of the reported_at index, each row checked through the
            // runner index and the once-keys' key: the reports of a window,
            // never the whole history.
            unfinished_reports: format!(
                "SELECT r.runner_id, r.reported_at, r.body FROM runner_reports r \
                 WHERE r.reported_at >= $1 AND r.reported_at < $2 AND r.phase = 'pre-job' \
                 AND NOT EXISTS (SELECT 1 FROM runner_reports p WHERE p.runner_id = r.runner_id AND p.phase = 'post-job') \
                 AND NOT EXISTS (SELECT 1 FROM once_keys o WHERE o.key = '{CRASH_KEY}' || r.runner_id) \
                 ORDER BY r.reported_at, r.id LIMIT $3"
            ),
            insert_instance_token: "INSERT INTO instance_tokens (token_hash, runner_id, expires_at, jit_files) VALUES ($1, $2, $3, $4)".into(),
            instance_token: "SELECT runner_id, expires_at, jit_files, token_fetched_at FROM instance_tokens WHERE token_hash = $1".into(),
            take_instance_registration: "UPDATE instance_tokens SET token_fetched_at = $2 WHERE token_hash = $1 AND token_fetched_at IS NULL".into(),
            arm_instance_tokens: "UPDATE instance_tokens SET expires_at = $2, jit_files = $3 WHERE runner_id = $1 AND token_fetched_at IS NULL".into(),
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
            end_term: "UPDATE leader_terms SET replica = '' WHERE name = $1 AND term = $2".into(),
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

/// A job's insert, answering its row (none when `(source, external_id)`
/// is stored already). On SQLite the row's fair-share tag is computed in
/// the insert, from the same four lookups the tag trigger makes (sqlite
/// migration 0017): the trigger's UPDATE wrote each row twice (migration
/// 0020 leaves it the rows inserted at the default tag 0). PostgreSQL's
/// trigger runs before the insert and writes the row once.
fn insert_job_statement(backend: crate::Backend) -> String {
    let job_count = column_count(JOB_COLUMNS);
    let values = placeholders(1, job_count);
    match backend {
        crate::Backend::Postgres => format!(
            "INSERT INTO jobs ({JOB_COLUMNS}) VALUES ({values}) \
             ON CONFLICT (source, external_id) DO NOTHING RETURNING id, {JOB_COLUMNS}"
        ),
        crate::Backend::Sqlite => {
            let at = |column: &str| {
                JOB_COLUMNS
                    .split(',')
                    .position(|c| c.trim() == column)
                    .map_or(0, |i| i + 1)
            };
            let (pool, state, key, weight) =
                (at("pool"), at("state"), at("share_key"), at("share_weight"));
            format!(
                "INSERT INTO jobs ({JOB_COLUMNS}, share_tag) VALUES ({values}, \
                 CASE WHEN ${state} = 'queued' THEN max( \
                   coalesce((SELECT share_tag FROM jobs WHERE pool = ${pool} AND state = 'provisioning' \
                             ORDER BY share_tag DESC LIMIT 1), 0), \
                   coalesce((SELECT share_tag FROM jobs WHERE pool = ${pool} AND state = 'running' \
                             ORDER BY share_tag DESC LIMIT 1), 0), \
                   coalesce((SELECT share_tag FROM jobs WHERE pool = ${pool} AND state = 'queued' \
                             ORDER BY share_tag LIMIT 1), 0), \
                   coalesce((SELECT share_tag FROM jobs WHERE pool = ${pool} AND share_key = ${key} \
                             AND state = 'queued' ORDER BY share_tag DESC LIMIT 1) \
                            + 1000.0 / max(${weight}, 1), 0)) \
                 ELSE 0 END) \
                 ON CONFLICT (source, external_id) DO NOTHING RETURNING id, {JOB_COLUMNS}"
            )
        }
    }
}

impl Statements {
    pub fn new(dialect: DialectSql) -> Statements {
        let job_count = column_count(JOB_COLUMNS);
        let runner_count = column_count(RUNNER_COLUMNS);
        let select_job = format!("SELECT id, {JOB_COLUMNS} FROM jobs");
        let select_runner = format!("SELECT id, {RUNNER_COLUMNS} FROM runners");
        let statements = [
            insert_job_statement(dialect.backend),
            format!("{select_job} WHERE id = $1"),
            format!("{select_job} WHERE source = $1 AND external_id = $2"),
            // The history line (`rows::history_line`) is the last argument.
            format!(
                "UPDATE jobs SET {}, history = history || ${} WHERE id = ${} AND version = ${}",
                assignments(JOB_COLUMNS, 1),
                job_count + 3,
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
            prune: crate::Prunable::ALL.map(|what| prune_statements(what, dialect.backend)),
            queue_times: queue_times(dialect.backend),
            claim: dialect.claim,
            claim_start: dialect.claim_start,
            guarded_pair: dialect.guarded_pair,
            complete_next: dialect.complete_next,
            enqueue_delivery: dialect.enqueue_delivery,
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
    format!("UPDATE jobs SET {GUARDED_SET} WHERE id = $1 AND {GUARD} RETURNING id, {JOB_COLUMNS}")
}

/// What a guarded change writes (parameters `$2`–`$9` and `$14`).
pub(crate) const GUARDED_SET: &str = "state = $2, \
     lease_deadline = CASE WHEN $3 = 1 THEN $4 ELSE jobs.lease_deadline END, \
     started_at = CASE WHEN $5 = 1 THEN $6 ELSE jobs.started_at END, \
     finished_at = CASE WHEN $7 = 1 THEN $8 ELSE jobs.finished_at END, \
     conclusion = CASE WHEN $7 = 1 THEN $9 ELSE jobs.conclusion END, \
     reason = CASE WHEN $7 = 1 THEN NULL ELSE jobs.reason END, \
     history = jobs.history || $14, \
     version = jobs.version + 1";

/// A guarded change's guard (parameters `$10`–`$13`).
pub(crate) const GUARD: &str = "state = $10 AND runner_id = $11 \
     AND ($12 = 0 OR (lease_deadline IS NOT NULL AND lease_deadline <= $13))";

/// A job's log written where it has one already: replaced.
pub(crate) const LOG_UPSERT: &str =
    "ON CONFLICT (job_id) DO UPDATE SET exit_code = excluded.exit_code, log = excluded.log";

/// `col = $k, …` over a runner's columns from `$first`, except that the
/// job is `job` when the bound value is NULL: the job a statement picks
/// itself (a claim that starts at once).
pub(crate) fn runner_assignments_with_job(first: usize, job: &str) -> String {
    RUNNER_COLUMNS
        .split(',')
        .map(str::trim)
        .enumerate()
        .map(|(i, column)| match column {
            "job_id" => format!("job_id = COALESCE(${}, {job})", first + i),
            _ => format!("{column} = ${}", first + i),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// PostgreSQL: a guarded job change, its runner's compare-and-set and the
/// job's log, in one statement that writes all or nothing. Parameters:
/// [`guarded_job`]'s `$1`–`$14`, then the runner's id (`$15`), the version
/// it must still have (`$16`), its next columns (`$17`…), then whether to
/// write a log (`1`/`0`), its exit code and its text. Rows are locked job
/// first (`lj`), then runner, as every writer of both does; the runner's
/// compare-and-set is its UPDATE (which locks it, and re-checks the
/// version after waiting for another writer), and the job and log are
/// written from the runner's updated row, so nothing is written unless both
/// rows were as expected. Returns the job.
pub(crate) fn guarded_pair_postgres() -> String {
    let runner_first = 17;
    let log = runner_first + column_count(RUNNER_COLUMNS);
    format!(
        "WITH lj AS (SELECT id FROM jobs WHERE id = $1 AND {GUARD} FOR UPDATE), \
         u AS (UPDATE runners SET {runner} FROM lj WHERE runners.id = $15 AND runners.version = $16 \
               RETURNING runners.id), \
         j AS (UPDATE jobs SET {GUARDED_SET} FROM u WHERE jobs.id = $1 RETURNING jobs.id, {job_columns}), \
         l AS (INSERT INTO job_logs (job_id, exit_code, log) SELECT lj.id, ${exit}, ${text} FROM lj, u \
               WHERE ${flag} = 1 {LOG_UPSERT}) \
         SELECT * FROM j",
        job_columns = qualified("jobs", JOB_COLUMNS),
        runner = assignments(RUNNER_COLUMNS, runner_first),
        flag = log,
        exit = log + 1,
        text = log + 2,
    )
}

/// PostgreSQL: a job and its webhook delivery in one statement (two
/// inserting CTEs, each skipping a row already stored; one commit).
/// Parameters: the job's columns (`$1`…), then the delivery's six. One
/// row: `new_delivery` (1 when the delivery was new) and the job's
/// columns, NULL when the job was stored already.
pub(crate) fn enqueue_delivery_postgres() -> String {
    let count = column_count(JOB_COLUMNS);
    let delivery = count + 1;
    format!(
        "WITH d AS (INSERT INTO deliveries (delivery_id, event, action, external_id, outcome, received_at) \
                VALUES (${delivery}, ${}, ${}, ${}, ${}, ${}) ON CONFLICT (delivery_id) DO NOTHING RETURNING 1), \
         j AS (INSERT INTO jobs ({JOB_COLUMNS}) VALUES ({}) \
               ON CONFLICT (source, external_id) DO NOTHING RETURNING id, {JOB_COLUMNS}) \
         SELECT (SELECT count(*) FROM d) AS new_delivery, j.* FROM (SELECT 1) AS one LEFT JOIN j ON true",
        delivery + 1,
        delivery + 2,
        delivery + 3,
        delivery + 4,
        delivery + 5,
        crate::rows::placeholders(1, count)
    )
}

/// PostgreSQL: [`guarded_pair_postgres`] (`$1`–`$35`, the runner's row
/// after the completion from `$17`), then, if both locks held, the oldest
/// queued job the runner may take started on it, in one statement. The
/// claim's parameters: pool (`$36`), the lease's end (`$37`), the runner's
/// labels (`$38`, JSON or NULL), both history lines (`$39`), the start time
/// (`$40`), the cap on a share key's running jobs (`$41`, NULL for none),
/// and the runner's busy row (`$42`…, its job NULL: the claimed
/// one is written). The runner gets its busy row if a job was found, else
/// its row after the completion. Locks: the ended job, the runner, then
/// the next job with `SKIP LOCKED` (never waits). The next job is claimed
/// and started by `runway_start_next` (migration 0019), a statement of its
/// own: its re-check of a row another claimer changed sets up only itself,
/// not every part of this statement. It runs only if both locks held (it
/// is joined to the runner's lock), and nothing else here writes the job
/// it starts. Returns the ended job (`part` 0) and the started one (`part`
/// 1).
pub(crate) fn complete_next_postgres() -> String {
    let idle_first = 17;
    let count = column_count(RUNNER_COLUMNS);
    let log = idle_first + count;
    // After the log's three parameters and the claim's six.
    let busy_first = log + 9;
    let runner = RUNNER_COLUMNS
        .split(',')
        .map(str::trim)
        .enumerate()
        .map(|(i, column)| {
            let busy = match column {
                "job_id" => "next.id".to_owned(),
                _ => format!("${}", busy_first + i),
            };
            format!(
                "{column} = CASE WHEN next.id IS NULL THEN ${} ELSE {busy} END",
                idle_first + i
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "WITH lj AS (SELECT id FROM jobs WHERE id = $1 AND {GUARD} FOR UPDATE), \
         lr AS (SELECT runners.id FROM runners, lj WHERE runners.id = $15 AND runners.version = $16 \
                FOR UPDATE OF runners), \
         next AS (SELECT started.* FROM lr, \
                  runway_start_next(${pool}, lr.id, ${labels}, ${lease}, ${started}, ${steps}, \
                                    ${cap}::bigint) AS started), \
         j AS (UPDATE jobs SET {GUARDED_SET} FROM lr WHERE jobs.id = $1 RETURNING jobs.id, {job_columns}), \
         lg AS (INSERT INTO job_logs (job_id, exit_code, log) SELECT lj.id, ${exit}, ${text} FROM lj, lr \
                WHERE ${flag} = 1 {LOG_UPSERT}), \
         u AS (UPDATE runners SET {runner} FROM lr LEFT JOIN next ON true \
               WHERE runners.id = lr.id RETURNING runners.id) \
         SELECT 0::bigint AS part, j.* FROM j UNION ALL SELECT 1::bigint AS part, next.id, {next_columns} FROM next",
        job_columns = qualified("jobs", JOB_COLUMNS),
        next_columns = qualified("next", JOB_COLUMNS),
        flag = log,
        exit = log + 1,
        text = log + 2,
        pool = log + 3,
        lease = log + 4,
        labels = log + 5,
        steps = log + 6,
        started = log + 7,
        cap = log + 8,
    )
}

/// PostgreSQL: a claim that starts the job at once, in one statement. The
/// claim's parameters (`$1`–`$7`, the dialect\'s `claim_statement`;
/// `$6` holds both history lines), then the start time (`$8`), the version
/// the runner must still have (`$9`) and its next columns (`$10`…, the job
/// NULL: the claimed one is written). Job first, then runner, as every
/// writer of both locks them. Returns one row: the started job's columns,
/// all NULL when no job is queued for the runner or the runner changed,
/// and `runner_version`, the runner's version as the statement found it
/// (NULL if there is no such runner), so a claim that started nothing
/// tells those two apart without another read.
pub(crate) fn claim_start_postgres(next_job: &str) -> String {
    format!(
        "WITH next AS ({next_job}), \
         lr AS (SELECT runners.id FROM runners, next WHERE runners.id = $2 AND runners.version = $9 \
                FOR UPDATE OF runners), \
         j AS (UPDATE jobs SET state = 'running', runner_id = $2, lease_deadline = $3, started_at = $8, \
               history = jobs.history || $6, version = jobs.version + 2 \
               FROM next, lr WHERE jobs.id = next.id RETURNING jobs.id, {job_columns}), \
         u AS (UPDATE runners SET {runner} FROM lr, next WHERE runners.id = lr.id RETURNING runners.id) \
         SELECT j.*, (SELECT runners.version FROM runners WHERE runners.id = $2) AS runner_version \
         FROM (SELECT 1) AS one LEFT JOIN j ON true",
        job_columns = qualified("jobs", JOB_COLUMNS),
        runner = runner_assignments_with_job(10, "next.id"),
    )
}

/// `table.col, …` for each of `columns`.
pub(crate) fn qualified(table: &str, columns: &str) -> String {
    columns
        .split(',')
        .map(|column| format!("{table}.{}", column.trim()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Binds a claim's parameters `$1`–`$7` (see
/// the dialect\'s `claim_statement`): its pool, its runner, the
/// lease's end, at most `limit` jobs, the runner's labels, the history,
/// the cap on a share key's running jobs.
pub(crate) fn bind_claim<'q, DB, Q>(
    query: Q,
    claim: &'q crate::Claim,
    (limit, lease_deadline): (i64, i64),
    labels: Option<&'q str>,
    history: &'q str,
) -> Q
where
    DB: sqlx::Database,
    Q: Bind<'q, DB>,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<&'q str>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<i64>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    query
        .with(claim.pool.as_str())
        .with(claim.runner.0)
        .with(lease_deadline)
        .with(limit)
        .with(labels)
        .with(history)
        .with(claim.max_running_per_key.map(i64::from))
}

/// Binds a guarded change to [`guarded_job`]'s parameters.
pub(crate) fn bind_guarded<'q, DB, Q>(
    query: Q,
    id: JobId,
    change: &'q runway_core::GuardedChange,
    history: &'q str,
) -> Q
where
    DB: sqlx::Database,
    Q: Bind<'q, DB>,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<i64>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    Option<&'q str>: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let set = &change.set;
    let flag = |on: bool| i64::from(on);
    query
        .with(id.0)
        .with(set.state.as_str())
        .with(flag(set.lease_deadline.is_some()))
        .with(set.lease_deadline.flatten().map(Timestamp::as_millis))
        .with(flag(set.started_at.is_some()))
        .with(set.started_at.map(Timestamp::as_millis))
        .with(flag(set.finished.is_some()))
        .with(set.finished.map(|(at, _)| at.as_millis()))
        .with(set.finished.map(|(_, conclusion)| conclusion.as_str()))
        .with(change.state.as_str())
        .with(change.runner.0)
        .with(flag(change.lease_at_most.is_some()))
        .with(change.lease_at_most.map(Timestamp::as_millis))
        .with(history)
}
