//! `[[pools]]`: a pool's shape, defaults and the checks that need nothing
//! but the pool itself (`Config::validate` checks it against the rest).

use std::time::Duration;

use runway_providers::settings::duration;
use serde::{Deserialize, Serialize};

use crate::config::{PoolAccess, PoolGithub, PoolShare};

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub name: String,
    /// The labels the pool's runners serve; a job can go to the pool when its
    /// labels are a subset of these (compared case-insensitively).
    pub labels: Vec<String>,
    #[serde(default)]
    pub min_idle: u32,
    #[serde(default = "pool_defaults::max_runners")]
    pub max_runners: u32,
    /// Runners wanted per queued job (1.0: one each; 0.5: one per two).
    #[serde(default = "pool_defaults::scaling_ratio")]
    pub scaling_ratio: f64,
    /// An idle runner beyond demand is removed only after idling this long.
    #[serde(with = "duration", default = "pool_defaults::idle_grace")]
    pub idle_grace: Duration,
    /// A runner not ready this long after it was requested is failed and replaced.
    #[serde(with = "duration", default = "pool_defaults::boot_timeout")]
    pub boot_timeout: Duration,
    /// Providers this pool may use, in preference order (empty: any).
    #[serde(default)]
    pub providers: Vec<String>,
    /// What becomes of runners still booting when the demand that asked
    /// for them is gone (the job was cancelled, or taken by a runner that
    /// freed up): `keep` (the default: where a machine is billed by the
    /// hour, or its boot is most of its cost, a booted runner serves the
    /// next job, and one past demand idles out after `idle_grace`), or
    /// `delete` (where billing is per second: stop paying at once).
    #[serde(default)]
    pub surplus_boots: SurplusBoots,
    /// One job per runner.
    #[serde(default = "pool_defaults::ephemeral")]
    pub ephemeral: bool,
    /// `runway` (keep `min_idle` warm) or `predictive` (keep warm as many
    /// runners as the arrivals expected within one boot time and a round,
    /// at the forecast quantile; never fewer than `min_idle`). docs/sim.md.
    #[serde(default)]
    pub policy: ScalingPolicy,
    /// What a minute of a job's wait is worth in minutes of a runner (its
    /// price): the predictive policy keeps warm what balances the two
    /// (`runway_core::forecast::quantile_for`). Default 1.75.
    #[serde(default = "pool_defaults::wait_value")]
    pub wait_value: f64,
    /// The predictive policy's quantile, overriding what `wait_value` gives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forecast_quantile: Option<f64>,
    /// A GitHub pool: its runners are just-in-time GitHub runners and are
    /// deregistered before their machine is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub github: Option<PoolGithub>,
    /// Which jobs may use the pool (repositories, forks, events); a job
    /// it refuses goes on to the next pool serving its labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<PoolAccess>,
    /// Fair share across the pool's repositories or submitters: weights
    /// and a cap on each one's running jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<PoolShare>,
    /// Stopped runners (created, booted once, stopped; started on demand
    /// for one job): at least this many kept…
    #[serde(default)]
    pub min_stopped: u32,
    /// …and at most this many (0, the default: none). They count against
    /// `max_runners` only once started. Needs a provider with
    /// `resume_seconds` (so far kinds `sim`, `ec2` and `container`), and is not a GitHub pool.
    #[serde(default)]
    pub max_stopped: u32,
    /// A stopped runner older than this is replaced, so its image and
    /// caches stay current.
    #[serde(with = "duration", default = "pool_defaults::stopped_max_age")]
    pub stopped_max_age: Duration,
}

/// A pool's defaults, one function a key (serde takes them by path).
mod pool_defaults {
    use std::time::Duration;

    pub fn max_runners() -> u32 {
        10
    }
    pub fn scaling_ratio() -> f64 {
        1.0
    }
    pub fn idle_grace() -> Duration {
        Duration::from_secs(300)
    }
    pub fn boot_timeout() -> Duration {
        Duration::from_secs(600)
    }
    pub fn ephemeral() -> bool {
        true
    }
    pub fn wait_value() -> f64 {
        runway_core::forecast::DEFAULT_WAIT_VALUE
    }
    pub fn stopped_max_age() -> Duration {
        runway_core::stopped::DEFAULT_MAX_AGE
    }
}

/// A pool's choice for runners booting beyond demand (`surplus_boots`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SurplusBoots {
    #[default]
    Keep,
    Delete,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ScalingPolicy {
    #[default]
    Runway,
    Predictive,
}

impl PoolConfig {
    /// A pool with every default and these labels.
    pub fn new(name: &str, labels: &[&str]) -> PoolConfig {
        PoolConfig {
            name: name.to_owned(),
            labels: labels.iter().map(|l| l.to_string()).collect(),
            min_idle: 0,
            max_runners: pool_defaults::max_runners(),
            scaling_ratio: pool_defaults::scaling_ratio(),
            idle_grace: pool_defaults::idle_grace(),
            boot_timeout: pool_defaults::boot_timeout(),
            providers: Vec::new(),
            surplus_boots: SurplusBoots::Keep,
            ephemeral: pool_defaults::ephemeral(),
            policy: ScalingPolicy::Runway,
            wait_value: pool_defaults::wait_value(),
            forecast_quantile: None,
            github: None,
            access: None,
            share: None,
            min_stopped: 0,
            max_stopped: 0,
            stopped_max_age: pool_defaults::stopped_max_age(),
        }
    }

    /// The quantile of the forecast arrivals the predictive policy keeps
    /// warm: `forecast_quantile`, or what `wait_value` gives.
    pub fn forecast_quantile(&self) -> f64 {
        self.forecast_quantile
            .unwrap_or_else(|| runway_core::forecast::quantile_for(self.wait_value))
    }

    /// The share of a job of this pool whose key is `key`.
    pub fn share_of(&self, key: &str) -> runway_core::share::Share {
        crate::config::share::share_of(self.share.as_ref(), key)
    }

    /// The cap on one key's jobs provisioning or running, if any.
    pub fn max_running_per_key(&self) -> Option<u32> {
        self.share.as_ref().and_then(|share| share.max_running)
    }

    /// Its stopped-runner settings, as the planner reads them.
    pub fn stopped_policy(&self) -> runway_core::stopped::StoppedPolicy {
        runway_core::stopped::StoppedPolicy {
            min_stopped: self.min_stopped,
            max_stopped: self.max_stopped,
            max_age: self.stopped_max_age,
        }
    }

    /// The forecast quantile of a predictive pool; `None` for the others.
    pub fn predictive_quantile(&self) -> Option<f64> {
        (self.policy == ScalingPolicy::Predictive).then(|| self.forecast_quantile())
    }
}

impl Default for PoolConfig {
    fn default() -> PoolConfig {
        PoolConfig::new("default", &["self-hosted", "linux", "x64"])
    }
}

impl PoolConfig {
    /// What is wrong with the pool on its own: the key (relative to the
    /// pool's table) and why.
    pub fn check_alone(&self) -> Result<(), (String, String)> {
        if self.name.trim().is_empty() {
            return Err(("name".to_owned(), "must not be empty".into()));
        }
        if !self
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err((
                "name".to_owned(),
                format!(
                    "{:?} may only contain letters, digits, '-' and '_'",
                    self.name
                ),
            ));
        }
        if self.labels.is_empty() {
            return Err((
                "labels".to_owned(),
                "a pool must serve at least one label".into(),
            ));
        }
        if let Some(label) = self.labels.iter().find(|l| l.trim().is_empty()) {
            return Err(("labels".to_owned(), format!("empty label {label:?}")));
        }
        // Each table's error names its key relative to the table.
        let within = |table: &str, error: String| {
            let (field, message) = error.split_once(": ").unwrap_or(("", &error));
            (format!("{table}.{field}"), message.to_owned())
        };
        if let Some(access) = &self.access {
            access
                .build()
                .map_err(|e| within("access", e.to_string()))?;
        }
        if let Some(share) = &self.share {
            share.build().map_err(|e| within("share", e.to_string()))?;
        }
        if !(self.scaling_ratio.is_finite()
            && self.scaling_ratio > 0.0
            && self.scaling_ratio <= 100.0)
        {
            return Err((
                "scaling_ratio".to_owned(),
                format!(
                    "{} is not a number above 0 and at most 100",
                    self.scaling_ratio
                ),
            ));
        }
        if self.min_stopped > self.max_stopped {
            return Err((
                "max_stopped".to_owned(),
                format!(
                    "max_stopped ({}) is below min_stopped ({})",
                    self.max_stopped, self.min_stopped
                ),
            ));
        }
        if self.max_runners < self.min_idle {
            return Err((
                "max_runners".to_owned(),
                format!(
                    "max_runners ({}) is below min_idle ({})",
                    self.max_runners, self.min_idle
                ),
            ));
        }
        Ok(())
    }
}

impl super::Config {
    /// The provider `pool` keeps its stopped runners through: the first of
    /// its providers with `resume_seconds`.
    pub fn stopping_provider(&self, pool: &PoolConfig) -> Option<&super::ProviderConfig> {
        self.providers.iter().find(|p| {
            p.resume_seconds.is_some()
                && (pool.providers.is_empty() || pool.providers.contains(&p.name))
        })
    }

    /// Part of [`super::Config::load`]'s validation: the default pool and each pool against the providers and GitHub settings.
    pub(super) fn check_pools(&self) -> Result<(), (String, String)> {
        let auth = self.github.auth();
        if let Some(default) = &self.routing.default_pool {
            if !self.pools.iter().any(|p| &p.name == default) {
                return Err((
                    "[routing] default_pool".into(),
                    format!("{default:?} is not the name of a configured pool"),
                ));
            }
        }
        let mut names = std::collections::BTreeSet::new();
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
            if pool.max_stopped > 0 {
                if self.stopping_provider(pool).is_none() {
                    return Err((
                        key("max_stopped"),
                        "none of the pool's providers keeps stopped runners: give one resume_seconds (so far kinds sim, ec2 and container)".into(),
                    ));
                }
                if !pool.ephemeral {
                    return Err((
                        key("max_stopped"),
                        "a stopped runner runs one job and is deleted: the pool must be ephemeral"
                            .into(),
                    ));
                }
                // A webhook pool's stopped runner gets its JIT configuration
                // minted at its start; a scale set's demand is its listener's
                // count, which the stock does not read.
                if pool
                    .github
                    .as_ref()
                    .is_some_and(|github| github.scale_set.is_some())
                {
                    return Err((
                        key("max_stopped"),
                        "a scale-set pool cannot keep stopped runners yet: its demand is the scale set's count, which the stock does not read; keep them on webhook-fed GitHub pools or runway's own".into(),
                    ));
                }
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
}
