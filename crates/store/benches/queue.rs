//! Queue throughput on both backends: enqueue, and the whole hand-out of a
//! job to a runner with 1 and 8 concurrent workers: the job alone (claim,
//! accept, complete), and the job with its runner and log as the runner
//! API moves them, in three writes (two-phase), in two (one step), and in
//! one (chained: each completion starts the runner's next job).
//!
//! `cargo bench -p runway-store` (PostgreSQL from `RUNWAY_TEST_POSTGRES_URL`,
//! default the local service). See `benches/README.md`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use runway_core::job::{NewJob, Route};
use runway_core::runner::NewRunner;
use runway_core::{
    moves, Conclusion, Job, JobEvent, JobSource, Runner, RunnerEvent, RunnerId, Timestamp,
};
use runway_store::{Claim, ClaimStart, OpenOptions, PostgresStore, SqliteStore, Store};

static SEQUENCE: AtomicU64 = AtomicU64::new(0);

fn next_id() -> u64 {
    SEQUENCE.fetch_add(1, Ordering::Relaxed)
}

fn new_job(pool: &str) -> NewJob {
    NewJob {
        source: JobSource::Api,
        external_id: format!("bench-{}-{}", std::process::id(), next_id()),
        route: Route::Pool(pool.to_owned()),
        labels: vec!["self-hosted".to_owned(), "linux".to_owned()],
        payload: r#"{"script":"make test"}"#.to_owned(),
        max_attempts: 3,
        share: Default::default(),
    }
}

fn now() -> Timestamp {
    Timestamp::from_millis(1_700_000_000_000)
}

/// A pool of its own with `jobs` queued jobs, filled outside the timed part.
async fn filled_pool(store: &dyn Store, prefix: &str, jobs: u64) -> String {
    let pool = format!("{prefix}-{}", next_id());
    let jobs: Vec<NewJob> = (0..jobs).map(|_| new_job(&pool)).collect();
    for chunk in jobs.chunks(1_000) {
        store.enqueue_many(chunk, now()).await.expect("fill");
    }
    pool
}

/// A registered runner of `pool`, idle.
async fn idle_runner(store: &Arc<dyn Store>, pool: &str, worker: u64) -> Runner {
    let new = NewRunner {
        name: format!("bench-{pool}-{worker}"),
        pool: pool.to_owned(),
        provider: "bench".to_owned(),
        labels: vec![],
        stock: false,
    };
    let runner = store.create_runner(&new, now()).await.expect("runner");
    store
        .apply_runner_event(runner.id, &RunnerEvent::Ready, now())
        .await
        .expect("ready")
}

/// One idle runner of `pool` per worker, each behind its worker's lock
/// with `state` beside it.
async fn worker_runners<T>(
    store: &Arc<dyn Store>,
    pool: &str,
    workers: u64,
    state: impl Fn() -> T,
) -> Arc<Vec<tokio::sync::Mutex<(Runner, T)>>> {
    let mut runners = Vec::new();
    for worker in 0..workers {
        let runner = idle_runner(store, pool, worker).await;
        runners.push(tokio::sync::Mutex::new((runner, state())));
    }
    Arc::new(runners)
}

/// A claim of one job of `pool` for `runner`.
fn claim_one(pool: &str, runner: &Runner) -> Claim {
    Claim::of_pool(pool, runner.id, 1, Duration::from_secs(120))
}

/// `runner`'s successful completion of the job it holds.
fn success(runner: &Runner) -> runway_core::GuardedChange {
    JobEvent::Complete {
        runner: runner.id,
        conclusion: Conclusion::Success,
    }
    .guarded(now())
    .expect("a completion has a guarded form")
}

/// One job through `runner`, as the runner API hands it out: claimed and
/// started in one write (`one_step`), or claimed and then accepted with the
/// runner made busy; then completed with the runner freed and the log
/// stored. Returns the runner as it is after.
async fn hand_out(store: &dyn Store, pool: &str, runner: &Runner, one_step: bool) -> Runner {
    let claim = claim_one(pool, runner);
    let (job, busy) = if one_step {
        let ClaimStart::Started(moved) = store
            .claim_and_start(&claim, runner, now())
            .await
            .expect("claim and start")
        else {
            panic!("every iteration has a queued job and a runner it knows");
        };
        (moved.job, moved.runner.expect("the runner is stored"))
    } else {
        let claimed = store.claim(&claim, now()).await.expect("claim");
        let job = claimed.into_iter().next().expect("a queued job");
        let accept = JobEvent::Accept { runner: runner.id }
            .guarded(now())
            .expect("an accept has a guarded form");
        let busy = moves::start(&job, runner, now()).expect("an idle runner starts");
        let moved = store
            .apply_guarded_with_runner(job.id, &accept, (runner, &busy), None)
            .await
            .expect("accept")
            .expect("the holder accepts");
        (moved.job, busy)
    };
    let complete = success(runner);
    let free = moves::finish(&job, &busy, false, now()).expect("busy with it");
    store
        .apply_guarded_with_runner(job.id, &complete, (&busy, &free), Some((Some(0), "ok")))
        .await
        .expect("complete")
        .expect("the holder completes");
    free
}

/// One job of a runner working through a queue: the job it runs (started
/// first if it has none) completed, with its next one started in the same
/// write. Returns the runner and the job it runs after.
async fn chained(
    store: &dyn Store,
    pool: &str,
    runner: Runner,
    running: Option<Job>,
) -> (Runner, Option<Job>) {
    let claim = claim_one(pool, &runner);
    let (job, busy) = match running {
        Some(job) => (job, runner),
        None => {
            let ClaimStart::Started(moved) = store
                .claim_and_start(&claim, &runner, now())
                .await
                .expect("claim and start")
            else {
                panic!("every iteration has a queued job and a runner it knows");
            };
            (moved.job, moved.runner.expect("the runner is stored"))
        }
    };
    let complete = success(&busy);
    let free = moves::finish(&job, &busy, false, now()).expect("busy with it");
    let (ended, next) = store
        .complete_and_start_next(
            job.id,
            &complete,
            (&busy, &free),
            Some((Some(0), "ok")),
            &claim,
            now(),
        )
        .await
        .expect("complete")
        .expect("the holder completes");
    (ended.runner.expect("the runner is stored"), next)
}

struct Backend {
    name: &'static str,
    store: Arc<dyn Store>,
    cleanup: Option<(String, String)>,
    _dir: Option<tempfile::TempDir>,
}

fn backends(runtime: &tokio::runtime::Runtime) -> Vec<Backend> {
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("bench.db").display().to_string();
        let sqlite = SqliteStore::open(&path).await.expect("open SQLite");
        let url = std::env::var("RUNWAY_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let schema = format!("runway_bench_{}", std::process::id());
        let options = OpenOptions {
            max_connections: 16,
            ..OpenOptions::default()
        };
        let postgres = PostgresStore::open(&url, Some(&schema), &options)
            .await
            .expect("PostgreSQL must be running for the benchmarks");
        vec![
            Backend {
                name: "sqlite",
                store: Arc::new(sqlite),
                cleanup: None,
                _dir: Some(dir),
            },
            Backend {
                name: "postgres",
                store: Arc::new(postgres),
                cleanup: Some((url, schema)),
                _dir: None,
            },
        ]
    })
}

/// Runs `iters` operations split over `workers` tasks and returns the wall time.
async fn run_split<F, Fut>(iters: u64, workers: u64, operation: F) -> Duration
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..workers {
        let share = iters / workers + u64::from(worker < iters % workers);
        let operation = operation.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..share {
                operation(worker).await;
            }
        }));
    }
    for task in tasks {
        task.await.expect("worker");
    }
    started.elapsed()
}

/// Benchmark group `name`, one job an element, on every backend with 1 and
/// 8 workers: `sample(store, workers, iters)` runs one timed sample of
/// `iters` jobs and returns its wall time.
fn per_worker_count<F, Fut>(
    c: &mut Criterion,
    runtime: &tokio::runtime::Runtime,
    backends: &[Backend],
    name: &str,
    sample: F,
) where
    F: Fn(Arc<dyn Store>, u64, u64) -> Fut,
    Fut: std::future::Future<Output = Duration>,
{
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(1));
    for backend in backends {
        for workers in [1u64, 8] {
            group.bench_with_input(
                BenchmarkId::new(backend.name, format!("{workers}-workers")),
                &workers,
                |b, &workers| {
                    b.to_async(runtime)
                        .iter_custom(|iters| sample(backend.store.clone(), workers, iters));
                },
            );
        }
    }
    group.finish();
}

fn queue_benchmarks(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let backends = backends(&runtime);

    per_worker_count(
        c,
        &runtime,
        &backends,
        "enqueue",
        |store, workers, iters| {
            run_split(iters, workers, move |_| {
                let store = store.clone();
                async move {
                    store
                        .enqueue(&new_job("enqueue"), now())
                        .await
                        .expect("enqueue");
                }
            })
        },
    );

    let mut group = c.benchmark_group("enqueue_many_100");
    group.throughput(Throughput::Elements(100));
    for backend in &backends {
        let store = backend.store.clone();
        group.bench_function(backend.name, |b| {
            b.to_async(&runtime).iter_custom(|iters| {
                let store = store.clone();
                async move {
                    let batches: Vec<Vec<NewJob>> = (0..iters)
                        .map(|_| (0..100).map(|_| new_job("batch")).collect())
                        .collect();
                    let started = Instant::now();
                    for batch in &batches {
                        store
                            .enqueue_many(batch, now())
                            .await
                            .expect("enqueue_many");
                    }
                    started.elapsed()
                }
            });
        });
    }
    group.finish();

    // One job handed out and finished: claim (lease) → accept → complete.
    let name = "claim_accept_complete";
    per_worker_count(
        c,
        &runtime,
        &backends,
        name,
        |store, workers, iters| async move {
            let pool = filled_pool(&*store, "claim", iters).await;
            run_split(iters, workers, move |worker| {
                let store = store.clone();
                let pool = pool.clone();
                async move {
                    let runner = RunnerId(worker as i64 + 1);
                    let claim = Claim::of_pool(pool, runner, 1, Duration::from_secs(120));
                    let jobs = store.claim(&claim, now()).await.expect("claim");
                    for job in jobs {
                        store.accept(job.id, runner, now()).await.expect("accept");
                        store
                            .complete(job.id, runner, Conclusion::Success, now())
                            .await
                            .expect("complete");
                    }
                }
            })
            .await
        },
    );

    // The hand-out as the runner API does it, the runner moving with its
    // job: in three writes (claim; accept with the runner made busy;
    // completion with the runner freed and the log stored), and in two (a
    // claim that starts the job with its runner, then the completion).
    // One statement each on PostgreSQL.
    for (name, one_step) in [("handout_two_phase", false), ("handout_one_step", true)] {
        per_worker_count(
            c,
            &runtime,
            &backends,
            name,
            |store, workers, iters| async move {
                let pool = filled_pool(&*store, name, iters).await;
                let runners = worker_runners(&store, &pool, workers, || ()).await;
                run_split(iters, workers, move |worker| {
                    let store = store.clone();
                    let pool = pool.clone();
                    let runners = runners.clone();
                    async move {
                        let mut runner = runners[worker as usize].lock().await;
                        runner.0 = hand_out(&*store, &pool, &runner.0, one_step).await;
                    }
                })
                .await
            },
        );
    }

    // The hand-out of a runner that works through a queue: each
    // completion starts the runner's next job in the same write
    // (`complete_and_start_next`), so a job costs one write (one statement
    // on PostgreSQL). A worker's first job is started on its own.
    per_worker_count(
        c,
        &runtime,
        &backends,
        "handout_chained",
        |store, workers, iters| async move {
            // A job to spare per worker: each ends holding one it started.
            let pool = filled_pool(&*store, "chained", iters + workers).await;
            let states = worker_runners(&store, &pool, workers, || None).await;
            run_split(iters, workers, move |worker| {
                let store = store.clone();
                let pool = pool.clone();
                let states = states.clone();
                async move {
                    let mut state = states[worker as usize].lock().await;
                    *state = chained(&*store, &pool, state.0.clone(), state.1.take()).await;
                }
            })
            .await
        },
    );

    for backend in backends {
        if let Some((url, schema)) = backend.cleanup {
            runtime
                .block_on(PostgresStore::drop_schema(&url, &schema))
                .expect("drop benchmark schema");
        }
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4));
    targets = queue_benchmarks
}
criterion_main!(benches);
