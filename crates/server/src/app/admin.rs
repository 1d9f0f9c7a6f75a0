//! The admin API's changes: cancel and retry a job, drain and terminate a
//! runner, pause and resume a pool. Each checks what it may change, makes
//! the change through the store's compare-and-set (a job and its runner in
//! one transaction), and records who did what in the audit trail and the
//! event log. A refusal changes nothing and says why.

use runway_core::job::{NewJob, Route};
use runway_core::{
    Job, JobEvent, JobId, JobSource, JobState, Runner, RunnerEvent, RunnerId, RunnerState,
    Timestamp,
};
use runway_store::{AuditEntry, StoreError};
use serde_json::{json, Value};

use crate::app::{AppError, ErrorKind, Service};
use crate::clock::now;

tokio::task_local! {
    /// Through what a change came (`console`, `cli`, `api`), set for each
    /// request by the HTTP layer (`http::channel`); changes runway makes
    /// itself, or a SIGHUP's reload, have none set.
    pub static CHANNEL: &'static str;
}

/// The channel of the change being made (`runway` outside a request).
pub fn channel() -> &'static str {
    CHANNEL.try_with(|channel| *channel).unwrap_or("runway")
}

/// Records `action` on `target` by `actor` in the audit trail and the
/// event log, with the channel it came through (`details.channel`). The
/// change is already made: a trail that cannot be written is logged, not
/// turned into a failure of the change.
pub async fn audit(
    service: &Service,
    actor: &str,
    action: &str,
    target: &str,
    mut details: Value,
    at: Timestamp,
) {
    if let Value::Object(fields) = &mut details {
        fields
            .entry("channel")
            .or_insert_with(|| Value::from(channel()));
    }
    let entry = AuditEntry {
        id: 0,
        at,
        actor: actor.to_owned(),
        action: action.to_owned(),
        target: target.to_owned(),
        details: details.to_string(),
    };
    if let Err(error) = service.store.add_audit(&entry).await {
        service.store_failed("add_audit");
        tracing::error!(%error, actor, action, target, "cannot record the audit entry");
    }
    tracing::info!(target: "runway::audit", actor, action, subject = target, %details, "admin change");
    service.events.emit(
        "audit",
        json!({"actor": actor, "action": action, "target": target, "details": details}),
        at,
    );
}

fn conflict(message: impl Into<String>) -> AppError {
    AppError::new(ErrorKind::Conflict, "invalid_transition", message)
}

async fn job(service: &Service, id: JobId) -> Result<Job, AppError> {
    service
        .store
        .get_job(id)
        .await
        .map_err(|e| AppError::store(service, "get_job", e))?
        .ok_or_else(|| AppError::not_found(format!("no job {id}")))
}

async fn runner(service: &Service, id: RunnerId) -> Result<Runner, AppError> {
    service
        .store
        .get_runner(id)
        .await
        .map_err(|e| AppError::store(service, "get_runner", e))?
        .ok_or_else(|| AppError::not_found(format!("no runner {id}")))
}

/// Runner `id`, refused when it is already stopping or gone.
async fn live_runner(service: &Service, id: RunnerId) -> Result<Runner, AppError> {
    let current = runner(service, id).await?;
    if current.state.is_terminal() || current.state == RunnerState::Terminating {
        return Err(conflict(format!(
            "runner {id} is {}; it is already stopping or gone",
            current.state
        )));
    }
    Ok(current)
}

/// Cancels a queued, provisioning or running job. Its runner, if it runs
/// it, is free again (or stops, ephemeral) in the same transaction; a
/// runway agent learns it at its next heartbeat and stops the job.
pub async fn cancel_job(
    service: &Service,
    actor: &str,
    id: JobId,
    reason: Option<String>,
) -> Result<Job, AppError> {
    let current = job(service, id).await?;
    if current.state.is_terminal() {
        return Err(conflict(format!(
            "job {id} is {}, which is final; only a queued, provisioning or running job can be cancelled",
            current.state
        )));
    }
    let reason = reason
        .filter(|r| !r.trim().is_empty())
        .unwrap_or_else(|| format!("cancelled by {actor}"));
    let now = now();
    let finish = |_: &Job, after: &Job, runner: &Runner, now: Timestamp| {
        Ok(runway_core::moves::finish(
            after,
            runner,
            service.stops_after_its_job(runner),
            now,
        ))
    };
    let moved = service
        .store
        .move_job_and_runner(
            id,
            &JobEvent::Cancel {
                reason: reason.clone(),
            },
            None,
            &finish,
            now,
        )
        .await
        .map_err(|e| AppError::transition(service, "cancel", e))?;
    service.runner_moved(moved.runner.as_ref());
    service.want_reconcile();
    audit(
        service,
        actor,
        "job.cancel",
        &format!("job {id}"),
        json!({"was": current.state.as_str(), "reason": reason, "runner": current.runner.map(|r| r.0)}),
        now,
    )
    .await;
    Ok(moved.job)
}

/// A failed or cancelled runway-API job again, as a new job with the same
/// labels and script (a finished job never changes): routed by today's
/// configuration, queued at the tail.
pub async fn retry_job(service: &Service, actor: &str, id: JobId) -> Result<Job, AppError> {
    let current = job(service, id).await?;
    if current.source != JobSource::Api {
        return Err(AppError::new(
            ErrorKind::Conflict,
            "not_retryable",
            format!(
                "job {id} came from {}; only jobs of runway's own job API can be retried (GitHub re-runs its own)",
                current.source.as_str()
            ),
        ));
    }
    if !matches!(current.state, JobState::Failed | JobState::Cancelled) {
        return Err(AppError::new(
            ErrorKind::Conflict,
            "not_retryable",
            format!(
                "job {id} is {}; only a failed or cancelled job can be retried",
                current.state
            ),
        ));
    }
    let config = service.config();
    let pool = crate::app::jobs::route(&config, &current.labels)?;
    let new_job = NewJob {
        source: JobSource::Api,
        external_id: crate::app::tokens::new_token(&format!("retry-{id}-")),
        route: Route::Pool(pool.clone()),
        labels: current.labels.clone(),
        payload: current.payload.clone(),
        max_attempts: config.queue.max_attempts,
        // A retry counts against the same key as the job it repeats.
        share: config
            .pool(&pool)
            .map(|pool| pool.share_of(&current.share.key))
            .unwrap_or_else(|| current.share.clone()),
    };
    let now = now();
    let enqueued = service
        .store
        .enqueue(&new_job, now)
        .await
        .map_err(|e| AppError::store(service, "enqueue", e))?;
    service.job_queued(&enqueued.job);
    service.job_arrived();
    audit(
        service,
        actor,
        "job.retry",
        &format!("job {id}"),
        json!({"was": current.state.as_str(), "new_job": enqueued.job.id.0, "pool": pool}),
        now,
    )
    .await;
    Ok(enqueued.job)
}

/// Drains a runner: it takes no new job; idle or booting, it stops now;
/// busy, once its job is over.
pub async fn drain_runner(
    service: &Service,
    actor: &str,
    id: RunnerId,
) -> Result<Runner, AppError> {
    let current = live_runner(service, id).await?;
    let now = now();
    let drained = service
        .store
        .apply_runner_event(id, &RunnerEvent::DrainRequested, now)
        .await
        .map_err(|e| AppError::transition(service, "drain", e))?;
    service.runner_moved(Some(&drained));
    audit(
        service,
        actor,
        "runner.drain",
        &format!("runner {id}"),
        json!({"name": drained.name, "was": current.state.as_str(), "now": drained.state.as_str()}),
        now,
    )
    .await;
    Ok(drained)
}

/// Terminates a runner now. An idle or booting one always; a busy one only
/// with `force`, which cancels its job in the same transaction (the
/// machine is deleted under it).
pub async fn terminate_runner(
    service: &Service,
    actor: &str,
    id: RunnerId,
    force: bool,
) -> Result<Runner, AppError> {
    let current = live_runner(service, id).await?;
    let now = now();
    let busy = current.state == RunnerState::Busy;
    if busy && !force {
        let job = current
            .job
            .map(|job| format!("job {job}"))
            .unwrap_or_else(|| "a job".to_owned());
        return Err(AppError::new(
            ErrorKind::Conflict,
            "runner_busy",
            format!(
                "runner {id} is running {job}; runway never stops a busy runner unless told to: pass force (its job is cancelled), or drain it to stop it after its job"
            ),
        ));
    }
    let terminated = match (busy, current.job) {
        (true, Some(job)) => {
            let stop = |_: &Job, after: &Job, runner: &Runner, now: Timestamp| {
                let free = runway_core::moves::finish(after, runner, false, now)
                    .unwrap_or_else(|| runner.clone());
                free.apply(&RunnerEvent::TerminateRequested, now)
                    .map(Some)
                    .map_err(StoreError::from)
            };
            let reason = format!("runner {} was terminated by {actor}", current.name);
            service
                .store
                .move_job_and_runner(job, &JobEvent::Cancel { reason }, Some(id), &stop, now)
                .await
                .map_err(|e| AppError::transition(service, "terminate", e))?
                .runner
                .ok_or_else(|| AppError::not_found(format!("no runner {id}")))?
        }
        (true, None) => {
            // Busy with a job runway does not know (GitHub's): free, then stop.
            let free = current
                .apply(&RunnerEvent::JobFinished, now)
                .and_then(|free| free.apply(&RunnerEvent::TerminateRequested, now))
                .map_err(|e| AppError::transition(service, "terminate", e.into()))?;
            let replaced = service
                .store
                .replace_runner(&current, &free)
                .await
                .map_err(|e| AppError::store(service, "replace_runner", e))?;
            if !replaced {
                return Err(AppError::new(
                    ErrorKind::Conflict,
                    "changed",
                    format!("runner {id} changed meanwhile; look again and retry"),
                ));
            }
            free
        }
        (false, _) => service
            .store
            .apply_runner_event(id, &RunnerEvent::TerminateRequested, now)
            .await
            .map_err(|e| AppError::transition(service, "terminate", e))?,
    };
    service.runner_moved(Some(&terminated));
    // Its own long poll, if it waits in one, sees it must stop.
    service.wake_runners(Some(&terminated.pool));
    audit(
        service,
        actor,
        "runner.terminate",
        &format!("runner {id}"),
        json!({"name": terminated.name, "was": current.state.as_str(), "force": force, "job": current.job.map(|j| j.0)}),
        now,
    )
    .await;
    Ok(terminated)
}

/// Pauses (`paused`) or resumes a configured pool. True when that changed
/// something (pausing a paused pool changes nothing and says so).
pub async fn set_pool_paused(
    service: &Service,
    actor: &str,
    pool: &str,
    paused: bool,
) -> Result<bool, AppError> {
    if service.config().pool(pool).is_none() {
        return Err(AppError::not_found(format!(
            "no pool {pool:?} in the configuration"
        )));
    }
    let now = now();
    let changed = service
        .store
        .set_pool_paused(pool, paused.then_some(actor), now)
        .await
        .map_err(|e| AppError::store(service, "set_pool_paused", e))?;
    if changed {
        service.want_reconcile();
        let action = if paused { "pool.pause" } else { "pool.resume" };
        audit(
            service,
            actor,
            action,
            &format!("pool {pool}"),
            json!({}),
            now,
        )
        .await;
    }
    Ok(changed)
}
