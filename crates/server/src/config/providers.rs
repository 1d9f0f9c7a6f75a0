//! `providers`: each provider's declaration, and the section as written:
//! `[providers.NAME]` tables or a `[[providers]]` list with `name` keys,
//! each read onto the defaults of its kind; written back as tables, in
//! name order.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use runway_providers::factory::{ProviderKind, ProviderSpec};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::load::one_line;

pub fn serialize<S: Serializer>(
    providers: &[ProviderConfig],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    providers
        .iter()
        .map(|provider| (&provider.name, provider))
        .collect::<BTreeMap<_, _>>()
        .serialize(serializer)
}

pub fn deserialize<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<ProviderConfig>, D::Error> {
    let named: Vec<(String, toml::Table, String)> = match toml::Value::deserialize(deserializer)? {
        toml::Value::Table(tables) => tables
            .into_iter()
            .map(|(name, value)| match value {
                toml::Value::Table(table) => {
                    let key = format!("[providers.{name}]");
                    Ok((name, table, key))
                }
                _ => Err(D::Error::custom(format!(
                    "[providers.{name}] is not a table"
                ))),
            })
            .collect::<Result<_, _>>()?,
        toml::Value::Array(list) => {
            let mut seen = BTreeSet::new();
            let mut named = Vec::new();
            for (i, entry) in list.into_iter().enumerate() {
                let toml::Value::Table(mut table) = entry else {
                    return Err(D::Error::custom(format!("providers[{i}] is not a table")));
                };
                let Some(toml::Value::String(name)) = table.remove("name") else {
                    return Err(D::Error::custom(format!(
                        "providers[{i}].name: missing: every provider needs a name"
                    )));
                };
                if !seen.insert(name.clone()) {
                    return Err(D::Error::custom(format!(
                        "providers[{i}].name: duplicate provider {name:?}"
                    )));
                }
                let key = format!("providers[{i}] ({name})");
                named.push((name, table, key));
            }
            named
        }
        _ => {
            return Err(D::Error::custom(
                "give [providers.NAME] tables or a [[providers]] list",
            ))
        }
    };
    let mut providers = named
        .into_iter()
        .map(|(name, table, key)| {
            read(&name, table).map_err(|m| D::Error::custom(format!("{key}: {m}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    providers.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(providers)
}

/// Whether an error's first part is the key of one provider, as
/// [`deserialize`] writes them: `[providers.NAME]` or `providers[I]…`.
pub fn names_a_provider(key: &str) -> bool {
    key.starts_with("[providers.") || key.starts_with("providers[")
}

/// The keys every kind takes, for an error about one it does not.
const COMMON_KEYS: &str =
    "conditions, inputs, required_keys, max_instances, price_per_hour, boot_seconds, list_lag, environment_variables, resume_seconds, stopped_price_per_hour";

/// One provider's table, over the defaults of its kind.
fn read(name: &str, table: toml::Table) -> Result<ProviderConfig, String> {
    let kind = match table.get("kind") {
        Some(toml::Value::String(kind)) => kind.clone(),
        Some(_) => return Err("kind: must be a string".to_owned()),
        None => {
            return Err(format!(
                "kind: missing: one of {}",
                ProviderKind::NAMES.join(", ")
            ))
        }
    };
    let Some(defaults) = ProviderConfig::for_kind(name, &kind) else {
        return Err(format!(
            "kind: {kind:?} is not one of {}",
            ProviderKind::NAMES.join(", ")
        ));
    };
    let mut merged = toml::Table::try_from(&defaults).map_err(|e| e.to_string())?;
    merged.extend(table);
    let mut provider: ProviderConfig =
        toml::Value::Table(merged)
            .try_into()
            .map_err(|e: toml::de::Error| {
                let message = one_line(e.message());
                if message.starts_with("unknown field") {
                    format!("{message} for kind {kind:?}, or one every kind takes: {COMMON_KEYS}")
                } else {
                    message
                }
            })?;
    provider.name = name.to_owned();
    Ok(provider)
}

/// A provider declaration: how runners are started (its `kind` and that
/// kind's keys, `runway_providers::factory::ProviderKind`), what capacity
/// it offers the planner (`max_instances`, `price_per_hour`,
/// `boot_seconds`, whose defaults depend on the kind), and what worker
/// configurations for it may say (its own condition names) and must
/// contain (required keys).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
pub struct ProviderConfig {
    /// The table's name (`[providers.NAME]`).
    #[serde(skip)]
    pub name: String,
    #[serde(flatten)]
    pub kind: ProviderKind,
    #[serde(default)]
    pub conditions: Vec<String>,
    /// Condition inputs every launch through this provider adds to the
    /// evaluation of its pools' worker configurations (`region`, or a
    /// name in `conditions`), e.g. `{ availabilityZone = "us-east-1a" }`
    /// for a GARM provider that serves one zone. The inputs an `ec2`
    /// offer implies (its zone, instance type, purchase option) come from
    /// the offer and cannot be given here.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub inputs: BTreeMap<String, String>,
    #[serde(default)]
    pub required_keys: Vec<String>,
    /// Most instances at once through this provider.
    pub max_instances: u32,
    pub price_per_hour: f64,
    /// Boot time, uniform between the two (equal for a fixed time): what
    /// `sim` instances take, and what the others' bids say to expect.
    #[serde(with = "runway_providers::settings::boot_seconds")]
    pub boot_seconds: (f64, f64),
    /// How long an instance may be missing from the provider's list after
    /// its create returned (cloud APIs are eventually consistent): until
    /// then its absence is "not visible yet", not "vanished". By kind:
    /// `ec2` 60 s, `exec` 30 s (GARM providers list real clouds), `process`
    /// and `sim` 0 (their lists are what they just did).
    #[serde(with = "runway_providers::settings::duration")]
    pub list_lag: Duration,
    /// `process`, `exec`, `container`: host environment variables (names, or prefixes
    /// such as `"AWS_"`) the child may inherit besides the base (`PATH`,
    /// `HOME`, `LANG`, `TMPDIR`, the proxy variables). Nothing else of
    /// runway's environment reaches it; `RUNWAY_*` and `GARM_*` never do.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub environment_variables: Vec<String>,
    /// Stopped runners (a pool's `max_stopped`): how long one takes to be
    /// ready once started. Unset: this provider keeps none. So far only
    /// `sim` keeps them, in `runway sim` (docs/sim.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_seconds: Option<f64>,
    /// What a stopped runner costs an hour (its disk); default 3 % of
    /// `price_per_hour`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_price_per_hour: Option<f64>,
}

impl ProviderConfig {
    /// A provider of `kind` with that kind's defaults: a simulated cloud
    /// boots in minutes and costs money; a local process starts in a
    /// second, free.
    pub fn new(name: &str, kind: ProviderKind) -> ProviderConfig {
        let local = matches!(
            kind,
            ProviderKind::Process { .. } | ProviderKind::Container { .. }
        );
        let list_lag = match kind {
            ProviderKind::Ec2 { .. } => Duration::from_secs(60),
            ProviderKind::Exec { .. } => Duration::from_secs(30),
            _ => Duration::ZERO,
        };
        ProviderConfig {
            name: name.to_owned(),
            kind,
            conditions: Vec::new(),
            inputs: BTreeMap::new(),
            required_keys: Vec::new(),
            max_instances: if local { 4 } else { 100 },
            price_per_hour: if local { 0.0 } else { 0.10 },
            boot_seconds: if local { (1.0, 1.0) } else { (120.0, 180.0) },
            list_lag,
            environment_variables: Vec::new(),
            resume_seconds: None,
            stopped_price_per_hour: None,
        }
    }

    /// The defaults of a provider of the kind called `kind`, if runway has it.
    pub fn for_kind(name: &str, kind: &str) -> Option<ProviderConfig> {
        ProviderKind::named(kind).map(|kind| ProviderConfig::new(name, kind))
    }

    /// Refuses launch inputs that could never be used or that runway or
    /// an offer sets, and declared conditions that would never get a value
    /// at launch (every rule conditioned on one would silently never
    /// apply): `(field, message)`.
    pub fn check_inputs(&self) -> Result<(), (String, String)> {
        let from_offers = self.kind.offer_input_names();
        for (name, value) in &self.inputs {
            let field = format!("inputs.{name}");
            if name == "provider" || name == "pool" {
                return Err((
                    field,
                    "runway sets this input itself at each launch (the provider's and the pool's name)".into(),
                ));
            }
            if from_offers.contains(&name.as_str()) {
                return Err((
                    field,
                    format!(
                        "a provider of kind {:?} takes it from each launch's offer; it cannot be set here",
                        self.kind.name()
                    ),
                ));
            }
            if name != "region" && !self.conditions.contains(name) {
                return Err((
                    field,
                    format!("{name:?} is not one of this provider's conditions: add it to conditions (or use region)"),
                ));
            }
            if value.trim().is_empty() {
                return Err((field, "must not be empty".into()));
            }
        }
        let implied = self.kind.implied_conditions();
        for name in &self.conditions {
            let general = runway_core::worker_config::GENERAL_CONDITIONS.contains(&name.as_str());
            if general || implied.contains(&name.as_str()) || self.inputs.contains_key(name) {
                continue;
            }
            return Err((
                "conditions".into(),
                format!(
                    "{name:?} never gets a value at launch, so a rule conditioned on it could never apply: give it one, e.g. inputs = {{ {name} = \"…\" }}"
                ),
            ));
        }
        Ok(())
    }

    /// How long a stopped runner of this provider takes to be ready once
    /// started (`resume_seconds`; zero for one that keeps none).
    pub fn resume_time(&self) -> Duration {
        Duration::from_secs_f64(self.resume_seconds.unwrap_or(0.0).max(0.0))
    }

    /// What a stopped runner of this provider costs an hour.
    pub fn stopped_price(&self) -> f64 {
        if let Some(price) = self.stopped_price_per_hour {
            return price;
        }
        match &self.kind {
            // Its disk: GB × $/GB-month over a month's 730 hours.
            ProviderKind::Ec2 {
                stopped_volume_gb: Some(gb),
                volume_price_per_gb_month,
                ..
            } => gb * volume_price_per_gb_month / 730.0,
            _ => self.price_per_hour * DEFAULT_STOPPED_FRACTION,
        }
    }

    /// A stopped hour's price as a share of a running one (0 for a free
    /// provider).
    pub fn stopped_fraction(&self) -> f64 {
        if self.price_per_hour > 0.0 {
            self.stopped_price() / self.price_per_hour
        } else {
            0.0
        }
    }

    /// Refuses stopped-runner keys a provider cannot use: `(field, message)`.
    fn check_stopped(&self) -> Result<(), (String, String)> {
        if let Some(resume) = self.resume_seconds {
            if !matches!(
                self.kind,
                ProviderKind::Sim { .. }
                    | ProviderKind::Ec2 { .. }
                    | ProviderKind::Container { .. }
                    | ProviderKind::Exec { .. }
            ) {
                return Err((
                    "resume_seconds".into(),
                    format!(
                        "a provider of kind {:?} cannot keep stopped runners; only sim, ec2, container and exec can",
                        self.kind.name()
                    ),
                ));
            }
            if !(resume.is_finite() && resume >= 0.0) {
                return Err((
                    "resume_seconds".into(),
                    "must be a number of seconds, 0 or more".into(),
                ));
            }
        }
        if let Some(price) = self.stopped_price_per_hour {
            if !(price.is_finite() && price >= 0.0) {
                return Err((
                    "stopped_price_per_hour".into(),
                    "must be a price, 0 or more".into(),
                ));
            }
        }
        Ok(())
    }

    /// Its typed declaration, for `runway_providers::factory::build`; `pools`
    /// are the pools that may use it.
    pub fn spec(&self, pools: Vec<String>) -> ProviderSpec {
        ProviderSpec {
            name: self.name.clone(),
            kind: self.kind.clone(),
            max_instances: self.max_instances,
            price_per_hour: self.price_per_hour,
            boot_seconds: self.boot_seconds,
            list_lag: self.list_lag,
            environment_variables: self.environment_variables.clone(),
            pools,
            resume_seconds: self.resume_seconds,
        }
    }
}

impl Default for ProviderConfig {
    fn default() -> ProviderConfig {
        ProviderConfig::new(
            "sim",
            ProviderKind::Sim {
                fail_rate: 0.0,
                seed: 0,
            },
        )
    }
}

/// A stopped runner's price, as a share of a running one's, when a
/// provider does not say: an instance's disk against the instance.
pub const DEFAULT_STOPPED_FRACTION: f64 = 0.03;

pub const PROVIDER_KINDS: [&str; 5] = ProviderKind::NAMES;

impl super::Config {
    /// Part of [`super::Config::load`]'s validation: each provider alone.
    pub(super) fn check_providers(&self) -> Result<(), (String, String)> {
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
            provider
                .check_stopped()
                .map_err(|(field, message)| (key(&field), message))?;
        }
        Ok(())
    }
}
