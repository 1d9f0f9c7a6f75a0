//! Worker configurations in use: the evaluation cache that the admin API's
//! evaluate endpoint and the reconciler's launch configurations share.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use runway_core::worker_config::WorkerConfigError;
use runway_store::StoredWorkerConfig;
use serde_json::Value;

use crate::app::Service;
use crate::config::worker_config::parse;

/// Evaluation results per (configuration, version, inputs). An entry is
/// valid as long as its version is the stored one, so a write invalidates
/// it by bumping the version; `forget` drops the stale entries.
/// (configuration id, version, condition inputs).
type EvaluationKey = (String, i64, BTreeMap<String, String>);

#[derive(Default)]
pub struct EvaluationCache {
    entries: Mutex<HashMap<EvaluationKey, Value>>,
}

impl EvaluationCache {
    pub fn get(&self, key: &EvaluationKey) -> Option<Value> {
        self.entries.lock().ok()?.get(key).cloned()
    }

    pub fn put(&self, key: EvaluationKey, value: Value) {
        if let Ok(mut entries) = self.entries.lock() {
            // Bounded: evaluation inputs come from API callers.
            if entries.len() >= 10_000 {
                entries.clear();
            }
            entries.insert(key, value);
        }
    }

    pub fn forget(&self, id: &str) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.retain(|(config, _, _), _| config != id);
        }
    }

    pub fn forget_all(&self) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.clear();
        }
    }

    pub fn len(&self) -> usize {
        self.entries.lock().map(|e| e.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a stored worker configuration could not be evaluated.
#[derive(Debug, thiserror::Error)]
pub enum EvaluateError {
    /// The stored body does not parse (it was checked when written).
    #[error("{0}")]
    Unreadable(String),
    /// The result breaks a provider's schema.
    #[error(transparent)]
    Invalid(#[from] WorkerConfigError),
}

/// `stored` evaluated with `inputs`, cached per (id, version, inputs): the
/// evaluate endpoint's answer, `{id, version, config, applied_rules}`.
pub fn evaluate(
    service: &Service,
    stored: &StoredWorkerConfig,
    inputs: &BTreeMap<String, String>,
) -> Result<Value, EvaluateError> {
    let key = (stored.id.clone(), stored.version, inputs.clone());
    if let Some(answer) = service.evaluations.get(&key) {
        return Ok(answer);
    }
    let config = parse(&stored.body, &stored.id).map_err(EvaluateError::Unreadable)?;
    let evaluation = config.evaluate(inputs, &service.schemas())?;
    let answer = serde_json::json!({
        "id": stored.id,
        "version": stored.version,
        "config": evaluation.values,
        "applied_rules": evaluation.applied_rules,
    });
    service.evaluations.put(key, answer.clone());
    Ok(answer)
}

/// The launch configuration a new runner of `pool` on `provider` gets: the
/// pool's worker configuration evaluated with the inputs `provider` and
/// `pool`, the provider's configured `inputs`, and what the chosen offer
/// adds (`offer_inputs`: an EC2 offer's region, zone, instance type and
/// purchase option); an empty object when no worker configuration names
/// the pool.
pub async fn launch_config(
    service: &Service,
    pool: &str,
    provider: &str,
    offer_inputs: BTreeMap<String, String>,
) -> Result<Value, String> {
    let configs = service
        .store
        .list_worker_configs()
        .await
        .map_err(|e| format!("cannot read worker configurations: {e}"))?;
    let Some(stored) = configs
        .into_iter()
        .find(|c| c.pools.iter().any(|p| p == pool))
    else {
        return Ok(Value::Object(serde_json::Map::new()));
    };
    let mut inputs = service.config().launch_inputs(provider);
    inputs.extend(offer_inputs);
    inputs.insert("provider".to_owned(), provider.to_owned());
    inputs.insert("pool".to_owned(), pool.to_owned());
    let answer = evaluate(service, &stored, &inputs).map_err(|e| match e {
        EvaluateError::Unreadable(e) => e,
        EvaluateError::Invalid(e) => format!("worker configuration {:?}: {e}", stored.id),
    })?;
    Ok(answer["config"].clone())
}

/// The scaling ratio the planner uses for `pool` now: the one the stored
/// worker configuration of the pool gives (`scalingRatio`, evaluated with
/// `Config::planning_inputs`), else the pool's `scaling_ratio`. A stored
/// body that no longer parses (it was checked when written) gives the
/// pool's own.
pub async fn scaling_ratio(
    service: &Service,
    pool: &crate::config::PoolConfig,
) -> Result<f64, runway_store::StoreError> {
    let configs = service.store.list_worker_configs().await?;
    let parsed: Vec<_> = configs
        .iter()
        .filter(|c| c.pools.iter().any(|p| p == &pool.name))
        .filter_map(|c| parse(&c.body, &c.id).ok())
        .collect();
    Ok(service.config().scaling_ratio(pool, &parsed))
}
