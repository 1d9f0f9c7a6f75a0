//! What a round or a status request costs as history grows, on SQLite:
//! every runner ever recorded (`list_runners`, what rounds read before)
//! against the live ones (`list_live_runners`), with 50 live runners and an
//! empty history, then 50,000 ended runners; job counts over every job (the
//! status pages before) against live ones (`live_job_counts`), with 200
//! queued jobs and no history, then 200,000 finished jobs; and one
//! retention batch (1,000 finished jobs) out of that history. And what a
//! fleet of 10,000 live runners costs the console's minute sample: every
//! runner decoded (`list_live_runners`, what it read before) against
//! three columns counted (`live_runner_counts`).
//!
//! `cargo bench -p runway-store --bench history`. See BENCHMARKS.md.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use runway_store::{RunnerFilter, SqliteStore, Store};
use sqlx::sqlite::SqlitePoolOptions;

const LIVE: u32 = 50;

/// Inserts `count` runners in `state` (one statement), named after `prefix`.
async fn seed(url: &str, prefix: &str, state: &str, count: u32) {
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .expect("connect");
    let sql = format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {count}) \
         INSERT INTO runners (name, pool, provider, labels, state, requested_at, ended_at, version) \
         SELECT '{prefix}-' || i, 'linux', 'sim', '[]', '{state}', i, \
                CASE WHEN '{state}' = 'idle' THEN NULL ELSE i + 1 END, 1 FROM n"
    );
    sqlx::query(&sql).execute(&pool).await.expect("seed");
    pool.close().await;
}

/// A runtime and a new SQLite store in a temporary directory (kept while
/// it lives) with `live` idle runners; its URL, for seeding more.
struct Seeded {
    runtime: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
    url: String,
    store: SqliteStore,
}

fn seeded(live: u32) -> Seeded {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let dir = tempfile::tempdir().expect("temporary directory");
    let url = format!("sqlite://{}", dir.path().join("bench.db").display());
    let store = runtime.block_on(async {
        let store = SqliteStore::open(&url).await.expect("open SQLite");
        seed(&url, "live", "idle", live).await;
        store
    });
    Seeded {
        runtime,
        _dir: dir,
        url,
        store,
    }
}

/// Every live runner, decoded; there must be `expected` of them.
fn read_live(
    runtime: &tokio::runtime::Runtime,
    store: &SqliteStore,
    expected: u32,
) -> Vec<runway_core::Runner> {
    let live = runtime
        .block_on(store.list_live_runners(None))
        .expect("list");
    assert_eq!(live.len(), expected as usize);
    live
}

fn history(c: &mut Criterion) {
    let Seeded {
        runtime,
        _dir,
        url,
        store,
    } = seeded(LIVE);
    let mut group = c.benchmark_group("round_runner_read");
    for ended in [0u32, 50_000] {
        if ended > 0 {
            runtime.block_on(seed(&url, "ended", "terminated", ended));
        }
        group.bench_with_input(BenchmarkId::new("all_runners", ended), &ended, |b, _| {
            b.iter(|| {
                runtime
                    .block_on(store.list_runners(&RunnerFilter::default()))
                    .expect("list")
            })
        });
        group.bench_with_input(BenchmarkId::new("live_runners", ended), &ended, |b, _| {
            b.iter(|| read_live(&runtime, &store, LIVE))
        });
    }
    group.finish();
}

/// 10,000 live runners: the whole list against the counts.
fn fleet(c: &mut Criterion) {
    const FLEET: u32 = 10_000;
    let Seeded {
        runtime,
        _dir,
        store,
        ..
    } = seeded(FLEET);
    let mut group = c.benchmark_group("fleet_read");
    group.bench_function("live_runners_10000", |b| {
        b.iter(|| read_live(&runtime, &store, FLEET))
    });
    group.bench_function("live_runner_counts_10000", |b| {
        b.iter(|| {
            let counts = runtime
                .block_on(store.live_runner_counts())
                .expect("counts");
            assert_eq!(
                counts.iter().map(|c| c.count).sum::<u64>(),
                u64::from(FLEET)
            );
            counts
        })
    });
    group.finish();
}

/// Inserts `count` jobs in `state` (one statement), named after `prefix`.
async fn seed_jobs(url: &str, prefix: &str, state: &str, count: u32) {
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .expect("connect");
    let sql = format!(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {count}) \
         INSERT INTO jobs (source, external_id, pool, labels, state, max_attempts, created_at, enqueued_at, finished_at) \
         SELECT 'api', '{prefix}-' || i, 'linux', '[\"linux\"]', '{state}', 3, i, i, \
                CASE WHEN '{state}' = 'queued' THEN NULL ELSE i + 1 END FROM n"
    );
    sqlx::query(&sql).execute(&pool).await.expect("seed jobs");
    pool.close().await;
}

fn status_counts(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let dir = tempfile::tempdir().expect("temporary directory");
    let url = format!("sqlite://{}", dir.path().join("counts.db").display());
    let (store, reader) = runtime.block_on(async {
        let store = SqliteStore::open(&url).await.expect("open SQLite");
        seed_jobs(&url, "live", "queued", 200).await;
        let reader = SqlitePoolOptions::new()
            .max_connections(1)
            .connect(&url)
            .await
            .expect("connect");
        (store, reader)
    });
    let mut group = c.benchmark_group("status_job_counts");
    for finished in [0u32, 200_000] {
        if finished > 0 {
            runtime.block_on(seed_jobs(&url, "done", "completed", finished));
        }
        group.bench_with_input(BenchmarkId::new("all_jobs", finished), &finished, |b, _| {
            b.iter(|| {
                runtime
                    .block_on(
                        sqlx::query_as::<_, (Option<String>, String, i64)>(
                            "SELECT pool, state, COUNT(*) FROM jobs GROUP BY pool, state",
                        )
                        .fetch_all(&reader),
                    )
                    .expect("count")
            })
        });
        group.bench_with_input(
            BenchmarkId::new("live_jobs", finished),
            &finished,
            |b, _| b.iter(|| runtime.block_on(store.live_job_counts()).expect("count")),
        );
    }
    group.finish();
    // One retention batch out of that history, re-seeded as it goes.
    let mut group = c.benchmark_group("retention_batch");
    let mut round = 0u32;
    group.bench_function("prune_1000_finished_jobs", |b| {
        b.iter(|| {
            round += 1;
            let pruned = runtime
                .block_on(store.prune(
                    runway_store::Prunable::FinishedJobs,
                    runway_core::Timestamp::from_millis(i64::MAX),
                    1_000,
                ))
                .expect("prune");
            if pruned < 1_000 {
                runtime.block_on(seed_jobs(
                    &url,
                    &format!("more-{round}"),
                    "completed",
                    100_000,
                ));
            }
            pruned
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = history, status_counts, fleet
}
criterion_main!(benches);
