//! Deletes: a runner terminated (or failed), deregistered, its machine deleted.

use super::*;

impl Inner {
    /// Deletes runner `runner_id` of `pool` (failing it first with
    /// `failure`, if given).
    pub(super) async fn delete(
        self: Arc<Self>,
        pool: String,
        runner_id: RunnerId,
        failure: Option<String>,
        now: Timestamp,
    ) -> Result<Report, StoreError> {
        let mut report = Report::default();
        self.delete_runner(&pool, runner_id, failure, now, &mut report)
            .await?;
        Ok(report)
    }

    pub(super) async fn delete_runner(
        &self,
        pool: &str,
        runner_id: RunnerId,
        failure: Option<String>,
        now: Timestamp,
        report: &mut Report,
    ) -> Result<(), StoreError> {
        let store = &self.store();
        let result_label = |result: DeleteResult| crate::telemetry::metrics::PoolResultLabels {
            pool: pool.to_owned(),
            result,
        };
        let github = self.github_pool(pool);
        let event = match (&failure, github.as_ref()) {
            // A GitHub runner fails only once GitHub has let it go: it may
            // have taken a job while we gave up on it.
            (Some(_), Some(_)) => None,
            (Some(reason), None) => Some(RunnerEvent::Failed {
                reason: reason.clone(),
            }),
            (None, _) => Some(RunnerEvent::TerminateRequested),
        };
        let current = match event {
            Some(event) => store.apply_runner_event(runner_id, &event, now).await,
            None => store
                .get_runner(runner_id)
                .await?
                .ok_or(StoreError::RunnerNotFound(runner_id)),
        };
        let mut runner = match current {
            Ok(runner) => runner,
            Err(StoreError::RunnerTransition(runway_core::RunnerTransitionError::Busy {
                ..
            })) => {
                self.service
                    .metrics
                    .runner_delete_requests
                    .get_or_create(&result_label(DeleteResult::RefusedBusy))
                    .inc();
                report.delete_refused_busy += 1;
                return Ok(());
            }
            // Changed since the snapshot (it took a job, it vanished): next round decides.
            Err(StoreError::RunnerTransition(_) | StoreError::RunnerNotFound(_)) => return Ok(()),
            Err(other) => return Err(other),
        };
        if let Some(github) = &github {
            let may_fail = matches!(
                runner.state,
                RunnerState::Requested | RunnerState::Provisioning | RunnerState::Idle
            );
            if failure.is_some() && !may_fail {
                return Ok(()); // Changed since the snapshot: next round decides.
            }
            if !self.release(github, &runner, now, report).await? {
                return Ok(()); // Busy at GitHub, or GitHub unreachable: kept.
            }
            if let Some(reason) = &failure {
                match store
                    .apply_runner_event(
                        runner.id,
                        &RunnerEvent::Failed {
                            reason: reason.clone(),
                        },
                        now,
                    )
                    .await
                {
                    Ok(failed) => runner = failed,
                    Err(StoreError::RunnerTransition(_)) => return Ok(()),
                    Err(other) => return Err(other),
                }
            }
        }
        let providers = self.providers();
        let (Some(provider), Some(instance)) = (
            providers.by_name.get(&runner.provider),
            runner.instance_id.clone(),
        ) else {
            return Ok(());
        };
        let deleted = {
            let Ok(_permit) = self.permit_to_act(&runner.provider, "delete").await else {
                return Ok(());
            };
            provider.delete(&InstanceId(instance)).await
        };
        match deleted {
            Ok(()) => {
                if runner.state == RunnerState::Terminating {
                    store
                        .apply_runner_event(runner.id, &RunnerEvent::Terminated, now)
                        .await?;
                }
                self.service
                    .metrics
                    .runner_delete_requests
                    .get_or_create(&result_label(DeleteResult::Ok))
                    .inc();
                report.deleted += 1;
            }
            Err(error) => {
                self.provider_error(&runner.provider, "delete", &error.to_string());
                self.service
                    .metrics
                    .runner_delete_requests
                    .get_or_create(&result_label(DeleteResult::Error))
                    .inc();
            }
        }
        Ok(())
    }
}
