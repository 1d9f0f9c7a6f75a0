//! What a runner's job looked like, for the event log and the metrics the
//! GitHub-runner metrics spec (seed 002) asks for, from two sources: the
//! runner's own pre-/post-job reports (`POST /api/v1/runners/{id}/metrics`,
//! sent by `contrib/github-runner-hooks`) and GitHub's `workflow_job`
//! webhooks. Whichever says it first writes the event, once per runner
//! (a once-key in the store, so replicas agree): a report carries what a
//! webhook does not (the triggering event, the runner's own clock), a
//! webhook covers runners without the hooks.
//!
//! - `runner_start`: `idle` is how long the runner was idle before the job
//!   (from when it became ready), observed in
//!   `runway_runner_idle_duration_seconds`.
//! - `runner_stop`: `status` as the spec lists it, `normal` or
//!   `repo-policy-check-failure`; `duration` from the pre-job report.
//! - A crash, as the spec defines it: a pre-job report with no post-job
//!   report once the runner has ended, or once [`JOB_TIMEOUT`] has passed.
//!   Counted once per runner in `runway_runners_crashed_total`, whoever saw
//!   it first (the reconciler counts a busy runner's machine gone).

use std::collections::BTreeMap;
use std::time::Duration;

use runway_core::{Runner, RunnerId, Timestamp};
use runway_store::{crash_key, StoreError};
use serde_json::{json, Value};

use crate::app::Service;
use crate::telemetry::events::JobContext;
use crate::telemetry::metrics::PoolLabel;

/// How long a runner that reported pre-job and no post-job may still be
/// running its job: GitHub's default `timeout-minutes` (360). A job
/// configured longer that is still running is counted crashed then.
pub const JOB_TIMEOUT: Duration = Duration::from_secs(6 * 3600);

/// How long after its runner ended a post-job report may still arrive (it
/// is sent as the job ends, while the machine is being removed).
pub const POST_JOB_GRACE: Duration = Duration::from_secs(60);

/// How many unfinished reports one check reads.
const CHECK_LIMIT: u32 = 1_000;

/// A pre-job report's facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreJob {
    pub workflow: String,
    pub repository: String,
    pub event: String,
    pub run_id: Option<u64>,
    pub at: Timestamp,
}

impl PreJob {
    /// A stored pre-job report's body, as the report endpoint validated it.
    pub fn parse(body: &str) -> Option<PreJob> {
        let value: Value = serde_json::from_str(body).ok()?;
        let text = |key: &str| value[key].as_str().unwrap_or_default().to_owned();
        let run_id = match &value["workflow_run_id"] {
            Value::Number(number) => number.as_u64(),
            Value::String(text) => text.parse().ok(),
            _ => None,
        };
        let seconds = value["timestamp"].as_f64()?;
        Some(PreJob {
            workflow: text("workflow"),
            repository: text("repository"),
            event: text("event"),
            run_id,
            at: Timestamp::from_millis((seconds * 1_000.0).round() as i64),
        })
    }

    fn context<'a>(&'a self, flavor: &'a str) -> JobContext<'a> {
        JobContext {
            flavor,
            workflow: &self.workflow,
            repo: &self.repository,
            github_event: &self.event,
        }
    }
}

fn start_key(runner: &Runner) -> String {
    format!("runner_start:{}", runner.id.0)
}

fn stop_key(runner: &Runner) -> String {
    format!("runner_stop:{}", runner.id.0)
}

/// Whether this replica is the first to say `key` (kept until retention
/// prunes once-keys). A store that cannot answer says yes: an event
/// written twice is better than one lost.
async fn first(service: &Service, key: &str, now: Timestamp) -> bool {
    match service
        .store
        .claim_once(key, now, Timestamp::from_millis(0))
        .await
    {
        Ok(first) => first,
        Err(error) => {
            tracing::debug!(%error, key, "cannot claim an event once; writing it anyway");
            true
        }
    }
}

/// How long `runner` was idle before a job started on it at `at`.
pub fn idle_before(runner: &Runner, at: Timestamp) -> Option<f64> {
    runner
        .idle_at
        .filter(|idle| *idle <= at)
        .map(|idle| at.since(idle).as_secs_f64())
}

/// `runner_start` for `runner`'s job, begun at `at`, unless already said.
pub async fn started(
    service: &Service,
    runner: &Runner,
    context: &JobContext<'_>,
    at: Timestamp,
    now: Timestamp,
) {
    if !first(service, &start_key(runner), now).await {
        return;
    }
    let idle = idle_before(runner, at);
    if let Some(idle) = idle {
        service
            .metrics
            .runner_idle_duration
            .get_or_create(&PoolLabel {
                pool: runner.pool.clone(),
            })
            .observe(idle);
    }
    service.events.emit(
        "runner_start",
        context.fields(at, json!({"idle": idle.unwrap_or(0.0).round() as u64})),
        now,
    );
}

/// The fields of a `runner_stop`: the spec's `status`, the job's
/// `duration` when known, and `extra` (a conclusion, the rule that refused
/// the job).
pub fn stop_fields(status: &str, duration: Option<f64>, extra: Value) -> Value {
    let mut fields = json!({"status": status});
    if let Some(duration) = duration {
        fields["duration"] = json!(duration.max(0.0).round() as u64);
    }
    if let (Value::Object(fields), Value::Object(extra)) = (&mut fields, extra) {
        fields.extend(extra);
    }
    fields
}

/// `runner_stop` for `runner`'s job, ended at `at`, unless already said.
pub async fn stopped(
    service: &Service,
    runner: &Runner,
    context: &JobContext<'_>,
    at: Timestamp,
    fields: Value,
    now: Timestamp,
) {
    if !first(service, &stop_key(runner), now).await {
        return;
    }
    service
        .events
        .emit("runner_stop", context.fields(at, fields), now);
}

/// `runner`'s pre-job report, if it sent one.
pub async fn pre_job_of(service: &Service, runner: RunnerId) -> Result<Option<PreJob>, StoreError> {
    Ok(service
        .store
        .runner_reports(runner)
        .await?
        .iter()
        .find(|(phase, _)| phase == "pre-job")
        .and_then(|(_, body)| PreJob::parse(body)))
}

/// A pre-job report arrived (validated and stored): its run's event is
/// known from now on, and the job started.
pub async fn pre_job(service: &Service, runner: &Runner, report: &PreJob, now: Timestamp) {
    if let Some(run_id) = report.run_id {
        crate::app::access::remember_event(service, &report.repository, run_id, &report.event);
    }
    started(
        service,
        runner,
        &report.context(&runner.pool),
        report.at,
        now,
    )
    .await;
}

/// A post-job report arrived (validated and stored) with `status`: the
/// job ended.
pub async fn post_job(
    service: &Service,
    runner: &Runner,
    status: &str,
    at: Timestamp,
    extra: Value,
    now: Timestamp,
) {
    let pre = match pre_job_of(service, runner.id).await {
        Ok(pre) => pre,
        Err(error) => {
            tracing::debug!(%error, runner = %runner.id, "cannot read the pre-job report");
            None
        }
    };
    let duration = pre.as_ref().map(|pre| at.since(pre.at).as_secs_f64());
    let fields = stop_fields(status, duration, extra);
    let context = match &pre {
        Some(pre) => pre.context(&runner.pool),
        None => JobContext {
            flavor: &runner.pool,
            workflow: "",
            repo: "",
            github_event: "",
        },
    };
    stopped(service, runner, &context, at, fields, now).await;
}

/// Counts the runners that reached pre-job and never post-job (the spec's
/// crash): ended at least [`POST_JOB_GRACE`] ago, or reported pre-job
/// [`JOB_TIMEOUT`] ago. Each is counted once (`crash_key`), with the
/// reconciler's own crashes; returns how many by pool.
pub async fn count_crashes(
    service: &Service,
    now: Timestamp,
) -> Result<BTreeMap<String, u32>, StoreError> {
    let store = &service.store;
    let from = now.minus(JOB_TIMEOUT + Duration::from_secs(3600));
    let mut crashed = BTreeMap::new();
    for (id, at, _) in store.unfinished_reports(from, now, CHECK_LIMIT).await? {
        let Some(runner) = store.get_runner(id).await? else {
            continue;
        };
        let ended = runner
            .ended_at
            .is_some_and(|ended| now.since(ended) >= POST_JOB_GRACE);
        if !(ended || now.since(at) >= JOB_TIMEOUT) {
            continue;
        }
        if !store
            .claim_once(&crash_key(id), now, Timestamp::from_millis(0))
            .await?
        {
            continue;
        }
        count_crash(service, &runner);
        *crashed.entry(runner.pool.clone()).or_default() += 1;
        tracing::warn!(target: "runway::events", event = "runner_crashed", runner = %runner.id, name = %runner.name, pool = %runner.pool, "a runner reported its job's start and never its end");
    }
    Ok(crashed)
}

/// Counts `runner`'s crash, seen by the reconciler or a lease's expiry,
/// unless it was counted already: true when this call counted it.
pub async fn crash_seen(service: &Service, runner: &Runner, now: Timestamp) -> bool {
    if !first(service, &crash_key(runner.id), now).await {
        return false;
    }
    count_crash(service, runner);
    true
}

/// One more crash of `runner`'s pool in `runway_runners_crashed_total`.
fn count_crash(service: &Service, runner: &Runner) {
    service
        .metrics
        .runners_crashed
        .get_or_create(&PoolLabel {
            pool: runner.pool.clone(),
        })
        .inc();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_pre_job_report_reads_back() {
        let body = r#"{"phase":"pre-job","workflow":"ci","repository":"o/r","event":"pull_request","workflow_run_id":"77","timestamp":1700000000.5}"#;
        assert_eq!(
            PreJob::parse(body),
            Some(PreJob {
                workflow: "ci".into(),
                repository: "o/r".into(),
                event: "pull_request".into(),
                run_id: Some(77),
                at: Timestamp::from_millis(1_700_000_000_500),
            })
        );
        assert_eq!(PreJob::parse("{}"), None);
        assert_eq!(PreJob::parse("not json"), None);
    }
}
