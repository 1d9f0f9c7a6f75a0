//! Builds a provider from its typed declaration: one place that knows every
//! kind, so the server declares providers as data and a new kind (a cloud
//! API, say) is one more variant here, not a branch in the reconciler.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::container::{ContainerConfig, ContainerProvider, Mount, Pull};
use crate::ec2::{Ec2Config, Ec2Provider, Purchase};
use crate::exec::{ExecConfig, ExecProvider, InterfaceVersion};
use crate::process::{ProcessConfig, ProcessProvider};
use crate::sim::{BootTime, SimConfig, SimProvider};
use crate::{settings, Clock, Provider};
use serde::{Deserialize, Serialize};

/// A provider's kind, with the settings only that kind has: in the config
/// file, `kind = "sim" | "process" | "exec"` and that kind's keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum ProviderKind {
    /// A simulated cloud (seeded): boots in `boot_seconds`, fails creates
    /// at `fail_rate`.
    Sim {
        #[serde(default)]
        fail_rate: f64,
        #[serde(default)]
        seed: u64,
    },
    /// Each runner a local child process running `command` (a first
    /// element `runway` means this very binary), tracked in `state_dir`.
    Process {
        #[serde(default)]
        command: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        state_dir: Option<PathBuf>,
        /// Between SIGTERM and SIGKILL when a runner is deleted.
        #[serde(with = "settings::duration", default = "default_stop_grace")]
        stop_grace: Duration,
    },
    /// A GARM external provider executable, one call per operation.
    Exec {
        /// Empty when the file names none (validation refuses that).
        #[serde(default)]
        executable: PathBuf,
        /// Passed as `GARM_PROVIDER_CONFIG_FILE`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        config_file: Option<PathBuf>,
        /// The longest one call of the executable may take.
        #[serde(with = "settings::duration", default = "default_exec_timeout")]
        timeout: Duration,
        /// The GARM interface version the executable speaks.
        #[serde(with = "settings::text", default)]
        interface_version: InterfaceVersion,
    },
    /// Amazon EC2 through the AWS SDK: one offer per instance type, zone
    /// and purchase option, spot priced live (`ec2.rs`).
    Ec2 {
        /// Empty when the file names none (validation refuses that).
        #[serde(default)]
        region: String,
        /// Another endpoint than AWS's: an emulator, an EC2-compatible cloud.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        endpoint_url: Option<String>,
        /// A profile of the shared AWS config files; without it, the
        /// standard chain (environment, `AWS_PROFILE`, instance role).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        profile: Option<String>,
        #[serde(default)]
        instance_types: Vec<String>,
        /// Availability zones, e.g. `["us-east-1a", "us-east-1b"]`.
        #[serde(default)]
        zones: Vec<String>,
        #[serde(default = "default_purchase_options")]
        purchase_options: Vec<Purchase>,
        /// On-demand $/hour per instance type; others cost `price_per_hour`.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        on_demand_prices: BTreeMap<String, f64>,
        /// How often the spot prices are read again (one paged
        /// `DescribeSpotPriceHistory` per interval at most).
        #[serde(with = "settings::duration", default = "default_spot_price_refresh")]
        spot_price_refresh: Duration,
        /// What the machine runs with its bootstrap exported (default:
        /// GitHub's runner with its JIT config, or `runway agent --once`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        boot_command: Option<String>,
        /// What a stopped runner's machine runs on its first boot, before
        /// it powers off to wait stopped for a job (warming caches, say;
        /// default nothing). It gets no credential.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prepare_command: Option<String>,
        /// The disk a stopped instance keeps, in GB: with
        /// `volume_price_per_gb_month`, what a stopped runner costs an hour
        /// (unless `stopped_price_per_hour` says).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stopped_volume_gb: Option<f64>,
        /// EBS's $/GB-month (gp3 in us-east-1: 0.08).
        #[serde(default = "default_volume_price")]
        volume_price_per_gb_month: f64,
    },
    /// One fresh container per runner through the Docker Engine API
    /// (Docker, or Podman's compatible service): `container.rs`.
    Container {
        /// The engine's socket; default `DOCKER_HOST`, then Docker's and
        /// Podman's usual sockets.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        socket: Option<PathBuf>,
        /// The image, unless a worker configuration sets `container.image`.
        #[serde(default)]
        image: String,
        #[serde(default)]
        pull: Pull,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cpus: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        memory_mb: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        pids_limit: Option<i64>,
        /// `none`, `host` or a named network (`bridge`, the default).
        #[serde(default = "default_network")]
        network: String,
        #[serde(default)]
        read_only: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        mounts: Vec<Mount>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        allowed_mounts: Vec<PathBuf>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        capabilities: Vec<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        allowed_capabilities: Vec<String>,
        /// The shell command run once the bootstrap is read (default:
        /// `runway agent --once`, or GitHub's runner for a GitHub pool).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        command: Option<String>,
        /// Mount this runway's executable read-only at
        /// `/usr/local/bin/runway`.
        #[serde(default = "default_mount_runway")]
        mount_runway: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        state_dir: Option<PathBuf>,
        #[serde(with = "settings::duration", default = "default_stop_grace")]
        stop_grace: Duration,
    },
}

fn default_network() -> String {
    "bridge".to_owned()
}

fn default_mount_runway() -> bool {
    true
}

fn default_purchase_options() -> Vec<Purchase> {
    Purchase::ALL.to_vec()
}

/// EBS gp3's $/GB-month in us-east-1.
fn default_volume_price() -> f64 {
    0.08
}

fn default_spot_price_refresh() -> Duration {
    Duration::from_secs(300)
}

fn default_stop_grace() -> Duration {
    Duration::from_secs(10)
}

fn default_exec_timeout() -> Duration {
    Duration::from_secs(120)
}

impl ProviderKind {
    /// The names the config file uses for the kinds, in this order.
    pub const NAMES: [&'static str; 5] = ["sim", "process", "exec", "ec2", "container"];

    /// The kind called `name`, with that kind's defaults.
    pub fn named(name: &str) -> Option<ProviderKind> {
        Some(match name {
            "sim" => ProviderKind::Sim {
                fail_rate: 0.0,
                seed: 0,
            },
            "process" => ProviderKind::Process {
                command: Vec::new(),
                state_dir: None,
                stop_grace: default_stop_grace(),
            },
            "exec" => ProviderKind::Exec {
                executable: PathBuf::new(),
                config_file: None,
                timeout: default_exec_timeout(),
                interface_version: InterfaceVersion::default(),
            },
            "ec2" => ProviderKind::Ec2 {
                region: String::new(),
                endpoint_url: None,
                profile: None,
                instance_types: Vec::new(),
                zones: Vec::new(),
                purchase_options: default_purchase_options(),
                on_demand_prices: BTreeMap::new(),
                spot_price_refresh: default_spot_price_refresh(),
                boot_command: None,
                prepare_command: None,
                stopped_volume_gb: None,
                volume_price_per_gb_month: default_volume_price(),
            },
            "container" => ProviderKind::Container {
                socket: None,
                image: String::new(),
                pull: Pull::default(),
                cpus: None,
                memory_mb: None,
                pids_limit: None,
                network: default_network(),
                read_only: false,
                user: None,
                mounts: Vec::new(),
                allowed_mounts: Vec::new(),
                capabilities: Vec::new(),
                allowed_capabilities: Vec::new(),
                command: None,
                mount_runway: default_mount_runway(),
                state_dir: None,
                stop_grace: default_stop_grace(),
            },
            _ => return None,
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            ProviderKind::Sim { .. } => "sim",
            ProviderKind::Process { .. } => "process",
            ProviderKind::Exec { .. } => "exec",
            ProviderKind::Ec2 { .. } => "ec2",
            ProviderKind::Container { .. } => "container",
        }
    }

    /// Condition names this kind gives the worker-configuration rules
    /// besides `provider`, `pool` and `region` ([`crate::Provider::offer_inputs`]).
    pub fn implied_conditions(&self) -> &'static [&'static str] {
        match self {
            ProviderKind::Ec2 { .. } => &["availabilityZone", "instanceType", "purchaseOption"],
            _ => &[],
        }
    }

    /// Condition inputs each launch of this kind takes from its offer
    /// ([`crate::Provider::offer_inputs`]): a provider's config cannot set
    /// them (`inputs`).
    pub fn offer_input_names(&self) -> &'static [&'static str] {
        match self {
            ProviderKind::Ec2 { .. } => &[
                "region",
                "availabilityZone",
                "instanceType",
                "purchaseOption",
            ],
            _ => &[],
        }
    }

    /// Keys the evaluated worker configuration must have for this kind.
    pub fn implied_required_keys(&self) -> &'static [&'static str] {
        match self {
            ProviderKind::Ec2 { .. } => &["ec2.ImageId"],
            _ => &[],
        }
    }

    /// What this kind refuses in one worker-configuration rule's `values`
    /// (before rules are merged), naming the key: an `ec2` object with a
    /// key RunInstances settings do not have (`ec2.SecurityGroupId` for
    /// `SecurityGroupIds`) or a value of the wrong shape. Checked where the
    /// operator is — `runway config check`, `serve`'s start and reload, a
    /// PUT of a worker configuration — not when a job first needs a runner.
    pub fn check_rule_values(&self, values: &serde_json::Value) -> Result<(), String> {
        match self {
            ProviderKind::Ec2 { .. } => crate::ec2::check_rule_values(values),
            ProviderKind::Container {
                allowed_mounts,
                allowed_capabilities,
                ..
            } => crate::container::check_rule_values(values, allowed_mounts, allowed_capabilities),
            _ => Ok(()),
        }
    }

    /// What is wrong with this kind's own settings, as (key, message).
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if let ProviderKind::Container {
            cpus,
            memory_mb,
            pids_limit,
            network,
            mounts,
            capabilities,
            allowed_capabilities,
            ..
        } = self
        {
            if cpus.is_some_and(|c| !(c.is_finite() && c > 0.0)) {
                return Err((
                    "cpus",
                    "must be a number of CPUs above 0, e.g. 2 or 0.5".into(),
                ));
            }
            if *memory_mb == Some(0) {
                return Err(("memory_mb", "must be at least 1 (MiB)".into()));
            }
            if pids_limit.is_some_and(|p| p <= 0) {
                return Err(("pids_limit", "must be at least 1".into()));
            }
            if network.trim().is_empty() {
                return Err(("network", "must be none, host or a network's name".into()));
            }
            if let Some(mount) = mounts
                .iter()
                .find(|m| !m.source.is_absolute() || !m.target.starts_with('/'))
            {
                return Err((
                    "mounts",
                    format!(
                        "{} → {}: source and target must be absolute paths",
                        mount.source.display(),
                        mount.target
                    ),
                ));
            }
            if let Some(bad) = capabilities
                .iter()
                .chain(allowed_capabilities)
                .find(|c| c.is_empty() || !c.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
            {
                return Err((
                    "capabilities",
                    format!("{bad:?} is not a capability name such as CAP_NET_ADMIN"),
                ));
            }
        }
        if let ProviderKind::Ec2 {
            region,
            instance_types,
            zones,
            purchase_options,
            on_demand_prices,
            spot_price_refresh,
            ..
        } = self
        {
            if region.trim().is_empty() {
                return Err(("region", "is required (e.g. \"us-east-1\")".into()));
            }
            if instance_types.is_empty()
                || instance_types
                    .iter()
                    .any(|t| t.trim().is_empty() || t.contains('/'))
            {
                return Err((
                    "instance_types",
                    "must list at least one instance type, e.g. [\"m5.large\"]".into(),
                ));
            }
            if zones.is_empty() || zones.iter().any(|z| z.trim().is_empty() || z.contains('/')) {
                return Err((
                    "zones",
                    "must list at least one availability zone, e.g. [\"us-east-1a\"]".into(),
                ));
            }
            if purchase_options.is_empty() {
                return Err((
                    "purchase_options",
                    "must list spot, on-demand or both".into(),
                ));
            }
            if let Some((name, price)) = on_demand_prices
                .iter()
                .find(|(_, p)| !(p.is_finite() && **p >= 0.0))
            {
                return Err((
                    "on_demand_prices",
                    format!("{name}: {price} is not a price"),
                ));
            }
            if let Some(name) = on_demand_prices
                .keys()
                .find(|t| !instance_types.contains(t))
            {
                return Err((
                    "on_demand_prices",
                    format!("{name} is not in instance_types"),
                ));
            }
            if spot_price_refresh.is_zero() {
                return Err(("spot_price_refresh", "must be longer than 0s".into()));
            }
        }
        Ok(())
    }
}

/// Everything a provider is declared with.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderSpec {
    pub name: String,
    pub kind: ProviderKind,
    /// Most instances at once.
    pub max_instances: u32,
    pub price_per_hour: f64,
    /// Boot time, uniform between the two (equal for a fixed time).
    pub boot_seconds: (f64, f64),
    /// How long a created instance may be missing from the list.
    pub list_lag: Duration,
    /// Host environment variables (names or prefixes) a child may inherit
    /// besides the base (`environment.rs`).
    pub environment_variables: Vec<String>,
    /// The pools that may use it (GARM's `exec` protocol names the pool).
    pub pools: Vec<String>,
    /// Seconds a stopped instance takes to be ready once started; `None`:
    /// the provider keeps no stopped runners.
    pub resume_seconds: Option<f64>,
}

impl ProviderSpec {
    /// The boot time the provider's bids promise: the middle of the range.
    pub fn mean_boot_time(&self) -> Duration {
        let (low, high) = self.boot_seconds;
        Duration::from_secs_f64((low + high) / 2.0)
    }
}

/// What providers need from the running installation.
pub struct BuildContext {
    /// Where providers read the time (the wall clock under `runway serve`).
    pub clock: Arc<dyn Clock>,
    /// This installation's id (from the store), a UUID; instances are
    /// tagged with it.
    pub controller_id: String,
    /// The id an installation from before the UUIDs tagged its instances
    /// with; they are still looked after.
    pub legacy_controller_id: Option<String>,
    /// This binary: what a `process` command's first element `runway` means.
    pub runway_exe: Option<PathBuf>,
    /// Asked right before each call that changes a cloud (`exec`, `ec2`).
    pub fence: crate::Fence,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BuildError {
    /// The declaration cannot work here; `key` names the setting.
    #[error("[providers.{provider}] {key}: {message}")]
    Invalid {
        provider: String,
        key: &'static str,
        message: String,
    },
}

/// The provider `spec` declares.
pub fn build(spec: &ProviderSpec, context: &BuildContext) -> Result<Arc<dyn Provider>, BuildError> {
    let invalid = |key: &'static str, message: String| BuildError::Invalid {
        provider: spec.name.clone(),
        key,
        message,
    };
    let provider: Arc<dyn Provider> = match &spec.kind {
        ProviderKind::Sim { fail_rate, seed } => {
            let (low, high) = spec.boot_seconds;
            let boot_time = if low == high {
                BootTime::Fixed(Duration::from_secs_f64(low))
            } else {
                BootTime::Uniform(Duration::from_secs_f64(low), Duration::from_secs_f64(high))
            };
            let sim = SimConfig {
                name: spec.name.clone(),
                boot_time,
                fail_rate: *fail_rate,
                price_per_hour: spec.price_per_hour,
                max_instances: spec.max_instances,
                seed: *seed,
                resume_time: spec
                    .resume_seconds
                    .map(|s| Duration::from_secs_f64(s.max(0.0))),
            };
            Arc::new(SimProvider::new(sim, context.clock.clone()))
        }
        ProviderKind::Process {
            command,
            state_dir,
            stop_grace,
        } => {
            let mut command = command.clone();
            if let (Some(first), Some(exe)) = (command.first_mut(), &context.runway_exe) {
                if first == "runway" {
                    *first = exe.display().to_string();
                }
            }
            let state_dir = state_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("runway-processes").join(&spec.name));
            let process = ProcessProvider::new(ProcessConfig {
                name: spec.name.clone(),
                command,
                state_dir,
                stop_grace: *stop_grace,
                max_instances: spec.max_instances,
                price_per_hour: spec.price_per_hour,
                boot_time: spec.mean_boot_time(),
                controller_id: context.controller_id.clone(),
                legacy_controller_id: context.legacy_controller_id.clone(),
                environment_variables: spec.environment_variables.clone(),
            })
            .map_err(|e| invalid("state_dir", e.to_string()))?;
            Arc::new(process)
        }
        ProviderKind::Exec {
            executable,
            config_file,
            timeout,
            interface_version,
        } => {
            if !executable.is_file() {
                return Err(invalid(
                    "executable",
                    format!("{} is not a file", executable.display()),
                ));
            }
            Arc::new(ExecProvider::fenced(
                ExecConfig {
                    name: spec.name.clone(),
                    executable: executable.clone(),
                    config_file: config_file.clone(),
                    pools: spec.pools.clone(),
                    timeout: *timeout,
                    environment_variables: spec.environment_variables.clone(),
                    max_instances: spec.max_instances,
                    price_per_hour: spec.price_per_hour,
                    boot_time: spec.mean_boot_time(),
                    list_lag: spec.list_lag,
                    controller_id: context.controller_id.clone(),
                    legacy_controller_id: context.legacy_controller_id.clone(),
                    interface_version: *interface_version,
                },
                context.fence.clone(),
            ))
        }
        ProviderKind::Ec2 {
            region,
            endpoint_url,
            profile,
            instance_types,
            zones,
            purchase_options,
            on_demand_prices,
            spot_price_refresh,
            boot_command,
            prepare_command,
            ..
        } => {
            spec.kind
                .check()
                .map_err(|(key, message)| invalid(key, message))?;
            Arc::new(
                Ec2Provider::new(
                    Ec2Config {
                        name: spec.name.clone(),
                        region: region.clone(),
                        endpoint_url: endpoint_url.clone(),
                        profile: profile.clone(),
                        instance_types: instance_types.clone(),
                        zones: zones.clone(),
                        purchase_options: purchase_options.clone(),
                        on_demand_prices: on_demand_prices.clone(),
                        price_per_hour: spec.price_per_hour,
                        spot_price_refresh: *spot_price_refresh,
                        boot_command: boot_command.clone(),
                        prepare_command: prepare_command.clone(),
                        max_instances: spec.max_instances,
                        boot_time: spec.mean_boot_time(),
                        list_lag: spec.list_lag,
                        controller_id: context.controller_id.clone(),
                        legacy_controller_id: context.legacy_controller_id.clone(),
                    },
                    context.clock.clone(),
                )
                .fenced(context.fence.clone()),
            )
        }
        ProviderKind::Container {
            socket,
            image,
            pull,
            cpus,
            memory_mb,
            pids_limit,
            network,
            read_only,
            user,
            mounts,
            allowed_mounts,
            capabilities,
            allowed_capabilities,
            command,
            mount_runway,
            state_dir,
            stop_grace,
        } => {
            spec.kind
                .check()
                .map_err(|(key, message)| invalid(key, message))?;
            let state_dir = state_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("runway-containers").join(&spec.name));
            let state_dir = std::path::absolute(&state_dir).unwrap_or(state_dir);
            Arc::new(
                ContainerProvider::new(ContainerConfig {
                    name: spec.name.clone(),
                    socket: socket.clone(),
                    image: image.clone(),
                    pull: *pull,
                    cpus: *cpus,
                    memory_mb: *memory_mb,
                    pids_limit: *pids_limit,
                    network: network.clone(),
                    read_only: *read_only,
                    user: user.clone(),
                    mounts: mounts.clone(),
                    allowed_mounts: allowed_mounts.clone(),
                    capabilities: capabilities.clone(),
                    allowed_capabilities: allowed_capabilities.clone(),
                    command: command.clone(),
                    runway_exe: if *mount_runway {
                        context.runway_exe.clone()
                    } else {
                        None
                    },
                    environment_variables: spec.environment_variables.clone(),
                    state_dir,
                    stop_grace: *stop_grace,
                    max_instances: spec.max_instances,
                    price_per_hour: spec.price_per_hour,
                    boot_time: spec.mean_boot_time(),
                    controller_id: context.controller_id.clone(),
                    legacy_controller_id: context.legacy_controller_id.clone(),
                })
                .map_err(|e| invalid("state_dir", e.to_string()))?
                .fenced(context.fence.clone()),
            )
        }
    };
    Ok(provider)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ManualClock;
    use runway_core::Timestamp;

    fn context() -> BuildContext {
        BuildContext {
            clock: Arc::new(ManualClock::new(Timestamp::from_millis(0))),
            controller_id: "test".into(),
            legacy_controller_id: None,
            runway_exe: None,
            fence: crate::unfenced(),
        }
    }

    fn spec(kind: ProviderKind) -> ProviderSpec {
        ProviderSpec {
            name: "p".into(),
            kind,
            max_instances: 3,
            price_per_hour: 0.5,
            boot_seconds: (10.0, 20.0),
            list_lag: Duration::ZERO,
            environment_variables: Vec::new(),
            pools: vec!["pool".into()],
            resume_seconds: None,
        }
    }

    #[test]
    fn each_kind_builds_the_provider_of_its_name() {
        let sim = build(
            &spec(ProviderKind::Sim {
                fail_rate: 0.0,
                seed: 1,
            }),
            &context(),
        )
        .expect("a sim provider");
        assert_eq!(sim.name(), "p");
        assert_eq!(
            spec(ProviderKind::Sim {
                fail_rate: 0.0,
                seed: 1
            })
            .mean_boot_time(),
            Duration::from_secs(15)
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let process = build(
            &spec(ProviderKind::Process {
                command: vec!["true".into()],
                state_dir: Some(dir.path().join("state")),
                stop_grace: Duration::from_secs(1),
            }),
            &context(),
        )
        .expect("a process provider");
        assert_eq!(process.name(), "p");
    }

    #[test]
    fn an_exec_provider_without_its_executable_is_refused_by_name() {
        let missing = build(
            &spec(ProviderKind::Exec {
                executable: PathBuf::from("/nonexistent/garm-provider"),
                config_file: None,
                timeout: Duration::from_secs(5),
                interface_version: InterfaceVersion::default(),
            }),
            &context(),
        )
        .err()
        .expect("refused");
        assert_eq!(
            missing.to_string(),
            "[providers.p] executable: /nonexistent/garm-provider is not a file"
        );
    }
}
