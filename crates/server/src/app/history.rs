//! The fleet's history behind the console's charts: once a minute the
//! leader records each pool's state — queued and running jobs, runners by
//! state, the queue times of the jobs that started, the runner time paid
//! for and its price, and why queued jobs wait — as one row of a bounded
//! time series (`Store::record_pool_samples`, pruned by `[retention]
//! pool_history`). Charts read that series, never the jobs' history, so a
//! page costs the same with a million finished jobs as with none.
//!
//! The sample is a pure function of what was read (`samples`); the worker
//! around it reads and writes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use runway_core::{JobState, RunnerState, Timestamp};
use runway_store::{JobCount, PoolSample, RunnerCount};
use tokio::sync::watch;

use crate::app::Service;
use crate::config::Config;
use crate::tasks::Worker;

/// One sample a pool every minute.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(60);

/// At most this many starts of a minute are read for its queue times.
const STARTS_READ: u32 = 50_000;

/// What one round read, for [`samples`].
pub struct Observed<'a> {
    pub jobs: &'a [JobCount],
    /// Live runners counted by pool, provider and state: what a sample
    /// needs of them, read without decoding every runner (at 10,000
    /// runners that decode was a tenth of what a waiting fleet cost).
    pub runners: &'a [RunnerCount],
    /// Each job started in the minute, with its pool and queue time.
    pub queue_times: Vec<(String, Duration)>,
    /// Queued jobs by pool and wait reason, from the reconciler's latest
    /// round (empty when none ran).
    pub waiting: &'a BTreeMap<(String, &'static str), i64>,
}

/// Each configured pool's sample of the minute starting `at`, whose
/// runners were paid for `seconds` (the time since the previous sample,
/// at most two minutes: a leader that just took over does not bill the
/// gap before it).
pub fn samples(
    config: &Config,
    observed: Observed<'_>,
    at: Timestamp,
    seconds: i64,
) -> Vec<PoolSample> {
    let seconds = seconds.clamp(0, 2 * SAMPLE_EVERY.as_secs() as i64);
    let percentiles = queue_percentiles(observed.queue_times);
    config
        .pools
        .iter()
        .map(|pool| {
            let jobs = |states: &[JobState]| -> i64 {
                observed
                    .jobs
                    .iter()
                    .filter(|c| {
                        c.pool.as_deref() == Some(pool.name.as_str()) && states.contains(&c.state)
                    })
                    .map(|c| i64::try_from(c.count).unwrap_or(i64::MAX))
                    .sum()
            };
            let runners: Vec<&RunnerCount> = observed
                .runners
                .iter()
                .filter(|c| c.pool == pool.name)
                .collect();
            let in_states = |states: &[RunnerState]| -> i64 {
                runners
                    .iter()
                    .filter(|c| states.contains(&c.state))
                    .map(|c| i64::try_from(c.count).unwrap_or(i64::MAX))
                    .sum()
            };
            // Live runners are never terminal: these are all of them.
            let live = in_states(&RunnerState::ALL);
            // Every live runner costs its provider's price, booting ones
            // too; a stopped one its stopped price (its disk).
            let cost: f64 = runners
                .iter()
                .map(|c| {
                    let provider = config.providers.iter().find(|p| p.name == c.provider);
                    let price = match c.state {
                        RunnerState::Stopped => provider.map_or(0.0, |p| p.stopped_price()),
                        _ => provider.map_or(0.0, |p| p.price_per_hour),
                    };
                    price * c.count as f64
                })
                .sum::<f64>()
                * seconds as f64
                / 3600.0;
            let (started, p50, p95) = match percentiles.get(&pool.name) {
                Some((started, p50, p95)) => {
                    (*started as i64, Some(millis(*p50)), Some(millis(*p95)))
                }
                None => (0, None, None),
            };
            let waits = observed
                .waiting
                .iter()
                .filter(|((p, _), jobs)| *p == pool.name && **jobs > 0)
                .map(|((_, reason), jobs)| ((*reason).to_owned(), *jobs))
                .collect();
            PoolSample {
                pool: pool.name.clone(),
                at,
                queued: jobs(&[JobState::Queued]),
                running: jobs(&[JobState::Provisioning, JobState::Running]),
                booting: in_states(&[RunnerState::Requested, RunnerState::Provisioning]),
                idle: in_states(&[RunnerState::Idle]),
                busy: in_states(&[RunnerState::Busy]),
                stopped: in_states(&[RunnerState::Stopped]),
                started,
                wait_p50_ms: p50,
                wait_p95_ms: p95,
                runner_seconds: live * seconds,
                cost_micros: (cost * 1e6).round() as i64,
                waits,
            }
        })
        .collect()
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Per pool, the jobs that started and the p50 and p95 of their queue
/// times (nearest rank).
pub fn queue_percentiles(
    times: Vec<(String, Duration)>,
) -> BTreeMap<String, (usize, Duration, Duration)> {
    let mut by_pool: BTreeMap<String, Vec<Duration>> = BTreeMap::new();
    for (pool, waited) in times {
        by_pool.entry(pool).or_default().push(waited);
    }
    by_pool
        .into_iter()
        .map(|(pool, mut waits)| {
            waits.sort_unstable();
            let rank = |q: f64| {
                waits[((q * waits.len() as f64).ceil() as usize).clamp(1, waits.len()) - 1]
            };
            let stats = (waits.len(), rank(0.5), rank(0.95));
            (pool, stats)
        })
        .collect()
}

/// The start of the minute `now` is in.
pub fn minute_of(now: Timestamp) -> Timestamp {
    let width = SAMPLE_EVERY.as_millis() as i64;
    Timestamp::from_millis(now.as_millis().div_euclid(width) * width)
}

/// Records a sample of every pool each minute, on the leader, until
/// `shutdown`. Each round samples the minute that just ended.
pub async fn sampler(service: Arc<Service>, shutdown: watch::Receiver<bool>) {
    let worker = Worker {
        name: "sample_pools",
        period: SAMPLE_EVERY,
        leader_only: true,
        first_round_at_once: false,
        wake: None,
    };
    let last: Arc<std::sync::Mutex<Option<Timestamp>>> = Arc::default();
    worker
        .run(&service.tasks, &|| service.is_leader(), shutdown, || {
            let (service, last) = (service.clone(), last.clone());
            async move { sample_once(&service, &last, crate::clock::now()).await }
        })
        .await
}

/// One round: the minute before `now`'s, unless already sampled.
pub async fn sample_once(
    service: &Service,
    last: &std::sync::Mutex<Option<Timestamp>>,
    now: Timestamp,
) -> Result<(), runway_store::StoreError> {
    let at = minute_of(now).minus(SAMPLE_EVERY);
    let previous = last.lock().ok().and_then(|l| *l);
    if previous.is_some_and(|p| p >= at) {
        return Ok(());
    }
    let since = previous.map_or(at, |p| p.plus(SAMPLE_EVERY));
    let jobs = service.store.live_job_counts().await?;
    let runners = service.store.live_runner_counts().await?;
    let queue_times = service.store.queue_times(since, STARTS_READ).await?;
    let waiting = service
        .waiting
        .lock()
        .map(|w| w.clone())
        .unwrap_or_default();
    let seconds = (now.as_millis() - since.as_millis()) / 1000;
    let config = service.config();
    let samples = samples(
        &config,
        Observed {
            jobs: &jobs,
            runners: &runners,
            queue_times,
            waiting: &waiting,
        },
        at,
        // The first round of a lead bills one minute.
        if previous.is_some() {
            seconds
        } else {
            SAMPLE_EVERY.as_secs() as i64
        },
    );
    service.store.record_pool_samples(&samples).await?;
    if let Ok(mut last) = last.lock() {
        *last = Some(at);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{PoolConfig, ProviderConfig};

    /// A pool's stopped runners are counted apart, and billed at their
    /// provider's stopped price (their disk), not its running price.
    #[test]
    fn stopped_runners_are_counted_and_billed_at_their_stopped_price() {
        let config = Config {
            pools: vec![PoolConfig {
                name: "linux".into(),
                labels: vec!["linux".into()],
                max_stopped: 2,
                ..PoolConfig::default()
            }],
            providers: vec![ProviderConfig {
                name: "cloud".into(),
                price_per_hour: 0.36,
                resume_seconds: Some(20.0),
                stopped_price_per_hour: Some(0.018),
                ..ProviderConfig::default()
            }],
            ..Config::default()
        };
        let count = |state: RunnerState, count: u64| RunnerCount {
            pool: "linux".into(),
            provider: "cloud".into(),
            state,
            count,
        };
        let runners = [count(RunnerState::Idle, 1), count(RunnerState::Stopped, 2)];
        let waiting = BTreeMap::new();
        let observed = Observed {
            jobs: &[],
            runners: &runners,
            queue_times: Vec::new(),
            waiting: &waiting,
        };
        let sample = &samples(&config, observed, Timestamp::from_millis(3_600_000), 60)
            .into_iter()
            .next()
            .unwrap();
        assert_eq!((sample.stopped, sample.idle, sample.booting), (2, 1, 0));
        // A minute: one idle runner at $0.36 an hour, two stopped at $0.018.
        assert_eq!(sample.cost_micros, (360_000 + 2 * 18_000) / 60);
    }
}
