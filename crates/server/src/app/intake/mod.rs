//! GitHub `workflow_job` events, from a webhook or from the healer's
//! re-check of GitHub's own record: route and store a new job, move a known
//! one forward (with its runner, in one transaction), record the delivery.
//! Everything returns a typed [`WebhookOutcome`]; nothing here knows HTTP.

pub mod held;
mod runners;

pub use held::{held_once, run as run_held, HeldReport, HeldRetries};
use runners::*;

use runway_core::github::{converge, GithubUpdate, WorkflowJobAction};
use runway_core::job::{NewJob, Route};
use runway_core::routing::RouteDecision;
use runway_core::runner::NewRunner;
use runway_core::{Conclusion, Job, JobSource, Runner, RunnerEvent, RunnerId, Timestamp};
use runway_store::{Delivery, Moved, StoreError};
use serde::Serialize;

use crate::app::access::Admitted;
use crate::app::{AppError, ErrorKind, Service};
use crate::clock::now;
use crate::github::payload::WorkflowJob;
use crate::telemetry::metrics::{PoolLabel, ReasonLabel};

/// What runway did with a webhook delivery that it accepted: the
/// `outcome` of the answer, the metric label and the delivery record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebhookOutcome {
    /// GitHub's `ping` event.
    Pong,
    /// An event other than `workflow_job`.
    IgnoredEvent,
    /// A `workflow_job` action runway does not act on.
    IgnoredAction,
    /// A delivery id runway already has.
    DuplicateDelivery,
    /// A `queued` event for a job runway already has (another delivery id).
    DuplicateJob,
    /// A job without the required self-hosted labels.
    IgnoredGithubHosted,
    /// A webhook for a job of a scale-set pool: the pool learns its jobs
    /// from its scale set's message queue, so the webhook changes nothing.
    ScaleSetPool,
    /// A new job no pool serves: stored as `unroutable`.
    Unroutable,
    /// A new job, queued in its pool.
    Queued,
    /// A new job stored as held: the pools serving its labels need facts
    /// of its workflow run that GitHub could not give yet.
    Held,
    /// `waiting` for a job runway does not know: nothing to store yet.
    Waiting,
    /// The event was not news: the job was already there or further.
    NoChange,
    Started,
    Completed,
}

impl WebhookOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            WebhookOutcome::Pong => "pong",
            WebhookOutcome::IgnoredEvent => "ignored_event",
            WebhookOutcome::IgnoredAction => "ignored_action",
            WebhookOutcome::DuplicateDelivery => "duplicate_delivery",
            WebhookOutcome::DuplicateJob => "duplicate_job",
            WebhookOutcome::IgnoredGithubHosted => "ignored_github_hosted",
            WebhookOutcome::ScaleSetPool => "scale_set_pool",
            WebhookOutcome::Unroutable => "unroutable",
            WebhookOutcome::Queued => "queued",
            WebhookOutcome::Held => "held",
            WebhookOutcome::Waiting => "waiting",
            WebhookOutcome::NoChange => "no_change",
            WebhookOutcome::Started => "started",
            WebhookOutcome::Completed => "completed",
        }
    }
}

impl Serialize for WebhookOutcome {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// What an event did, and to which job.
#[derive(Debug, Clone)]
pub struct Applied {
    pub outcome: WebhookOutcome,
    pub job: Option<Job>,
}

impl Applied {
    fn outcome(outcome: WebhookOutcome) -> Applied {
        Applied { outcome, job: None }
    }

    fn for_job(outcome: WebhookOutcome, job: &Job) -> Applied {
        Applied {
            outcome,
            job: Some(job.clone()),
        }
    }
}

/// A verified `workflow_job` delivery: `delivery` is its id when it has one.
/// A `queued` event is the hot path (one write); any other first checks the
/// delivery was not seen, then applies the event.
pub async fn receive(
    service: &Service,
    payload: &WorkflowJob,
    action: WorkflowJobAction,
    delivery: Option<&str>,
    now: Timestamp,
) -> Result<Applied, AppError> {
    if action == WorkflowJobAction::InProgress
        && payload.runner_name.as_deref().is_none_or(str::is_empty)
    {
        // Checked before anything is stored: a refused event changes nothing.
        return Err(AppError::invalid(
            "invalid_payload",
            "workflow_job.runner_name: is missing on an in_progress event",
        ));
    }
    if action == WorkflowJobAction::Queued {
        return queued(service, payload, delivery, now).await;
    }
    if let Some(delivery) = delivery {
        let seen = service
            .store
            .delivery_seen(delivery)
            .await
            .map_err(|e| AppError::store(service, "delivery_seen", e))?;
        if seen {
            return Ok(Applied::outcome(WebhookOutcome::DuplicateDelivery));
        }
    }
    apply(service, payload, action, delivery, now).await
}

fn delivery_record(
    delivery: Option<&str>,
    payload: &WorkflowJob,
    outcome: WebhookOutcome,
    now: Timestamp,
) -> Option<Delivery> {
    delivery.map(|id| Delivery {
        id: id.to_owned(),
        event: "workflow_job".to_owned(),
        action: Some(payload.action.clone()),
        external_id: Some(payload.external_id()),
        outcome: outcome.as_str().to_owned(),
        received_at: now,
    })
}

/// The facts kept with a GitHub job (its stored `payload`): written at
/// intake, read by the re-check, the predictive forecast and `runway trace
/// export`. Absent facts are left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GithubFacts {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repository: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created_at_ms: Option<i64>,
    /// `false` for a scale set's job runway has stored but not yet
    /// acquired; absent for every other (acquired, or not a scale set's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acquired: Option<bool>,
}

impl GithubFacts {
    fn of(payload: &WorkflowJob) -> GithubFacts {
        GithubFacts {
            repository: payload.repository.clone(),
            workflow: payload.workflow.clone(),
            name: payload.name.clone(),
            run_id: payload.run_id,
            created_at_ms: payload.created_at.map(|t| t.as_millis()),
            acquired: payload
                .scale_set
                .as_ref()
                .filter(|origin| !origin.acquired)
                .map(|_| false),
        }
    }

    /// The facts in a stored payload, each read on its own: one of the
    /// wrong type, or a payload that is not JSON, is taken as absent.
    pub fn parse(payload: &str) -> GithubFacts {
        let facts: serde_json::Value =
            serde_json::from_str(payload).unwrap_or(serde_json::Value::Null);
        let text = |key: &str| facts[key].as_str().map(str::to_owned);
        GithubFacts {
            repository: text("repository"),
            workflow: text("workflow"),
            name: text("name"),
            run_id: facts["run_id"].as_u64(),
            created_at_ms: facts["created_at_ms"].as_i64(),
            acquired: facts["acquired"].as_bool(),
        }
    }

    /// Its workflow run: the id, and the workflow's name (empty when
    /// unknown).
    pub fn run(&self) -> Option<(u64, String)> {
        Some((self.run_id?, self.workflow.clone().unwrap_or_default()))
    }
}

/// Source-specific facts kept with a GitHub job.
fn github_payload(payload: &WorkflowJob) -> String {
    serde_json::to_string(&GithubFacts::of(payload)).unwrap_or_else(|_| "{}".to_owned())
}

/// How a job seen for the first time goes in: routed, or not at all.
enum Entry {
    Route(Route),
    /// Needs the required self-hosted labels.
    GithubHosted,
    /// A webhook for a job a scale set's queue brings.
    ScaleSetPool,
    /// The pools serving its labels cannot judge it yet: its workflow run
    /// could not be looked up. It is stored held ([`held`]), never lost
    /// to an outage longer than GitHub's redeliveries.
    Undecided(String),
}

/// What the reason of a held job begins with.
pub const HELD: &str =
    "waiting for GitHub to say what the pools serving its labels need to know of its workflow run (from a fork? triggered by what?)";

/// What a stored reason of a job every pool's access policy refused
/// begins with.
pub const ACCESS_REFUSED: &str = "refused by the access policy of every pool serving its labels";

/// Routes a job seen for the first time. A scale set's job belongs to its
/// pool; a webhook job routed to a scale-set pool is left to the queue,
/// so the same job never becomes two. Among the pools serving its labels
/// the job goes to the first whose access policy admits it.
async fn route_new_job(service: &Service, payload: &WorkflowJob) -> Entry {
    if let Some(origin) = &payload.scale_set {
        return Entry::Route(Route::Pool(origin.pool.clone()));
    }
    let config = service.config();
    if let Some(pool) = scale_set_pool_of(&config, &payload.labels) {
        tracing::debug!(job_id = payload.job_id, %pool, "a webhook for a job of a scale set by its name: its queue brings it");
        return Entry::ScaleSetPool;
    }
    let candidates = match config.candidates(&payload.labels, &config.github.required_labels) {
        Ok(candidates) => candidates,
        Err(RouteDecision::Ignore { .. }) => {
            count_rejection(service, "github_hosted");
            return Entry::GithubHosted;
        }
        Err(RouteDecision::Unroutable { reason, detail }) => {
            tracing::warn!(job_id = payload.job_id, labels = ?payload.labels, reason = %reason, %detail, "unroutable job");
            return Entry::Route(Route::Unroutable { reason: detail });
        }
        Err(RouteDecision::Pool(pool)) => vec![pool],
    };
    let scale_set_pool = |name: &str| {
        config
            .pool(name)
            .and_then(|p| p.github.as_ref())
            .is_some_and(|github| github.scale_set.is_some())
    };
    if scale_set_pool(&candidates[0]) {
        tracing::debug!(job_id = payload.job_id, pool = %candidates[0], "a webhook for a scale-set pool's job: its queue brings it");
        return Entry::ScaleSetPool;
    }
    let candidates: Vec<String> = candidates
        .into_iter()
        .filter(|name| !scale_set_pool(name))
        .collect();
    drop(config);
    match crate::app::access::admit(service, payload, &candidates).await {
        Admitted::Pool(pool, refusals) => {
            if !refusals.is_empty() {
                let refused: Vec<String> = refusals.iter().map(ToString::to_string).collect();
                tracing::info!(job_id = payload.job_id, %pool, ?refused, "routed past pools whose access policy refuses it");
            }
            Entry::Route(Route::Pool(pool))
        }
        Admitted::Unknown(refusals) => {
            let refused: Vec<String> = refusals.iter().map(ToString::to_string).collect();
            Entry::Undecided(refused.join("; "))
        }
        Admitted::Refused(refusals) => {
            let refused: Vec<String> = refusals.iter().map(ToString::to_string).collect();
            let reason = format!("{ACCESS_REFUSED}: {}", refused.join("; "));
            tracing::warn!(job_id = payload.job_id, repository = ?payload.repository, %reason, "job refused by access policy");
            service.events.emit(
                "job_refused",
                serde_json::json!({
                    "github_job_id": payload.job_id,
                    "repository": payload.repository,
                    "refusals": refusals.iter().map(|r| serde_json::json!({
                        "pool": r.pool, "rule": r.rule.as_str(), "detail": r.detail,
                    })).collect::<Vec<_>>(),
                }),
                now(),
            );
            Entry::Route(Route::Unroutable { reason })
        }
    }
}

/// The scale-set pool whose scale set a job asks for by name
/// (`runs-on: NAME` or `[self-hosted, NAME]`, with at most the pool's own
/// labels besides): GitHub gives such a job to the scale set, whose queue
/// brings it to runway, so its webhook must not make a second job.
fn scale_set_pool_of(config: &crate::config::Config, labels: &[String]) -> Option<String> {
    let named = |label: &str, name: &str| label.eq_ignore_ascii_case(name);
    config.pools.iter().find_map(|pool| {
        let name = pool.github.as_ref()?.scale_set.as_deref()?;
        let asks_by_name = labels.iter().any(|l| named(l, name));
        let all_its_own = labels.iter().all(|l| {
            named(l, name) || named(l, "self-hosted") || pool.labels.iter().any(|own| named(l, own))
        });
        (asks_by_name && all_its_own).then(|| pool.name.clone())
    })
}

/// The route of a job seen for the first time, or the answer when it is
/// not runway's to store: a GitHub-hosted job (counted, nothing stored), or
/// a webhook for a scale-set pool's job (its delivery recorded).
async fn route_or_answer(
    service: &Service,
    payload: &WorkflowJob,
    delivery: Option<&str>,
    now: Timestamp,
) -> Result<Result<Route, Applied>, AppError> {
    Ok(match route_new_job(service, payload).await {
        Entry::Route(route) => Ok(route),
        Entry::GithubHosted => Err(Applied::outcome(WebhookOutcome::IgnoredGithubHosted)),
        Entry::Undecided(why) => Ok(Route::Held {
            reason: format!("{HELD}: {why}"),
        }),
        Entry::ScaleSetPool => {
            let outcome = WebhookOutcome::ScaleSetPool;
            record(service, delivery_record(delivery, payload, outcome, now)).await?;
            Err(Applied::outcome(outcome))
        }
    })
}

/// A GitHub job counts against its repository in its pool's fair share.
fn share_in(service: &Service, pool: &str, repository: Option<&str>) -> runway_core::share::Share {
    let key = repository.unwrap_or_default();
    service
        .config()
        .pool(pool)
        .map(|pool| pool.share_of(key))
        .unwrap_or_else(|| runway_core::share::Share::new(key, Default::default()))
}

fn new_job(service: &Service, payload: &WorkflowJob, route: Route) -> NewJob {
    let share = match &route {
        Route::Pool(pool) => share_in(service, pool, payload.repository.as_deref()),
        Route::Unroutable { .. } | Route::Held { .. } => Default::default(),
    };
    NewJob {
        source: JobSource::Github,
        external_id: payload.external_id(),
        route,
        labels: payload.labels.clone(),
        payload: github_payload(payload),
        max_attempts: service.config().queue.max_attempts,
        share,
    }
}

fn count_new_job(service: &Service, job: &Job) {
    if job.state == runway_core::JobState::Held {
        service.metrics.jobs_held.inc();
        tracing::warn!(job = %job.id, external_id = %job.external_id, reason = ?job.reason, "job held until GitHub can say what its pools need to know of its run");
        return;
    }
    match &job.pool {
        Some(pool) => {
            service.job_arrived();
            service
                .metrics
                .jobs_routed
                .get_or_create(&PoolLabel { pool: pool.clone() })
                .inc();
        }
        None if job
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with(ACCESS_REFUSED)) =>
        {
            count_rejection(service, "access_policy")
        }
        None => count_rejection(service, "no_matching_pool"),
    }
}

/// The hot path: a `queued` event is one write, which records the delivery
/// and creates the job (or finds it) in one transaction. GitHub-hosted jobs
/// cost nothing but a count. No read happens first: a redelivery is
/// recognised by the delivery insert itself.
async fn queued(
    service: &Service,
    payload: &WorkflowJob,
    delivery: Option<&str>,
    now: Timestamp,
) -> Result<Applied, AppError> {
    let route = match route_or_answer(service, payload, delivery, now).await? {
        Ok(route) => route,
        Err(answer) => return Ok(answer),
    };
    let outcome = match route {
        Route::Unroutable { .. } => WebhookOutcome::Unroutable,
        Route::Held { .. } => WebhookOutcome::Held,
        Route::Pool(_) => WebhookOutcome::Queued,
    };
    let record = delivery_record(delivery, payload, outcome, now);
    let (enqueued, new_delivery) = service
        .store
        .enqueue_with_delivery(&new_job(service, payload, route), record.as_ref(), now)
        .await
        .map_err(|e| AppError::store(service, "enqueue", e))?;
    if record.is_some() && !new_delivery {
        return Ok(Applied::for_job(
            WebhookOutcome::DuplicateDelivery,
            &enqueued.job,
        ));
    }
    if !enqueued.created {
        return Ok(Applied::for_job(
            WebhookOutcome::DuplicateJob,
            &enqueued.job,
        ));
    }
    count_new_job(service, &enqueued.job);
    Ok(Applied::for_job(outcome, &enqueued.job))
}

/// What a re-check found (GitHub's own record of a job), applied as its
/// lost webhook would have been. Returns what was done.
pub async fn apply_observed(
    service: &Service,
    payload: &WorkflowJob,
    action: WorkflowJobAction,
    now: Timestamp,
) -> Result<WebhookOutcome, AppError> {
    apply(service, payload, action, None, now)
        .await
        .map(|applied| applied.outcome)
}

/// `waiting`, `in_progress` and `completed`: find or create the job, move it
/// forward if the event is news, then record the delivery. The effect comes
/// first, so a crash in between at worst makes a redelivery apply it again,
/// which changes nothing.
async fn apply(
    service: &Service,
    payload: &WorkflowJob,
    action: WorkflowJobAction,
    delivery: Option<&str>,
    now: Timestamp,
) -> Result<Applied, AppError> {
    let existing = service
        .store
        .find_job(JobSource::Github, &payload.external_id())
        .await
        .map_err(|e| AppError::store(service, "find_job", e))?;
    let job = match existing {
        Some(job) => job,
        None => {
            let route = match route_or_answer(service, payload, delivery, now).await? {
                Ok(route) => route,
                Err(answer) => return Ok(answer),
            };
            if !action.creates_job() {
                record(
                    service,
                    delivery_record(delivery, payload, WebhookOutcome::Waiting, now),
                )
                .await?;
                return Ok(Applied::outcome(WebhookOutcome::Waiting));
            }
            let enqueued = service
                .store
                .enqueue(&new_job(service, payload, route), now)
                .await
                .map_err(|e| AppError::store(service, "enqueue", e))?;
            if enqueued.created {
                count_new_job(service, &enqueued.job);
            }
            enqueued.job
        }
    };
    let update = match action {
        WorkflowJobAction::Queued => GithubUpdate::Queued,
        WorkflowJobAction::Waiting => GithubUpdate::Waiting,
        WorkflowJobAction::InProgress => {
            let name = payload.runner_name.as_deref().unwrap_or_default();
            GithubUpdate::InProgress {
                runner: runner_for(service, name, &job).await?,
            }
        }
        WorkflowJobAction::Completed => {
            let runner = match payload
                .runner_name
                .as_deref()
                .filter(|name| !name.is_empty())
            {
                Some(name) => Some(runner_for(service, name, &job).await?),
                None => None,
            };
            GithubUpdate::Completed {
                conclusion: conclusion_of(payload),
                runner,
            }
        }
    };
    let moved = move_job(service, &job, &update, now).await?;
    if moved.is_none() {
        if let GithubUpdate::InProgress { runner }
        | GithubUpdate::Completed {
            runner: Some(runner),
            ..
        } = &update
        {
            used_up_elsewhere(service, &job, *runner, action, now).await;
        }
    }
    let outcome = match (&moved, action) {
        (None, _) => WebhookOutcome::NoChange,
        (Some(_), WorkflowJobAction::InProgress) => WebhookOutcome::Started,
        (Some(_), _) => WebhookOutcome::Completed,
    };
    if let Some(moved) = &moved {
        after_move(service, payload, &moved.job, moved.runner.as_ref(), now).await;
    }
    record(service, delivery_record(delivery, payload, outcome, now)).await?;
    let job = moved.as_ref().map(|moved| &moved.job).unwrap_or(&job);
    Ok(Applied::for_job(outcome, job))
}

fn count_rejection(service: &Service, reason: &'static str) {
    service
        .metrics
        .jobs_rejected
        .get_or_create(&ReasonLabel { reason })
        .inc();
}

async fn record(service: &Service, delivery: Option<Delivery>) -> Result<(), AppError> {
    if let Some(delivery) = delivery {
        service
            .store
            .record_delivery(&delivery)
            .await
            .map_err(|e| AppError::store(service, "record_delivery", e))?;
    }
    Ok(())
}

/// An unknown conclusion (GitHub adds some now and then) still completes the
/// job: a job left queued would create demand forever.
fn conclusion_of(payload: &WorkflowJob) -> Conclusion {
    match payload.conclusion.as_deref().map(str::parse::<Conclusion>) {
        Some(Ok(conclusion)) => conclusion,
        other => {
            tracing::warn!(job_id = payload.job_id, conclusion = ?payload.conclusion, ?other, "unknown or missing conclusion; recorded as neutral");
            Conclusion::Neutral
        }
    }
}

/// Reads, converges and compare-and-sets until the job is where the update
/// says or further, changing its runner in the same transaction: a job that
/// starts makes its runner busy with it, one that ends frees it (and stops
/// an ephemeral one). `None` when nothing changed.
async fn move_job(
    service: &Service,
    job: &Job,
    update: &GithubUpdate,
    now: Timestamp,
) -> Result<Option<Moved>, AppError> {
    let mut current = job.clone();
    for _ in 0..32 {
        let Some(event) = converge(&current, update) else {
            return Ok(None);
        };
        let next = match current.apply(&event, now) {
            Ok(next) => next,
            Err(error) => {
                tracing::debug!(%error, "GitHub event does not apply; nothing to change");
                return Ok(None);
            }
        };
        let runner = match next.runner.or(current.runner) {
            Some(id) => service
                .store
                .get_runner(id)
                .await
                .map_err(|e| AppError::store(service, "get_runner", e))?,
            None => None,
        };
        let runner_next = runner.as_ref().and_then(|runner| {
            if next.state == runway_core::JobState::Running {
                // GitHub says it runs there: a refusal (the record already
                // ended) leaves the record as it is.
                runway_core::moves::start(&next, runner, now).ok()
            } else if next.state.is_terminal() {
                let terminate = service.stops_after_its_job(runner);
                runway_core::moves::finish(&next, runner, terminate, now)
            } else {
                None
            }
        });
        let pair = runner
            .as_ref()
            .map(|now| (now, runner_next.as_ref().unwrap_or(now)));
        if service
            .store
            .replace_job_and_runner((&current, &next), pair)
            .await
            .map_err(|e| AppError::store(service, "replace_job_and_runner", e))?
        {
            service.runner_moved(runner_next.as_ref());
            return Ok(Some(Moved {
                job: next,
                runner: runner_next.or(runner),
            }));
        }
        current = service
            .store
            .get_job(job.id)
            .await
            .map_err(|e| AppError::store(service, "get_job", e))?
            .ok_or_else(AppError::store_unavailable)?;
    }
    Err(AppError::new(
        ErrorKind::Unavailable,
        "contention",
        "the job kept changing under us; retry",
    ))
}

#[cfg(test)]
mod tests;
