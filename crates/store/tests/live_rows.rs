//! What runs every round or request reads live rows only, and the pruner
//! reads what it deletes: SQLite's planner answers each query from the
//! partial index made for it, so its cost follows live work however long
//! the history grows. (The predicates are the store's own `LIVE_RUNNER`,
//! `LIVE_JOB` and `FINISHED_JOB`; the indexes must match them.)

use runway_store::{SqliteStore, Store, FINISHED_JOB, LIVE_JOB, LIVE_RUNNER, QUEUE_TIMES};
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

#[tokio::test]
async fn the_live_runner_query_is_served_by_the_partial_index() {
    let filters = ["", " AND pool = 'p'"];
    let queries: Vec<String> = filters
        .iter()
        .map(|f| format!("SELECT id FROM runners WHERE {LIVE_RUNNER}{f} ORDER BY id"))
        .collect();
    for (pool_filter, details) in filters.iter().zip(plans(&queries).await) {
        assert!(
            details.iter().any(|d| d.contains("runners_live")),
            "{pool_filter:?}: {details:?}"
        );
        assert!(
            // Scanning the partial index reads live rows only; scanning
            // the table (no USING) would read the whole history.
            !details
                .iter()
                .any(|d| d.starts_with("SCAN runners") && !d.contains("USING")),
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

/// The console's queue times read the last hour's started jobs through
/// the `started_at` index, newest first, never the whole history.
#[tokio::test]
async fn queue_times_read_the_window_through_the_started_at_index() {
    let query = QUEUE_TIMES.replace("$1", "0").replace("$2", "10");
    let details = plans(&[query]).await.remove(0);
    assert!(
        details.iter().any(|d| d.contains("jobs_started_at")),
        "{details:?}"
    );
    assert!(
        !details.iter().any(|d| d.contains("TEMP B-TREE")),
        "no sort of the whole set: {details:?}"
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
