//! Create batches: quota slots and records first, then the provider calls.

use super::*;

/// Why a create batch stopped before its last runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stopped {
    /// The provider (or GitHub) refused for good, or GitHub said no.
    Refused,
    /// The provider has no quota left.
    Quota,
    /// This replica can no longer show it leads: nothing more is done,
    /// records included (they are the next leader's).
    Deposed,
}

impl Inner {
    /// Creates `count` runners of `pool` through `provider`; with `stock`,
    /// runners for its stock of stopped runners, which are handed no job
    /// credential (a start would need one, not a create).
    pub(super) async fn create_batch(
        self: Arc<Self>,
        pool: String,
        provider: String,
        offer: String,
        count: u32,
        stock: bool,
        now: Timestamp,
    ) -> Result<Report, StoreError> {
        let began = Instant::now();
        let mut report = Report::default();
        let (pool, provider, count) = (&pool, &provider, &count);
        let store = &self.store();
        let metrics = &self.service.metrics;

        let Some(backend) = self.providers().by_name.get(provider).cloned() else {
            return Ok(report);
        };
        let config = self.service.config();
        let Some(pool_config) = config.pools.iter().find(|p| &p.name == pool) else {
            return Ok(report);
        };
        if pool_config.github.is_some() && self.jit_backing_off(pool, now) {
            return Ok(report); // GitHub refused lately; asked again later.
        }
        if pool_config
            .github
            .as_ref()
            .is_some_and(|github| github.scale_set.is_some())
            && self
                .service
                .scale_sets
                .get(pool)
                .and_then(|handle| handle.id())
                .is_none()
        {
            // Its listener has not found or created the scale set yet:
            // no runner could register.
            return Ok(report);
        }
        let labels = pool_config.labels.clone();
        let launch_config = match crate::app::worker_configs::launch_config(
            &self.service,
            pool,
            provider,
            backend.offer_inputs(&offer),
        )
        .await
        {
            Ok(values) => values,
            Err(message) => {
                // No runner could boot as configured: back off like a failed create.
                self.provider_error(provider, "launch_config", &message);
                self.provider_failed(provider, &offer, &message, now);
                return Ok(report);
            }
        };
        let (mut succeeded, mut last_error) = (0u32, None);
        let mut failed = Vec::new();
        // Every runner's quota slot and record first, before any call: a
        // round that plans while this batch works sees them all (its
        // records as supply, its slots in the provider's bid), so it
        // neither asks for them again nor gives their quota to another
        // pool. A provider with no slot left stops the batch there:
        // capacity, not a failure.
        let mut batch = Vec::new();
        for _ in 0..*count {
            let suffix: u32 = rand::thread_rng().gen();
            let name = format!("{pool}-{:08x}", suffix);
            if let Err(error) = backend.reserve(&name) {
                tracing::debug!(%provider, %error, "no quota slot for another runner this round");
                break;
            }
            let created = store
                .create_runner(
                    &NewRunner {
                        name: name.clone(),
                        pool: pool.clone(),
                        provider: provider.clone(),
                        labels: labels.clone(),
                        stock,
                    },
                    now,
                )
                .await;
            let runner = match created {
                Ok(runner) => runner,
                Err(error) => {
                    backend.unreserve(&name);
                    for (runner, _) in &batch {
                        let runner: &runway_core::Runner = runner;
                        backend.unreserve(&runner.name);
                    }
                    return Err(error);
                }
            };
            // Nothing else concludes about it while it is created.
            let working = self.working_on(runner.id);
            batch.push((runner, working));
        }
        let mut stopped: Option<Stopped> = None;
        for (runner, _working) in batch {
            let name = runner.name.clone();
            if let Some(why) = &stopped {
                // The batch stopped before this one's turn.
                backend.unreserve(&name);
                match why {
                    // Ended if the store still takes this term's writes (a
                    // lease that ran out; a later term's store refuses).
                    Stopped::Deposed => {
                        if let Err(error) = self.never_started(&runner, now).await {
                            tracing::debug!(%error, runner = %runner.name, "a deposed leader's runner record is left to the next leader");
                        }
                    }
                    _ => self.never_started(&runner, now).await?,
                }
                continue;
            }
            let request = match self
                .boot_request(
                    &runner,
                    pool_config,
                    &backend,
                    (&offer, &launch_config),
                    !stock,
                    now,
                )
                .await?
            {
                Minted::Request(request) => *request,
                Minted::Deposed => {
                    backend.unreserve(&name);
                    stopped = Some(Stopped::Deposed);
                    if let Err(error) = self.never_started(&runner, now).await {
                        tracing::debug!(%error, runner = %runner.name, "a deposed leader's runner record is left to the next leader");
                    }
                    continue;
                }
                Minted::Refused => {
                    // GitHub said no (the record is failed); the next
                    // round asks again.
                    backend.unreserve(&name);
                    report.create_failures += 1;
                    stopped = Some(Stopped::Refused);
                    continue;
                }
            };
            let created = {
                let Ok(_permit) = self.permit_to_act(provider, "create").await else {
                    backend.unreserve(&name);
                    stopped = Some(Stopped::Deposed);
                    if let Err(error) = self.never_started(&runner, now).await {
                        tracing::debug!(%error, runner = %runner.name, "a deposed leader's runner record is left to the next leader");
                    }
                    continue;
                };
                backend.create(&request).await
            };
            match created {
                Ok(instance) => {
                    store
                        .apply_runner_event(
                            runner.id,
                            &RunnerEvent::ProvisioningStarted {
                                instance_id: instance.id.0.clone(),
                            },
                            now,
                        )
                        .await?;
                    metrics
                        .runners_created
                        .get_or_create(&crate::telemetry::metrics::PoolProviderLabels {
                            pool: pool.clone(),
                            provider: provider.clone(),
                        })
                        .inc();
                    succeeded += 1;
                    report.created += 1;
                    self.learn(provider, &offer, true, now);
                }
                Err(ProviderError::Quota { .. }) => {
                    // Another create took the slot (a provider that holds
                    // none ahead): capacity, not a failed launch; the offer's
                    // reliability is untouched.
                    backend.unreserve(&name);
                    metrics
                        .offer_creates
                        .get_or_create(&crate::telemetry::metrics::OfferResultLabels {
                            provider: provider.clone(),
                            offer: offer.clone(),
                            result: "quota",
                        })
                        .inc();
                    self.never_started(&runner, now).await?;
                    if let Some(github) = &pool_config.github {
                        if let Err(error) = self.deregister(github, &runner).await? {
                            tracing::warn!(runner = %runner.name, %error, "cannot deregister a runner the provider had no quota for");
                        }
                    }
                    stopped = Some(Stopped::Quota);
                }
                Err(error) if error.is_in_doubt() => {
                    // The instance may exist, or appear later: the record
                    // stays in flight (its quota slot held, no longer
                    // booting for demand) until a list adopts the instance
                    // or the in-flight window passes (`observe`). Nothing
                    // is deregistered or deleted on it now.
                    self.provider_error(provider, "create", &error.to_string());
                    report.create_failures += 1;
                    self.learn(provider, &offer, false, now);
                    last_error = Some(error.to_string());
                    let ended = now.plus(began.elapsed());
                    self.create_in_doubt(&runner, &error.to_string(), ended)
                        .await?;
                }
                Err(error) => {
                    backend.unreserve(&name);
                    self.provider_error(provider, "create", &error.to_string());
                    report.create_failures += 1;
                    self.learn(provider, &offer, false, now);
                    let permanent = !error.is_retryable();
                    last_error = Some(error.to_string());
                    failed.push((runner, error.to_string()));
                    if permanent {
                        stopped = Some(Stopped::Refused); // The rest would fail the same way.
                    }
                }
            }
        }
        // A provider that delivers some of what was asked is merely
        // unreliable (the next round asks again for the rest); one
        // that delivers nothing is backed off, so the next offer wins.
        // Backed off from when the calls ended, not from the round:
        // time spent hanging must not use up the backoff.
        match (succeeded, last_error) {
            (0, Some(error)) => {
                self.provider_failed(provider, &offer, &error, now.plus(began.elapsed()))
            }
            (_, _) if succeeded > 0 => self.provider_succeeded(provider, &offer),
            _ => {}
        }
        // Only now are the failed runners' records failed: a round that
        // sees their demand uncovered also sees the offer's backoff, and
        // never asks the failing offer again in between.
        for (runner, reason) in failed {
            store
                .apply_runner_event(runner.id, &RunnerEvent::Failed { reason }, now)
                .await?;
            // Its registration would never come online.
            if let Some(github) = &pool_config.github {
                if let Err(error) = self.deregister(github, &runner).await? {
                    tracing::warn!(runner = %runner.name, %error, "cannot deregister a runner whose machine never started");
                }
            }
        }
        Ok(report)
    }

    /// Ends `runner`, whose create was never made (its batch stopped first,
    /// or the provider had no quota): terminated, as a runner that is no
    /// longer needed, not failed: nothing was tried and nothing broke.
    async fn never_started(
        &self,
        runner: &runway_core::Runner,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let store = self.store();
        for event in [RunnerEvent::TerminateRequested, RunnerEvent::Terminated] {
            match store.apply_runner_event(runner.id, &event, now).await {
                Ok(_) => {}
                Err(StoreError::RunnerTransition(_) | StoreError::RunnerNotFound(_)) => break,
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }
}
