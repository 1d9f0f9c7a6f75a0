//! Held jobs (issue 58). A new GitHub job whose candidate pools need facts
//! of its workflow run (`forks = "deny"`, an `events` list) that GitHub
//! cannot give right now (the run lookup fails, the request budget is
//! spent) is stored `held`: the webhook gets its 2xx, nothing claims the
//! job, no machine starts for it. The leader looks each held run up again
//! with backoff ([`FIRST_RETRY`], doubling to [`MAX_RETRY`], once per run
//! however many of its jobs wait), within the request budget, and routes
//! the job as intake would have: to the first pool that admits it, or
//! `unroutable` when every pool refuses it. After `[github]
//! run_facts_wait` without the facts it is given up as `unroutable`, with
//! the reason. It never runs on a pool that needs facts it lacks.
//!
//! A released job is queued with the fair-share tag a requeued job keeps:
//! it takes its turn before the jobs that arrived after it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use runway_core::job::Route;
use runway_core::{Job, JobEvent, JobState, Timestamp};
use runway_store::{JobFilter, StoreError};

use super::{count_rejection, route_new_job, share_in, Entry, GithubFacts, ACCESS_REFUSED};
use crate::app::Service;
use crate::github::payload::WorkflowJob;
use crate::telemetry::metrics::PoolLabel;

/// The first look again at a run whose facts were unknown.
pub const FIRST_RETRY: Duration = Duration::from_secs(10);
/// The longest wait between two looks at one run.
pub const MAX_RETRY: Duration = Duration::from_secs(300);
/// Held jobs read per pass at most (oldest first); the rest wait a pass.
const PER_PASS: u32 = 500;

/// A run: `(repository in lower case, run id)`.
type Run = (String, u64);

/// When each held run may be looked up again, and how many looks failed.
#[derive(Default)]
pub struct HeldRetries {
    next: Mutex<BTreeMap<Run, (Timestamp, u32)>>,
}

impl HeldRetries {
    fn due(&self, run: Option<&Run>, now: Timestamp) -> bool {
        let Some(run) = run else { return true };
        self.next
            .lock()
            .map(|next| next.get(run).is_none_or(|(at, _)| *at <= now))
            .unwrap_or(true)
    }

    fn failed(&self, run: Option<Run>, now: Timestamp) {
        let (Some(run), Ok(mut next)) = (run, self.next.lock()) else {
            return;
        };
        let failures = next.get(&run).map_or(0, |(_, failures)| *failures);
        let wait = FIRST_RETRY
            .saturating_mul(1 << failures.min(16))
            .min(MAX_RETRY);
        next.insert(run, (now.plus(wait), failures + 1));
    }

    fn keep_only(&self, live: &BTreeSet<Run>) {
        if let Ok(mut next) = self.next.lock() {
            next.retain(|run, _| live.contains(run));
        }
    }
}

/// What one pass over the held jobs did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct HeldReport {
    /// Held jobs read.
    pub held: u32,
    /// Routed to a pool now that the facts came.
    pub released: u32,
    /// Given up as `unroutable` (refused by every pool, or past `run_facts_wait`).
    pub given_up: u32,
    /// Still held: their run is backing off, or GitHub still cannot say.
    pub waiting: u32,
}

/// The webhook a held job came from, as far as its stored facts tell.
fn its_webhook(job: &Job, facts: &GithubFacts) -> WorkflowJob {
    WorkflowJob {
        action: "queued".to_owned(),
        job_id: job.external_id.parse().unwrap_or_default(),
        run_id: facts.run_id,
        name: facts.name.clone(),
        labels: job.labels.clone(),
        runner_name: None,
        conclusion: None,
        repository: facts.repository.clone(),
        workflow: facts.workflow.clone(),
        created_at: facts.created_at_ms.map(Timestamp::from_millis),
        started_at: None,
        completed_at: None,
        scale_set: None,
    }
}

fn seconds(duration: Duration) -> String {
    humantime::format_duration(Duration::from_secs(duration.as_secs())).to_string()
}

/// One pass (the leader's, every few seconds): each held job whose run is
/// due is routed again; one past `run_facts_wait` is given up.
pub async fn held_once(
    service: &Service,
    retries: &HeldRetries,
    now: Timestamp,
) -> Result<HeldReport, StoreError> {
    let store = service.leader_store();
    let held = store
        .list_jobs(&JobFilter {
            state: Some(JobState::Held),
            oldest_first: true,
            limit: Some(PER_PASS),
            ..JobFilter::default()
        })
        .await?;
    let wait = service.config().github.run_facts_wait;
    let mut report = HeldReport {
        held: held.len() as u32,
        ..HeldReport::default()
    };
    let mut live = BTreeSet::new();
    for job in held {
        let facts = GithubFacts::parse(&job.payload);
        let run = facts
            .repository
            .as_deref()
            .map(str::to_lowercase)
            .zip(facts.run_id);
        let overdue = now.since(job.created_at) >= wait;
        if !overdue && !retries.due(run.as_ref(), now) {
            live.extend(run);
            report.waiting += 1;
            continue;
        }
        let (event, rejection) = match route_new_job(service, &its_webhook(&job, &facts)).await {
            Entry::Route(Route::Pool(pool)) => {
                let share = share_in(service, &pool, facts.repository.as_deref());
                (JobEvent::Release { pool, share }, None)
            }
            Entry::Route(Route::Unroutable { reason }) => {
                let kind = if reason.starts_with(ACCESS_REFUSED) {
                    "access_policy"
                } else {
                    "no_matching_pool"
                };
                (JobEvent::GiveUp { reason }, Some(kind))
            }
            // Counted by the routing itself.
            Entry::GithubHosted => (
                JobEvent::GiveUp {
                    reason:
                        "it lacks a label of [github] required_labels (changed since it arrived)"
                            .to_owned(),
                },
                None,
            ),
            Entry::ScaleSetPool => (
                JobEvent::GiveUp {
                    reason: "its labels now name a scale-set pool, whose queue brings its jobs"
                        .to_owned(),
                },
                Some("no_matching_pool"),
            ),
            Entry::Undecided(why) | Entry::Route(Route::Held { reason: why }) => {
                if !overdue {
                    retries.failed(run.clone(), now);
                    live.extend(run);
                    report.waiting += 1;
                    continue;
                }
                let reason = format!(
                    "held {} waiting for GitHub to say what the pools serving its labels need to know of its workflow run; given up ([github] run_facts_wait = \"{}\"): {why}",
                    seconds(now.since(job.created_at)),
                    seconds(wait),
                );
                (JobEvent::GiveUp { reason }, Some("run_facts_unknown"))
            }
        };
        let next = match job.apply(&event, now) {
            Ok(next) => next,
            Err(error) => {
                tracing::debug!(job = %job.id, %error, "a held job moved meanwhile");
                continue;
            }
        };
        if !store.replace_job(&job, &next).await? {
            // Cancelled or ended by GitHub meanwhile: the next pass sees it.
            continue;
        }
        match &next.pool {
            Some(pool) => {
                report.released += 1;
                service
                    .metrics
                    .jobs_routed
                    .get_or_create(&PoolLabel { pool: pool.clone() })
                    .inc();
                service.job_arrived();
                service.job_queued(&next);
                tracing::info!(job = %job.id, external_id = %job.external_id, %pool, held_for = %seconds(now.since(job.created_at)), "held job released: GitHub gave its run's facts");
            }
            None => {
                report.given_up += 1;
                if let Some(kind) = rejection {
                    count_rejection(service, kind);
                }
                tracing::warn!(job = %job.id, external_id = %job.external_id, reason = ?next.reason, "held job given up");
            }
        }
    }
    retries.keep_only(&live);
    service
        .metrics
        .jobs_held_now
        .set(i64::from(report.held - report.released - report.given_up));
    Ok(report)
}

/// How often the leader looks at the held jobs: one indexed read of the
/// held rows (none, almost always), so a released job waits at most this
/// long beyond its run's backoff.
pub const PERIOD: Duration = Duration::from_secs(5);

/// Runs [`held_once`] on the leader every [`PERIOD`] until `shutdown`.
pub async fn run(service: std::sync::Arc<Service>, shutdown: tokio::sync::watch::Receiver<bool>) {
    let retries = std::sync::Arc::new(HeldRetries::default());
    crate::tasks::Worker {
        name: "held_jobs",
        period: PERIOD,
        leader_only: true,
        first_round_at_once: true,
        wake: None,
    }
    .run(&service.tasks, &|| service.is_leader(), shutdown, || {
        let (service, retries) = (service.clone(), retries.clone());
        async move {
            held_once(&service, &retries, crate::clock::now())
                .await
                .map(drop)
                .inspect_err(|_| service.store_failed("held_jobs"))
        }
    })
    .await
}
