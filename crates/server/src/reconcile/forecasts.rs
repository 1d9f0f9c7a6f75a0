//! The predictive pools' forecasts: fed the store's arrivals, asked how many runners to keep warm.

use super::*;

/// A predictive pool's forecast, the settings it was made with, and the
/// newest job it has been fed (`None`: not seeded yet).
pub(super) struct Learning {
    forecast: ArrivalForecast,
    horizon: Duration,
    quantile: f64,
    /// `Some` while the store's history is still being read: the forecast
    /// is not used until it is complete.
    seed: Option<Seed>,
    /// The newest job fed (once seeded).
    newest: JobId,
}

/// A forecast's first read of the store's history, newest first, a
/// bounded number of pages a round, kept compact (a few words a job)
/// until it reaches the history's start and is fed in time order.
#[derive(Default)]
struct Seed {
    /// The next page ends below this id (`None`: the newest).
    before: Option<JobId>,
    /// The newest id when the read began: later jobs are read after it.
    newest: Option<JobId>,
    done: bool,
    /// (created at, (run id, workflow's index), key's index) of the
    /// pool's jobs: workflow names and fair-share keys (repositories) are
    /// kept once each, in `names`.
    jobs: Vec<SeedJob>,
    names: Vec<String>,
    /// Index of each name in `names`.
    name_index: std::collections::HashMap<String, u32>,
}

/// A job of a seed: when it was created, its workflow run (id and the
/// workflow's index in `Seed::names`) and its key's index there.
type SeedJob = (Timestamp, Option<(u64, u32)>, u32);

/// Jobs read a page at a time.
const JOB_PAGE: u32 = 1_000;

/// A GitHub job's workflow run (id and workflow name), from the facts
/// intake stored with it.
fn run_of(job: &runway_core::Job) -> Option<(u64, String)> {
    if job.source != runway_core::JobSource::Github {
        return None;
    }
    crate::app::intake::GithubFacts::parse(&job.payload).run()
}

/// A seed reads at most this many pages of 1,000 jobs a round, so a long
/// history spreads over rounds instead of holding one up.
const SEED_PAGES: usize = 20;

impl Seed {
    fn name(&mut self, name: &str) -> u32 {
        if let Some(index) = self.name_index.get(name) {
            return *index;
        }
        let next = self.names.len() as u32;
        self.names.push(name.to_owned());
        self.name_index.insert(name.to_owned(), next);
        next
    }
}

impl Inner {
    /// What a predictive pool's forecast expects at `now` (at its own
    /// quantile, or at `quantile`); `None` for a pool that is not
    /// predictive, or whose forecast is still being seeded.
    fn explained(
        &self,
        pool: &PoolConfig,
        now: Timestamp,
        quantile: Option<f64>,
    ) -> Option<runway_core::forecast::Expected> {
        let mut forecasts = self.forecasts.lock().ok()?;
        let learning = forecasts.get_mut(&pool.name)?;
        if learning.seed.is_some() {
            return None;
        }
        Some(match quantile {
            Some(quantile) => learning.forecast.explain_at(now, quantile),
            None => learning.forecast.explain(now),
        })
    }

    /// The arrivals a predictive pool's stock is sized for
    /// (`runway_core::stopped::stock_expected`, at the stopped quantile);
    /// 0 for the others, which keep `min_stopped`.
    pub(super) fn stock_expected(&self, pool: &PoolConfig, now: Timestamp) -> u32 {
        let fraction = self
            .service
            .config()
            .stopping_provider(pool)
            .map_or(1.0, |p| p.stopped_fraction());
        let quantile = runway_core::stopped::quantile_for(pool.wait_value, fraction);
        self.explained(pool, now, Some(quantile))
            .map_or(0, |expected| {
                runway_core::stopped::stock_expected(&expected)
            })
    }

    /// How many idle runners `pool` keeps warm: `min_idle`, or with the
    /// predictive policy the arrivals expected within one boot time and a
    /// round.
    pub(super) fn warm(&self, pool: &PoolConfig, now: Timestamp) -> u32 {
        let forecast = self.explained(pool, now, None);
        let Some(forecast) = forecast else {
            if let Ok(mut warm) = self.service.warm.lock() {
                warm.remove(&pool.name); // Not (or no longer) predictive.
            }
            return pool.min_idle.min(pool.max_runners);
        };
        // A pool that keeps stopped runners keeps its warm pool stopped
        // (`stock_expected`), not idle: idle only to `min_idle`, as
        // `runway sim`'s `predictive+stopped` does.
        let keeps_stock =
            pool.max_stopped > 0 && self.service.config().stopping_provider(pool).is_some();
        let target = if keeps_stock {
            pool.min_idle.min(pool.max_runners)
        } else {
            forecast.jobs.max(pool.min_idle).min(pool.max_runners)
        };
        if let Ok(mut warm) = self.service.warm.lock() {
            warm.insert(
                pool.name.clone(),
                crate::app::Warm {
                    target,
                    forecast,
                    at: now,
                },
            );
        }
        target
    }

    /// A predictive pool's forecast settings: it looks one boot time and a
    /// round ahead (its first provider's, or the first provider's, longest
    /// boot time and the scaling interval), at the pool's quantile.
    fn forecast_settings(&self, pool: &PoolConfig) -> Option<(Duration, f64)> {
        let quantile = pool.predictive_quantile()?;
        let config = self.service.config();
        let first = self.providers().by_name.keys().next().cloned();
        let boot = pool
            .providers
            .first()
            .cloned()
            .or(first)
            .and_then(|name| config.providers.iter().find(|p| p.name == name))
            .map(|p| Duration::from_secs_f64(p.boot_seconds.0.max(p.boot_seconds.1).max(0.0)))
            .unwrap_or(Duration::from_secs(150));
        Some((boot + config.scaling.interval, quantile))
    }

    /// Feeds each predictive pool's forecast the jobs routed to it since
    /// the last round, read from the store (so a leader learns every
    /// replica's arrivals, not only its own intake's), with GitHub's
    /// workflow runs. A new forecast — a start, a new leader, a pool made
    /// predictive (or retuned) by a reload — first reads the store's last
    /// four weeks, so a restart does not forget what a pool's weeks look
    /// like: at most [`SEED_PAGES`] pages a round, so a long history
    /// spreads over rounds (the pool keeps `min_idle` until it is read)
    /// instead of holding one up. Then, newest first through the id index
    /// down to the last job fed, a round reads only what is new. A PostgreSQL
    /// transaction that commits after a later id was read is missed: one
    /// arrival short in a statistical forecast.
    pub(super) async fn learn_arrivals(&self, now: Timestamp) -> Result<(), StoreError> {
        let wanted: BTreeMap<String, (Duration, f64)> = self
            .service
            .config()
            .pools
            .iter()
            .filter_map(|pool| Some((pool.name.clone(), self.forecast_settings(pool)?)))
            .collect();
        let pools: Vec<String> = match self.forecasts.lock() {
            Ok(mut forecasts) => {
                forecasts.retain(|pool, learning| {
                    wanted.get(pool) == Some(&(learning.horizon, learning.quantile))
                });
                for (pool, (horizon, quantile)) in &wanted {
                    forecasts.entry(pool.clone()).or_insert_with(|| Learning {
                        forecast: ArrivalForecast::new(*horizon, *quantile),
                        horizon: *horizon,
                        quantile: *quantile,
                        seed: Some(Seed::default()),
                        newest: JobId(0),
                    });
                }
                forecasts.keys().cloned().collect()
            }
            Err(_) => return Ok(()),
        };
        for pool in pools {
            let seed = self
                .forecasts
                .lock()
                .ok()
                .and_then(|mut f| f.get_mut(&pool).and_then(|l| l.seed.take()));
            if let Some(seed) = seed {
                let seed = self.read_history(&pool, seed, now).await?;
                let Ok(mut forecasts) = self.forecasts.lock() else {
                    return Ok(());
                };
                let Some(learning) = forecasts.get_mut(&pool) else {
                    continue;
                };
                if !seed.done {
                    learning.seed = Some(seed);
                    continue;
                }
                for (at, run, key) in seed.jobs.iter().rev() {
                    let run = run.map(|(id, w)| (id, seed.names[w as usize].as_str()));
                    let key = seed.names[*key as usize].as_str();
                    learning.forecast.observe_job(*at, run, key);
                }
                learning.newest = seed.newest.unwrap_or(JobId(0));
                tracing::info!(pool = %pool, jobs = seed.jobs.len(), "predictive forecast seeded from the store");
            }
            let after = match self.forecasts.lock() {
                Ok(forecasts) => match forecasts.get(&pool) {
                    Some(learning) => learning.newest,
                    None => continue,
                },
                Err(_) => return Ok(()),
            };
            let (seen, newest) = self.jobs_after(&pool, after).await?;
            if let Ok(mut forecasts) = self.forecasts.lock() {
                if let Some(learning) = forecasts.get_mut(&pool) {
                    for (at, run, key) in &seen {
                        let run = run.as_ref().map(|(id, w)| (*id, w.as_str()));
                        learning.forecast.observe_job(*at, run, key);
                    }
                    learning.newest = newest;
                }
            }
        }
        Ok(())
    }

    /// Reads up to [`SEED_PAGES`] more pages of `pool`'s history into
    /// `seed`, newest first, down to the forecast's history start. Walks
    /// every pool's jobs (the window of ids bounds it; a pool filter could
    /// scan the whole table for a pool with no jobs) and keeps the pool's.
    async fn read_history(
        &self,
        pool: &str,
        mut seed: Seed,
        now: Timestamp,
    ) -> Result<Seed, StoreError> {
        let since = now.minus(runway_core::forecast::HISTORY);
        for _ in 0..SEED_PAGES {
            let page = self
                .store()
                .list_jobs(&runway_store::JobFilter {
                    before: seed.before,
                    newest_first: true,
                    limit: Some(JOB_PAGE),
                    ..runway_store::JobFilter::default()
                })
                .await?;
            let Some(last) = page.last() else {
                seed.done = true;
                return Ok(seed);
            };
            seed.before = Some(last.id);
            seed.newest = seed.newest.max(page.first().map(|job| job.id));
            for job in &page {
                // Ids follow first sight: the rest is older.
                if job.created_at < since {
                    seed.done = true;
                    return Ok(seed);
                }
                if job.pool.as_deref() == Some(pool) {
                    let run = run_of(job).map(|(id, w)| (id, seed.name(&w)));
                    let key = seed.name(&job.share.key);
                    seed.jobs.push((job.created_at, run, key));
                }
            }
            if page.len() < JOB_PAGE as usize {
                seed.done = true;
                return Ok(seed);
            }
        }
        Ok(seed)
    }

    /// `pool`'s jobs after job `after`, oldest first, with their workflow
    /// runs, and the newest id read: a range of the id key.
    #[allow(clippy::type_complexity)]
    async fn jobs_after(
        &self,
        pool: &str,
        after: JobId,
    ) -> Result<(Vec<(Timestamp, Option<(u64, String)>, String)>, JobId), StoreError> {
        let mut seen = Vec::new();
        let mut newest = after;
        let mut before = None;
        loop {
            let page = self
                .store()
                .list_jobs(&runway_store::JobFilter {
                    pool: Some(pool.to_owned()),
                    before,
                    after: Some(after),
                    newest_first: true,
                    limit: Some(JOB_PAGE),
                    ..runway_store::JobFilter::default()
                })
                .await?;
            let Some(last) = page.last() else { break };
            before = Some(last.id);
            newest = newest.max(page[0].id);
            seen.extend(
                page.iter()
                    .map(|job| (job.created_at, run_of(job), job.share.key.clone())),
            );
            if page.len() < JOB_PAGE as usize {
                break;
            }
        }
        seen.sort_by_key(|(at, _, _)| *at);
        Ok((seen, newest))
    }
}
