//! runway's configuration: one TOML file (documented in
//! `examples/runway.toml`), built-in defaults for everything, and command-line
//! overrides for the listen address and the database.
//!
//! The types here are the file's shape: serde reads the file straight into
//! them (a missing key takes its type's default, an unknown key is an
//! error) and writes them back ([`Config::to_redacted_toml`]). Loading is
//! three steps: serde, [`Config::parse`]'s resolve (secrets, relative
//! paths, per-key checks) and `validate` (keys against each other).
//!
//! Secrets (the database URL can carry a password) may be written
//! `env:NAME` or `file:PATH`; they are resolved at load time and never
//! printed or logged: [`Secret`]'s `Debug` and `Display` show only where the
//! value came from.

pub mod access;
pub mod github;
mod load;
pub mod pools;
pub mod providers;
pub mod secret;
pub mod server;
pub mod share;
pub mod tokens;
pub mod worker_config;

#[cfg(test)]
mod tests;

pub use access::{ForksSetting, PoolAccess};
pub use github::{GithubAuth, GithubConfig, Hook, PoolGithub, Target};
pub use pools::{PoolConfig, ScalingPolicy, SurplusBoots};
pub use providers::{ProviderConfig, PROVIDER_KINDS};
pub use secret::{Secret, SecretSource};
pub use server::ServerConfig;
pub use share::PoolShare;
pub use tokens::{Role, Scope, TokenConfig};

use load::check_database_url;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use runway_core::routing::{PoolLabels, RouteDecision, RoutingPolicy};
use runway_core::worker_config::{ProviderSchema, Schemas, WorkerConfig};
use runway_providers::factory::{ProviderKind, ProviderSpec};
use runway_providers::settings::duration;
use serde::{Deserialize, Serialize};

use crate::config::worker_config::WorkerConfigDto;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_DATABASE: &str = "sqlite://runway.db";
pub const DEFAULT_GITHUB_API: &str = "https://api.github.com";

/// A configuration that was read, resolved and validated. The types below
/// are the file's own shape (one schema): serde reads the file into them,
/// every missing key takes the default its type documents, and unknown keys
/// are errors, so a typo never silently does nothing.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub queue: QueueConfig,
    pub github: GithubConfig,
    pub routing: RoutingConfig,
    pub runner_api: RunnerApiConfig,
    pub retention: RetentionConfig,
    pub scaling: ScalingConfig,
    pub telemetry: TelemetryConfig,
    pub metrics: MetricsConfig,
    pub pools: Vec<PoolConfig>,
    /// Providers by name, in name order: `[providers.NAME]` tables or a
    /// `[[providers]]` list with `name` keys.
    #[serde(with = "providers", skip_serializing_if = "Vec::is_empty")]
    pub providers: Vec<ProviderConfig>,
    /// The `[[worker_configs]]` entries as written, for `config check`.
    #[serde(rename = "worker_configs", skip_serializing_if = "Vec::is_empty")]
    pub worker_config_sources: Vec<toml::Value>,
    /// Those entries read (written to the store at start-up).
    #[serde(skip)]
    pub worker_configs: Vec<WorkerConfig>,
}

/// The job labels metrics may carry.
pub const JOB_LABELS: [&str; 3] = ["repo", "workflow", "event"];

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct QueueConfig {
    /// A job whose lease expires this many times fails instead of requeueing.
    pub max_attempts: u32,
}

impl Default for QueueConfig {
    fn default() -> QueueConfig {
        QueueConfig { max_attempts: 3 }
    }
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RoutingConfig {
    /// Preferred among several pools that can serve a job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_pool: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunnerApiConfig {
    /// How long `POST /api/v1/jobs/request` waits for a job before 204 (on
    /// the last whole second before it is up: `jobs::poll_end`).
    #[serde(with = "duration")]
    pub poll_timeout: Duration,
    /// How long a claim holds without a keepalive or heartbeat.
    #[serde(with = "duration")]
    pub lease: Duration,
}

impl Default for RunnerApiConfig {
    fn default() -> RunnerApiConfig {
        RunnerApiConfig {
            poll_timeout: Duration::from_secs(30),
            lease: Duration::from_secs(120),
        }
    }
}

/// `[retention]`: how long finished history is kept. Zero keeps forever.
/// Live work (queued, provisioning, running jobs; live runners) is never
/// pruned.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// Completed, failed, cancelled and unroutable jobs, from when they
    /// finished; at least [`MIN_DEDUPE_RETENTION`] (their rows dedupe a
    /// redelivered webhook).
    #[serde(with = "duration")]
    pub finished_jobs: Duration,
    /// Terminated, failed and crashed runners (with their reports).
    #[serde(with = "duration")]
    pub ended_runners: Duration,
    /// Webhook deliveries (and once-keys); at least
    /// [`MIN_DEDUPE_RETENTION`].
    #[serde(with = "duration")]
    pub deliveries: Duration,
    /// Finished jobs' output.
    #[serde(with = "duration")]
    pub job_logs: Duration,
    /// What runners and their machines reported.
    #[serde(with = "duration")]
    pub runner_reports: Duration,
    /// The audit trail of the admin API's changes.
    #[serde(with = "duration")]
    pub audit: Duration,
    /// The fleet's sampled history behind the console's charts (one row
    /// a pool a minute); the week chart needs at least 7 days.
    #[serde(with = "duration")]
    pub pool_history: Duration,
    /// Between two pruning passes (leader only).
    #[serde(with = "duration")]
    pub interval: Duration,
    /// Rows deleted per statement: each is a short transaction, so intake
    /// never waits long behind the pruner.
    pub batch: u32,
}

impl Default for RetentionConfig {
    fn default() -> RetentionConfig {
        const DAY: u64 = 24 * 3600;
        RetentionConfig {
            finished_jobs: Duration::from_secs(30 * DAY),
            ended_runners: Duration::from_secs(7 * DAY),
            deliveries: Duration::from_secs(7 * DAY),
            job_logs: Duration::from_secs(7 * DAY),
            runner_reports: Duration::from_secs(7 * DAY),
            audit: Duration::from_secs(90 * DAY),
            pool_history: Duration::from_secs(8 * DAY),
            interval: Duration::from_secs(600),
            batch: 1_000,
        }
    }
}

/// GitHub redelivers a webhook for three days; a finished job's row and
/// its delivery's are what make a late redelivery a duplicate, so neither
/// is pruned sooner than this.
pub const MIN_DEDUPE_RETENTION: Duration = Duration::from_secs(4 * 24 * 3600);

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScalingConfig {
    /// How often the reconciler runs (it also runs when a job arrives).
    #[serde(with = "duration")]
    pub interval: Duration,
}

impl Default for ScalingConfig {
    fn default() -> ScalingConfig {
        ScalingConfig {
            interval: Duration::from_secs(10),
        }
    }
}

/// `[telemetry]`: the JSON event log.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// A file path, `-` for standard output, or none (no event log).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_log: Option<String>,
    /// A file is rotated before it grows past this.
    pub event_log_max_bytes: u64,
    /// Rotated files kept (`events.log.1` … `.N`).
    pub event_log_keep: u32,
}

impl Default for TelemetryConfig {
    fn default() -> TelemetryConfig {
        TelemetryConfig {
            event_log: None,
            event_log_max_bytes: 100 * 1024 * 1024,
            event_log_keep: 5,
        }
    }
}

/// `[metrics]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// Which of `repo`, `workflow`, `event` job metrics carry (each can
    /// multiply the series count).
    pub job_labels: Vec<String>,
}

impl Default for MetricsConfig {
    fn default() -> MetricsConfig {
        MetricsConfig {
            job_labels: JOB_LABELS.iter().map(|l| l.to_string()).collect(),
        }
    }
}

/// What went wrong with a configuration, always naming the file and, where
/// there is one, the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("config {origin}: {location}: {message}")]
    Invalid {
        origin: String,
        location: String,
        message: String,
    },
}

impl Default for Config {
    fn default() -> Config {
        Config {
            server: ServerConfig::default(),
            queue: QueueConfig::default(),
            github: GithubConfig::default(),
            routing: RoutingConfig::default(),
            runner_api: RunnerApiConfig::default(),
            retention: RetentionConfig::default(),
            scaling: ScalingConfig::default(),
            telemetry: TelemetryConfig::default(),
            metrics: MetricsConfig::default(),
            pools: vec![PoolConfig::default()],
            providers: Vec::new(),
            worker_config_sources: Vec::new(),
            worker_configs: Vec::new(),
        }
    }
}

impl Config {
    /// What `runway serve` runs without a config file: one pool `local`
    /// (labels `local`, `linux`) whose runners are `runway agent --once`
    /// processes on this machine, at most two at a time.
    pub fn out_of_the_box() -> Config {
        let mut provider = ProviderConfig::new(
            "local",
            ProviderKind::Process {
                command: vec!["runway".into(), "agent".into(), "--once".into()],
                state_dir: None,
                stop_grace: Duration::from_secs(10),
            },
        );
        provider.max_instances = 2;
        Config {
            pools: vec![PoolConfig {
                max_runners: 2,
                boot_timeout: Duration::from_secs(60),
                providers: vec!["local".to_owned()],
                ..PoolConfig::new("local", &["local", "linux"])
            }],
            providers: vec![provider],
            ..Config::default()
        }
    }
}

/// Command-line values that win over the file.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Option<SocketAddr>,
    pub database: Option<String>,
}

impl Config {
    /// Routes `labels` to a pool; `required_labels` are those a job must
    /// carry to be ours (GitHub's `[github] required_labels`, none for API jobs).
    pub fn route(&self, labels: &[String], required_labels: &[String]) -> RouteDecision {
        match self.candidates(labels, required_labels) {
            Ok(mut pools) => RouteDecision::Pool(pools.swap_remove(0)),
            Err(decision) => decision,
        }
    }

    /// Every pool that can serve `labels`, best first ([`Config::route`]'s
    /// choice is the first); the decision instead when none can.
    pub fn candidates(
        &self,
        labels: &[String],
        required_labels: &[String],
    ) -> Result<Vec<String>, RouteDecision> {
        let pools: Vec<PoolLabels> = self
            .pools
            .iter()
            .map(|p| PoolLabels {
                name: p.name.clone(),
                labels: p.labels.clone(),
            })
            .collect();
        let policy = RoutingPolicy {
            required_labels: required_labels.to_vec(),
            default_pool: self.routing.default_pool.clone(),
        };
        runway_core::routing::candidates(labels, &pools, &policy)
    }

    /// The pool called `name`.
    pub fn pool(&self, name: &str) -> Option<&PoolConfig> {
        self.pools.iter().find(|pool| pool.name == name)
    }

    /// The typed declaration of every provider, each with the pools that
    /// may use it (a pool that names no provider may use any).
    pub fn provider_specs(&self) -> Vec<ProviderSpec> {
        self.providers
            .iter()
            .map(|provider| {
                let pools = self
                    .pools
                    .iter()
                    .filter(|pool| {
                        pool.providers.is_empty() || pool.providers.contains(&provider.name)
                    })
                    .map(|pool| pool.name.clone())
                    .collect();
                provider.spec(pools)
            })
            .collect()
    }

    /// The condition inputs a pool's worker configuration is evaluated
    /// with for the planner (its `scalingRatio`): the pool, its first
    /// provider and that provider's `inputs`. An offer's inputs (an EC2
    /// zone) are not known until a launch is chosen, so rules conditioned
    /// on them do not set the ratio.
    pub fn planning_inputs(&self, pool: &PoolConfig) -> BTreeMap<String, String> {
        let provider = pool.providers.first().cloned().unwrap_or_default();
        let mut inputs = self.launch_inputs(&provider);
        inputs.insert("provider".to_owned(), provider);
        inputs.insert("pool".to_owned(), pool.name.clone());
        inputs
    }

    /// The condition inputs `provider`'s configuration gives every launch
    /// through it (`[providers.NAME] inputs`).
    pub fn launch_inputs(&self, provider: &str) -> BTreeMap<String, String> {
        self.providers
            .iter()
            .find(|p| p.name == provider)
            .map(|p| p.inputs.clone())
            .unwrap_or_default()
    }

    /// The scaling ratio the planner uses for `pool`: `scalingRatio` from
    /// the worker configuration (of `configs`) that names the pool, when
    /// its rules set one for [`Config::planning_inputs`]; else the pool's
    /// own `scaling_ratio`.
    pub fn scaling_ratio(&self, pool: &PoolConfig, configs: &[WorkerConfig]) -> f64 {
        configs
            .iter()
            .find(|config| config.pools.contains(&pool.name))
            .and_then(|config| config.scaling_ratio(&self.planning_inputs(pool)))
            .unwrap_or(pool.scaling_ratio)
    }

    /// What the declared providers allow worker configurations to say.
    pub fn schemas(&self) -> Schemas {
        Schemas {
            providers: self
                .providers
                .iter()
                .map(|p| {
                    // What the kind implies, then what the file adds.
                    let with = |implied: &[&str], declared: &[String]| {
                        let mut all: Vec<String> =
                            implied.iter().map(|s| (*s).to_owned()).collect();
                        for name in declared {
                            if !all.contains(name) {
                                all.push(name.clone());
                            }
                        }
                        all
                    };
                    ProviderSchema {
                        name: p.name.clone(),
                        conditions: with(p.kind.implied_conditions(), &p.conditions),
                        required_keys: with(p.kind.implied_required_keys(), &p.required_keys),
                    }
                })
                .collect(),
        }
    }

    /// What the providers its pools may use refuse in `config`'s rules
    /// (each kind checks its own keys: `ProviderKind::check_rule_values`),
    /// naming the rule and the key. A configuration of no known pool is
    /// checked against every provider.
    pub fn check_provider_values(&self, config: &WorkerConfig) -> Result<(), String> {
        let mut providers: Vec<&ProviderConfig> = Vec::new();
        for pool in self.pools.iter().filter(|p| config.pools.contains(&p.name)) {
            for provider in &self.providers {
                let allowed = pool.providers.is_empty() || pool.providers.contains(&provider.name);
                if allowed && !providers.iter().any(|p| p.name == provider.name) {
                    providers.push(provider);
                }
            }
        }
        if providers.is_empty() {
            providers = self.providers.iter().collect();
        }
        for rule in &config.rules {
            for provider in &providers {
                provider.kind.check_rule_values(&rule.values).map_err(|e| {
                    format!(
                        "rule {:?}: {e} (refused by provider {:?}, kind {})",
                        rule.rule_id,
                        provider.name,
                        provider.kind.name()
                    )
                })?;
            }
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), (String, String)> {
        self.check_providers()?;
        self.check_worker_configs()?;
        check_database_url(self.server.database.expose())
            .map_err(|m| ("[server] database".to_owned(), m))?;
        for (key, zero) in [
            (
                "[server] database_max_connections",
                self.server.database_max_connections == 0,
            ),
            ("[queue] max_attempts", self.queue.max_attempts == 0),
            ("[github] max_body_bytes", self.github.max_body_bytes == 0),
            (
                "[github] max_requests_per_hour",
                self.github.max_requests_per_hour == 0,
            ),
        ] {
            if zero {
                return Err((key.into(), "must be at least 1".into()));
            }
        }
        if let Some(index) = self
            .github
            .webhook_secrets
            .iter()
            .position(|s| s.expose().is_empty())
        {
            return Err((
                format!("[github] webhook_secrets[{index}]"),
                "is empty; an empty secret would accept anyone's signature".into(),
            ));
        }
        self.check_tokens()?;
        self.check_github()?;
        self.check_pools()
    }

    /// The effective configuration as TOML, with secrets shown only by
    /// where they come from (a [`Secret`] serialises redacted).
    pub fn to_redacted_toml(&self) -> String {
        toml::to_string(self)
            .unwrap_or_else(|e| format!("# cannot render the configuration: {e}\n"))
    }
}
