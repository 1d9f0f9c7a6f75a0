//! Creates whose outcome is unknown: a call that timed out or lost its
//! answer, or a create cut off by a restart or a lost lead. Its runner
//! stays in flight (quota slot held, not booting for demand) until a list
//! shows an instance with its name (adopted) or its in-flight window —
//! the provider's `list_lag` plus the pool's `boot_timeout` — has passed
//! (DESIGN §3). Only then is it judged never created, and a GitHub runner
//! only once GitHub has let its registration go.

use super::*;

/// Why a runner found requested with no task working on it is in doubt.
const CUT_OFF: &str =
    "its create was cut off (the replica that made it stopped, or its lead ended, during the call)";

impl Inner {
    /// Records that `runner`'s create has an unknown outcome (`why`), as of
    /// `since`.
    pub(super) async fn create_in_doubt(
        &self,
        runner: &runway_core::Runner,
        why: &str,
        since: Timestamp,
    ) -> Result<(), StoreError> {
        let event = RunnerEvent::CreateInDoubt {
            reason: format!("create outcome unknown: {why}"),
        };
        match self
            .store()
            .apply_runner_event(runner.id, &event, since)
            .await
        {
            // Changed meanwhile (its runner registered before the create
            // answered, say): the list still finds its instance by name.
            Ok(_) | Err(StoreError::RunnerTransition(_) | StoreError::RunnerNotFound(_)) => {}
            Err(error) => return Err(error),
        }
        if let Ok(mut in_doubt) = self.in_doubt.lock() {
            in_doubt.insert(runner.id, since);
        }
        tracing::warn!(runner = %runner.name, pool = %runner.pool, provider = %runner.provider, reason = why, "a create's outcome is unknown; its runner stays in flight until its instance appears or its window passes");
        Ok(())
    }

    /// Since when this replica has known `runner` to be without an
    /// instance and without a task working on it (now, the first time).
    fn doubted_since(&self, runner: RunnerId, now: Timestamp) -> Timestamp {
        self.in_doubt
            .lock()
            .map(|mut in_doubt| *in_doubt.entry(runner).or_insert(now))
            .unwrap_or(now)
    }

    /// The in-flight window of a create of provider `provider` for pool
    /// `pool`: how long after its create an instance may still appear.
    pub(super) fn in_flight_window(&self, provider: &str, pool: &str) -> Duration {
        let config = self.service.config();
        let boot = config
            .pool(pool)
            .map(|p| p.boot_timeout)
            .unwrap_or_else(|| {
                config
                    .pools
                    .iter()
                    .map(|p| p.boot_timeout)
                    .max()
                    .unwrap_or_default()
            });
        self.list_lag(provider) + boot
    }

    /// Judges `runner` of `provider`, which has no known instance, no task
    /// working on it, and none listed under its name: in doubt until its
    /// window passes, then never created (requested) or gone
    /// (terminating) — for a GitHub runner once GitHub let it go.
    pub(super) async fn judge_without_instance(
        &self,
        provider: &Arc<dyn Provider>,
        runner: &runway_core::Runner,
        now: Timestamp,
        report: &mut Report,
    ) -> Result<(), StoreError> {
        let requested = runner.state == RunnerState::Requested;
        if !matches!(
            runner.state,
            RunnerState::Requested | RunnerState::Terminating
        ) {
            return Ok(()); // A runner that registered before its create answered.
        }
        if requested && !runner.create_in_doubt() {
            report.creates_in_doubt += 1;
            self.create_in_doubt(runner, CUT_OFF, now).await?;
        }
        if requested {
            // Its slot, held again after a restart: what may exist counts.
            if let Err(error) = provider.reserve(&runner.name) {
                tracing::debug!(runner = %runner.name, %error, "no quota slot to hold for a create in doubt");
            }
        }
        let since = self.doubted_since(runner.id, now);
        if now.since(since) < self.in_flight_window(&runner.provider, &runner.pool) {
            return Ok(());
        }
        if let Some(github) = self.github_pool(&runner.pool) {
            if self.let_go_at_github(&github, runner, now).await? != LetGo::Gone {
                return Ok(()); // Kept: busy at GitHub, or GitHub not reachable.
            }
        }
        let event = if requested {
            RunnerEvent::Failed {
                reason: "its create was never made: no instance appeared within the in-flight window (list_lag + boot_timeout)".into(),
            }
        } else {
            RunnerEvent::Terminated
        };
        match self
            .store()
            .apply_runner_event(runner.id, &event, now)
            .await
        {
            Ok(_) => {}
            Err(StoreError::RunnerTransition(_) | StoreError::RunnerNotFound(_)) => return Ok(()),
            Err(error) => return Err(error),
        }
        provider.unreserve(&runner.name);
        self.forget_doubt(runner.id);
        if requested {
            tracing::warn!(runner = %runner.name, pool = %runner.pool, "a runner whose create never made an instance is failed");
            report.marked_lost += 1;
        } else {
            tracing::info!(runner = %runner.name, pool = %runner.pool, "a terminating runner with no instance is terminated");
        }
        Ok(())
    }

    pub(super) fn forget_doubt(&self, runner: RunnerId) {
        if let Ok(mut in_doubt) = self.in_doubt.lock() {
            in_doubt.remove(&runner);
        }
    }

    /// Asks GitHub to let `runner`'s registration go, unless a backoff
    /// after an earlier refusal runs. A 422 (it runs a job) keeps it, and it
    /// is asked again at doubling waits; an error or a rate limit, after a
    /// backoff.
    pub(super) async fn let_go_at_github(
        &self,
        github: &PoolGithub,
        runner: &runway_core::Runner,
        now: Timestamp,
    ) -> Result<LetGo, StoreError> {
        if !self.deregistration_due(runner.id, now) && !self.job_ended_since_busy(runner) {
            return Ok(LetGo::NotYet);
        }
        let recheck = self.service.config().github.recheck_after;
        match self.deregister(github, runner).await? {
            Ok(true) => {
                self.deregistration_done(runner.id);
                Ok(LetGo::Gone)
            }
            Ok(false) => {
                self.deregistration_refused(runner.id, DEREGISTER_RETRY, now);
                Ok(LetGo::NotYet)
            }
            Err(GithubError::RunnerBusy(_)) => {
                tracing::info!(runner = %runner.name, pool = %runner.pool, "GitHub says the runner runs a job; its machine is kept");
                self.refused_busy(runner, recheck, now);
                Ok(LetGo::Busy)
            }
            Err(error) => {
                tracing::warn!(runner = %runner.name, pool = %runner.pool, %error, "cannot deregister the runner from GitHub yet; its machine is kept and GitHub asked again after a backoff");
                self.deregistration_refused(runner.id, DEREGISTER_RETRY, now);
                Ok(LetGo::NotYet)
            }
        }
    }
}

/// What GitHub said of letting a runner's registration go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LetGo {
    /// Deregistered (204/404), or it never had one: its machine may go.
    Gone,
    /// 422: it runs a job. Its machine is kept.
    Busy,
    /// Not asked now (a backoff runs) or GitHub could not answer.
    NotYet,
}
