//! The `exec` provider: an external executable driven exactly as GARM
//! drives its external providers (cloudbase/garm `doc/external_provider.md`),
//! so the providers written for GARM (LXD, OpenStack, AWS, Azure, GCP,
//! Kubernetes, …) can start runway's runners.
//!
//! Each call runs the executable once with `GARM_COMMAND` (`CreateInstance`,
//! `DeleteInstance`, `GetInstance`, `ListInstances`, `RemoveAllInstances`,
//! `Start`, `Stop`), `GARM_PROVIDER_CONFIG_FILE` and `GARM_CONTROLLER_ID`
//! always set, `GARM_POOL_ID` for `CreateInstance` and `ListInstances`, and
//! `GARM_INSTANCE_ID` for the calls about one instance. `CreateInstance`
//! reads the bootstrap parameters as JSON on standard input and prints the
//! instance as JSON; `GetInstance` prints one instance and `ListInstances`
//! an array. The executable runs in a clean environment, as under GARM:
//! only the base of [`crate::environment`], the host variables
//! `environment_variables` names, and the `GARM_*` variables of the call.
//! A non-zero exit is a failure, with the end of standard error as
//! its message. Every call has a timeout; a call that overruns is killed.
//!
//! runway's pool *name* is the `GARM_POOL_ID`. The bootstrap document
//! carries GARM's fields (`name`, `labels`, `pool_id`, `callback-url`,
//! `instance-token`, `extra_specs`, …) and, in `runway_environment`, the
//! variables a runway runner boots with (`RUNWAY_URL`,
//! `RUNWAY_REGISTRATION_TOKEN`, `RUNWAY_RUNNER_NAME`, …).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
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
    /// The pools whose instances `list` asks for (`GARM_POOL_ID` each).
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
    pub controller_id: String,
}

/// The GARM operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    CreateInstance,
    DeleteInstance,
    GetInstance,
    ListInstances,
    RemoveAllInstances,
    Start,
    Stop,
}

impl Command {
    pub fn as_str(self) -> &'static str {
        match self {
            Command::CreateInstance => "CreateInstance",
            Command::DeleteInstance => "DeleteInstance",
            Command::GetInstance => "GetInstance",
            Command::ListInstances => "ListInstances",
            Command::RemoveAllInstances => "RemoveAllInstances",
            Command::Start => "Start",
            Command::Stop => "Stop",
        }
    }
}

pub struct ExecProvider {
    config: ExecConfig,
    used: AtomicU32,
    /// Instances created by this process, by name: a retried create finds
    /// the first even when the executable itself is not idempotent.
    created: Mutex<BTreeMap<String, InstanceId>>,
    creating: tokio::sync::Mutex<()>,
}

/// The most of the executable's standard error quoted in an error.
const STDERR_TAIL: usize = 512;

/// GARM's instance statuses, as runway reads them.
fn instance_state(status: &str) -> InstanceState {
    match status {
        "running" | "active" => InstanceState::Running,
        "pending_create" | "creating" | "pending" | "pending_start" | "starting" => {
            InstanceState::Pending
        }
        // stopped, error, deleting, deleted, unknown, …
        _ => InstanceState::Stopped,
    }
}

impl ExecProvider {
    pub fn new(config: ExecConfig) -> ExecProvider {
        ExecProvider {
            config,
            used: AtomicU32::new(0),
            created: Mutex::new(BTreeMap::new()),
            creating: tokio::sync::Mutex::new(()),
        }
    }

    fn error(&self, message: String) -> ProviderError {
        ProviderError::Transient {
            provider: self.config.name.clone(),
            message,
        }
    }

    /// Runs one operation: the executable with GARM's environment, `stdin`
    /// written to it, its standard output returned.
    pub async fn call(
        &self,
        operation: Command,
        pool: Option<&str>,
        instance: Option<&str>,
        stdin: Option<&[u8]>,
    ) -> Result<Vec<u8>, ProviderError> {
        let config_file = self
            .config
            .config_file
            .clone()
            .unwrap_or_else(|| PathBuf::from("/dev/null"));
        let mut command = tokio::process::Command::new(&self.config.executable);
        // As GARM does: a clean environment, never runway's own (its
        // secrets must not reach a third-party executable).
        crate::environment::set_clean(
            &mut command,
            &self.config.environment_variables,
            [
                ("GARM_COMMAND", std::ffi::OsString::from(operation.as_str())),
                ("GARM_PROVIDER_CONFIG_FILE", config_file.into_os_string()),
                (
                    "GARM_CONTROLLER_ID",
                    std::ffi::OsString::from(&self.config.controller_id),
                ),
            ],
        );
        command
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(pool) = pool {
            command.env("GARM_POOL_ID", pool);
        }
        if let Some(instance) = instance {
            command.env("GARM_INSTANCE_ID", instance);
        }
        let mut child = command.spawn().map_err(|e| ProviderError::Permanent {
            provider: self.config.name.clone(),
            message: format!("cannot run {}: {e}", self.config.executable.display()),
        })?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            // A provider that does not read its input is not an error.
            let _ = pipe.write_all(input).await;
            drop(pipe);
        }
        let output = match tokio::time::timeout(self.config.timeout, child.wait_with_output()).await
        {
            Ok(Ok(output)) => output,
            Ok(Err(e)) => return Err(self.error(format!("{}: {e}", operation.as_str()))),
            // Dropping the future kills the child (kill_on_drop).
            Err(_) => {
                return Err(self.error(format!(
                    "{} did not finish within {:?}",
                    operation.as_str(),
                    self.config.timeout
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
            return Err(self.error(format!(
                "{} failed ({}): {}",
                operation.as_str(),
                output.status,
                if tail.is_empty() {
                    "no message on standard error"
                } else {
                    tail
                }
            )));
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

    /// The bootstrap document `CreateInstance` reads on standard input.
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
        json!({
            "name": request.name,
            "tools": [],
            "repo_url": "",
            "callback-url": env("RUNWAY_URL"),
            "metadata-url": env("RUNWAY_URL"),
            "instance-token": env("RUNWAY_REGISTRATION_TOKEN"),
            "extra_specs": launch,
            "ca-cert-bundle": null,
            "github-runner-group": "",
            "os_type": text("os_type", "linux"),
            "arch": text("arch", "amd64"),
            "flavor": text("flavor", ""),
            "image": text("image", ""),
            "labels": request.labels,
            "pool_id": request.pool,
            // GARM's flag for a runner that starts from a JIT configuration
            // (here: runway_environment.RUNWAY_JIT_CONFIG).
            "jit_config_enabled": request.bootstrap.contains_key("RUNWAY_JIT_CONFIG"),
            "runway_environment": environment,
        })
    }

    /// Deletes every instance tagged with this installation's controller id.
    pub async fn remove_all(&self) -> Result<(), ProviderError> {
        self.call(Command::RemoveAllInstances, None, None, None)
            .await?;
        if let Ok(mut created) = self.created.lock() {
            created.clear();
        }
        Ok(())
    }

    pub async fn get(&self, id: &InstanceId) -> Result<Instance, ProviderError> {
        let stdout = self
            .call(Command::GetInstance, None, Some(&id.0), None)
            .await?;
        let value = self.parse_json(Command::GetInstance, &stdout)?;
        self.parse_instance(Command::GetInstance, &value)
    }

    pub async fn start(&self, id: &InstanceId) -> Result<(), ProviderError> {
        self.call(Command::Start, None, Some(&id.0), None)
            .await
            .map(drop)
    }

    pub async fn stop(&self, id: &InstanceId) -> Result<(), ProviderError> {
        self.call(Command::Stop, None, Some(&id.0), None)
            .await
            .map(drop)
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

    async fn create(&self, request: &CreateRequest) -> Result<Instance, ProviderError> {
        let _one_at_a_time = self.creating.lock().await;
        let known = self
            .created
            .lock()
            .ok()
            .and_then(|created| created.get(&request.name).cloned());
        if let Some(id) = known {
            if let Ok(instance) = self.get(&id).await {
                return Ok(instance);
            }
        }
        let used = self.list().await?.len() as u32;
        if used >= self.config.max_instances {
            return Err(ProviderError::Quota {
                provider: self.config.name.clone(),
                limit: self.config.max_instances,
            });
        }
        let input = self.bootstrap(request).to_string();
        let stdout = match self
            .call(
                Command::CreateInstance,
                Some(&request.pool),
                None,
                Some(input.as_bytes()),
            )
            .await
        {
            Ok(stdout) => stdout,
            Err(error) => {
                // GARM's contract: clean up a failed create by name.
                let _ = self
                    .call(Command::DeleteInstance, None, Some(&request.name), None)
                    .await;
                return Err(error);
            }
        };
        let value = self.parse_json(Command::CreateInstance, &stdout)?;
        if value.get("status").and_then(Value::as_str) == Some("error") {
            let fault = value
                .get("provider_fault")
                .and_then(Value::as_str)
                .unwrap_or("no provider_fault given");
            return Err(self.error(format!("CreateInstance reported an error: {fault}")));
        }
        let instance = self.parse_instance(Command::CreateInstance, &value)?;
        if let Ok(mut created) = self.created.lock() {
            created.insert(request.name.clone(), instance.id.clone());
        }
        self.used.store(used + 1, Ordering::SeqCst);
        Ok(instance)
    }

    async fn delete(&self, id: &InstanceId) -> Result<(), ProviderError> {
        self.call(Command::DeleteInstance, None, Some(&id.0), None)
            .await?;
        if let Ok(mut created) = self.created.lock() {
            created.retain(|_, known| known != id);
        }
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_sub(1))
            })
            .ok();
        Ok(())
    }

    async fn list(&self) -> Result<Vec<Instance>, ProviderError> {
        let mut instances = Vec::new();
        for pool in &self.config.pools {
            let stdout = self
                .call(Command::ListInstances, Some(pool), None, None)
                .await?;
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
            for item in &items {
                instances.push(self.parse_instance(Command::ListInstances, item)?);
            }
        }
        self.used.store(instances.len() as u32, Ordering::SeqCst);
        Ok(instances)
    }

    fn bid(&self, pool: &str, capacity: u32) -> Vec<Offer> {
        if !self.config.pools.iter().any(|p| p == pool) {
            return Vec::new();
        }
        crate::quota_offer(
            &self.config.name,
            self.config.max_instances,
            self.used.load(Ordering::SeqCst),
            capacity,
            self.config.price_per_hour,
            self.config.boot_time,
            1.0,
        )
    }
}
