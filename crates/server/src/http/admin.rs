//! The admin API's write half, behind an admin token (a read token gets
//! 403): cancel and retry jobs, drain and terminate runners, pause and
//! resume pools, reload the config; and what it leaves behind — a job's
//! history and the audit trail. The operations are `app::admin` and
//! `app::reload`; this module parses, authenticates and answers.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use runway_core::{JobId, RunnerId};
use serde::{Deserialize, Serialize};

use crate::app::{admin, reload, Service};
use crate::clock::rfc3339;
use crate::http::api::{JobDto, RunnerDto};
use crate::http::auth::{Reader, Writer};
use crate::http::error::ApiError;

pub fn router() -> Router<Arc<Service>> {
    Router::new()
        .route("/api/v1/jobs/{id}/cancel", post(cancel_job))
        .route("/api/v1/jobs/{id}/retry", post(retry_job))
        .route("/api/v1/jobs/{id}/events", get(job_events))
        .route("/api/v1/runners/{id}/drain", post(drain_runner))
        .route("/api/v1/runners/{id}/terminate", post(terminate_runner))
        .route("/api/v1/pools/{name}/pause", post(pause_pool))
        .route("/api/v1/pools/{name}/resume", post(resume_pool))
        .route("/api/v1/config/reload", post(reload_config))
        .route("/api/v1/audit", get(list_audit))
}

fn path_id(id: &str, what: &str) -> Result<i64, ApiError> {
    id.parse::<i64>()
        .map_err(|_| ApiError::bad_request("invalid_path", format!("{id:?} is not a {what} id")))
}

/// An optional JSON body: empty is `T::default()`, anything else must parse.
fn optional_body<T: serde::de::DeserializeOwned + Default>(body: &Bytes) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request("invalid_body", format!("body: {e}")))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CancelRequest {
    reason: Option<String>,
}

async fn cancel_job(
    Writer(caller): Writer,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<JobDto>, ApiError> {
    let id = JobId(path_id(&id, "job")?);
    let request: CancelRequest = optional_body(&body)?;
    let job = admin::cancel_job(&service, &caller.name, id, request.reason).await?;
    Ok(Json(JobDto::from(&job)))
}

async fn retry_job(
    Writer(caller): Writer,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
) -> Result<(axum::http::StatusCode, Json<JobDto>), ApiError> {
    let id = JobId(path_id(&id, "job")?);
    let job = admin::retry_job(&service, &caller.name, id).await?;
    Ok((axum::http::StatusCode::CREATED, Json(JobDto::from(&job))))
}

/// One step of a job's history.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
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

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
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
        (None, _) => "created",
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

async fn job_events(
    _: Reader,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
) -> Result<Json<JobEventsDto>, ApiError> {
    let id = JobId(path_id(&id, "job")?);
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

async fn drain_runner(
    Writer(caller): Writer,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
) -> Result<Json<RunnerDto>, ApiError> {
    let id = RunnerId(path_id(&id, "runner")?);
    let runner = admin::drain_runner(&service, &caller.name, id).await?;
    Ok(Json(RunnerDto::from(&runner)))
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct TerminateRequest {
    /// Terminate a busy runner too (its job is cancelled).
    #[serde(default)]
    force: bool,
}

async fn terminate_runner(
    Writer(caller): Writer,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<RunnerDto>, ApiError> {
    let id = RunnerId(path_id(&id, "runner")?);
    let request: TerminateRequest = optional_body(&body)?;
    let runner = admin::terminate_runner(&service, &caller.name, id, request.force).await?;
    Ok(Json(RunnerDto::from(&runner)))
}

/// A pool's pause state after a pause or resume.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
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

async fn pause_pool(
    Writer(caller): Writer,
    State(service): State<Arc<Service>>,
    Path(name): Path<String>,
) -> Result<Json<PauseDto>, ApiError> {
    set_paused(&caller.name, &service, &name, true).await
}

async fn resume_pool(
    Writer(caller): Writer,
    State(service): State<Arc<Service>>,
    Path(name): Path<String>,
) -> Result<Json<PauseDto>, ApiError> {
    set_paused(&caller.name, &service, &name, false).await
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ReloadDto {
    /// The config's top-level sections that changed.
    pub changed: Vec<String>,
    /// Keys that changed but need a restart (their running values stay).
    pub restart_needed: Vec<String>,
}

async fn reload_config(
    Writer(caller): Writer,
    State(service): State<Arc<Service>>,
) -> Result<Json<ReloadDto>, ApiError> {
    let done = reload::reload(&service, &caller.name).await?;
    Ok(Json(ReloadDto {
        changed: done.changed,
        restart_needed: done.restart_needed,
    }))
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
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

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct AuditPageDto {
    pub entries: Vec<AuditEntryDto>,
    /// Pass as `cursor` for the next (older) page; absent on the last.
    pub next_cursor: Option<String>,
}

#[derive(Deserialize)]
struct AuditQuery {
    limit: Option<String>,
    cursor: Option<String>,
}

async fn list_audit(
    _: Reader,
    State(service): State<Arc<Service>>,
    Query(query): Query<AuditQuery>,
) -> Result<Json<AuditPageDto>, ApiError> {
    let limit = crate::http::api::page_limit(query.limit.as_deref())?;
    let before = match query.cursor.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(text) => Some(text.parse::<i64>().map_err(|_| {
            ApiError::bad_request(
                "invalid_query",
                format!("cursor: {text:?} is not a cursor this API gave out"),
            )
        })?),
    };
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
