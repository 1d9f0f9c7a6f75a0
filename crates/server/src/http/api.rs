//! The admin read API: jobs, pools and runners, behind a bearer token from
//! `[server] admin_tokens`. Wire types (DTOs) live here and are converted by
//! hand from the core types.
//!
//! Why one file of over 800 lines: each read route sits beside its wire
//! type and OpenAPI annotations, and the DTOs share their conversions; the
//! write routes, the runner API and the console are modules of their own.
//! Next to split, by resource, if it grows.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use runway_core::planner::WaitReason;
use runway_core::{Job, JobId, JobState, Runner, RunnerState};
use runway_store::{JobFilter, RunnerFilter, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::explain::Explanation;
use crate::app::{AppError, Service};
use crate::clock::rfc3339;
use crate::http::auth::Reader;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::{cursor, path_id, Path, Query};
use crate::http::openapi::{one_of, ReadRefusals};

pub const DEFAULT_PAGE: u32 = 100;
pub const MAX_PAGE: u32 = 10_000;

pub fn router() -> OpenApiRouter<Arc<Service>> {
    OpenApiRouter::new()
        .routes(routes!(list_jobs))
        .routes(routes!(get_job))
        .routes(routes!(list_pools))
        .routes(routes!(list_runners))
        .routes(routes!(get_runner))
        .routes(routes!(list_tasks))
        .routes(routes!(cluster))
}

fn store_error(service: &Service, operation: &str, error: StoreError) -> ApiError {
    AppError::store(service, operation, error).into()
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, utoipa::ToSchema)]
pub struct JobDto {
    pub id: i64,
    pub source: String,
    pub external_id: String,
    pub pool: Option<String>,
    pub labels: Vec<String>,
    pub state: String,
    pub reason: Option<String>,
    pub conclusion: Option<String>,
    pub runner: Option<i64>,
    pub attempts: u32,
    pub max_attempts: u32,
    pub lease_deadline: Option<String>,
    pub created_at: String,
    pub enqueued_at: String,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
    pub details: Value,
    /// Who the job counts against in its pool's fair share: its repository
    /// (GitHub) or tenant (runway's job API); empty when unknown.
    #[serde(default)]
    pub share_key: String,
    /// Why a queued job waits (or why it was never routed): `{code, details}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<Value>,
}

impl From<&Job> for JobDto {
    fn from(job: &Job) -> JobDto {
        JobDto {
            id: job.id.0,
            source: job.source.as_str().to_owned(),
            external_id: job.external_id.clone(),
            pool: job.pool.clone(),
            labels: job.labels.clone(),
            state: job.state.as_str().to_owned(),
            reason: job.reason.clone(),
            conclusion: job.conclusion.map(|c| c.as_str().to_owned()),
            runner: job.runner.map(|r| r.0),
            attempts: job.attempts,
            max_attempts: job.max_attempts,
            lease_deadline: job.lease_deadline.map(rfc3339),
            created_at: rfc3339(job.created_at),
            enqueued_at: rfc3339(job.enqueued_at),
            started_at: job.started_at.map(rfc3339),
            finished_at: job.finished_at.map(rfc3339),
            details: serde_json::from_str(&job.payload).unwrap_or(serde_json::Value::Null),
            share_key: job.share.key.clone(),
            waiting: None,
        }
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, utoipa::ToSchema)]
pub struct JobPageDto {
    pub jobs: Vec<JobDto>,
    /// Pass as `cursor` for the next (older) page; absent on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct JobQuery {
    /// Only jobs in this state.
    #[param(schema_with = job_states)]
    state: Option<String>,
    /// Only jobs of this pool.
    pool: Option<String>,
    /// How many jobs per page.
    #[param(value_type = Option<u32>, minimum = 1, maximum = 10000)]
    limit: Option<String>,
    /// The `next_cursor` of the page before.
    #[param(value_type = Option<i64>)]
    cursor: Option<String>,
    /// `true`: add each job's wait reason (`waiting`).
    #[param(value_type = Option<bool>)]
    explain: Option<String>,
}

fn job_states() -> utoipa::openapi::Object {
    one_of(JobState::ALL.iter().map(|s| s.as_str())).build()
}

fn runner_states() -> utoipa::openapi::Object {
    one_of(RunnerState::ALL.iter().map(|s| s.as_str())).build()
}

/// A query's `true` or `false`: absent is false.
fn flag_query(name: &str, written: Option<&str>) -> Result<bool, ApiError> {
    match written {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(other) => Err(ApiError::bad_request(
            "invalid_query",
            format!("{name}: {other:?} is neither true nor false"),
        )),
    }
}

/// A listing's `state=`: none when absent, else the state it names, or a
/// 400 that says the value and `refusal()`.
fn state_query<T: std::str::FromStr>(
    written: Option<&str>,
    refusal: impl FnOnce() -> String,
) -> Result<Option<T>, ApiError> {
    let Some(text) = written else {
        return Ok(None);
    };
    text.parse().map(Some).map_err(|_| {
        ApiError::bad_request("invalid_query", format!("state: {text:?} {}", refusal()))
    })
}

/// A listing's `limit=`: [`DEFAULT_PAGE`] when absent, else 1 to [`MAX_PAGE`].
pub(crate) fn page_limit(written: Option<&str>) -> Result<u32, ApiError> {
    match written {
        None => Ok(DEFAULT_PAGE),
        Some(text) => match text.parse::<u32>() {
            Ok(limit) if (1..=MAX_PAGE).contains(&limit) => Ok(limit),
            _ => Err(ApiError::bad_request(
                "invalid_query",
                format!("limit: {text:?} is not a number from 1 to {MAX_PAGE}"),
            )),
        },
    }
}

/// Jobs, newest first, a page at a time.
#[utoipa::path(get, path = "/api/v1/jobs", tag = "jobs", params(JobQuery),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "A page of jobs, newest first", body = JobPageDto),
        (status = 400, description = "A query parameter is not valid", body = ErrorBody),
        ReadRefusals,
    ))]
async fn list_jobs(
    Reader(caller): Reader,
    State(service): State<Arc<Service>>,
    Query(query): Query<JobQuery>,
) -> Result<Json<JobPageDto>, ApiError> {
    if let Some(pool) = query.pool.as_deref().filter(|p| !p.is_empty()) {
        caller.require_pool(Some(pool))?;
    }
    let state: Option<JobState> = state_query(query.state.as_deref(), || {
        let known: Vec<&str> = JobState::ALL.iter().map(|s| s.as_str()).collect();
        format!("is not one of {}", known.join(", "))
    })?;
    let limit = page_limit(query.limit.as_deref())?;
    let explain = flag_query("explain", query.explain.as_deref())?;
    let before = cursor(query.cursor.as_deref())?.map(JobId);
    let filter = JobFilter {
        state,
        pool: query.pool.filter(|p| !p.is_empty()),
        // One more than asked tells whether another page exists.
        limit: Some(limit + 1),
        newest_first: true,
        oldest_first: false,
        before,
        after: None,
    };
    let mut jobs = service
        .store
        .list_jobs(&filter)
        .await
        .map_err(|e| store_error(&service, "list_jobs", e))?;
    let more = jobs.len() > limit as usize;
    jobs.truncate(limit as usize);
    let next_cursor = if more {
        jobs.last().map(|job| job.id.0.to_string())
    } else {
        None
    };
    // A token of some pools sees only theirs (a page may then hold fewer
    // than `limit`; the cursor still pages on).
    jobs.retain(|job| caller.scope.covers(job.pool.as_deref()));
    let mut dtos: Vec<JobDto> = jobs.iter().map(JobDto::from).collect();
    if explain {
        let explained = crate::app::explain::explain_jobs(&service, &jobs)
            .await
            .map_err(|e| store_error(&service, "explain", e))?;
        for (dto, job) in dtos.iter_mut().zip(&jobs) {
            dto.waiting = explained.get(&job.id).map(explanation_json);
        }
    }
    Ok(Json(JobPageDto {
        jobs: dtos,
        next_cursor,
    }))
}

/// One job, with why it waits when it is queued.
#[utoipa::path(get, path = "/api/v1/jobs/{id}", tag = "jobs",
    params(("id" = i64, Path, description = "The job's id")),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The job", body = JobDto),
        (status = 400, description = "The id is not a number", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        ReadRefusals,
    ))]
async fn get_job(
    Reader(caller): Reader,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
) -> Result<Json<JobDto>, ApiError> {
    let id = path_id(&id, "job")?;
    let job = service
        .store
        .get_job(JobId(id))
        .await
        .map_err(|e| store_error(&service, "get_job", e))?
        .ok_or_else(|| ApiError::not_found(format!("no job {id}")))?;
    caller.require_pool(job.pool.as_deref())?;
    let mut dto = JobDto::from(&job);
    dto.waiting = crate::app::explain::explain_job(&service, &job)
        .await
        .map_err(|e| store_error(&service, "explain", e))?
        .as_ref()
        .map(explanation_json);
    Ok(Json(dto))
}

/// An explanation as the API shows it: a stable code and its details.
fn explanation_json(explanation: &Explanation) -> Value {
    let (code, details) = match explanation {
        Explanation::Waiting {
            reason,
            has_providers,
            offers,
            warm,
        } => {
            let mut details = wait_details(reason, *has_providers);
            if let Value::Object(details) = &mut details {
                if !offers.is_empty() {
                    details.insert("offers".into(), offers_json(offers));
                }
                if let Some(warm) = warm {
                    details.insert("warm".into(), Value::String(warm.clone()));
                }
            }
            (reason.code(), details)
        }
        Explanation::Unroutable { reason } => ("unroutable", json!({ "reason": reason })),
        Explanation::Held {
            reason,
            gives_up_at,
        } => (
            "held",
            json!({
                "reason": reason,
                "gives_up_at": rfc3339(*gives_up_at),
                "hint": "runway looks the workflow run up again with backoff and routes the job when GitHub answers; [github] run_facts_wait bounds the wait",
            }),
        ),
        Explanation::PoolNotConfigured { pool } => (
            "pool_not_configured",
            json!({ "pool": pool, "hint": "the job's pool is no longer in the configuration" }),
        ),
    };
    json!({ "code": code, "details": details })
}

/// How bidding chose, cheapest per unit of reliable capacity first.
fn offers_json(offers: &[crate::app::explain::OfferChoice]) -> Value {
    offers
        .iter()
        .map(|choice| {
            json!({
                "provider": choice.offer.provider,
                "offer": choice.offer.key,
                "price_per_hour": choice.offer.price_per_hour,
                "reliability": choice.offer.reliability,
                "cost": choice.cost,
                "capacity": choice.offer.capacity,
                "chosen": choice.chosen,
                "backoff": choice.backoff.as_ref().map(|b| json!({
                    "until": rfc3339(b.retry_at),
                    "last_error": b.last_error,
                })),
            })
        })
        .collect()
}

fn wait_details(reason: &WaitReason, has_providers: bool) -> Value {
    match reason {
        WaitReason::RunnerIdle { runner } => json!({ "runner": runner.0 }),
        WaitReason::RunnerBooting { runner, since } => {
            json!({ "runner": runner.0, "since": rfc3339(*since) })
        }
        WaitReason::StoppedRunnerStarting { runner, ready_by } => {
            json!({ "runner": runner.0, "ready_by": rfc3339(*ready_by) })
        }
        WaitReason::RunnerRequested { provider } => json!({ "provider": provider }),
        WaitReason::AtMaxRunners { max_runners } => json!({ "max_runners": max_runners }),
        WaitReason::KeyAtCap { key, max_running } => json!({
            "key": key,
            "max_running": max_running,
            "hint": "[pools.share] max_running: this key's other jobs in the pool hold every place it may have; it starts when one of them ends"
        }),
        WaitReason::PoolPaused => json!({
            "hint": "an operator paused this pool; `runway pools resume POOL` starts runners for it again"
        }),
        WaitReason::ProviderBackoff {
            provider,
            last_error,
            retry_at,
        } => {
            json!({ "provider": provider, "last_error": last_error, "retry_at": rfc3339(*retry_at) })
        }
        WaitReason::NoProviderCapacity => json!({
            "hint": if has_providers {
                "no offer: each of the pool's providers is at its max_instances (instances and creates in flight), or bids nothing"
            } else {
                "no runner can start for this pool yet: register one (runway agent) or configure a provider"
            }
        }),
        WaitReason::ScalingRatio { scaling_ratio } => json!({ "scaling_ratio": scaling_ratio }),
        WaitReason::LeaseExpiredRequeued { attempts } => json!({ "attempts": attempts }),
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, utoipa::ToSchema)]
pub struct PoolDto {
    pub name: String,
    pub labels: Vec<String>,
    pub min_idle: u32,
    pub max_runners: u32,
    pub queued: u64,
    pub jobs: BTreeMap<String, u64>,
    pub runners: BTreeMap<String, u64>,
    /// An operator paused it: no runner is started for it.
    #[serde(default)]
    pub paused: bool,
    /// A predictive pool's warm pool, as the reconciler last sized it
    /// (absent for other pools, and before the first round).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<WarmDto>,
    /// A scale-set pool's scale set, as this replica knows it (the
    /// leader holds the session; absent for other pools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_set: Option<ScaleSetDto>,
    /// Where GitHub admits more than the pool's `[pools.access]` policy
    /// (its runner group: every repository, public repositories), as last
    /// read from GitHub.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// Its stock of stopped runners (absent for a pool that keeps none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stock: Option<StockDto>,
}

/// A pool's stock of stopped runners: booted once, stopped, started for one
/// job each (docs/providers.md).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, utoipa::ToSchema)]
pub struct StockDto {
    pub min_stopped: u32,
    pub max_stopped: u32,
    /// Stopped and ready to start.
    pub stopped: u64,
    /// Being prepared: booting once, or stopping.
    pub preparing: u64,
    /// What the stopped ones cost an hour (their disks), in the providers'
    /// currency.
    pub cost_per_hour: f64,
}

impl StockDto {
    /// Pool `pool`'s stock among `runners` (any pools'), or `None` for a
    /// pool that keeps none.
    pub fn of(
        config: &crate::config::Config,
        pool: &crate::config::PoolConfig,
        runners: &[runway_core::Runner],
    ) -> Option<StockDto> {
        (pool.max_stopped > 0).then(|| {
            let ours = || runners.iter().filter(|r| r.pool == pool.name && r.stock);
            let stopped = ours().filter(|r| r.state == RunnerState::Stopped).count() as u64;
            let live = ours().filter(|r| !r.state.is_terminal()).count() as u64;
            let price = config
                .stopping_provider(pool)
                .map_or(0.0, |p| p.stopped_price());
            StockDto {
                min_stopped: pool.min_stopped,
                max_stopped: pool.max_stopped,
                stopped,
                preparing: live - stopped,
                cost_per_hour: stopped as f64 * price,
            }
        })
    }
}

/// A scale-set pool's scale set and GitHub's latest statistics of it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, utoipa::ToSchema)]
pub struct ScaleSetDto {
    pub name: String,
    /// GitHub's id, once found or created (null until then).
    pub id: Option<i64>,
    /// Whether this replica holds its message session.
    pub session: bool,
    /// Jobs and runners as GitHub's last message counted them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub statistics: Option<ScaleSetStatisticsDto>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, utoipa::ToSchema)]
pub struct ScaleSetStatisticsDto {
    pub available_jobs: i64,
    pub acquired_jobs: i64,
    pub assigned_jobs: i64,
    pub running_jobs: i64,
    pub registered_runners: i64,
    pub busy_runners: i64,
    pub idle_runners: i64,
    /// When GitHub sent them.
    pub at: String,
}

/// How many idle runners a predictive pool keeps, and why.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, utoipa::ToSchema)]
pub struct WarmDto {
    /// Idle runners kept: the forecast, within min_idle and max_runners.
    pub target: u32,
    /// Jobs expected within one boot time and a round: the recurring rate
    /// at the pool's quantile, the scheduled batches and the later jobs of
    /// workflow runs in progress.
    pub expected: u32,
    /// Of those, jobs of a recognised scheduled batch.
    pub batch: u32,
    /// Of those, later jobs of workflow runs in progress.
    pub following: u32,
    /// Jobs still to come of groups in progress (jobs arriving close
    /// together from one repository), learnt without workflow runs.
    #[serde(default)]
    pub group: u32,
    /// The recurring scheduled batches the forecast expects: those its
    /// runners are kept warm for now, and those due within twelve hours.
    #[serde(default)]
    pub batches: Vec<ExpectedBatchDto>,
    /// Why the runners are kept warm, in a sentence.
    #[serde(default)]
    pub why: Option<String>,
    /// When it was sized.
    pub at: String,
}

/// A recurring batch the forecast expects.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, utoipa::ToSchema)]
pub struct ExpectedBatchDto {
    /// Its earliest and latest likely start today (the earliest and
    /// latest of its starts on the days it came), RFC 3339.
    pub earliest: String,
    pub latest: String,
    /// The jobs it brings (the median over the days it came).
    pub jobs: u32,
    /// Of those, not yet arrived (while it is expected now).
    pub remaining: u32,
    /// On how many of the days (or weeks) looked at it came, of how many.
    pub seen: u32,
    pub of: u32,
    /// Recurs weekly (else daily).
    pub weekly: bool,
    /// Runners are kept warm for it now (from one boot time before its
    /// earliest likely start until it has arrived or is not coming).
    pub warm: bool,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, utoipa::ToSchema)]
pub struct PoolsDto {
    pub pools: Vec<PoolDto>,
}

/// The configured pools with their live jobs and runners.
#[utoipa::path(get, path = "/api/v1/pools", tag = "pools",
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "Every configured pool", body = PoolsDto),
        ReadRefusals,
    ))]
async fn list_pools(
    Reader(caller): Reader,
    State(service): State<Arc<Service>>,
) -> Result<Json<PoolsDto>, ApiError> {
    let counts = service
        .store
        .live_job_counts()
        .await
        .map_err(|e| store_error(&service, "live_job_counts", e))?;
    let runners = service
        .store
        .list_live_runners(None)
        .await
        .map_err(|e| store_error(&service, "list_live_runners", e))?;
    let paused = service
        .store
        .paused_pools()
        .await
        .map_err(|e| store_error(&service, "paused_pools", e))?;
    let warm = service.warm.lock().map(|w| w.clone()).unwrap_or_default();
    let warnings = service
        .runner_group_warnings
        .lock()
        .map(|w| w.clone())
        .unwrap_or_default();
    let pools = service
        .config()
        .pools
        .iter()
        .filter(|pool| caller.scope.covers(Some(&pool.name)))
        .map(|pool| {
            let jobs: BTreeMap<String, u64> = counts
                .iter()
                .filter(|c| c.pool.as_deref() == Some(pool.name.as_str()))
                .map(|c| (c.state.as_str().to_owned(), c.count))
                .collect();
            let mut by_state = BTreeMap::new();
            for runner in runners
                .iter()
                .filter(|r| r.pool == pool.name && !r.state.is_terminal())
            {
                *by_state
                    .entry(runner.state.as_str().to_owned())
                    .or_insert(0) += 1;
            }
            let stock = StockDto::of(&service.config(), pool, &runners);
            PoolDto {
                name: pool.name.clone(),
                labels: pool.labels.clone(),
                min_idle: pool.min_idle,
                max_runners: pool.max_runners,
                queued: jobs.get(JobState::Queued.as_str()).copied().unwrap_or(0),
                jobs,
                runners: by_state,
                paused: paused.iter().any(|p| p.pool == pool.name),
                warm: warm.get(&pool.name).map(|w| WarmDto {
                    target: w.target,
                    expected: w.forecast.jobs,
                    batch: w.forecast.batch,
                    following: w.forecast.following,
                    group: w.forecast.group,
                    batches: w
                        .forecast
                        .batches
                        .iter()
                        .map(|b| ExpectedBatchDto {
                            earliest: rfc3339(b.earliest),
                            latest: rfc3339(b.latest),
                            jobs: b.jobs,
                            remaining: b.remaining,
                            seen: b.seen,
                            of: b.of,
                            weekly: b.weekly,
                            warm: b.warm,
                        })
                        .collect(),
                    why: w.why(),
                    at: rfc3339(w.at),
                }),
                scale_set: scale_set_dto(&service, pool),
                warnings: warnings.get(&pool.name).cloned().unwrap_or_default(),
                stock,
            }
        })
        .collect();
    Ok(Json(PoolsDto { pools }))
}

fn scale_set_dto(service: &Service, pool: &crate::config::PoolConfig) -> Option<ScaleSetDto> {
    let name = pool.github.as_ref()?.scale_set.clone()?;
    let handle = service.scale_sets.get(&pool.name);
    Some(ScaleSetDto {
        name,
        id: handle.as_ref().and_then(|h| h.id()),
        session: handle.as_ref().is_some_and(|h| h.holds_session()),
        statistics: handle
            .and_then(|h| h.statistics())
            .map(|(s, at)| ScaleSetStatisticsDto {
                available_jobs: s.total_available_jobs,
                acquired_jobs: s.total_acquired_jobs,
                assigned_jobs: s.total_assigned_jobs,
                running_jobs: s.total_running_jobs,
                registered_runners: s.total_registered_runners,
                busy_runners: s.total_busy_runners,
                idle_runners: s.total_idle_runners,
                at: rfc3339(at),
            }),
    })
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, utoipa::ToSchema)]
pub struct RunnerDto {
    pub id: i64,
    pub name: String,
    pub pool: String,
    pub provider: String,
    pub instance_id: Option<String>,
    pub state: String,
    pub job: Option<i64>,
    pub reason: Option<String>,
    pub requested_at: String,
    pub idle_at: Option<String>,
    pub busy_at: Option<String>,
    pub ended_at: Option<String>,
    /// Drained: takes no new job, stops after its current one.
    #[serde(default)]
    pub draining: bool,
    /// In its pool's stock of stopped runners (booted once, stopped,
    /// started for one job), until started.
    #[serde(default)]
    pub stock: bool,
    /// When it last stopped, while stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<String>,
}

impl From<&Runner> for RunnerDto {
    fn from(runner: &Runner) -> RunnerDto {
        RunnerDto {
            id: runner.id.0,
            name: runner.name.clone(),
            pool: runner.pool.clone(),
            provider: runner.provider.clone(),
            instance_id: runner.instance_id.clone(),
            state: runner.state.as_str().to_owned(),
            job: runner.job.map(|j| j.0),
            reason: runner.reason.clone(),
            requested_at: rfc3339(runner.requested_at),
            idle_at: runner.idle_at.map(rfc3339),
            busy_at: runner.busy_at.map(rfc3339),
            ended_at: runner.ended_at.map(rfc3339),
            draining: runner.draining,
            stock: runner.stock,
            stopped_at: runner
                .stopped_at
                .filter(|_| runner.state == RunnerState::Stopped)
                .map(rfc3339),
        }
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, utoipa::ToSchema)]
pub struct RunnersDto {
    pub runners: Vec<RunnerDto>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct RunnerQuery {
    /// Only runners in this state.
    #[param(schema_with = runner_states)]
    state: Option<String>,
    /// Only runners of this pool.
    pool: Option<String>,
}

/// Runners, filtered by state and pool.
#[utoipa::path(get, path = "/api/v1/runners", tag = "runners", params(RunnerQuery),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The runners", body = RunnersDto),
        (status = 400, description = "A query parameter is not valid", body = ErrorBody),
        ReadRefusals,
    ))]
async fn list_runners(
    Reader(caller): Reader,
    State(service): State<Arc<Service>>,
    Query(query): Query<RunnerQuery>,
) -> Result<Json<RunnersDto>, ApiError> {
    if let Some(pool) = query.pool.as_deref().filter(|p| !p.is_empty()) {
        caller.require_pool(Some(pool))?;
    }
    let state: Option<RunnerState> = state_query(query.state.as_deref(), || {
        "is not a runner state".to_owned()
    })?;
    let runners = service
        .store
        .list_runners(&RunnerFilter {
            state,
            pool: query.pool.filter(|p| !p.is_empty()),
        })
        .await
        .map_err(|e| store_error(&service, "list_runners", e))?;
    let runners: Vec<_> = runners
        .into_iter()
        .filter(|runner| caller.scope.covers(Some(&runner.pool)))
        .collect();
    Ok(Json(RunnersDto {
        runners: runners.iter().map(RunnerDto::from).collect(),
    }))
}

/// One runner with what it and its machine reported, oldest first: the
/// runner's pre-/post-job metrics (`phase` `pre-job`, `post-job`) and a
/// GARM machine's callbacks (`garm-status`, `garm-system-info`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, utoipa::ToSchema)]
pub struct RunnerDetailDto {
    #[serde(flatten)]
    pub runner: RunnerDto,
    pub reports: Vec<RunnerReportDto>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, utoipa::ToSchema)]
pub struct RunnerReportDto {
    pub phase: String,
    pub body: serde_json::Value,
}

#[utoipa::path(get, path = "/api/v1/runners/{id}", tag = "runners",
    params(("id" = i64, Path, description = "The runner's id")),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The runner and what it reported", body = RunnerDetailDto),
        (status = 400, description = "The id is not a number", body = ErrorBody),
        (status = 404, description = "No such runner", body = ErrorBody),
        ReadRefusals,
    ))]
async fn get_runner(
    Reader(caller): Reader,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
) -> Result<Json<RunnerDetailDto>, ApiError> {
    let id = path_id(&id, "runner")?;
    let runner = service
        .store
        .get_runner(runway_core::RunnerId(id))
        .await
        .map_err(|e| store_error(&service, "get_runner", e))?
        .ok_or_else(|| ApiError::not_found(format!("no runner {id}")))?;
    caller.require_pool(Some(&runner.pool))?;
    let reports = service
        .store
        .runner_reports(runner.id)
        .await
        .map_err(|e| store_error(&service, "runner_reports", e))?
        .into_iter()
        .map(|(phase, body)| RunnerReportDto {
            body: serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body)),
            phase,
        })
        .collect();
    Ok(Json(RunnerDetailDto {
        runner: RunnerDto::from(&runner),
        reports,
    }))
}

/// One background worker of this process (`crate::tasks`).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, utoipa::ToSchema)]
pub struct TaskDto {
    pub name: String,
    /// `idle`, `running`, `backing_off`, `following` (leader-only, on a
    /// replica that does not lead) or `stopped`.
    pub state: String,
    pub leader_only: bool,
    pub period_seconds: f64,
    pub runs: u64,
    pub consecutive_failures: u32,
    pub last_error: Option<String>,
    pub last_started_at: Option<String>,
    pub last_success_at: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, utoipa::ToSchema)]
pub struct TasksDto {
    pub leading: bool,
    pub tasks: Vec<TaskDto>,
    /// Providers (or one offer of one) the reconciler backs off after
    /// errors, with the last one's cause (an engine that does not answer,
    /// a refused image, a cloud's quota…), as this replica last planned.
    #[serde(default)]
    pub providers_backing_off: Vec<BackoffDto>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, utoipa::ToSchema)]
pub struct BackoffDto {
    pub provider: String,
    /// The offer backing off; empty: every offer of the provider.
    pub offer: String,
    pub until: String,
    pub last_error: String,
}

/// The background workers of the replica that answers, with their state,
/// last error and consecutive failures; and the providers it backs off,
/// with why.
#[utoipa::path(get, path = "/api/v1/tasks", tag = "operations",
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "This replica's background workers", body = TasksDto),
        ReadRefusals,
    ))]
async fn list_tasks(
    Reader(caller): Reader,
    State(service): State<Arc<Service>>,
) -> Result<Json<TasksDto>, ApiError> {
    caller.require_every_pool()?;
    Ok(Json(tasks_dto(&service)))
}

/// This replica's background workers (the API's and the console's view).
pub(crate) fn tasks_dto(service: &Service) -> TasksDto {
    let tasks = service
        .tasks
        .snapshot()
        .into_iter()
        .map(|status| TaskDto {
            name: status.name.to_owned(),
            state: status.state.as_str().to_owned(),
            leader_only: status.leader_only,
            period_seconds: status.period.as_secs_f64(),
            runs: status.runs,
            consecutive_failures: status.consecutive_failures,
            last_error: status.last_error,
            last_started_at: status.last_started_at.map(rfc3339),
            last_success_at: status.last_success_at.map(rfc3339),
        })
        .collect();
    let providers_backing_off = service
        .provider_backoffs
        .lock()
        .map(|backoffs| {
            backoffs
                .iter()
                .map(|b| BackoffDto {
                    provider: b.provider.clone(),
                    offer: b.offer.clone(),
                    until: rfc3339(b.retry_at),
                    last_error: b.last_error.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    TasksDto {
        leading: service.is_leader(),
        tasks,
        providers_backing_off,
    }
}

#[derive(Serialize, utoipa::ToSchema)]
pub(crate) struct ClusterDto {
    /// The replica that answered.
    replica: String,
    /// The latest leader and its term (it may have died since: compare
    /// with the replicas' heartbeats).
    leader: Option<LeaderDto>,
    /// The replicas heard from in the last minute, oldest first.
    replicas: Vec<ReplicaDto>,
    /// The answering replica's own lead, while it holds it.
    lead: Option<OwnLeadDto>,
}

#[derive(Serialize, utoipa::ToSchema)]
struct OwnLeadDto {
    term: i64,
    /// Whether it makes side effects yet: a replica that took the lead
    /// from one that did not release it waits out that one's lease first.
    acting: bool,
    /// How long it waited (or waits) after taking the lead before acting:
    /// one silence of the lock (5 checks) when the previous leader did not
    /// release its term, 0 after a release or on the first term.
    waited_ms: u64,
}

#[derive(Serialize, utoipa::ToSchema)]
struct LeaderDto {
    replica: String,
    term: i64,
    since: String,
}

#[derive(Serialize, utoipa::ToSchema)]
struct ReplicaDto {
    id: String,
    address: String,
    version: String,
    started_at: String,
    last_heartbeat_at: String,
    leader: bool,
}

/// How long a silent replica stays in the cluster view.
const SEEN_RECENTLY: std::time::Duration = std::time::Duration::from_secs(60);

/// The replicas sharing the store and who leads, in which term.
#[utoipa::path(get, path = "/api/v1/cluster", tag = "operations",
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The replicas and the leader", body = ClusterDto),
        ReadRefusals,
    ))]
async fn cluster(
    Reader(caller): Reader,
    State(service): State<Arc<Service>>,
) -> Result<Json<ClusterDto>, ApiError> {
    caller.require_every_pool()?;
    cluster_dto(&service)
        .await
        .map(Json)
        .map_err(|e| ApiError::from(AppError::store(&service, "cluster", e)))
}

/// The replicas and the leader (the API's and the console's view).
pub(crate) async fn cluster_dto(service: &Service) -> Result<ClusterDto, StoreError> {
    let now = crate::clock::now();
    // A term its holder released (a graceful shutdown) has no leader.
    let leader = service
        .store
        .leader(crate::app::background::LEAD)
        .await?
        .filter(|l| !l.replica.is_empty());
    let replicas = service.store.replicas(now.minus(SEEN_RECENTLY)).await?;
    let leading = leader.as_ref().map(|l| l.replica.clone());
    Ok(ClusterDto {
        replica: service.replica.clone(),
        leader: leader.map(|l| LeaderDto {
            replica: l.replica,
            term: l.term,
            since: rfc3339(l.since),
        }),
        replicas: replicas
            .into_iter()
            .map(|r| ReplicaDto {
                leader: leading.as_deref() == Some(r.id.as_str()),
                id: r.id,
                address: r.address,
                version: r.version,
                started_at: rfc3339(r.started_at),
                last_heartbeat_at: rfc3339(r.heartbeat_at),
            })
            .collect(),
        lead: match service.term.load(std::sync::atomic::Ordering::SeqCst) {
            0 => None,
            term => Some(OwnLeadDto {
                term,
                acting: service.is_leader(),
                waited_ms: service
                    .lead_waited_ms
                    .load(std::sync::atomic::Ordering::SeqCst),
            }),
        },
    })
}
