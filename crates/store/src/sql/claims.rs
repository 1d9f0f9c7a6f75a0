//! What the claims and starts write beside their SQL: the runner's labels
//! as a claim binds them, the history lines a claim or start appends, and
//! what a completion that starts the next job answers.

use runway_core::{Job, JobState, Runner, RunnerId, Timestamp};

use crate::rows::history_line;
use crate::{Claim, Moved};

/// A claim's runner labels as its statement takes them: a JSON list in
/// lowercase, or NULL for any.
pub(super) fn claim_labels(claim: &Claim) -> Option<String> {
    claim.runner_labels.as_ref().map(|labels| {
        let lower: Vec<String> = labels.iter().map(|l| l.to_lowercase()).collect();
        crate::rows::json_list(&lower)
    })
}

/// The history line of a move of a job to `state` on `runner` at `now`
/// that the statement makes itself (a claim, a claim that starts).
pub(super) fn holder_step(state: JobState, runner: RunnerId, now: Timestamp) -> String {
    history_line(Some(&runway_core::JobStep {
        at: now,
        state,
        runner: Some(runner),
        attempts: None,
        conclusion: None,
        reason: None,
    }))
}

/// What `complete_and_start_next` answers: the ended job with the runner's
/// final row (busy with the started job, or as it was left by the
/// completion), and the started job.
pub(super) fn completed_next(
    ended: Job,
    started: Option<Job>,
    finished: &Runner,
    busy: Runner,
) -> (Moved, Option<Job>) {
    let runner = match &started {
        Some(next) => Runner {
            job: Some(next.id),
            ..busy
        },
        None => finished.clone(),
    };
    (
        Moved {
            job: ended,
            runner: Some(runner),
        },
        started,
    )
}

/// The history a claim that starts its job writes: claimed, then started.
pub(super) fn start_steps(runner: RunnerId, now: Timestamp) -> String {
    format!(
        "{}{}",
        holder_step(JobState::Provisioning, runner, now),
        holder_step(JobState::Running, runner, now)
    )
}
