//! Each pool's stock of stopped runners (issue 60), planned by
//! `runway_core::stopped::plan` before the round's main plan: runners the
//! stock starts are booting capacity in the snapshot, so the planner does
//! not cold-boot for the jobs they will take.
//!
//! - **start:** the runner's record moves `stopped → provisioning` first
//!   (out of the stock), then its provider starts the instance, fenced as
//!   every side effect is. A start the provider refuses (no capacity, the
//!   instance gone) fails the runner and deletes its instance: its job
//!   stays queued, and the next round cold-boots for it.
//! - **prepare:** a create batch of stock runners: no job credential is
//!   minted or handed over (only a start would need one).
//! - **retire:** the normal delete path (`stopped → terminating`).
//!
//! Only providers with `resume_seconds` keep a stock (so far `sim`).

use super::*;
use runway_core::stopped::{StoppedInput, StoppedRunner};

impl Inner {
    /// Plans each stock-keeping pool's stock at `now` and starts the calls.
    pub(super) async fn stock(self: &Arc<Self>, now: Timestamp) -> Result<Vec<Task>, StoreError> {
        let config = self.service.config();
        let mut tasks = Vec::new();
        for pool in config.pools.iter().filter(|p| p.max_stopped > 0) {
            let Some(provider) = config.stopping_provider(pool) else {
                continue;
            };
            let Some(backend) = self.providers().by_name.get(&provider.name).cloned() else {
                continue;
            };
            let store = self.store();
            let runners = store.list_live_runners(Some(&pool.name)).await?;
            let queued = store.queued_count(&pool.name).await?;
            let stopped: Vec<StoppedRunner> = runners
                .iter()
                .filter(|r| r.stock && r.state == RunnerState::Stopped && !self.is_worked_on(r.id))
                .map(|r| StoppedRunner {
                    id: r.id,
                    created_at: r.requested_at,
                    stopped_at: r.stopped_at.unwrap_or(r.requested_at),
                })
                .collect();
            let preparing = runners
                .iter()
                .filter(|r| {
                    r.stock
                        && matches!(
                            r.state,
                            RunnerState::Requested
                                | RunnerState::Provisioning
                                | RunnerState::Stopping
                        )
                })
                .count() as u32;
            let covering = runners
                .iter()
                .filter(|r| {
                    !r.stock
                        && !r.create_in_doubt()
                        && matches!(
                            r.state,
                            RunnerState::Idle | RunnerState::Requested | RunnerState::Provisioning
                        )
                })
                .count() as u64;
            let running = runners.iter().filter(|r| !r.stock).count() as u32;
            let policy = pool.stopped_policy();
            let boot = Duration::from_secs_f64(
                ((provider.boot_seconds.0 + provider.boot_seconds.1) / 2.0).max(0.0),
            );
            let planned = runway_core::stopped::plan(
                &StoppedInput {
                    policy: &policy,
                    stopped: &stopped,
                    preparing,
                    uncovered: u32::try_from(queued.saturating_sub(covering)).unwrap_or(u32::MAX),
                    room: pool.max_runners.saturating_sub(running),
                    expected: self.stock_expected(pool, now),
                    surplus_after: runway_core::stopped::surplus_after(
                        boot,
                        provider.price_per_hour,
                        provider.stopped_price(),
                        policy.max_age,
                    ),
                },
                now,
            );
            for id in planned.start {
                let Some(runner) = runners.iter().find(|r| r.id == id) else {
                    continue;
                };
                let Some(instance) = runner.instance_id.clone() else {
                    continue;
                };
                // Out of the stock first: the planner counts it as booting,
                // and nothing else starts it again.
                if store
                    .apply_runner_event(id, &RunnerEvent::StartRequested, now)
                    .await
                    .is_err()
                {
                    continue;
                }
                let (this, backend, name, pool_name) = (
                    self.clone(),
                    backend.clone(),
                    provider.name.clone(),
                    pool.name.clone(),
                );
                let runner_name = runner.name.clone();
                tasks.extend(self.spawn(Some(id), async move {
                    let started = {
                        let Ok(_permit) = this.permit_to_act(&name, "start").await else {
                            return Ok(Report::default());
                        };
                        backend.start(&InstanceId(instance.clone())).await
                    };
                    let mut report = Report::default();
                    match started {
                        Ok(()) => {
                            tracing::info!(runner = %runner_name, %instance, "started a stopped runner for a queued job");
                            this.count_start(&pool_name, "started");
                        }
                        Err(error) => {
                            this.count_start(&pool_name, "refused");
                            // Its job stays queued: the next round cold-boots.
                            this.provider_error(&name, "start", &error.to_string());
                            let reason = format!("start of its stopped instance refused: {error}");
                            report.create_failures += 1;
                            this.delete_runner(&pool_name, id, Some(reason), now, &mut report)
                                .await?;
                        }
                    }
                    Ok(report)
                }));
            }
            for id in planned.retire {
                tasks.extend(self.dispatch(
                    Action::Delete {
                        pool: pool.name.clone(),
                        runner: id,
                    },
                    now,
                ));
            }
            if planned.prepare > 0 {
                let offer = backend
                    .bid(&pool.name, planned.prepare)
                    .first()
                    .map(|o| o.key.clone())
                    .unwrap_or_default();
                let (this, pool_name, name, count) = (
                    self.clone(),
                    pool.name.clone(),
                    provider.name.clone(),
                    planned.prepare,
                );
                tasks.extend(self.spawn(None, async move {
                    this.create_batch(pool_name, name, offer, count, true, now)
                        .await
                }));
            }
        }
        Ok(tasks)
    }

    fn count_start(&self, pool: &str, result: &'static str) {
        self.service
            .metrics
            .stopped_runner_starts
            .get_or_create(&crate::telemetry::metrics::PoolKindLabels {
                pool: pool.to_owned(),
                kind: result,
            })
            .inc();
    }

    /// Whether a task is working on `runner` now.
    fn is_worked_on(&self, runner: RunnerId) -> bool {
        self.in_flight
            .lock()
            .map(|in_flight| in_flight.contains(&runner))
            .unwrap_or(true)
    }
}
