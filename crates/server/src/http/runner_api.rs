//! The runner API's HTTP surface: registration, job submission for
//! non-GitHub sources, the long-poll job request, the two-phase start,
//! heartbeats, completion and job logs. The operations are `app::jobs` and
//! `app::runners`; this module parses, authenticates and answers.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use runway_core::{Conclusion, Job, JobId};
use serde::{Deserialize, Serialize};

use crate::app::jobs::{self, Completion, ProvisioningStatus, Submission};
use crate::app::{runners, AppError, Service};
use crate::clock::rfc3339;
use crate::http::auth::{Reader, RunnerAuth, Writer};
use crate::http::error::ApiError;

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

fn job_id(id: &str) -> Result<JobId, ApiError> {
    id.parse::<i64>()
        .map(JobId)
        .map_err(|_| ApiError::bad_request("invalid_path", format!("{id:?} is not a job id")))
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
    let (token, expires_at) =
        runners::create_registration_token(&service, &request.pool, request.ttl).await?;
    let dto = RegistrationTokenDto {
        token,
        pool: request.pool,
        expires_at: rfc3339(expires_at),
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
    let (runner, runner_token) =
        runners::register(&service, &request.token, &request.name, &request.labels).await?;
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
    let submitted = jobs::submit(
        &service,
        Submission {
            labels: request.labels,
            script: request.script,
            timeout_seconds: request.timeout_seconds,
            external_id: request.external_id,
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

/// Long poll: 201 with a job, or 204 after `[runner_api] poll_timeout`.
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
    match jobs::claim(&service, &runner, request.labels).await? {
        Some(assigned) => {
            let dto = AssignedJobDto {
                id: assigned.job.id.0,
                labels: assigned.job.labels,
                script: assigned.script,
                timeout_seconds: assigned.timeout_seconds,
                lease_seconds: assigned.lease.as_secs(),
            };
            Ok((StatusCode::CREATED, Json(dto)).into_response())
        }
        None => Ok(StatusCode::NO_CONTENT.into_response()),
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

fn job_state(job: &Job) -> Response {
    Json(JobStateDto {
        id: job.id.0,
        state: job.state.as_str().to_owned(),
        lease_deadline: job.lease_deadline.map(rfc3339),
    })
    .into_response()
}

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

async fn heartbeat(
    RunnerAuth(runner): RunnerAuth,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = job_id(&id)?;
    let job = jobs::heartbeat(&service, &runner, id).await?;
    Ok(job_state(&job))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CompleteRequest {
    conclusion: Option<String>,
    exit_code: Option<i64>,
    #[serde(default)]
    log_tail: String,
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
    let completion = Completion {
        conclusion,
        exit_code: request.exit_code,
        log_tail: request.log_tail,
    };
    let job = jobs::complete(&service, &runner, id, completion).await?;
    Ok(job_state(&job))
}

async fn log(
    _: Reader,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = job_id(&id)?;
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
