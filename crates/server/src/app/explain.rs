//! "Why is my job waiting?": the production planner, run over the store's
//! view of a pool, says for every queued job what it waits for.

use runway_core::planner::{
    plan, Offer, PoolPolicy, PoolSnapshot, QueuedJob, RunnerView, Snapshot, WaitReason, Waiting,
};
use runway_core::{Job, JobState};
use runway_store::{JobFilter, StoreError};
use serde_json::{json, Value};

use crate::app::Service;
use crate::clock::now;
use crate::clock::rfc3339;
use crate::config::PoolConfig;

pub fn policy(pool: &PoolConfig) -> PoolPolicy {
    PoolPolicy {
        name: pool.name.clone(),
        min_idle: pool.min_idle,
        max_runners: pool.max_runners,
        scaling_ratio: pool.scaling_ratio,
        idle_grace: pool.idle_grace,
        boot_timeout: pool.boot_timeout,
        providers: pool.providers.clone(),
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
    Ok(PoolSnapshot {
        policy: policy(pool),
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

/// A reason as the API shows it: a stable code and its details.
pub fn reason_json(reason: &WaitReason, pool: Option<&PoolConfig>) -> Value {
    let details = match reason {
        WaitReason::RunnerIdle { runner } => json!({ "runner": runner.0 }),
        WaitReason::RunnerBooting { runner, since } => {
            json!({ "runner": runner.0, "since": rfc3339(*since) })
        }
        WaitReason::RunnerRequested { provider } => json!({ "provider": provider }),
        WaitReason::AtMaxRunners { max_runners } => json!({ "max_runners": max_runners }),
        WaitReason::ProviderBackoff {
            provider,
            last_error,
            retry_at,
        } => {
            json!({ "provider": provider, "last_error": last_error, "retry_at": rfc3339(*retry_at) })
        }
        WaitReason::NoProviderCapacity => {
            let configured = pool.map(|p| !p.providers.is_empty()).unwrap_or(false);
            json!({
                "hint": if configured {
                    "the pool's providers have no quota left"
                } else {
                    "no runner can start for this pool yet: register one (runway agent) or configure a provider"
                }
            })
        }
        WaitReason::ScalingRatio { scaling_ratio } => json!({ "scaling_ratio": scaling_ratio }),
        WaitReason::LeaseExpiredRequeued { attempts } => json!({ "attempts": attempts }),
    };
    json!({ "code": reason.code(), "details": details })
}

/// The explanation of a job intake could not route.
pub fn unroutable_json(job: &Job) -> Value {
    json!({ "code": "unroutable", "details": { "reason": job.reason } })
}

/// Why `job` is where it is, if it is waiting (or was never routed).
pub async fn explain_job(service: &Service, job: &Job) -> Result<Option<Value>, StoreError> {
    match job.state {
        JobState::Unroutable => Ok(Some(unroutable_json(job))),
        JobState::Queued => {
            let Some(pool) = job
                .pool
                .as_deref()
                .and_then(|name| service.config.pool(name))
            else {
                return Ok(Some(json!({
                    "code": "pool_not_configured",
                    "details": { "pool": job.pool, "hint": "the job's pool is no longer in the configuration" },
                })));
            };
            let waiting = waiting_in_pool(service, pool).await?;
            Ok(waiting
                .get(&job.id)
                .map(|reason| reason_json(reason, Some(pool))))
        }
        _ => Ok(None),
    }
}
