//! Jobs of the runner API (DESIGN §3, §4): submission for non-GitHub
//! sources, the long-poll claim, the explicit two-phase start (a job handed
//! to a runner stays `provisioning` under a lease until the runner says it
//! really started), heartbeats, completion, and the lease sweep that puts a
//! quiet runner's job back in the queue. A change that moves a job and its
//! runner together is one store transaction.

mod complete;
mod leases;

pub use complete::*;
pub use leases::*;

use std::sync::Arc;
use std::time::Duration;

use runway_core::job::{NewJob, Route};
use runway_core::routing::RouteDecision;
use runway_core::{Job, JobEvent, JobId, JobState, Runner, RunnerState, Timestamp};
use runway_store::{Claim, ClaimStart, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::app::tokens::ByToken;
use crate::app::{AppError, ErrorKind, Service};
use crate::clock::now;
use crate::telemetry::events::JobContext;
use crate::telemetry::metrics::PoolLabel;

/// The most a runner may report of a job's output.
pub const MAX_LOG_TAIL: usize = 64 * 1024;
/// The longest a submitted job may run.
pub const MAX_JOB_TIMEOUT: u64 = 7 * 24 * 3600;
/// How often a one-step claim decides again on a runner that changed under
/// it before it waits like an empty poll.
const MAX_RUNNER_CHANGES: u32 = 3;

/// A job submitted through the runner API.
#[derive(Debug, Clone)]
pub struct Submission {
    pub labels: Vec<String>,
    pub script: String,
    pub timeout_seconds: Option<u64>,
    /// The caller's idempotency key; a fresh one if absent.
    pub external_id: Option<String>,
    /// Who the job counts against in its pool's fair share: the tenant the
    /// request names, else the submitting token's name.
    pub share_key: String,
}

/// The longest tenant a job may name (characters).
pub const MAX_TENANT: usize = 128;

/// What an API job carries for its runner (its stored payload).
#[derive(Serialize, Deserialize, Debug, Clone)]
struct ApiJobPayload {
    script: String,
    timeout_seconds: u64,
}

#[derive(Debug, Clone)]
pub struct Submitted {
    pub job: Job,
    pub pool: String,
    /// False when the external id was already submitted (nothing new).
    pub created: bool,
}

/// The pool an API job with `labels` goes to, or 422 `unroutable` with why.
pub(crate) fn route(config: &crate::config::Config, labels: &[String]) -> Result<String, AppError> {
    let refused = |detail| AppError::new(ErrorKind::Unprocessable, "unroutable", detail);
    match config.route(labels, &[]) {
        RouteDecision::Pool(pool) => Ok(pool),
        RouteDecision::Unroutable { detail, .. } => Err(refused(detail)),
        RouteDecision::Ignore { missing } => {
            Err(refused(format!("labels lack {}", missing.join(", "))))
        }
    }
}

/// Routes and enqueues a job; the same external id twice is one job.
pub async fn submit(service: &Service, request: Submission) -> Result<Submitted, AppError> {
    if request.script.trim().is_empty() {
        return Err(AppError::invalid(
            "invalid_body",
            "script: must not be empty",
        ));
    }
    let timeout_seconds = request.timeout_seconds.unwrap_or(3600);
    if timeout_seconds == 0 || timeout_seconds > MAX_JOB_TIMEOUT {
        return Err(AppError::invalid(
            "invalid_body",
            format!("timeout_seconds: must be between 1 and {MAX_JOB_TIMEOUT}"),
        ));
    }
    let share_length = request.share_key.chars().count();
    if share_length == 0 || share_length > MAX_TENANT {
        return Err(AppError::invalid(
            "invalid_body",
            format!("tenant: must be 1 to {MAX_TENANT} characters"),
        ));
    }
    let config = service.config();
    let pool = route(&config, &request.labels)?;
    let share = config
        .pool(&pool)
        .map(|pool| pool.share_of(&request.share_key))
        .unwrap_or_default();
    let payload = ApiJobPayload {
        script: request.script,
        timeout_seconds,
    };
    let new_job = NewJob {
        source: runway_core::JobSource::Api,
        external_id: request
            .external_id
            .unwrap_or_else(|| crate::app::tokens::new_token("job_")),
        route: Route::Pool(pool.clone()),
        labels: request.labels,
        payload: serde_json::to_string(&payload).unwrap_or_default(),
        max_attempts: config.queue.max_attempts,
        share,
    };
    let enqueued = service
        .store
        .enqueue(&new_job, now())
        .await
        .map_err(|e| AppError::store(service, "enqueue", e))?;
    if enqueued.created {
        service
            .metrics
            .jobs_routed
            .get_or_create(&PoolLabel { pool: pool.clone() })
            .inc();
        service.job_queued(&enqueued.job);
        service.job_arrived();
    }
    Ok(Submitted {
        job: enqueued.job,
        pool,
        created: enqueued.created,
    })
}

/// A job handed to a runner: what it runs and for how long it may.
#[derive(Debug, Clone)]
pub struct Assigned {
    pub job: Job,
    pub script: String,
    pub timeout_seconds: u64,
    pub lease: Duration,
}

/// Long poll: the oldest queued job of the runner's pool that `labels` (the
/// runner's registered labels if `None`) can serve, or `None` after
/// `[runner_api] poll_timeout`. A runner being scaled down, or gone, is
/// refused: it takes no more work. With `start`, the job starts at once —
/// running, the runner busy with it, in one store write — instead of
/// waiting under its lease for the runner's accept; a runner that cannot
/// start a job (busy with another) is refused.
///
/// `asked`: the runner as the poll's token named it, maybe as runway
/// last read or wrote it for that token (`Service::renewals`). Such a
/// remembered runner may wait, and start a job (the start's
/// compare-and-set of its version proves it current: its token not
/// replaced, not drained, not ended); before a look that does not start,
/// or where the start's check did not hold, it is read again by the token.
pub async fn claim(
    service: &Service,
    asked: ByToken,
    mut labels: Option<Vec<String>>,
    start: bool,
) -> Result<Option<Assigned>, AppError> {
    let ByToken {
        runner,
        token_hash,
        remembered,
    } = asked;
    let (lease, poll_timeout) = {
        let config = service.config();
        (config.runner_api.lease, config.runner_api.poll_timeout)
    };
    // Built at the poll's first look: a poll spared its look (most of
    // what a waiting fleet makes) needs none.
    let mut claim: Option<Claim> = None;
    let deadline = poll_end(tokio::time::Instant::now(), poll_timeout);
    // Shared with the renewals' copy until the runner is read again.
    let mut current = runner.clone();
    // `current` came from the renewals and no write has proved it yet.
    let mut unproven = remembered;
    let mut changes = 0;
    let mut waiting = service.waiters.enter(
        &runner.pool,
        runner.id,
        Some(labels.as_deref().unwrap_or(&runner.labels)),
    );
    // The runner's previous poll found nothing, and nothing has been
    // queued in its pool since: this poll waits without a look, and makes
    // no store query until a wake-up comes.
    let mut look = !waiting.known_empty();
    loop {
        if current.draining && !current.state.is_terminal() {
            return Err(AppError::new(
                ErrorKind::Gone,
                "runner_draining",
                format!("runner {} is draining; it takes no more jobs", current.name),
            ));
        }
        if matches!(current.state, RunnerState::Terminating) || current.state.is_terminal() {
            return Err(AppError::new(
                ErrorKind::Gone,
                "runner_terminating",
                format!(
                    "runner {} is {}; it takes no more jobs",
                    current.name, current.state
                ),
            ));
        }
        if look {
            if unproven && !start {
                // A claim that does not start checks nothing of the
                // runner: decide on it as it is now (draining? ended?).
                unproven = false;
                current = crate::app::tokens::read_again(service, &token_hash).await?;
                continue;
            }
            let claim = claim.get_or_insert_with(|| next_claim(service, &runner, labels.take()));
            // Listen before looking, so a job enqueued in between still
            // wakes us.
            waiting.looking();
            let claimed = if start {
                let now = now();
                match service.store.claim_and_start(claim, &current, now).await {
                    Ok(ClaimStart::Started(moved)) => {
                        waiting.settled();
                        started(service, &current, &moved.job, now);
                        if let Some(busy) = moved.runner {
                            // As written: what its completion checks.
                            let busy = Arc::new(busy);
                            let at = std::time::Instant::now();
                            service.renewals.put(&token_hash, busy, at);
                        }
                        Some(moved.job)
                    }
                    Ok(ClaimStart::NoJob) => {
                        // The runner is the row it was decided on.
                        unproven = false;
                        waiting.found_nothing();
                        None
                    }
                    // The runner changed (its token too, maybe): decide
                    // again on it as its token names it now.
                    Ok(ClaimStart::RunnerChanged(_)) if changes < MAX_RUNNER_CHANGES => {
                        changes += 1;
                        unproven = false;
                        current = crate::app::tokens::read_again(service, &token_hash).await?;
                        continue;
                    }
                    // Not settled: the job it was woken for, if any, is
                    // passed on when it leaves.
                    Ok(ClaimStart::RunnerChanged(fresh)) => {
                        current = Arc::new(*fresh);
                        None
                    }
                    // A remembered runner that is gone, or says it cannot
                    // start: as its token names it now, it may.
                    Err(StoreError::RunnerNotFound(_) | StoreError::RunnerTransition(_))
                        if unproven =>
                    {
                        unproven = false;
                        current = crate::app::tokens::read_again(service, &token_hash).await?;
                        continue;
                    }
                    Err(StoreError::RunnerTransition(refused)) => {
                        return Err(AppError::new(
                            ErrorKind::Conflict,
                            "runner_unavailable",
                            format!("this runner cannot start a job ({refused})"),
                        ))
                    }
                    Err(e) => return Err(AppError::store(service, "claim_and_start", e)),
                }
            } else {
                let claimed = service
                    .store
                    .claim(claim, now())
                    .await
                    .map_err(|e| AppError::store(service, "claim", e))?
                    .into_iter()
                    .next();
                match &claimed {
                    Some(_) => waiting.settled(),
                    None => waiting.found_nothing(),
                }
                claimed
            };
            if let Some(job) = claimed {
                return Ok(Some(assigned(job, lease)));
            }
        }
        look = true;
        let now_instant = tokio::time::Instant::now();
        if now_instant >= deadline {
            return Ok(None);
        }
        // No timed re-poll, not even at the poll's end: a waiting runner
        // costs no store query. A job queued here or on another replica
        // wakes one waiter that can take it; a wake-up that was missed is
        // caught by the safety net (`waiters::safety_net`: one look per
        // pool, not one per waiter).
        if tokio::time::timeout(deadline - now_instant, waiting.woken())
            .await
            .is_err()
        {
            return Ok(None);
        }
        // A claim that starts its job holds only if the runner is still the
        // row it was decided on, and answers with the row as it is when not
        // (`RunnerChanged`): no need to read it first. An unproven one is
        // read by its token before the look.
        if !start && !unproven {
            current = match service.store.get_runner(runner.id).await {
                Ok(Some(fresh)) => Arc::new(fresh),
                Ok(None) => current,
                Err(e) => return Err(AppError::store(service, "get_runner", e)),
            };
        }
    }
}

/// The step on which long polls end: a poll that finds no job is answered
/// at the last whole step of the process's clock before its
/// `poll_timeout` is up, so the polls that end within one step end
/// together. 10,000 runners polling every 30 s end 333 polls a second;
/// ended one by one, each was a timer of its own firing and a worker
/// thread woken for it, and the renewals that follow came in one by one
/// too. Ended together, one wake-up answers them all, and their renewals
/// arrive together (issue 59: BENCHMARKS.md, "eighth round").
pub const POLL_END_STEP: Duration = Duration::from_secs(1);

/// When a long poll begun at `start` ends without a job: the last whole
/// [`POLL_END_STEP`] of the process's clock at or before `start +
/// timeout`, never later; where that step falls before three quarters
/// of `timeout` (short polls, as tests use), at its exact time.
pub fn poll_end(start: tokio::time::Instant, timeout: Duration) -> tokio::time::Instant {
    static EPOCH: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();
    poll_end_since(
        *EPOCH.get_or_init(tokio::time::Instant::now),
        start,
        timeout,
    )
}

/// [`poll_end`] with the clock's origin given: a pure function.
fn poll_end_since(
    epoch: tokio::time::Instant,
    start: tokio::time::Instant,
    timeout: Duration,
) -> tokio::time::Instant {
    let exact = start + timeout;
    let since = exact.saturating_duration_since(epoch);
    let step = POLL_END_STEP.as_nanos();
    let whole = since.as_nanos() / step * step;
    let stepped = epoch + Duration::from_nanos(u64::try_from(whole).unwrap_or(u64::MAX));
    if stepped > exact || stepped < start + timeout.mul_f64(0.75) {
        exact
    } else {
        stepped
    }
}

/// What a runner says about a job it was handed (the two-phase start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProvisioningStatus {
    /// Still preparing: extend the lease.
    Pending,
    /// Started: the job runs, and the runner is busy with it.
    Accepted,
    /// Will not run it: back to the queue.
    Declined,
}

impl std::str::FromStr for ProvisioningStatus {
    type Err = AppError;

    fn from_str(text: &str) -> Result<ProvisioningStatus, AppError> {
        match text {
            "pending" => Ok(ProvisioningStatus::Pending),
            "accepted" => Ok(ProvisioningStatus::Accepted),
            "declined" => Ok(ProvisioningStatus::Declined),
            other => Err(AppError::invalid(
                "invalid_body",
                format!("status: {other:?} is not one of pending, accepted, declined"),
            )),
        }
    }
}

/// A job of the runner API: no workflow, repository or GitHub event.
fn api_job(pool: &str) -> JobContext<'_> {
    JobContext {
        flavor: pool,
        workflow: "",
        repo: "",
        github_event: "",
    }
}

/// Applies a runner's provisioning report on job `id`. Accepting moves the
/// job and the runner in one transaction: a runner being scaled down or
/// gone refuses, the job goes back to the queue, and nothing is started.
pub async fn provisioning(
    service: &Service,
    runner: &Runner,
    id: JobId,
    status: ProvisioningStatus,
) -> Result<Job, AppError> {
    let now = now();
    let job = match status {
        ProvisioningStatus::Accepted => accept(service, runner, id, now).await?,
        ProvisioningStatus::Pending => {
            let event = JobEvent::Keepalive {
                runner: runner.id,
                lease_deadline: now.plus(service.config().runner_api.lease),
            };
            service
                .store
                .apply_job_event(id, &event, now)
                .await
                .map_err(|error| AppError::transition(service, "provisioning", error))?
        }
        ProvisioningStatus::Declined => {
            let event = JobEvent::Decline { runner: runner.id };
            let job = service
                .store
                .apply_job_event(id, &event, now)
                .await
                .map_err(|error| AppError::transition(service, "provisioning", error))?;
            service.job_queued(&job);
            job
        }
    };
    Ok(job)
}

async fn accept(
    service: &Service,
    runner: &Runner,
    id: JobId,
    now: Timestamp,
) -> Result<Job, AppError> {
    let start = |_: &Job, after: &Job, current: &Runner, now: Timestamp| {
        runway_core::moves::start(after, current, now)
            .map(Some)
            .map_err(StoreError::from)
    };
    let event = JobEvent::Accept { runner: runner.id };
    // The hot path: one statement that starts the job (if it is still this
    // runner's and provisioning) and makes the runner busy (if it is still
    // the row this request authenticated with). Anything else — a repeat,
    // a runner that cannot start, a runner changed meanwhile — takes the
    // general path below, where the state machines decide.
    if let (Some(change), Ok(busy)) = (
        event.guarded(now),
        runway_core::moves::start_by_id(id, runner, now),
    ) {
        match service
            .store
            .apply_guarded_with_runner(id, &change, (runner, &busy), None)
            .await
        {
            Ok(Some(moved)) => {
                started(service, runner, &moved.job, now);
                return Ok(moved.job);
            }
            Ok(None) => {}
            Err(error) => return Err(AppError::transition(service, "provisioning", error)),
        }
    }
    let job = match service
        .store
        .move_job_and_runner(id, &event, Some(runner.id), &start, now)
        .await
    {
        Ok(moved) => moved.job,
        Err(StoreError::RunnerTransition(refused)) => {
            tracing::info!(runner = %runner.id, job = %id, %refused, "accept refused; the job goes back to the queue");
            let requeued = service
                .store
                .apply_job_event(id, &JobEvent::Decline { runner: runner.id }, now)
                .await;
            if let Ok(job) = requeued {
                service.job_queued(&job);
            }
            return Err(AppError::new(
                ErrorKind::Conflict,
                "runner_unavailable",
                format!(
                    "this runner cannot start a job ({refused}); the job was returned to the queue"
                ),
            ));
        }
        Err(StoreError::JobTransition(refused)) => {
            // A repeated accept (the first one's answer was lost: the
            // server restarted, a connection dropped) is answered as the
            // first was, so the runner runs the job it already holds
            // rather than leave it to run out its lease.
            return match service.store.get_job(id).await {
                Ok(Some(job))
                    if job.state == JobState::Running && job.runner == Some(runner.id) =>
                {
                    Ok(job)
                }
                _ => Err(AppError::transition(
                    service,
                    "provisioning",
                    StoreError::JobTransition(refused),
                )),
            };
        }
        Err(error) => return Err(AppError::transition(service, "provisioning", error)),
    };
    started(service, runner, &job, now);
    Ok(job)
}

/// How long a job waited, from its creation to its start (`now` if it has
/// no start yet): a decline or a lease expiry requeues it (a new
/// `enqueued_at`) but does not make its earlier wait disappear.
fn queued_for(job: &Job, now: Timestamp) -> f64 {
    job.started_at
        .unwrap_or(now)
        .since(job.created_at)
        .as_secs_f64()
}

/// What a job that started on `runner` (as it was before) is counted as.
fn started(service: &Service, runner: &Runner, job: &Job, now: Timestamp) {
    let pool = PoolLabel {
        pool: job.pool.clone().unwrap_or_default(),
    };
    let labels = service.metrics.job_labels(&pool.pool, None, None, None);
    service.metrics.jobs_started.get_or_create(&labels).inc();
    let queued_for = queued_for(job, now);
    service
        .metrics
        .job_queue_duration
        .get_or_create(&labels)
        .observe(queued_for);
    let idle = runner
        .idle_at
        .map(|idle_since| now.since(idle_since).as_secs_f64());
    if let Some(idle) = idle {
        service
            .metrics
            .runner_idle_duration
            .get_or_create(&pool)
            .observe(idle);
    }
    service.events.emit(
        "job_queuing",
        json!({"flavor": pool.pool, "duration": queued_for.round() as u64}),
        now,
    );
    service.events.emit(
        "runner_start",
        api_job(&pool.pool).fields(now, json!({"idle": idle.unwrap_or(0.0).round() as u64})),
        now,
    );
}

/// Extends the lease of a job `runner` holds.
/// A job an operator cancelled is refused with `job_cancelled`: the
/// runner stops it.
pub async fn heartbeat(service: &Service, runner: &Runner, id: JobId) -> Result<Job, AppError> {
    match service
        .store
        .keepalive(id, runner.id, service.config().runner_api.lease, now())
        .await
    {
        Ok(job) => Ok(job),
        Err(StoreError::JobTransition(refused)) => match service.store.get_job(id).await {
            Ok(Some(job)) if job.state == JobState::Cancelled && job.runner == Some(runner.id) => {
                Err(AppError::new(
                    ErrorKind::Conflict,
                    "job_cancelled",
                    format!(
                        "job {id} was cancelled ({}); stop it",
                        job.reason.as_deref().unwrap_or("no reason given")
                    ),
                ))
            }
            _ => Err(AppError::transition(
                service,
                "heartbeat",
                StoreError::JobTransition(refused),
            )),
        },
        Err(error) => Err(AppError::transition(service, "heartbeat", error)),
    }
}

/// The claim of a runner's next job: its pool, `labels` (by default its
/// registered ones), the configured lease, the pool's cap on one key's
/// running jobs.
fn next_claim(service: &Service, runner: &Runner, labels: Option<Vec<String>>) -> Claim {
    let config = service.config();
    Claim {
        pool: runner.pool.clone(),
        runner: runner.id,
        limit: 1,
        lease: config.runner_api.lease,
        runner_labels: Some(labels.unwrap_or_else(|| runner.labels.clone())),
        max_running_per_key: config
            .pool(&runner.pool)
            .and_then(|pool| pool.max_running_per_key()),
    }
}

/// A started job as the runner API hands it out, its script and timeout
/// read from its payload.
fn assigned(job: Job, lease: Duration) -> Assigned {
    let payload: ApiJobPayload = serde_json::from_str(&job.payload).unwrap_or(ApiJobPayload {
        script: String::new(),
        timeout_seconds: 3600,
    });
    Assigned {
        job,
        script: payload.script,
        timeout_seconds: payload.timeout_seconds,
        lease,
    }
}

#[cfg(test)]
mod queue_time_tests;

#[cfg(test)]
mod poll_end_tests {
    use super::*;

    /// Polls begun at these offsets (ms) from the clock's origin, with
    /// these timeouts (ms), end at these offsets (ms).
    #[test]
    fn polls_end_on_the_last_whole_step_before_their_timeout() {
        let cases: [(u64, u64, u64); 16] = [
            // (start, timeout, end)
            (0, 30_000, 30_000),
            (250, 30_000, 30_000),
            (999, 30_000, 30_000),
            (1_000, 30_000, 31_000),
            (1_001, 30_000, 31_000),
            (4_999, 30_000, 34_000),
            (12_345, 30_000, 42_000),
            // Polls begun within one step end together.
            (40_001, 60_000, 100_000),
            (40_999, 60_000, 100_000),
            // Short polls step only where three quarters of their time
            // is still theirs, and otherwise end at their exact time.
            (600, 2_000, 2_600),
            (500, 2_000, 2_000),
            (100, 1_000, 1_000),
            (300, 1_000, 1_300),
            (0, 0, 0),
            (1_500, 4_000, 5_000),
            (2_100, 4_000, 6_000),
        ];
        let epoch = tokio::time::Instant::now() + Duration::from_secs(10);
        let at = |ms: u64| epoch + Duration::from_millis(ms);
        for (start, timeout, end) in cases {
            let got = poll_end_since(epoch, at(start), Duration::from_millis(timeout));
            assert_eq!(
                got.duration_since(epoch).as_millis(),
                u128::from(end),
                "begun at {start} ms with a {timeout} ms timeout"
            );
            assert!(got <= at(start + timeout), "never after the timeout");
            assert!(
                got >= at(start) + Duration::from_millis(timeout).mul_f64(0.75),
                "never before three quarters of it"
            );
        }
        // A poll begun before the clock's origin (another runtime's paused
        // clock, in tests) ends at its exact time.
        let before = epoch - Duration::from_millis(5_000);
        assert_eq!(
            poll_end_since(epoch, before, Duration::from_millis(3_000)),
            before + Duration::from_millis(3_000)
        );
    }
}
