//! runway's configuration: one TOML file (documented in
//! `examples/runway.toml`), built-in defaults for everything, and command-line
//! overrides for the listen address and the database.
//!
//! Secrets (the database URL can carry a password) may be written
//! `env:NAME` or `file:PATH`; they are resolved at load time and never
//! printed or logged: [`Secret`]'s `Debug` and `Display` show only where the
//! value came from.

pub mod github;
pub mod worker_config;

pub use github::{Hook, Target};

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use runway_core::routing::{route, PoolLabels, RouteDecision, RoutingPolicy};
use runway_core::worker_config::{ProviderSchema, Schemas, WorkerConfig};
use runway_providers::exec::InterfaceVersion;
use runway_providers::factory::{ProviderKind, ProviderSpec};
use serde::{Deserialize, Serialize};

use crate::config::worker_config::WorkerConfigDto;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
pub const DEFAULT_DATABASE: &str = "sqlite://runway.db";
pub const DEFAULT_GITHUB_API: &str = "https://api.github.com";

/// A configuration that was read, resolved and validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub server: ServerConfig,
    pub queue: QueueConfig,
    pub github: GithubConfig,
    pub routing: RoutingConfig,
    pub runner_api: RunnerApiConfig,
    /// How often the reconciler runs (it also runs when a job arrives).
    pub scaling_interval: Duration,
    pub pools: Vec<PoolConfig>,
    /// Providers by name, in name order.
    pub providers: Vec<ProviderConfig>,
    /// Worker configurations given in the file (written to the store at start-up).
    pub worker_configs: Vec<WorkerConfig>,
    /// The `[[worker_configs]]` entries as written, for `config check`.
    pub worker_config_sources: Vec<toml::Value>,
    pub telemetry: TelemetryConfig,
    pub retention: RetentionConfig,
    /// `[metrics] job_labels`: which of `repo`, `workflow`, `event` job
    /// metrics carry (each can multiply the series count).
    pub metrics_job_labels: Vec<String>,
}

/// The job labels metrics may carry.
pub const JOB_LABELS: [&str; 3] = ["repo", "workflow", "event"];

/// `[telemetry]`: the JSON event log.
#[derive(Debug, Clone, PartialEq)]
pub struct TelemetryConfig {
    /// A file path, `-` for standard output, or none (no event log).
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

/// A provider declaration: how runners are started (its `kind` and that
/// kind's keys), what capacity it offers the planner (`max_instances`,
/// `price_per_hour`, `boot_seconds`), and what worker configurations for it
/// may say (its own condition names) and must contain (required keys).
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderConfig {
    pub name: String,
    pub kind: String,
    pub conditions: Vec<String>,
    pub required_keys: Vec<String>,
    /// Most instances at once through this provider.
    pub max_instances: u32,
    pub price_per_hour: f64,
    /// Boot time, uniform between the two (equal for a fixed time): what
    /// `sim` instances take, and what the others' bids say to expect.
    pub boot_seconds: (f64, f64),
    /// `sim`: probability that a create fails.
    pub fail_rate: f64,
    /// `sim`: seed of its randomness.
    pub seed: u64,
    /// `process`: the runner's program and arguments. A first element
    /// `runway` means this very binary.
    pub command: Vec<String>,
    /// `process`: where runner processes are tracked (default
    /// `runway-processes/NAME` in the working directory).
    pub state_dir: Option<PathBuf>,
    /// `process`: between SIGTERM and SIGKILL when a runner is deleted.
    pub stop_grace: Duration,
    /// `exec`: the GARM external provider executable.
    pub executable: Option<PathBuf>,
    /// `exec`: passed to it as `GARM_PROVIDER_CONFIG_FILE`.
    pub config_file: Option<PathBuf>,
    /// `exec`: the longest one call of the executable may take.
    pub timeout: Duration,
    /// `exec`: the GARM external provider interface it speaks (`v0.1.0` or
    /// `v0.1.1`, GARM's `interface_version`).
    pub interface_version: InterfaceVersion,
    /// `process`, `exec`: host environment variables (names, or prefixes
    /// such as `"AWS_"`) the child may inherit besides the base (`PATH`,
    /// `HOME`, `LANG`, `TMPDIR`, the proxy variables). Nothing else of
    /// runway's environment reaches it; `RUNWAY_*` and `GARM_*` never do.
    pub environment_variables: Vec<String>,
}

impl ProviderConfig {
    /// The defaults of a provider of `kind`: a simulated cloud boots in
    /// minutes and costs money; a local process starts in a second, free.
    pub fn for_kind(name: &str, kind: &str) -> ProviderConfig {
        let local = kind == "process";
        ProviderConfig {
            name: name.to_owned(),
            kind: kind.to_owned(),
            conditions: Vec::new(),
            required_keys: Vec::new(),
            max_instances: if local { 4 } else { 100 },
            price_per_hour: if local { 0.0 } else { 0.10 },
            boot_seconds: if local { (1.0, 1.0) } else { (120.0, 180.0) },
            fail_rate: 0.0,
            seed: 0,
            command: Vec::new(),
            state_dir: None,
            stop_grace: Duration::from_secs(10),
            executable: None,
            config_file: None,
            timeout: Duration::from_secs(120),
            interface_version: InterfaceVersion::default(),
            environment_variables: Vec::new(),
        }
    }
}

impl ProviderConfig {
    /// Its typed declaration, for `runway_providers::factory::build`; `pools`
    /// are the pools that may use it. `None` for a kind runway does not
    /// have, or an `exec` provider without its executable (validation
    /// refuses both).
    pub fn spec(&self, pools: Vec<String>) -> Option<ProviderSpec> {
        let kind = match self.kind.as_str() {
            "sim" => ProviderKind::Sim {
                fail_rate: self.fail_rate,
                seed: self.seed,
            },
            "process" => ProviderKind::Process {
                command: self.command.clone(),
                state_dir: self.state_dir.clone(),
                stop_grace: self.stop_grace,
            },
            "exec" => ProviderKind::Exec {
                executable: self.executable.clone()?,
                config_file: self.config_file.clone(),
                timeout: self.timeout,
                interface_version: self.interface_version,
            },
            _ => return None,
        };
        Some(ProviderSpec {
            name: self.name.clone(),
            kind,
            max_instances: self.max_instances,
            price_per_hour: self.price_per_hour,
            boot_seconds: self.boot_seconds,
            environment_variables: self.environment_variables.clone(),
            pools,
        })
    }
}

impl Default for ProviderConfig {
    fn default() -> ProviderConfig {
        ProviderConfig::for_kind("sim", "sim")
    }
}

pub const PROVIDER_KINDS: [&str; 3] = ProviderKind::NAMES;

#[derive(Debug, Clone, PartialEq)]
pub struct GithubConfig {
    /// Secrets a webhook signature may be made with; several, so a secret
    /// can be rotated without downtime. None configured: webhooks are refused.
    pub webhook_secrets: Vec<Secret>,
    /// Jobs lacking any of these labels are GitHub-hosted and ignored.
    pub required_labels: Vec<String>,
    /// Larger webhook bodies are refused with 413 (GitHub's own cap is 25 MiB).
    pub max_body_bytes: usize,
    /// The REST API's root: `https://api.github.com`, or a GitHub
    /// Enterprise Server's `https://HOST/api/v3`.
    pub api_url: String,
    /// How runway authenticates to the API; none: GitHub pools are refused
    /// and no re-checks or redeliveries happen.
    pub auth: Option<GithubAuth>,
    /// Runway's own cap on API requests per hour, below GitHub's.
    pub max_requests_per_hour: u32,
    /// A GitHub job queued this long is looked up in case its webhook was lost.
    pub recheck_after: Duration,
    /// How often failed webhook deliveries are listed and redelivered.
    pub redeliver_interval: Duration,
    /// Whose webhook deliveries to heal; default: the App's when
    /// authenticating as an App, none otherwise.
    pub deliveries: Option<crate::config::Hook>,
}

/// `[github] token`, or `app_id` + `private_key` + `installation_id`.
#[derive(Debug, Clone, PartialEq)]
pub enum GithubAuth {
    Token(Secret),
    App {
        app_id: u64,
        /// The App's PEM private key (RS256).
        private_key: Secret,
        installation_id: u64,
    },
}

/// `[pools.github]`: where a GitHub pool's runners register.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolGithub {
    pub target: crate::config::Target,
    /// The runner group new runners join (1: the default group).
    pub runner_group_id: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RoutingConfig {
    /// Preferred among several pools that can serve a job.
    pub default_pool: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub database: Secret,
    /// PostgreSQL connection pool size.
    pub database_max_connections: u32,
    /// Bearer tokens for the admin API (read and write).
    pub admin_tokens: Vec<Secret>,
    /// Bearer tokens that may only read the admin API.
    pub read_tokens: Vec<Secret>,
    /// The URL runners reach this server at (`RUNWAY_URL` of the runners
    /// runway starts). Default: `http://` and the listening address, with
    /// an unspecified address (0.0.0.0, ::) as loopback.
    pub public_url: Option<String>,
}

/// `[retention]`: how long finished history is kept. Zero keeps forever.
/// Live work (queued, provisioning, running jobs; live runners) is never
/// pruned.
#[derive(Debug, Clone, PartialEq)]
pub struct RetentionConfig {
    /// Completed, failed, cancelled and unroutable jobs, from when they
    /// finished; at least [`MIN_DEDUPE_RETENTION`] (their rows dedupe a
    /// redelivered webhook).
    pub finished_jobs: Duration,
    /// Terminated, failed and crashed runners (with their reports).
    pub ended_runners: Duration,
    /// Webhook deliveries (and once-keys); at least
    /// [`MIN_DEDUPE_RETENTION`].
    pub deliveries: Duration,
    /// Finished jobs' output.
    pub job_logs: Duration,
    /// What runners and their machines reported.
    pub runner_reports: Duration,
    /// Between two pruning passes (leader only).
    pub interval: Duration,
    /// Rows deleted per statement: each is a short transaction, so intake
    /// never waits long behind the pruner.
    pub batch: u32,
}

/// GitHub redelivers a webhook for three days; a finished job's row and
/// its delivery's are what make a late redelivery a duplicate, so neither
/// is pruned sooner than this.
pub const MIN_DEDUPE_RETENTION: Duration = Duration::from_secs(4 * 24 * 3600);

#[derive(Debug, Clone, PartialEq)]
pub struct RunnerApiConfig {
    /// How long `POST /api/v1/jobs/request` waits for a job before 204.
    pub poll_timeout: Duration,
    /// How long a claim holds without a keepalive or heartbeat.
    pub lease: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    /// A job whose lease expires this many times fails instead of requeueing.
    pub max_attempts: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PoolConfig {
    pub name: String,
    /// The labels the pool's runners serve; a job can go to the pool when its
    /// labels are a subset of these (compared case-insensitively).
    pub labels: Vec<String>,
    pub min_idle: u32,
    pub max_runners: u32,
    /// Runners wanted per queued job (1.0: one each; 0.5: one per two).
    pub scaling_ratio: f64,
    /// An idle runner beyond demand is removed only after idling this long.
    pub idle_grace: Duration,
    /// A runner not ready this long after it was requested is failed and replaced.
    pub boot_timeout: Duration,
    /// Providers this pool may use, in preference order (empty: any).
    pub providers: Vec<String>,
    /// One job per runner.
    pub ephemeral: bool,
    /// `runway` (keep `min_idle` warm) or `predictive` (keep warm as many
    /// runners as the arrivals expected within one boot time, at
    /// `forecast_quantile`; never fewer than `min_idle`). docs/sim.md.
    pub policy: ScalingPolicy,
    /// A GitHub pool: its runners are just-in-time GitHub runners and are
    /// deregistered before their machine is deleted.
    pub github: Option<PoolGithub>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScalingPolicy {
    Runway,
    Predictive { quantile: f64 },
}

impl ScalingPolicy {
    fn parse(name: &str, quantile: Option<f64>) -> Result<ScalingPolicy, String> {
        let quantile = quantile.unwrap_or(0.9);
        if !(quantile > 0.0 && quantile <= 1.0) {
            return Err(format!(
                "forecast_quantile {quantile} is not above 0 and at most 1"
            ));
        }
        match name {
            "runway" => Ok(ScalingPolicy::Runway),
            "predictive" => Ok(ScalingPolicy::Predictive { quantile }),
            other => Err(format!("{other:?} is not one of runway, predictive")),
        }
    }
}

impl Default for PoolConfig {
    fn default() -> PoolConfig {
        PoolConfig {
            name: "default".to_owned(),
            labels: vec![
                "self-hosted".to_owned(),
                "linux".to_owned(),
                "x64".to_owned(),
            ],
            min_idle: 0,
            max_runners: 10,
            scaling_ratio: 1.0,
            idle_grace: Duration::from_secs(300),
            boot_timeout: Duration::from_secs(600),
            providers: Vec::new(),
            ephemeral: true,
            policy: ScalingPolicy::Runway,
            github: None,
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
            server: ServerConfig {
                listen: DEFAULT_LISTEN
                    .parse()
                    .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 8080))),
                database: Secret::literal(DEFAULT_DATABASE),
                database_max_connections: 16,
                admin_tokens: Vec::new(),
                read_tokens: Vec::new(),
                public_url: None,
            },
            runner_api: RunnerApiConfig {
                poll_timeout: Duration::from_secs(30),
                lease: Duration::from_secs(120),
            },
            retention: RetentionConfig {
                finished_jobs: Duration::from_secs(30 * 24 * 3600),
                ended_runners: Duration::from_secs(7 * 24 * 3600),
                deliveries: Duration::from_secs(7 * 24 * 3600),
                job_logs: Duration::from_secs(7 * 24 * 3600),
                runner_reports: Duration::from_secs(7 * 24 * 3600),
                interval: Duration::from_secs(600),
                batch: 1_000,
            },
            queue: QueueConfig { max_attempts: 3 },
            github: GithubConfig {
                webhook_secrets: Vec::new(),
                required_labels: vec!["self-hosted".to_owned()],
                max_body_bytes: 25 * 1024 * 1024,
                api_url: DEFAULT_GITHUB_API.to_owned(),
                auth: None,
                max_requests_per_hour: 3000,
                recheck_after: Duration::from_secs(300),
                redeliver_interval: Duration::from_secs(300),
                deliveries: None,
            },
            routing: RoutingConfig { default_pool: None },
            scaling_interval: Duration::from_secs(10),
            providers: Vec::new(),
            worker_configs: Vec::new(),
            worker_config_sources: Vec::new(),
            pools: vec![PoolConfig::default()],
            telemetry: TelemetryConfig::default(),
            metrics_job_labels: JOB_LABELS.iter().map(|l| l.to_string()).collect(),
        }
    }
}

impl ServerConfig {
    /// Where runners reach this server, given the address it listens on.
    pub fn runner_url(&self, bound: SocketAddr) -> String {
        if let Some(url) = &self.public_url {
            return url.clone();
        }
        let mut address = bound;
        if address.ip().is_unspecified() {
            address.set_ip(if address.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        format!("http://{address}")
    }
}

impl Config {
    /// What `runway serve` runs without a config file: one pool `local`
    /// (labels `local`, `linux`) whose runners are `runway agent --once`
    /// processes on this machine, at most two at a time.
    pub fn out_of_the_box() -> Config {
        let mut provider = ProviderConfig::for_kind("local", "process");
        provider.command = vec!["runway".into(), "agent".into(), "--once".into()];
        provider.max_instances = 2;
        Config {
            pools: vec![PoolConfig {
                name: "local".to_owned(),
                labels: vec!["local".to_owned(), "linux".to_owned()],
                min_idle: 0,
                max_runners: 2,
                boot_timeout: Duration::from_secs(60),
                providers: vec!["local".to_owned()],
                ..PoolConfig::default()
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
    /// The environment variables the secrets of this configuration were
    /// read from (`env:NAME`). `runway serve` removes them from its own
    /// environment once loaded, so nothing it starts can inherit them.
    pub fn secret_environment_variables(&self) -> Vec<String> {
        let github = match &self.github.auth {
            Some(GithubAuth::Token(token)) => Some(token),
            Some(GithubAuth::App { private_key, .. }) => Some(private_key),
            None => None,
        };
        let mut names: Vec<String> = std::iter::once(&self.server.database)
            .chain(&self.server.admin_tokens)
            .chain(&self.server.read_tokens)
            .chain(&self.github.webhook_secrets)
            .chain(github)
            .filter_map(|secret| secret.environment_variable().map(str::to_owned))
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
    /// relative `file:` secrets are looked up (the config file's directory).
    pub fn parse(text: &str, origin: &str, base: Option<&Path>) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Invalid {
            origin: origin.to_owned(),
            location: describe_location(text, e.span()),
            message: one_line(e.message()),
        })?;
        raw.resolve(base)
            .map_err(|(location, message)| ConfigError::Invalid {
                origin: origin.to_owned(),
                location,
                message,
            })
    }

    /// Routes `labels` to a pool; `required_labels` are those a job must
    /// carry to be ours (GitHub's `[github] required_labels`, none for API jobs).
    pub fn route(&self, labels: &[String], required_labels: &[String]) -> RouteDecision {
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
        route(labels, &pools, &policy)
    }

    /// The typed declaration of every provider, each with the pools that
    /// may use it (a pool that names no provider may use any).
    pub fn provider_specs(&self) -> Result<Vec<ProviderSpec>, String> {
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
                provider.spec(pools).ok_or_else(|| {
                    format!(
                        "[providers.{}] kind: {:?} with these settings is not a provider runway can build",
                        provider.name, provider.kind
                    )
                })
            })
            .collect()
    }

    /// What the declared providers allow worker configurations to say.
    pub fn schemas(&self) -> Schemas {
        Schemas {
            providers: self
                .providers
                .iter()
                .map(|p| ProviderSchema {
                    name: p.name.clone(),
                    conditions: p.conditions.clone(),
                    required_keys: p.required_keys.clone(),
                })
                .collect(),
        }
    }

    fn validate(&self) -> Result<(), (String, String)> {
        for provider in &self.providers {
            if runway_core::RunnerOrigin::is_reserved(&provider.name) {
                return Err((
                    format!("[providers.{}]", provider.name),
                    "this name is reserved (runway marks runners that registered themselves or that it only heard of this way); choose another".into(),
                ));
            }
            if !PROVIDER_KINDS.contains(&provider.kind.as_str()) {
                return Err((
                    format!("[providers.{}] kind", provider.name),
                    format!(
                        "{:?} is not one of {}",
                        provider.kind,
                        PROVIDER_KINDS.join(", ")
                    ),
                ));
            }
            let key = |field: &str| format!("[providers.{}] {field}", provider.name);
            if provider.kind == "process" && provider.command.is_empty() {
                return Err((
                    key("command"),
                    "a process provider needs the runner's command, e.g. [\"runway\", \"agent\", \"--once\"]".into(),
                ));
            }
            if provider.kind == "exec" && provider.executable.is_none() {
                return Err((
                    key("executable"),
                    "an exec provider needs the path of a GARM external provider executable".into(),
                ));
            }
            if provider.kind == "process" && provider.max_instances == 0 {
                return Err((key("max_instances"), "must be at least 1".into()));
            }
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
        if self.server.database_max_connections == 0 {
            return Err((
                "[server] database_max_connections".into(),
                "must be at least 1".into(),
            ));
        }
        if self.queue.max_attempts == 0 {
            return Err(("[queue] max_attempts".into(), "must be at least 1".into()));
        }
        if self.github.max_body_bytes == 0 {
            return Err((
                "[github] max_body_bytes".into(),
                "must be at least 1".into(),
            ));
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
        if self.github.max_requests_per_hour == 0 {
            return Err((
                "[github] max_requests_per_hour".into(),
                "must be at least 1".into(),
            ));
        }
        if let Some(GithubAuth::Token(token)) = &self.github.auth {
            if token.expose().trim().is_empty() {
                return Err(("[github] token".into(), "is empty".into()));
            }
        }
        if let Some(GithubAuth::App { private_key, .. }) = &self.github.auth {
            jsonwebtoken::EncodingKey::from_rsa_pem(private_key.expose().as_bytes()).map_err(
                |e| {
                    (
                        "[github] private_key".to_owned(),
                        format!("not an RSA private key in PEM form ({e})"),
                    )
                },
            )?;
        }
        if self.github.deliveries.is_some() && self.github.auth.is_none() {
            return Err((
                "[github] deliveries".into(),
                "redelivering webhooks needs [github] token or App credentials".into(),
            ));
        }
        if matches!(self.github.deliveries, Some(crate::config::Hook::App))
            && !matches!(self.github.auth, Some(GithubAuth::App { .. }))
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
            if pool.name.trim().is_empty() {
                return Err((key("name"), "must not be empty".into()));
            }
            if !pool
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err((
                    key("name"),
                    format!(
                        "{:?} may only contain letters, digits, '-' and '_'",
                        pool.name
                    ),
                ));
            }
            if !names.insert(pool.name.to_lowercase()) {
                return Err((key("name"), format!("duplicate pool name {:?}", pool.name)));
            }
            if pool.labels.is_empty() {
                return Err((key("labels"), "a pool must serve at least one label".into()));
            }
            if let Some(label) = pool.labels.iter().find(|l| l.trim().is_empty()) {
                return Err((key("labels"), format!("empty label {label:?}")));
            }
            if !(pool.scaling_ratio.is_finite()
                && pool.scaling_ratio > 0.0
                && pool.scaling_ratio <= 100.0)
            {
                return Err((
                    key("scaling_ratio"),
                    format!(
                        "{} is not a number above 0 and at most 100",
                        pool.scaling_ratio
                    ),
                ));
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
            if pool.github.is_some() && self.github.auth.is_none() {
                return Err((
                    key("github"),
                    "a GitHub pool needs [github] token or App credentials (app_id, private_key, installation_id)".into(),
                ));
            }
            if pool.max_runners < pool.min_idle {
                return Err((
                    key("max_runners"),
                    format!(
                        "max_runners ({}) is below min_idle ({})",
                        pool.max_runners, pool.min_idle
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The effective configuration as TOML, with secrets shown only by
    /// where they come from.
    pub fn to_redacted_toml(&self) -> String {
        let raw = RawConfig {
            server: RawServer {
                listen: Some(self.server.listen.to_string()),
                database: Some(self.server.database.redacted()),
                database_max_connections: Some(self.server.database_max_connections),
                admin_tokens: Some(
                    self.server
                        .admin_tokens
                        .iter()
                        .map(Secret::redacted)
                        .collect(),
                ),
                read_tokens: Some(
                    self.server
                        .read_tokens
                        .iter()
                        .map(Secret::redacted)
                        .collect(),
                ),
                public_url: self.server.public_url.clone(),
            },
            runner_api: RawRunnerApi {
                poll_timeout: Some(format_duration(self.runner_api.poll_timeout)),
                lease: Some(format_duration(self.runner_api.lease)),
            },
            retention: RawRetention {
                finished_jobs: Some(format_duration(self.retention.finished_jobs)),
                ended_runners: Some(format_duration(self.retention.ended_runners)),
                deliveries: Some(format_duration(self.retention.deliveries)),
                job_logs: Some(format_duration(self.retention.job_logs)),
                runner_reports: Some(format_duration(self.retention.runner_reports)),
                interval: Some(format_duration(self.retention.interval)),
                batch: Some(self.retention.batch),
            },
            scaling: RawScaling {
                interval: Some(format_duration(self.scaling_interval)),
            },
            metrics: RawMetrics {
                job_labels: Some(self.metrics_job_labels.clone()),
            },
            telemetry: RawTelemetry {
                event_log: self.telemetry.event_log.clone(),
                event_log_max_bytes: Some(self.telemetry.event_log_max_bytes),
                event_log_keep: Some(self.telemetry.event_log_keep),
            },
            queue: RawQueue {
                max_attempts: Some(self.queue.max_attempts),
            },
            github: RawGithub {
                webhook_secrets: Some(
                    self.github
                        .webhook_secrets
                        .iter()
                        .map(Secret::redacted)
                        .collect(),
                ),
                required_labels: Some(self.github.required_labels.clone()),
                max_body_bytes: Some(self.github.max_body_bytes),
                api_url: Some(self.github.api_url.clone()),
                token: match &self.github.auth {
                    Some(GithubAuth::Token(token)) => Some(token.redacted()),
                    _ => None,
                },
                app_id: match &self.github.auth {
                    Some(GithubAuth::App { app_id, .. }) => Some(*app_id),
                    _ => None,
                },
                private_key: match &self.github.auth {
                    Some(GithubAuth::App { private_key, .. }) => Some(private_key.redacted()),
                    _ => None,
                },
                installation_id: match &self.github.auth {
                    Some(GithubAuth::App {
                        installation_id, ..
                    }) => Some(*installation_id),
                    _ => None,
                },
                max_requests_per_hour: Some(self.github.max_requests_per_hour),
                recheck_after: Some(format_duration(self.github.recheck_after)),
                redeliver_interval: Some(format_duration(self.github.redeliver_interval)),
                deliveries: self.github.deliveries.as_ref().map(|h| h.to_string()),
            },
            routing: RawRouting {
                default_pool: self.routing.default_pool.clone(),
            },
            providers: (!self.providers.is_empty()).then(|| {
                let by_name: BTreeMap<String, RawProvider> = self
                    .providers
                    .iter()
                    .map(|p| {
                        let raw = RawProvider {
                            kind: p.kind.clone(),
                            conditions: p.conditions.clone(),
                            required_keys: p.required_keys.clone(),
                            max_instances: Some(p.max_instances),
                            price_per_hour: Some(p.price_per_hour),
                            boot_seconds: Some(toml::Value::Array(vec![
                                toml::Value::Float(p.boot_seconds.0),
                                toml::Value::Float(p.boot_seconds.1),
                            ])),
                            fail_rate: Some(p.fail_rate),
                            seed: Some(p.seed),
                            command: (p.kind == "process").then(|| p.command.clone()),
                            state_dir: p.state_dir.as_ref().map(|d| d.display().to_string()),
                            stop_grace: (p.kind == "process")
                                .then(|| format_duration(p.stop_grace)),
                            executable: p.executable.as_ref().map(|d| d.display().to_string()),
                            config_file: p.config_file.as_ref().map(|d| d.display().to_string()),
                            timeout: (p.kind == "exec").then(|| format_duration(p.timeout)),
                            interface_version: (p.kind == "exec")
                                .then(|| p.interface_version.as_str().to_owned()),
                            environment_variables: p.environment_variables.clone(),
                        };
                        (p.name.clone(), raw)
                    })
                    .collect();
                toml::Value::try_from(by_name).unwrap_or(toml::Value::Table(toml::Table::new()))
            }),
            worker_configs: (!self.worker_config_sources.is_empty())
                .then(|| self.worker_config_sources.clone()),
            pools: Some(
                self.pools
                    .iter()
                    .map(|p| RawPool {
                        name: p.name.clone(),
                        labels: p.labels.clone(),
                        min_idle: Some(p.min_idle),
                        max_runners: Some(p.max_runners),
                        scaling_ratio: Some(p.scaling_ratio),
                        idle_grace: Some(format_duration(p.idle_grace)),
                        boot_timeout: Some(format_duration(p.boot_timeout)),
                        providers: Some(p.providers.clone()),
                        ephemeral: Some(p.ephemeral),
                        policy: Some(
                            match p.policy {
                                ScalingPolicy::Runway => "runway",
                                ScalingPolicy::Predictive { .. } => "predictive",
                            }
                            .to_owned(),
                        ),
                        forecast_quantile: match p.policy {
                            ScalingPolicy::Predictive { quantile } => Some(quantile),
                            ScalingPolicy::Runway => None,
                        },
                        github: p.github.as_ref().map(RawPoolGithub::from_config),
                    })
                    .collect(),
            ),
        };
        toml::to_string(&raw)
            .unwrap_or_else(|e| format!("# cannot render the configuration: {e}\n"))
    }
}

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

/// Where a value came from: written in the file, or read from the
/// environment or a file at load time.
#[derive(Clone, PartialEq, Eq)]
pub enum SecretSource {
    Literal,
    Env(String),
    File(PathBuf),
}

/// A configuration value that may be secret. Its `Debug` and `Display`
/// never show the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    source: SecretSource,
    value: String,
}

impl Secret {
    pub fn literal(value: &str) -> Secret {
        Secret {
            source: SecretSource::Literal,
            value: value.to_owned(),
        }
    }

    /// `env:NAME` reads the environment variable, `file:PATH` the file
    /// (relative to `base`; one trailing newline dropped); anything else is
    /// the value itself.
    pub fn parse(written: &str, base: Option<&Path>) -> Result<Secret, String> {
        if let Some(name) = written.strip_prefix("env:") {
            let value = std::env::var(name)
                .map_err(|_| format!("environment variable {name} is not set"))?;
            return Ok(Secret {
                source: SecretSource::Env(name.to_owned()),
                value,
            });
        }
        if let Some(path) = written.strip_prefix("file:") {
            let path = match base {
                Some(base) if Path::new(path).is_relative() => base.join(path),
                _ => PathBuf::from(path),
            };
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let value = text.strip_suffix('\n').unwrap_or(&text);
            let value = value.strip_suffix('\r').unwrap_or(value).to_owned();
            return Ok(Secret {
                source: SecretSource::File(path),
                value,
            });
        }
        Ok(Secret::literal(written))
    }

    /// The environment variable it was read from (`env:NAME`), if any.
    pub fn environment_variable(&self) -> Option<&str> {
        match &self.source {
            SecretSource::Env(name) => Some(name),
            _ => None,
        }
    }

    /// The value itself. Only for handing to the code that needs it.
    pub fn expose(&self) -> &str {
        &self.value
    }

    /// Safe to print: `env:NAME`, `file:PATH`, or for a value written in the
    /// file, `***` (a URL keeps everything but its password).
    pub fn redacted(&self) -> String {
        match &self.source {
            SecretSource::Env(name) => format!("env:{name}"),
            SecretSource::File(path) => format!("file:{}", path.display()),
            // A URL keeps everything but its password; anything else is all secret.
            SecretSource::Literal if self.value.contains("://") => {
                runway_store::redact_url(&self.value)
            }
            SecretSource::Literal => "***".to_owned(),
        }
    }
}

/// A secret serialises as its [`Secret::redacted`] form: whatever carries
/// one (an API answer, a dump of the configuration, the event log) can
/// never write its value.
impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.redacted())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({})", self.redacted())
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

// The file's shape. Every field is optional so defaults fill the gaps, and
// unknown keys are errors, so a typo never silently does nothing.

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    queue: RawQueue,
    #[serde(default)]
    github: RawGithub,
    #[serde(default)]
    routing: RawRouting,
    #[serde(default)]
    runner_api: RawRunnerApi,
    #[serde(default)]
    retention: RawRetention,
    #[serde(default)]
    scaling: RawScaling,
    #[serde(default)]
    telemetry: RawTelemetry,
    #[serde(default)]
    metrics: RawMetrics,
    #[serde(skip_serializing_if = "Option::is_none")]
    pools: Option<Vec<RawPool>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    providers: Option<toml::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    worker_configs: Option<Vec<toml::Value>>,
}

/// `[providers.NAME]` tables, or a `[[providers]]` list with `name` keys.
enum RawProviders {
    ByName(BTreeMap<String, RawProvider>),
    List(Vec<toml::Table>),
}

impl RawProviders {
    fn from_toml(value: toml::Value) -> Result<RawProviders, (String, String)> {
        let problem = |e: toml::de::Error| ("providers".to_owned(), one_line(e.message()));
        match value {
            toml::Value::Array(_) => value.try_into().map(RawProviders::List).map_err(problem),
            _ => value.try_into().map(RawProviders::ByName).map_err(problem),
        }
    }

    fn into_named(self) -> Result<Vec<(String, RawProvider)>, (String, String)> {
        match self {
            RawProviders::ByName(map) => Ok(map.into_iter().collect()),
            RawProviders::List(list) => {
                let mut seen = BTreeSet::new();
                let mut named = Vec::new();
                for (i, mut entry) in list.into_iter().enumerate() {
                    let name = match entry.remove("name") {
                        Some(toml::Value::String(name)) => name,
                        _ => {
                            return Err((
                                format!("providers[{i}].name"),
                                "missing: every provider needs a name".to_owned(),
                            ))
                        }
                    };
                    if !seen.insert(name.clone()) {
                        return Err((
                            format!("providers[{i}].name"),
                            format!("duplicate provider {name:?}"),
                        ));
                    }
                    let provider: RawProvider =
                        toml::Value::Table(entry)
                            .try_into()
                            .map_err(|e: toml::de::Error| {
                                (format!("providers[{i}] ({name})"), one_line(e.message()))
                            })?;
                    named.push((name, provider));
                }
                Ok(named)
            }
        }
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawProvider {
    kind: String,
    #[serde(default)]
    conditions: Vec<String>,
    #[serde(default)]
    required_keys: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_instances: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    price_per_hour: Option<f64>,
    /// A number, or `[min, max]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    boot_seconds: Option<toml::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fail_rate: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    command: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    state_dir: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_grace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    executable: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    config_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    interface_version: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    environment_variables: Vec<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: Option<String>,
    database: Option<String>,
    database_max_connections: Option<u32>,
    admin_tokens: Option<Vec<String>>,
    read_tokens: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    public_url: Option<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    job_labels: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawTelemetry {
    #[serde(skip_serializing_if = "Option::is_none")]
    event_log: Option<String>,
    event_log_max_bytes: Option<u64>,
    event_log_keep: Option<u32>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawScaling {
    interval: Option<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawRetention {
    finished_jobs: Option<String>,
    ended_runners: Option<String>,
    deliveries: Option<String>,
    job_logs: Option<String>,
    runner_reports: Option<String>,
    interval: Option<String>,
    batch: Option<u32>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawRunnerApi {
    poll_timeout: Option<String>,
    lease: Option<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawGithub {
    webhook_secrets: Option<Vec<String>>,
    required_labels: Option<Vec<String>>,
    max_body_bytes: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    api_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    app_id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    private_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    installation_id: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_requests_per_hour: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    recheck_after: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    redeliver_interval: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deliveries: Option<String>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawPoolGithub {
    #[serde(skip_serializing_if = "Option::is_none")]
    org: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    repo: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    runner_group_id: Option<u64>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawRouting {
    #[serde(skip_serializing_if = "Option::is_none")]
    default_pool: Option<String>,
}

#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawQueue {
    max_attempts: Option<u32>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawPool {
    name: String,
    labels: Vec<String>,
    min_idle: Option<u32>,
    max_runners: Option<u32>,
    scaling_ratio: Option<f64>,
    idle_grace: Option<String>,
    boot_timeout: Option<String>,
    providers: Option<Vec<String>>,
    ephemeral: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    forecast_quantile: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    github: Option<RawPoolGithub>,
}

impl RawConfig {
    fn resolve(self, base: Option<&Path>) -> Result<Config, (String, String)> {
        let defaults = Config::default();
        let listen = match self.server.listen {
            None => defaults.server.listen,
            Some(text) => text.parse().map_err(|_| {
                (
                    "[server] listen".to_owned(),
                    format!("{text:?} is not an address like 127.0.0.1:8080 or [::1]:8080"),
                )
            })?,
        };
        let database = match self.server.database {
            None => defaults.server.database,
            Some(text) => {
                Secret::parse(&text, base).map_err(|m| ("[server] database".to_owned(), m))?
            }
        };
        let pools = match self.pools {
            None => defaults.pools,
            Some(pools) => pools
                .into_iter()
                .enumerate()
                .map(|(i, p)| {
                    let base = PoolConfig::default();
                    let key = |field: &str| format!("pools[{i}].{field}");
                    let duration =
                        |field: &str, written: Option<String>, default: Duration| match written {
                            None => Ok(default),
                            Some(text) => parse_duration(&text).map_err(|m| (key(field), m)),
                        };
                    Ok(PoolConfig {
                        idle_grace: duration("idle_grace", p.idle_grace, base.idle_grace)?,
                        boot_timeout: duration("boot_timeout", p.boot_timeout, base.boot_timeout)?,
                        name: p.name,
                        labels: p.labels,
                        min_idle: p.min_idle.unwrap_or(base.min_idle),
                        max_runners: p.max_runners.unwrap_or(base.max_runners),
                        scaling_ratio: p.scaling_ratio.unwrap_or(base.scaling_ratio),
                        providers: p.providers.unwrap_or_default(),
                        ephemeral: p.ephemeral.unwrap_or(base.ephemeral),
                        policy: ScalingPolicy::parse(
                            p.policy.as_deref().unwrap_or("runway"),
                            p.forecast_quantile,
                        )
                        .map_err(|m| (key("policy"), m))?,
                        github: p
                            .github
                            .map(|g| g.resolve())
                            .transpose()
                            .map_err(|(field, m)| (key(&format!("github.{field}")), m))?,
                    })
                })
                .collect::<Result<Vec<_>, (String, String)>>()?,
        };
        let secrets = |key: &str,
                       written: Option<Vec<String>>|
         -> Result<Vec<Secret>, (String, String)> {
            written
                .unwrap_or_default()
                .iter()
                .enumerate()
                .map(|(i, text)| Secret::parse(text, base).map_err(|m| (format!("{key}[{i}]"), m)))
                .collect()
        };
        let admin_tokens = secrets("[server] admin_tokens", self.server.admin_tokens)?;
        let read_tokens = secrets("[server] read_tokens", self.server.read_tokens)?;
        let duration = |key: &str, written: Option<String>, default: Duration| match written {
            None => Ok(default),
            Some(text) => parse_duration(&text).map_err(|m| (key.to_owned(), m)),
        };
        let runner_api = RunnerApiConfig {
            poll_timeout: duration(
                "[runner_api] poll_timeout",
                self.runner_api.poll_timeout,
                defaults.runner_api.poll_timeout,
            )?,
            lease: duration(
                "[runner_api] lease",
                self.runner_api.lease,
                defaults.runner_api.lease,
            )?,
        };
        let retention = {
            let d = &defaults.retention;
            let r = self.retention;
            let retention = RetentionConfig {
                finished_jobs: duration(
                    "[retention] finished_jobs",
                    r.finished_jobs,
                    d.finished_jobs,
                )?,
                ended_runners: duration(
                    "[retention] ended_runners",
                    r.ended_runners,
                    d.ended_runners,
                )?,
                deliveries: duration("[retention] deliveries", r.deliveries, d.deliveries)?,
                job_logs: duration("[retention] job_logs", r.job_logs, d.job_logs)?,
                runner_reports: duration(
                    "[retention] runner_reports",
                    r.runner_reports,
                    d.runner_reports,
                )?,
                interval: duration("[retention] interval", r.interval, d.interval)?,
                batch: r.batch.unwrap_or(d.batch),
            };
            for (key, kept) in [
                ("[retention] finished_jobs", retention.finished_jobs),
                ("[retention] deliveries", retention.deliveries),
            ] {
                if !kept.is_zero() && kept < MIN_DEDUPE_RETENTION {
                    return Err((
                        key.to_owned(),
                        "must be 0 (keep forever) or at least 4 days: GitHub redelivers a webhook for 3 days, and these rows are what make a redelivery a duplicate".to_owned(),
                    ));
                }
            }
            if retention.interval.is_zero() {
                return Err((
                    "[retention] interval".to_owned(),
                    "must be more than 0".to_owned(),
                ));
            }
            if retention.batch == 0 {
                return Err((
                    "[retention] batch".to_owned(),
                    "must be at least 1".to_owned(),
                ));
            }
            retention
        };
        let providers = match self.providers {
            None => Vec::new(),
            Some(raw) => RawProviders::from_toml(raw)?.into_named()?,
        }
        .into_iter()
        .map(|(name, p)| {
            let defaults = ProviderConfig::for_kind(&name, &p.kind);
            let key = |field: &str| format!("[providers.{name}] {field}");
            let path = |written: Option<String>| {
                written.map(|text| match base {
                    Some(dir) if Path::new(&text).is_relative() => dir.join(text),
                    _ => PathBuf::from(text),
                })
            };
            let duration_of =
                |field: &str, written: Option<String>, default: Duration| match written {
                    None => Ok(default),
                    Some(text) => parse_duration(&text).map_err(|m| (key(field), m)),
                };
            let stop_grace = duration_of("stop_grace", p.stop_grace.clone(), defaults.stop_grace)?;
            let timeout = duration_of("timeout", p.timeout.clone(), defaults.timeout)?;
            let interface_version = match &p.interface_version {
                None => defaults.interface_version,
                Some(text) => text
                    .parse::<InterfaceVersion>()
                    .map_err(|message| (key("interface_version"), message))?,
            };
            let base = defaults;
            let boot_seconds = match &p.boot_seconds {
                None => base.boot_seconds,
                Some(value) => {
                    let number =
                        |v: &toml::Value| v.as_float().or_else(|| v.as_integer().map(|i| i as f64));
                    let pair = match value {
                        toml::Value::Array(items) if items.len() == 2 => {
                            number(&items[0]).zip(number(&items[1]))
                        }
                        other => number(other).map(|n| (n, n)),
                    };
                    match pair {
                        Some((low, high)) if low >= 0.0 && high >= low => (low, high),
                        _ => {
                            return Err((
                                key("boot_seconds"),
                                "must be a number of seconds or [min, max]".to_owned(),
                            ))
                        }
                    }
                }
            };
            let fail_rate = p.fail_rate.unwrap_or(base.fail_rate);
            if !(0.0..=1.0).contains(&fail_rate) {
                return Err((
                    key("fail_rate"),
                    format!("{fail_rate} is not between 0 and 1"),
                ));
            }
            Ok(ProviderConfig {
                kind: p.kind,
                conditions: p.conditions,
                required_keys: p.required_keys,
                max_instances: p.max_instances.unwrap_or(base.max_instances),
                price_per_hour: p.price_per_hour.unwrap_or(base.price_per_hour),
                boot_seconds,
                fail_rate,
                seed: p.seed.unwrap_or(base.seed),
                command: p.command.unwrap_or_default(),
                state_dir: path(p.state_dir),
                stop_grace,
                executable: path(p.executable),
                config_file: path(p.config_file),
                timeout,
                interface_version,
                environment_variables: p.environment_variables,
                name,
            })
        })
        .collect::<Result<Vec<_>, (String, String)>>()?;
        let worker_config_sources = self.worker_configs.unwrap_or_default();
        let worker_configs = worker_config_sources
            .iter()
            .enumerate()
            .map(|(i, source)| {
                worker_config_from_toml(source, base)
                    .map_err(|m| (format!("worker_configs[{i}]"), m))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let webhook_secrets = secrets("[github] webhook_secrets", self.github.webhook_secrets)?;
        let scaling_interval = duration(
            "[scaling] interval",
            self.scaling.interval,
            defaults.scaling_interval,
        )?;
        let telemetry = TelemetryConfig {
            event_log: match self.telemetry.event_log {
                Some(path) if path.trim().is_empty() => {
                    return Err((
                        "[telemetry] event_log".to_owned(),
                        "is empty; give a file path or \"-\" for standard output".to_owned(),
                    ))
                }
                Some(path) if path != "-" && Path::new(&path).is_relative() => Some(
                    base.map(|dir| dir.join(&path))
                        .unwrap_or_else(|| PathBuf::from(&path))
                        .display()
                        .to_string(),
                ),
                other => other,
            },
            event_log_max_bytes: match self.telemetry.event_log_max_bytes {
                Some(bytes) if bytes < 1024 => {
                    return Err((
                        "[telemetry] event_log_max_bytes".to_owned(),
                        format!("{bytes} is below 1024"),
                    ))
                }
                Some(bytes) => bytes,
                None => defaults.telemetry.event_log_max_bytes,
            },
            event_log_keep: self
                .telemetry
                .event_log_keep
                .unwrap_or(defaults.telemetry.event_log_keep),
        };
        let auth = github_auth(
            self.github.token,
            self.github.app_id,
            self.github.private_key,
            self.github.installation_id,
            base,
        )?;
        let metrics_job_labels = match self.metrics.job_labels {
            None => defaults.metrics_job_labels,
            Some(labels) => {
                if let Some(unknown) = labels.iter().find(|l| !JOB_LABELS.contains(&l.as_str())) {
                    return Err((
                        "[metrics] job_labels".to_owned(),
                        format!("{unknown:?} is not one of {}", JOB_LABELS.join(", ")),
                    ));
                }
                labels
            }
        };
        Ok(Config {
            metrics_job_labels,
            retention,
            telemetry,
            scaling_interval,
            runner_api,
            providers,
            worker_configs,
            worker_config_sources,
            github: GithubConfig {
                api_url: match self.github.api_url {
                    None => defaults.github.api_url,
                    Some(url) if url.starts_with("http://") || url.starts_with("https://") => {
                        url.trim_end_matches('/').to_owned()
                    }
                    Some(url) => {
                        return Err((
                            "[github] api_url".to_owned(),
                            format!("{url:?} is not an http:// or https:// URL"),
                        ))
                    }
                },
                deliveries: match self.github.deliveries {
                    Some(text) => Some(
                        text.parse()
                            .map_err(|m| ("[github] deliveries".to_owned(), m))?,
                    ),
                    // An App's own webhook is the one to heal.
                    None => matches!(auth, Some(GithubAuth::App { .. }))
                        .then_some(crate::config::Hook::App),
                },
                auth,
                max_requests_per_hour: self
                    .github
                    .max_requests_per_hour
                    .unwrap_or(defaults.github.max_requests_per_hour),
                recheck_after: duration(
                    "[github] recheck_after",
                    self.github.recheck_after,
                    defaults.github.recheck_after,
                )?,
                redeliver_interval: duration(
                    "[github] redeliver_interval",
                    self.github.redeliver_interval,
                    defaults.github.redeliver_interval,
                )?,
                webhook_secrets,
                required_labels: self
                    .github
                    .required_labels
                    .unwrap_or(defaults.github.required_labels),
                max_body_bytes: self
                    .github
                    .max_body_bytes
                    .unwrap_or(defaults.github.max_body_bytes),
            },
            routing: RoutingConfig {
                default_pool: self.routing.default_pool,
            },
            server: ServerConfig {
                public_url: match self.server.public_url {
                    Some(url) if !(url.starts_with("http://") || url.starts_with("https://")) => {
                        return Err((
                            "[server] public_url".to_owned(),
                            format!("{url:?} is not an http:// or https:// URL"),
                        ))
                    }
                    other => other.map(|url| url.trim_end_matches('/').to_owned()),
                },
                admin_tokens,
                read_tokens,
                listen,
                database,
                database_max_connections: self
                    .server
                    .database_max_connections
                    .unwrap_or(defaults.server.database_max_connections),
            },
            queue: QueueConfig {
                max_attempts: self
                    .queue
                    .max_attempts
                    .unwrap_or(defaults.queue.max_attempts),
            },
            pools,
        })
    }
}

/// `[github] token` or the App's three keys; never both, never a part.
fn github_auth(
    token: Option<String>,
    app_id: Option<u64>,
    private_key: Option<String>,
    installation_id: Option<u64>,
    base: Option<&Path>,
) -> Result<Option<GithubAuth>, (String, String)> {
    let secret = |key: &str, text: &str| {
        Secret::parse(text, base).map_err(|m| (format!("[github] {key}"), m))
    };
    match (token, app_id, private_key, installation_id) {
        (None, None, None, None) => Ok(None),
        (Some(token), None, None, None) => Ok(Some(GithubAuth::Token(secret("token", &token)?))),
        (Some(_), _, _, _) => Err((
            "[github] token".to_owned(),
            "give either token or the App's app_id, private_key and installation_id, not both"
                .to_owned(),
        )),
        (None, Some(app_id), Some(private_key), Some(installation_id)) => {
            Ok(Some(GithubAuth::App {
                app_id,
                private_key: secret("private_key", &private_key)?,
                installation_id,
            }))
        }
        (None, app_id, private_key, _) => {
            let missing = if app_id.is_none() {
                "app_id"
            } else if private_key.is_none() {
                "private_key"
            } else {
                "installation_id"
            };
            Err((
                format!("[github] {missing}"),
                "missing: authenticating as a GitHub App needs app_id, private_key and installation_id".to_owned(),
            ))
        }
    }
}

impl RawPoolGithub {
    fn resolve(self) -> Result<PoolGithub, (String, String)> {
        use crate::config::Target;
        let target = match (self.org, self.repo) {
            (Some(org), None) if !org.trim().is_empty() && !org.contains('/') => Target::Org(org),
            (Some(org), None) => {
                return Err((
                    "org".to_owned(),
                    format!("{org:?} is not an organisation name"),
                ))
            }
            (None, Some(repo)) => match repo.split_once('/') {
                Some((owner, name))
                    if !owner.is_empty() && !name.is_empty() && !name.contains('/') =>
                {
                    Target::Repo {
                        owner: owner.to_owned(),
                        name: name.to_owned(),
                    }
                }
                _ => return Err(("repo".to_owned(), format!("{repo:?} is not owner/name"))),
            },
            (Some(_), Some(_)) => {
                return Err(("org".to_owned(), "give org or repo, not both".to_owned()))
            }
            (None, None) => {
                return Err((
                    "org".to_owned(),
                    "missing: a GitHub pool needs org = \"NAME\" or repo = \"owner/name\""
                        .to_owned(),
                ))
            }
        };
        Ok(PoolGithub {
            target,
            runner_group_id: self.runner_group_id.unwrap_or(1),
        })
    }

    fn from_config(github: &PoolGithub) -> RawPoolGithub {
        use crate::config::Target;
        let (org, repo) = match &github.target {
            Target::Org(org) => (Some(org.clone()), None),
            Target::Repo { owner, name } => (None, Some(format!("{owner}/{name}"))),
        };
        RawPoolGithub {
            org,
            repo,
            runner_group_id: Some(github.runner_group_id),
        }
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

/// `30s`, `2m`, `1h 30m`, `500ms`, `2days` (humantime's form), or a bare
/// number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let refused = || format!("{text:?} is not a duration like 30s, 2m, 1h 30m or 500ms");
    // A bare number is seconds; anything else is humantime's form.
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse().map(Duration::from_secs).map_err(|_| refused());
    }
    humantime::parse_duration(text).map_err(|_| refused())
}

fn format_duration(duration: Duration) -> String {
    let millis = duration.as_millis();
    const DAY: u128 = 86_400_000;
    if millis >= DAY && millis % DAY == 0 {
        format!("{}d", millis / DAY)
    } else if millis % 1_000 == 0 {
        format!("{}s", millis / 1_000)
    } else {
        format!("{millis}ms")
    }
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

    #[test]
    fn durations_as_operators_write_them() {
        let cases = [
            ("30", Some(30_000)),
            ("30s", Some(30_000)),
            ("500ms", Some(500)),
            ("2m", Some(120_000)),
            ("1h 30m", Some(5_400_000)),
            ("1h30m", Some(5_400_000)),
            ("2days", Some(172_800_000)),
            (" 10s ", Some(10_000)),
            ("", None),
            ("ten seconds", None),
            ("-5s", None),
            ("5 parsecs", None),
        ];
        for (text, millis) in cases {
            let parsed = parse_duration(text).ok().map(|d| d.as_millis() as u64);
            assert_eq!(parsed, millis, "{text:?}");
        }
        assert_eq!(
            parse_duration("soon").unwrap_err(),
            "\"soon\" is not a duration like 30s, 2m, 1h 30m or 500ms"
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
                ephemeral = true
                policy = "runway"
            "#]],
        );
    }

    #[test]
    fn unknown_keys_are_named_with_their_place() {
        check(
            "[server]\nlisten = \"127.0.0.1:9000\"\nlisen = \"x\"\n",
            expect!["error: config runway.toml: [server] lisen (line 3, column 1): unknown field `lisen`, expected one of `listen`, `database`, `database_max_connections`, `admin_tokens`, `read_tokens`, `public_url`"],
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
                r#"error: config runway.toml: [server] listen: "localhost" is not an address like 127.0.0.1:8080 or [::1]:8080"#
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
            "[server]\ndatabase = \"mysql://x\"\n",
            expect![[
                r#"error: [server] database: unsupported database URL scheme "mysql"; use sqlite://PATH or postgres://USER@HOST/DB"#
            ]],
        );
        check(
            "[providers.external]\nkind = \"sim\"\n",
            expect!["error: [providers.external]: this name is reserved (runway marks runners that registered themselves or that it only heard of this way); choose another"],
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
                runner_group_id: 3
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
            expect!["error: config runway.toml: pools[0].github.org: give org or repo, not both"],
        );
        check(
            &format!("[github]\ntoken = \"t\"\n{pool}[pools.github]\nrepo = \"just-a-name\"\n"),
            expect![[
                r#"error: config runway.toml: pools[0].github.repo: "just-a-name" is not owner/name"#
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
            expect![[r#"error: config runway.toml: [github] deliveries: "x" is not a hook id"#]],
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
                ephemeral = true
                policy = "runway"
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
