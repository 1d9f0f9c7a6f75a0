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
pub mod pools;
pub mod providers;
pub mod secret;
pub mod server;
pub mod share;
pub mod tokens;
pub mod worker_config;

pub use access::{ForksSetting, PoolAccess};
pub use github::{GithubAuth, GithubConfig, Hook, PoolGithub, Target};
pub use pools::{PoolConfig, ScalingPolicy, SurplusBoots};
pub use providers::{ProviderConfig, PROVIDER_KINDS};
pub use secret::{Secret, SecretSource};
pub use server::ServerConfig;
pub use share::PoolShare;
pub use tokens::{Role, Scope, TokenConfig};

use std::collections::{BTreeMap, BTreeSet};
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
    /// How long `POST /api/v1/jobs/request` waits for a job before 204.
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
    /// Every secret of this configuration, with the key that writes it.
    fn secrets_mut(&mut self) -> Vec<(String, &mut Secret)> {
        fn numbered<'a>(
            key: &str,
            secrets: &'a mut [Secret],
        ) -> impl Iterator<Item = (String, &'a mut Secret)> {
            let key = key.to_owned();
            secrets
                .iter_mut()
                .enumerate()
                .map(move |(i, secret)| (format!("{key}[{i}]"), secret))
        }
        let server = &mut self.server;
        let github = &mut self.github;
        let mut all = vec![("[server] database".to_owned(), &mut server.database)];
        all.extend(numbered("[server] admin_tokens", &mut server.admin_tokens));
        all.extend(numbered("[server] read_tokens", &mut server.read_tokens));
        all.extend(
            server
                .tokens
                .iter_mut()
                .enumerate()
                .map(|(i, t)| (format!("[server] tokens[{i}].token"), &mut t.token)),
        );
        all.extend(numbered(
            "[github] webhook_secrets",
            &mut github.webhook_secrets,
        ));
        all.extend(
            github
                .token
                .as_mut()
                .map(|t| ("[github] token".to_owned(), t)),
        );
        all.extend(
            github
                .private_key
                .as_mut()
                .map(|k| ("[github] private_key".to_owned(), k)),
        );
        all
    }

    /// The environment variables the secrets of this configuration were
    /// read from (`env:NAME`). `runway serve` removes them from its own
    /// environment once loaded, so nothing it starts can inherit them.
    pub fn secret_environment_variables(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .clone()
            .secrets_mut()
            .into_iter()
            .filter_map(|(_, secret)| secret.environment_variable().map(str::to_owned))
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

impl Config {
    /// Reads `path`, or returns the built-in defaults when `path` is `None`;
    /// then applies `overrides` and validates the result.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
        let (mut config, origin) = match path {
            None => (Config::out_of_the_box(), "(built-in defaults)".to_owned()),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                })?;
                let origin = path.display().to_string();
                (Config::parse(&text, &origin, path.parent())?, origin)
            }
        };
        if let Some(listen) = overrides.listen {
            config.server.listen = listen;
        }
        if let Some(database) = &overrides.database {
            let invalid = |message| ConfigError::Invalid {
                origin: "--database".to_owned(),
                location: "value".to_owned(),
                message,
            };
            config.server.database = Secret::parse(database, None).map_err(invalid)?;
            check_database_url(config.server.database.expose()).map_err(invalid)?;
        }
        config
            .validate()
            .map_err(|(location, message)| ConfigError::Invalid {
                origin,
                location,
                message,
            })?;
        Ok(config)
    }

    /// Parses TOML text. `origin` names it in errors; `base` is where
    /// relative paths and `file:` secrets are looked up (the config file's
    /// directory).
    pub fn parse(text: &str, origin: &str, base: Option<&Path>) -> Result<Config, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| {
            let message = one_line(e.message());
            // A provider's error names its table itself (TOML's span is
            // the whole `providers` value).
            let (location, message) = match message.split_once(": ") {
                Some((key, rest)) if providers::names_a_provider(key) => {
                    (key.to_owned(), rest.to_owned())
                }
                _ => (describe_location(text, e.span()), message),
            };
            ConfigError::Invalid {
                origin: origin.to_owned(),
                location,
                message,
            }
        })?;
        config
            .resolve(base)
            .map_err(|(location, message)| ConfigError::Invalid {
                origin: origin.to_owned(),
                location,
                message,
            })?;
        Ok(config)
    }

    /// What reading the file leaves to do: read `env:`/`file:` secrets,
    /// make relative paths relative to `base`, fill the defaults that
    /// depend on other keys, read worker configurations, and refuse what a
    /// key cannot say on its own terms.
    fn resolve(&mut self, base: Option<&Path>) -> Result<(), (String, String)> {
        for (key, secret) in self.secrets_mut() {
            secret.load(base).map_err(|message| (key, message))?;
        }
        let relative = |path: &mut PathBuf| {
            if let Some(dir) = base.filter(|_| path.is_relative()) {
                *path = dir.join(&*path);
            }
        };
        for provider in &mut self.providers {
            match &mut provider.kind {
                ProviderKind::Process {
                    state_dir: Some(dir),
                    ..
                } => relative(dir),
                ProviderKind::Exec {
                    executable,
                    config_file,
                    ..
                } => {
                    if !executable.as_os_str().is_empty() {
                        relative(executable);
                    }
                    config_file.iter_mut().for_each(relative);
                }
                _ => {}
            }
        }
        match &self.telemetry.event_log {
            Some(path) if path.trim().is_empty() => {
                return Err((
                    "[telemetry] event_log".to_owned(),
                    "is empty; give a file path or \"-\" for standard output".to_owned(),
                ))
            }
            Some(path) if path != "-" && Path::new(path).is_relative() => {
                let mut path = PathBuf::from(path);
                relative(&mut path);
                self.telemetry.event_log = Some(path.display().to_string());
            }
            _ => {}
        }
        if self.telemetry.event_log_max_bytes < 1024 {
            return Err((
                "[telemetry] event_log_max_bytes".to_owned(),
                format!("{} is below 1024", self.telemetry.event_log_max_bytes),
            ));
        }
        self.worker_configs = self
            .worker_config_sources
            .iter()
            .enumerate()
            .map(|(i, source)| {
                worker_config_from_toml(source, base)
                    .map_err(|m| (format!("worker_configs[{i}]"), m))
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.github.check_auth()?;
        // An App's own webhook is the one to heal.
        if self.github.deliveries.is_none()
            && matches!(self.github.auth(), Some(GithubAuth::App { .. }))
        {
            self.github.deliveries = Some(Hook::App);
        }
        let url = |key: &str, url: &mut String| {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err((
                    key.to_owned(),
                    format!("{url:?} is not an http:// or https:// URL"),
                ));
            }
            *url = url.trim_end_matches('/').to_owned();
            Ok(())
        };
        url("[github] api_url", &mut self.github.api_url)?;
        if let Some(public_url) = &mut self.server.public_url {
            url("[server] public_url", public_url)?;
        }
        for (key, kept) in [
            ("[retention] finished_jobs", self.retention.finished_jobs),
            ("[retention] deliveries", self.retention.deliveries),
        ] {
            if !kept.is_zero() && kept < MIN_DEDUPE_RETENTION {
                return Err((
                    key.to_owned(),
                    "must be 0 (keep forever) or at least 4 days: GitHub redelivers a webhook for 3 days, and these rows are what make a redelivery a duplicate".to_owned(),
                ));
            }
        }
        if self.retention.interval.is_zero() {
            return Err((
                "[retention] interval".to_owned(),
                "must be more than 0".to_owned(),
            ));
        }
        if self.retention.batch == 0 {
            return Err((
                "[retention] batch".to_owned(),
                "must be at least 1".to_owned(),
            ));
        }
        if let Some(unknown) = self
            .metrics
            .job_labels
            .iter()
            .find(|l| !JOB_LABELS.contains(&l.as_str()))
        {
            return Err((
                "[metrics] job_labels".to_owned(),
                format!("{unknown:?} is not one of {}", JOB_LABELS.join(", ")),
            ));
        }
        for (i, pool) in self.pools.iter_mut().enumerate() {
            if let Some(quantile) = pool.forecast_quantile {
                if !(quantile > 0.0 && quantile <= 1.0) {
                    return Err((
                        format!("pools[{i}].forecast_quantile"),
                        format!("{quantile} is not above 0 and at most 1"),
                    ));
                }
            }
            if !(pool.wait_value.is_finite() && pool.wait_value > 0.0) {
                return Err((
                    format!("pools[{i}].wait_value"),
                    format!(
                        "{} is not a positive number (minutes of a runner a minute of waiting is worth)",
                        pool.wait_value
                    ),
                ));
            }
        }
        Ok(())
    }

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
        for provider in &self.providers {
            if runway_core::RunnerOrigin::is_reserved(&provider.name) {
                return Err((
                    format!("[providers.{}]", provider.name),
                    "this name is reserved (runway marks runners that registered themselves or that it only heard of this way); choose another".into(),
                ));
            }
            let key = |field: &str| format!("[providers.{}] {field}", provider.name);
            if matches!(&provider.kind, ProviderKind::Process { command, .. } if command.is_empty())
            {
                return Err((
                    key("command"),
                    "a process provider needs the runner's command, e.g. [\"runway\", \"agent\", \"--once\"]".into(),
                ));
            }
            if matches!(&provider.kind, ProviderKind::Exec { executable, .. } if executable.as_os_str().is_empty())
            {
                return Err((
                    key("executable"),
                    "an exec provider needs the path of a GARM external provider executable".into(),
                ));
            }
            if matches!(provider.kind, ProviderKind::Process { .. }) && provider.max_instances == 0
            {
                return Err((key("max_instances"), "must be at least 1".into()));
            }
            provider
                .kind
                .check()
                .map_err(|(field, message)| (key(field), message))?;
            provider
                .check_inputs()
                .map_err(|(field, message)| (key(&field), message))?;
        }
        let schemas = self.schemas();
        let mut owners: BTreeMap<&str, &str> = BTreeMap::new();
        let mut ids = BTreeSet::new();
        for (i, config) in self.worker_configs.iter().enumerate() {
            let key = format!("worker_configs[{i}]");
            if !ids.insert(config.id.as_str()) {
                return Err((
                    format!("{key}.id"),
                    format!("duplicate worker configuration id {:?}", config.id),
                ));
            }
            config
                .check(&schemas)
                .map_err(|e| (key.clone(), e.to_string()))?;
            self.check_provider_values(config)
                .map_err(|e| (key.clone(), e))?;
            for pool in &config.pools {
                if let Some(owner) = owners.insert(pool, &config.id) {
                    return Err((
                        format!("{key}.pools"),
                        format!("pool {pool:?} already belongs to worker configuration {owner:?}"),
                    ));
                }
            }
        }

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
        if let Some(index) = self
            .server
            .admin_tokens
            .iter()
            .position(|s| s.expose().len() < 16)
        {
            return Err((
                format!("[server] admin_tokens[{index}]"),
                "is shorter than 16 characters; use a long random token".into(),
            ));
        }
        let mut token_names = BTreeSet::new();
        for (i, token) in self.server.tokens.iter().enumerate() {
            let key = |field: &str| format!("[server] tokens[{i}].{field}");
            if token.name.trim().is_empty() {
                return Err((key("name"), "must not be empty".into()));
            }
            if !token_names.insert(token.name.as_str()) {
                return Err((
                    key("name"),
                    format!("duplicate token name {:?}", token.name),
                ));
            }
            if token.token.expose().len() < 16 {
                return Err((
                    key("token"),
                    "is shorter than 16 characters; use a long random token".into(),
                ));
            }
            if token.pools.is_empty() {
                return Err((
                    key("pools"),
                    "covers no pool; leave it out for every pool".into(),
                ));
            }
            Scope::of(&token.pools)
                .map_err(|(index, message)| (key(&format!("pools[{index}]")), message))?;
            for (index, glob) in token.pools.iter().enumerate() {
                let Ok(scope) = Scope::of(std::slice::from_ref(glob)) else {
                    continue;
                };
                if !self.pools.iter().any(|p| scope.covers(Some(&p.name))) {
                    return Err((
                        key(&format!("pools[{index}]")),
                        format!("{glob:?} names no configured pool"),
                    ));
                }
            }
        }
        let every_secret: Vec<&str> = self
            .server
            .admin_tokens
            .iter()
            .chain(&self.server.read_tokens)
            .chain(self.server.tokens.iter().map(|t| &t.token))
            .map(Secret::expose)
            .collect();
        if every_secret.len() != every_secret.iter().collect::<BTreeSet<_>>().len() {
            return Err((
                "[server] tokens".into(),
                "the same token appears twice (admin_tokens, read_tokens, tokens): each must be distinct".into(),
            ));
        }
        let auth = self.github.auth();
        if let Some(GithubAuth::Token(token)) = &auth {
            if token.expose().trim().is_empty() {
                return Err(("[github] token".into(), "is empty".into()));
            }
        }
        if let Some(GithubAuth::App { private_key, .. }) = &auth {
            jsonwebtoken::EncodingKey::from_rsa_pem(private_key.expose().as_bytes()).map_err(
                |e| {
                    (
                        "[github] private_key".to_owned(),
                        format!("not an RSA private key in PEM form ({e})"),
                    )
                },
            )?;
        }
        if self.github.deliveries.is_some() && auth.is_none() {
            return Err((
                "[github] deliveries".into(),
                "redelivering webhooks needs [github] token or App credentials".into(),
            ));
        }
        if matches!(self.github.deliveries, Some(crate::config::Hook::App))
            && !matches!(auth, Some(GithubAuth::App { .. }))
        {
            return Err((
                "[github] deliveries".into(),
                "\"app\" (the App's webhook) needs App credentials (app_id, private_key, installation_id)".into(),
            ));
        }
        if let Some(default) = &self.routing.default_pool {
            if !self.pools.iter().any(|p| &p.name == default) {
                return Err((
                    "[routing] default_pool".into(),
                    format!("{default:?} is not the name of a configured pool"),
                ));
            }
        }
        let mut names = BTreeSet::new();
        for (i, pool) in self.pools.iter().enumerate() {
            let key = |field: &str| format!("pools[{i}].{field}");
            pool.check_alone()
                .map_err(|(field, message)| (key(&field), message))?;
            if !names.insert(pool.name.to_lowercase()) {
                return Err((key("name"), format!("duplicate pool name {:?}", pool.name)));
            }
            if let Some(unknown) = pool
                .providers
                .iter()
                .find(|name| !self.providers.iter().any(|p| &&p.name == name))
            {
                return Err((
                    key("providers"),
                    format!("{unknown:?} is not a declared provider ([providers.NAME])"),
                ));
            }
            if pool.github.is_some() && !pool.ephemeral {
                return Err((
                    key("ephemeral"),
                    "a GitHub pool's runners are just-in-time runners, one job each: ephemeral must be true".into(),
                ));
            }
            if pool.github.is_some() && auth.is_none() {
                return Err((
                    key("github"),
                    "a GitHub pool needs [github] token or App credentials (app_id, private_key, installation_id)".into(),
                ));
            }
            if pool.access.is_some() && pool.github.as_ref().is_some_and(|g| g.scale_set.is_some())
            {
                return Err((
                    key("access"),
                    "access policies judge webhook-fed GitHub pools; a scale-set pool's jobs come from its scale set's queue and are not judged yet — restrict the scale set's runner group at GitHub instead".into(),
                ));
            }
            if let Some(scale_set) = pool.github.as_ref().and_then(|g| g.scale_set.as_ref()) {
                let github = pool.github.as_ref().map(|g| &g.target);
                if let Some(other) = self.pools[..i].iter().find(|other| {
                    other.github.as_ref().is_some_and(|g| {
                        Some(&g.target) == github && g.scale_set.as_ref() == Some(scale_set)
                    })
                }) {
                    return Err((
                        key("github.scale_set"),
                        format!(
                            "{scale_set:?} is already pool {:?}'s scale set: a scale set has one session, so one pool",
                            other.name
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The effective configuration as TOML, with secrets shown only by
    /// where they come from (a [`Secret`] serialises redacted).
    pub fn to_redacted_toml(&self) -> String {
        toml::to_string(self)
            .unwrap_or_else(|e| format!("# cannot render the configuration: {e}\n"))
    }
}

/// `listen`: an address and port, `127.0.0.1:8080` or `[::1]:8080`.
fn check_database_url(url: &str) -> Result<(), String> {
    if url.trim().is_empty() {
        return Err("must not be empty".into());
    }
    match url.split_once("://") {
        Some(("postgres" | "postgresql" | "sqlite", _)) => Ok(()),
        Some((scheme, _)) => Err(format!(
            "unsupported database URL scheme {scheme:?}; use sqlite://PATH or postgres://USER@HOST/DB"
        )),
        // `sqlite:PATH`, `sqlite::memory:` or a plain file path.
        None => Ok(()),
    }
}

/// One `[[worker_configs]]` entry: `{ file = "build.json" }` (JSON, which
/// can say `null`), or the configuration written inline in TOML.
fn worker_config_from_toml(
    source: &toml::Value,
    base: Option<&Path>,
) -> Result<WorkerConfig, String> {
    if let Some(file) = source.get("file").and_then(toml::Value::as_str) {
        if source.as_table().map_or(0, |t| t.len()) != 1 {
            return Err("an entry with `file` takes no other keys".into());
        }
        let path = match base {
            Some(base) if Path::new(file).is_relative() => base.join(file),
            _ => PathBuf::from(file),
        };
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        return crate::config::worker_config::parse(&text, &path.display().to_string());
    }
    let json = serde_json::to_value(source).map_err(|e| e.to_string())?;
    let dto: WorkerConfigDto =
        serde_json::from_value(json).map_err(|e| one_line(&e.to_string()))?;
    let id = dto.id.clone().unwrap_or_default();
    Ok(dto.into_core(&id))
}

fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// "`[table] key` (line L, column C)" for the start of `span` in `text`.
fn describe_location(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    let Some(span) = span else {
        return "(unknown position)".to_owned();
    };
    let before = &text[..span.start.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    let line_text = text.lines().nth(line - 1).unwrap_or("");
    let table = text
        .lines()
        .take(line)
        .filter_map(|l| {
            let l = l.trim();
            l.starts_with('[')
                .then(|| l.split('#').next().unwrap_or(l).trim().to_owned())
        })
        .last();
    let key = line_text
        .split_once('=')
        .map(|(key, _)| key.trim().to_owned())
        .filter(|key| !key.is_empty() && !key.starts_with('['));
    let name = match (table, key) {
        (Some(table), Some(key)) => format!("{table} {key} "),
        (None, Some(key)) => format!("{key} "),
        (Some(table), None) => format!("{table} "),
        (None, None) => String::new(),
    };
    format!("{name}(line {line}, column {column})")
}

#[cfg(test)]
mod tests {
    use expect_test::{expect, Expect};

    use super::*;

    #[test]
    fn a_secret_serialises_only_its_redacted_form() {
        #[derive(Serialize)]
        struct Carrier {
            token: Secret,
            database: Secret,
        }
        let carrier = Carrier {
            token: Secret::literal("hunter2-token"),
            database: Secret::literal("postgres://runway:hunter2@db/runway"),
        };
        let json = serde_json::to_string(&carrier).expect("serialises");
        assert!(!json.contains("hunter2"), "{json}");
        assert_eq!(
            json,
            r#"{"token":"***","database":"postgres://runway:***@db/runway"}"#
        );
    }

    fn check(text: &str, expect: Expect) {
        let result = match Config::parse(text, "runway.toml", None) {
            Ok(config) => match config.validate() {
                Ok(()) => config.to_redacted_toml(),
                Err((location, message)) => format!("error: {location}: {message}"),
            },
            Err(e) => format!("error: {e}"),
        };
        expect.assert_eq(&result);
    }

    #[test]
    fn the_documented_example_is_valid() {
        let text = include_str!("../../../../examples/runway.toml");
        let config = Config::parse(text, "examples/runway.toml", None).expect("example parses");
        config.validate().expect("example is valid");
        assert_eq!(config.pools.len(), 2);
        // Every key the example documents is at its default where it says so.
        assert_eq!(config.server, Config::default().server);
        assert_eq!(config.queue, Config::default().queue);
        assert_eq!(config.pools[0], Config::default().pools[0]);
    }

    #[test]
    fn empty_file_gives_defaults() {
        check(
            "",
            expect![[r#"
                [server]
                listen = "127.0.0.1:8080"
                database = "sqlite://runway.db"
                database_max_connections = 16
                admin_tokens = []
                read_tokens = []

                [queue]
                max_attempts = 3

                [github]
                webhook_secrets = []
                required_labels = ["self-hosted"]
                max_body_bytes = 26214400
                api_url = "https://api.github.com"
                max_requests_per_hour = 3000
                recheck_after = "300s"
                redeliver_interval = "300s"

                [routing]

                [runner_api]
                poll_timeout = "30s"
                lease = "120s"

                [retention]
                finished_jobs = "30d"
                ended_runners = "7d"
                deliveries = "7d"
                job_logs = "7d"
                runner_reports = "7d"
                audit = "90d"
                pool_history = "8d"
                interval = "600s"
                batch = 1000

                [scaling]
                interval = "10s"

                [telemetry]
                event_log_max_bytes = 104857600
                event_log_keep = 5

                [metrics]
                job_labels = ["repo", "workflow", "event"]

                [[pools]]
                name = "default"
                labels = ["self-hosted", "linux", "x64"]
                min_idle = 0
                max_runners = 10
                scaling_ratio = 1.0
                idle_grace = "300s"
                boot_timeout = "600s"
                providers = []
                surplus_boots = "keep"
                ephemeral = true
                policy = "runway"
                wait_value = 1.75
            "#]],
        );
    }

    #[test]
    fn unknown_keys_are_named_with_their_place() {
        check(
            "[server]\nlisten = \"127.0.0.1:9000\"\nlisen = \"x\"\n",
            expect!["error: config runway.toml: [server] lisen (line 3, column 1): unknown field `lisen`, expected one of `listen`, `database`, `database_max_connections`, `admin_tokens`, `read_tokens`, `tokens`, `public_url`"],
        );
    }

    #[test]
    fn wrong_types_are_named_with_their_place() {
        check(
            "[queue]\nmax_attempts = \"three\"\n",
            expect![[
                r#"error: config runway.toml: [queue] max_attempts (line 2, column 16): invalid type: string "three", expected u32"#
            ]],
        );
        check(
            "[server]\nlisten = \"localhost\"\n",
            expect![[
                r#"error: config runway.toml: [server] listen (line 2, column 10): "localhost" is not an address like 127.0.0.1:8080 or [::1]:8080"#
            ]],
        );
        check(
            "[server\n",
            expect!["error: config runway.toml: [server (line 1, column 8): invalid table header expected `.`, `]`"],
        );
    }

    #[test]
    fn providers_as_tables_or_as_a_list() {
        let list = "[[providers]]\nname = \"cloud\"\nkind = \"sim\"\nboot_seconds = [1, 3]\n\n[[pools]]\nname = \"p\"\nlabels = [\"x\"]\nproviders = [\"cloud\"]\n";
        let config = Config::parse(list, "t", None).expect("list form");
        config.validate().expect("valid");
        assert_eq!(config.providers[0].name, "cloud");
        assert_eq!(config.providers[0].boot_seconds, (1.0, 3.0));
        let tables = "[providers.cloud]\nkind = \"sim\"\nboot_seconds = 2\n";
        let config = Config::parse(tables, "t", None).expect("table form");
        assert_eq!(config.providers[0].boot_seconds, (2.0, 2.0));
        let twice = "[[providers]]\nname = \"a\"\nkind = \"sim\"\n[[providers]]\nname = \"a\"\nkind = \"sim\"\n";
        let error = Config::parse(twice, "t", None).expect_err("duplicate");
        assert!(error.to_string().contains("providers[1].name"), "{error}");
        let unknown_provider =
            "[[pools]]\nname = \"p\"\nlabels = [\"x\"]\nproviders = [\"nope\"]\n";
        let config = Config::parse(unknown_provider, "t", None).expect("parses");
        let (key, message) = config.validate().expect_err("undeclared provider");
        assert_eq!(key, "pools[0].providers");
        assert!(message.contains("nope"), "{message}");
    }

    #[test]
    fn a_provider_takes_only_its_kinds_keys() {
        check(
            "[providers.cloud]\nkind = \"sim\"\ncommand = [\"runway\"]\n",
            expect![[
                r#"error: config runway.toml: [providers.cloud]: unknown field `command`, expected `fail_rate` or `seed` for kind "sim", or one every kind takes: conditions, inputs, required_keys, max_instances, price_per_hour, boot_seconds, list_lag, environment_variables"#
            ]],
        );
        check(
            "[providers.cloud]\nkind = \"ec3\"\n",
            expect![[
                r#"error: config runway.toml: [providers.cloud]: kind: "ec3" is not one of sim, process, exec, ec2, container"#
            ]],
        );
        check(
            "[providers.cloud]\nkind = \"ec2\"\n",
            expect![[r#"error: [providers.cloud] region: is required (e.g. "us-east-1")"#]],
        );
        check(
            "[providers.cloud]\nkind = \"ec2\"\nregion = \"us-east-1\"\ninstance_types = [\"m5.large\"]\nzones = [\"us-east-1a\"]\non_demand_prices = { \"m6i.large\" = 0.1 }\n",
            expect![[r#"error: [providers.cloud] on_demand_prices: m6i.large is not in instance_types"#]],
        );
        check(
            "[providers.cloud]\nkind = \"ec2\"\nregion = \"us-east-1\"\ninstance_types = [\"m5.large\"]\nzones = [\"us-east-1a\"]\npurchase_options = [\"reserved\"]\n",
            expect![[r#"error: config runway.toml: [providers.cloud]: unknown variant `reserved`, expected `spot` or `on-demand`"#]],
        );
        check(
            "[providers.local]\nkind = \"process\"\n",
            expect![[
                r#"error: [providers.local] command: a process provider needs the runner's command, e.g. ["runway", "agent", "--once"]"#
            ]],
        );
    }

    #[test]
    fn the_effective_configuration_reads_back_as_itself() {
        // One schema: what `config check` prints is a file that loads to
        // the same configuration (secrets aside, which print redacted).
        let texts = [
            include_str!("../../../../examples/runway.toml").to_owned(),
            "[providers.local]\nkind = \"process\"\ncommand = [\"runway\", \"agent\"]\nstop_grace = \"1500ms\"\n\
             [providers.garm]\nkind = \"exec\"\nexecutable = \"/usr/bin/garm-provider\"\ninterface_version = \"v0.1.0\"\n\
             environment_variables = [\"AWS_\"]\n[[pools]]\nname = \"p\"\nlabels = [\"x\"]\npolicy = \"predictive\"\n"
                .to_owned(),
            "[providers.aws]\nkind = \"ec2\"\nregion = \"eu-west-1\"\nendpoint_url = \"http://127.0.0.1:5000\"\n\
             instance_types = [\"m5.large\", \"c6i.xlarge\"]\nzones = [\"eu-west-1a\"]\npurchase_options = [\"spot\"]\n\
             on_demand_prices = { \"m5.large\" = 0.107 }\nspot_price_refresh = \"2m\"\nboot_command = \"runway agent\"\n"
                .to_owned(),
        ];
        for text in texts {
            let config = Config::parse(&text, "t", None).expect("parses");
            let printed = config.to_redacted_toml();
            let again = Config::parse(&printed, "printed", None).expect("printed form parses");
            assert_eq!(again, config, "{printed}");
        }
    }

    #[test]
    fn semantic_errors_name_the_key() {
        check(
            "[[pools]]\nname = \"a\"\nlabels = [\"x\"]\n[[pools]]\nname = \"A\"\nlabels = [\"y\"]\n",
            expect![[r#"error: pools[1].name: duplicate pool name "A""#]],
        );
        check(
            "[[pools]]\nname = \"a\"\nlabels = []\n",
            expect![[r#"error: pools[0].labels: a pool must serve at least one label"#]],
        );
        check(
            "[[pools]]\nname = \"a\"\nlabels = [\"x\"]\n[pools.access]\nrepositories = [\"octo-org/*\", \"octo-org\"]\n",
            expect![[r#"error: pools[0].access.repositories[1]: "octo-org" is not a valid pattern: it must be owner/name (one `/`; globs allowed on each side)"#]],
        );
        check(
            "[[pools]]\nname = \"a\"\nlabels = [\"x\"]\n[pools.access]\nevents = [\"Push\"]\n",
            expect![[
                r#"error: pools[0].access.events[0]: "Push" is not an event name (lowercase letters and `_`)"#
            ]],
        );
        check(
            "[[pools]]\nname = \"a\"\nlabels = [\"x\"]\n[pools.share]\nweights = { \"octo-org/*\" = 0 }\n",
            expect![[r#"error: pools[0].share.weights."octo-org/*": 0 is not a weight (a number above 0 and at most 1000000)"#]],
        );
        check(
            "[[pools]]\nname = \"a\"\nlabels = [\"x\"]\n[pools.share]\nweights = { \"octo-org/[\" = 2 }\n",
            expect![[r#"error: pools[0].share.weights."octo-org/[": unclosed character class; missing ']'"#]],
        );
        check(
            "[[pools]]\nname = \"a\"\nlabels = [\"x\"]\n[pools.share]\nmax_running = 0\n",
            expect![
                "error: pools[0].share.max_running: must be at least 1 (leave it out for no cap)"
            ],
        );
        check(
            "[[pools]]\nname = \"a\"\nlabels = [\"x\"]\n[pools.share]\nweight = 2\n",
            expect!["error: config runway.toml: [pools.share] weight (line 5, column 1): unknown field `weight`, expected `weights` or `max_running`"],
        );
        let token = |extra: &str| {
            format!("[server]\n{extra}[[server.tokens]]\nname = \"t\"\ntoken = \"0123456789abcdefgh\"\n")
        };
        check(
            &(token("") + "role = \"superuser\"\n"),
            expect!["error: config runway.toml: [[server.tokens]] role (line 5, column 8): unknown variant `superuser`, expected one of `read`, `operate`, `admin`"],
        );
        check(
            &(token("") + "role = \"read\"\npools = [\"nope-*\"]\n"),
            expect![[r#"error: [server] tokens[0].pools[0]: "nope-*" names no configured pool"#]],
        );
        check(
            &(token("") + "role = \"read\"\npools = [\"[\"]\n"),
            expect![[
                r#"error: [server] tokens[0].pools[0]: "[" is not a valid glob: unclosed character class; missing ']'"#
            ]],
        );
        check(
            &(token("") + "role = \"read\"\npools = []\n"),
            expect!["error: [server] tokens[0].pools: covers no pool; leave it out for every pool"],
        );
        check(
            &(token("admin_tokens = [\"0123456789abcdefgh\"]\n") + "role = \"read\"\n"),
            expect!["error: [server] tokens: the same token appears twice (admin_tokens, read_tokens, tokens): each must be distinct"],
        );
        check(
            "[[pools]]\nname = \"a\"\nlabels = [\"x\"]\n[pools.access]\nforks = \"maybe\"\n",
            expect!["error: config runway.toml: [pools.access] forks (line 5, column 9): unknown variant `maybe`, expected `allow` or `deny`"],
        );
        check(
            "[server]\ndatabase = \"mysql://x\"\n",
            expect![[
                r#"error: [server] database: unsupported database URL scheme "mysql"; use sqlite://PATH or postgres://USER@HOST/DB"#
            ]],
        );
        check(
            "[[pools]]\nname = \"a\"\nlabels = [\"x\"]\npolicy = \"predictive\"\nwait_value = 0\n",
            expect![[
                r#"error: config runway.toml: pools[0].wait_value: 0 is not a positive number (minutes of a runner a minute of waiting is worth)"#
            ]],
        );
        check(
            "[providers.external]\nkind = \"sim\"\n",
            expect!["error: [providers.external]: this name is reserved (runway marks runners that registered themselves or that it only heard of this way); choose another"],
        );
    }

    #[test]
    fn scale_set_settings_parse_and_their_errors_name_the_key() {
        let pool = |name: &str, github: &str| {
            format!("[[pools]]\nname = \"{name}\"\nlabels = [\"self-hosted\"]\n[pools.github]\n{github}")
        };
        check(
            &format!(
                "[github]\ntoken = \"t\"\n{}[pools.access]\nforks = \"deny\"\n",
                pool("a", "org = \"o\"\nscale_set = \"s\"\n")
            ),
            expect!["error: pools[0].access: access policies judge webhook-fed GitHub pools; a scale-set pool's jobs come from its scale set's queue and are not judged yet — restrict the scale set's runner group at GitHub instead"],
        );
        let parsed = Config::parse(
            &format!(
                "[github]\ntoken = \"t\"\n{}",
                pool(
                    "ss",
                    "enterprise = \"acme-corp\"\nscale_set = \"linux-large\"\nrunner_group = \"ci\"\n"
                )
            ),
            "runway.toml",
            None,
        )
        .unwrap();
        parsed.validate().unwrap();
        assert_eq!(
            parsed.pools[0].github,
            Some(PoolGithub {
                target: crate::config::Target::Enterprise("acme-corp".into()),
                runner_group_id: 1,
                scale_set: Some("linux-large".into()),
                runner_group: Some("ci".into()),
            })
        );
        let text = parsed.to_redacted_toml();
        assert!(text.contains("scale_set = \"linux-large\""), "{text}");
        assert!(text.contains("enterprise = \"acme-corp\""), "{text}");
        check(
            &format!("[github]\ntoken = \"t\"\n{}", pool("a", "org = \"o\"\nrunner_group = \"ci\"\n")),
            expect!["error: config runway.toml: [pools.github] (line 6, column 1): runner_group: names a scale set's runner group; without scale_set use runner_group_id"],
        );
        check(
            &format!(
                "[github]\ntoken = \"t\"\n{}",
                pool("a", "org = \"o\"\nscale_set = \"a/b\"\n")
            ),
            expect![[
                r#"error: config runway.toml: [pools.github] (line 6, column 1): scale_set: at most 45 characters, without "/" or ",""#
            ]],
        );
        check(
            &format!(
                "[github]\ntoken = \"t\"\n{}{}",
                pool("a", "org = \"o\"\nscale_set = \"x\"\n"),
                pool("b", "org = \"o\"\nscale_set = \"x\"\n")
            ),
            expect![[
                r#"error: pools[1].github.scale_set: "x" is already pool "a"'s scale set: a scale set has one session, so one pool"#
            ]],
        );
        check(
            &pool("a", "org = \"o\"\nscale_set = \"x\"\n"),
            expect!["error: pools[0].github: a GitHub pool needs [github] token or App credentials (app_id, private_key, installation_id)"],
        );
    }

    #[test]
    fn github_settings_parse_and_their_errors_name_the_key() {
        let pool = "[[pools]]\nname = \"gh\"\nlabels = [\"self-hosted\"]\n";
        let parsed = Config::parse(
            &format!(
                "[github]\napi_url = \"https://ghe.example.com/api/v3/\"\ntoken = \"ghp_x\"\n\
                 recheck_after = \"2m\"\ndeliveries = \"repos/o/r/hooks/7\"\n\
                 {pool}[pools.github]\nrepo = \"o/r\"\nrunner_group_id = 3\n"
            ),
            "runway.toml",
            None,
        )
        .unwrap();
        parsed.validate().unwrap();
        assert_eq!(parsed.github.api_url, "https://ghe.example.com/api/v3");
        assert_eq!(parsed.github.recheck_after, Duration::from_secs(120));
        assert_eq!(parsed.github.redeliver_interval, Duration::from_secs(300));
        assert_eq!(parsed.github.max_requests_per_hour, 3000);
        assert_eq!(
            parsed.github.deliveries.as_ref().map(ToString::to_string),
            Some("repos/o/r/hooks/7".to_owned())
        );
        assert_eq!(
            parsed.pools[0].github,
            Some(PoolGithub {
                target: crate::config::Target::Repo {
                    owner: "o".into(),
                    name: "r".into()
                },
                runner_group_id: 3,
                scale_set: None,
                runner_group: None,
            })
        );
        let text = parsed.to_redacted_toml();
        assert!(text.contains("token = \"***\""), "{text}");
        assert!(!text.contains("ghp_x"));
        check(
            &format!("{pool}[pools.github]\norg = \"acme\"\n"),
            expect!["error: pools[0].github: a GitHub pool needs [github] token or App credentials (app_id, private_key, installation_id)"],
        );
        check(
            &format!(
                "[github]\ntoken = \"t\"\n{pool}[pools.github]\norg = \"a\"\nrepo = \"b/c\"\n"
            ),
            expect!["error: config runway.toml: [pools.github] (line 6, column 1): org: give one of org, repo and enterprise"],
        );
        check(
            &format!("[github]\ntoken = \"t\"\n{pool}[pools.github]\nrepo = \"just-a-name\"\n"),
            expect![[
                r#"error: config runway.toml: [pools.github] (line 6, column 1): repo: "just-a-name" is not owner/name"#
            ]],
        );
        check(
            &format!("[github]\ntoken = \"t\"\n{pool}ephemeral = false\n[pools.github]\norg = \"a\"\n"),
            expect!["error: pools[0].ephemeral: a GitHub pool's runners are just-in-time runners, one job each: ephemeral must be true"],
        );
        check(
            "[github]\napp_id = 1\ninstallation_id = 2\n",
            expect!["error: config runway.toml: [github] private_key: missing: authenticating as a GitHub App needs app_id, private_key and installation_id"],
        );
        check(
            "[github]\ntoken = \"t\"\napp_id = 1\n",
            expect!["error: config runway.toml: [github] token: give either token or the App's app_id, private_key and installation_id, not both"],
        );
        check(
            "[github]\napp_id = 1\nprivate_key = \"not a key\"\ninstallation_id = 2\n",
            expect!["error: [github] private_key: not an RSA private key in PEM form (InvalidKeyFormat)"],
        );
        check(
            "[github]\ntoken = \"t\"\ndeliveries = \"app\"\n",
            expect![[
                r#"error: [github] deliveries: "app" (the App's webhook) needs App credentials (app_id, private_key, installation_id)"#
            ]],
        );
        check(
            "[github]\ntoken = \"t\"\ndeliveries = \"orgs/acme/hooks/x\"\n",
            expect![[
                r#"error: config runway.toml: [github] deliveries (line 3, column 14): "x" is not a hook id"#
            ]],
        );
        check(
            "[github]\napi_url = \"api.github.com\"\n",
            expect![[
                r#"error: config runway.toml: [github] api_url: "api.github.com" is not an http:// or https:// URL"#
            ]],
        );
    }

    #[test]
    fn secrets_resolve_and_never_print() {
        std::env::set_var(
            "RUNWAY_CONFIG_TEST_DB",
            "postgres://runway:hunter2@db/runway",
        );
        check(
            "[server]\ndatabase = \"env:RUNWAY_CONFIG_TEST_DB\"\n[[pools]]\nname = \"p\"\nlabels = [\"self-hosted\"]\n",
            expect![[r#"
                [server]
                listen = "127.0.0.1:8080"
                database = "env:RUNWAY_CONFIG_TEST_DB"
                database_max_connections = 16
                admin_tokens = []
                read_tokens = []

                [queue]
                max_attempts = 3

                [github]
                webhook_secrets = []
                required_labels = ["self-hosted"]
                max_body_bytes = 26214400
                api_url = "https://api.github.com"
                max_requests_per_hour = 3000
                recheck_after = "300s"
                redeliver_interval = "300s"

                [routing]

                [runner_api]
                poll_timeout = "30s"
                lease = "120s"

                [retention]
                finished_jobs = "30d"
                ended_runners = "7d"
                deliveries = "7d"
                job_logs = "7d"
                runner_reports = "7d"
                audit = "90d"
                pool_history = "8d"
                interval = "600s"
                batch = 1000

                [scaling]
                interval = "10s"

                [telemetry]
                event_log_max_bytes = 104857600
                event_log_keep = 5

                [metrics]
                job_labels = ["repo", "workflow", "event"]

                [[pools]]
                name = "p"
                labels = ["self-hosted"]
                min_idle = 0
                max_runners = 10
                scaling_ratio = 1.0
                idle_grace = "300s"
                boot_timeout = "600s"
                providers = []
                surplus_boots = "keep"
                ephemeral = true
                policy = "runway"
                wait_value = 1.75
            "#]],
        );
        let config = Config::parse(
            "[server]\ndatabase = \"env:RUNWAY_CONFIG_TEST_DB\"\n",
            "t",
            None,
        )
        .unwrap();
        assert_eq!(
            config.server.database.expose(),
            "postgres://runway:hunter2@db/runway"
        );
        assert!(!format!("{config:?}").contains("hunter2"));
        let literal = Secret::literal("postgres://runway:hunter2@db/runway");
        assert_eq!(literal.to_string(), "postgres://runway:***@db/runway");
        check(
            "[server]\ndatabase = \"env:RUNWAY_CONFIG_TEST_UNSET\"\n",
            expect![[
                r#"error: config runway.toml: [server] database: environment variable RUNWAY_CONFIG_TEST_UNSET is not set"#
            ]],
        );
    }
}
