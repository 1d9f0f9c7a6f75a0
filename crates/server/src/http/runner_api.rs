//! The runner API's HTTP surface: registration, job submission for
//! non-GitHub sources, the long-poll job request, the two-phase start,
//! heartbeats, completion and job logs. The operations are `app::jobs` and
//! `app::runners`; this module parses, authenticates and answers.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use runway_core::{Conclusion, Job, JobId};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::jobs::{self, Completion, ProvisioningStatus, Submission};
use crate::app::{runners, AppError, Service};
use crate::clock::rfc3339;
use crate::http::auth::{Operator, Reader, RememberedRunner, RunnerAuth};
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::{optional_json, path_id, whole, Path};
use crate::http::openapi::{HolderRefusals, ReadRefusals, RunnerRefusals, WriteRefusals};

pub fn router() -> OpenApiRouter<Arc<Service>> {
    OpenApiRouter::new()
        .routes(routes!(create_registration_token))
        .routes(routes!(register))
        .routes(routes!(submit))
        .routes(routes!(request_job))
        .routes(routes!(provisioning))
        .routes(routes!(heartbeat))
        .routes(routes!(complete))
        .routes(routes!(log))
}

fn parse_json<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request("invalid_body", format!("body: {e}")))
}

fn job_id(id: &str) -> Result<JobId, ApiError> {
    path_id(id, "job").map(JobId)
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct RegistrationTokenRequest {
    /// The pool the runner will serve.
    pool: String,
    /// Seconds; default one hour, at most a week.
    #[serde(default, deserialize_with = "whole::option_u64")]
    #[schema(minimum = 1, maximum = 604800)]
    ttl: Option<u64>,
}

#[derive(Serialize, Deserialize, Debug, utoipa::ToSchema)]
pub struct RegistrationTokenDto {
    pub token: String,
    pub pool: String,
    pub expires_at: String,
}

/// A one-use registration token for a runner of `pool`.
#[utoipa::path(post, path = "/api/v1/registration-tokens", tag = "runner-api",
    request_body = RegistrationTokenRequest,
    security(("admin_token" = [])),
    responses(
        (status = 201, description = "The token (shown once)", body = RegistrationTokenDto),
        (status = 400, description = "Not a valid request", body = ErrorBody),
        (status = 422, description = "Not a configured pool", body = ErrorBody),
        WriteRefusals,
    ))]
async fn create_registration_token(
    Operator(caller): Operator,
    State(service): State<Arc<Service>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: RegistrationTokenRequest = parse_json(&body)?;
    caller.require_pool(Some(&request.pool))?;
    let (token, expires_at) =
        runners::create_registration_token(&service, &request.pool, request.ttl).await?;
    let dto = RegistrationTokenDto {
        token,
        pool: request.pool,
        expires_at: rfc3339(expires_at),
    };
    Ok((StatusCode::CREATED, Json(dto)).into_response())
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct RegisterRequest {
    /// A registration token from `POST /api/v1/registration-tokens`.
    token: String,
    /// The runner's name, unique among live runners.
    #[schema(min_length = 1, max_length = 200, pattern = "\\S")]
    name: String,
    /// The runner's labels (at most 64, each 1 to 100 characters).
    #[serde(default)]
    #[schema(schema_with = runner_labels)]
    labels: Vec<String>,
    /// A random key (16 to 128 characters) the runner makes for this one
    /// registration and sends with every try of it: when an answer is lost
    /// and the runner asks again with the same token and key, it gets the
    /// runner registered by the first try (with a new runner token)
    /// instead of a 401 for a used token. Only its hash is stored.
    #[serde(default)]
    #[schema(min_length = 16, max_length = 128)]
    attempt: Option<String>,
}

fn runner_labels() -> utoipa::openapi::Array {
    utoipa::openapi::ArrayBuilder::new()
        .items(label_schema())
        .max_items(Some(64))
        .build()
}

/// A label: 1 to 100 characters, not only spaces.
fn label_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .min_length(Some(1))
        .max_length(Some(100))
        .pattern(Some("\\S"))
        .build()
}

#[derive(Serialize, Deserialize, Debug, utoipa::ToSchema)]
pub struct RegisteredDto {
    pub runner_id: i64,
    pub runner_token: String,
}

/// Register a runner with a registration token; answers its runner token.
#[utoipa::path(post, path = "/api/v1/runners/register", tag = "runner-api",
    request_body = RegisterRequest,
    security(()),
    responses(
        (status = 201, description = "Registered (the runner token is shown once)", body = RegisteredDto),
        (status = 400, description = "Not a valid request", body = ErrorBody),
        (status = 401, description = "The registration token is unknown, used or expired (a used token with the same `attempt` gives the runner it registered, while that runner has had no job)", body = ErrorBody),
        (status = 409, description = "A live runner already has that name", body = ErrorBody),
        (status = 503, description = "The store is unavailable; retry", body = ErrorBody),
    ))]
async fn register(State(service): State<Arc<Service>>, body: Bytes) -> Result<Response, ApiError> {
    let request: RegisterRequest = parse_json(&body)?;
    let (runner, runner_token) = runners::register(
        &service,
        &request.token,
        request.attempt.as_deref(),
        &request.name,
        &request.labels,
    )
    .await?;
    let dto = RegisteredDto {
        runner_id: runner.id.0,
        runner_token,
    };
    Ok((StatusCode::CREATED, Json(dto)).into_response())
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct SubmitRequest {
    /// The labels the job needs; they pick its pool.
    labels: Vec<String>,
    /// The shell script a runner runs.
    #[schema(min_length = 1, pattern = "\\S")]
    script: String,
    /// Seconds; default one hour, at most a week.
    #[serde(default, deserialize_with = "whole::option_u64")]
    #[schema(minimum = 1, maximum = 604800)]
    timeout_seconds: Option<u64>,
    /// Your id for the job: the same id twice is one job.
    external_id: Option<String>,
    /// Who the job counts against in its pool's fair share (`[pools.share]`):
    /// a team, a project. Default: the submitting token's name.
    #[schema(min_length = 1, max_length = 128)]
    tenant: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, utoipa::ToSchema)]
pub struct SubmittedDto {
    pub id: i64,
    pub pool: String,
    pub created: bool,
}

/// Submit a job to runway's own queue.
#[utoipa::path(post, path = "/api/v1/jobs", tag = "jobs",
    request_body = SubmitRequest,
    security(("admin_token" = [])),
    responses(
        (status = 201, description = "Queued", body = SubmittedDto),
        (status = 200, description = "That external id was already submitted: the same job", body = SubmittedDto),
        (status = 400, description = "Not a valid request", body = ErrorBody),
        (status = 422, description = "No pool takes these labels", body = ErrorBody),
        WriteRefusals,
    ))]
async fn submit(
    Operator(caller): Operator,
    State(service): State<Arc<Service>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: SubmitRequest = parse_json(&body)?;
    if !caller.scope.is_every_pool() {
        // The pool the labels route to must be the caller's (a job no
        // pool takes is refused by the submission itself, 422).
        if let runway_core::routing::RouteDecision::Pool(pool) =
            service.config().route(&request.labels, &[])
        {
            caller.require_pool(Some(&pool))?;
        }
    }
    let submitted = jobs::submit(
        &service,
        Submission {
            labels: request.labels,
            script: request.script,
            timeout_seconds: request.timeout_seconds,
            external_id: request.external_id,
            share_key: request.tenant.unwrap_or_else(|| caller.name.clone()),
        },
    )
    .await?;
    let status = if submitted.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let dto = SubmittedDto {
        id: submitted.job.id.0,
        pool: submitted.pool,
        created: submitted.created,
    };
    Ok((status, Json(dto)).into_response())
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct JobRequest {
    /// Labels to match against; the runner's registered labels if absent.
    labels: Option<Vec<String>>,
    /// `true`: the job starts at once (`running`, this runner busy with it)
    /// instead of waiting under its lease for `provisioning` `accepted` —
    /// for runners with nothing to prepare. Default `false`.
    #[serde(default)]
    start: bool,
}

#[derive(Serialize, Deserialize, Debug, Clone, utoipa::ToSchema)]
pub struct AssignedJobDto {
    pub id: i64,
    pub labels: Vec<String>,
    pub script: String,
    pub timeout_seconds: u64,
    pub lease_seconds: u64,
    /// `provisioning` (accept it before the lease ends) or, for a request
    /// with `start`, `running`.
    #[serde(default)]
    pub state: String,
}

/// Long poll: 201 with a job, or 204 after `[runner_api] poll_timeout`.
/// The job is leased: accept it (`provisioning`) before the lease ends —
/// or, asked with `"start": true`, it is already running on this runner.
#[utoipa::path(post, path = "/api/v1/jobs/request", tag = "runner-api",
    request_body(content = Option<JobRequest>, content_type = "application/json"),
    security(("runner_token" = [])),
    responses(
        (status = 201, description = "A job, leased to this runner", body = AssignedJobDto),
        (status = 204, description = "No job before the poll timeout; ask again"),
        (status = 400, description = "Not a valid request", body = ErrorBody),
        (status = 409, description = "Asked with `start`: this runner cannot start a job now (`runner_unavailable`: it is busy with another)", body = ErrorBody),
        (status = 410, description = "The runner is draining or terminating: it takes no job", body = ErrorBody),
        RunnerRefusals,
    ))]
async fn request_job(
    RememberedRunner(runner): RememberedRunner,
    State(service): State<Arc<Service>>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: JobRequest = optional_json(&body)?;
    match jobs::claim(&service, runner, request.labels, request.start).await? {
        Some(assigned) => Ok((StatusCode::CREATED, Json(assigned_dto(assigned))).into_response()),
        None => Ok(StatusCode::NO_CONTENT.into_response()),
    }
}

fn assigned_dto(assigned: jobs::Assigned) -> AssignedJobDto {
    AssignedJobDto {
        state: assigned.job.state.as_str().to_owned(),
        id: assigned.job.id.0,
        labels: assigned.job.labels,
        script: assigned.script,
        timeout_seconds: assigned.timeout_seconds,
        lease_seconds: assigned.lease.as_secs(),
    }
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct ProvisioningRequest {
    /// `pending` (still preparing: extends the lease), `accepted` (the job
    /// starts) or `declined` (back to the queue).
    #[schema(value_type = ProvisioningStatusDto)]
    status: String,
}

#[derive(utoipa::ToSchema)]
#[schema(rename_all = "lowercase")]
#[allow(dead_code)] // documents `ProvisioningRequest::status`
enum ProvisioningStatusDto {
    Pending,
    Accepted,
    Declined,
}

#[derive(Serialize, utoipa::ToSchema)]
struct JobStateDto {
    id: i64,
    state: String,
    lease_deadline: Option<String>,
}

fn job_state(job: &Job) -> Response {
    Json(JobStateDto {
        id: job.id.0,
        state: job.state.as_str().to_owned(),
        lease_deadline: job.lease_deadline.map(rfc3339),
    })
    .into_response()
}

/// The two-phase start: accept, decline or extend a leased job.
#[utoipa::path(post, path = "/api/v1/jobs/{id}/provisioning", tag = "runner-api",
    params(("id" = i64, Path, description = "The job's id")),
    security(("runner_token" = [])),
    request_body = ProvisioningRequest,
    responses(
        (status = 200, description = "The job's state after the step", body = JobStateDto),
        (status = 400, description = "The id or the body is not valid", body = ErrorBody),
        (status = 409, description = "The job is not in a state that allows the step (its lease ended, it was cancelled…)", body = ErrorBody),
        HolderRefusals,
    ))]
async fn provisioning(
    RunnerAuth(runner): RunnerAuth,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let id = job_id(&id)?;
    let request: ProvisioningRequest = parse_json(&body)?;
    let status: ProvisioningStatus = request.status.parse()?;
    let job = jobs::provisioning(&service, &runner, id, status).await?;
    Ok(job_state(&job))
}

/// A running job's heartbeat: extends its lease.
#[utoipa::path(post, path = "/api/v1/jobs/{id}/heartbeat", tag = "runner-api",
    params(("id" = i64, Path, description = "The job's id")),
    security(("runner_token" = [])),
    responses(
        (status = 200, description = "The job's state and new lease deadline", body = JobStateDto),
        (status = 400, description = "The id is not a number", body = ErrorBody),
        (status = 409, description = "The job was cancelled (`job_cancelled`: stop it) or is not running", body = ErrorBody),
        HolderRefusals,
    ))]
async fn heartbeat(
    RunnerAuth(runner): RunnerAuth,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = job_id(&id)?;
    let job = jobs::heartbeat(&service, &runner, id).await?;
    Ok(job_state(&job))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(as = CompleteRequestFields)]
struct CompleteRequest {
    /// How the job ended; if absent, `exit_code` 0 is success and any
    /// other is failure. One of the two is required.
    #[schema(schema_with = conclusions)]
    conclusion: Option<String>,
    #[serde(default, deserialize_with = "whole::option_i64")]
    #[schema(nullable = false)]
    exit_code: Option<i64>,
    /// The end of the job's output, kept as its log.
    #[serde(default)]
    log_tail: String,
    /// Also start this runner's next job, in the same write, if one is
    /// queued and the runner can take it (not stopping after its job, not
    /// draining). It comes back as `next`, already running; without one,
    /// ask `jobs/request`.
    #[serde(default)]
    next: bool,
}

/// A completed job and, asked with `next`, the job that started after it.
#[derive(Serialize, utoipa::ToSchema)]
struct CompletedDto {
    id: i64,
    state: String,
    lease_deadline: Option<String>,
    /// The runner's next job, `running` on it; absent when none started.
    #[serde(skip_serializing_if = "Option::is_none")]
    next: Option<AssignedJobDto>,
}

/// [`CompleteRequest`] as documented: its fields, at least one of
/// `conclusion` and `exit_code` present.
struct CompleteBody;

impl utoipa::PartialSchema for CompleteBody {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{AllOfBuilder, AnyOfBuilder, ObjectBuilder};
        AllOfBuilder::new()
            .item(<CompleteRequest as utoipa::PartialSchema>::schema())
            .item(
                AnyOfBuilder::new()
                    .item(ObjectBuilder::new().required("conclusion"))
                    .item(ObjectBuilder::new().required("exit_code")),
            )
            .into()
    }
}

impl utoipa::ToSchema for CompleteBody {
    fn name() -> std::borrow::Cow<'static, str> {
        "CompleteRequest".into()
    }
}

fn conclusions() -> utoipa::openapi::Object {
    crate::http::openapi::one_of(Conclusion::ALL.iter().map(|c| c.as_str())).build()
}

/// A job's end, with its conclusion and the tail of its log.
#[utoipa::path(post, path = "/api/v1/jobs/{id}/complete", tag = "runner-api",
    params(("id" = i64, Path, description = "The job's id")),
    security(("runner_token" = [])),
    request_body = CompleteBody,
    responses(
        (status = 200, description = "The job, finished; asked with `next`, the runner's next job, started", body = CompletedDto),
        (status = 400, description = "The id or the body is not valid", body = ErrorBody),
        (status = 409, description = "The job is not running", body = ErrorBody),
        HolderRefusals,
    ))]
async fn complete(
    RememberedRunner(runner): RememberedRunner,
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
    let completion = Completion {
        conclusion,
        exit_code: request.exit_code,
        log_tail: request.log_tail,
    };
    let (job, next) = jobs::complete(&service, runner, id, &completion, request.next).await?;
    Ok(Json(CompletedDto {
        id: job.id.0,
        state: job.state.as_str().to_owned(),
        lease_deadline: job.lease_deadline.map(rfc3339),
        next: next.map(assigned_dto),
    })
    .into_response())
}

/// A finished job's log as plain text (empty until it ends); its state and
/// exit code are in headers.
#[utoipa::path(get, path = "/api/v1/jobs/{id}/log", tag = "jobs",
    params(("id" = i64, Path, description = "The job's id")),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The log", content_type = "text/plain", body = String,
            headers(
                ("x-runway-job-state" = String, description = "The job's state"),
                ("x-runway-exit-code" = i64, description = "The job's exit code, once it has one"),
            )),
        (status = 400, description = "The id is not a number", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        ReadRefusals,
    ))]
async fn log(
    Reader(caller): Reader,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = job_id(&id)?;
    crate::http::auth::require_job(&service, &caller, id).await?;
    let store_failed =
        |operation, error| ApiError::from(AppError::store(&service, operation, error));
    let job = service
        .store
        .get_job(id)
        .await
        .map_err(|e| store_failed("get_job", e))?
        .ok_or_else(|| ApiError::not_found(format!("no job {id}")))?;
    let (exit_code, text) = service
        .store
        .get_job_log(id)
        .await
        .map_err(|e| store_failed("get_job_log", e))?
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
