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

/// What a worker-configuration rule may say under `container` (checked
/// when the configuration is written, naming the key).
pub fn check_rule_values(values: &Value) -> Result<(), String> {
    LaunchSettings::of(values).map(|_| ())
}
