//! The `sim` provider: a deterministic cloud. Instances become ready after a
//! boot time (fixed, or uniform in a range), creates fail with a given
//! probability, there is a quota and a price. Seeded, and driven by a
//! [`Clock`], so tests and `runway sim` replay exactly. With a
//! `resume_time`, an instance can be stopped (listed stopped, off the quota)
//! and started again, ready that long after.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use runway_core::planner::Offer;
use runway_core::Timestamp;

use crate::{Clock, CreateRequest, Instance, InstanceId, InstanceState, Provider, ProviderError};

#[derive(Debug, Clone, PartialEq)]
pub enum BootTime {
    Fixed(Duration),
    /// Uniform between the two bounds.
    Uniform(Duration, Duration),
}

impl BootTime {
    fn mean(&self) -> Duration {
        match self {
            BootTime::Fixed(duration) => *duration,
            BootTime::Uniform(low, high) => (*low + *high) / 2,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    pub name: String,
    pub boot_time: BootTime,
    /// Probability in [0, 1] that a create fails.
    pub fail_rate: f64,
    pub price_per_hour: f64,
    pub max_instances: u32,
    pub seed: u64,
    /// How long a stopped instance takes to be ready once started; `None`:
    /// its instances cannot stop.
    pub resume_time: Option<Duration>,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            name: "sim".to_owned(),
            // The LXD install time the reactive-scheduling spec measured.
            boot_time: BootTime::Uniform(Duration::from_secs(120), Duration::from_secs(180)),
            fail_rate: 0.0,
            price_per_hour: 0.10,
            max_instances: 100,
            seed: 0,
            resume_time: None,
        }
    }
}

struct SimInstance {
    id: InstanceId,
    ready_at: Timestamp,
    stopped: bool,
    /// The bootstrap keys each of its boots was given (its create's, then
    /// each start's with credentials), for tests: never the values.
    boots: Vec<Vec<String>>,
}

impl SimInstance {
    fn state(&self, now: Timestamp) -> InstanceState {
        if self.stopped {
            InstanceState::Stopped
        } else if self.ready_at <= now {
            InstanceState::Running
        } else {
            InstanceState::Pending
        }
    }
}

struct State {
    instances: BTreeMap<String, SimInstance>,
    rng: StdRng,
    next_id: u64,
}

pub struct SimProvider {
    config: SimConfig,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
}

impl SimProvider {
    pub fn new(config: SimConfig, clock: Arc<dyn Clock>) -> SimProvider {
        let rng = StdRng::seed_from_u64(config.seed);
        SimProvider {
            config,
            clock,
            state: Mutex::new(State {
                instances: BTreeMap::new(),
                rng,
                next_id: 1,
            }),
        }
    }

    /// Instance `id`, or a permanent error of `operation` naming it.
    fn instance<'a>(
        &self,
        state: &'a mut State,
        id: &InstanceId,
        operation: &str,
    ) -> Result<&'a mut SimInstance, ProviderError> {
        state
            .instances
            .values_mut()
            .find(|instance| &instance.id == id)
            .ok_or_else(|| ProviderError::Permanent {
                provider: self.config.name.clone(),
                message: format!("{operation}: no instance {id}"),
            })
    }

    /// The bootstrap keys each boot of the instance named `name` was given
    /// (its create's, then each start's that carried credentials).
    pub fn boots(&self, name: &str) -> Vec<Vec<String>> {
        self.state
            .lock()
            .ok()
            .and_then(|state| state.instances.get(name).map(|i| i.boots.clone()))
            .unwrap_or_default()
    }

    fn state(&self) -> Result<std::sync::MutexGuard<'_, State>, ProviderError> {
        self.state.lock().map_err(|_| ProviderError::Transient {
            provider: self.config.name.clone(),
            message: "internal state poisoned".to_owned(),
        })
    }
}

/// Instances that count against the quota: all but the stopped ones.
fn running(state: &State) -> u32 {
    state.instances.values().filter(|i| !i.stopped).count() as u32
}

#[async_trait]
impl Provider for SimProvider {
    fn name(&self) -> &str {
        &self.config.name
    }

    async fn create(&self, request: &CreateRequest) -> Result<Instance, ProviderError> {
        let now = self.clock.now();
        let mut state = self.state()?;
        if let Some(existing) = state.instances.get(&request.name) {
            return Ok(Instance {
                id: existing.id.clone(),
                name: request.name.clone(),
                state: existing.state(now),
            });
        }
        if running(&state) >= self.config.max_instances {
            return Err(ProviderError::Quota {
                provider: self.config.name.clone(),
                limit: self.config.max_instances,
            });
        }
        if state.rng.gen_bool(self.config.fail_rate.clamp(0.0, 1.0)) {
            return Err(ProviderError::Transient {
                provider: self.config.name.clone(),
                message: "simulated create failure".to_owned(),
            });
        }
        let boot = match self.config.boot_time {
            BootTime::Fixed(duration) => duration,
            BootTime::Uniform(low, high) if high > low => {
                let millis = state.rng.gen_range(low.as_millis()..=high.as_millis());
                Duration::from_millis(u64::try_from(millis).unwrap_or(u64::MAX))
            }
            BootTime::Uniform(low, _) => low,
        };
        let id = InstanceId(format!("{}-{:06}", self.config.name, state.next_id));
        state.next_id += 1;
        state.instances.insert(
            request.name.clone(),
            SimInstance {
                id: id.clone(),
                ready_at: now.plus(boot),
                stopped: false,
                boots: vec![request.bootstrap.keys().cloned().collect()],
            },
        );
        Ok(Instance {
            id,
            name: request.name.clone(),
            state: if boot.is_zero() {
                InstanceState::Running
            } else {
                InstanceState::Pending
            },
        })
    }

    async fn delete(&self, id: &InstanceId) -> Result<(), ProviderError> {
        self.state()?
            .instances
            .retain(|_, instance| &instance.id != id);
        Ok(())
    }

    async fn stop(&self, id: &InstanceId) -> Result<(), ProviderError> {
        if self.config.resume_time.is_none() {
            return Err(ProviderError::Permanent {
                provider: self.config.name.clone(),
                message: format!("instance {id} cannot be stopped (no resume_seconds)"),
            });
        }
        let mut state = self.state()?;
        self.instance(&mut state, id, "StopInstance")?.stopped = true;
        Ok(())
    }

    async fn start(
        &self,
        id: &InstanceId,
        fresh: Option<&CreateRequest>,
    ) -> Result<(), ProviderError> {
        let Some(resume) = self.config.resume_time else {
            return Err(ProviderError::Permanent {
                provider: self.config.name.clone(),
                message: format!("instance {id} cannot be started again"),
            });
        };
        let now = self.clock.now();
        let mut state = self.state()?;
        let running = running(&state);
        let instance = self.instance(&mut state, id, "StartInstance")?;
        if !instance.stopped {
            return Ok(());
        }
        // A start takes quota again, as a create does.
        if running >= self.config.max_instances {
            return Err(ProviderError::Quota {
                provider: self.config.name.clone(),
                limit: self.config.max_instances,
            });
        }
        instance.stopped = false;
        instance.ready_at = now.plus(resume);
        if let Some(fresh) = fresh {
            instance
                .boots
                .push(fresh.bootstrap.keys().cloned().collect());
        }
        Ok(())
    }

    async fn list(&self) -> Result<Vec<Instance>, ProviderError> {
        let now = self.clock.now();
        Ok(self
            .state()?
            .instances
            .iter()
            .map(|(name, instance)| Instance {
                id: instance.id.clone(),
                name: name.clone(),
                state: instance.state(now),
            })
            .collect())
    }

    fn bid(&self, _pool: &str, capacity: u32) -> Vec<Offer> {
        let used = self.state.lock().map(|s| running(&s)).unwrap_or(u32::MAX);
        crate::quota_offer(
            &self.config.name,
            self.config.max_instances,
            used,
            capacity,
            self.config.price_per_hour,
            self.config.boot_time.mean(),
            (1.0 - self.config.fail_rate).clamp(0.01, 1.0),
        )
    }
}
