//! Observation: each provider's list taken by a round, and what it means for the runners it judges (`core::observe` decides).

use super::*;

/// What [`Inner::power`] does to an instance.
#[derive(Clone, Copy)]
enum Power {
    Start,
    Stop,
}

impl Inner {
    /// Starts a list of every provider that has none running, and waits
    /// for them as for any call.
    async fn refresh_lists(self: &Arc<Self>, now: Timestamp) -> Result<(), StoreError> {
        let mut tasks = Vec::new();
        let providers = self.providers();
        for (name, provider) in &providers.by_name {
            let Ok(mut listing) = self.listing.lock() else {
                continue;
            };
            let entry = listing.entry(name.clone()).or_default();
            if entry.in_flight {
                continue; // Still running since an earlier round.
            }
            entry.in_flight = true;
            drop(listing);
            let (this, name, provider) = (self.clone(), name.clone(), provider.clone());
            tasks.extend(self.spawn(None, async move {
                let outcome = {
                    let _permit = this.permit(&name).await;
                    provider.list().await.map_err(|e| e.to_string())
                };
                if let Ok(mut listing) = this.listing.lock() {
                    let entry = listing.entry(name).or_default();
                    entry.in_flight = false;
                    entry.latest = Some(Listed {
                        started_at: now,
                        outcome,
                    });
                }
                Ok(Report::default())
            }));
        }
        self.collect(tasks).await.map(drop)
    }

    /// Brings runner records in line with what providers report: booted
    /// instances make their runners idle, vanished ones fail (or crash, if
    /// busy). Each provider's latest list is used once; a provider whose
    /// list is still running is observed in a later round.
    pub(super) async fn observe(
        self: &Arc<Self>,
        now: Timestamp,
        report: &mut Report,
    ) -> Result<(), StoreError> {
        self.refresh_lists(now).await?;
        let mut lists: BTreeMap<String, Listed> = self
            .listing
            .lock()
            .map(|mut listing| {
                listing
                    .iter_mut()
                    .filter_map(|(name, entry)| Some((name.clone(), entry.latest.take()?)))
                    .collect()
            })
            .unwrap_or_default();
        // One read of the live runners per round, after the lists were
        // taken: a record is written before its instance is created, so
        // every listed instance's record is in it. Each provider's part
        // below touches only its own runners, so the snapshot stays true.
        let runners = self.store().list_live_runners(None).await?;
        // Backoffs of runners no longer live (ended, or gone with their
        // machine) are forgotten: the map stays as small as the fleet.
        let live: std::collections::BTreeSet<RunnerId> = runners.iter().map(|r| r.id).collect();
        if let Ok(mut waits) = self.deregistrations.lock() {
            // An ended runner's wait is kept a while: the orphan rules ask
            // GitHub about an ended record's machine at doubling waits.
            let kept = Duration::from_secs(3600);
            waits.retain(|id, (_, not_before)| live.contains(id) || now < not_before.plus(kept));
            if let Ok(mut busy) = self.refused_busy_at.lock() {
                busy.retain(|id, _| waits.contains_key(id));
            }
        }
        if let Ok(mut in_doubt) = self.in_doubt.lock() {
            in_doubt.retain(|id, _| live.contains(id));
        }
        let mut tasks = Vec::new();
        let providers = self.providers();
        for (name, provider) in &providers.by_name {
            let Some(listed) = lists.remove(name) else {
                continue;
            };
            let instances = match listed.outcome {
                Ok(instances) => instances,
                Err(error) => {
                    self.provider_error(name, "list", &error);
                    continue;
                }
            };
            let judged: Vec<runway_core::Runner> = {
                let in_flight = self.in_flight.lock().map(|f| f.clone()).unwrap_or_default();
                runners
                    .iter()
                    .filter(|r| &r.provider == name && !r.state.is_terminal())
                    // Nothing is concluded about a runner a task is working
                    // on, or one requested after the list began.
                    .filter(|r| !in_flight.contains(&r.id) && r.requested_at < listed.started_at)
                    .cloned()
                    .collect()
            };
            tasks.extend(self.orphans(name, provider, &instances, &runners, now, report));
            let listing = runway_core::observe::Listing {
                started_at: listed.started_at,
                lag: self.list_lag(name),
            };
            self.observe_provider(
                name, provider, &instances, &judged, listing, now, report, &mut tasks,
            )
            .await?;
        }
        report.merge(self.collect(tasks).await?);
        Ok(())
    }

    /// Observes `runners` of provider `name` against its `instances`;
    /// provider calls it needs go to `tasks`.
    #[allow(clippy::too_many_arguments)]
    async fn observe_provider(
        self: &Arc<Self>,
        name: &str,
        provider: &Arc<dyn Provider>,
        instances: &[runway_providers::Instance],
        runners: &[runway_core::Runner],
        listing: runway_core::observe::Listing,
        now: Timestamp,
        report: &mut Report,
        tasks: &mut Vec<Task>,
    ) -> Result<(), StoreError> {
        let store = &self.store();
        let by_id: BTreeMap<&InstanceId, InstanceState> =
            instances.iter().map(|i| (&i.id, i.state)).collect();
        let registers = provider.runners_register();
        for runner in runners {
            let instance_id = match &runner.instance_id {
                Some(id) => InstanceId(id.clone()),
                None => {
                    // Its create never returned, or its outcome is unknown
                    // (a timeout, a restart, a lost lead): the instance, if
                    // any, carries its name.
                    let Some(found) = instances.iter().find(|i| i.name == runner.name) else {
                        // No task here works on it and no instance carries
                        // its name (yet): in doubt until its in-flight
                        // window passes (`doubt.rs`).
                        self.judge_without_instance(provider, runner, now, report)
                            .await?;
                        continue;
                    };
                    let started = RunnerEvent::ProvisioningStarted {
                        instance_id: found.id.0.clone(),
                    };
                    if store
                        .apply_runner_event(runner.id, &started, now)
                        .await
                        .is_err()
                    {
                        continue;
                    }
                    if runner.state == RunnerState::Requested {
                        // The list counts it now: its held slot goes.
                        provider.unreserve(&runner.name);
                        tracing::info!(runner = %runner.name, instance = %found.id, "adopted the instance of a create whose answer was lost");
                        report.adopted += 1;
                    }
                    self.forget_doubt(runner.id);
                    found.id.clone()
                }
            };
            let github = self.github_pool(&runner.pool);
            if let (Some(github), RunnerState::Busy, None) =
                (github.as_ref(), runner.state, runner.job)
            {
                self.settle_unknown_job(github, runner, now).await?;
                continue;
            }
            if runner.state == RunnerState::Terminating && by_id.contains_key(&instance_id) {
                // Terminated outside a scale-down (an ephemeral runner
                // after its job): deregister, then delete its instance.
                let (this, runner, provider, name) = (
                    self.clone(),
                    runner.clone(),
                    provider.clone(),
                    name.to_owned(),
                );
                tasks.extend(self.spawn(Some(runner.id), async move {
                    let mut report = Report::default();
                    if let Some(github) = this.github_pool(&runner.pool) {
                        if runner.busy_at.is_some() {
                            // A just-in-time runner runs one job, and GitHub
                            // removes it when that job is over: asking again
                            // would only wait on the request budget while the
                            // finished runner holds the pool's capacity.
                            this.store().set_runner_external_id(runner.id, "").await?;
                        } else if !this.release(&github, &runner, now, &mut report).await? {
                            return Ok(report);
                        }
                    }
                    let deleted = {
                        let Ok(_permit) = this.permit_to_act(&name, "delete").await else {
                            return Ok(report);
                        };
                        provider.delete(&instance_id).await
                    };
                    match deleted {
                        Ok(()) => {
                            if this
                                .store()
                                .apply_runner_event(runner.id, &RunnerEvent::Terminated, now)
                                .await
                                .is_ok()
                            {
                                report.deleted += 1;
                            }
                        }
                        Err(error) => this.provider_error(&name, "delete", &error.to_string()),
                    }
                    Ok(report)
                }));
                continue;
            }
            let observed = match by_id.get(&instance_id) {
                // Listed as ended: gone for sure, no lag to wait out.
                None if provider.seen_gone(&instance_id) => Observed::Failed,
                None => Observed::Absent,
                Some(InstanceState::Pending) => Observed::Pending,
                Some(InstanceState::Running) => Observed::Running,
                Some(InstanceState::Stopped) => Observed::Stopped,
                Some(InstanceState::Failed) => Observed::Failed,
                Some(InstanceState::Unknown) => Observed::Unknown,
            };
            if wants_start(runner, observed) {
                // A runner just started from the stock may still be listed
                // stopped while the list lags behind its start.
                if runner.stopped_at.is_some()
                    && now.since(runner.requested_at) < self.list_lag(name)
                {
                    continue;
                }
                // Stopped, not gone (GARM's `stopped`): started again.
                tasks.extend(self.power(provider, name, &instance_id, runner, Power::Start, now));
                continue;
            }
            // A stock runner up (or still up after its stop): stopped, a
            // fenced side effect like a create.
            let stop = runner.stock
                && observed == Observed::Running
                && matches!(
                    runner.state,
                    RunnerState::Requested | RunnerState::Provisioning | RunnerState::Stopping
                );
            if stop && runner.state != RunnerState::Stopping && provider.stock_stops_itself() {
                // It powers itself off once its first boot has warmed it.
                continue;
            }
            if stop {
                if runner.state != RunnerState::Stopping
                    && store
                        .apply_runner_event(runner.id, &RunnerEvent::StopRequested, now)
                        .await
                        .is_err()
                {
                    continue;
                }
                tasks.extend(self.power(provider, name, &instance_id, runner, Power::Stop, now));
                continue;
            }
            // A runner that registers itself is ready when it says so,
            // not when its machine is up. A GitHub pool's runners
            // register with GitHub, not with runway.
            let readiness = if registers && github.is_none() {
                Readiness::RunnerRegisters
            } else {
                Readiness::MachineRunning
            };
            let Some(event) = observe(runner, &instance_id.0, observed, readiness, listing) else {
                continue; // Nothing changes (or its instance is not visible yet).
            };
            // What the provider knows of why it ended ("out of memory", its
            // last output) goes with the runner's reason.
            let event = match (event, provider.ended_detail(&instance_id)) {
                (RunnerEvent::Crashed { reason }, Some(detail)) => RunnerEvent::Crashed {
                    reason: format!("{reason}: {detail}"),
                },
                (RunnerEvent::Failed { reason }, Some(detail)) => RunnerEvent::Failed {
                    reason: format!("{reason}: {detail}"),
                },
                (event, _) => event,
            };
            if matches!(event, RunnerEvent::Crashed { .. })
                && github.is_some()
                && !self.completion_grace_over(runner.id, now)
            {
                continue; // Its completion may still be on its way.
            }
            let ready = event == RunnerEvent::Ready;
            // A runway-API job whose runner's machine is gone goes back to
            // the queue now, with the runner's crash, not at its lease's end.
            let moved = match (&event, runner.job, &github) {
                (RunnerEvent::Crashed { .. }, Some(job), None) => {
                    crate::app::jobs::holder_lost(&self.service, job, runner.id, &event, now)
                        .await?
                        .is_some()
                }
                _ => false,
            };
            if !moved
                && store
                    .apply_runner_event(runner.id, &event, now)
                    .await
                    .is_err()
            {
                continue;
            }
            if matches!(event, RunnerEvent::Crashed { .. }) {
                *report.crashed.entry(runner.pool.clone()).or_default() += 1;
                // Every crash the reconciler sees counts (a busy runner's
                // machine gone, on GitHub pools once its completion had its
                // grace), not only a lease that expired: GitHub jobs have no
                // lease, so their crashes never reached the alert. Once per
                // runner: its missing post-job report may have said it.
                crate::app::reports::crash_seen(&self.service, runner, now).await;
            }
            let stock_event = matches!(event, RunnerEvent::Stopped);
            if let (Some(github), false) = (github, ready || stock_event) {
                // Its machine is gone: so must its registration be.
                if let Err(error) = self.deregister(&github, runner).await? {
                    tracing::debug!(runner = %runner.name, %error, "registration of a vanished runner left to GitHub");
                }
            }
            if ready {
                let installed = now.since(runner.requested_at);
                self.service
                    .metrics
                    .runner_installed(&runner.pool, installed);
                self.service.events.emit(
                    "runner_installed",
                    serde_json::json!({
                        "timestamp": now.as_millis().div_euclid(1000),
                        "flavor": runner.pool,
                        "duration": installed.as_secs_f64().round() as u64,
                    }),
                    now,
                );
                report.marked_ready += 1;
            } else if !stock_event {
                report.marked_lost += 1;
            }
        }
        Ok(())
    }

    /// Starts (a stopped machine of a runner that counts on it) or stops
    /// (a stock runner once up) `runner`'s instance, as a task of its own,
    /// fenced like every side effect.
    fn power(
        self: &Arc<Self>,
        provider: &Arc<dyn Provider>,
        name: &str,
        instance_id: &InstanceId,
        runner: &runway_core::Runner,
        power: Power,
        now: Timestamp,
    ) -> Option<Task> {
        let (this, provider, name, runner, instance_id) = (
            self.clone(),
            provider.clone(),
            name.to_owned(),
            runner.clone(),
            instance_id.clone(),
        );
        let runner_name = runner.name.clone();
        self.spawn(Some(runner.id), async move {
            let operation = match power {
                Power::Start => "start",
                Power::Stop => "stop",
            };
            let config = this.service.config();
            let pool = config.pool(&runner.pool);
            let done = match (power, pool) {
                // A runner started from the stock whose start did not take
                // (runway stopped meanwhile, or the start did not come
                // through): started again for its job, with credentials
                // minted anew (the first ones may be gone with the call).
                (Power::Start, Some(pool)) if runner.stopped_at.is_some() => {
                    match this
                        .start_stopped(&runner, &provider, &name, pool, &instance_id.0, now)
                        .await?
                    {
                        Some(done) => done,
                        None => return Ok(Report::default()),
                    }
                }
                _ => {
                    let Ok(_permit) = this.permit_to_act(&name, operation).await else {
                        return Ok(Report::default());
                    };
                    match power {
                        Power::Start => provider.start(&instance_id, None).await,
                        Power::Stop => provider.stop(&instance_id).await,
                    }
                }
            };
            match done {
                Ok(()) => tracing::info!(runner = %runner_name, instance = %instance_id, operation, "powered an instance"),
                Err(error) => this.provider_error(&name, operation, &error.to_string()),
            }
            Ok(Report::default())
        })
    }

    /// Whether busy runner `runner`, whose machine is gone, has waited
    /// [`COMPLETION_GRACE`] for its job's completion since this replica
    /// first saw it gone. Runners no longer waiting are forgotten here
    /// once their grace would be long over.
    fn completion_grace_over(&self, runner: RunnerId, now: Timestamp) -> bool {
        let Ok(mut vanished) = self.vanished_busy.lock() else {
            return true;
        };
        vanished.retain(|_, since| now.since(*since) < COMPLETION_GRACE * 4);
        let since = *vanished.entry(runner).or_insert(now);
        let over = now.since(since) >= COMPLETION_GRACE;
        if over {
            vanished.remove(&runner);
        }
        over
    }

    /// How long provider `name`'s list may lag behind its creates
    /// (`[providers.NAME] list_lag`).
    pub(super) fn list_lag(&self, name: &str) -> Duration {
        self.service
            .config()
            .providers
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.list_lag)
            .unwrap_or_default()
    }
}
