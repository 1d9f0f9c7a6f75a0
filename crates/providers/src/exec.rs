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

/// The versions of GARM's external provider interface runway speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InterfaceVersion {
    V010,
    #[default]
    V011,
}

impl InterfaceVersion {
    pub const NAMES: [&'static str; 2] = ["v0.1.0", "v0.1.1"];

    pub fn as_str(self) -> &'static str {
        match self {
            InterfaceVersion::V010 => "v0.1.0",
            InterfaceVersion::V011 => "v0.1.1",
        }
    }
}

impl std::fmt::Display for InterfaceVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for InterfaceVersion {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "v0.1.0" => Ok(InterfaceVersion::V010),
            "v0.1.1" => Ok(InterfaceVersion::V011),
            other => Err(format!(
                "unknown GARM interface version {other:?} (one of {})",
                InterfaceVersion::NAMES.join(", ")
            )),
        }
    }
}

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

/// The GARM operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    CreateInstance,
    DeleteInstance,
    GetInstance,
    ListInstances,
    RemoveAllInstances,
    StartInstance,
    StopInstance,
}

impl Command {
    pub fn as_str(self) -> &'static str {
        match self {
            Command::CreateInstance => "CreateInstance",
            Command::DeleteInstance => "DeleteInstance",
            Command::GetInstance => "GetInstance",
            Command::ListInstances => "ListInstances",
            Command::RemoveAllInstances => "RemoveAllInstances",
            Command::StartInstance => "StartInstance",
            Command::StopInstance => "StopInstance",
        }
    }

    /// Whether the command changes instances (the fence is asked first).
    fn changes_instances(self) -> bool {
        !matches!(self, Command::GetInstance | Command::ListInstances)
    }

    /// Whether interface `version` sends this command the pool's id.
    fn takes_pool(self, version: InterfaceVersion) -> bool {
        match version {
            InterfaceVersion::V010 => {
                matches!(self, Command::CreateInstance | Command::ListInstances)
            }
            InterfaceVersion::V011 => true,
        }
    }
}

/// GARM's exit code for "not found".
pub const EXIT_NOT_FOUND: i32 = 30;
/// GARM's exit code for "duplicate".
pub const EXIT_DUPLICATE: i32 = 31;

/// The `GARM_POOL_ID` runway pool `pool` had under `controller_id` before
/// pool ids named their provider: a UUID (version 5) of the pool's name in
/// the controller's namespace. Instances under it are listed unproven.
pub fn pool_id(controller_id: &str, pool: &str) -> String {
    uuid::Uuid::new_v5(&controller_namespace(controller_id), pool.as_bytes()).to_string()
}

/// The `GARM_POOL_ID` of runway pool `pool` served by provider `provider`
/// under `controller_id`: a UUID (version 5) of `provider/pool` in the
/// controller's namespace, the same on every replica and after every
/// restart, and another for each provider (GARM's pools belong to one).
pub fn provider_pool_id(controller_id: &str, provider: &str, pool: &str) -> String {
    let key = format!("{provider}/{pool}");
    uuid::Uuid::new_v5(&controller_namespace(controller_id), key.as_bytes()).to_string()
}

fn controller_namespace(controller_id: &str) -> uuid::Uuid {
    uuid::Uuid::parse_str(controller_id).unwrap_or_else(|_| {
        uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, controller_id.as_bytes())
    })
}

/// Under which ids an instance lives at the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Scope {
    controller_id: String,
    /// `GARM_POOL_ID`.
    pool_id: Option<String>,
    /// The runway pool, for its extra specs.
    pool: Option<String>,
    /// Whether its ids name this provider: instances listed under an
    /// older scope may be another provider's too.
    proven: bool,
}

/// How one call went wrong.
#[derive(Debug)]
enum CallError {
    /// It exited with `code` (30 not found, 31 duplicate, …).
    Exit {
        code: i32,
        error: ProviderError,
    },
    Other(ProviderError),
}

impl CallError {
    fn code(&self) -> Option<i32> {
        match self {
            CallError::Exit { code, .. } => Some(*code),
            CallError::Other(_) => None,
        }
    }
}

impl From<CallError> for ProviderError {
    fn from(error: CallError) -> ProviderError {
        match error {
            CallError::Exit { error, .. } | CallError::Other(error) => error,
        }
    }
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
    unproven: Mutex<std::collections::BTreeSet<InstanceId>>,
}

/// The most of the executable's standard error quoted in an error.
const STDERR_TAIL: usize = 512;

/// GARM's instance statuses, as runway reads them. GARM itself accepts only
/// the first four from a provider; the rest are read leniently.
fn instance_state(status: &str) -> InstanceState {
    match status {
        "running" => InstanceState::Running,
        "stopped" => InstanceState::Stopped,
        "error" | "deleting" | "deleted" | "pending_delete" | "pending_force_delete" => {
            InstanceState::Failed
        }
        "pending_create" | "creating" => InstanceState::Pending,
        // "unknown", and anything GARM does not define.
        _ => InstanceState::Unknown,
    }
}

/// Launch-configuration keys that become bootstrap fields, not extra specs.
const BOOTSTRAP_KEYS: [&str; 9] = [
    "os_type",
    "arch",
    "flavor",
    "image",
    "ssh_keys",
    "user_data_options",
    "proxy_config",
    "ca_cert_bundle",
    "github_runner_group",
];

/// A pool's GARM extra specs from its launch configuration: its
/// `extra_specs` object when it has one, else the launch configuration
/// without the keys that become bootstrap fields (providers such as
/// garm-provider-lxd refuse extra specs they do not know).
pub fn extra_specs(launch: &Value) -> Value {
    if let Some(specs) = launch.get("extra_specs").filter(|v| v.is_object()) {
        return specs.clone();
    }
    match launch {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(key, _)| !BOOTSTRAP_KEYS.contains(&key.as_str()))
                .map(|(key, value)| (key.clone(), value.clone()))
                .collect(),
        ),
        _ => json!({}),
    }
}

/// A `provider_fault` as text: Go encodes bytes as base64 in JSON.
fn fault_text(value: &Value) -> Option<String> {
    let raw = value.get("provider_fault").and_then(Value::as_str)?;
    if raw.is_empty() {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(raw)
        .ok()
        .and_then(|bytes| String::from_utf8(bytes).ok());
    Some(decoded.unwrap_or_else(|| raw.to_owned()))
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
            unproven: Mutex::new(std::collections::BTreeSet::new()),
        }
    }

    fn error(&self, message: String) -> ProviderError {
        ProviderError::Transient {
            provider: self.config.name.clone(),
            message,
        }
    }

    /// The current scope of runway pool `pool`.
    fn pool_scope(&self, pool: &str) -> Scope {
        Scope {
            controller_id: self.config.controller_id.clone(),
            pool_id: Some(provider_pool_id(
                &self.config.controller_id,
                &self.config.name,
                pool,
            )),
            pool: Some(pool.to_owned()),
            proven: true,
        }
    }

    /// The scopes `list` asks: each pool's, and its older ones while
    /// instances may be left there.
    fn list_scopes(&self) -> Vec<Scope> {
        let mut scopes: Vec<Scope> = self
            .config
            .pools
            .iter()
            .map(|p| self.pool_scope(p))
            .collect();
        if !self.legacy_left.load(Ordering::SeqCst) {
            return scopes;
        }
        scopes.extend(self.config.pools.iter().map(|p| Scope {
            controller_id: self.config.controller_id.clone(),
            pool_id: Some(pool_id(&self.config.controller_id, p)),
            pool: Some(p.clone()),
            proven: false,
        }));
        if let Some(legacy) = &self.config.legacy_controller_id {
            scopes.extend(self.config.pools.iter().map(|p| Scope {
                controller_id: legacy.clone(),
                pool_id: Some(p.clone()),
                pool: Some(p.clone()),
                proven: false,
            }));
        }
        scopes
    }

    /// Where `id` lives, if it was seen; after a fresh list if not.
    async fn locate(&self, id: &InstanceId) -> Option<Scope> {
        let known = |this: &Self| this.located.lock().ok().and_then(|l| l.get(id).cloned());
        if let Some(scope) = known(self) {
            return Some(scope);
        }
        let _ = self.list().await;
        known(self)
    }

    fn remember(&self, id: &InstanceId, scope: &Scope) {
        if let Ok(mut located) = self.located.lock() {
            located.insert(id.clone(), scope.clone());
        }
    }

    fn forget(&self, id: &InstanceId) {
        if let Ok(mut located) = self.located.lock() {
            located.remove(id);
        }
        if let Ok(mut created) = self.created.lock() {
            created.retain(|_, known| known != id);
        }
    }

    /// Runs one operation: the executable with GARM's environment for
    /// `scope`, `stdin` written to it, its standard output returned.
    async fn call(
        &self,
        operation: Command,
        scope: &Scope,
        instance: Option<&str>,
        stdin: Option<&[u8]>,
    ) -> Result<Vec<u8>, CallError> {
        let config_file = self
            .config
            .config_file
            .clone()
            .unwrap_or_else(|| PathBuf::from("/dev/null"));
        let version = self.config.interface_version;
        let mut own: Vec<(&str, std::ffi::OsString)> = vec![
            ("GARM_COMMAND", operation.as_str().into()),
            ("GARM_INTERFACE_VERSION", version.as_str().into()),
            ("GARM_PROVIDER_CONFIG_FILE", config_file.into_os_string()),
            ("GARM_CONTROLLER_ID", scope.controller_id.clone().into()),
        ];
        if operation.takes_pool(version) {
            if let Some(pool_id) = &scope.pool_id {
                own.push(("GARM_POOL_ID", pool_id.clone().into()));
            }
        }
        if version == InterfaceVersion::V011 {
            let specs = scope
                .pool
                .as_ref()
                .and_then(|pool| self.extra_specs.lock().ok()?.get(pool).cloned())
                .unwrap_or_else(|| json!({}));
            let encoded = base64::engine::general_purpose::STANDARD.encode(specs.to_string());
            own.push(("GARM_POOL_EXTRASPECS", encoded.into()));
        }
        if let Some(instance) = instance {
            own.push(("GARM_INSTANCE_ID", instance.into()));
        }
        if operation.changes_instances() {
            if let Err(why) = (self.fence)() {
                return Err(CallError::Other(ProviderError::Transient {
                    provider: self.config.name.clone(),
                    message: format!("{} not made: {why}", operation.as_str()),
                }));
            }
        }
        let mut command = tokio::process::Command::new(&self.config.executable);
        // As GARM does: a clean environment, never runway's own (its
        // secrets must not reach a third-party executable).
        crate::environment::set_clean(&mut command, &self.config.environment_variables, own);
        command
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(|e| {
            CallError::Other(ProviderError::Permanent {
                provider: self.config.name.clone(),
                message: format!("cannot run {}: {e}", self.config.executable.display()),
            })
        })?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            // A provider that does not read its input is not an error.
            let _ = pipe.write_all(input).await;
            drop(pipe);
        }
        let output = match tokio::time::timeout(self.config.timeout, child.wait_with_output()).await
        {
            Ok(Ok(output)) => output,
            Ok(Err(e)) => {
                return Err(CallError::Other(
                    self.error(format!("{}: {e}", operation.as_str())),
                ))
            }
            // Dropping the future kills the child (kill_on_drop). What it
            // did before is unknown: a create may have made its instance.
            Err(_) => {
                return Err(CallError::Other(ProviderError::in_doubt(
                    &self.config.name,
                    format!(
                        "{} did not finish within {:?}",
                        operation.as_str(),
                        self.config.timeout
                    ),
                )))
            }
        };
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let trimmed = stderr.trim();
            let tail = if trimmed.len() > STDERR_TAIL {
                let mut start = trimmed.len() - STDERR_TAIL;
                while !trimmed.is_char_boundary(start) {
                    start += 1;
                }
                &trimmed[start..]
            } else {
                trimmed
            };
            let error = self.error(format!(
                "{} failed ({}): {}",
                operation.as_str(),
                output.status,
                if tail.is_empty() {
                    "no message on standard error"
                } else {
                    tail
                }
            ));
            return Err(match output.status.code() {
                Some(code) => CallError::Exit { code, error },
                None => CallError::Other(error),
            });
        }
        Ok(output.stdout)
    }

    fn parse_instance(&self, operation: Command, value: &Value) -> Result<Instance, ProviderError> {
        let field = |name: &str| value.get(name).and_then(Value::as_str).unwrap_or_default();
        let id = field("provider_id");
        let name = field("name");
        if id.is_empty() || name.is_empty() {
            return Err(self.error(format!(
                "{} printed an instance without provider_id or name: {}",
                operation.as_str(),
                short(&value.to_string())
            )));
        }
        Ok(Instance {
            id: InstanceId(id.to_owned()),
            name: name.to_owned(),
            state: instance_state(field("status")),
        })
    }

    fn parse_json(&self, operation: Command, stdout: &[u8]) -> Result<Value, ProviderError> {
        serde_json::from_slice(stdout).map_err(|e| {
            self.error(format!(
                "{} printed something that is not JSON ({e}): {}",
                operation.as_str(),
                short(&String::from_utf8_lossy(stdout))
            ))
        })
    }

    /// The bootstrap document `CreateInstance` reads on standard input:
    /// GARM's `BootstrapInstance`, plus `runway_environment`.
    pub fn bootstrap(&self, request: &CreateRequest) -> Value {
        let env = |key: &str| request.bootstrap.get(key).cloned().unwrap_or_default();
        let mut environment = request.bootstrap.clone();
        environment.insert("RUNWAY_RUNNER_NAME".into(), request.name.clone());
        environment.insert("RUNWAY_POOL".into(), request.pool.clone());
        environment.insert("RUNWAY_RUNNER_LABELS".into(), request.labels.join(","));
        let launch = &request.launch_config;
        let text = |key: &str, default: &str| {
            launch
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or(default)
                .to_owned()
        };
        let pool_id = pool_id(&self.config.controller_id, &request.pool);
        let jit = request.bootstrap.contains_key("RUNWAY_JIT_CONFIG");
        let mut labels = request.labels.clone();
        if !jit {
            // As GARM does for a runner without a JIT configuration.
            labels.push(format!(
                "runner-controller-id={}",
                self.config.controller_id
            ));
            labels.push(format!("runner-pool-id={pool_id}"));
        }
        // Go decodes []byte from base64.
        let ca_bundle = launch
            .get("ca_cert_bundle")
            .and_then(Value::as_str)
            .map(|pem| base64::engine::general_purpose::STANDARD.encode(pem));
        let object = |key: &str| launch.get(key).filter(|v| v.is_object()).cloned();
        // The instance API, when runway serves it: as GARM does, the pool's
        // extra specs carry a runner_install_template (base64, as Go
        // encodes bytes) that fetches the install script, unless the
        // launch configuration brings its own.
        let mut extra_specs = extra_specs(launch);
        let (metadata_url, callback_url, instance_token, tools, repo_url) = match &request
            .instance_api
        {
            Some(api) => {
                if let Some(specs) = extra_specs.as_object_mut() {
                    specs.entry("runner_install_template").or_insert_with(|| {
                        Value::String(
                            base64::engine::general_purpose::STANDARD.encode(&api.install_wrapper),
                        )
                    });
                }
                (
                    api.metadata_url.clone(),
                    api.callback_url.clone(),
                    api.token.clone(),
                    api.tools.clone(),
                    api.repo_url.clone(),
                )
            }
            None => (
                env("RUNWAY_URL"),
                env("RUNWAY_URL"),
                env("RUNWAY_REGISTRATION_TOKEN"),
                Vec::new(),
                String::new(),
            ),
        };
        json!({
            "name": request.name,
            "tools": tools,
            "repo_url": repo_url,
            "callback-url": callback_url,
            "metadata-url": metadata_url,
            "instance-token": instance_token,
            "ssh-keys": launch.get("ssh_keys").filter(|v| v.is_array()).cloned().unwrap_or(json!([])),
            "extra_specs": extra_specs,
            "ca-cert-bundle": ca_bundle,
            "github-runner-group": text("github_runner_group", ""),
            "os_type": text("os_type", "linux"),
            "arch": text("arch", "amd64"),
            "flavor": text("flavor", ""),
            "image": text("image", ""),
            "labels": labels,
            "pool_id": pool_id,
            "user_data_options": object("user_data_options").unwrap_or(json!({
                "disable_updates_on_boot": false,
                "extra_packages": [],
                "enable_boot_debug": false,
            })),
            "proxy_config": object("proxy_config").unwrap_or(json!({
                "http_proxy": "",
                "https_proxy": "",
                "no_proxy": "",
            })),
            // GARM's flag for a runner that starts from a JIT configuration
            // (here: runway_environment.RUNWAY_JIT_CONFIG).
            "jit_config_enabled": jit,
            "runway_environment": environment,
        })
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

    pub async fn stop(&self, id: &InstanceId) -> Result<(), ProviderError> {
        let Some(scope) = self.locate(id).await else {
            return Err(self.error(format!("StopInstance: no instance {id}")));
        };
        self.call(Command::StopInstance, &scope, Some(&id.0), None)
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
}

fn short(text: &str) -> String {
    let mut cut: String = text.chars().take(200).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    cut
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
            (None, InterfaceVersion::V011) => return Ok(()),
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

    async fn start(&self, id: &InstanceId) -> Result<(), ProviderError> {
        let Some(scope) = self.locate(id).await else {
            return Err(self.error(format!("StartInstance: no instance {id}")));
        };
        self.call(Command::StartInstance, &scope, Some(&id.0), None)
            .await
            .map(drop)
            .map_err(Into::into)
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
        if let Ok(mut kept) = self.unproven.lock() {
            *kept = unproven;
        }
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
        Ok(instances)
    }

    fn proven_own(&self, id: &InstanceId) -> bool {
        self.unproven
            .lock()
            .map(|unproven| !unproven.contains(id))
            .unwrap_or(false)
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
