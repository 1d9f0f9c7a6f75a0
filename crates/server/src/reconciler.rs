//! The reconciler: level-triggered. Each round it observes what the
//! providers report, snapshots the store, asks the pure planner what to do,
//! applies the actions through the providers and records every outcome. It
//! assumes nothing about why it runs; running it twice in a row is harmless.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use runway_core::planner::{
    backoff_delay, learn_reliability, plan, Action, Backoff, Plan, Snapshot,
};
use runway_core::runner::NewRunner;
use runway_core::{JobState, RunnerEvent, RunnerId, RunnerState, Timestamp};
use runway_providers::sim::{BootTime, SimConfig, SimProvider};
use runway_providers::{Clock, CreateRequest, InstanceId, InstanceState, Provider};
use runway_store::{JobFilter, RunnerFilter, StoreError};

use crate::config::ProviderConfig;
use crate::service::Service;

/// Builds the providers a configuration declares. Kinds whose runners
/// report readiness themselves (process, exec) land with their providers.
pub fn build_providers(
    configs: &[ProviderConfig],
    clock: Arc<dyn Clock>,
) -> Result<BTreeMap<String, Arc<dyn Provider>>, String> {
    let mut providers: BTreeMap<String, Arc<dyn Provider>> = BTreeMap::new();
    for config in configs {
        match config.kind.as_str() {
            "sim" => {
                let (low, high) = config.boot_seconds;
                let boot_time = if low == high {
                    BootTime::Fixed(Duration::from_secs_f64(low))
                } else {
                    BootTime::Uniform(Duration::from_secs_f64(low), Duration::from_secs_f64(high))
                };
                let sim = SimConfig {
                    name: config.name.clone(),
                    boot_time,
                    fail_rate: config.fail_rate,
                    price_per_hour: config.price_per_hour,
                    max_instances: config.max_instances,
                    seed: config.seed,
                };
                providers.insert(
                    config.name.clone(),
                    Arc::new(SimProvider::new(sim, clock.clone())),
                );
            }
            other => {
                // Declared for worker configurations; runway cannot drive
                // this kind yet, so no runners are started through it.
                tracing::warn!(
                    provider = %config.name,
                    kind = other,
                    "this provider kind cannot start runners yet (only \"sim\"); it is used for worker-configuration checks only"
                );
            }
        }
    }
    Ok(providers)
}

#[derive(Default)]
struct Health {
    consecutive_failures: u32,
    backoff: Option<Backoff>,
}

/// What one round did, for logs and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub created: u32,
    pub create_failures: u32,
    pub deleted: u32,
    pub delete_refused_busy: u32,
    pub marked_ready: u32,
    pub marked_lost: u32,
}

pub struct Reconciler {
    service: Arc<Service>,
    providers: BTreeMap<String, Arc<dyn Provider>>,
    health: Mutex<BTreeMap<String, Health>>,
    /// Reliability learnt from each provider's create outcomes; an offer
    /// counts with the lower of this and what the provider declares.
    reliability: Mutex<BTreeMap<String, f64>>,
}

impl Reconciler {
    pub fn new(
        service: Arc<Service>,
        providers: BTreeMap<String, Arc<dyn Provider>>,
    ) -> Reconciler {
        Reconciler {
            service,
            providers,
            health: Mutex::new(BTreeMap::new()),
            reliability: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn has_providers(&self) -> bool {
        !self.providers.is_empty()
    }

    /// One round at `now`.
    pub async fn reconcile_once(&self, now: Timestamp) -> Result<(Report, Plan), StoreError> {
        let started = Instant::now();
        let mut report = Report::default();
        self.observe(now, &mut report).await?;
        let snapshot = self.snapshot(now).await?;
        let plan = plan(&snapshot, now);
        for action in &plan.actions {
            self.apply(action, now, &mut report).await?;
        }
        self.update_gauges(&plan).await?;
        if let Ok(mut last) = self.service.last_plan.lock() {
            *last = Some(plan.clone());
        }
        self.service
            .metrics
            .reconcile_duration
            .observe(started.elapsed().as_secs_f64());
        if report != Report::default() {
            tracing::info!(target: "runway::events", event = "reconciliation", ?report);
        }
        Ok((report, plan))
    }

    /// Brings runner records in line with what providers report: booted
    /// instances make their runners idle, vanished ones fail (or crash, if busy).
    async fn observe(&self, now: Timestamp, report: &mut Report) -> Result<(), StoreError> {
        let store = &self.service.store;
        for (name, provider) in &self.providers {
            let instances = match provider.list().await {
                Ok(instances) => instances,
                Err(error) => {
                    self.provider_error(name, "list", &error.to_string());
                    continue;
                }
            };
            let by_id: BTreeMap<&InstanceId, InstanceState> =
                instances.iter().map(|i| (&i.id, i.state)).collect();
            let runners = store.list_runners(&RunnerFilter::default()).await?;
            for runner in runners
                .iter()
                .filter(|r| &r.provider == name && !r.state.is_terminal())
            {
                let Some(instance_id) =
                    runner.instance_id.as_ref().map(|id| InstanceId(id.clone()))
                else {
                    continue; // A create in flight; boot_timeout covers one that never finished.
                };
                if runner.state == RunnerState::Terminating && by_id.contains_key(&instance_id) {
                    // Terminated outside a scale-down (an ephemeral runner
                    // after its job): delete its instance now.
                    match provider.delete(&instance_id).await {
                        Ok(()) => {
                            if store
                                .apply_runner_event(runner.id, &RunnerEvent::Terminated, now)
                                .await
                                .is_ok()
                            {
                                report.deleted += 1;
                            }
                        }
                        Err(error) => self.provider_error(name, "delete", &error.to_string()),
                    }
                    continue;
                }
                let event = match (by_id.get(&instance_id), runner.state) {
                    (Some(InstanceState::Running), RunnerState::Provisioning) => {
                        Some(RunnerEvent::Ready)
                    }
                    (None | Some(InstanceState::Stopped), RunnerState::Busy) => {
                        Some(RunnerEvent::Crashed {
                            reason: format!("instance {instance_id} vanished while running a job"),
                        })
                    }
                    (None | Some(InstanceState::Stopped), RunnerState::Terminating) => {
                        Some(RunnerEvent::Terminated)
                    }
                    (
                        None | Some(InstanceState::Stopped),
                        RunnerState::Provisioning | RunnerState::Idle,
                    ) => Some(RunnerEvent::Failed {
                        reason: format!("instance {instance_id} vanished"),
                    }),
                    _ => None,
                };
                if let Some(event) = event {
                    let ready = event == RunnerEvent::Ready;
                    if store
                        .apply_runner_event(runner.id, &event, now)
                        .await
                        .is_ok()
                    {
                        if ready {
                            report.marked_ready += 1;
                        } else {
                            report.marked_lost += 1;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    async fn snapshot(&self, now: Timestamp) -> Result<Snapshot, StoreError> {
        let mut pools = Vec::new();
        for pool in &self.service.config.pools {
            let allowed =
                |name: &str| pool.providers.is_empty() || pool.providers.iter().any(|p| p == name);
            let offers = self
                .providers
                .iter()
                .filter(|(name, _)| allowed(name))
                .flat_map(|(_, provider)| provider.bid(&pool.name, pool.max_runners))
                .map(|mut offer| {
                    offer.reliability = offer
                        .reliability
                        .min(self.learnt_reliability(&offer.provider));
                    offer
                })
                .collect();
            pools.push(crate::explain::pool_snapshot(&self.service, pool, offers).await?);
        }
        let backoffs = self
            .health
            .lock()
            .map(|health| {
                health
                    .values()
                    .filter_map(|h| h.backoff.clone())
                    .filter(|b| b.retry_at > now)
                    .collect()
            })
            .unwrap_or_default();
        Ok(Snapshot { pools, backoffs })
    }

    async fn apply(
        &self,
        action: &Action,
        now: Timestamp,
        report: &mut Report,
    ) -> Result<(), StoreError> {
        let store = &self.service.store;
        let metrics = &self.service.metrics;
        match action {
            Action::Create {
                pool,
                provider,
                count,
            } => {
                let Some(backend) = self.providers.get(provider) else {
                    return Ok(());
                };
                let labels = self
                    .service
                    .config
                    .pools
                    .iter()
                    .find(|p| &p.name == pool)
                    .map(|p| p.labels.clone())
                    .unwrap_or_default();
                let (mut succeeded, mut last_error) = (0u32, None);
                for _ in 0..*count {
                    let suffix: u32 = rand::thread_rng().gen();
                    let name = format!("{pool}-{:08x}", suffix);
                    let runner = store
                        .create_runner(
                            &NewRunner {
                                name: name.clone(),
                                pool: pool.clone(),
                                provider: provider.clone(),
                                labels: labels.clone(),
                            },
                            now,
                        )
                        .await?;
                    let request = CreateRequest {
                        name,
                        pool: pool.clone(),
                        labels: labels.clone(),
                        bootstrap: BTreeMap::new(),
                        launch_config: serde_json::json!({}),
                    };
                    match backend.create(&request).await {
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
                                .get_or_create(&crate::metrics::PoolProviderLabels {
                                    pool: pool.clone(),
                                    provider: provider.clone(),
                                })
                                .inc();
                            succeeded += 1;
                            report.created += 1;
                            self.learn(provider, true);
                        }
                        Err(error) => {
                            store
                                .apply_runner_event(
                                    runner.id,
                                    &RunnerEvent::Failed {
                                        reason: error.to_string(),
                                    },
                                    now,
                                )
                                .await?;
                            self.provider_error(provider, "create", &error.to_string());
                            report.create_failures += 1;
                            self.learn(provider, false);
                            let permanent = !error.is_retryable();
                            last_error = Some(error.to_string());
                            if permanent {
                                break; // The rest would fail the same way.
                            }
                        }
                    }
                }
                // A provider that delivers some of what was asked is merely
                // unreliable (the next round asks again for the rest); one
                // that delivers nothing is backed off, so the next offer wins.
                match (succeeded, last_error) {
                    (0, Some(error)) => self.provider_failed(provider, &error, now),
                    (_, _) if succeeded > 0 => self.provider_succeeded(provider),
                    _ => {}
                }
            }
            Action::Delete { pool, runner } => {
                self.delete(pool, *runner, None, now, report).await?
            }
            Action::FailAndDelete {
                pool,
                runner,
                reason,
            } => {
                self.delete(pool, *runner, Some(reason.clone()), now, report)
                    .await?
            }
        }
        Ok(())
    }

    async fn delete(
        &self,
        pool: &str,
        runner_id: RunnerId,
        failure: Option<String>,
        now: Timestamp,
        report: &mut Report,
    ) -> Result<(), StoreError> {
        let store = &self.service.store;
        let result_label = |result: &str| crate::metrics::PoolResultLabels {
            pool: pool.to_owned(),
            result: result.to_owned(),
        };
        let event = match &failure {
            Some(reason) => RunnerEvent::Failed {
                reason: reason.clone(),
            },
            None => RunnerEvent::TerminateRequested,
        };
        let runner = match store.apply_runner_event(runner_id, &event, now).await {
            Ok(runner) => runner,
            Err(StoreError::RunnerTransition(runway_core::RunnerTransitionError::Busy {
                ..
            })) => {
                self.service
                    .metrics
                    .runner_delete_requests
                    .get_or_create(&result_label("refused_busy"))
                    .inc();
                report.delete_refused_busy += 1;
                return Ok(());
            }
            // Changed since the snapshot (it took a job, it vanished): next round decides.
            Err(StoreError::RunnerTransition(_)) => return Ok(()),
            Err(other) => return Err(other),
        };
        let (Some(provider), Some(instance)) = (
            self.providers.get(&runner.provider),
            runner.instance_id.clone(),
        ) else {
            return Ok(());
        };
        match provider.delete(&InstanceId(instance)).await {
            Ok(()) => {
                if runner.state == RunnerState::Terminating {
                    store
                        .apply_runner_event(runner.id, &RunnerEvent::Terminated, now)
                        .await?;
                }
                self.service
                    .metrics
                    .runner_delete_requests
                    .get_or_create(&result_label("ok"))
                    .inc();
                report.deleted += 1;
            }
            Err(error) => {
                self.provider_error(&runner.provider, "delete", &error.to_string());
                self.service
                    .metrics
                    .runner_delete_requests
                    .get_or_create(&result_label("error"))
                    .inc();
            }
        }
        Ok(())
    }

    async fn update_gauges(&self, plan: &Plan) -> Result<(), StoreError> {
        let runners = self
            .service
            .store
            .list_runners(&RunnerFilter::default())
            .await?;
        let metrics = &self.service.metrics;
        for pool in &self.service.config.pools {
            for state in RunnerState::ALL.iter().filter(|s| !s.is_terminal()) {
                let count = runners
                    .iter()
                    .filter(|r| r.pool == pool.name && r.state == *state)
                    .count();
                metrics
                    .runners
                    .get_or_create(&crate::metrics::PoolStateLabels {
                        pool: pool.name.clone(),
                        state: state.as_str().to_owned(),
                    })
                    .set(count as i64);
            }
        }
        let mut waiting: BTreeMap<(String, &'static str), i64> = BTreeMap::new();
        let pool_of: BTreeMap<_, _> = self
            .service
            .store
            .list_jobs(&JobFilter {
                state: Some(JobState::Queued),
                ..JobFilter::default()
            })
            .await?
            .into_iter()
            .map(|j| (j.id, j.pool.unwrap_or_default()))
            .collect();
        for (job, reason) in &plan.waiting {
            let pool = pool_of.get(job).cloned().unwrap_or_default();
            *waiting.entry((pool, reason.code())).or_default() += 1;
        }
        metrics.jobs_waiting.clear();
        for ((pool, reason), count) in waiting {
            metrics
                .jobs_waiting
                .get_or_create(&crate::metrics::PoolReasonLabels {
                    pool,
                    reason: reason.to_owned(),
                })
                .set(count);
        }
        Ok(())
    }

    fn provider_error(&self, provider: &str, operation: &str, message: &str) {
        tracing::warn!(provider, operation, error = message, "provider call failed");
        self.service
            .metrics
            .provider_errors
            .get_or_create(&crate::metrics::ProviderOperationLabels {
                provider: provider.to_owned(),
                operation: operation.to_owned(),
            })
            .inc();
    }

    fn provider_failed(&self, provider: &str, message: &str, now: Timestamp) {
        if let Ok(mut health) = self.health.lock() {
            let entry = health.entry(provider.to_owned()).or_default();
            entry.consecutive_failures += 1;
            let delay = backoff_delay(
                entry.consecutive_failures,
                rand::thread_rng().gen_range(0.5..=1.0),
            );
            entry.backoff = Some(Backoff {
                provider: provider.to_owned(),
                retry_at: now.plus(delay),
                last_error: message.to_owned(),
            });
        }
    }

    fn learnt_reliability(&self, provider: &str) -> f64 {
        self.reliability
            .lock()
            .ok()
            .and_then(|learnt| learnt.get(provider).copied())
            .unwrap_or(1.0)
    }

    fn learn(&self, provider: &str, succeeded: bool) {
        if let Ok(mut learnt) = self.reliability.lock() {
            let entry = learnt.entry(provider.to_owned()).or_insert(1.0);
            *entry = learn_reliability(*entry, succeeded);
        }
    }

    fn provider_succeeded(&self, provider: &str) {
        if let Ok(mut health) = self.health.lock() {
            health.remove(provider);
        }
    }
}

/// Runs the reconciler every `interval`, and at once when a job arrives,
/// until `shutdown` flips.
pub async fn run(
    reconciler: Arc<Reconciler>,
    interval: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut consecutive_errors: u32 = 0;
    loop {
        let wait = if consecutive_errors == 0 {
            interval
        } else {
            interval.saturating_mul(2u32.saturating_pow(consecutive_errors.min(5)))
        };
        tokio::select! {
            _ = shutdown.changed() => return,
            () = tokio::time::sleep(wait) => {}
            () = reconciler.service.job_available.notified() => {}
        }
        if *shutdown.borrow() {
            return;
        }
        match reconciler.reconcile_once(crate::service::now()).await {
            Ok(_) => consecutive_errors = 0,
            Err(error) => {
                consecutive_errors += 1;
                reconciler.service.metrics.store_error("reconcile");
                tracing::warn!(%error, consecutive_errors, "reconcile failed; backing off");
            }
        }
    }
}
