//! The runner side of a webhook: which of our runners it names, what a job's
//! move does to it, and a runner used up by a job runway did not give it.

use super::*;

/// GitHub says our runner `runner` ran (`completed`) `job`, but the job did
/// not move to it: a job runway refused or never routed (its access policy,
/// no pool), or one that ended another way first. A just-in-time runner runs
/// one job whatever runway thought of it, so it is used up: finished and
/// stopped, its place under `max_runners` given back for the next job.
///
/// An `in_progress` alone changes nothing: a late, reordered one cannot be
/// told from a current one, and marking a runner busy on it left runners
/// busy with no job until the re-check (chaos soak, seed 10). An idle-looking
/// runner that is in fact running ends on its `completed`, or when its
/// machine exits.
pub(super) async fn used_up_elsewhere(
    service: &Service,
    job: &Job,
    runner: RunnerId,
    action: WorkflowJobAction,
    now: Timestamp,
) {
    let Ok(Some(record)) = service.store.get_runner(runner).await else {
        return;
    };
    if job.runner == Some(record.id) || !service.stops_after_its_job(&record) {
        return;
    }
    use runway_core::RunnerState as S;
    let event = match (action, record.state, record.job) {
        (WorkflowJobAction::Completed, S::Busy, None) => {
            tracing::info!(runner = %record.name, job_id = %job.external_id, "a runner finished a job runway did not run there; stopped");
            service.finish_runner_job(record.id, now).await;
            return;
        }
        (WorkflowJobAction::Completed, S::Requested | S::Provisioning | S::Idle, _) => {
            RunnerEvent::TerminateRequested
        }
        _ => return,
    };
    match service
        .store
        .apply_runner_event(record.id, &event, now)
        .await
    {
        Ok(next) => {
            tracing::info!(runner = %record.name, job_id = %job.external_id, state = %next.state, "a runner ran a job runway did not give it; it is used up");
            service.runner_moved(Some(&next));
        }
        Err(error) => tracing::debug!(%error, runner = %record.name, "runner changed meanwhile"),
    }
}

/// The runner a GitHub job runs on: ours if we know the name, else an
/// external runner recorded for the job's pool.
pub(super) async fn runner_for(
    service: &Service,
    name: &str,
    job: &Job,
) -> Result<RunnerId, AppError> {
    let store = &service.store;
    if let Some(runner) = store
        .find_runner(name)
        .await
        .map_err(|e| AppError::store(service, "find_runner", e))?
    {
        return Ok(runner.id);
    }
    let new = NewRunner {
        name: name.to_owned(),
        pool: job.pool.clone().unwrap_or_default(),
        provider: runway_core::RunnerOrigin::External.column().to_owned(),
        labels: Vec::new(),
        stock: false,
    };
    match store.create_runner(&new, now()).await {
        Ok(runner) => Ok(runner.id),
        Err(StoreError::DuplicateRunnerName(_)) => store
            .find_runner(name)
            .await
            .map_err(|e| AppError::store(service, "find_runner", e))?
            .map(|runner| runner.id)
            .ok_or_else(AppError::store_unavailable),
        Err(error) => Err(AppError::store(service, "create_runner", error)),
    }
}

/// Bookkeeping after a job (and its runner) moved: metrics and the event
/// log. Nothing here can fail the webhook: the move is stored.
pub(super) async fn after_move(
    service: &Service,
    payload: &WorkflowJob,
    job: &Job,
    runner: Option<&Runner>,
    now: Timestamp,
) {
    let pool = PoolLabel {
        pool: job.pool.clone().unwrap_or_default(),
    };
    // The webhook names the repository and workflow, not the event that
    // triggered the run: that is known when the run was looked up (for a
    // pool's policy, or in the background when the job was queued) or a
    // runner reported it (pre-job), here or in the store — never the
    // webhook's type.
    let mut event =
        crate::app::access::known_event(service, payload.repository.as_deref(), payload.run_id);
    let completed = job.state == runway_core::JobState::Completed;
    // The runner's reports, read once: its pre-job report names the event,
    // and at the job's end both say whether the runner got there.
    let reports = match runner {
        Some(runner) if event.is_none() || completed => {
            match service.store.runner_reports(runner.id).await {
                Ok(reports) => Some(reports),
                Err(error) => {
                    tracing::debug!(%error, runner = %runner.name, "cannot read the runner's reports");
                    None
                }
            }
        }
        _ => None,
    };
    if event.is_none() {
        event = reports
            .iter()
            .flatten()
            .find(|(phase, _)| phase == "pre-job")
            .and_then(|(_, body)| crate::app::reports::PreJob::parse(body))
            .map(|pre| pre.event)
            .filter(|event| !event.is_empty());
    }
    let labels = service.metrics.job_labels(
        &pool.pool,
        payload.repository.as_deref(),
        payload.workflow.as_deref(),
        event.as_deref(),
    );
    let running = job.state == runway_core::JobState::Running;
    let ending = if completed {
        Some(ending(service, payload, job, runner, reports.as_deref()).await)
    } else {
        None
    };
    if running {
        service.metrics.jobs_started.get_or_create(&labels).inc();
    } else if let (Some(conclusion), Some(Ending::Stopped)) = (job.conclusion, ending) {
        service
            .metrics
            .jobs_completed
            .get_or_create(&crate::telemetry::metrics::JobConclusionLabels {
                job: labels.clone(),
                conclusion: conclusion.as_str().to_owned(),
            })
            .inc();
    }
    let context = crate::telemetry::events::JobContext {
        flavor: &pool.pool,
        workflow: payload.workflow.as_deref().unwrap_or(""),
        repo: payload.repository.as_deref().unwrap_or(""),
        github_event: event.as_deref().unwrap_or(""),
    };
    if running {
        if let (Some(created), Some(started)) = (payload.created_at, payload.started_at) {
            let seconds = started.since(created).as_secs_f64();
            service
                .metrics
                .job_queue_duration
                .get_or_create(&labels)
                .observe(seconds);
            service.events.emit(
                "job_queuing",
                serde_json::json!({"flavor": pool.pool, "duration": seconds.round() as u64}),
                now,
            );
        }
        let started = payload.started_at.unwrap_or(now);
        match runner {
            // Once per runner, whether its pre-job report said it first.
            Some(runner) => {
                crate::app::reports::started(service, runner, &context, started, now).await
            }
            None => service.events.emit(
                "runner_start",
                context.fields(started, serde_json::json!({"idle": 0})),
                now,
            ),
        }
    } else if ending == Some(Ending::Stopped) {
        let completed = payload.completed_at.unwrap_or(now);
        let seconds = payload
            .started_at
            .map(|started| completed.since(started).as_secs_f64());
        if let Some(seconds) = seconds {
            service
                .metrics
                .job_run_duration
                .get_or_create(&labels)
                .observe(seconds);
        }
        // GitHub says the job completed: its runner got to its end (the
        // spec's `normal`); how the job went is its conclusion.
        let fields = crate::app::reports::stop_fields(
            "normal",
            seconds,
            serde_json::json!({
                "conclusion": job.conclusion.map(|c| c.as_str()).unwrap_or("unknown"),
            }),
        );
        match runner {
            Some(runner) => {
                crate::app::reports::stopped(service, runner, &context, completed, fields, now)
                    .await
            }
            None => service
                .events
                .emit("runner_stop", context.fields(completed, fields), now),
        }
    }
}

/// What GitHub's `completed` says of the runner's end, as the metrics spec
/// counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    /// The job never had a runner (cancelled while queued): no stop, no
    /// run time, not a completion, whose count is of runners that got to
    /// their job's end.
    NoRunner,
    /// The runner reported its job's start (pre-job) and, by now, not its
    /// end: its post-job hook never ran, so it did not get to its end
    /// whatever the job's conclusion. A crash, which the leader counts
    /// once the runner has ended (`reports::count_crashes`); a post-job
    /// report that still comes writes the stop then. Or its machine died
    /// while it ran, and the reconciler counted the crash already.
    Crashed,
    /// The runner got to its end: its post-job report came, or it runs no
    /// hooks and GitHub's word is all there is (the spec's `normal`).
    Stopped,
}

async fn ending(
    service: &Service,
    payload: &WorkflowJob,
    job: &Job,
    runner: Option<&Runner>,
    reports: Option<&[(String, String)]>,
) -> Ending {
    // GitHub names no runner and runway saw no start: nothing ran it.
    let named = payload
        .runner_name
        .as_deref()
        .is_some_and(|n| !n.is_empty());
    if !named && job.started_at.is_none() {
        return Ending::NoRunner;
    }
    let Some(runner) = runner else {
        return Ending::Stopped;
    };
    // Its machine died while it ran (the reconciler counted the crash).
    if let Ok(true) = service
        .store
        .once_claimed(&runway_store::crash_key(runner.id))
        .await
    {
        return Ending::Crashed;
    }
    // Reports that could not be read: GitHub's word stands, as for a
    // runner without hooks.
    let said = |phase: &str| reports.is_some_and(|r| r.iter().any(|(p, _)| p == phase));
    if said("pre-job") && !said("post-job") {
        tracing::info!(runner = %runner.name, "GitHub says the job completed, but its runner never reported the job's end: counted as a crash, not a stop");
        Ending::Crashed
    } else {
        Ending::Stopped
    }
}
