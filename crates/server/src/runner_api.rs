//! The runner API: registration, job submission for non-GitHub sources,
//! the long-poll job request, and the explicit two-phase start (DESIGN §3,
//! §4): a job handed to a runner stays `provisioning` under a lease until
//! the runner says it really started, and a job whose runner goes quiet
//! goes back to the queue.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use runway_core::job::{NewJob, Route};
use runway_core::routing::RouteDecision;
use runway_core::{
    Conclusion, Job, JobEvent, JobId, JobSource, Runner, RunnerEvent, RunnerState, Timestamp,
};
use runway_store::{Claim, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::auth::{new_token, token_hash, Reader, RunnerAuth, Writer};
use crate::error::ApiError;
use crate::metrics::PoolLabel;
use crate::service::{now, Service};

/// The most a runner may report of a job's output.
pub const MAX_LOG_TAIL: usize = 64 * 1024;
/// The longest a registration token may live.
const MAX_REGISTRATION_TTL: u64 = 7 * 24 * 3600;
/// Long pollers look again this often even without a wake-up, so a missed
/// notification (or a job requeued elsewhere) costs at most this long.
const REPOLL: Duration = Duration::from_secs(2);

pub fn router() -> Router<Arc<Service>> {
    Router::new()
        .route(
            "/api/v1/registration-tokens",
            post(create_registration_token),
        )
        .route("/api/v1/runners/register", post(register))
        .route("/api/v1/jobs", post(submit))
        .route("/api/v1/jobs/request", post(request_job))
        .route("/api/v1/jobs/{id}/provisioning", post(provisioning))
        .route("/api/v1/jobs/{id}/heartbeat", post(heartbeat))
        .route("/api/v1/jobs/{id}/complete", post(complete))
        .route("/api/v1/jobs/{id}/log", get(log))
}

fn parse_json<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request("invalid_body", format!("body: {e}")))
}

fn store_failure(service: &Service, operation: &str, error: StoreError) -> ApiError {
    service.metrics.store_error(operation);
    tracing::error!(%error, operation, "store operation failed in the runner API");
    ApiError::store_unavailable()
}

/// A refused transition as the runner should see it.
fn transition_error(service: &Service, operation: &str, error: StoreError) -> ApiError {
    use runway_core::JobTransitionError as E;
    match error {
        StoreError::JobNotFound(id) => ApiError::not_found(format!("no job {id}")),
        StoreError::JobTransition(E::NotHolder { job, runner }) => ApiError::new(
            StatusCode::FORBIDDEN,
            "not_holder",
            format!("job {job} is not held by runner {runner}"),
        ),
        StoreError::JobTransition(other) => ApiError::new(
            StatusCode::CONFLICT,
            "invalid_transition",
            other.to_string(),
        ),
        other => store_failure(service, operation, other),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegistrationTokenRequest {
    pool: String,
    /// Seconds; default one hour.
    ttl: Option<u64>,
}

#[derive(Serialize, Deserialize, Debug)]
pub struct RegistrationTokenDto {
    pub token: String,
    pub pool: String,
    pub expires_at: String,
}

async fn create_registration_token(
    _: Writer,
    State(service): State<Arc<Service>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: RegistrationTokenRequest = parse_json(&body)?;
    if !service.config.pools.iter().any(|p| p.name == request.pool) {
        return Err(ApiError::bad_request(
            "unknown_pool",
            format!("pool: {:?} is not a configured pool", request.pool),
        ));
    }
    let ttl = request.ttl.unwrap_or(3600);
    if ttl == 0 || ttl > MAX_REGISTRATION_TTL {
        return Err(ApiError::bad_request(
            "invalid_body",
            format!("ttl: {ttl} is not between 1 and {MAX_REGISTRATION_TTL} seconds"),
        ));
    }
    let token = new_token("rwr_");
    let now = now();
    let expires_at = now.plus(Duration::from_secs(ttl));
    service
        .store
        .create_registration_token(&token_hash(&token), &request.pool, None, expires_at, now)
        .await
        .map_err(|e| store_failure(&service, "create_registration_token", e))?;
    let dto = RegistrationTokenDto {
        token,
        pool: request.pool,
        expires_at: crate::api::rfc3339(expires_at),
    };
    Ok((StatusCode::CREATED, Json(dto)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegisterRequest {
    token: String,
    name: String,
    #[serde(default)]
    labels: Vec<String>,
}

#[derive(Serialize, Deserialize, Debug)]
pub struct RegisteredDto {
    pub runner_id: i64,
    pub runner_token: String,
}

async fn register(State(service): State<Arc<Service>>, body: Bytes) -> Result<Response, ApiError> {
    let request: RegisterRequest = parse_json(&body)?;
    let name = request.name.trim();
    if name.is_empty() || name.len() > 200 {
        return Err(ApiError::bad_request(
            "invalid_body",
            "name: must be 1 to 200 characters",
        ));
    }
    if request.labels.len() > 64
        || request
            .labels
            .iter()
            .any(|l| l.trim().is_empty() || l.len() > 100)
    {
        return Err(ApiError::bad_request(
            "invalid_body",
            "labels: at most 64 labels of 1 to 100 characters",
        ));
    }
    let runner_token = new_token("rwt_");
    let now = now();
    let runner = service
        .store
        .register_runner(
            &token_hash(&request.token),
            name,
            &request.labels,
            &token_hash(&runner_token),
            now,
        )
        .await
        .map_err(|error| match error {
            StoreError::InvalidToken => {
                ApiError::unauthorized("the registration token is unknown, used or expired")
            }
            StoreError::DuplicateRunnerName(name) => ApiError::new(
                StatusCode::CONFLICT,
                "duplicate_name",
                format!("a runner named {name:?} already exists"),
            ),
            other => store_failure(&service, "register_runner", other),
        })?;
    // A runner runway started (its token was bound to its record) is ready
    // already, and its install time is known.
    if runner.origin() == runway_core::RunnerOrigin::Registered {
        if let Err(error) = service
            .store
            .apply_runner_event(runner.id, &RunnerEvent::Ready, now)
            .await
        {
            tracing::warn!(%error, runner = %runner.id, "cannot mark a new runner idle");
        }
    } else {
        let installed = now.since(runner.requested_at);
        service.metrics.runner_installed(&runner.pool, installed);
        service.events.emit(
            "runner_installed",
            json!({"flavor": runner.pool, "duration": installed.as_secs_f64().round() as u64}),
            now,
        );
        tracing::info!(target: "runway::events", event = "runner_installed", flavor = %runner.pool, duration = installed.as_secs_f64(), runner = %runner.name);
    }
    tracing::info!(target: "runway::events", event = "runner_registered", runner = %runner.id, name = %runner.name, pool = %runner.pool);
    let dto = RegisteredDto {
        runner_id: runner.id.0,
        runner_token,
    };
    Ok((StatusCode::CREATED, Json(dto)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubmitRequest {
    labels: Vec<String>,
    script: String,
    timeout_seconds: Option<u64>,
    external_id: Option<String>,
}

/// What an API job carries for its runner.
#[derive(Serialize, Deserialize, Debug, Clone)]
struct ApiJobPayload {
    script: String,
    timeout_seconds: u64,
}

#[derive(Serialize, Deserialize, Debug)]
pub struct SubmittedDto {
    pub id: i64,
    pub pool: String,
    pub created: bool,
}

async fn submit(
    _: Writer,
    State(service): State<Arc<Service>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: SubmitRequest = parse_json(&body)?;
    if request.script.trim().is_empty() {
        return Err(ApiError::bad_request(
            "invalid_body",
            "script: must not be empty",
        ));
    }
    let timeout_seconds = request.timeout_seconds.unwrap_or(3600);
    if timeout_seconds == 0 || timeout_seconds > 7 * 24 * 3600 {
        return Err(ApiError::bad_request(
            "invalid_body",
            "timeout_seconds: must be between 1 and 604800",
        ));
    }
    let pool = match service.config.route(&request.labels, &[]) {
        RouteDecision::Pool(pool) => pool,
        RouteDecision::Unroutable { detail, .. } => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "unroutable",
                detail,
            ));
        }
        RouteDecision::Ignore { missing } => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "unroutable",
                format!("labels lack {}", missing.join(", ")),
            ));
        }
    };
    let payload = ApiJobPayload {
        script: request.script,
        timeout_seconds,
    };
    let new_job = NewJob {
        source: JobSource::Api,
        external_id: request.external_id.unwrap_or_else(|| new_token("job_")),
        route: Route::Pool(pool.clone()),
        labels: request.labels,
        payload: serde_json::to_string(&payload).unwrap_or_default(),
        max_attempts: service.config.queue.max_attempts,
    };
    let enqueued = service
        .store
        .enqueue(&new_job, now())
        .await
        .map_err(|e| store_failure(&service, "enqueue", e))?;
    if enqueued.created {
        service
            .metrics
            .jobs_routed
            .get_or_create(&PoolLabel { pool: pool.clone() })
            .inc();
        service.job_available.notify_waiters();
        service.job_arrived(&pool, enqueued.job.enqueued_at);
    }
    let status = if enqueued.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let dto = SubmittedDto {
        id: enqueued.job.id.0,
        pool,
        created: enqueued.created,
    };
    Ok((status, Json(dto)).into_response())
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct JobRequest {
    /// Labels to match against; the runner's registered labels if absent.
    labels: Option<Vec<String>>,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct AssignedJobDto {
    pub id: i64,
    pub labels: Vec<String>,
    pub script: String,
    pub timeout_seconds: u64,
    pub lease_seconds: u64,
}

/// Long poll: the oldest queued job of the runner's pool that its labels
/// can serve, or 204 after `[runner_api] poll_timeout`.
async fn request_job(
    RunnerAuth(runner): RunnerAuth,
    State(service): State<Arc<Service>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: JobRequest = if body.is_empty() {
        JobRequest::default()
    } else {
        parse_json(&body)?
    };
    let claim = Claim {
        pool: runner.pool.clone(),
        runner: runner.id,
        limit: 1,
        lease: service.config.runner_api.lease,
        runner_labels: Some(request.labels.unwrap_or_else(|| runner.labels.clone())),
    };
    let deadline = tokio::time::Instant::now() + service.config.runner_api.poll_timeout;
    let mut current = runner.clone();
    loop {
        // A runner being scaled down, or gone, takes no more work.
        if matches!(current.state, RunnerState::Terminating) || current.state.is_terminal() {
            return Err(ApiError::new(
                StatusCode::GONE,
                "runner_terminating",
                format!(
                    "runner {} is {}; it takes no more jobs",
                    current.name, current.state
                ),
            ));
        }
        // Listen before looking, so a job enqueued in between still wakes us.
        let notified = service.job_available.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let claimed = service
            .store
            .claim(&claim, now())
            .await
            .map_err(|e| store_failure(&service, "claim", e))?;
        if let Some(job) = claimed.into_iter().next() {
            let payload: ApiJobPayload =
                serde_json::from_str(&job.payload).unwrap_or(ApiJobPayload {
                    script: String::new(),
                    timeout_seconds: 3600,
                });
            let dto = AssignedJobDto {
                id: job.id.0,
                labels: job.labels.clone(),
                script: payload.script,
                timeout_seconds: payload.timeout_seconds,
                lease_seconds: service.config.runner_api.lease.as_secs(),
            };
            return Ok((StatusCode::CREATED, Json(dto)).into_response());
        }
        let now_instant = tokio::time::Instant::now();
        if now_instant >= deadline {
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
        let wait = (deadline - now_instant).min(REPOLL);
        let _ = tokio::time::timeout(wait, notified).await;
        current = match service.store.get_runner(runner.id).await {
            Ok(Some(fresh)) => fresh,
            Ok(None) => current,
            Err(e) => return Err(store_failure(&service, "get_runner", e)),
        };
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProvisioningRequest {
    status: String,
}

#[derive(Serialize)]
struct JobStateDto {
    id: i64,
    state: String,
    lease_deadline: Option<String>,
}

fn job_state(job: &Job) -> Json<JobStateDto> {
    Json(JobStateDto {
        id: job.id.0,
        state: job.state.as_str().to_owned(),
        lease_deadline: job.lease_deadline.map(crate::api::rfc3339),
    })
}

fn job_id(id: &str) -> Result<JobId, ApiError> {
    id.parse::<i64>()
        .map(JobId)
        .map_err(|_| ApiError::bad_request("invalid_path", format!("{id:?} is not a job id")))
}

async fn provisioning(
    RunnerAuth(runner): RunnerAuth,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let id = job_id(&id)?;
    let request: ProvisioningRequest = parse_json(&body)?;
    let now = now();
    let lease = service.config.runner_api.lease;
    let event = match request.status.as_str() {
        "pending" => JobEvent::Keepalive {
            runner: runner.id,
            lease_deadline: now.plus(lease),
        },
        "accepted" => JobEvent::Accept { runner: runner.id },
        "declined" => JobEvent::Decline { runner: runner.id },
        other => {
            return Err(ApiError::bad_request(
                "invalid_body",
                format!("status: {other:?} is not one of pending, accepted, declined"),
            ))
        }
    };
    let job = if let JobEvent::Accept { .. } = event {
        // The job and its runner in one transaction: a runner being scaled
        // down (terminating) or gone refuses, and then nothing is started.
        let start = |_: &Job, after: &Job, current: &Runner, now: Timestamp| {
            runway_core::moves::start(after, current, now)
                .map(Some)
                .map_err(StoreError::from)
        };
        match service
            .store
            .move_job_and_runner(id, &event, Some(runner.id), &start, now)
            .await
        {
            Ok(moved) => moved.job,
            Err(StoreError::RunnerTransition(refused)) => {
                tracing::info!(runner = %runner.id, job = %id, %refused, "accept refused; the job goes back to the queue");
                let _ = service
                    .store
                    .apply_job_event(id, &JobEvent::Decline { runner: runner.id }, now)
                    .await;
                service.job_available.notify_waiters();
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "runner_unavailable",
                    format!("this runner cannot start a job ({refused}); the job was returned to the queue"),
                ));
            }
            Err(error) => return Err(transition_error(&service, "provisioning", error)),
        }
    } else {
        service
            .store
            .apply_job_event(id, &event, now)
            .await
            .map_err(|error| transition_error(&service, "provisioning", error))?
    };
    match &event {
        JobEvent::Accept { .. } => {
            let pool = PoolLabel {
                pool: job.pool.clone().unwrap_or_default(),
            };
            let labels = service.metrics.job_labels(&pool.pool, None, None, None);
            service.metrics.jobs_started.get_or_create(&labels).inc();
            let queued_for = job
                .started_at
                .unwrap_or(now)
                .since(job.enqueued_at)
                .as_secs_f64();
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
                api_job(&pool.pool)
                    .fields(now, json!({"idle": idle.unwrap_or(0.0).round() as u64})),
                now,
            );
        }
        JobEvent::Decline { .. } => service.job_available.notify_waiters(),
        _ => {}
    }
    Ok(job_state(&job).into_response())
}

/// A job of the runner API: no workflow, repository or GitHub event.
fn api_job(pool: &str) -> crate::events::JobContext<'_> {
    crate::events::JobContext {
        flavor: pool,
        workflow: "",
        repo: "",
        github_event: "",
    }
}

async fn heartbeat(
    RunnerAuth(runner): RunnerAuth,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = job_id(&id)?;
    let now = now();
    let job = service
        .store
        .keepalive(id, runner.id, service.config.runner_api.lease, now)
        .await
        .map_err(|e| transition_error(&service, "heartbeat", e))?;
    Ok(job_state(&job).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CompleteRequest {
    conclusion: Option<String>,
    exit_code: Option<i64>,
    #[serde(default)]
    log_tail: String,
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

async fn complete(
    RunnerAuth(runner): RunnerAuth,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let id = job_id(&id)?;
    let request: CompleteRequest = parse_json(&body)?;
    let conclusion = match (request.conclusion.as_deref(), request.exit_code) {
        (Some(text), _) => text.parse::<Conclusion>().map_err(|_| {
            ApiError::bad_request(
                "invalid_body",
                format!("conclusion: {text:?} is not one of success, failure, cancelled, skipped, timed_out, neutral"),
            )
        })?,
        (None, Some(0)) => Conclusion::Success,
        (None, Some(_)) => Conclusion::Failure,
        (None, None) => {
            return Err(ApiError::bad_request(
                "invalid_body",
                "conclusion or exit_code: one of them is required",
            ))
        }
    };
    let now = now();
    // The log first: a completion that is acknowledged has its log stored.
    let current = service
        .store
        .get_job(id)
        .await
        .map_err(|e| store_failure(&service, "get_job", e))?
        .ok_or_else(|| ApiError::not_found(format!("no job {id}")))?;
    if current.state.is_terminal() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "invalid_transition",
            format!("job {id} is {}, which is final", current.state),
        ));
    }
    if !current.is_held_by(runner.id) {
        return Err(transition_error(
            &service,
            "complete",
            StoreError::JobTransition(runway_core::JobTransitionError::NotHolder {
                job: id,
                runner: runner.id,
            }),
        ));
    }
    service
        .store
        .put_job_log(id, request.exit_code, tail(&request.log_tail))
        .await
        .map_err(|e| store_failure(&service, "put_job_log", e))?;
    // The job and its runner in one transaction: the runner is free (or,
    // ephemeral, stopping) exactly when its job is over.
    let terminate = service.stops_after_its_job(&runner);
    let finish = |_: &Job, after: &Job, current: &Runner, now: Timestamp| {
        Ok(runway_core::moves::finish(after, current, terminate, now))
    };
    let moved = service
        .store
        .move_job_and_runner(
            id,
            &JobEvent::Complete {
                runner: runner.id,
                conclusion,
            },
            Some(runner.id),
            &finish,
            now,
        )
        .await
        .map_err(|e| transition_error(&service, "complete", e))?;
    let job = moved.job;
    let pool = PoolLabel {
        pool: job.pool.clone().unwrap_or_default(),
    };
    let labels = service.metrics.job_labels(&pool.pool, None, None, None);
    service
        .metrics
        .jobs_completed
        .get_or_create(&crate::metrics::JobConclusionLabels {
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
        service.events.emit(
            "runner_stop",
            api_job(&pool.pool).fields(
                now,
                json!({"status": conclusion.as_str(), "duration": ran.round() as u64}),
            ),
            now,
        );
    }
    service.runner_moved(moved.runner.as_ref());
    Ok(job_state(&job).into_response())
}

async fn log(
    _: Reader,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = job_id(&id)?;
    let job = service
        .store
        .get_job(id)
        .await
        .map_err(|e| store_failure(&service, "get_job", e))?
        .ok_or_else(|| ApiError::not_found(format!("no job {id}")))?;
    let (exit_code, text) = service
        .store
        .get_job_log(id)
        .await
        .map_err(|e| store_failure(&service, "get_job_log", e))?
        .unwrap_or((None, String::new()));
    let mut response = (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8".to_owned())],
        text,
    )
        .into_response();
    let headers = response.headers_mut();
    if let Ok(value) = job.state.as_str().parse() {
        headers.insert("x-runway-job-state", value);
    }
    if let Some(code) = exit_code {
        if let Ok(value) = code.to_string().parse() {
            headers.insert("x-runway-exit-code", value);
        }
    }
    Ok(response)
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
    if !expired.is_empty() {
        service.job_available.notify_waiters();
        service.reconcile_wanted.notify_one();
    }
    Ok(expired.len())
}
