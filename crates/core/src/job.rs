//! The job state machine (DESIGN §3).
//!
//! ```text
//! queued ──claim──► provisioning ──accept──► running ──complete──► completed
//!   ▲  ▲                │  (lease; keepalive extends it)
//!   │  └──decline───────┘  (the declining runner is excluded from this job)
//!   └──lease expired (attempts + 1; at max_attempts ► failed)
//! queued/provisioning ──external start (GitHub in_progress)──► running
//! any live state ──external completion (GitHub completed)──► completed
//! any live state ──cancel──► cancelled
//! (intake) ──no pool serves the labels──► unroutable
//! ```
//!
//! [`Job::apply`] is the only way a job changes state. The store persists its
//! result; it never decides a transition on its own (the one exception is the
//! single-statement claim, whose effect the store's conformance suite checks
//! against [`JobEvent::Claim`]).

use std::collections::BTreeSet;
use std::str::FromStr;

pub use crate::ids::JobId;
use crate::ids::RunnerId;
use crate::time::Timestamp;

/// Where a job came from. Together with the external id it identifies a job
/// across redeliveries, which is what makes enqueue idempotent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobSource {
    /// A GitHub `workflow_job` webhook; the external id is GitHub's job id.
    Github,
    /// runway's own job API; the external id is the submitter's key.
    Api,
}

impl JobSource {
    pub fn as_str(self) -> &'static str {
        match self {
            JobSource::Github => "github",
            JobSource::Api => "api",
        }
    }
}

impl FromStr for JobSource {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "github" => Ok(JobSource::Github),
            "api" => Ok(JobSource::Api),
            other => Err(UnknownName::new("job source", other)),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum JobState {
    /// Stored without a pool until GitHub gives the facts of its run that
    /// its pools need (issue 58; `runway_server::app::intake::held`).
    Held,
    Queued,
    Provisioning,
    Running,
    Completed,
    Failed,
    Cancelled,
    Unroutable,
}

names!(JobState, "job state", {
    Held => "held",
    Queued => "queued",
    Provisioning => "provisioning",
    Running => "running",
    Completed => "completed",
    Failed => "failed",
    Cancelled => "cancelled",
    Unroutable => "unroutable",
});

impl JobState {
    /// Terminal states never change again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Completed | JobState::Failed | JobState::Cancelled | JobState::Unroutable
        )
    }
}

/// How a completed job ended, in GitHub's vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Conclusion {
    Success,
    Failure,
    Cancelled,
    Skipped,
    TimedOut,
    Neutral,
    ActionRequired,
    Stale,
}

names!(Conclusion, "conclusion", {
    Success => "success",
    Failure => "failure",
    Cancelled => "cancelled",
    Skipped => "skipped",
    TimedOut => "timed_out",
    Neutral => "neutral",
    ActionRequired => "action_required",
    Stale => "stale",
});

/// A name read from outside (the store, the wire) that is not one we know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} {value:?}")]
pub struct UnknownName {
    pub kind: &'static str,
    pub value: String,
}

impl UnknownName {
    pub fn new(kind: &'static str, value: &str) -> UnknownName {
        UnknownName {
            kind,
            value: value.to_owned(),
        }
    }
}

/// One job as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub id: JobId,
    pub source: JobSource,
    pub external_id: String,
    /// The pool the job was routed to; `None` only for unroutable jobs.
    pub pool: Option<String>,
    pub labels: Vec<String>,
    pub state: JobState,
    /// Failed attempts so far (expired leases). Never decreases.
    pub attempts: u32,
    /// At this many failed attempts the job fails instead of being requeued.
    pub max_attempts: u32,
    /// The runner the job is bound to while provisioning or running, and the
    /// one that ran it once it has completed.
    pub runner: Option<RunnerId>,
    /// Until when the bound runner's claim holds without a keepalive. Only set
    /// while provisioning, or while running a job handed out by runway itself.
    pub lease_deadline: Option<Timestamp>,
    /// Runners that declined this job and are never offered it again.
    pub excluded_runners: BTreeSet<RunnerId>,
    /// Opaque source-specific data (the script of an API job, GitHub's run id).
    pub payload: String,
    pub created_at: Timestamp,
    /// When the job last entered its pool's queue (reset on every
    /// requeue); its place in the queue is its fair-share tag, which the
    /// store keeps (`crate::share`).
    pub enqueued_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    pub conclusion: Option<Conclusion>,
    /// Why the job is failed, cancelled or unroutable.
    pub reason: Option<String>,
    /// Bumped by every change; the store's compare-and-set token.
    pub version: i64,
    /// Who the job counts against in its pool's fair share.
    pub share: crate::share::Share,
}

/// Where intake sent a new job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Pool(String),
    /// No pool serves the job's labels; the job is stored as `unroutable`.
    Unroutable {
        reason: String,
    },
    /// The pools serving its labels cannot judge it yet (its workflow
    /// run's facts are unknown): stored as `held`, with `reason`.
    Held {
        reason: String,
    },
}

/// A job as intake hands it to the store, before it has an id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewJob {
    pub source: JobSource,
    pub external_id: String,
    pub route: Route,
    pub labels: Vec<String>,
    pub payload: String,
    pub max_attempts: u32,
    /// Who the job counts against in its pool's fair share (default: the
    /// pool's one anonymous key, weight 1).
    pub share: crate::share::Share,
}

impl NewJob {
    /// A job of runway's own API for `pool`, with `labels`, an empty
    /// payload, three attempts and the pool's anonymous share: what the
    /// tests, benchmarks and seeding helpers enqueue.
    pub fn api(external_id: impl Into<String>, pool: &str, labels: &[&str]) -> NewJob {
        NewJob {
            source: JobSource::Api,
            external_id: external_id.into(),
            route: Route::Pool(pool.to_owned()),
            labels: labels.iter().map(|l| (*l).to_owned()).collect(),
            payload: "{}".into(),
            max_attempts: 3,
            share: Default::default(),
        }
    }

    /// The job as first stored: queued in its pool, held without one, or
    /// terminal `unroutable`.
    pub fn initial(&self, id: JobId, now: Timestamp) -> Job {
        let (state, pool, reason, finished_at) = match &self.route {
            Route::Pool(pool) => (JobState::Queued, Some(pool.clone()), None, None),
            Route::Unroutable { reason } => {
                (JobState::Unroutable, None, Some(reason.clone()), Some(now))
            }
            Route::Held { reason } => (JobState::Held, None, Some(reason.clone()), None),
        };
        Job {
            id,
            source: self.source,
            external_id: self.external_id.clone(),
            pool,
            labels: self.labels.clone(),
            state,
            attempts: 0,
            max_attempts: self.max_attempts.max(1),
            runner: None,
            lease_deadline: None,
            excluded_runners: BTreeSet::new(),
            payload: self.payload.clone(),
            created_at: now,
            enqueued_at: now,
            started_at: None,
            finished_at,
            conclusion: None,
            reason,
            version: 0,
            share: self.share.clone(),
        }
    }
}

/// One step of a job's history (`GET /api/v1/jobs/{id}/events`): the
/// state it entered, when, on which runner, and why. The store appends one
/// with every change of state or attempt, in the same statement as the
/// change; a keepalive is not a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobStep {
    pub at: Timestamp,
    pub state: JobState,
    /// The runner it was on or went to (the one that declined it, or
    /// whose lease expired, for a requeue).
    pub runner: Option<RunnerId>,
    /// The failed attempts so far, when this step counted one (an expired lease).
    pub attempts: Option<u32>,
    pub conclusion: Option<Conclusion>,
    pub reason: Option<String>,
}

impl Job {
    /// The step that created the job: queued, or held or unroutable with
    /// intake's reason.
    pub fn first_step(&self) -> JobStep {
        let routed = !matches!(self.state, JobState::Unroutable | JobState::Held);
        JobStep {
            at: self.created_at,
            state: if routed { JobState::Queued } else { self.state },
            runner: None,
            attempts: None,
            conclusion: None,
            reason: if routed { None } else { self.reason.clone() },
        }
    }

    /// The step from `self` to `next`, if it is one (a state or an
    /// attempt changed). Its time is the one the state machine set for
    /// the state entered (a claim, which sets none, passes `claimed_at`).
    pub fn step_to(&self, next: &Job, claimed_at: Option<Timestamp>) -> Option<JobStep> {
        if self.state == next.state && self.attempts == next.attempts {
            return None;
        }
        let at = match next.state {
            JobState::Queued => Some(next.enqueued_at),
            JobState::Provisioning => claimed_at,
            JobState::Running => next.started_at,
            _ => next.finished_at,
        };
        let latest = [Some(next.enqueued_at), next.started_at, next.finished_at]
            .into_iter()
            .flatten()
            .max()
            .unwrap_or(next.created_at);
        Some(JobStep {
            at: at.unwrap_or(latest),
            state: next.state,
            runner: next.runner.or(self.runner),
            attempts: (next.attempts != self.attempts).then_some(next.attempts),
            conclusion: next.conclusion,
            reason: next.reason.clone(),
        })
    }
}

impl GuardedChange {
    /// The step this change makes where its guard holds (a heartbeat makes none).
    pub fn step(&self) -> Option<JobStep> {
        if self.set.state == self.state {
            return None;
        }
        let at = self
            .set
            .finished
            .map(|(at, _)| at)
            .or(self.set.started_at)?;
        Some(JobStep {
            at,
            state: self.set.state,
            runner: Some(self.runner),
            attempts: None,
            conclusion: self.set.finished.map(|(_, c)| c),
            reason: None,
        })
    }
}

/// Everything that can happen to a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobEvent {
    /// A runner takes the job under a lease; the job waits for its accept.
    Claim {
        runner: RunnerId,
        lease_deadline: Timestamp,
    },
    /// The holder extends its lease (provisioning keepalive or running heartbeat).
    Keepalive {
        runner: RunnerId,
        lease_deadline: Timestamp,
    },
    /// The holder really started the job.
    Accept {
        runner: RunnerId,
    },
    /// The holder will not run the job: back to the tail, never to this runner.
    Decline {
        runner: RunnerId,
    },
    /// The holder finished the job.
    Complete {
        runner: RunnerId,
        conclusion: Conclusion,
    },
    /// Someone else assigned the job and it started (GitHub's `in_progress`).
    ExternalStart {
        runner: RunnerId,
    },
    /// Someone else says the job is over (GitHub's `completed`), naming the
    /// runner it ran on when it knows.
    ExternalComplete {
        conclusion: Conclusion,
        runner: Option<RunnerId>,
    },
    Cancel {
        reason: String,
    },
    /// A held job's facts came and a pool admits it: queued there, counted
    /// against `share`.
    Release {
        pool: String,
        share: crate::share::Share,
    },
    /// A held job is given up: no pool will take it (`reason` says why).
    GiveUp {
        reason: String,
    },
    /// The lease deadline passed without a keepalive.
    LeaseExpired,
    /// The holder's machine is gone (its provider no longer lists it, or
    /// the cloud took it back): what a lease expiry would conclude, at
    /// once rather than at the deadline.
    HolderLost {
        runner: RunnerId,
    },
}

impl JobEvent {
    pub fn name(&self) -> &'static str {
        match self {
            JobEvent::Claim { .. } => "claim",
            JobEvent::Keepalive { .. } => "keepalive",
            JobEvent::Accept { .. } => "accept",
            JobEvent::Decline { .. } => "decline",
            JobEvent::Complete { .. } => "complete",
            JobEvent::ExternalStart { .. } => "external start",
            JobEvent::ExternalComplete { .. } => "external completion",
            JobEvent::Cancel { .. } => "cancel",
            JobEvent::Release { .. } => "release",
            JobEvent::GiveUp { .. } => "give up",
            JobEvent::LeaseExpired => "lease expiry",
            JobEvent::HolderLost { .. } => "holder lost",
        }
    }
}

/// A job transition whose result does not depend on the row beyond a
/// guard: when the stored job is in `state`, held by `runner` and (if
/// `lease_at_most` is set) leased until no later than it, the event sets
/// exactly what `set` says and bumps the version. The store applies it as
/// one conditional UPDATE, with no read first, and falls back to reading the
/// row and [`Job::apply`] only when the guard does not hold, so the state
/// machine still decides every refusal. [`JobEvent::guarded`] is the only
/// source of these; a property test checks that, wherever the guard holds,
/// [`GuardedChange::applied_to`] equals [`Job::apply`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardedChange {
    pub state: JobState,
    pub runner: RunnerId,
    pub lease_at_most: Option<Timestamp>,
    pub set: GuardedSet,
}

/// The columns a [`GuardedChange`] writes; `None` leaves a column as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuardedSet {
    pub state: JobState,
    pub lease_deadline: Option<Option<Timestamp>>,
    pub started_at: Option<Timestamp>,
    /// Finished at this time with this conclusion; the reason is cleared.
    pub finished: Option<(Timestamp, Conclusion)>,
}

impl GuardedChange {
    /// Whether `job` satisfies the guard.
    pub fn holds_for(&self, job: &Job) -> bool {
        job.state == self.state
            && job.runner == Some(self.runner)
            && match self.lease_at_most {
                None => true,
                Some(limit) => matches!(job.lease_deadline, Some(lease) if lease <= limit),
            }
    }

    /// `job` after the change, when the guard holds.
    pub fn applied_to(&self, job: &Job) -> Option<Job> {
        if !self.holds_for(job) {
            return None;
        }
        let mut next = job.clone();
        next.version += 1;
        next.state = self.set.state;
        if let Some(lease) = self.set.lease_deadline {
            next.lease_deadline = lease;
        }
        if let Some(started) = self.set.started_at {
            next.started_at = Some(started);
        }
        if let Some((finished_at, conclusion)) = self.set.finished {
            next.finished_at = Some(finished_at);
            next.conclusion = Some(conclusion);
            next.reason = None;
        }
        Some(next)
    }
}

impl JobEvent {
    /// The one-statement form of this event's common case, for the events a
    /// runner sends on the hot path (accept, heartbeat, complete); `None`
    /// for the others, which always read the row first.
    pub fn guarded(&self, now: Timestamp) -> Option<GuardedChange> {
        match *self {
            JobEvent::Accept { runner } => Some(GuardedChange {
                state: JobState::Provisioning,
                runner,
                lease_at_most: None,
                set: GuardedSet {
                    state: JobState::Running,
                    lease_deadline: None,
                    started_at: Some(now),
                    finished: None,
                },
            }),
            // A heartbeat while running: a keepalive never shortens a
            // lease, so the guard asks for one no later than the new one.
            JobEvent::Keepalive {
                runner,
                lease_deadline,
            } => Some(GuardedChange {
                state: JobState::Running,
                runner,
                lease_at_most: Some(lease_deadline),
                set: GuardedSet {
                    state: JobState::Running,
                    lease_deadline: Some(Some(lease_deadline)),
                    started_at: None,
                    finished: None,
                },
            }),
            JobEvent::Complete { runner, conclusion } => Some(GuardedChange {
                state: JobState::Running,
                runner,
                lease_at_most: None,
                set: GuardedSet {
                    state: JobState::Completed,
                    lease_deadline: Some(None),
                    started_at: None,
                    finished: Some((now, conclusion)),
                },
            }),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobTransitionError {
    #[error("job {job} is {state}, which is final; {event} refused")]
    Terminal {
        job: JobId,
        state: JobState,
        event: &'static str,
    },
    #[error("job {job} is {state}; {event} is not allowed in that state")]
    InvalidState {
        job: JobId,
        state: JobState,
        event: &'static str,
    },
    #[error("job {job} is not held by runner {runner}")]
    NotHolder { job: JobId, runner: RunnerId },
    #[error("runner {runner} declined job {job} before and may not take it again")]
    RunnerExcluded { job: JobId, runner: RunnerId },
    #[error("the lease on job {job} runs until {deadline}; it has not expired at {now}")]
    LeaseNotExpired {
        job: JobId,
        deadline: Timestamp,
        now: Timestamp,
    },
}

impl Job {
    /// Whether `runner` holds the job's lease (or is the runner it started on).
    pub fn is_held_by(&self, runner: RunnerId) -> bool {
        self.runner == Some(runner)
            && matches!(self.state, JobState::Provisioning | JobState::Running)
    }

    /// The job after `event` at `now`, or why the event is refused. Pure: the
    /// job itself is untouched and the version is bumped on the result.
    pub fn apply(&self, event: &JobEvent, now: Timestamp) -> Result<Job, JobTransitionError> {
        use JobState::*;
        if self.state.is_terminal() {
            return Err(JobTransitionError::Terminal {
                job: self.id,
                state: self.state,
                event: event.name(),
            });
        }
        let invalid = || JobTransitionError::InvalidState {
            job: self.id,
            state: self.state,
            event: event.name(),
        };
        let mut next = self.clone();
        next.version += 1;
        match event {
            JobEvent::Claim {
                runner,
                lease_deadline,
            } => {
                if self.state != Queued {
                    return Err(invalid());
                }
                if self.excluded_runners.contains(runner) {
                    return Err(JobTransitionError::RunnerExcluded {
                        job: self.id,
                        runner: *runner,
                    });
                }
                next.state = Provisioning;
                next.runner = Some(*runner);
                next.lease_deadline = Some(*lease_deadline);
            }
            JobEvent::Keepalive {
                runner,
                lease_deadline,
            } => {
                self.require_holder(*runner)?;
                if self.lease_deadline.is_none() {
                    // A job started by GitHub has no lease to extend.
                    return Err(invalid());
                }
                // A late keepalive never shortens a lease.
                next.lease_deadline = self.lease_deadline.max(Some(*lease_deadline));
            }
            JobEvent::Accept { runner } => {
                if self.state != Provisioning {
                    return Err(invalid());
                }
                self.require_holder(*runner)?;
                next.state = Running;
                next.started_at = Some(now);
            }
            JobEvent::Decline { runner } => {
                if self.state != Provisioning {
                    return Err(invalid());
                }
                self.require_holder(*runner)?;
                next.excluded_runners.insert(*runner);
                next.requeue(now);
            }
            JobEvent::Complete { runner, conclusion } => {
                if self.state != Running {
                    return Err(invalid());
                }
                self.require_holder(*runner)?;
                next.finish(Completed, Some(*conclusion), None, now);
            }
            JobEvent::ExternalStart { runner } => {
                if !matches!(self.state, Queued | Provisioning) {
                    return Err(invalid());
                }
                next.state = Running;
                next.runner = Some(*runner);
                next.lease_deadline = None;
                next.started_at = Some(now);
            }
            JobEvent::ExternalComplete { conclusion, runner } => {
                // Whichever event named the runner first keeps it, so the
                // order of `in_progress` and `completed` does not matter.
                if next.runner.is_none() {
                    next.runner = *runner;
                }
                next.finish(Completed, Some(*conclusion), None, now);
            }
            JobEvent::Cancel { reason } => {
                next.finish(Cancelled, None, Some(reason.clone()), now);
            }
            JobEvent::Release { pool, share } => {
                if self.state != Held {
                    return Err(invalid());
                }
                next.pool = Some(pool.clone());
                next.share = share.clone();
                next.reason = None;
                next.requeue(now);
            }
            JobEvent::GiveUp { reason } => {
                if self.state != Held {
                    return Err(invalid());
                }
                next.finish(Unroutable, None, Some(reason.clone()), now);
            }
            JobEvent::LeaseExpired => {
                let Some(deadline) = self.lease_deadline else {
                    return Err(invalid());
                };
                if deadline > now {
                    return Err(JobTransitionError::LeaseNotExpired {
                        job: self.id,
                        deadline,
                        now,
                    });
                }
                next.lost_holder("lease expired", now);
            }
            JobEvent::HolderLost { runner } => {
                self.require_holder(*runner)?;
                next.lost_holder("runner lost", now);
            }
        }
        Ok(next)
    }

    /// Its holder stopped (`what` happened). Before it accepted the job
    /// (provisioning), the job never started: it goes back to the queue as
    /// if that runner had declined it (the GitLab router proposal's
    /// "returns to the queue as in a declined scenario"): that runner is
    /// excluded and no attempt is counted. Once running, it is another
    /// attempt from the queue, or failed once it has had `max_attempts`.
    fn lost_holder(&mut self, what: &str, now: Timestamp) {
        if self.state == JobState::Provisioning {
            if let Some(runner) = self.runner {
                self.excluded_runners.insert(runner);
            }
            self.requeue(now);
            return;
        }
        self.attempts = self.attempts.saturating_add(1);
        if self.attempts >= self.max_attempts {
            let reason = format!(
                "{what} {} times (max_attempts = {})",
                self.attempts, self.max_attempts
            );
            self.finish(JobState::Failed, None, Some(reason), now);
        } else {
            self.requeue(now);
        }
    }

    fn require_holder(&self, runner: RunnerId) -> Result<(), JobTransitionError> {
        if self.is_held_by(runner) {
            Ok(())
        } else {
            Err(JobTransitionError::NotHolder {
                job: self.id,
                runner,
            })
        }
    }

    fn requeue(&mut self, now: Timestamp) {
        self.state = JobState::Queued;
        self.runner = None;
        self.lease_deadline = None;
        self.started_at = None;
        self.enqueued_at = now;
    }

    fn finish(
        &mut self,
        state: JobState,
        conclusion: Option<Conclusion>,
        reason: Option<String>,
        now: Timestamp,
    ) {
        self.state = state;
        self.lease_deadline = None;
        self.finished_at = Some(now);
        self.conclusion = conclusion;
        self.reason = reason;
    }

    /// The structural invariants every stored job satisfies, as a list of
    /// violations (empty when the job is consistent). Used by the property
    /// tests here and by the store's crash tests on what survived a SIGKILL.
    pub fn invariant_violations(&self) -> Vec<String> {
        use JobState::*;
        let mut problems = Vec::new();
        let mut check = |ok: bool, what: &str| {
            if !ok {
                problems.push(format!("job {} ({}): {what}", self.id, self.state));
            }
        };
        check(
            self.lease_deadline.is_none() || matches!(self.state, Provisioning | Running),
            "has a lease outside provisioning/running",
        );
        check(
            self.state != Provisioning || (self.runner.is_some() && self.lease_deadline.is_some()),
            "is provisioning without a runner and a lease",
        );
        check(
            self.state != Running || self.runner.is_some(),
            "is running without a runner",
        );
        check(
            self.state != Queued || self.runner.is_none(),
            "is queued but bound to a runner",
        );
        check(
            self.state != Unroutable || self.pool.is_none(),
            "is unroutable but has a pool",
        );
        check(
            self.state != Held || self.pool.is_none(),
            "is held but has a pool",
        );
        // A held job GitHub ended first never started here.
        check(
            matches!(self.state, Unroutable | Held)
                || self.pool.is_some()
                || (self.state.is_terminal() && self.started_at.is_none()),
            "has no pool",
        );
        check(
            self.state != Failed || self.reason.is_some(),
            "failed without a reason",
        );
        check(
            self.finished_at.is_some() == self.state.is_terminal(),
            "finished_at does not match a terminal state",
        );
        check(
            self.attempts < self.max_attempts || self.state.is_terminal(),
            "is live with attempts at max_attempts",
        );
        problems
    }
}
