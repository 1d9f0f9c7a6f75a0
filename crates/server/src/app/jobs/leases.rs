//! Leases: a job whose holder is lost goes back to the queue, and the sweep
//! that finds expired leases.

use super::*;

/// The machine of `runner`, which holds job `job`, is gone: in one
/// transaction the runner crashes (`crash`, the observed event) and the job
/// goes back to the queue at once (or fails at `max_attempts`), as its
/// lease's expiry would conclude later. `None` when the job is no longer
/// the runner's (it moved on meanwhile); the caller then applies the
/// runner's event alone.
pub async fn holder_lost(
    service: &Service,
    job: runway_core::JobId,
    runner: runway_core::RunnerId,
    crash: &runway_core::RunnerEvent,
    now: Timestamp,
) -> Result<Option<runway_store::Moved>, StoreError> {
    let change = |_: &runway_core::Job,
                  _: &runway_core::Job,
                  current: &runway_core::Runner,
                  now: Timestamp| { Ok(current.apply(crash, now).ok()) };
    let moved = match service
        .store
        .move_job_and_runner(
            job,
            &JobEvent::HolderLost { runner },
            Some(runner),
            &change,
            now,
        )
        .await
    {
        Ok(moved) => moved,
        Err(StoreError::JobTransition(_) | StoreError::JobNotFound(_)) => return Ok(None),
        Err(other) => return Err(other),
    };
    tracing::info!(
        target: "runway::events",
        event = "holder_lost",
        job = %job,
        runner = %runner,
        now = %moved.job.state,
        attempts = moved.job.attempts
    );
    service.job_queued(&moved.job);
    service.want_reconcile();
    Ok(Some(moved))
}

/// Puts every job whose lease expired by `now` back in the queue (or fails
/// it at `max_attempts`), marks the runner of a job that was running as
/// crashed, and wakes long pollers. Returns how many jobs it moved.
pub async fn sweep_leases(service: &Service, now: Timestamp) -> Result<usize, StoreError> {
    // Each job with its runner in one transaction (the store's sweep).
    let expired = service.store.expire_leases(now).await?;
    for moved in &expired {
        tracing::info!(
            target: "runway::events",
            event = "lease_expired",
            job = %moved.was.id,
            // Silent before it accepted: as if that runner declined.
            declined = moved.was.state == runway_core::JobState::Provisioning,
            was = %moved.was.state,
            now = %moved.job.state,
            attempts = moved.job.attempts
        );
        if moved.runner_crashed {
            service
                .metrics
                .runners_crashed
                .get_or_create(&PoolLabel {
                    pool: moved.was.pool.clone().unwrap_or_default(),
                })
                .inc();
        }
    }
    for moved in &expired {
        service.job_queued(&moved.job);
    }
    if !expired.is_empty() {
        service.want_reconcile();
    }
    Ok(expired.len())
}
