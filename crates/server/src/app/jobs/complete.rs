//! Completion: a runner ends the job it runs, its runner freed (or
//! stopping) in the same write, and, asked, its next job started.

use std::sync::Arc;

use runway_core::{Conclusion, Job, JobEvent, JobId, Runner, Timestamp};
use runway_store::{Claim, ClaimStart, StoreError};
use serde_json::json;

use super::{api_job, assigned, next_claim, started, Assigned, MAX_LOG_TAIL};
use crate::app::tokens::ByToken;
use crate::app::{AppError, ErrorKind, Service};
use crate::clock::now;
use crate::telemetry::metrics::JobConclusionLabels;

/// How a runner ended a job.
#[derive(Debug, Clone)]
pub struct Completion {
    pub conclusion: Conclusion,
    pub exit_code: Option<i64>,
    /// The end of the job's output; only the last [`MAX_LOG_TAIL`] bytes are kept.
    pub log_tail: String,
}

/// The last `MAX_LOG_TAIL` bytes of `log`, cut at a character boundary.
fn tail(log: &str) -> &str {
    if log.len() <= MAX_LOG_TAIL {
        return log;
    }
    let mut start = log.len() - MAX_LOG_TAIL;
    while !log.is_char_boundary(start) {
        start += 1;
    }
    &log[start..]
}

/// Ends job `id` that `runner` holds: the job and its runner move in one
/// write with the job's log, so the runner is free (or, ephemeral,
/// stopping) exactly when its job is over and an acknowledged completion
/// has its log. With `next`, the runner's next job starts in the same
/// write when one is queued and the runner can take it (not stopping, not
/// draining): one write a job for a runner that works through a queue.
/// No long poll: without a queued job the runner asks `jobs/request`.
///
/// `asked`: the runner as the call's token named it. A remembered one
/// (`Service::renewals`) is proven by the one statement's compare-and-set
/// of its version; where that does not hold, it is read again by the
/// token, and the completion decided again on that.
pub async fn complete(
    service: &Service,
    asked: ByToken,
    id: JobId,
    completion: &Completion,
    next: bool,
) -> Result<(Job, Option<Assigned>), AppError> {
    let ByToken {
        mut runner,
        token_hash,
        mut remembered,
    } = asked;
    loop {
        let Some((job, after, assigned)) =
            complete_as(service, &runner, remembered, id, completion, next).await?
        else {
            remembered = false;
            runner = crate::app::tokens::read_again(service, &token_hash).await?;
            continue;
        };
        // As written: what its next poll's start checks. Not known
        // (its next job started apart): read by the token next time.
        match after {
            Some(after) => {
                let at = std::time::Instant::now();
                service.renewals.put(&token_hash, Arc::new(after), at);
            }
            None => service.renewals.forget(&token_hash),
        }
        return Ok((job, assigned));
    }
}

/// [`complete`] for `runner` as it was named: the job, the runner as
/// written (if known), and the runner's next job; `None`, and nothing
/// written, when `remembered` and the one statement did not hold.
async fn complete_as(
    service: &Service,
    runner: &Runner,
    remembered: bool,
    id: JobId,
    completion: &Completion,
    next: bool,
) -> Result<Option<(Job, Option<Runner>, Option<Assigned>)>, AppError> {
    let now = now();
    let conclusion = completion.conclusion;
    let terminate = service.stops_after_its_job(runner);
    let event = JobEvent::Complete {
        runner: runner.id,
        conclusion,
    };
    let log = tail(&completion.log_tail);
    let claim = next_claim(service, runner, None);
    // The hot path: one statement ends the job (if this runner runs it),
    // frees or stops the runner (if it is still the row this request
    // authenticated with), stores the log and, asked, starts the next job,
    // all or nothing. Anything else takes the general path below.
    let hot = match (
        event.guarded(now),
        runway_core::moves::finish_by_id(id, runner, terminate, now),
    ) {
        (Some(change), Some(free)) if next => service
            .store
            .complete_and_start_next(
                id,
                &change,
                (runner, &free),
                Some((completion.exit_code, log)),
                &claim,
                now,
            )
            .await
            .map_err(|e| AppError::transition(service, "complete", e))?
            .map(|(moved, started)| (moved.job, moved.runner, free, started)),
        (Some(change), Some(free)) => service
            .store
            .apply_guarded_with_runner(
                id,
                &change,
                (runner, &free),
                Some((completion.exit_code, log)),
            )
            .await
            .map_err(|e| AppError::transition(service, "complete", e))?
            .map(|moved| (moved.job, moved.runner, free, None)),
        _ => None,
    };
    let (job, after, free, started_job) = match hot {
        Some(done) => done,
        // Not proven: decided again on the runner as its token names it.
        None if remembered => return Ok(None),
        None => {
            let log = (completion.exit_code, log);
            let moved =
                complete_in_general(service, runner, (id, &event), log, terminate, now).await?;
            let after = moved.runner;
            let free = after.clone().unwrap_or_else(|| runner.clone());
            let started_job = match next {
                true => start_now(service, &free, &claim, now).await?,
                false => None,
            };
            // Started apart, the runner is no longer the row moved.
            let after = after.filter(|_| started_job.is_none());
            (moved.job, after, free, started_job)
        }
    };
    completed(service, Some(&free), &job, conclusion, now);
    if claim.max_running_per_key.is_some() && job.state.is_terminal() {
        // Under a cap, this job's end may free its key's next: the pool's
        // waiting runners look again (a wake-up per job would not know
        // which key is now free).
        service.waiters.wake_all(Some(&claim.pool));
    }
    let assigned = started_job.map(|started_job| {
        started(service, &free, &started_job, now);
        assigned(started_job, claim.lease)
    });
    Ok(Some((job, after, assigned)))
}

/// One attempt to start `runner`'s next job, without waiting: the job, or
/// `None` when none is queued or the runner cannot take one now.
async fn start_now(
    service: &Service,
    runner: &Runner,
    claim: &Claim,
    now: Timestamp,
) -> Result<Option<Job>, AppError> {
    if runway_core::moves::start_on_claim(runner, now).is_err() {
        return Ok(None);
    }
    match service.store.claim_and_start(claim, runner, now).await {
        Ok(ClaimStart::Started(moved)) => Ok(Some(moved.job)),
        Ok(ClaimStart::NoJob | ClaimStart::RunnerChanged(_)) => Ok(None),
        Err(StoreError::RunnerTransition(_)) => Ok(None),
        Err(e) => Err(AppError::store(service, "claim_and_start", e)),
    }
}

/// [`complete`] when its one statement did not apply: the job is read and
/// refused as the state machine says, the log stored, and the job and its
/// runner moved as they are found.
async fn complete_in_general(
    service: &Service,
    runner: &Runner,
    (id, event): (JobId, &JobEvent),
    (exit_code, log): (Option<i64>, &str),
    terminate: bool,
    now: Timestamp,
) -> Result<runway_store::Moved, AppError> {
    let current = service
        .store
        .get_job(id)
        .await
        .map_err(|e| AppError::store(service, "get_job", e))?
        .ok_or_else(|| AppError::not_found(format!("no job {id}")))?;
    if current.state.is_terminal() {
        return Err(AppError::new(
            ErrorKind::Conflict,
            "invalid_transition",
            format!("job {id} is {}, which is final", current.state),
        ));
    }
    if !current.is_held_by(runner.id) {
        return Err(AppError::transition(
            service,
            "complete",
            StoreError::JobTransition(runway_core::JobTransitionError::NotHolder {
                job: id,
                runner: runner.id,
            }),
        ));
    }
    service
        .store
        .put_job_log(id, exit_code, log)
        .await
        .map_err(|e| AppError::store(service, "put_job_log", e))?;
    let finish = |_: &Job, after: &Job, current: &Runner, now: Timestamp| {
        Ok(runway_core::moves::finish(after, current, terminate, now))
    };
    service
        .store
        .move_job_and_runner(id, event, Some(runner.id), &finish, now)
        .await
        .map_err(|e| AppError::transition(service, "complete", e))
}

/// What a job that ended (its runner now `runner_after`) is counted as.
fn completed(
    service: &Service,
    runner_after: Option<&Runner>,
    job: &Job,
    conclusion: Conclusion,
    now: Timestamp,
) {
    let pool = job.pool.clone().unwrap_or_default();
    let labels = service.metrics.job_labels(&pool, None, None, None);
    service
        .metrics
        .jobs_completed
        .get_or_create(&JobConclusionLabels {
            job: labels.clone(),
            conclusion: conclusion.as_str().to_owned(),
        })
        .inc();
    if let Some(started) = job.started_at {
        let ran = now.since(started).as_secs_f64();
        service
            .metrics
            .job_run_duration
            .get_or_create(&labels)
            .observe(ran);
        // The runner reported its job's end itself: the spec's `normal`
        // stop (its post-job phase); how the job went is its conclusion.
        service.events.emit(
            "runner_stop",
            api_job(&pool).fields(
                now,
                crate::app::reports::stop_fields(
                    "normal",
                    Some(ran),
                    json!({"conclusion": conclusion.as_str()}),
                ),
            ),
            now,
        );
    }
    service.runner_moved(runner_after);
}
