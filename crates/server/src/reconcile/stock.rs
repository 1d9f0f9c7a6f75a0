//! Each pool's stock of stopped runners (issue 60), planned by
//! `runway_core::stopped::plan` before the round's main plan: runners the
//! stock starts are booting capacity in the snapshot, so the planner does
//! not cold-boot for the jobs they will take.
//!
//! - **start:** the runner's record moves `stopped → provisioning` first
//!   (out of the stock), then its provider starts the instance, fenced as
//!   every side effect is. A start the provider refuses (no capacity, the
//!   instance gone) fails the runner and deletes its instance: its job
//!   stays queued, and the next round cold-boots for it; that provider's
//!   stopped runners are then not started for [`START_BACKOFF`], so the
//!   queue is not held by starts that keep failing.
//! - **prepare:** a create batch of stock runners: no job credential is
//!   minted or handed over (only a start would need one).
//! - **retire:** the normal delete path (`stopped → terminating`).
//!
//! Only providers with `resume_seconds` keep a stock (so far `sim`, `ec2`,
//! `container` and `exec`). An `exec` (GARM) start carries nothing to the
//! machine: its runner's instance token, inert while in the stock, is
//! armed for the start instead (`credentials.rs`).

use super::*;
use runway_core::stopped::{StoppedInput, StoppedRunner};

/// How long a provider whose start of a stopped runner was refused (no
/// capacity, most often) starts no other: its pools' jobs get cold boots,
/// which bidding can place on another offer.
pub const START_BACKOFF: Duration = Duration::from_secs(60);

impl Inner {
    /// Plans each stock-keeping pool's stock at `now` from the round's
    /// `snapshot` (its queue: the jobs the main plan will see, held ones
    /// left out) and starts the calls; each runner started joins the
    /// snapshot as booting.
    pub(super) async fn stock(
        self: &Arc<Self>,
        now: Timestamp,
        snapshot: &mut runway_core::planner::Snapshot,
    ) -> Result<Vec<Task>, StoreError> {
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
            let Some(planned_pool) = snapshot
                .pools
                .iter_mut()
                .find(|p| p.policy.name == pool.name)
            else {
                continue;
            };
            // A paused pool starts nothing.
            let queued = if planned_pool.policy.paused {
                0
            } else {
                planned_pool.queued.len() as u64 + u64::from(planned_pool.unlisted)
            };
            let stopped: Vec<StoppedRunner> = runners
                .iter()
                .filter(|r| r.stock && r.state == RunnerState::Stopped && !self.is_worked_on(r.id))
                .map(|r| StoppedRunner {
                    id: r.id,
                    created_at: r.requested_at,
                    stopped_at: r.stopped_at.unwrap_or(r.requested_at),
                })
                .collect();
            // A stock runner whose first boot never ended stopped within
            // the pool's boot timeout (an EC2 instance that never powered
            // itself off, a stop that never took) is failed and replaced:
            // the planner's boot timeout never sees the stock.
            let (overdue, preparing): (Vec<&runway_core::Runner>, Vec<&runway_core::Runner>) =
                runners
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
                    .partition(|r| {
                        // One whose create is in doubt is judged by `doubt.rs`.
                        !r.create_in_doubt() && now.since(r.requested_at) > pool.boot_timeout
                    });
            let preparing = preparing.len() as u32;
            for runner in overdue.iter().filter(|r| !self.is_worked_on(r.id)) {
                tasks.extend(self.dispatch(
                    Action::FailAndDelete {
                        pool: pool.name.clone(),
                        runner: runner.id,
                        reason: format!(
                            "stopped runner not stopped {}s after it was requested (boot_timeout)",
                            pool.boot_timeout.as_secs()
                        ),
                    },
                    now,
                ));
            }
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
            // After a refused start, the jobs get cold boots for a while
            // (the main plan sees them uncovered in this very round).
            let starts = if self.starts_refused(&provider.name, now) {
                Vec::new()
            } else {
                planned.start
            };
            for id in starts {
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
                planned_pool.runners.push(runway_core::planner::RunnerView {
                    id,
                    provider: provider.name.clone(),
                    state: RunnerState::Provisioning,
                    in_doubt: false,
                    requested_at: now,
                    idle_at: None,
                    ready_by: Some(now.plus(provider.resume_time())),
                });
                let (this, backend, name, pool_config) = (
                    self.clone(),
                    backend.clone(),
                    provider.name.clone(),
                    pool.clone(),
                );
                let (runner, pool_name) = (runner.clone(), pool.name.clone());
                tasks.extend(self.spawn(Some(id), async move {
                    let Some(started) = this
                        .start_stopped(&runner, &backend, &name, &pool_config, &instance, now)
                        .await?
                    else {
                        return Ok(Report::default());
                    };
                    let runner_name = &runner.name;
                    let mut report = Report::default();
                    match started {
                        Ok(()) => {
                            tracing::info!(runner = %runner_name, %instance, "started a stopped runner for a queued job");
                            this.count_start(&pool_name, "started");
                        }
                        Err(error) => {
                            this.count_start(&pool_name, "refused");
                            this.refuse_starts(&name, now);
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

    /// Starts stock runner `runner`'s stopped instance for a job (its
    /// record already moved out of the stock), with one-time credentials
    /// minted now for this start: `None` when this replica no longer
    /// leads (nothing was minted or started).
    pub(super) async fn start_stopped(
        &self,
        runner: &runway_core::Runner,
        backend: &Arc<dyn Provider>,
        provider: &str,
        pool: &PoolConfig,
        instance: &str,
        now: Timestamp,
    ) -> Result<Option<Result<(), ProviderError>>, StoreError> {
        // What the machine reads at this boot: its armed instance token
        // (a GARM machine, whose start carries nothing), or the request
        // the provider writes where the machine reads it.
        let fresh = if backend.start_reads_instance_api() {
            match self.arm_instance_token(runner, pool, now).await? {
                Arming::Armed => None,
                Arming::Deposed => return Ok(None),
                Arming::Refused(why) => {
                    return Ok(Some(Err(ProviderError::permanent(provider, why))))
                }
            }
        } else {
            match self
                .boot_request(
                    runner,
                    pool,
                    backend,
                    ("", &serde_json::Value::Null),
                    true,
                    now,
                )
                .await?
            {
                Minted::Request(request) => Some(request),
                Minted::Deposed => return Ok(None),
                Minted::Refused => {
                    return Ok(Some(Err(ProviderError::permanent(
                        provider,
                        "no runner registration for its start".to_owned(),
                    ))))
                }
            }
        };
        let Ok(_permit) = self.permit_to_act(provider, "start").await else {
            return Ok(None);
        };
        Ok(Some(
            backend
                .start(&InstanceId(instance.to_owned()), fresh.as_deref())
                .await,
        ))
    }

    /// Whether provider `name` had a start refused less than
    /// [`START_BACKOFF`] before `now`.
    fn starts_refused(&self, name: &str, now: Timestamp) -> bool {
        self.starts_refused
            .lock()
            .map(|refused| refused.get(name).is_some_and(|until| now < *until))
            .unwrap_or(false)
    }

    fn refuse_starts(&self, name: &str, now: Timestamp) {
        if let Ok(mut refused) = self.starts_refused.lock() {
            refused.insert(name.to_owned(), now.plus(START_BACKOFF));
        }
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
