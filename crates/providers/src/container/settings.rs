//! What a container is launched with: the image pull policy, mounts and the
//! launch settings a worker configuration may set, with their checks.

use super::*;

/// When the image is pulled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Pull {
    /// Only when the engine does not have it.
    #[default]
    Missing,
    /// Before every container (a moving tag).
    Always,
    /// Never: a missing image is a configuration error.
    Never,
}

/// A host path mounted into every container, or one a worker
/// configuration may ask for (`allowed_mounts`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mount {
    pub source: PathBuf,
    pub target: String,
    /// Read-only unless said.
    #[serde(default = "yes")]
    pub read_only: bool,
}

pub(super) fn yes() -> bool {
    true
}

/// What the worker configuration may set, under `container`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LaunchSettings {
    pub image: Option<String>,
    pub cpus: Option<f64>,
    pub memory_mb: Option<u64>,
    pub pids_limit: Option<i64>,
    #[serde(default)]
    pub mounts: Vec<Mount>,
    #[serde(default)]
    pub capabilities: Vec<String>,
}

impl LaunchSettings {
    /// The `container` object of a launch configuration (absent: none).
    pub fn of(launch_config: &Value) -> Result<LaunchSettings, String> {
        match launch_config.get("container") {
            None | Some(Value::Null) => Ok(LaunchSettings::default()),
            Some(value) => {
                serde_json::from_value(value.clone()).map_err(|e| format!("container: {e}"))
            }
        }
    }
}

/// Whether a worker configuration may mount the host path `source`: an
/// absolute path with no `..` (which the engine would resolve out of an
/// allowed directory), under one of `allowed`.
pub(super) fn mount_allowed(source: &Path, allowed: &[PathBuf]) -> bool {
    source.is_absolute()
        && !source
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
        && allowed.iter().any(|a| source.starts_with(a))
}

/// What a worker-configuration rule may say under `container`, checked
/// when the configuration is written (`runway config check`, `serve`, a
/// PUT), naming the key and the value: its shape, and that every mount is
/// under this provider's `allowed_mounts` and every capability in its
/// `allowed_capabilities`. Launch checks the merged result again.
pub fn check_rule_values(
    values: &Value,
    allowed_mounts: &[PathBuf],
    allowed_capabilities: &[String],
) -> Result<(), String> {
    let settings = LaunchSettings::of(values)?;
    for mount in &settings.mounts {
        if !mount_allowed(&mount.source, allowed_mounts) {
            return Err(format!(
                "container.mounts: {} is not under allowed_mounts {:?}",
                mount.source.display(),
                allowed_mounts
            ));
        }
    }
    for capability in &settings.capabilities {
        if !allowed_capabilities.contains(capability) {
            return Err(format!(
                "container.capabilities: {capability} is not in allowed_capabilities {allowed_capabilities:?}"
            ));
        }
    }
    Ok(())
}
