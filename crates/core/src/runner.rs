//! The runner state machine (DESIGN §3).
//!
//! ```text
//! requested ─► provisioning ─► idle ◄─► busy ─► terminating ─► terminated
//!      │             │          │        │
//!      └─────────────┴──────────┴─► failed (boot timeout, provider error, lost while idle)
//!                                        └─► crashed (instance lost while busy)
//! ```
//!
//! The one rule the rest of runway leans on: a `busy` runner is never asked to
//! terminate. [`RunnerEvent::TerminateRequested`] on a busy runner is refused.
//!
//! Beyond DESIGN §3: a runner can be `busy` before runway knows its job.
//! GitHub refuses to deregister a runner that runs a job (422) while the
//! job's `in_progress` webhook may still be on its way;
//! [`RunnerEvent::RemovalRefused`] then takes an idle or terminating runner
//! back to `busy` with no job, and the job's own event names it later.

use crate::ids::JobId;
pub use crate::ids::RunnerId;
use crate::time::Timestamp;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RunnerState {
    Requested,
    Provisioning,
    Idle,
    Busy,
    Terminating,
    Terminated,
    Failed,
    Crashed,
    /// A stock runner ([`Runner::stock`]) booted once and asked to stop:
    /// waiting for its provider to say it is stopped.
    Stopping,
    /// A stock runner stopped: it costs its disk only, and is started for
    /// one job ([`RunnerEvent::StartRequested`]) or retired.
    Stopped,
}

names!(RunnerState, "runner state", {
    Requested => "requested",
    Provisioning => "provisioning",
    Idle => "idle",
    Busy => "busy",
    Terminating => "terminating",
    Terminated => "terminated",
    Failed => "failed",
    Crashed => "crashed",
    Stopping => "stopping",
    Stopped => "stopped",
});

impl RunnerState {
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunnerState::Terminated | RunnerState::Failed | RunnerState::Crashed
        )
    }
}

/// A runner as intake or the reconciler hands it to the store, before it has an id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRunner {
    /// Unique and deterministic (pool plus a sequence), so a create that never
    /// finished can still be found and deleted by name.
    pub name: String,
    pub pool: String,
    pub provider: String,
    pub labels: Vec<String>,
    /// Created for the pool's stock of stopped runners: booted once, then
    /// stopped, never given a job before it is started.
    pub stock: bool,
}

impl NewRunner {
    pub fn initial(&self, id: RunnerId, now: Timestamp) -> Runner {
        Runner {
            id,
            name: self.name.clone(),
            pool: self.pool.clone(),
            provider: self.provider.clone(),
            labels: self.labels.clone(),
            instance_id: None,
            state: RunnerState::Requested,
            job: None,
            requested_at: now,
            provisioning_at: None,
            idle_at: None,
            busy_at: None,
            terminating_at: None,
            ended_at: None,
            reason: None,
            draining: false,
            stock: self.stock,
            stopped_at: None,
            version: 0,
        }
    }
}

/// Where a runner record came from. Stored in the `provider` column: a
/// provider's name, or one of two markers no provider may be called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunnerOrigin<'a> {
    /// Created by the reconciler through this provider; runway deletes its
    /// instance.
    Provisioned { provider: &'a str },
    /// Registered itself with a token an admin minted
    /// (`runway registration-token`); it manages its own lifetime.
    Registered,
    /// Known only from a webhook naming it (another system's runner).
    External,
}

impl<'a> RunnerOrigin<'a> {
    const REGISTERED: &'static str = "registered";
    const EXTERNAL: &'static str = "external";

    /// The origin a stored `provider` column says.
    pub fn of_column(provider: &'a str) -> RunnerOrigin<'a> {
        match provider {
            RunnerOrigin::REGISTERED => RunnerOrigin::Registered,
            RunnerOrigin::EXTERNAL => RunnerOrigin::External,
            provider => RunnerOrigin::Provisioned { provider },
        }
    }

    /// What the `provider` column stores for it.
    pub fn column(self) -> &'a str {
        match self {
            RunnerOrigin::Provisioned { provider } => provider,
            RunnerOrigin::Registered => RunnerOrigin::REGISTERED,
            RunnerOrigin::External => RunnerOrigin::EXTERNAL,
        }
    }

    /// Whether a provider name would be read back as a marker (config
    /// validation refuses such a provider name).
    pub fn is_reserved(name: &str) -> bool {
        matches!(name, RunnerOrigin::REGISTERED | RunnerOrigin::EXTERNAL)
    }
}

impl Runner {
    pub fn origin(&self) -> RunnerOrigin<'_> {
        RunnerOrigin::of_column(&self.provider)
    }

    /// Whether its create's outcome is unknown ([`RunnerEvent::CreateInDoubt`]):
    /// requested, no instance known, and a reason why.
    pub fn create_in_doubt(&self) -> bool {
        self.state == RunnerState::Requested && self.instance_id.is_none() && self.reason.is_some()
    }
}

/// One runner as the store holds it, with the time of each transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Runner {
    pub id: RunnerId,
    pub name: String,
    pub pool: String,
    pub provider: String,
    pub labels: Vec<String>,
    /// The provider's own id of the machine or process, once it has one.
    pub instance_id: Option<String>,
    pub state: RunnerState,
    /// The job the runner is running; set exactly while `busy`.
    pub job: Option<JobId>,
    pub requested_at: Timestamp,
    pub provisioning_at: Option<Timestamp>,
    /// When the runner last became idle (the start of its idle period).
    pub idle_at: Option<Timestamp>,
    /// When the runner last became busy.
    pub busy_at: Option<Timestamp>,
    pub terminating_at: Option<Timestamp>,
    /// When the runner reached terminated, failed or crashed.
    pub ended_at: Option<Timestamp>,
    /// Why the runner failed or crashed.
    pub reason: Option<String>,
    /// An operator drained it: it takes no new job and stops once its
    /// current one is over.
    pub draining: bool,
    /// In the pool's stock of stopped runners: created to boot once and be
    /// stopped, with no job and no job credential, until it is started
    /// ([`RunnerEvent::StartRequested`] clears it). A stock runner never
    /// takes a job: ephemerality holds for the job it is started for.
    pub stock: bool,
    /// When it last stopped (set while stopped).
    pub stopped_at: Option<Timestamp>,
    pub version: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunnerEvent {
    /// The provider accepted the create and named the instance.
    ProvisioningStarted { instance_id: String },
    /// The runner is up and can take a job.
    Ready,
    /// The runner took a job (from our job API or, for GitHub, `in_progress`).
    JobAssigned { job: JobId },
    /// The runner's job is over and the runner can take another.
    JobFinished,
    /// Scale-down: delete this runner. Refused while busy.
    TerminateRequested,
    /// An operator's drain: no new job; an idle or booting runner stops
    /// now, a busy one once its job is over (`JobFinished` then leaves it
    /// for the caller to terminate, see `moves::finish`).
    DrainRequested,
    /// The job source refused to let the runner go because it is running a
    /// job runway has not heard of yet (GitHub's 422 on deregistration,
    /// ahead of the job's `in_progress` webhook): busy, job not yet known.
    RemovalRefused,
    /// The provider's create failed in a way that leaves its outcome
    /// unknown (a timeout, a lost answer, a restart during the call): the
    /// instance may exist or appear later. The runner stays `requested`,
    /// holding its quota slot, with `reason` saying why it is in doubt;
    /// it no longer counts as booting for demand. A list that shows its
    /// instance adopts it (`ProvisioningStarted`); past the in-flight
    /// window it fails.
    CreateInDoubt { reason: String },
    /// The provider confirmed the instance is gone.
    Terminated,
    /// Boot timeout, provider error, or the instance vanished while not busy.
    Failed { reason: String },
    /// The instance vanished while running a job.
    Crashed { reason: String },
    /// A stock runner is up: runway asks its provider to stop it (instead
    /// of its becoming idle).
    StopRequested,
    /// The provider reports the stock runner's instance stopped.
    Stopped,
    /// A stopped stock runner is started for a queued job: booting again,
    /// out of the stock, its one-time credential written for this start.
    StartRequested,
}

impl RunnerEvent {
    pub fn name(&self) -> &'static str {
        match self {
            RunnerEvent::ProvisioningStarted { .. } => "provisioning start",
            RunnerEvent::Ready => "ready",
            RunnerEvent::JobAssigned { .. } => "job assignment",
            RunnerEvent::JobFinished => "job finish",
            RunnerEvent::TerminateRequested => "terminate request",
            RunnerEvent::DrainRequested => "drain request",
            RunnerEvent::RemovalRefused => "removal refusal",
            RunnerEvent::CreateInDoubt { .. } => "create in doubt",
            RunnerEvent::Terminated => "termination",
            RunnerEvent::Failed { .. } => "failure",
            RunnerEvent::Crashed { .. } => "crash",
            RunnerEvent::StopRequested => "stop request",
            RunnerEvent::Stopped => "stop",
            RunnerEvent::StartRequested => "start request",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunnerTransitionError {
    #[error("runner {runner} is {state}, which is final; {event} refused")]
    Terminal {
        runner: RunnerId,
        state: RunnerState,
        event: &'static str,
    },
    #[error("runner {runner} is busy with job {job}; it is never terminated while running a job")]
    Busy { runner: RunnerId, job: JobId },
    #[error("runner {runner} is draining; it takes no new job")]
    Draining { runner: RunnerId },
    #[error("runner {runner} is {state}; {event} is not allowed in that state")]
    InvalidState {
        runner: RunnerId,
        state: RunnerState,
        event: &'static str,
    },
}

impl Runner {
    /// The runner after `event` at `now`, or why the event is refused.
    pub fn apply(
        &self,
        event: &RunnerEvent,
        now: Timestamp,
    ) -> Result<Runner, RunnerTransitionError> {
        use RunnerState::*;
        if self.state.is_terminal() {
            return Err(RunnerTransitionError::Terminal {
                runner: self.id,
                state: self.state,
                event: event.name(),
            });
        }
        let invalid = || RunnerTransitionError::InvalidState {
            runner: self.id,
            state: self.state,
            event: event.name(),
        };
        let mut next = self.clone();
        next.version += 1;
        match event {
            RunnerEvent::ProvisioningStarted { instance_id } => {
                // A runner that registers itself (process, exec) can be up,
                // and even busy, before its provider's create returns: then
                // only the instance is recorded, the state stays.
                match (self.state, &self.instance_id) {
                    (Requested, _) => {
                        next.state = Provisioning;
                        next.provisioning_at = Some(now);
                        // Adopted: no longer in doubt.
                        next.reason = None;
                    }
                    (Provisioning | Idle | Busy | Terminating, None) => {}
                    _ => return Err(invalid()),
                }
                next.instance_id = Some(instance_id.clone());
            }
            RunnerEvent::Ready => {
                // A stock runner is stopped when up, never idle.
                if !matches!(self.state, Requested | Provisioning) || self.stock {
                    return Err(invalid());
                }
                next.state = Idle;
                next.idle_at = Some(now);
            }
            RunnerEvent::JobAssigned { job } => {
                // A runner can pick up work before we saw it become idle:
                // GitHub's `in_progress` may beat the provider's own report.
                // A runner busy with a job not yet known learns which.
                let busy_unknown = self.state == Busy && self.job.is_none();
                if !(matches!(self.state, Requested | Provisioning | Idle) || busy_unknown)
                    || self.stock
                {
                    return Err(invalid());
                }
                // A drained runner takes no new job (GitHub may still name
                // the one it already runs: busy with a job not yet known).
                if self.draining && !busy_unknown {
                    return Err(RunnerTransitionError::Draining { runner: self.id });
                }
                next.state = Busy;
                next.job = Some(*job);
                next.busy_at = Some(now);
            }
            RunnerEvent::JobFinished => {
                if self.state != Busy {
                    return Err(invalid());
                }
                next.state = Idle;
                next.job = None;
                next.idle_at = Some(now);
            }
            RunnerEvent::TerminateRequested => match (self.state, self.job) {
                (Busy, Some(job)) => {
                    return Err(RunnerTransitionError::Busy {
                        runner: self.id,
                        job,
                    })
                }
                (Busy, None) | (Terminating, _) => return Err(invalid()),
                _ => {
                    next.state = Terminating;
                    next.terminating_at = Some(now);
                }
            },
            RunnerEvent::DrainRequested => match self.state {
                Busy => next.draining = true,
                Requested | Provisioning | Idle | Stopping | Stopped => {
                    next.draining = true;
                    next.state = Terminating;
                    next.terminating_at = Some(now);
                }
                _ => return Err(invalid()),
            },
            RunnerEvent::RemovalRefused => {
                if !matches!(self.state, Provisioning | Idle | Terminating) || self.stock {
                    return Err(invalid());
                }
                next.state = Busy;
                next.job = None;
                next.terminating_at = None;
                next.busy_at = Some(now);
            }
            RunnerEvent::CreateInDoubt { reason } => {
                if self.state != Requested || self.instance_id.is_some() {
                    return Err(invalid());
                }
                next.reason = Some(reason.clone());
            }
            RunnerEvent::Terminated => {
                if self.state != Terminating {
                    return Err(invalid());
                }
                next.state = Terminated;
                next.ended_at = Some(now);
            }
            RunnerEvent::Failed { reason } => {
                if self.state == Busy {
                    return Err(invalid());
                }
                next.state = Failed;
                next.reason = Some(reason.clone());
                next.ended_at = Some(now);
            }
            RunnerEvent::Crashed { reason } => {
                if self.state != Busy {
                    return Err(invalid());
                }
                next.state = Crashed;
                next.reason = Some(reason.clone());
                next.ended_at = Some(now);
            }
            RunnerEvent::StopRequested => {
                if !(self.stock && matches!(self.state, Requested | Provisioning)) {
                    return Err(invalid());
                }
                next.state = Stopping;
            }
            RunnerEvent::Stopped => {
                if !(self.stock && matches!(self.state, Provisioning | Stopping)) {
                    return Err(invalid());
                }
                next.state = Stopped;
                next.stopped_at = Some(now);
            }
            RunnerEvent::StartRequested => {
                if !(self.stock && self.state == Stopped) || self.draining {
                    return Err(invalid());
                }
                // Requested anew: its boot timeout runs from the start. Its
                // age in the stock (`requested_at` while stopped) is over.
                next.state = Provisioning;
                next.stock = false;
                next.requested_at = now;
                next.provisioning_at = Some(now);
            }
        }
        Ok(next)
    }

    /// Structural invariants of a stored runner, as a list of violations.
    pub fn invariant_violations(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let mut check = |ok: bool, what: &str| {
            if !ok {
                problems.push(format!("runner {} ({}): {what}", self.id, self.state));
            }
        };
        // Busy without a job is allowed: the job source said the runner
        // runs a job before it said which (RunnerEvent::RemovalRefused).
        check(
            self.job.is_none() || matches!(self.state, RunnerState::Busy | RunnerState::Crashed),
            "is bound to a job while neither busy nor crashed",
        );
        check(
            self.ended_at.is_some() == self.state.is_terminal(),
            "ended_at does not match a terminal state",
        );
        check(
            self.state != RunnerState::Terminating || self.terminating_at.is_some(),
            "terminating without terminating_at",
        );
        check(
            !self.stock || (self.job.is_none() && self.busy_at.is_none() && self.idle_at.is_none()),
            "a stock runner has run or waited for a job",
        );
        check(
            self.stock || !matches!(self.state, RunnerState::Stopping | RunnerState::Stopped),
            "stopping or stopped outside the stock",
        );
        check(
            self.state != RunnerState::Stopped || self.stopped_at.is_some(),
            "stopped without stopped_at",
        );
        problems
    }
}

#[cfg(test)]
mod origin_tests {
    use super::RunnerOrigin;

    #[test]
    fn origins_round_trip_through_the_provider_column() {
        for origin in [
            RunnerOrigin::Registered,
            RunnerOrigin::External,
            RunnerOrigin::Provisioned { provider: "ec2" },
        ] {
            assert_eq!(RunnerOrigin::of_column(origin.column()), origin);
        }
        assert!(RunnerOrigin::is_reserved("registered"));
        assert!(!RunnerOrigin::is_reserved("local"));
    }
}
