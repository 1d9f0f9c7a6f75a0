//! Providers (DESIGN §6): each knows how to create, list and delete
//! instances on one backend, and what capacity it can offer; none knows
//! anything of demand. The reconciler decides; a provider only does.
//!
//! Every provider passes one conformance suite (`tests/conformance.rs`):
//! creates are idempotent by instance name, deletes are idempotent and
//! tolerate an instance that never finished being created, and offers never
//! exceed the quota left.

pub mod container;
pub mod ec2;
pub mod environment;
pub mod exec;
pub mod factory;
pub mod process;
pub mod settings;
pub mod sim;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use runway_core::planner::Offer;
use runway_core::Timestamp;

/// The provider's own identifier of an instance.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstanceId(pub String);

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How a machine booted by a GARM provider reaches runway's instance API
/// (GARM's `metadata-url`, `callback-url`, `instance-token`, `tools`).
#[derive(Clone, PartialEq)]
pub struct InstanceApi {
    pub metadata_url: String,
    pub callback_url: String,
    /// The machine's bearer token. Secret: never logged.
    pub token: String,
    /// What the machine downloads (GARM's `RunnerApplicationDownload`s).
    pub tools: Vec<serde_json::Value>,
    /// The script put into `extra_specs.runner_install_template`: it
    /// fetches the real install script with the token.
    pub install_wrapper: String,
    /// GARM's `repo_url`: the GitHub organisation or repository a GitHub
    /// pool's runner serves (empty otherwise).
    pub repo_url: String,
}

impl fmt::Debug for InstanceApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InstanceApi")
            .field("metadata_url", &self.metadata_url)
            .field("callback_url", &self.callback_url)
            .field("token", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// What a new runner needs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CreateRequest {
    /// Deterministic and unique: a retried create finds the first attempt.
    pub name: String,
    pub pool: String,
    /// Which of the provider's offers the planner chose (`Offer::key`;
    /// empty for a provider's only offer).
    pub offer: String,
    pub labels: Vec<String>,
    /// Environment the runner boots with (`RUNWAY_URL`, a one-time
    /// registration token, …). Secret: never logged.
    pub bootstrap: BTreeMap<String, String>,
    /// The launch configuration the pool's worker configuration evaluated to.
    pub launch_config: serde_json::Value,
    /// For a provider whose machines call runway's GARM instance API.
    pub instance_api: Option<InstanceApi>,
    /// A runner of its pool's stock of stopped runners: the machine boots
    /// once to warm (no credential in `bootstrap`) and is then stopped,
    /// until a [`Provider::start`] gives it its credentials for a job.
    pub stock: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceState {
    /// Created, not yet able to run a job.
    Pending,
    Running,
    /// Powered off but still there: it may be started again
    /// ([`Provider::start`]).
    Stopped,
    /// Failed, exited or being deleted: it will not run a job.
    Failed,
    /// The provider cannot tell now; nothing is concluded from it.
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub id: InstanceId,
    pub name: String,
    pub state: InstanceState,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    #[error("provider {provider} has no quota left ({limit} instances)")]
    Quota { provider: String, limit: u32 },
    #[error("provider {provider}: {message}")]
    Transient { provider: String, message: String },
    #[error("provider {provider}: {message}")]
    Permanent { provider: String, message: String },
    /// The call's outcome is unknown (it timed out, or its connection
    /// broke after the request went out): the instance may exist, or
    /// appear later. Never a reason to delete anything: the runner's
    /// record stays in flight until a list shows the instance or its
    /// in-flight window passes (DESIGN §3).
    #[error("provider {provider}: {message} (outcome unknown: the instance may exist)")]
    InDoubt { provider: String, message: String },
}

impl ProviderError {
    /// A failure of `provider` that may pass.
    pub fn transient(provider: &str, message: String) -> ProviderError {
        ProviderError::Transient {
            provider: provider.to_owned(),
            message,
        }
    }

    /// A refusal of `provider` that needs a configuration change.
    pub fn permanent(provider: &str, message: String) -> ProviderError {
        ProviderError::Permanent {
            provider: provider.to_owned(),
            message,
        }
    }

    /// A call of `provider` whose outcome is unknown.
    pub fn in_doubt(provider: &str, message: String) -> ProviderError {
        ProviderError::InDoubt {
            provider: provider.to_owned(),
            message,
        }
    }

    /// Whether the call may have done what it was asked although it
    /// failed ([`ProviderError::InDoubt`]).
    pub fn is_in_doubt(&self) -> bool {
        matches!(self, ProviderError::InDoubt { .. })
    }

    /// Whether the same call may succeed later (quota frees up, a network
    /// blip passes); a permanent error needs a configuration change.
    pub fn is_retryable(&self) -> bool {
        !matches!(self, ProviderError::Permanent { .. })
    }
}

#[async_trait]
pub trait Provider: Send + Sync {
    fn name(&self) -> &str;

    /// Starts an instance named `request.name`, or returns the one already
    /// started under that name.
    async fn create(&self, request: &CreateRequest) -> Result<Instance, ProviderError>;

    /// Deletes an instance. Deleting one that does not exist is not an error.
    async fn delete(&self, id: &InstanceId) -> Result<(), ProviderError>;

    /// Starts a stopped instance again. With `fresh`, the instance is a
    /// stopped runner of a pool's stock started for a job: `fresh` carries
    /// the one-time credentials minted for this start, which the provider
    /// puts where the machine reads them at this boot before it starts it,
    /// and never starts it if it cannot (a stale or missing credential
    /// takes no job). Without, the machine boots as it was (a runner's
    /// machine stopped underneath, started again). Providers whose
    /// instances cannot stop (they only fail) keep the default, which
    /// refuses.
    async fn start(
        &self,
        id: &InstanceId,
        fresh: Option<&CreateRequest>,
    ) -> Result<(), ProviderError> {
        let _ = fresh;
        Err(ProviderError::Permanent {
            provider: self.name().to_owned(),
            message: format!("instance {id} cannot be started again"),
        })
    }

    /// Stops an instance (powered off, kept: a stopped runner of a pool's
    /// stock, `runway_core::stopped`). Stopping one already stopped is not
    /// an error. Providers whose instances cannot stop keep the default,
    /// which refuses.
    async fn stop(&self, id: &InstanceId) -> Result<(), ProviderError> {
        Err(ProviderError::Permanent {
            provider: self.name().to_owned(),
            message: format!("instance {id} cannot be stopped"),
        })
    }

    /// Every instance this provider manages for this installation: tagged
    /// with this installation's controller id and, since provider names
    /// were added to tags, with this provider's name. Another provider's
    /// instances (of this installation or another) are never listed.
    async fn list(&self) -> Result<Vec<Instance>, ProviderError>;

    /// Whether the latest list proved `id` this provider's own (its tags
    /// name this provider). An instance from before provider names were
    /// tagged is listed, so that its record can find it, but unproven:
    /// another provider of the same kind may list it too, so nothing that
    /// no record of this provider accounts for is ever deleted on it.
    fn proven_own(&self, id: &InstanceId) -> bool {
        let _ = id;
        true
    }

    /// Offers for up to `capacity` new runners of `pool`.
    fn bid(&self, pool: &str, capacity: u32) -> Vec<Offer>;

    /// Holds a quota slot for the runner `name` that is about to be
    /// created, before its record is written and its create called, so a
    /// round that plans meanwhile (its bid) sees the slot taken. A create
    /// of that name uses the slot; [`Provider::unreserve`] gives back one
    /// that no create will use. [`ProviderError::Quota`] when none is left:
    /// capacity, not a failure. Providers that count their creates
    /// otherwise keep the default, which holds nothing.
    fn reserve(&self, name: &str) -> Result<(), ProviderError> {
        let _ = name;
        Ok(())
    }

    /// Whether the latest list saw instance `id` ended (EC2 lists a
    /// terminated instance for a while): its absence from the list is then
    /// no lag to wait out (`list_lag`), it is gone for sure.
    fn seen_gone(&self, id: &InstanceId) -> bool {
        let _ = id;
        false
    }

    /// Why instance `id`, listed as ended ([`InstanceState::Failed`]),
    /// ended, when the provider knows more than that it did ("out of
    /// memory", an exit code, its last output): added to its runner's
    /// reason.
    fn ended_detail(&self, id: &InstanceId) -> Option<String> {
        let _ = id;
        None
    }

    /// Gives back the slot [`Provider::reserve`] held for `name`.
    fn unreserve(&self, name: &str) {
        let _ = name;
    }

    /// The condition inputs a launch on `offer` adds to the evaluation of
    /// the pool's worker configuration (an EC2 offer's `region`,
    /// `availabilityZone`, `instanceType` and `purchaseOption`), so rules
    /// can say, for example, which subnet each zone uses.
    fn offer_inputs(&self, _offer: &str) -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    /// Whether this provider's machines call runway's GARM instance API
    /// (its creates then carry [`CreateRequest::instance_api`]).
    fn uses_instance_api(&self) -> bool {
        false
    }

    /// Whether this provider's runners say themselves when they are ready
    /// (they register with a one-time token); then a running instance is
    /// not yet a ready runner.
    fn runners_register(&self) -> bool {
        false
    }

    /// Whether a stock runner's machine stops itself once its first boot
    /// has warmed it (an EC2 instance powers itself off at the end of its
    /// user data): runway then waits for it to stop instead of stopping it
    /// as soon as it runs. Past the pool's `boot_timeout` it is failed and
    /// replaced as any runner that never came up.
    fn stock_stops_itself(&self) -> bool {
        false
    }

    /// Whether a stock runner's machine reads its one-time credential at
    /// its start from runway's GARM instance API, with the instance token
    /// its create gave it, because a start carries nothing to the machine
    /// (GARM's `StartInstance` has no payload). That token works only once
    /// its runner is started for a job: until then the instance API
    /// answers 409 `instance_not_started`, and a stopped disk holds no
    /// credential that takes a job. Providers that hand `fresh` to the
    /// machine themselves (EC2's user data, a container's environment)
    /// keep the default.
    fn start_reads_instance_api(&self) -> bool {
        false
    }
}

/// The instances the last list showed with this installation's mark but
/// without the proof that this provider made them ([`Provider::proven_own`]):
/// never deleted. Empty (all proven) until a list says otherwise; a
/// poisoned lock proves nothing.
#[derive(Debug, Default)]
pub struct Unproven(std::sync::Mutex<std::collections::BTreeSet<InstanceId>>);

impl Unproven {
    /// What the latest list found unproven, in place of the last one's.
    pub fn replace(&self, unproven: std::collections::BTreeSet<InstanceId>) {
        if let Ok(mut kept) = self.0.lock() {
            *kept = unproven;
        }
    }

    /// Whether `id` is proven this provider's own.
    pub fn proves(&self, id: &InstanceId) -> bool {
        self.0
            .lock()
            .map(|unproven| !unproven.contains(id))
            .unwrap_or(false)
    }
}

/// Quota slots held for creates about to be made ([`Provider::reserve`]),
/// by runner name, for providers that count their instances themselves.
#[derive(Debug, Default)]
pub struct Slots(std::sync::Mutex<std::collections::BTreeSet<String>>);

impl Slots {
    /// Holds a slot for `name` unless `used` instances and the slots held
    /// already reach `max` ([`ProviderError::Quota`]); holding one twice
    /// is one slot.
    pub fn reserve(
        &self,
        provider: &str,
        name: &str,
        used: u32,
        max: u32,
    ) -> Result<(), ProviderError> {
        let mut held = self
            .0
            .lock()
            .map_err(|_| ProviderError::transient(provider, "quota lock poisoned".into()))?;
        if held.contains(name) {
            return Ok(());
        }
        if used + held.len() as u32 >= max {
            return Err(ProviderError::Quota {
                provider: provider.to_owned(),
                limit: max,
            });
        }
        held.insert(name.to_owned());
        Ok(())
    }

    /// Gives `name`'s slot back.
    pub fn release(&self, name: &str) {
        if let Ok(mut held) = self.0.lock() {
            held.remove(name);
        }
    }

    /// Gives back the slot of each create whose instance a list shows: it
    /// is counted among the listed instances now. Held on, it would count
    /// twice, and for good once the instance is deleted by a path that
    /// never gave it back, shrinking the provider's quota until a restart.
    pub fn release_listed(&self, instances: &[Instance]) {
        if let Ok(mut held) = self.0.lock() {
            for instance in instances {
                held.remove(&instance.name);
            }
        }
    }

    /// How many slots are held.
    pub fn held(&self) -> u32 {
        self.0.lock().map(|held| held.len() as u32).unwrap_or(0)
    }

    /// How many slots are held for creates other than `name`'s whose
    /// instances are not among `listed` (names): a create whose instance a
    /// list shows already, while its call has not returned, counts once.
    pub fn held_besides_unlisted(
        &self,
        name: &str,
        listed: &std::collections::BTreeSet<String>,
    ) -> u32 {
        self.0
            .lock()
            .map(|held| {
                held.iter()
                    .filter(|n| n.as_str() != name && !listed.contains(n.as_str()))
                    .count() as u32
            })
            .unwrap_or(0)
    }

    /// How many slots are held for creates other than `name`'s.
    pub fn held_besides(&self, name: &str) -> u32 {
        self.0
            .lock()
            .map(|held| held.iter().filter(|n| n.as_str() != name).count() as u32)
            .unwrap_or(0)
    }
}

/// Asked by a provider right before a call that changes something in the
/// cloud (create, delete, start, stop): `Err` with why the caller may no
/// longer act (`runway serve`: this replica does not lead, or its lease ran
/// out while it was paused), and the call is not made. The reconciler
/// checks the same before each call; this check comes after whatever the
/// provider does first (an `exec` provider's lookups, a pause in between),
/// so the window in which a deposed replica's call can still go out is the
/// spawn or send itself.
pub type Fence = std::sync::Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// A fence that never refuses (tests, the simulator, one process alone).
pub fn unfenced() -> Fence {
    std::sync::Arc::new(|| Ok(()))
}

/// A provider's offer: what its quota leaves of `max_instances` with
/// `used` instances, up to the `capacity` asked for (capacity 0 when
/// nothing is left: the offer is still shown, with its price and
/// reliability, in explanations and metrics).
pub fn quota_offer(
    provider: &str,
    max_instances: u32,
    used: u32,
    capacity: u32,
    price_per_hour: f64,
    boot_time: Duration,
    reliability: f64,
) -> Vec<Offer> {
    let left = max_instances.saturating_sub(used).min(capacity);
    vec![Offer {
        provider: provider.to_owned(),
        key: String::new(),
        capacity: left,
        price_per_hour,
        boot_time,
        reliability,
    }]
}

/// Where providers read the time: the wall clock under `runway serve`, a
/// hand-driven one in tests and in the simulator.
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let millis = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        Timestamp::from_millis(i64::try_from(millis).unwrap_or(i64::MAX))
    }
}

/// A clock that moves only when told to.
#[derive(Default)]
pub struct ManualClock {
    millis: AtomicI64,
}

impl ManualClock {
    pub fn new(start: Timestamp) -> ManualClock {
        ManualClock {
            millis: AtomicI64::new(start.as_millis()),
        }
    }

    pub fn advance(&self, by: Duration) {
        let by = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.millis.fetch_add(by, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(self.millis.load(Ordering::SeqCst))
    }
}
