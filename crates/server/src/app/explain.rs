//! "Why is my job waiting?": the production planner, run over the store's
//! view of a pool, says for every queued job what it waits for.

use runway_core::planner::{
    plan, Offer, PoolPolicy, PoolSnapshot, QueuedJob, RunnerView, Snapshot, WaitReason, Waiting,
};
use std::collections::{BTreeMap, BTreeSet};

use runway_core::{Job, JobId, JobState, Timestamp};
use runway_store::{JobFilter, StoreError};

use crate::app::{worker_configs, Service};
use crate::clock::now;
use crate::config::PoolConfig;

/// The planner's policy for `pool`; `scaling_ratio` is the one its worker
/// configuration gives, if any (`Config::scaling_ratio`).
pub fn policy(pool: &PoolConfig, paused: bool, scaling_ratio: f64) -> PoolPolicy {
    PoolPolicy {
        name: pool.name.clone(),
        min_idle: pool.min_idle,
        max_runners: pool.max_runners,
        scaling_ratio,
        idle_grace: pool.idle_grace,
        boot_timeout: pool.boot_timeout,
        providers: pool.providers.clone(),
        paused,
        delete_surplus_boots: pool.surplus_boots == crate::config::SurplusBoots::Delete,
    }
}

/// How many of a pool's queued jobs, in queue order, the planner lists (and
/// gives each a wait reason). The rest are counted, not read: they count
/// towards demand all the same (`PoolSnapshot::unlisted`), and each waits
/// for what the last listed one waits for (it is further back). So
/// a round costs the same with a queue of a thousand or of a million.
pub const LISTED_QUEUE: u32 = 1_000;

/// A pool as the planner sees it, from the store, with the given offers.
pub async fn pool_snapshot(
    service: &Service,
    pool: &PoolConfig,
    offers: Vec<Offer>,
) -> Result<PoolSnapshot, StoreError> {
    let queued = service
        .store
        .list_jobs(&JobFilter {
            state: Some(JobState::Queued),
            pool: Some(pool.name.clone()),
            limit: Some(LISTED_QUEUE),
            ..JobFilter::default()
        })
        .await?;
    let unlisted = if queued.len() as u32 == LISTED_QUEUE {
        let total = service.store.queued_count(&pool.name).await?;
        u32::try_from(total.saturating_sub(u64::from(LISTED_QUEUE))).unwrap_or(u32::MAX)
    } else {
        0
    };
    // A scale-set pool: GitHub's count of jobs assigned to the scale set
    // and not yet running is demand too, should the store have fewer
    // (a job acquired before runway held the session, say).
    let unlisted = unlisted.saturating_add(
        pool.github
            .as_ref()
            .filter(|github| github.scale_set.is_some())
            .and_then(|_| service.scale_sets.get(&pool.name))
            .and_then(|handle| handle.statistics())
            .map(|(statistics, _)| {
                beyond_stored(&statistics, queued.len() as u64 + u64::from(unlisted))
            })
            .unwrap_or(0),
    );
    // Under a cap on one key's running jobs, a key's jobs beyond its room
    // wait and count for no runner.
    let (queued, unlisted, held) = match pool.max_running_per_key() {
        None => (queued, unlisted, Vec::new()),
        Some(cap) => {
            let counts = service.store.share_counts(&pool.name).await?;
            let active = runway_store::ShareCount::active_by_key(&counts);
            let (stay, held) = runway_core::planner::hold_by_cap(
                queued.iter().map(|job| (job.id, job.share.key.as_str())),
                &active,
                cap,
            );
            // Of the jobs beyond the listed queue, those past their key's
            // room are held too: counted out of demand.
            let excess: u64 = counts
                .iter()
                .map(|c| {
                    c.queued
                        .saturating_sub(u64::from(cap).saturating_sub(c.active))
                })
                .sum();
            let held_unlisted = excess.saturating_sub(held.len() as u64);
            let unlisted =
                unlisted.saturating_sub(u32::try_from(held_unlisted).unwrap_or(u32::MAX));
            let stay: Vec<Job> = stay.into_iter().map(|i| queued[i].clone()).collect();
            (stay, unlisted, held)
        }
    };
    let runners = service.store.list_live_runners(Some(&pool.name)).await?;
    let config = service.config();
    // A runner started from the stock is ready its provider's
    // `resume_seconds` after its start (`requested_at` then).
    let resume_time = |provider: &str| {
        config
            .providers
            .iter()
            .find(|p| p.name == provider)
            .map(crate::config::ProviderConfig::resume_time)
            .unwrap_or_default()
    };
    let paused = service
        .store
        .paused_pools()
        .await?
        .iter()
        .any(|paused| paused.pool == pool.name);
    let scaling_ratio = worker_configs::scaling_ratio(service, pool).await?;
    Ok(PoolSnapshot {
        unlisted,
        held,
        policy: policy(pool, paused, scaling_ratio),
        queued: queued
            .iter()
            .map(|job| QueuedJob {
                id: job.id,
                enqueued_at: job.enqueued_at,
                attempts: job.attempts,
            })
            .collect(),
        runners: runners
            .iter()
            // Runners only known from webhooks (another system's) are
            // not runway's capacity to plan with, nor is the stock of
            // stopped runners (`runway_core::stopped` plans it).
            .filter(|r| {
                !r.state.is_terminal()
                    && !r.stock
                    && r.origin() != runway_core::RunnerOrigin::External
            })
            .map(|r| RunnerView {
                id: r.id,
                provider: r.provider.clone(),
                state: r.state,
                in_doubt: r.create_in_doubt(),
                requested_at: r.requested_at,
                idle_at: r.idle_at,
                ready_by: r
                    .stopped_at
                    .filter(|_| r.state == runway_core::RunnerState::Provisioning)
                    .map(|_| r.requested_at.plus(resume_time(&r.provider))),
            })
            .collect(),
        offers,
    })
}

/// Jobs GitHub has assigned to a scale set that no runner runs yet, beyond
/// the `stored` queued jobs of its pool: demand the store does not hold.
pub fn beyond_stored(statistics: &crate::github::scaleset::Statistics, stored: u64) -> u32 {
    let waiting = statistics
        .total_assigned_jobs
        .saturating_sub(statistics.total_running_jobs)
        .max(0) as u64;
    u32::try_from(waiting.saturating_sub(stored)).unwrap_or(u32::MAX)
}

/// `pool`'s offers and the providers' backoffs as this replica's latest
/// reconcile round left them (none on a replica that does not lead).
fn latest_round(
    service: &Service,
    pool: &PoolConfig,
) -> (Vec<Offer>, Vec<runway_core::planner::Backoff>) {
    let offers = service
        .offers
        .lock()
        .ok()
        .and_then(|offers| offers.get(&pool.name).cloned())
        .unwrap_or_default();
    let backoffs = service
        .provider_backoffs
        .lock()
        .map(|backoffs| backoffs.clone())
        .unwrap_or_default();
    (offers, backoffs)
}

/// The wait reason of every listed queued job of `pool`, planned with the
/// offers and provider backoffs of this replica's latest round (none on a
/// replica that does not lead, or before the first round), and the reason
/// of the jobs behind the listed ones (that of the last listed). Without
/// the backoffs a job whose every provider is backing off would read "no
/// provider has capacity" instead of the provider's last error.
pub async fn waiting_in_pool(
    service: &Service,
    pool: &PoolConfig,
) -> Result<(Waiting, Option<WaitReason>), StoreError> {
    let (offers, backoffs) = latest_round(service, pool);
    let snapshot = Snapshot {
        pools: vec![pool_snapshot(service, pool, offers).await?],
        backoffs,
    };
    let waiting = plan(&snapshot, now()).waiting;
    let behind = beyond_listed(&snapshot.pools[0], &waiting);
    Ok((waiting, behind))
}

/// What the jobs behind a pool's listed queue wait for: what the last
/// listed job waits for; `None` when every queued job is listed.
pub fn beyond_listed(pool: &PoolSnapshot, waiting: &Waiting) -> Option<WaitReason> {
    if pool.unlisted == 0 {
        return None;
    }
    let last = pool.queued.last()?;
    waiting.get(&last.id).cloned()
}

/// Why a job is where it is, for the API to show.
#[derive(Debug, Clone, PartialEq)]
pub enum Explanation {
    /// Queued in a configured pool; the planner's reason.
    Waiting {
        reason: WaitReason,
        /// Whether any configured provider may start runners for the pool
        /// (without one, it waits for a runner to register itself).
        has_providers: bool,
        /// How bidding chose: the pool's offers in the latest round,
        /// cheapest per unit of reliable capacity first.
        offers: Vec<OfferChoice>,
        /// Why the runner it waits for was kept warm (a predictive pool's
        /// forecast: "… kept warm for the batch expected at 02:00 UTC …").
        warm: Option<String>,
    },
    /// Intake could not route it; intake's reason.
    Unroutable { reason: Option<String> },
    /// Held until GitHub gives its run's facts (issue 58): why, and when
    /// it is given up (`[github] run_facts_wait` after it arrived).
    Held {
        reason: Option<String>,
        gives_up_at: runway_core::Timestamp,
    },
    /// Queued in a pool the configuration no longer has.
    PoolNotConfigured { pool: Option<String> },
}

impl Explanation {
    fn waiting(reason: WaitReason, pool: &PoolConfig, service: &Service) -> Explanation {
        // A pool that names no provider may use any.
        let has_providers = !pool.providers.is_empty() || !service.config().providers.is_empty();
        let (offers, backoffs) = latest_round(service, pool);
        // A job a warm runner takes (or one booting ahead of it): why
        // the pool kept it warm.
        let warm = matches!(
            reason,
            WaitReason::RunnerIdle { .. }
                | WaitReason::RunnerBooting { .. }
                | WaitReason::StoppedRunnerStarting { .. }
        )
        .then(|| {
            service
                .warm
                .lock()
                .ok()
                .and_then(|warm| warm.get(&pool.name).and_then(|w| w.why()))
        })
        .flatten();
        Explanation::Waiting {
            reason,
            has_providers,
            offers: rank_offers(offers, &backoffs, now()),
            warm,
        }
    }
}

/// One offer as bidding saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct OfferChoice {
    pub offer: Offer,
    /// Price per hour ÷ reliability: what the planner ranks by.
    pub cost: f64,
    /// The backoff keeping the planner from it, if any.
    pub backoff: Option<runway_core::planner::Backoff>,
    /// The offer new runners go to first (the cheapest usable one).
    pub chosen: bool,
}

/// `offers` in the planner's order (cost per unit of reliable capacity,
/// then boot time), each with its backoff, the first usable one chosen.
pub fn rank_offers(
    offers: Vec<Offer>,
    backoffs: &[runway_core::planner::Backoff],
    now: Timestamp,
) -> Vec<OfferChoice> {
    let mut ranked: Vec<OfferChoice> = offers
        .into_iter()
        .map(|offer| OfferChoice {
            cost: runway_core::planner::offer_cost(&offer),
            backoff: runway_core::planner::backoff_of(backoffs, &offer, now).cloned(),
            offer,
            chosen: false,
        })
        .collect();
    ranked.sort_by(|a, b| {
        a.cost
            .total_cmp(&b.cost)
            .then(a.offer.boot_time.cmp(&b.offer.boot_time))
    });
    if let Some(first) = ranked
        .iter_mut()
        .find(|c| c.backoff.is_none() && c.offer.capacity > 0)
    {
        first.chosen = true;
    }
    ranked
}

/// Why `job` is where it is, if it is waiting (or was never routed).
pub async fn explain_job(service: &Service, job: &Job) -> Result<Option<Explanation>, StoreError> {
    Ok(explain_jobs(service, std::slice::from_ref(job))
        .await?
        .remove(&job.id))
}

/// [`explain_job`] for many jobs: one planner run per pool they wait in,
/// not one per job.
pub async fn explain_jobs(
    service: &Service,
    jobs: &[Job],
) -> Result<BTreeMap<JobId, Explanation>, StoreError> {
    let config = service.config();
    let mut explained = BTreeMap::new();
    let mut pools = BTreeSet::new();
    for job in jobs {
        match job.state {
            JobState::Unroutable => {
                let reason = job.reason.clone();
                explained.insert(job.id, Explanation::Unroutable { reason });
            }
            JobState::Held => {
                let reason = job.reason.clone();
                let gives_up_at = job.created_at.plus(config.github.run_facts_wait);
                explained.insert(
                    job.id,
                    Explanation::Held {
                        reason,
                        gives_up_at,
                    },
                );
            }
            JobState::Queued => match job.pool.as_deref().and_then(|name| config.pool(name)) {
                Some(pool) => {
                    pools.insert(pool.name.as_str());
                }
                None => {
                    let pool = job.pool.clone();
                    explained.insert(job.id, Explanation::PoolNotConfigured { pool });
                }
            },
            _ => {}
        }
    }
    let wanted: BTreeSet<JobId> = jobs.iter().map(|job| job.id).collect();
    for name in pools {
        let Some(pool) = config.pool(name) else {
            continue;
        };
        let (waiting, behind) = waiting_in_pool(service, pool).await?;
        for (id, reason) in waiting {
            if wanted.contains(&id) {
                explained.insert(id, Explanation::waiting(reason, pool, service));
            }
        }
        if let Some(reason) = behind {
            // Queued further back than the planner lists.
            let behind: Vec<JobId> = jobs
                .iter()
                .filter(|job| {
                    job.state == JobState::Queued
                        && job.pool.as_deref() == Some(name)
                        && !explained.contains_key(&job.id)
                })
                .map(|job| job.id)
                .collect();
            for id in behind {
                explained.insert(id, Explanation::waiting(reason.clone(), pool, service));
            }
        }
    }
    Ok(explained)
}

#[cfg(test)]
mod tests {
    use super::beyond_stored;
    use crate::github::scaleset::Statistics;

    #[test]
    fn github_assigned_jobs_beyond_the_stored_ones_are_demand() {
        let stats = |assigned, running| Statistics {
            total_assigned_jobs: assigned,
            total_running_jobs: running,
            ..Statistics::default()
        };
        // Every waiting job stored: nothing more.
        assert_eq!(beyond_stored(&stats(5, 2), 3), 0);
        assert_eq!(beyond_stored(&stats(5, 2), 7), 0);
        // Two assigned jobs the store does not have.
        assert_eq!(beyond_stored(&stats(5, 0), 3), 2);
        // Odd counts (running above assigned) are no demand.
        assert_eq!(beyond_stored(&stats(1, 4), 0), 0);
    }
}
