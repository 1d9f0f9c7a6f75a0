//! Worker configurations at the edge: the JSON shape, its conversion to
//! `core::worker_config`, the admin API, and the evaluation cache.
//!
//! JSON shape: `{id, pools: [names], rules: [{rule_id, description,
//! conditions, values}]}` where `conditions` is `null`, one condition
//! object, or a list of them, and each condition maps a name to a glob or a
//! list of globs.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use runway_core::worker_config::{ConditionSet, Rule, Schemas, WorkerConfig, WorkerConfigError};
use runway_store::{Expect, StoreError, StoredWorkerConfig};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::api::rfc3339;
use crate::auth::{Reader, Writer};
use crate::error::ApiError;
use crate::service::{now, Service};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfigDto {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default)]
    pub pools: Vec<String>,
    #[serde(default)]
    pub rules: Vec<RuleDto>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuleDto {
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

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum ConditionsDto {
    One(BTreeMap<String, GlobsDto>),
    Many(Vec<BTreeMap<String, GlobsDto>>),
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
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
    fn get(&self, key: &EvaluationKey) -> Option<Value> {
        self.entries.lock().ok()?.get(key).cloned()
    }

    fn put(&self, key: EvaluationKey, value: Value) {
        if let Ok(mut entries) = self.entries.lock() {
            // Bounded: evaluation inputs come from API callers.
            if entries.len() >= 10_000 {
                entries.clear();
            }
            entries.insert(key, value);
        }
    }

    fn forget(&self, id: &str) {
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

pub fn router() -> Router<Arc<Service>> {
    Router::new()
        .route("/api/v1/worker-configs", get(list))
        .route(
            "/api/v1/worker-configs/{id}",
            get(read).put(write).delete(remove),
        )
        .route("/api/v1/worker-configs/{id}/evaluate", post(evaluate))
}

#[derive(Serialize)]
struct StoredDto {
    id: String,
    version: i64,
    updated_at: String,
    pools: Vec<String>,
    rules: Vec<RuleDto>,
}

fn stored_dto(stored: StoredWorkerConfig) -> Result<StoredDto, ApiError> {
    let config = parse(&stored.body, &stored.id).map_err(|e| {
        tracing::error!(error = %e, "a stored worker configuration does not parse");
        ApiError::store_unavailable()
    })?;
    Ok(StoredDto {
        id: stored.id,
        version: stored.version,
        updated_at: rfc3339(stored.updated_at),
        pools: stored.pools,
        rules: WorkerConfigDto::from_core(&config).rules,
    })
}

fn store_error(service: &Service, operation: &str, error: StoreError) -> ApiError {
    match error {
        StoreError::VersionConflict { .. } | StoreError::PoolTaken { .. } => {
            ApiError::new(StatusCode::CONFLICT, "conflict", error.to_string())
        }
        other => {
            service.metrics.store_error(operation);
            tracing::error!(error = %other, operation, "store operation failed in the worker-config API");
            ApiError::store_unavailable()
        }
    }
}

/// `If-Match: "3"` (or `3`, or `W/"3"`) → version 3; absent or `*` → any.
fn precondition(headers: &HeaderMap) -> Result<Expect, ApiError> {
    let Some(value) = headers.get(header::IF_MATCH) else {
        return Ok(Expect::Any);
    };
    let text = value.to_str().unwrap_or("").trim();
    if text == "*" {
        return Ok(Expect::Any);
    }
    let bare = text.trim_start_matches("W/").trim_matches('"');
    bare.parse::<i64>().map(Expect::Version).map_err(|_| {
        ApiError::bad_request(
            "invalid_header",
            format!("If-Match: {text:?} is not a version this API gave out (an ETag like \"3\")"),
        )
    })
}

fn etag(version: i64) -> (header::HeaderName, String) {
    (header::ETAG, format!("\"{version}\""))
}

async fn list(_: Reader, State(service): State<Arc<Service>>) -> Result<Response, ApiError> {
    let configs = service
        .store
        .list_worker_configs()
        .await
        .map_err(|e| store_error(&service, "list_worker_configs", e))?;
    let dtos = configs
        .into_iter()
        .map(stored_dto)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(serde_json::json!({ "worker_configs": dtos })).into_response())
}

async fn read(
    _: Reader,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let stored = service
        .store
        .get_worker_config(&id)
        .await
        .map_err(|e| store_error(&service, "get_worker_config", e))?
        .ok_or_else(|| ApiError::not_found(format!("no worker configuration {id:?}")))?;
    let version = stored.version;
    Ok(([etag(version)], Json(stored_dto(stored)?)).into_response())
}

/// Checks a configuration against the declared providers, as a 400.
fn checked(config: &WorkerConfig, schemas: &Schemas) -> Result<(), ApiError> {
    config.check(schemas).map_err(|e: WorkerConfigError| {
        ApiError::bad_request("invalid_worker_config", e.to_string())
    })
}

async fn write(
    _: Writer,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let expect = precondition(&headers)?;
    let dto: WorkerConfigDto = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request("invalid_worker_config", format!("body: {e}")))?;
    if let Some(body_id) = &dto.id {
        if body_id != &id {
            return Err(ApiError::bad_request(
                "invalid_worker_config",
                format!("id: the body says {body_id:?} but the path says {id:?}"),
            ));
        }
    }
    let config = dto.into_core(&id);
    checked(&config, &service.schemas())?;
    let existed = service
        .store
        .get_worker_config(&id)
        .await
        .map_err(|e| store_error(&service, "get_worker_config", e))?
        .is_some();
    let text = serde_json::to_string(&WorkerConfigDto::from_core(&config))
        .map_err(|_| ApiError::store_unavailable())?;
    let version = service
        .store
        .put_worker_config(&id, &text, &config.pools, expect, now())
        .await
        .map_err(|e| store_error(&service, "put_worker_config", e))?;
    service.evaluations.forget(&id);
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((
        status,
        [etag(version)],
        Json(serde_json::json!({ "id": id, "version": version })),
    )
        .into_response())
}

async fn remove(
    _: Writer,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let expect = precondition(&headers)?;
    let deleted = service
        .store
        .delete_worker_config(&id, expect)
        .await
        .map_err(|e| store_error(&service, "delete_worker_config", e))?;
    service.evaluations.forget(&id);
    if deleted {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        Err(ApiError::not_found(format!(
            "no worker configuration {id:?}"
        )))
    }
}

async fn evaluate(
    _: Reader,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let inputs: BTreeMap<String, String> = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(
            "invalid_inputs",
            format!("body: the condition inputs must be an object of strings, like {{\"provider\":\"ec2\",\"region\":\"us-east-1\"}}: {e}"),
        )
    })?;
    let stored = service
        .store
        .get_worker_config(&id)
        .await
        .map_err(|e| store_error(&service, "get_worker_config", e))?
        .ok_or_else(|| ApiError::not_found(format!("no worker configuration {id:?}")))?;
    let key = (id.clone(), stored.version, inputs.clone());
    if let Some(answer) = service.evaluations.get(&key) {
        return Ok(Json(answer).into_response());
    }
    let config = parse(&stored.body, &id).map_err(|_| ApiError::store_unavailable())?;
    let evaluation = config.evaluate(&inputs, &service.schemas()).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_result",
            e.to_string(),
        )
    })?;
    let answer = serde_json::json!({
        "id": id,
        "version": stored.version,
        "config": evaluation.values,
        "applied_rules": evaluation.applied_rules,
    });
    service.evaluations.put(key, answer.clone());
    Ok(Json(answer).into_response())
}

/// The launch configuration a new runner of `pool` on `provider` gets: the
/// pool's worker configuration evaluated with the inputs `provider` and
/// `pool` (an empty object when no worker configuration names the pool).
pub async fn launch_config(service: &Service, pool: &str, provider: &str) -> Result<Value, String> {
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
    let inputs = BTreeMap::from([
        ("provider".to_owned(), provider.to_owned()),
        ("pool".to_owned(), pool.to_owned()),
    ]);
    // Shares the cache with the evaluate endpoint, in its answer's shape.
    let key = (stored.id.clone(), stored.version, inputs.clone());
    if let Some(answer) = service.evaluations.get(&key) {
        return Ok(answer["config"].clone());
    }
    let config = parse(&stored.body, &stored.id)?;
    let evaluation = config
        .evaluate(&inputs, &service.schemas())
        .map_err(|e| format!("worker configuration {:?}: {e}", stored.id))?;
    let answer = serde_json::json!({
        "id": stored.id,
        "version": stored.version,
        "config": evaluation.values,
        "applied_rules": evaluation.applied_rules,
    });
    service.evaluations.put(key, answer.clone());
    Ok(answer["config"].clone())
}
