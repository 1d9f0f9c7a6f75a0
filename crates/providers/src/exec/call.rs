//! One call of the external executable: the command and its `GARM_*`
//! environment, the clean environment, the timeout that kills it, and reading
//! its answer (exit codes, JSON, `provider_fault`).

use super::*;

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
    pub(super) fn changes_instances(self) -> bool {
        !matches!(self, Command::GetInstance | Command::ListInstances)
    }

    /// Whether interface `version` sends this command the pool's id.
    pub(super) fn takes_pool(self, version: InterfaceVersion) -> bool {
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

/// How one call went wrong.
#[derive(Debug)]
pub(super) enum CallError {
    /// It exited with `code` (30 not found, 31 duplicate, …).
    Exit {
        code: i32,
        error: ProviderError,
    },
    Other(ProviderError),
}

impl CallError {
    pub(super) fn code(&self) -> Option<i32> {
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

/// The most of the executable's standard error quoted in an error.
pub(super) const STDERR_TAIL: usize = 512;

/// GARM's instance statuses, as runway reads them. GARM itself accepts only
/// the first four from a provider; the rest are read leniently.
pub(super) fn instance_state(status: &str) -> InstanceState {
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

/// A `provider_fault` as text: Go encodes bytes as base64 in JSON.
pub(super) fn fault_text(value: &Value) -> Option<String> {
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

pub(super) fn short(text: &str) -> String {
    let mut cut: String = text.chars().take(200).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    cut
}

impl ExecProvider {
    /// Runs one operation: the executable with GARM's environment for
    /// `scope`, `stdin` written to it, its standard output returned.
    pub(super) async fn call(
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

    pub(super) fn parse_instance(
        &self,
        operation: Command,
        value: &Value,
    ) -> Result<Instance, ProviderError> {
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

    pub(super) fn parse_json(
        &self,
        operation: Command,
        stdout: &[u8],
    ) -> Result<Value, ProviderError> {
        serde_json::from_slice(stdout).map_err(|e| {
            self.error(format!(
                "{} printed something that is not JSON ({e}): {}",
                operation.as_str(),
                short(&String::from_utf8_lossy(stdout))
            ))
        })
    }
}
