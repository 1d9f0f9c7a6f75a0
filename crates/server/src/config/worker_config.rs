//! The worker-configuration file shape (DESIGN §5): `{id, pools: [names],
//! rules: [{rule_id, description, conditions, values}]}` where `conditions`
//! is `null`, one condition object, or a list of them, and each condition
//! maps a name to a glob or a list of globs. The admin API speaks the same
//! shape.

use std::collections::BTreeMap;

use runway_core::worker_config::{ConditionSet, Rule, WorkerConfig};
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfigDto {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default)]
    pub pools: Vec<String>,
    #[serde(default)]
    pub rules: Vec<RuleDto>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RuleDto {
    #[schema(min_length = 1)]
    pub rule_id: String,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub conditions: Option<ConditionsDto>,
    #[serde(default = "empty_object")]
    pub values: Value,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(untagged)]
pub enum ConditionsDto {
    One(BTreeMap<String, GlobsDto>),
    Many(Vec<BTreeMap<String, GlobsDto>>),
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(untagged)]
pub enum GlobsDto {
    One(String),
    Many(Vec<String>),
}

impl WorkerConfigDto {
    /// The core configuration; `id` wins over any id in the body.
    pub fn into_core(self, id: &str) -> WorkerConfig {
        let set = |map: BTreeMap<String, GlobsDto>| -> ConditionSet {
            map.into_iter()
                .map(|(name, globs)| {
                    let globs = match globs {
                        GlobsDto::One(glob) => vec![glob],
                        GlobsDto::Many(globs) => globs,
                    };
                    (name, globs)
                })
                .collect()
        };
        WorkerConfig {
            id: id.to_owned(),
            pools: self.pools,
            rules: self
                .rules
                .into_iter()
                .map(|rule| Rule {
                    rule_id: rule.rule_id,
                    description: rule.description,
                    conditions: rule.conditions.map(|conditions| match conditions {
                        ConditionsDto::One(map) => vec![set(map)],
                        ConditionsDto::Many(maps) => maps.into_iter().map(set).collect(),
                    }),
                    values: rule.values,
                })
                .collect(),
        }
    }

    pub fn from_core(config: &WorkerConfig) -> WorkerConfigDto {
        WorkerConfigDto {
            id: Some(config.id.clone()),
            pools: config.pools.clone(),
            rules: config
                .rules
                .iter()
                .map(|rule| RuleDto {
                    rule_id: rule.rule_id.clone(),
                    description: rule.description.clone(),
                    conditions: rule.conditions.as_ref().map(|sets| {
                        ConditionsDto::Many(
                            sets.iter()
                                .map(|set| {
                                    set.iter()
                                        .map(|(name, globs)| {
                                            (name.clone(), GlobsDto::Many(globs.clone()))
                                        })
                                        .collect()
                                })
                                .collect(),
                        )
                    }),
                    values: rule.values.clone(),
                })
                .collect(),
        }
    }
}

/// Parses one worker configuration from JSON text; `origin` names it in errors.
pub fn parse(text: &str, origin: &str) -> Result<WorkerConfig, String> {
    let dto: WorkerConfigDto = serde_json::from_str(text).map_err(|e| format!("{origin}: {e}"))?;
    let id = dto.id.clone().unwrap_or_default();
    Ok(dto.into_core(&id))
}

impl super::Config {
    /// Part of [`super::Config::load`]'s validation: the worker configurations, their ids, values and pools.
    pub(super) fn check_worker_configs(&self) -> Result<(), (String, String)> {
        let schemas = self.schemas();
        let mut owners: BTreeMap<&str, &str> = BTreeMap::new();
        let mut ids = std::collections::BTreeSet::new();
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
        Ok(())
    }
}
