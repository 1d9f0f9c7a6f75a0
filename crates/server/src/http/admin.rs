//! The admin API's write half, behind an admin token (a read token gets
//! 403): cancel and retry jobs, drain and terminate runners, pause and
//! resume pools, reload the config; and what it leaves behind — a job's
//! history and the audit trail. The operations are `app::admin` and
//! `app::reload`; this module parses, authenticates and answers.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::Json;
use runway_core::{JobId, RunnerId};
use serde::{Deserialize, Serialize};
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::{admin, reload, Service};
use crate::clock::rfc3339;
use crate::http::api::{JobDto, RunnerDto};
use crate::http::auth::{require_job, require_runner, Admin, Operator, Reader};
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::{cursor, optional_json, path_id, Path, Query};
use crate::http::openapi::{ReadRefusals, WriteRefusals};

pub fn router() -> OpenApiRouter<Arc<Service>> {
    OpenApiRouter::new()
        .routes(routes!(cancel_job))
        .routes(routes!(retry_job))
        .routes(routes!(job_events))
        .routes(routes!(drain_runner))
        .routes(routes!(terminate_runner))
        .routes(routes!(pause_pool))
        .routes(routes!(resume_pool))
        .routes(routes!(reload_config))
        .routes(routes!(list_audit))
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct CancelRequest {
    /// Why, for the job's history and the audit trail.
    reason: Option<String>,
}

/// Cancel a queued, provisioning or running job. A running runway-API
/// job's runner learns of it at its next heartbeat; a job's runner stops
/// with it. The body is optional.
#[utoipa::path(post, path = "/api/v1/jobs/{id}/cancel", tag = "jobs",
    params(("id" = i64, Path, description = "The job's id")),
    request_body(content = Option<CancelRequest>, content_type = "application/json"),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The job, cancelled", body = JobDto),
        (status = 400, description = "The id or the body is not valid", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        (status = 409, description = "The job has already ended", body = ErrorBody),
        WriteRefusals,
    ))]
async fn cancel_job(
    Operator(caller): Operator,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<JobDto>, ApiError> {
    let id = JobId(path_id(&id, "job")?);
    let request: CancelRequest = optional_json(&body)?;
    require_job(&service, &caller, id).await?;
    let job = admin::cancel_job(&service, &caller.name, id, request.reason).await?;
    Ok(Json(JobDto::from(&job)))
}

/// Queue a failed or cancelled runway-API job again, as a new job.
#[utoipa::path(post, path = "/api/v1/jobs/{id}/retry", tag = "jobs",
    params(("id" = i64, Path, description = "The job's id")),
    security(("admin_token" = [])),
    responses(
        (status = 201, description = "The new job", body = JobDto),
        (status = 400, description = "The id is not a number", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        (status = 409, description = "The job is not a failed or cancelled runway-API job", body = ErrorBody),
        (status = 422, description = "No pool takes the job's labels any more", body = ErrorBody),
        WriteRefusals,
    ))]
async fn retry_job(
    Operator(caller): Operator,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
) -> Result<(axum::http::StatusCode, Json<JobDto>), ApiError> {
    let id = JobId(path_id(&id, "job")?);
    require_job(&service, &caller, id).await?;
    let job = admin::retry_job(&service, &caller.name, id).await?;
    Ok((axum::http::StatusCode::CREATED, Json(JobDto::from(&job))))
}

/// One step of a job's history.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, utoipa::ToSchema)]
pub struct JobEventDto {
    pub at: String,
    /// The state the job entered.
    pub state: String,
    /// What moved it there: `created`, `claimed`, `declined`,
    /// `lease_expired`, `started`, `completed`, `failed`, `cancelled`…
    pub event: String,
    pub runner: Option<i64>,
    pub attempts: Option<u32>,
    pub conclusion: Option<String>,
    pub reason: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, utoipa::ToSchema)]
pub struct JobEventsDto {
    pub job: i64,
    pub events: Vec<JobEventDto>,
}

/// What made `step` (given the state before it, `None` for the first).
pub(crate) fn event_name(
    before: Option<runway_core::JobState>,
    step: &runway_core::JobStep,
) -> &'static str {
    use runway_core::JobState::*;
    match (before, step.state) {
        (None, Unroutable) => "unroutable",
        (None, Held) => "held",
        (None, _) => "created",
        (Some(Held), Queued) => "released",
        (_, Held) => "held",
        (_, Provisioning) => "claimed",
        (Some(Provisioning), Queued) if step.attempts.is_none() => "declined",
        (_, Queued) => "lease_expired",
        (_, Running) => "started",
        (_, Completed) => "completed",
        (_, Failed) => "failed",
        (_, Cancelled) => "cancelled",
        (_, Unroutable) => "unroutable",
    }
}

/// A job's history: every transition with its time, runner and reason.
#[utoipa::path(get, path = "/api/v1/jobs/{id}/events", tag = "jobs",
    params(("id" = i64, Path, description = "The job's id")),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The job's transitions, oldest first", body = JobEventsDto),
        (status = 400, description = "The id is not a number", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        ReadRefusals,
    ))]
async fn job_events(
    Reader(caller): Reader,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
) -> Result<Json<JobEventsDto>, ApiError> {
    let id = JobId(path_id(&id, "job")?);
    require_job(&service, &caller, id).await?;
    let steps = service
        .store
        .job_history(id)
        .await
        .map_err(|e| ApiError::from(crate::app::AppError::store(&service, "job_history", e)))?
        .ok_or_else(|| ApiError::not_found(format!("no job {id}")))?;
    let mut before = None;
    let events = steps
        .iter()
        .map(|step| {
            let dto = JobEventDto {
                at: rfc3339(step.at),
                state: step.state.as_str().to_owned(),
                event: event_name(before, step).to_owned(),
                runner: step.runner.map(|r| r.0),
                attempts: step.attempts,
                conclusion: step.conclusion.map(|c| c.as_str().to_owned()),
                reason: step.reason.clone(),
            };
            before = Some(step.state);
            dto
        })
        .collect();
    Ok(Json(JobEventsDto { job: id.0, events }))
}

/// Drain a runner: it takes no new job; an idle or booting one stops now,
/// a busy one once its job is over.
#[utoipa::path(post, path = "/api/v1/runners/{id}/drain", tag = "runners",
    params(("id" = i64, Path, description = "The runner's id")),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The runner, draining", body = RunnerDto),
        (status = 400, description = "The id is not a number", body = ErrorBody),
        (status = 404, description = "No such runner", body = ErrorBody),
        (status = 409, description = "The runner has already ended", body = ErrorBody),
        WriteRefusals,
    ))]
async fn drain_runner(
    Operator(caller): Operator,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
) -> Result<Json<RunnerDto>, ApiError> {
    let id = RunnerId(path_id(&id, "runner")?);
    require_runner(&service, &caller, id).await?;
    let runner = admin::drain_runner(&service, &caller.name, id).await?;
    Ok(Json(RunnerDto::from(&runner)))
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct TerminateRequest {
    /// Terminate a busy runner too (its job is cancelled).
    #[serde(default)]
    force: bool,
}

/// Stop a runner now. A busy one only with `force`, which cancels its job
/// in the same move. The body is optional.
#[utoipa::path(post, path = "/api/v1/runners/{id}/terminate", tag = "runners",
    params(("id" = i64, Path, description = "The runner's id")),
    request_body(content = Option<TerminateRequest>, content_type = "application/json"),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The runner, stopping", body = RunnerDto),
        (status = 400, description = "The id or the body is not valid", body = ErrorBody),
        (status = 404, description = "No such runner", body = ErrorBody),
        (status = 409, description = "The runner is busy and `force` was not given, or it has already ended", body = ErrorBody),
        WriteRefusals,
    ))]
async fn terminate_runner(
    Operator(caller): Operator,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<RunnerDto>, ApiError> {
    let id = RunnerId(path_id(&id, "runner")?);
    require_runner(&service, &caller, id).await?;
    let request: TerminateRequest = optional_json(&body)?;
    let runner = admin::terminate_runner(&service, &caller.name, id, request.force).await?;
    Ok(Json(RunnerDto::from(&runner)))
}

/// A pool's pause state after a pause or resume.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, utoipa::ToSchema)]
pub struct PauseDto {
    pub pool: String,
    pub paused: bool,
    /// False when the pool already was in that state.
    pub changed: bool,
}

async fn set_paused(
    caller: &str,
    service: &Service,
    pool: &str,
    paused: bool,
) -> Result<Json<PauseDto>, ApiError> {
    let changed = admin::set_pool_paused(service, caller, pool, paused).await?;
    Ok(Json(PauseDto {
        pool: pool.to_owned(),
        paused,
        changed,
    }))
}

/// Pause a pool: its queue stays, no runner is started for it.
#[utoipa::path(post, path = "/api/v1/pools/{name}/pause", tag = "pools",
    params(("name" = String, Path, description = "The pool's name")),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The pool, paused", body = PauseDto),
        (status = 404, description = "No such pool in the configuration", body = ErrorBody),
        WriteRefusals,
    ))]
async fn pause_pool(
    Operator(caller): Operator,
    State(service): State<Arc<Service>>,
    Path(name): Path<String>,
) -> Result<Json<PauseDto>, ApiError> {
    caller.require_pool(Some(&name))?;
    set_paused(&caller.name, &service, &name, true).await
}

/// Resume a paused pool.
#[utoipa::path(post, path = "/api/v1/pools/{name}/resume", tag = "pools",
    params(("name" = String, Path, description = "The pool's name")),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The pool, running", body = PauseDto),
        (status = 404, description = "No such pool in the configuration", body = ErrorBody),
        WriteRefusals,
    ))]
async fn resume_pool(
    Operator(caller): Operator,
    State(service): State<Arc<Service>>,
    Path(name): Path<String>,
) -> Result<Json<PauseDto>, ApiError> {
    caller.require_pool(Some(&name))?;
    set_paused(&caller.name, &service, &name, false).await
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, utoipa::ToSchema)]
pub struct ReloadDto {
    /// The config's top-level sections that changed.
    pub changed: Vec<String>,
    /// Keys that changed but need a restart (their running values stay).
    pub restart_needed: Vec<String>,
}

/// Read the configuration file again and apply it; an invalid file is
/// refused with `runway config check`'s words and the running config stays.
#[utoipa::path(post, path = "/api/v1/config/reload", tag = "operations",
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "Applied: what changed, what needs a restart", body = ReloadDto),
        (status = 400, description = "The file is not a valid configuration", body = ErrorBody),
        (status = 409, description = "This server was not started by `runway serve`: nothing to reload from", body = ErrorBody),
        WriteRefusals,
    ))]
async fn reload_config(
    Admin(caller): Admin,
    State(service): State<Arc<Service>>,
) -> Result<Json<ReloadDto>, ApiError> {
    caller.require_every_pool()?;
    let done = reload::reload(&service, &caller.name).await?;
    Ok(Json(ReloadDto {
        changed: done.changed,
        restart_needed: done.restart_needed,
    }))
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, utoipa::ToSchema)]
pub struct AuditEntryDto {
    pub id: i64,
    pub at: String,
    /// The token's name: `env:NAME`, `file:NAME`, `admin_tokens[i]`, or
    /// `signal:SIGHUP`.
    pub actor: String,
    pub action: String,
    pub target: String,
    pub details: serde_json::Value,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, utoipa::ToSchema)]
pub struct AuditPageDto {
    pub entries: Vec<AuditEntryDto>,
    /// Pass as `cursor` for the next (older) page; absent on the last.
    pub next_cursor: Option<String>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct AuditQuery {
    /// How many entries per page.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 10000)]
    limit: Option<String>,
    /// The `next_cursor` of the page before.
    #[param(value_type = Option<i64>)]
    cursor: Option<String>,
}

/// The audit trail, newest first: who changed what, when.
#[utoipa::path(get, path = "/api/v1/audit", tag = "operations", params(AuditQuery),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "A page of entries, newest first", body = AuditPageDto),
        (status = 400, description = "A query parameter is not valid", body = ErrorBody),
        ReadRefusals,
    ))]
async fn list_audit(
    Reader(caller): Reader,
    State(service): State<Arc<Service>>,
    Query(query): Query<AuditQuery>,
) -> Result<Json<AuditPageDto>, ApiError> {
    caller.require_every_pool()?;
    let limit = crate::http::api::page_limit(query.limit.as_deref())?;
    let before = cursor(query.cursor.as_deref())?;
    let mut entries = service
        .store
        .list_audit(limit + 1, before)
        .await
        .map_err(|e| ApiError::from(crate::app::AppError::store(&service, "list_audit", e)))?;
    let more = entries.len() > limit as usize;
    entries.truncate(limit as usize);
    let next_cursor = more
        .then(|| entries.last().map(|e| e.id.to_string()))
        .flatten();
    Ok(Json(AuditPageDto {
        entries: entries
            .into_iter()
            .map(|e| AuditEntryDto {
                id: e.id,
                at: rfc3339(e.at),
                actor: e.actor,
                action: e.action,
                target: e.target,
                details: serde_json::from_str(&e.details).unwrap_or(serde_json::Value::Null),
            })
            .collect(),
        next_cursor,
    }))
}
