//! "Why is my job waiting?": the production planner, run over the store's
//! view of a pool, says for every queued job what it waits for.

use runway_core::planner::{
    plan, Offer, PoolPolicy, PoolSnapshot, QueuedJob, RunnerView, Snapshot, WaitReason, Waiting,
};
use std::collections::{BTreeMap, BTreeSet};

use runway_core::{Job, JobId, JobState};
use runway_store::{JobFilter, StoreError};

use crate::app::Service;
use crate::clock::now;
use crate::config::PoolConfig;

pub fn policy(pool: &PoolConfig, paused: bool) -> PoolPolicy {
    PoolPolicy {
        name: pool.name.clone(),
        min_idle: pool.min_idle,
        max_runners: pool.max_runners,
        scaling_ratio: pool.scaling_ratio,
        idle_grace: pool.idle_grace,
        boot_timeout: pool.boot_timeout,
        providers: pool.providers.clone(),
        paused,
    }
}

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
            ..JobFilter::default()
        })
        .await?;
    let runners = service.store.list_live_runners(Some(&pool.name)).await?;
    let paused = service
        .store
        .paused_pools()
        .await?
        .iter()
        .any(|paused| paused.pool == pool.name);
    Ok(PoolSnapshot {
        unlisted: 0,
        policy: policy(pool, paused),
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
            // not runway's capacity to plan with.
            .filter(|r| !r.state.is_terminal() && r.origin() != runway_core::RunnerOrigin::External)
            .map(|r| RunnerView {
                id: r.id,
                provider: r.provider.clone(),
                state: r.state,
                requested_at: r.requested_at,
                idle_at: r.idle_at,
            })
            .collect(),
        offers,
    })
}

/// The wait reason of every queued job of `pool`, planned without provider
/// offers (for when no reconciler has planned it yet).
pub async fn waiting_in_pool(service: &Service, pool: &PoolConfig) -> Result<Waiting, StoreError> {
    let snapshot = Snapshot {
        pools: vec![pool_snapshot(service, pool, Vec::new()).await?],
        backoffs: Vec::new(),
    };
    Ok(plan(&snapshot, now()).waiting)
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
    },
    /// Intake could not route it; intake's reason.
    Unroutable { reason: Option<String> },
    /// Queued in a pool the configuration no longer has.
    PoolNotConfigured { pool: Option<String> },
}

impl Explanation {
    fn waiting(reason: WaitReason, pool: &PoolConfig, service: &Service) -> Explanation {
        // A pool that names no provider may use any.
        let has_providers = !pool.providers.is_empty() || !service.config().providers.is_empty();
        Explanation::Waiting {
            reason,
            has_providers,
        }
    }
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
        for (id, reason) in waiting_in_pool(service, pool).await? {
            if wanted.contains(&id) {
                explained.insert(id, Explanation::waiting(reason, pool, service));
            }
        }
    }
    Ok(explained)
}
