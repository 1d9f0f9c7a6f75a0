//! How GitHub `workflow_job` events move a job, whatever order they arrive in.
//!
//! GitHub may deliver `completed` before `in_progress`, `in_progress` before
//! `queued`, and any of them twice. Each event only ever moves a job forward
//! (queued → running → completed), and one that would move it backwards or
//! sideways is a no-op, so every interleaving of the same events ends in the
//! same state: the furthest one any of them reached.

use crate::job::{Conclusion, Job, JobEvent, JobState};
use crate::runner::RunnerId;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkflowJobAction {
    Queued,
    Waiting,
    InProgress,
    Completed,
}

impl WorkflowJobAction {
    pub fn parse(action: &str) -> Option<WorkflowJobAction> {
        match action {
            "queued" => Some(WorkflowJobAction::Queued),
            "waiting" => Some(WorkflowJobAction::Waiting),
            "in_progress" => Some(WorkflowJobAction::InProgress),
            "completed" => Some(WorkflowJobAction::Completed),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WorkflowJobAction::Queued => "queued",
            WorkflowJobAction::Waiting => "waiting",
            WorkflowJobAction::InProgress => "in_progress",
            WorkflowJobAction::Completed => "completed",
        }
    }

    /// Whether an event with this action makes runway store a job it has
    /// not seen yet. `waiting` (a job held by an environment's protection
    /// rules) creates no demand until GitHub queues it.
    pub fn creates_job(self) -> bool {
        !matches!(self, WorkflowJobAction::Waiting)
    }
}

/// The state change an event asks of a stored job, after routing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GithubUpdate {
    Queued,
    Waiting,
    InProgress {
        runner: RunnerId,
    },
    Completed {
        conclusion: Conclusion,
        runner: Option<RunnerId>,
    },
}

/// The job event to apply to `job` for `update`, or `None` when the update
/// changes nothing (a duplicate, or older news than the job already has).
pub fn converge(job: &Job, update: &GithubUpdate) -> Option<JobEvent> {
    if job.state.is_terminal() {
        return None;
    }
    match update {
        GithubUpdate::Queued | GithubUpdate::Waiting => None,
        GithubUpdate::InProgress { runner } => match job.state {
            JobState::Queued | JobState::Provisioning => {
                Some(JobEvent::ExternalStart { runner: *runner })
            }
            _ => None,
        },
        GithubUpdate::Completed { conclusion, runner } => Some(JobEvent::ExternalComplete {
            conclusion: *conclusion,
            runner: *runner,
        }),
    }
}
