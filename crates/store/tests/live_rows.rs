//! What runs every round or request reads live rows only, and the pruner
//! reads what it deletes: SQLite's planner answers each query from the
//! partial index made for it, so its cost follows live work however long
//! the history grows. (The predicates are the store's own `LIVE_RUNNER`,
//! `LIVE_JOB` and `FINISHED_JOB`; the indexes must match them.) On
//! PostgreSQL, whose generic plans do not see a statement's arguments, no
//! index on `jobs` may be keyed by state for every job: the hot path's
//! guarded changes (`id = $1 AND state = $10 …`) must find their job by id.

use crate::common;

use runway_store::{
    queue_times, Backend, ClaimForm, Dialect, PostgresDialect, SqliteStore, Store, FINISHED_JOB,
    LIVE_JOB, LIVE_RUNNER, REGISTERED_ENDED_RUNNER,
};
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::SqlitePoolOptions;

/// SQLite's query plan for each of `queries`, on a freshly migrated store.
async fn plans(queries: &[String]) -> Vec<Vec<String>> {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("runway.db").display());
    let store = SqliteStore::open(&url).await.expect("open");
    store.check_ready().await.expect("migrated");
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("connect");
    let mut plans = Vec::new();
    for query in queries {
        let plan: Vec<(i64, i64, i64, String)> =
            sqlx::query_as(&format!("EXPLAIN QUERY PLAN {query}"))
                .fetch_all(&pool)
                .await
                .expect("plan");
        plans.push(plan.into_iter().map(|row| row.3).collect());
    }
    plans
}

/// Whether SQLite's plan `details` scan `table` itself (no USING: every
/// row, the whole history), rather than search or scan an index of it.
fn scans_the_table(details: &[String], table: &str) -> bool {
    details
        .iter()
        .any(|d| d.starts_with(&format!("SCAN {table}")) && !d.contains("USING"))
}

#[tokio::test]
async fn ended_runners_still_registered_are_read_through_their_partial_index() {
    let query =
        format!("SELECT id FROM runners WHERE {REGISTERED_ENDED_RUNNER} ORDER BY id LIMIT 20");
    let details = plans(&[query]).await.remove(0);
    assert!(
        details
            .iter()
            .any(|d| d.contains("runners_registered_ended")),
        "{details:?}"
    );
    assert!(!scans_the_table(&details, "runners"), "{details:?}");
}

#[tokio::test]
async fn the_live_runner_query_is_served_by_the_partial_index() {
    let filters = ["", " AND pool = 'p'", "the gauges' counts"];
    let mut queries: Vec<String> = filters[..2]
        .iter()
        .map(|f| format!("SELECT id FROM runners WHERE {LIVE_RUNNER}{f} ORDER BY id"))
        .collect();
    queries.push(format!(
        "SELECT pool, provider, state FROM runners WHERE {LIVE_RUNNER} ORDER BY id"
    ));
    for (pool_filter, details) in filters.iter().zip(plans(&queries).await) {
        assert!(
            details.iter().any(|d| d.contains("runners_live")),
            "{pool_filter:?}: {details:?}"
        );
        assert!(
            // Scanning the partial index reads live rows only.
            !scans_the_table(&details, "runners"),
            "{pool_filter:?}: a full scan: {details:?}"
        );
    }
}

/// The pruner finds old finished jobs through the `jobs_finished` partial
/// index, oldest first (its SQLite statement names the index; this checks
/// the index serves the predicate, or SQLite would refuse the statement):
/// a batch reads what it deletes, not the history or the live queue.
#[tokio::test]
async fn the_pruner_reads_finished_jobs_through_their_index() {
    let query = format!(
        "SELECT id FROM jobs INDEXED BY jobs_finished WHERE {FINISHED_JOB} AND finished_at < 1 ORDER BY finished_at, id LIMIT 10"
    );
    let details = plans(&[query]).await.remove(0);
    assert!(
        details.iter().any(|d| d.contains("jobs_finished")),
        "{details:?}"
    );
    assert!(
        !details.iter().any(|d| d.contains("TEMP B-TREE")),
        "no sort of the whole set: {details:?}"
    );
}

/// Status pages count live jobs through the state index, never every job.
#[tokio::test]
async fn live_job_counts_read_only_live_states() {
    let query =
        format!("SELECT pool, state, COUNT(*) FROM jobs WHERE {LIVE_JOB} GROUP BY pool, state");
    let details = plans(&[query]).await.remove(0);
    assert!(
        details
            .iter()
            .any(|d| d.starts_with("SEARCH jobs USING") && d.contains("state=?")),
        "{details:?}"
    );
}

/// The console's queue times read the last hour's started jobs without
/// an index of every job's start: the live jobs through the state index,
/// and the finished ones through a range of `jobs_finished`, never the
/// whole history.
#[tokio::test]
async fn queue_times_read_live_jobs_and_the_window_of_finished_ones() {
    let query = queue_times(Backend::Sqlite)
        .replace("$1", "0")
        .replace("$2", "10");
    let details = plans(&[query]).await.remove(0);
    assert!(
        details
            .iter()
            .any(|d| d.contains("jobs_finished") && d.contains("finished_at>?")),
        "{details:?}"
    );
    assert!(
        details
            .iter()
            .any(|d| d.starts_with("SEARCH jobs USING") && d.contains("state=?")),
        "{details:?}"
    );
    assert!(
        !scans_the_table(&details, "jobs"),
        "a full scan: {details:?}"
    );
}

/// The predictive forecasts read each round the jobs new since the last
/// (`JobFilter::after`, newest first): a range of the id key, whatever
/// the history below it, with or without a pool.
#[tokio::test]
async fn jobs_new_since_a_listing_are_a_range_of_the_id_key() {
    let filters = ["", " AND pool = 'p'"];
    let queries: Vec<String> = filters
        .iter()
        .map(|f| format!("SELECT id FROM jobs WHERE 1 = 1{f} AND id > 5 ORDER BY id DESC LIMIT 10"))
        .collect();
    for (pool_filter, details) in filters.iter().zip(plans(&queries).await) {
        assert!(
            details
                .iter()
                .any(|d| d.starts_with("SEARCH jobs USING INTEGER PRIMARY KEY")),
            "{pool_filter:?}: {details:?}"
        );
        assert!(
            !details.iter().any(|d| d.contains("TEMP B-TREE")),
            "{pool_filter:?}: no sort: {details:?}"
        );
    }
}

/// A connection pool to the PostgreSQL harness's schema.
async fn postgres_schema(harness: &common::Harness) -> sqlx::PgPool {
    let schema = harness.postgres_schema().expect("a PostgreSQL harness");
    let options: sqlx::postgres::PgConnectOptions = harness.url.parse().expect("PostgreSQL URL");
    PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options.options([("search_path", schema)]))
        .await
        .expect("connect")
}

/// Every index of `jobs` whose key holds `state` is partial. A full one
/// (migration 0001's `jobs_state`, dropped by 0016) held an entry for each
/// version of each job, and the generic plans of the guarded statements
/// chose it over the primary key: a completion walked every entry of its
/// state, dead versions included (BENCHMARKS.md, 2026-11-26).
#[tokio::test]
async fn postgres_indexes_no_state_of_every_job() {
    let harness = common::Harness::postgres().await;
    let pool = postgres_schema(&harness).await;
    let indexes: Vec<(String, String)> = sqlx::query_as(
        "SELECT indexname::text, indexdef FROM pg_indexes \
         WHERE schemaname = current_schema() AND tablename = 'jobs'",
    )
    .fetch_all(&pool)
    .await
    .expect("indexes");
    assert!(indexes.len() >= 5, "the jobs table's indexes: {indexes:?}");
    for (name, definition) in &indexes {
        let keys = definition
            .split_once(" USING btree (")
            .and_then(|(_, rest)| rest.split_once(')'))
            .map(|(keys, _)| keys)
            .unwrap_or_else(|| panic!("{name}: {definition}"));
        if keys.split(',').any(|key| key.trim() == "state") {
            assert!(
                definition.contains(" WHERE "),
                "{name} keys every job by state: {definition}"
            );
        }
    }
}

/// PostgreSQL's plans for `queries` on one connection of a fresh schema,
/// after the `set_up` statements (settings, `PREPARE`s) ran on it.
async fn postgres_plans(set_up: &[&str], queries: &[&str]) -> Vec<Vec<String>> {
    let harness = common::Harness::postgres().await;
    let pool = postgres_schema(&harness).await;
    let mut connection = pool.acquire().await.expect("connection");
    for statement in set_up {
        sqlx::query(statement)
            .execute(&mut *connection)
            .await
            .expect("set up");
    }
    let mut plans = Vec::new();
    for query in queries {
        let plan: Vec<(String,)> = sqlx::query_as(&format!("EXPLAIN {query}"))
            .fetch_all(&mut *connection)
            .await
            .expect("plan");
        plans.push(plan.into_iter().map(|row| row.0).collect());
    }
    plans
}

/// The live job counts are served by the partial index of live jobs,
/// whose predicate is `LIVE_JOB` (the planner is told to avoid a scan
/// of the table, so this checks the index can serve the query at all).
#[tokio::test]
async fn postgres_live_job_counts_read_the_live_index() {
    let query =
        format!("SELECT pool, state, COUNT(*) FROM jobs WHERE {LIVE_JOB} GROUP BY pool, state");
    let plan = postgres_plans(&["SET enable_seqscan = off"], &[&query])
        .await
        .remove(0);
    assert!(
        plan.iter()
            .any(|line| line.contains("jobs_live") || line.contains("jobs_share")),
        "{plan:?}"
    );
}

/// Listing queued jobs (the wait explanations each request, the GitHub
/// recheck each round) reads the queue's partial indexes even in a generic
/// plan, which sees no arguments: the state is a literal in the statement
/// (`list_jobs`), the pool and limit are bound.
#[tokio::test]
async fn postgres_queued_listings_read_the_queue_in_generic_plans() {
    let set_up = [
        "SET plan_cache_mode = force_generic_plan",
        "SET enable_seqscan = off",
        "PREPARE by_pool(text, bigint) AS SELECT id FROM jobs WHERE 1 = 1 AND state = 'queued' \
         AND pool = $1 ORDER BY share_tag, id LIMIT $2",
        "PREPARE every_pool AS SELECT id FROM jobs WHERE 1 = 1 AND state = 'queued' \
         ORDER BY share_tag, id",
    ];
    let executes = ["EXECUTE by_pool('p', 10)", "EXECUTE every_pool"];
    read_live_indexes(&set_up, &executes).await;
}

/// The console's queue times on PostgreSQL, in a generic plan: the live
/// jobs through their partial index and the finished ones through a range
/// of `jobs_finished` (the planner is told to avoid a scan of the table,
/// so this checks the indexes can serve the query at all).
#[tokio::test]
async fn postgres_queue_times_read_live_jobs_and_the_window_of_finished_ones() {
    let prepare = format!(
        "PREPARE queue_times(bigint, bigint) AS {}",
        queue_times(Backend::Postgres)
    );
    let set_up = [
        "SET plan_cache_mode = force_generic_plan",
        "SET enable_seqscan = off",
        prepare.as_str(),
    ];
    let plan = postgres_plans(&set_up, &["EXECUTE queue_times(0, 10)"])
        .await
        .remove(0);
    assert!(
        !plan.iter().any(|line| line.contains("Seq Scan on jobs")),
        "the whole table: {plan:?}"
    );
    // Live jobs through either partial index of them (both have the
    // predicate `LIVE_JOB`).
    for indexes in [&["jobs_live", "jobs_share"][..], &["jobs_finished"]] {
        assert!(
            plan.iter()
                .any(|line| indexes.iter().any(|index| line.contains(index))),
            "{indexes:?}: {plan:?}"
        );
    }
}

/// The fair-share tag each insert computes (migration 0021's trigger) and
/// the claim's order read the live partial indexes in generic plans: a
/// key's last queued tag through `jobs_share`, the pool's virtual time and
/// the claim's tag order through `jobs_live` — never the whole table.
#[tokio::test]
async fn postgres_fair_share_reads_live_indexes_in_generic_plans() {
    let set_up = [
        "SET plan_cache_mode = force_generic_plan",
        "SET enable_seqscan = off",
        "PREPARE last_of_key(text, text) AS SELECT share_tag FROM jobs \
         WHERE pool = $1 AND share_key = $2 AND state = 'queued' ORDER BY share_tag DESC LIMIT 1",
        "PREPARE head(text) AS SELECT share_tag FROM jobs WHERE pool = $1 AND state = 'queued' \
         ORDER BY share_tag LIMIT 1",
        "PREPARE served(text) AS SELECT share_tag FROM jobs WHERE pool = $1 AND state = 'running' \
         ORDER BY share_tag DESC LIMIT 1",
        "PREPARE next(text) AS SELECT id FROM jobs WHERE state = 'queued' AND pool = $1 \
         ORDER BY share_tag, id LIMIT 1",
        "PREPARE running_of_key(text, text) AS SELECT count(*) FROM jobs \
         WHERE pool = $1 AND share_key = $2 AND state IN ('provisioning', 'running')",
    ];
    let executes = [
        "EXECUTE last_of_key('p', 'k')",
        "EXECUTE head('p')",
        "EXECUTE served('p')",
        "EXECUTE next('p')",
        "EXECUTE running_of_key('p', 'k')",
    ];
    read_live_indexes(&set_up, &executes).await;
    // Each tag lookup stops at one index entry (a plain `max()` on a table
    // whose statistics said "empty" once aggregated the whole queue).
    let lookups = &executes[..4];
    for (execute, plan) in lookups.iter().zip(postgres_plans(&set_up, lookups).await) {
        assert!(
            plan.iter().any(|line| line.contains("Limit")),
            "{execute}: {plan:?}"
        );
    }
}

/// `PREPARE {name}` of the store's claim statement in `form` (PostgreSQL),
/// its parameters typed as the store binds them.
fn prepare_claim(name: &str, form: ClaimForm) -> String {
    format!(
        "PREPARE {name}(text, bigint, bigint, bigint, text, text, bigint) AS {}",
        <PostgresDialect as Dialect>::claim_statement(form)
    )
}

/// The store's claim of one job, as the runner API makes it (a runner
/// with labels, and one without), reads its pool's queue in tag order
/// through `jobs_live`, one entry, even when the statistics say the queue
/// is empty: a long history analysed while nothing was queued, then a
/// burst of 3,000 jobs in a new pool. Before migration 0028 the planner
/// guessed one queued row, chose the smaller per-key index (partial on the
/// same `state = 'queued'`), and read and sorted the whole queue for every
/// claim. The per-key lookups still read that index, one entry. And the
/// chained completion's claim, a statement in a PL/pgSQL function, keeps
/// its generic plan rather than being planned again each call.
#[tokio::test]
async fn postgres_a_claim_reads_one_entry_whatever_the_statistics_say() {
    let harness = common::Harness::postgres().await;
    let pool = postgres_schema(&harness).await;
    let insert = |pool: &str, count: u32| {
        format!(
            "INSERT INTO jobs (source, external_id, pool, labels, state, max_attempts, \
             created_at, enqueued_at, share_tag) \
             SELECT 'api', '{pool}-' || g, '{pool}', '[]', 'queued', 3, 1, 1, g \
             FROM generate_series(1, {count}) AS g"
        )
    };
    let set_up = [
        // No analysis behind the test's back: the statistics stay stale.
        "ALTER TABLE jobs SET (autovacuum_enabled = false)".to_owned(),
        insert("history", 20_000),
        "UPDATE jobs SET state = 'running' WHERE pool = 'history'".to_owned(),
        "UPDATE jobs SET state = 'completed' WHERE pool = 'history'".to_owned(),
        "ANALYZE jobs".to_owned(),
        insert("burst", 3_000),
        prepare_claim("labelled", claim_of_one(true, false)),
        prepare_claim("bare", claim_of_one(false, false)),
    ];
    // One connection: the prepared statements live on it.
    let mut connection = pool.acquire().await.expect("connection");
    for statement in &set_up {
        sqlx::query(statement)
            .execute(&mut *connection)
            .await
            .expect("set up");
    }
    let mut explain = async |query: &str| {
        let plan: Vec<(String,)> = sqlx::query_as(&format!("EXPLAIN {query}"))
            .fetch_all(&mut *connection)
            .await
            .expect("plan");
        plan.into_iter().map(|row| row.0).collect::<Vec<_>>()
    };
    for execute in [
        "EXECUTE labelled('burst', 7, 0, 1, '[]', '', NULL)",
        "EXECUTE bare('burst', 7, 0, 1, NULL, '', NULL)",
    ] {
        let claim = explain(execute).await;
        assert!(
            claim.iter().any(|line| line.contains("using jobs_live"))
                && !claim.iter().any(|line| line.contains("Sort")),
            "the claim reads the queue in order: {execute}: {claim:?}"
        );
    }
    let last_of_key = explain(
        "SELECT share_tag FROM jobs WHERE pool = 'burst' AND share_key = '' \
         AND state = 'queued' ORDER BY share_tag DESC LIMIT 1",
    )
    .await;
    assert!(
        last_of_key
            .iter()
            .any(|line| line.contains("using jobs_share"))
            && !last_of_key.iter().any(|line| line.contains("Sort")),
        "a key's last queued tag: {last_of_key:?}"
    );
    let (settings,): (Vec<String>,) = sqlx::query_as(
        "SELECT proconfig FROM pg_proc WHERE proname = 'runway_start_next' \
             AND pronamespace = current_schema()::regnamespace",
    )
    .fetch_one(&mut *connection)
    .await
    .expect("the chained claim's function");
    assert_eq!(settings, ["plan_cache_mode=force_generic_plan"]);
}

/// The form of a claim of one job, with labels or without, a cap or not.
fn claim_of_one(labelled: bool, capped: bool) -> ClaimForm {
    ClaimForm {
        labelled,
        capped,
        one: true,
    }
}

/// The store's claim of one job, by a runner with labels or without, with
/// a cap or without, keeps one generic plan once PostgreSQL has tried five
/// custom ones, on a queue whose statistics say it is long. With the
/// labels' `$5 IS NULL OR …`, the cap's subquery or `LIMIT $4` in one
/// statement for every claim, the generic plan looked dearer than the
/// custom ones and the claim was planned again at each execution.
#[tokio::test]
async fn postgres_a_claim_of_one_keeps_its_generic_plan() {
    let harness = common::Harness::postgres().await;
    let pool = postgres_schema(&harness).await;
    // One connection: the prepared statements live on it.
    let mut connection = pool.acquire().await.expect("connection");
    for statement in [
        "INSERT INTO jobs (source, external_id, pool, labels, state, max_attempts, \
         created_at, enqueued_at, share_tag) \
         SELECT 'api', 'q-' || g, 'p', '[\"linux\"]', 'queued', 3, 1, 1, g \
         FROM generate_series(1, 20000) AS g",
        "ANALYZE jobs",
    ] {
        sqlx::query(statement)
            .execute(&mut *connection)
            .await
            .expect("set up");
    }
    let forms = [
        ("bare", false, false, "NULL", "NULL"),
        ("labelled", true, false, "'[\"linux\"]'", "NULL"),
        ("capped", true, true, "'[\"linux\"]'", "100000"),
    ];
    for (name, labelled, capped, labels, cap) in forms {
        sqlx::query(&prepare_claim(name, claim_of_one(labelled, capped)))
            .execute(&mut *connection)
            .await
            .expect("prepare");
        for _ in 0..8 {
            let claimed = sqlx::query(&format!(
                "EXECUTE {name}('p', 1, 0, 1, {labels}, '', {cap})"
            ))
            .fetch_all(&mut *connection)
            .await
            .expect("claim");
            assert_eq!(claimed.len(), 1, "{name}");
        }
        let (generic, custom): (i64, i64) = sqlx::query_as(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = $1",
        )
        .bind(name)
        .fetch_one(&mut *connection)
        .await
        .expect("plan counts");
        assert!(generic > 0, "{name}: {custom} custom plans, no generic one");
    }
}

/// SQLite: each of the four lookups that give an inserted job its
/// fair-share tag (the store's insert, and sqlite migration 0020's
/// trigger) reads one index in tag order, neither the table nor a sort of
/// every started job of the pool (572 µs an insert with 5,000 running).
#[tokio::test]
async fn the_fair_share_tag_lookups_read_an_index_in_tag_order() {
    let lookups = [
        "SELECT share_tag FROM jobs WHERE pool = 'p' AND state = 'provisioning' \
         ORDER BY share_tag DESC LIMIT 1",
        "SELECT share_tag FROM jobs WHERE pool = 'p' AND state = 'running' \
         ORDER BY share_tag DESC LIMIT 1",
        "SELECT share_tag FROM jobs WHERE pool = 'p' AND state = 'queued' \
         ORDER BY share_tag LIMIT 1",
        "SELECT share_tag FROM jobs WHERE pool = 'p' AND share_key = 'k' AND state = 'queued' \
         ORDER BY share_tag DESC LIMIT 1",
    ]
    .map(str::to_owned);
    for (lookup, details) in lookups.iter().zip(plans(&lookups).await) {
        assert!(
            details.iter().any(|d| d.contains("USING")) && !scans_the_table(&details, "jobs"),
            "{lookup}: {details:?}"
        );
        assert!(
            !details.iter().any(|d| d.contains("TEMP B-TREE")),
            "{lookup}: sorts: {details:?}"
        );
    }
}

/// Each of `executes` (after `set_up`) reads a partial index of live or
/// queued jobs and never scans the table.
async fn read_live_indexes(set_up: &[&str], executes: &[&str]) {
    for (execute, plan) in executes.iter().zip(postgres_plans(set_up, executes).await) {
        assert!(
            !plan.iter().any(|line| line.contains("Seq Scan on jobs")),
            "{execute}: the whole table: {plan:?}"
        );
        assert!(
            plan.iter()
                .any(|line| ["jobs_queue", "jobs_live", "jobs_share"]
                    .iter()
                    .any(|index| line.contains(index))),
            "{execute}: {plan:?}"
        );
    }
}

/// The held jobs (issue 58): the leader's look every few seconds and the
/// count beside the live ones read only held rows, never the history: on
/// SQLite through the state index it already had, on PostgreSQL (which
/// keeps no index of every job's state) through the partial index
/// `jobs_held`.
const HELD_READS: [&str; 2] = [
    "SELECT id FROM jobs WHERE 1 = 1 AND state = 'held' ORDER BY id LIMIT 500",
    "SELECT NULL, 'held', COUNT(*) FROM jobs WHERE state = 'held' HAVING COUNT(*) > 0",
];

#[tokio::test]
async fn held_jobs_are_read_through_their_partial_index() {
    let queries: Vec<String> = HELD_READS.iter().map(|q| (*q).to_owned()).collect();
    for (query, details) in queries.iter().zip(plans(&queries).await) {
        assert!(!scans_the_table(&details, "jobs"), "{query}: {details:?}");
        assert!(
            details
                .iter()
                .any(|d| d.starts_with("SEARCH jobs USING") && d.contains("state=?")),
            "{query}: {details:?}"
        );
    }
}

#[tokio::test]
async fn postgres_held_jobs_are_read_through_their_partial_index() {
    let plans = postgres_plans(&["SET enable_seqscan = off"], &HELD_READS).await;
    for (query, plan) in HELD_READS.iter().zip(plans) {
        assert!(
            plan.iter().any(|line| line.contains("jobs_held")),
            "{query}: {plan:?}"
        );
    }
}
