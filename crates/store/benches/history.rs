//! What a round costs as history grows: every runner ever recorded
//! (`list_runners`, what rounds read before) against the live ones
//! (`list_live_runners`, what they read now), on SQLite with 50 live
//! runners and an empty history, then 50,000 ended runners.
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

fn history(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let dir = tempfile::tempdir().expect("temporary directory");
    let url = format!("sqlite://{}", dir.path().join("history.db").display());
    let store = runtime.block_on(async {
        let store = SqliteStore::open(&url).await.expect("open SQLite");
        seed(&url, "live", "idle", LIVE).await;
        store
    });
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
            b.iter(|| {
                let live = runtime
                    .block_on(store.list_live_runners(None))
                    .expect("list");
                assert_eq!(live.len(), LIVE as usize);
                live
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20);
    targets = history
}
criterion_main!(benches);
