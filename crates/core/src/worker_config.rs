//! Worker configurations: ordered rules with glob conditions whose values
//! deep-merge into a launch configuration (DESIGN §7, after Taskcluster's
//! worker-manager RFC 124).
//!
//! A rule applies when its conditions are `None`, or when any one of its
//! condition objects holds; an object holds when every name in it has a
//! value among the inputs that matches one of its globs. Applying rules
//! merge their values in order: objects merge key by key, anything else
//! replaces, and a `null` value deletes the key. The result is checked for
//! the keys the provider requires, with errors naming the rule that set (or
//! should have set) the value.
//!
//! Everything here is pure: the same configuration and inputs always give
//! the same result, so callers may cache it per configuration version.

use std::collections::{BTreeMap, BTreeSet};

use globset::{Glob, GlobMatcher};
use serde_json::{Map, Value};

/// The top-level key whose number, in a pool's evaluated configuration, is
/// the planner's scaling ratio for that pool (RFC 124's `scalingRatio`):
/// runners wanted per queued job, above 0 and at most 100.
pub const SCALING_RATIO: &str = "scalingRatio";

/// Whether `ratio` is a scaling ratio the planner takes.
pub fn valid_scaling_ratio(ratio: f64) -> bool {
    ratio.is_finite() && ratio > 0.0 && ratio <= 100.0
}

/// The condition names every configuration may use.
pub const GENERAL_CONDITIONS: [&str; 3] = ["provider", "pool", "region"];

#[derive(Debug, Clone, PartialEq)]
pub struct WorkerConfig {
    pub id: String,
    /// The pools this configuration describes; a pool belongs to one
    /// configuration at most.
    pub pools: Vec<String>,
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    pub rule_id: String,
    pub description: String,
    /// `None`: always applies. Otherwise any one object must hold.
    pub conditions: Option<Vec<ConditionSet>>,
    /// Merged into the result when the rule applies.
    pub values: Value,
}

/// Condition name → globs (any one matching satisfies the name).
pub type ConditionSet = BTreeMap<String, Vec<String>>;

/// What a provider declares: the extra condition names it understands and
/// the keys (dotted paths) a launch configuration for it must contain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProviderSchema {
    pub name: String,
    pub conditions: Vec<String>,
    pub required_keys: Vec<String>,
}

/// The providers a configuration is checked against. Empty means standalone
/// evaluation: any condition name is accepted and no result is validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schemas {
    pub providers: Vec<ProviderSchema>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkerConfigError {
    #[error("configuration id must not be empty")]
    EmptyId,
    #[error("rule #{index} has an empty rule_id")]
    EmptyRuleId { index: usize },
    #[error("rule_id {rule_id:?} appears more than once")]
    DuplicateRuleId { rule_id: String },
    #[error("rule {rule_id:?}: condition {name:?}: {glob:?} is not a valid glob: {reason}")]
    BadGlob {
        rule_id: String,
        name: String,
        glob: String,
        reason: String,
    },
    #[error("rule {rule_id:?}: condition {name:?} has no globs; it could never match")]
    EmptyCondition { rule_id: String, name: String },
    #[error("rule {rule_id:?}: condition {name:?} is not a general condition ({general}) nor declared by {providers}")]
    UnknownCondition {
        rule_id: String,
        name: String,
        general: String,
        providers: String,
    },
    #[error("rule {rule_id:?}: values must be an object")]
    ValuesNotObject { rule_id: String },
    #[error("rule {rule_id:?}: scalingRatio must be a number above 0 and at most 100 (or null to unset it), not {value}")]
    BadScalingRatio { rule_id: String, value: String },
    #[error("pool {pool:?} is listed twice")]
    DuplicatePool { pool: String },
    #[error("the result for provider {provider:?} lacks required key {key:?}: none of the rules that applied ({applied}) sets it")]
    MissingKey {
        provider: String,
        key: String,
        applied: String,
    },
    #[error("the result for provider {provider:?} has an empty {key:?}, set by rule {rule_id:?}")]
    EmptyKey {
        provider: String,
        key: String,
        rule_id: String,
    },
    #[error("no provider {provider:?} is declared; declared: {declared}")]
    UnknownProvider { provider: String, declared: String },
}

/// The result of an evaluation: the merged values, and for each leaf path
/// the rule that last set it (for error messages and for `explain`).
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    pub values: Value,
    pub set_by: BTreeMap<String, String>,
    pub applied_rules: Vec<String>,
}

impl WorkerConfig {
    /// Structural checks that need no provider: ids, globs, value shapes.
    /// With `schemas` declaring providers, also refuses condition names that
    /// neither the general set nor a matching provider declares.
    pub fn check(&self, schemas: &Schemas) -> Result<(), WorkerConfigError> {
        if self.id.trim().is_empty() {
            return Err(WorkerConfigError::EmptyId);
        }
        let mut pools = BTreeSet::new();
        for pool in &self.pools {
            if !pools.insert(pool) {
                return Err(WorkerConfigError::DuplicatePool { pool: pool.clone() });
            }
        }
        let mut ids = BTreeSet::new();
        for (index, rule) in self.rules.iter().enumerate() {
            if rule.rule_id.trim().is_empty() {
                return Err(WorkerConfigError::EmptyRuleId { index });
            }
            if !ids.insert(rule.rule_id.as_str()) {
                return Err(WorkerConfigError::DuplicateRuleId {
                    rule_id: rule.rule_id.clone(),
                });
            }
            if !rule.values.is_object() {
                return Err(WorkerConfigError::ValuesNotObject {
                    rule_id: rule.rule_id.clone(),
                });
            }
            match rule.values.get(SCALING_RATIO) {
                None | Some(Value::Null) => {}
                Some(value) if value.as_f64().is_some_and(valid_scaling_ratio) => {}
                Some(value) => {
                    return Err(WorkerConfigError::BadScalingRatio {
                        rule_id: rule.rule_id.clone(),
                        value: value.to_string(),
                    })
                }
            }
            for set in rule.conditions.iter().flatten() {
                for (name, globs) in set {
                    if globs.is_empty() {
                        return Err(WorkerConfigError::EmptyCondition {
                            rule_id: rule.rule_id.clone(),
                            name: name.clone(),
                        });
                    }
                    for glob in globs {
                        compile(glob).map_err(|reason| WorkerConfigError::BadGlob {
                            rule_id: rule.rule_id.clone(),
                            name: name.clone(),
                            glob: glob.clone(),
                            reason,
                        })?;
                    }
                }
                schemas.check_condition_names(&rule.rule_id, set)?;
            }
        }
        Ok(())
    }

    /// Evaluates the rules for `inputs` (condition name → value). Checks the
    /// configuration first, so an invalid one never yields a result.
    pub fn evaluate(
        &self,
        inputs: &BTreeMap<String, String>,
        schemas: &Schemas,
    ) -> Result<Evaluation, WorkerConfigError> {
        self.check(schemas)?;
        let mut values = Value::Object(Map::new());
        let mut set_by = BTreeMap::new();
        let mut applied_rules = Vec::new();
        for rule in &self.rules {
            if rule.applies(inputs) {
                merge(&mut values, &rule.values, "", &rule.rule_id, &mut set_by);
                applied_rules.push(rule.rule_id.clone());
            }
        }
        let evaluation = Evaluation {
            values,
            set_by,
            applied_rules,
        };
        if let Some(provider) = inputs.get("provider") {
            schemas.validate(provider, &evaluation)?;
        }
        Ok(evaluation)
    }
}

impl WorkerConfig {
    /// The scaling ratio the rules that apply for `inputs` give
    /// ([`SCALING_RATIO`]; the last applying rule that sets it wins, a
    /// `null` unsets it), if any. Only the top-level key is read, so no
    /// other key needs its inputs (an offer's zone, say) to be known.
    pub fn scaling_ratio(&self, inputs: &BTreeMap<String, String>) -> Option<f64> {
        let mut ratio = None;
        for rule in self.rules.iter().filter(|rule| rule.applies(inputs)) {
            match rule.values.get(SCALING_RATIO) {
                None => {}
                Some(value) => ratio = value.as_f64(),
            }
        }
        ratio.filter(|ratio| valid_scaling_ratio(*ratio))
    }
}

impl Rule {
    pub fn applies(&self, inputs: &BTreeMap<String, String>) -> bool {
        match &self.conditions {
            None => true,
            Some(sets) => sets.iter().any(|set| holds(set, inputs)),
        }
    }
}

fn compile(glob: &str) -> Result<GlobMatcher, String> {
    Glob::new(glob)
        .map(|g| g.compile_matcher())
        .map_err(|e| e.kind().to_string())
}

fn holds(set: &ConditionSet, inputs: &BTreeMap<String, String>) -> bool {
    set.iter().all(|(name, globs)| match inputs.get(name) {
        None => false,
        Some(value) => globs
            .iter()
            .any(|glob| compile(glob).map(|m| m.is_match(value)).unwrap_or(false)),
    })
}

/// Deep-merges `patch` into `target`, recording which rule set each path.
fn merge(
    target: &mut Value,
    patch: &Value,
    prefix: &str,
    rule_id: &str,
    set_by: &mut BTreeMap<String, String>,
) {
    let (Value::Object(target_map), Value::Object(patch_map)) = (&mut *target, patch) else {
        *target = patch.clone();
        set_by.insert(prefix.to_owned(), rule_id.to_owned());
        return;
    };
    for (key, value) in patch_map {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        if value.is_null() {
            target_map.remove(key);
            set_by.retain(|p, _| p != &path && !p.starts_with(&format!("{path}.")));
            continue;
        }
        match target_map.get_mut(key) {
            Some(existing) if existing.is_object() && value.is_object() => {
                merge(existing, value, &path, rule_id, set_by);
            }
            _ => {
                // A replaced subtree forgets who set its old leaves.
                set_by.retain(|p, _| !p.starts_with(&format!("{path}.")));
                let mut fresh = if value.is_object() {
                    Value::Object(Map::new())
                } else {
                    Value::Null
                };
                merge(&mut fresh, value, &path, rule_id, set_by);
                if value.is_object() {
                    set_by.insert(path.clone(), rule_id.to_owned());
                }
                target_map.insert(key.clone(), fresh);
            }
        }
    }
}

fn lookup<'a>(value: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(value, |current, key| current.get(key))
}

impl Schemas {
    fn names(&self) -> String {
        self.providers
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn check_condition_names(
        &self,
        rule_id: &str,
        set: &ConditionSet,
    ) -> Result<(), WorkerConfigError> {
        if self.providers.is_empty() {
            return Ok(());
        }
        // The providers this condition object can be about: those its
        // `provider` globs match, or every provider if it names none.
        let candidates: Vec<&ProviderSchema> = match set.get("provider") {
            None => self.providers.iter().collect(),
            Some(globs) => self
                .providers
                .iter()
                .filter(|p| {
                    globs
                        .iter()
                        .any(|g| compile(g).map(|m| m.is_match(&p.name)).unwrap_or(false))
                })
                .collect(),
        };
        for name in set.keys() {
            let general = GENERAL_CONDITIONS.contains(&name.as_str());
            let declared = candidates.iter().any(|p| p.conditions.contains(name));
            if !general && !declared {
                let providers = if candidates.is_empty() {
                    "any declared provider (none matches the rule's provider condition)".to_owned()
                } else {
                    candidates
                        .iter()
                        .map(|p| p.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                return Err(WorkerConfigError::UnknownCondition {
                    rule_id: rule_id.to_owned(),
                    name: name.clone(),
                    general: GENERAL_CONDITIONS.join(", "),
                    providers,
                });
            }
        }
        Ok(())
    }

    fn validate(&self, provider: &str, evaluation: &Evaluation) -> Result<(), WorkerConfigError> {
        if self.providers.is_empty() {
            return Ok(());
        }
        let schema = self
            .providers
            .iter()
            .find(|p| p.name == provider)
            .ok_or_else(|| WorkerConfigError::UnknownProvider {
                provider: provider.to_owned(),
                declared: self.names(),
            })?;
        for key in &schema.required_keys {
            let empty = |v: &Value| match v {
                Value::Null => true,
                Value::String(s) => s.trim().is_empty(),
                Value::Object(m) => m.is_empty(),
                Value::Array(a) => a.is_empty(),
                _ => false,
            };
            match lookup(&evaluation.values, key) {
                None => {
                    return Err(WorkerConfigError::MissingKey {
                        provider: provider.to_owned(),
                        key: key.clone(),
                        applied: evaluation.applied_rules.join(", "),
                    })
                }
                Some(value) if empty(value) => {
                    let rule_id = evaluation.set_by.get(key).cloned().unwrap_or_default();
                    return Err(WorkerConfigError::EmptyKey {
                        provider: provider.to_owned(),
                        key: key.clone(),
                        rule_id,
                    });
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}
