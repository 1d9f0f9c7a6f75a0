//! What runs every round or request reads live rows only: SQLite's planner
//! answers the live-runner query from the `runners_live` partial index, so
//! its cost follows live runners however long the history grows. (The
//! predicate is the store's own `LIVE_RUNNER`; the index must match it.)

use runway_store::{SqliteStore, Store, LIVE_RUNNER};
use sqlx::sqlite::SqlitePoolOptions;

#[tokio::test]
async fn the_live_runner_query_is_served_by_the_partial_index() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("runway.db");
    let url = format!("sqlite://{}", path.display());
    let store = SqliteStore::open(&url).await.expect("open");
    store.check_ready().await.expect("migrated");
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("connect");
    for pool_filter in ["", " AND pool = 'p'"] {
        let sql = format!(
            "EXPLAIN QUERY PLAN SELECT id FROM runners WHERE {LIVE_RUNNER}{pool_filter} ORDER BY id"
        );
        let plan: Vec<(i64, i64, i64, String)> =
            sqlx::query_as(&sql).fetch_all(&pool).await.expect("plan");
        let details: Vec<&str> = plan.iter().map(|row| row.3.as_str()).collect();
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
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("runway.db").display());
    let store = SqliteStore::open(&url).await.expect("open");
    store.check_ready().await.expect("migrated");
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("connect");
    let sql = format!(
        "EXPLAIN QUERY PLAN SELECT id FROM jobs INDEXED BY jobs_finished WHERE {} AND finished_at < 1 ORDER BY finished_at, id LIMIT 10",
        runway_store::FINISHED_JOB
    );
    let plan: Vec<(i64, i64, i64, String)> =
        sqlx::query_as(&sql).fetch_all(&pool).await.expect("plan");
    let details: Vec<&str> = plan.iter().map(|row| row.3.as_str()).collect();
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
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("runway.db").display());
    let store = SqliteStore::open(&url).await.expect("open");
    store.check_ready().await.expect("migrated");
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("connect");
    let sql = format!(
        "EXPLAIN QUERY PLAN SELECT pool, state, COUNT(*) FROM jobs WHERE {} GROUP BY pool, state",
        runway_store::LIVE_JOB
    );
    let plan: Vec<(i64, i64, i64, String)> =
        sqlx::query_as(&sql).fetch_all(&pool).await.expect("plan");
    let details: Vec<&str> = plan.iter().map(|row| row.3.as_str()).collect();
    assert!(
        details
            .iter()
            .any(|d| d.starts_with("SEARCH jobs USING") && d.contains("state=?")),
        "{details:?}"
    );
}
