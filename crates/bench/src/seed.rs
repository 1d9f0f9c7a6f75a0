//! `runway-bench forecast-seed`: what a predictive pool's first read of
//! the store's history costs the reconciler's rounds. A scratch SQLite
//! store gets `--jobs` GitHub jobs over the last three weeks (one in
//! `--share` routed to the predictive pool, in workflow runs of eight,
//! the rest unroutable, so the live queue stays small), then a reconciler
//! (no providers) runs rounds until the forecast is seeded and as many
//! again after. Reported: the rounds it took, and the median round while
//! seeding against the median once seeded, measured in the same run.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use runway_core::job::{NewJob, Route};
use runway_core::{JobSource, Timestamp};
use runway_server::app::Service;
use runway_server::config::{Config, PoolConfig, ScalingPolicy};
use runway_server::reconcile::Reconciler;

#[derive(Args, Debug, Clone)]
pub struct SeedArgs {
    /// Jobs in the store's history.
    #[arg(long, default_value_t = 1_000_000)]
    jobs: u64,
    /// One job in this many goes to the predictive pool.
    #[arg(long, default_value_t = 1_000)]
    share: u64,
    /// Rounds to run at most before giving up on the seed.
    #[arg(long, default_value_t = 2_000)]
    max_rounds: u32,
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

pub async fn forecast_seed(args: SeedArgs) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("runway-seed-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).context("a scratch directory")?;
    let result = run(&args, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn run(args: &SeedArgs, dir: &std::path::Path) -> anyhow::Result<()> {
    let url = format!("sqlite://{}", dir.join("runway.db").display());
    let store = runway_store::open(&url, &runway_store::OpenOptions::default())
        .await
        .context("open the scratch store")?;
    let span = Duration::from_secs(21 * 86_400).as_millis() as i64;
    let now = Timestamp::from_millis(span + 1);
    let step = (span / args.jobs.max(1) as i64).max(1);
    let started = Instant::now();
    let mut batch = Vec::with_capacity(5_000);
    for i in 0..args.jobs {
        let route = if i % args.share.max(1) == 0 {
            Route::Pool("linux".into())
        } else {
            Route::Unroutable {
                reason: "no pool".into(),
            }
        };
        batch.push(NewJob {
            source: JobSource::Github,
            external_id: i.to_string(),
            route,
            labels: vec!["linux".into()],
            payload: serde_json::json!({
                "repository": "acme/monorepo", "workflow": "ci", "name": "build",
                "run_id": i / 8, "created_at_ms": i as i64 * step,
            })
            .to_string(),
            max_attempts: 3,
            share: Default::default(),
        });
        if batch.len() == batch.capacity() || i + 1 == args.jobs {
            store
                .enqueue_many(&batch, Timestamp::from_millis(i as i64 * step))
                .await?;
            batch.clear();
        }
    }
    eprintln!(
        "stored {} jobs in {:.1} s",
        args.jobs,
        started.elapsed().as_secs_f64()
    );
    let config = Config {
        pools: vec![PoolConfig {
            name: "linux".into(),
            labels: vec!["linux".into()],
            policy: ScalingPolicy::Predictive,
            ..PoolConfig::default()
        }],
        ..Config::default()
    };
    let service = Arc::new(Service::new(config, store));
    let reconciler = Reconciler::new(service.clone(), BTreeMap::new());
    let seeded = || {
        service
            .warm
            .lock()
            .map(|w| w.contains_key("linux"))
            .unwrap_or(false)
    };
    let (mut seeding, mut after) = (Vec::new(), Vec::new());
    let mut rounds = 0;
    while !seeded() {
        anyhow::ensure!(rounds < args.max_rounds, "not seeded after {rounds} rounds");
        let round = Instant::now();
        reconciler
            .reconcile_once(now.plus(Duration::from_millis(u64::from(rounds))))
            .await?;
        seeding.push(round.elapsed());
        rounds += 1;
    }
    for i in 0..rounds.max(5) {
        let round = Instant::now();
        reconciler
            .reconcile_once(now.plus(Duration::from_millis(u64::from(rounds + i))))
            .await?;
        after.push(round.elapsed());
    }
    let (during, once) = (median(seeding), median(after));
    println!("| jobs in the store | rounds to seed | median round while seeding | median round once seeded | ratio |");
    println!("| ---: | ---: | ---: | ---: | ---: |");
    println!(
        "| {} | {rounds} | {:.1} ms | {:.1} ms | {:.1}× |",
        args.jobs,
        during.as_secs_f64() * 1e3,
        once.as_secs_f64() * 1e3,
        during.as_secs_f64() / once.as_secs_f64().max(1e-9)
    );
    Ok(())
}

#[derive(Args, Debug, Clone)]
pub struct DeepQueueArgs {
    /// Queued jobs in the deep store.
    #[arg(long, default_value_t = 100_000)]
    jobs: u64,
    /// Queued jobs in the shallow store it is compared with.
    #[arg(long, default_value_t = 1_000)]
    shallow: u64,
    /// Rounds measured on each store (after two warm-up rounds).
    #[arg(long, default_value_t = 21)]
    rounds: u32,
}

/// `runway-bench deep-queue`: what a deep queue costs the reconciler's
/// rounds. Two scratch SQLite stores, one pool (`max_runners` 50, no
/// providers, so nothing starts and the queue stays as deep), `--shallow`
/// and `--jobs` queued jobs; the same number of rounds on each, the two
/// measured alternately in the same run. Reported: each median round and
/// their ratio.
pub async fn deep_queue(args: DeepQueueArgs) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("runway-deep-queue-{}", std::process::id()));
    std::fs::create_dir_all(&dir).context("a scratch directory")?;
    let result = deep_queue_in(&args, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn queued_store(
    dir: &std::path::Path,
    name: &str,
    jobs: u64,
) -> anyhow::Result<(Arc<Service>, Reconciler)> {
    let url = format!("sqlite://{}", dir.join(format!("{name}.db")).display());
    let store = runway_store::open(&url, &runway_store::OpenOptions::default())
        .await
        .context("open the scratch store")?;
    let mut batch = Vec::with_capacity(5_000);
    for i in 0..jobs {
        batch.push(NewJob::api(format!("deep-{i}"), "linux", &["linux"]));
        if batch.len() == batch.capacity() || i + 1 == jobs {
            store
                .enqueue_many(&batch, Timestamp::from_millis(i as i64))
                .await?;
            batch.clear();
        }
    }
    let config = Config {
        pools: vec![PoolConfig {
            name: "linux".into(),
            labels: vec!["linux".into()],
            max_runners: 50,
            ..PoolConfig::default()
        }],
        ..Config::default()
    };
    let service = Arc::new(Service::new(config, store));
    let reconciler = Reconciler::new(service.clone(), BTreeMap::new());
    Ok((service, reconciler))
}

async fn deep_queue_in(args: &DeepQueueArgs, dir: &std::path::Path) -> anyhow::Result<()> {
    let stores = [
        (
            "shallow",
            args.shallow,
            queued_store(dir, "shallow", args.shallow).await?,
        ),
        (
            "deep",
            args.jobs,
            queued_store(dir, "deep", args.jobs).await?,
        ),
    ];
    let now = Timestamp::from_millis(86_400_000);
    let mut times: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    for round in 0..args.rounds + 2 {
        for (i, (_, _, (_, reconciler))) in stores.iter().enumerate() {
            let started = Instant::now();
            reconciler
                .reconcile_once(now.plus(Duration::from_millis(u64::from(round))))
                .await?;
            if round >= 2 {
                times[i].push(started.elapsed());
            }
        }
    }
    for (_, jobs, (service, _)) in &stores {
        let queued = service
            .store
            .live_job_counts()
            .await?
            .iter()
            .filter(|c| c.state == runway_core::JobState::Queued)
            .map(|c| c.count)
            .sum::<u64>();
        anyhow::ensure!(queued == *jobs, "the queue changed: {queued} of {jobs}");
    }
    let [shallow, deep] = times.map(median);
    println!(
        "| queued jobs | median round | vs {} queued |",
        args.shallow
    );
    println!("| ---: | ---: | ---: |");
    for ((_, jobs, _), time) in stores.iter().zip([shallow, deep]) {
        println!(
            "| {jobs} | {:.2} ms | {:.2}× |",
            time.as_secs_f64() * 1e3,
            time.as_secs_f64() / shallow.as_secs_f64().max(1e-9)
        );
    }
    Ok(())
}
