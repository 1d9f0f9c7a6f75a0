//! Healing what webhooks lose. GitHub does not retry a delivery that
//! failed, so runway does two things:
//!
//! - **re-checks**: a GitHub job still queued in the store after `[github]
//!   recheck_after` is looked up (`GET …/actions/jobs/{id}`); if it started,
//!   finished or was cancelled, the store is corrected exactly as the lost
//!   webhook would have done, and the job stops creating demand;
//! - **redelivery**: every `[github] redeliver_interval` the hook's
//!   deliveries since the last look are listed (all of them: GitHub's
//!   `status=failure` filter leaves out the attempts runway never
//!   answered), and each `workflow_job` event whose newest attempt failed
//!   is redelivered, unless runway has that delivery after all. A pass
//!   reads at most [`MAX_DELIVERY_PAGES`] pages and the next pass goes on
//!   from where it stopped, so a lost delivery behind any number of newer
//!   ones is reached. A redelivery that fails too is asked again (once per
//!   failed attempt, at most [`MAX_ASKS`] times per event, never for an
//!   attempt older than GitHub keeps), so one more outage does not lose
//!   the job.
//!
//! Both spend the request budget at the lowest priorities, so JIT configs
//! and deregistrations always come first.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runway_core::github::WorkflowJobAction;
use runway_core::{JobId, JobSource, JobState, Timestamp};
use runway_store::{JobFilter, StoreError};

use crate::app::Service;
use crate::github::api::{parse_time, Delivery, GithubClient, GithubError, Hook};
use crate::github::payload::WorkflowJob;
use crate::telemetry::metrics::ReasonLabel;

/// Pages of deliveries read per pass at most (100 each).
const MAX_DELIVERY_PAGES: usize = 10;
/// How far back the very first pass looks.
const FIRST_LOOK_BACK: Duration = Duration::from_secs(3600);
/// Each pass looks this far behind the last one, in case GitHub lists a
/// delivery late; what was already redelivered is not asked again.
const OVERLAP: Duration = Duration::from_secs(60);
/// How long a redelivery request is remembered: longer than GitHub keeps
/// deliveries (three days).
const REMEMBER: Duration = Duration::from_secs(7 * 24 * 3600);
/// GitHub keeps deliveries this long: an older attempt is not redelivered.
const MAX_AGE: Duration = Duration::from_secs(3 * 24 * 3600);
/// Redeliveries asked for one event at most: an event runway keeps
/// refusing (a wrong secret, say) is not asked for forever.
pub const MAX_ASKS: u32 = 5;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RecheckReport {
    /// Jobs looked up.
    pub checked: u32,
    /// Jobs the store had wrong, now corrected.
    pub corrected: u32,
    /// Jobs left for a later pass because the budget said wait.
    pub deferred: u32,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RedeliverReport {
    /// Failed `workflow_job` deliveries found.
    pub failed: u32,
    /// Of those, asked to be redelivered now.
    pub redelivered: u32,
}

pub struct Healer {
    service: Arc<Service>,
    client: Arc<GithubClient>,
    /// When each queued job was last looked up.
    checked: Mutex<BTreeMap<JobId, Timestamp>>,
}

impl Healer {
    /// The store as this leader's term sees it (`Service::leader_store`).
    fn store(&self) -> Arc<dyn runway_store::Store> {
        self.service.leader_store()
    }

    pub fn new(service: Arc<Service>, client: Arc<GithubClient>) -> Healer {
        Healer {
            service,
            client,
            checked: Mutex::new(BTreeMap::new()),
        }
    }

    fn count_recheck(&self, what: &'static str) {
        self.service
            .metrics
            .github_job_rechecks
            .get_or_create(&ReasonLabel { reason: what })
            .inc();
    }

    /// One pass over the queued GitHub jobs older than `recheck_after`,
    /// each looked up at most once per `recheck_after`.
    pub async fn recheck_once(&self, now: Timestamp) -> Result<RecheckReport, StoreError> {
        let after = self.service.config().github.recheck_after;
        let queued = self
            .store()
            .list_jobs(&JobFilter {
                state: Some(JobState::Queued),
                ..JobFilter::default()
            })
            .await?;
        let due: Vec<_> = {
            let Ok(mut checked) = self.checked.lock() else {
                return Ok(RecheckReport::default());
            };
            // Forget jobs that are no longer queued.
            let live: BTreeSet<JobId> = queued.iter().map(|j| j.id).collect();
            checked.retain(|id, _| live.contains(id));
            queued
                .into_iter()
                .filter(|job| job.source == JobSource::Github)
                .filter(|job| now.since(job.created_at) >= after)
                .filter(|job| {
                    checked
                        .get(&job.id)
                        .is_none_or(|last| now.since(*last) >= after)
                })
                .collect()
        };
        let mut report = RecheckReport::default();
        for (index, job) in due.iter().enumerate() {
            let facts = crate::app::intake::GithubFacts::parse(&job.payload);
            let (Some(repository), Ok(github_id)) =
                (facts.repository.as_deref(), job.external_id.parse::<u64>())
            else {
                continue; // Nothing to look it up by.
            };
            let status = match self
                .client
                .get_job(&self.service.metrics, repository, github_id)
                .await
            {
                Ok(status) => status,
                Err(GithubError::Budget { .. }) => {
                    report.deferred = (due.len() - index) as u32;
                    break;
                }
                Err(error) => {
                    self.count_recheck("error");
                    tracing::warn!(job = %job.id, %error, "cannot re-check a queued GitHub job");
                    continue;
                }
            };
            report.checked += 1;
            if let Ok(mut checked) = self.checked.lock() {
                checked.insert(job.id, now);
            }
            let action = match status.status.as_str() {
                "in_progress" if status.runner_name.is_some() => WorkflowJobAction::InProgress,
                "completed" => WorkflowJobAction::Completed,
                _ => {
                    self.count_recheck("queued");
                    continue; // Still waiting at GitHub too.
                }
            };
            let observed = WorkflowJob {
                action: action.as_str().to_owned(),
                job_id: github_id,
                run_id: facts.run_id,
                name: facts.name.clone(),
                labels: job.labels.clone(),
                runner_name: status.runner_name.clone().filter(|n| !n.is_empty()),
                conclusion: status.conclusion.clone(),
                repository: Some(repository.to_owned()),
                workflow: facts.workflow.clone(),
                created_at: facts.created_at_ms.map(Timestamp::from_millis),
                started_at: status.started_at.as_deref().and_then(parse_time),
                completed_at: status.completed_at.as_deref().and_then(parse_time),
                scale_set: None,
            };
            match crate::app::intake::apply_observed(&self.service, &observed, action, now).await {
                Ok(crate::app::intake::WebhookOutcome::NoChange) => self.count_recheck("queued"),
                Ok(_) => {
                    report.corrected += 1;
                    let what = match action {
                        WorkflowJobAction::InProgress => "started",
                        _ => "completed",
                    };
                    self.count_recheck(what);
                    tracing::info!(job = %job.id, github_job = github_id, status = %status.status, "re-check corrected a job whose webhook was lost");
                }
                Err(error) => {
                    self.count_recheck("error");
                    tracing::warn!(job = %job.id, error = %error.message, "cannot apply a re-check");
                }
            }
        }
        if report.corrected > 0 {
            self.service.reconcile_wanted.notify_one();
        }
        Ok(report)
    }

    fn cursor_key(hook: &Hook) -> String {
        format!("github.deliveries.{hook}.checked_until")
    }

    fn walk_key(hook: &Hook) -> String {
        format!("github.deliveries.{hook}.walk")
    }

    /// One pass over `hook`'s deliveries: from the newest down to the last
    /// pass's newest, or, when the last pass stopped at the page cap, on
    /// down from where it stopped.
    pub async fn redeliver_once(
        &self,
        hook: &Hook,
        now: Timestamp,
    ) -> Result<RedeliverReport, StoreError> {
        let store = &self.store();
        let walk_key = Healer::walk_key(hook);
        let walk = store
            .get_setting(&walk_key)
            .await?
            .and_then(|text| serde_json::from_str::<Walk>(&text).ok());
        let mut walk = match walk {
            Some(walk) => walk,
            None => {
                let checked_until = store
                    .get_setting(&Healer::cursor_key(hook))
                    .await?
                    .and_then(|text| text.parse::<i64>().ok());
                let since = match checked_until {
                    Some(until) => until - OVERLAP.as_millis() as i64,
                    None => now.minus(FIRST_LOOK_BACK).as_millis(),
                };
                Walk {
                    since,
                    newest: checked_until.unwrap_or(since),
                    cursor: None,
                }
            }
        };
        // Newest first: the first attempt seen of an event is its newest.
        let mut newest_attempts: Vec<Delivery> = Vec::new();
        let mut guids = BTreeSet::new();
        let mut complete = false;
        for _ in 0..MAX_DELIVERY_PAGES {
            let page = match self
                .client
                .list_deliveries(&self.service.metrics, hook, walk.cursor.as_deref())
                .await
            {
                Ok(page) => page,
                Err(error) => {
                    tracing::warn!(%hook, %error, "cannot list webhook deliveries; next interval");
                    return Ok(RedeliverReport::default());
                }
            };
            let mut reached_old = false;
            for delivery in page.deliveries {
                let Some(at) = parse_time(&delivery.delivered_at) else {
                    continue;
                };
                if at.as_millis() <= walk.since {
                    reached_old = true;
                    break; // The rest were seen by an earlier walk.
                }
                walk.newest = walk.newest.max(at.as_millis());
                if delivery.event == "workflow_job" && guids.insert(delivery.guid.clone()) {
                    newest_attempts.push(delivery);
                }
            }
            match page.next_cursor {
                Some(next) if !reached_old => walk.cursor = Some(next),
                _ => {
                    complete = true;
                    break;
                }
            }
        }
        let mut report = RedeliverReport::default();
        let mut all_done = true;
        // Oldest first: a job's `queued` before its `completed`.
        for delivery in newest_attempts.iter().rev() {
            if !delivery.failed() {
                continue;
            }
            let too_old =
                parse_time(&delivery.delivered_at).is_none_or(|at| at < now.minus(MAX_AGE));
            if too_old || store.delivery_seen(&delivery.guid).await? {
                continue; // Gone from GitHub, or it reached runway after all.
            }
            report.failed += 1;
            match self.ask(hook, delivery, now).await? {
                Asked::Now => report.redelivered += 1,
                Asked::Before | Asked::Enough => {}
                Asked::Failed { budget } => {
                    all_done = false;
                    if budget {
                        break;
                    }
                }
            }
        }
        if !all_done {
            // Read this stretch again next time; what was asked is not
            // asked again.
            return Ok(report);
        }
        if complete {
            store
                .put_setting(&Healer::cursor_key(hook), &walk.newest.to_string())
                .await?;
            store.put_setting(&walk_key, "").await?; // No walk under way.
        } else {
            let text = serde_json::to_string(&walk).unwrap_or_default();
            store.put_setting(&walk_key, &text).await?;
        }
        Ok(report)
    }

    /// Asks GitHub to redeliver the event of `attempt`, its newest failed
    /// attempt: once per failed attempt, across restarts and replicas
    /// sharing the store, and at most [`MAX_ASKS`] times per event.
    async fn ask(
        &self,
        hook: &Hook,
        attempt: &Delivery,
        now: Timestamp,
    ) -> Result<Asked, StoreError> {
        let store = &self.store();
        let forget_before = now.minus(REMEMBER);
        let once = format!("github.redeliver.{hook}.{}", attempt.id);
        if !store.claim_once(&once, now, forget_before).await? {
            return Ok(Asked::Before);
        }
        let mut slot = None;
        for n in 0..MAX_ASKS {
            let key = format!("github.redeliver.{hook}.{}.{n}", attempt.guid);
            if store.claim_once(&key, now, forget_before).await? {
                slot = Some(key);
                break;
            }
        }
        let Some(slot) = slot else {
            tracing::warn!(%hook, guid = %attempt.guid, asks = MAX_ASKS, "webhook delivery still failing after its redeliveries; given up (the re-check still corrects its job)");
            return Ok(Asked::Enough);
        };
        if self.service.may_act("github_redeliver").await.is_err() {
            // Deposed between its claims and the call: the once-keys were
            // written in this term (fenced), so the next leader asks.
            return Ok(Asked::Failed { budget: false });
        }
        match self
            .client
            .redeliver(&self.service.metrics, hook, attempt.id)
            .await
        {
            Ok(()) => {
                self.service.metrics.github_redeliveries.inc();
                tracing::info!(%hook, delivery = attempt.id, guid = %attempt.guid, action = ?attempt.action, "asked GitHub to redeliver a failed webhook");
                Ok(Asked::Now)
            }
            Err(error) => {
                // Not done: ask again next time.
                store.forget_once(&slot).await?;
                store.forget_once(&once).await?;
                tracing::warn!(%hook, delivery = attempt.id, %error, "cannot redeliver; next interval");
                Ok(Asked::Failed {
                    budget: matches!(error, GithubError::Budget { .. }),
                })
            }
        }
    }
}

/// Where a walk down the delivery list stands: deliveries newer than
/// `since` are its window; `cursor` is the next page to read (`None`: the
/// newest); `newest` the newest delivery time seen.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Walk {
    since: i64,
    newest: i64,
    cursor: Option<String>,
}

enum Asked {
    Now,
    /// This attempt was asked for already.
    Before,
    /// The event was asked for [`MAX_ASKS`] times.
    Enough,
    /// GitHub refused or could not be asked (`budget`: the request budget
    /// said wait).
    Failed {
        budget: bool,
    },
}

/// How often queued jobs are looked at: often enough that a job is
/// re-checked soon after it becomes due.
pub fn recheck_period(recheck_after: Duration) -> Duration {
    (recheck_after / 5).clamp(Duration::from_secs(1), Duration::from_secs(60))
}

/// Runs re-checks and, when `[github] deliveries` names a hook,
/// redelivery, until `shutdown` flips.
pub async fn run(healer: Arc<Healer>, shutdown: tokio::sync::watch::Receiver<bool>) {
    let service = healer.service.clone();
    let config = &service.config().github;
    let leading = || service.is_leader();
    // Leader-only: another replica heals while this one follows.
    let rechecks = crate::tasks::Worker {
        name: "github_recheck",
        period: recheck_period(config.recheck_after),
        leader_only: true,
        first_round_at_once: false,
        wake: None,
    }
    .run(&service.tasks, &leading, shutdown.clone(), || {
        let healer = healer.clone();
        async move { healer.recheck_once(crate::clock::now()).await.map(|_| ()) }
    });
    // Every replica: each shows the warnings in its own GET /api/v1/pools.
    let runner_groups = crate::tasks::Worker {
        name: "github_runner_groups",
        period: std::time::Duration::from_secs(600),
        leader_only: false,
        first_round_at_once: true,
        wake: Some(&service.config_replaced),
    }
    .run(&service.tasks, &leading, shutdown.clone(), || {
        let service = service.clone();
        async move { crate::app::access::check_runner_groups(&service).await }
    });
    let rechecks = async { tokio::join!(rechecks, runner_groups) };
    let Some(hook) = config.deliveries.clone() else {
        rechecks.await;
        return;
    };
    let redeliveries = crate::tasks::Worker {
        name: "github_redeliver",
        period: config.redeliver_interval,
        leader_only: true,
        first_round_at_once: false,
        wake: None,
    }
    .run(&service.tasks, &leading, shutdown, || {
        let (healer, hook) = (healer.clone(), hook.clone());
        async move {
            healer
                .redeliver_once(&hook, crate::clock::now())
                .await
                .map(|_| ())
        }
    });
    tokio::join!(rechecks, redeliveries);
}
