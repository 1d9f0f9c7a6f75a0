//! The `exec` provider: an external executable driven exactly as GARM
//! drives its external providers (cloudbase/garm `runner/providers/v0.1.0`
//! and `v0.1.1`, garm-provider-common `execution/`), so the providers
//! written for GARM (LXD, Incus, OpenStack, AWS, Azure, GCP, Kubernetes, …)
//! can start runway's runners.
//!
//! Each call runs the executable once with `GARM_COMMAND`
//! (`CreateInstance`, `DeleteInstance`, `GetInstance`, `ListInstances`,
//! `RemoveAllInstances`, `StartInstance`, `StopInstance`),
//! `GARM_INTERFACE_VERSION`, `GARM_PROVIDER_CONFIG_FILE` and
//! `GARM_CONTROLLER_ID` always set. Interface `v0.1.0` adds `GARM_POOL_ID`
//! to `CreateInstance` and `ListInstances` only; `v0.1.1` (the default) adds
//! `GARM_POOL_ID` and `GARM_POOL_EXTRASPECS` (base64 of the pool's extra
//! specs as JSON) to every command, as garm-provider-common's v0.1.1
//! validation requires. `GARM_INSTANCE_ID` names the instance of the calls
//! about one (its `provider_id`, or its name when a create never returned
//! one). `CreateInstance` reads the bootstrap document as JSON on standard
//! input and prints the instance; `GetInstance` prints one instance,
//! `ListInstances` an array. Exit code 30 means "not found" (a
//! `DeleteInstance` answering it succeeded), 31 "duplicate" (a create of a
//! name that exists: runway adopts it). Statuses are GARM's: `running`,
//! `stopped` (started again by the reconciler), `error`, `unknown` (left
//! alone); `provider_fault` is base64, as Go encodes bytes. The executable
//! runs in a clean environment, as under GARM: only the base of
//! [`crate::environment`], the host variables `environment_variables`
//! names, and the `GARM_*` variables of the call. Every call has a
//! timeout; a call that overruns is killed.
//!
//! The controller id is a UUID and each pool's `GARM_POOL_ID` is a UUID
//! derived from it, this provider's name and the pool's name
//! ([`provider_pool_id`]): as in GARM, where a pool belongs to one
//! provider, so two `exec` providers on one backend never list each
//! other's instances. Providers use both as tags and labels, whose
//! lengths are limited. Instances under older ids (a pool id without the
//! provider's name, [`pool_id`]; a controller `rwc_…` with the pool's name
//! as its id) are still listed, so that their records find them, until
//! none is left — but as *unproven* ([`Provider::proven_own`]): another
//! provider may list them too, and nothing no record accounts for is
//! deleted on them.
//!
//! A call that overruns its timeout has an unknown outcome
//! ([`ProviderError::InDoubt`]): a `CreateInstance` killed late may still
//! have made its instance, so runway does not clean up by name after it
//! (GARM does); the reconciler adopts the instance or judges it as any
//! other it cannot account for. Calls of one provider run concurrently
//! (the reconciler bounds them per provider): a hung create holds its own
//! call, not the provider.

mod bootstrap;
mod call;
mod scope;

use bootstrap::*;
pub use call::*;
pub use scope::*;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine as _;
use runway_core::planner::Offer;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use crate::{CreateRequest, Instance, InstanceId, InstanceState, Provider, ProviderError};

#[derive(Debug, Clone, PartialEq)]
pub struct ExecConfig {
    pub name: String,
    /// The provider executable (a GARM external provider).
    pub executable: PathBuf,
    /// Passed as `GARM_PROVIDER_CONFIG_FILE`; opaque to runway.
    pub config_file: Option<PathBuf>,
    /// The pools (by runway name) whose instances `list` asks for.
    pub pools: Vec<String>,
    /// The longest one call may take.
    pub timeout: Duration,
    /// Host variables (names or prefixes, GARM's `environment_variables`)
    /// the executable may inherit besides the base of
    /// [`crate::environment`].
    pub environment_variables: Vec<String>,
    pub max_instances: u32,
    pub price_per_hour: f64,
    pub boot_time: Duration,
    /// How long a created instance may be missing from `ListInstances`
    /// (a GARM provider lists a real cloud): it counts against
    /// `max_instances` meanwhile.
    pub list_lag: Duration,
    /// This installation's id, a UUID (`GARM_CONTROLLER_ID`).
    pub controller_id: String,
    /// The id of an installation from before the UUIDs, whose instances
    /// (tagged with it and with the pool's name) are still looked after.
    pub legacy_controller_id: Option<String>,
    pub interface_version: InterfaceVersion,
}

pub struct ExecProvider {
    config: ExecConfig,
    /// Asked right before each call that changes an instance.
    fence: crate::Fence,
    /// Instances counted against the quota as of the last list: the
    /// listed ones and launches the list does not show yet.
    used: AtomicU32,
    /// Quota slots held for runners about to be created (by name).
    reserved: crate::Slots,
    /// Launches not yet seen in a list, and when each returned.
    launched: Mutex<BTreeMap<String, std::time::Instant>>,
    /// Instances created by this process, by name: a retried create finds
    /// the first even when the executable itself is not idempotent.
    created: Mutex<BTreeMap<String, InstanceId>>,
    /// Where each instance seen lives (from creates and lists): the calls
    /// about one instance name its pool.
    located: Mutex<BTreeMap<InstanceId, Scope>>,
    /// Each pool's extra specs, as its last create sent them.
    extra_specs: Mutex<BTreeMap<String, Value>>,
    /// Whether instances under older ids (a legacy controller, a pool id
    /// without this provider's name) may still exist.
    legacy_left: AtomicBool,
    /// Instances the latest list found only under older ids.
    unproven: crate::Unproven,
}

impl ExecProvider {
    pub fn new(config: ExecConfig) -> ExecProvider {
        ExecProvider::fenced(config, crate::unfenced())
    }

    /// A provider that asks `fence` right before each call that changes
    /// an instance (create, delete, start, stop, remove all).
    pub fn fenced(config: ExecConfig, fence: crate::Fence) -> ExecProvider {
        ExecProvider {
            config,
            fence,
            used: AtomicU32::new(0),
            reserved: crate::Slots::default(),
            launched: Mutex::new(BTreeMap::new()),
            created: Mutex::new(BTreeMap::new()),
            located: Mutex::new(BTreeMap::new()),
            extra_specs: Mutex::new(BTreeMap::new()),
            // Until a list finds none under the older ids.
            legacy_left: AtomicBool::new(true),
            unproven: crate::Unproven::default(),
        }
    }

    fn error(&self, message: String) -> ProviderError {
        ProviderError::Transient {
            provider: self.config.name.clone(),
            message,
        }
    }

    /// Deletes every instance tagged with this installation's controller
    /// id (and the legacy one).
    pub async fn remove_all(&self) -> Result<(), ProviderError> {
        let mut controllers = vec![self.config.controller_id.clone()];
        controllers.extend(self.config.legacy_controller_id.clone());
        for controller_id in controllers {
            let scope = Scope {
                controller_id,
                pool_id: None,
                pool: None,
                proven: false,
            };
            self.call(Command::RemoveAllInstances, &scope, None, None)
                .await?;
        }
        if let Ok(mut created) = self.created.lock() {
            created.clear();
        }
        if let Ok(mut located) = self.located.lock() {
            located.clear();
        }
        Ok(())
    }

    /// One instance; `Ok(None)` when the provider says it does not exist.
    pub async fn get(&self, id: &InstanceId) -> Result<Option<Instance>, ProviderError> {
        let Some(scope) = self.locate(id).await else {
            return Ok(None);
        };
        match self
            .call(Command::GetInstance, &scope, Some(&id.0), None)
            .await
        {
            Ok(stdout) => {
                let value = self.parse_json(Command::GetInstance, &stdout)?;
                self.parse_instance(Command::GetInstance, &value).map(Some)
            }
            Err(error) if error.code() == Some(EXIT_NOT_FOUND) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// `StartInstance` or `StopInstance` of instance `id`.
    async fn power(&self, command: Command, id: &InstanceId) -> Result<(), ProviderError> {
        let Some(scope) = self.locate(id).await else {
            return Err(self.error(format!("{}: no instance {id}", command.as_str())));
        };
        self.call(command, &scope, Some(&id.0), None)
            .await
            .map(drop)
            .map_err(Into::into)
    }

    /// The instance named `name` in `scope`, by listing it.
    async fn find_by_name(
        &self,
        scope: &Scope,
        name: &str,
    ) -> Result<Option<Instance>, ProviderError> {
        Ok(self
            .list_scope(scope)
            .await?
            .into_iter()
            .find(|i| i.name == name))
    }

    async fn list_scope(&self, scope: &Scope) -> Result<Vec<Instance>, ProviderError> {
        let stdout = self.call(Command::ListInstances, scope, None, None).await?;
        let value = self.parse_json(Command::ListInstances, &stdout)?;
        let items = match value {
            Value::Array(items) => items,
            Value::Null => Vec::new(),
            other => {
                return Err(self.error(format!(
                    "ListInstances printed {}, not an array",
                    short(&other.to_string())
                )))
            }
        };
        let mut instances = Vec::with_capacity(items.len());
        for item in &items {
            let instance = self.parse_instance(Command::ListInstances, item)?;
            self.remember(&instance.id, scope);
            instances.push(instance);
        }
        Ok(instances)
    }
}

impl ExecProvider {
    fn remember_created(&self, request: &CreateRequest, instance: &Instance, used: u32) {
        if let Ok(mut created) = self.created.lock() {
            created.insert(request.name.clone(), instance.id.clone());
        }
        if let Ok(mut launched) = self.launched.lock() {
            launched.insert(instance.id.0.clone(), std::time::Instant::now());
        }
        self.unreserve_slot(&request.name);
        self.used.store(used + 1, Ordering::SeqCst);
    }

    fn unreserve_slot(&self, name: &str) {
        self.reserved.release(name);
    }

    /// Gives back the quota slot of deleted instance `id` (held under its
    /// runner's name, which is its id for most GARM providers): a create
    /// whose instance is deleted is in flight no more.
    fn release_slot_of(&self, id: &InstanceId) {
        self.reserved.release(&id.0);
        if let Ok(mut created) = self.created.lock() {
            created.retain(|name, made| {
                let this = made == id;
                if this {
                    self.reserved.release(name);
                }
                !this
            });
        }
    }
}

#[async_trait]
impl Provider for ExecProvider {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn runners_register(&self) -> bool {
        true
    }

    fn uses_instance_api(&self) -> bool {
        true
    }

    fn start_reads_instance_api(&self) -> bool {
        true
    }

    async fn create(&self, request: &CreateRequest) -> Result<Instance, ProviderError> {
        let known = self
            .created
            .lock()
            .ok()
            .and_then(|created| created.get(&request.name).cloned());
        if let Some(id) = known {
            if let Ok(Some(instance)) = self.get(&id).await {
                return Ok(instance);
            }
        }
        let instances = self.list().await?;
        if let Some(found) = instances.iter().find(|i| i.name == request.name) {
            // Made by an earlier create whose answer was lost (a timeout,
            // a restart): adopted, not made twice. The list counted it.
            if let Ok(mut created) = self.created.lock() {
                created.insert(request.name.clone(), found.id.clone());
            }
            self.unreserve_slot(&request.name);
            return Ok(found.clone());
        }
        let listed: std::collections::BTreeSet<String> =
            instances.into_iter().map(|i| i.name).collect();
        let used = self.used.load(Ordering::SeqCst);
        // Creates run concurrently: another's slot whose instance the list
        // shows already counts once, in `used`.
        if used + self.reserved.held_besides_unlisted(&request.name, &listed)
            >= self.config.max_instances
        {
            self.unreserve_slot(&request.name);
            return Err(ProviderError::Quota {
                provider: self.config.name.clone(),
                limit: self.config.max_instances,
            });
        }
        if let Ok(mut specs) = self.extra_specs.lock() {
            specs.insert(request.pool.clone(), extra_specs(&request.launch_config));
        }
        let scope = self.pool_scope(&request.pool);
        let input = self.bootstrap(request).to_string();
        let stdout = match self
            .call(
                Command::CreateInstance,
                &scope,
                None,
                Some(input.as_bytes()),
            )
            .await
        {
            Ok(stdout) => stdout,
            Err(error) if error.code() == Some(EXIT_DUPLICATE) => {
                // It exists already (a create retried after runway lost
                // the answer): adopt it.
                match self.find_by_name(&scope, &request.name).await? {
                    Some(instance) => {
                        self.remember_created(request, &instance, used);
                        return Ok(instance);
                    }
                    None => return Err(error.into()),
                }
            }
            Err(error) => {
                let error = ProviderError::from(error);
                if !error.is_in_doubt() {
                    self.unreserve_slot(&request.name);
                }
                // GARM cleans up a failed create by name at once. runway
                // does not: a create that failed late (killed at its
                // timeout, say) may have made an instance that registered
                // and took a job. Its record or the orphan rules judge it
                // once the in-flight window has passed, after positive
                // checks (DESIGN §3).
                return Err(error);
            }
        };
        self.unreserve_slot(&request.name);
        let value = self.parse_json(Command::CreateInstance, &stdout)?;
        if value.get("status").and_then(Value::as_str) == Some("error") {
            let fault = fault_text(&value).unwrap_or_else(|| "no provider_fault given".to_owned());
            // As GARM does: an instance that failed to come up is removed.
            let id = value
                .get("provider_id")
                .and_then(Value::as_str)
                .filter(|id| !id.is_empty())
                .unwrap_or(&request.name);
            let _ = self
                .call(Command::DeleteInstance, &scope, Some(id), None)
                .await;
            return Err(self.error(format!("CreateInstance reported an error: {fault}")));
        }
        let instance = self.parse_instance(Command::CreateInstance, &value)?;
        self.remember(&instance.id, &scope);
        self.remember_created(request, &instance, used);
        Ok(instance)
    }

    async fn delete(&self, id: &InstanceId) -> Result<(), ProviderError> {
        let scope = match (self.locate(id).await, self.config.interface_version) {
            (Some(scope), _) => scope,
            // Listed under no pool: it does not exist. v0.1.0 needs no
            // pool, so it is asked anyway (a create that never returned
            // may have left it unlisted).
            (None, InterfaceVersion::V011) => {
                self.release_slot_of(id);
                return Ok(());
            }
            (None, InterfaceVersion::V010) => Scope {
                controller_id: self.config.controller_id.clone(),
                pool_id: None,
                pool: None,
                proven: false,
            },
        };
        match self
            .call(Command::DeleteInstance, &scope, Some(&id.0), None)
            .await
        {
            Ok(_) => {}
            Err(error) if error.code() == Some(EXIT_NOT_FOUND) => {}
            Err(error) => return Err(error.into()),
        }
        self.forget(id);
        self.release_slot_of(id);
        if let Ok(mut launched) = self.launched.lock() {
            launched.remove(&id.0);
        }
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_sub(1))
            })
            .ok();
        Ok(())
    }

    async fn start(
        &self,
        id: &InstanceId,
        fresh: Option<&CreateRequest>,
    ) -> Result<(), ProviderError> {
        // GARM's StartInstance carries nothing: a stock runner's machine
        // reads its credential from runway's instance API, armed before
        // this call (`start_reads_instance_api`).
        let _ = fresh;
        self.power(Command::StartInstance, id).await
    }

    async fn stop(&self, id: &InstanceId) -> Result<(), ProviderError> {
        self.power(Command::StopInstance, id).await
    }

    async fn list(&self) -> Result<Vec<Instance>, ProviderError> {
        let mut instances: Vec<Instance> = Vec::new();
        let mut unproven = std::collections::BTreeSet::new();
        let mut legacy_found = false;
        for scope in self.list_scopes() {
            let found = self.list_scope(&scope).await?;
            if scope.proven {
                instances.extend(found);
                continue;
            }
            legacy_found |= !found.is_empty();
            for instance in found {
                // One instance under two scopes is listed once, as proven.
                if !instances.iter().any(|i| i.id == instance.id) {
                    unproven.insert(instance.id.clone());
                    instances.push(instance);
                }
            }
        }
        self.unproven.replace(unproven);
        if !legacy_found {
            // Every legacy list came back empty: none is left to look after.
            self.legacy_left.store(false, Ordering::SeqCst);
        }
        // A launch the list does not show yet still counts, until the
        // list shows it or `list_lag` has passed since it returned.
        let unlisted = self
            .launched
            .lock()
            .map(|mut launched| {
                launched.retain(|id, at| {
                    at.elapsed() < self.config.list_lag && !instances.iter().any(|i| &i.id.0 == id)
                });
                launched.len()
            })
            .unwrap_or(0);
        self.used
            .store((instances.len() + unlisted) as u32, Ordering::SeqCst);
        self.reserved.release_listed(&instances);
        Ok(instances)
    }

    fn proven_own(&self, id: &InstanceId) -> bool {
        self.unproven.proves(id)
    }

    fn reserve(&self, name: &str) -> Result<(), ProviderError> {
        self.reserved.reserve(
            &self.config.name,
            name,
            self.used.load(Ordering::SeqCst),
            self.config.max_instances,
        )
    }

    fn unreserve(&self, name: &str) {
        self.unreserve_slot(name);
    }

    fn bid(&self, pool: &str, capacity: u32) -> Vec<Offer> {
        if !self.config.pools.iter().any(|p| p == pool) {
            return Vec::new();
        }
        crate::quota_offer(
            &self.config.name,
            self.config.max_instances,
            self.used.load(Ordering::SeqCst) + self.reserved.held(),
            capacity,
            self.config.price_per_hour,
            self.config.boot_time,
            1.0,
        )
    }
}
