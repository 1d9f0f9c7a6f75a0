//! The GitHub side of a GitHub pool's runners: just-in-time configurations, deregistration before a machine goes, runners GitHub keeps for jobs runway never heard of.

use super::doubt::LetGo;
use super::*;

/// After a deregistration GitHub could not take (unreachable, 5xx, rate
/// limited), the first wait before asking again; it doubles.
pub(super) const DEREGISTER_RETRY: Duration = Duration::from_secs(30);

impl Inner {
    /// The GitHub side of `pool`, if it is a GitHub pool.
    pub(super) fn github_pool(&self, pool: &str) -> Option<PoolGithub> {
        self.service
            .config()
            .pool(pool)
            .and_then(|p| p.github.clone())
    }

    /// Registers `runner` with GitHub as a just-in-time runner and returns
    /// its encoded configuration; `None` (the runner recorded as failed)
    /// when GitHub or the request budget said no.
    pub(super) async fn jit_config(
        &self,
        github: &PoolGithub,
        runner: &runway_core::Runner,
        labels: &[String],
        now: Timestamp,
    ) -> Result<Option<String>, StoreError> {
        let store = &self.store();
        let result = match (&github.scale_set, &self.service.github) {
            // A scale-set pool's runners register in its scale set.
            (Some(scale_set), _) => match self
                .service
                .scale_sets
                .get(&runner.pool)
                .and_then(|handle| Some((handle.id()?, handle)))
            {
                Some((id, handle)) => handle
                    .client
                    .generate_jit_config(&self.service.metrics, id, &runner.name)
                    .await
                    .map_err(|e| e.to_string()),
                None => Err(format!(
                    "scale set {scale_set:?} not found or created yet (its listener keeps trying)"
                )),
            },
            (None, Some(client)) => client
                .generate_jitconfig(
                    &self.service.metrics,
                    &github.target,
                    &runner.name,
                    labels,
                    github.runner_group_id,
                )
                .await
                .map_err(|e| e.to_string()),
            (None, None) => Err("no GitHub credentials ([github] token or App)".to_owned()),
        };
        let result = result.inspect_err(|_| self.jit_failed(&runner.pool, now));
        match result {
            Ok(jit) => {
                if let Ok(mut backoff) = self.jit_backoff.lock() {
                    backoff.remove(&runner.pool);
                }
                store
                    .set_runner_external_id(runner.id, &jit.runner_id.to_string())
                    .await?;
                Ok(Some(jit.encoded))
            }
            Err(error) => {
                tracing::warn!(pool = %runner.pool, runner = %runner.name, %error, "no JIT runner configuration; runner not started");
                let failed = RunnerEvent::Failed {
                    reason: format!("no JIT configuration: {error}"),
                };
                store.apply_runner_event(runner.id, &failed, now).await?;
                Ok(None)
            }
        }
    }

    pub(super) fn jit_backing_off(&self, pool: &str, now: Timestamp) -> bool {
        self.jit_backoff
            .lock()
            .map(|backoff| backoff.get(pool).is_some_and(|(_, until)| now < *until))
            .unwrap_or(false)
    }

    fn jit_failed(&self, pool: &str, now: Timestamp) {
        if let Ok(mut backoff) = self.jit_backoff.lock() {
            let entry = backoff.entry(pool.to_owned()).or_insert((0, now));
            entry.0 += 1;
            let delay = backoff_delay(entry.0, rand::thread_rng().gen_range(0.5..=1.0));
            entry.1 = now.plus(delay);
        }
    }

    /// Removes `runner`'s GitHub registration. `Ok(true)`: gone (or never
    /// registered); `Ok(false)`: GitHub refused or could not be asked.
    pub(super) async fn deregister(
        &self,
        github: &PoolGithub,
        runner: &runway_core::Runner,
    ) -> Result<Result<bool, GithubError>, StoreError> {
        let stored = self.store().runner_external_id(runner.id).await?;
        if let Err(deposed) = self.service.may_act("github_deregister").await {
            return Ok(Err(GithubError::Transport {
                operation: "deregister runner",
                message: deposed.to_string(),
            }));
        }
        let github_id = match stored.as_deref() {
            // Deregistered before.
            Some("") => return Ok(Ok(true)),
            Some(id) => match id.parse::<u64>() {
                Ok(id) => id,
                Err(_) => return Ok(Ok(true)),
            },
            // Still in the stock of stopped runners: its JIT
            // configuration is minted only at its start, never before.
            None if runner.stock => return Ok(Ok(true)),
            // No id stored: it never got a JIT configuration — or GitHub
            // gave it one and runway stopped (or its store failed) before
            // the id was written. GitHub is asked by the runner's name.
            None => {
                let found = match (&github.scale_set, &self.service.github) {
                    (None, Some(client)) => {
                        client
                            .find_runner_id(&self.service.metrics, &github.target, &runner.name)
                            .await
                    }
                    _ => Ok(None),
                };
                match found {
                    Ok(Some(id)) => id,
                    Ok(None) => return Ok(Ok(true)),
                    Err(error) => return Ok(Err(error)),
                }
            }
        };
        let deleted = if github.scale_set.is_some() {
            // Registered in the scale set: removed through the Actions service.
            let Some(handle) = self.service.scale_sets.get(&runner.pool) else {
                return Ok(Ok(false));
            };
            handle
                .client
                .delete_runner(&self.service.metrics, github_id)
                .await
        } else {
            let Some(client) = &self.service.github else {
                return Ok(Ok(false));
            };
            client
                .delete_runner(&self.service.metrics, &github.target, github_id)
                .await
        };
        match deleted {
            Ok(_) => {
                // Asked once: an empty id means "deregistered".
                self.store().set_runner_external_id(runner.id, "").await?;
                Ok(Ok(true))
            }
            Err(error) => Ok(Err(error)),
        }
    }

    /// Whether `runner` may be asked to deregister at `now`: not while the
    /// backoff after GitHub's last refusal runs.
    pub(super) fn deregistration_due(&self, runner: RunnerId, now: Timestamp) -> bool {
        let waits = self
            .deregistrations
            .lock()
            .ok()
            .and_then(|d| d.get(&runner).copied());
        waits.is_none_or(|(_, not_before)| now >= not_before)
    }

    /// GitHub refused (or could not take) `runner`'s deregistration: the
    /// next ask waits `first` after the first refusal, doubling after each.
    pub(super) fn deregistration_refused(&self, runner: RunnerId, first: Duration, now: Timestamp) {
        if let Ok(mut waits) = self.deregistrations.lock() {
            let refusals = waits.get(&runner).map_or(0, |(n, _)| *n) + 1;
            let wait = runway_core::moves::deregistration_backoff(first, refusals);
            waits.insert(runner, (refusals, now.plus(wait)));
        }
    }

    /// GitHub refused `runner`'s deregistration because it runs a job:
    /// counted, and the next ask put off.
    pub(super) fn refused_busy(
        &self,
        runner: &runway_core::Runner,
        recheck: Duration,
        now: Timestamp,
    ) {
        self.deregistration_refused(runner.id, recheck, now);
        if let Ok(mut busy) = self.refused_busy_at.lock() {
            busy.insert(runner.id, now);
        }
        self.service
            .metrics
            .runner_delete_requests
            .get_or_create(&crate::telemetry::metrics::PoolResultLabels {
                pool: runner.pool.clone(),
                result: DeleteResult::RefusedBusy,
            })
            .inc();
    }

    /// GitHub refused `runner`'s deregistration because it ran a job, and
    /// the runner was told to stop since (its job ended, by the job's
    /// webhook or the re-check): the busy wait no longer holds, and GitHub
    /// is asked again now, once. Without this a runner that ended (or was
    /// told to stop) after such a refusal kept its machine for the rest of
    /// the busy backoff (`recheck_after`, 5 minutes by default) wherever
    /// deletion waits on GitHub's word: the orphan rules for an ended
    /// record, a terminating runner whose instance is not listed.
    pub(super) fn job_ended_since_busy(&self, runner: &runway_core::Runner) -> bool {
        let Some(stopping) = runner.terminating_at.or(runner.ended_at) else {
            return false;
        };
        let Ok(mut busy) = self.refused_busy_at.lock() else {
            return false;
        };
        match busy.get(&runner.id) {
            Some(refused) if stopping > *refused => {
                busy.remove(&runner.id);
                true
            }
            _ => false,
        }
    }

    /// `runner` is deregistered: how many asks were refused before it,
    /// observed for the ADR's budget.
    pub(super) fn deregistration_done(&self, runner: RunnerId) {
        if let Ok(mut busy) = self.refused_busy_at.lock() {
            busy.remove(&runner);
        }
        let refusals = self
            .deregistrations
            .lock()
            .ok()
            .and_then(|mut waits| waits.remove(&runner))
            .map_or(0, |(n, _)| n);
        self.service
            .metrics
            .deregistrations_refused
            .observe(f64::from(refusals));
    }

    /// Deregister before delete: `true` when the instance may go. A runner
    /// GitHub says is running a job becomes busy (its job named by the
    /// job's own webhook) and keeps its instance.
    pub(super) async fn release(
        &self,
        github: &PoolGithub,
        runner: &runway_core::Runner,
        now: Timestamp,
        report: &mut Report,
    ) -> Result<bool, StoreError> {
        match self.let_go_at_github(github, runner, now).await? {
            LetGo::Gone => Ok(true),
            LetGo::NotYet => Ok(false),
            LetGo::Busy => {
                report.delete_refused_busy += 1;
                if let Err(error) = self
                    .store()
                    .apply_runner_event(runner.id, &RunnerEvent::RemovalRefused, now)
                    .await
                {
                    tracing::debug!(%error, runner = %runner.name, "runner changed meanwhile");
                }
                Ok(false)
            }
        }
    }

    /// A runner GitHub kept for a job runway never heard of: once that has
    /// lasted `[github] recheck_after`, ask GitHub again, and after each
    /// refusal wait twice as long as before (a one-hour job costs a few
    /// refused deletes, not one a round); when it lets the
    /// runner go (the ephemeral runner's job is over), the runner finishes
    /// and is terminated like any other.
    pub(super) async fn settle_unknown_job(
        &self,
        github: &PoolGithub,
        runner: &runway_core::Runner,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let since = runner.busy_at.unwrap_or(runner.requested_at);
        let recheck = self.service.config().github.recheck_after;
        if now.since(since) < recheck || !self.deregistration_due(runner.id, now) {
            return Ok(());
        }
        let outcome = self.deregister(github, runner).await?;
        match &outcome {
            Ok(true) => self.deregistration_done(runner.id),
            Ok(false) => {}
            Err(GithubError::RunnerBusy(_)) => self.refused_busy(runner, recheck, now),
            Err(_) => self.deregistration_refused(runner.id, DEREGISTER_RETRY, now),
        }
        if let Ok(true) = outcome {
            tracing::info!(runner = %runner.name, "GitHub let go of a runner whose job runway never heard of");
            self.service.finish_runner_job(runner.id, now).await;
            // Deregistered already: nothing must ever give it work again.
            let _ = self
                .store()
                .apply_runner_event(runner.id, &RunnerEvent::TerminateRequested, now)
                .await;
        }
        Ok(())
    }

    /// Asks GitHub again to let go of the registrations of ended runners
    /// it has not let go of yet (a deregistration that met a 5xx, a rate
    /// limit or an outage), each at doubling waits, at most
    /// [`DEREGISTER_BATCH`] a sweep and a sweep every [`DEREGISTER_SWEEP`],
    /// in a task of its own (a slow GitHub holds no round): a stale
    /// just-in-time registration is never left at GitHub.
    pub(super) fn retry_deregistrations(self: &Arc<Self>, now: Timestamp) -> Option<Task> {
        {
            let mut swept = self.deregistrations_swept.lock().ok()?;
            if swept.is_some_and(|at| now.since(at) < DEREGISTER_SWEEP) {
                return None;
            }
            *swept = Some(now);
        }
        let this = self.clone();
        self.sweep("deregistrations".into(), async move {
            let ended = this
                .store()
                .ended_runners_registered(DEREGISTER_BATCH)
                .await?;
            for runner in ended {
                let Some(github) = this.github_pool(&runner.pool) else {
                    continue; // Its pool is gone: nothing to ask with.
                };
                if this.let_go_at_github(&github, &runner, now).await? == LetGo::Gone {
                    tracing::info!(runner = %runner.name, pool = %runner.pool, "GitHub let go of an ended runner's registration");
                }
            }
            Ok(Report::default())
        })
    }
}

/// How many ended runners' registrations one sweep asks about at most.
const DEREGISTER_BATCH: u32 = 20;
/// How often ended runners' registrations are looked at.
const DEREGISTER_SWEEP: Duration = Duration::from_secs(10);
