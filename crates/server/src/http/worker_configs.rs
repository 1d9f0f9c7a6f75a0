//! The worker-configuration admin API: list, read, write (with ETags and
//! `If-Match`), delete, and evaluate. The shape is `config::worker_config`.
use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use runway_core::worker_config::{Schemas, WorkerConfig, WorkerConfigError};
use runway_store::{Expect, StoreError, StoredWorkerConfig};
use serde::Serialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::worker_configs::{self, EvaluateError};
use crate::app::{AppError, Service};
use crate::clock::now;
use crate::clock::rfc3339;
use crate::config::worker_config::{parse, RuleDto, WorkerConfigDto};
use crate::http::auth::{Admin, Reader};
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::Path;
use crate::http::openapi::{ReadRefusals, WriteRefusals};

pub fn router() -> OpenApiRouter<Arc<Service>> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(read, write, remove))
        .routes(routes!(evaluate))
}

#[derive(Serialize, utoipa::ToSchema)]
struct WorkerConfigsDto {
    worker_configs: Vec<StoredDto>,
}

/// A write's outcome: the configuration's new version (also its `ETag`).
#[derive(Serialize, utoipa::ToSchema)]
struct WrittenDto {
    id: String,
    version: i64,
}

#[derive(Serialize, utoipa::ToSchema)]
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
        other => AppError::store(service, operation, other).into(),
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

/// Every stored worker configuration.
#[utoipa::path(get, path = "/api/v1/worker-configs", tag = "worker-configs",
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The worker configurations", body = WorkerConfigsDto),
        ReadRefusals,
    ))]
async fn list(
    Reader(caller): Reader,
    State(service): State<Arc<Service>>,
) -> Result<Response, ApiError> {
    caller.require_every_pool()?;
    let configs = service
        .store
        .list_worker_configs()
        .await
        .map_err(|e| store_error(&service, "list_worker_configs", e))?;
    let dtos = configs
        .into_iter()
        .map(stored_dto)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(WorkerConfigsDto {
        worker_configs: dtos,
    })
    .into_response())
}

/// One worker configuration; its version is the `ETag`.
#[utoipa::path(get, path = "/api/v1/worker-configs/{id}", tag = "worker-configs",
    params(("id" = String, Path, description = "The worker configuration's id")),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The worker configuration", body = StoredDto,
            headers(("etag" = String, description = "The version, for If-Match"))),
        (status = 404, description = "No such worker configuration", body = ErrorBody),
        ReadRefusals,
    ))]
async fn read(
    Reader(caller): Reader,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    caller.require_every_pool()?;
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
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_worker_config",
            e.to_string(),
        )
    })
}

/// Create or replace a worker configuration, checked against the
/// providers' schemas; `If-Match` makes it a compare-and-set.
#[utoipa::path(put, path = "/api/v1/worker-configs/{id}", tag = "worker-configs",
    params(
        ("id" = String, Path, description = "The worker configuration's id"),
        ("If-Match" = Option<String>, Header, nullable = false, pattern = r#"^(\*|(W/)?"?[0-9]{1,18}"?)$"#,
            description = "Only if the stored version is this ETag (`\"3\"`) or `*`"),
    ),
    request_body = WorkerConfigDto,
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "Replaced", body = WrittenDto,
            headers(("etag" = String, description = "The new version"))),
        (status = 201, description = "Created", body = WrittenDto,
            headers(("etag" = String, description = "The new version"))),
        (status = 400, description = "Not a worker configuration, or a malformed If-Match", body = ErrorBody),
        (status = 422, description = "The configuration does not check out: another id than the path's, an empty or repeated rule id, an undeclared condition, values the pools' providers refuse", body = ErrorBody),
        (status = 409, description = "The version is not the one If-Match named, or a pool already has a configuration", body = ErrorBody),
        WriteRefusals,
    ))]
async fn write(
    Admin(caller): Admin,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    caller.require_every_pool()?;
    let expect = precondition(&headers)?;
    let dto: WorkerConfigDto = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request("invalid_worker_config", format!("body: {e}")))?;
    if let Some(body_id) = &dto.id {
        if body_id != &id {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_worker_config",
                format!("id: the body says {body_id:?} but the path says {id:?}"),
            ));
        }
    }
    let config = dto.into_core(&id);
    checked(&config, &service.schemas())?;
    service
        .config()
        .check_provider_values(&config)
        .map_err(|message| {
            ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_worker_config",
                message,
            )
        })?;
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
    Ok((status, [etag(version)], Json(WrittenDto { id, version })).into_response())
}

/// Delete a worker configuration; `If-Match` makes it a compare-and-set.
#[utoipa::path(delete, path = "/api/v1/worker-configs/{id}", tag = "worker-configs",
    params(
        ("id" = String, Path, description = "The worker configuration's id"),
        ("If-Match" = Option<String>, Header, nullable = false, pattern = r#"^(\*|(W/)?"?[0-9]{1,18}"?)$"#,
            description = "Only if the stored version is this ETag (`\"3\"`) or `*`"),
    ),
    security(("admin_token" = [])),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "A malformed If-Match", body = ErrorBody),
        (status = 404, description = "No such worker configuration", body = ErrorBody),
        (status = 409, description = "The version is not the one If-Match named", body = ErrorBody),
        WriteRefusals,
    ))]
async fn remove(
    Admin(caller): Admin,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    caller.require_every_pool()?;
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

/// What a worker configuration gives a runner with these condition
/// inputs (e.g. `{"provider": "ec2", "region": "us-east-1"}`).
#[utoipa::path(post, path = "/api/v1/worker-configs/{id}/evaluate", tag = "worker-configs",
    params(("id" = String, Path, description = "The worker configuration's id")),
    request_body(content = BTreeMap<String, String>, description = "The condition inputs"),
    security(("admin_token" = [])),
    responses(
        (status = 200, description = "The merged values of the rules that match", body = serde_json::Value),
        (status = 400, description = "The inputs are not an object of strings", body = ErrorBody),
        (status = 404, description = "No such worker configuration", body = ErrorBody),
        (status = 422, description = "The merged values do not pass the provider's schema", body = ErrorBody),
        ReadRefusals,
    ))]
async fn evaluate(
    Reader(caller): Reader,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    caller.require_every_pool()?;
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
    let answer = worker_configs::evaluate(&service, &stored, &inputs).map_err(|e| match e {
        EvaluateError::Unreadable(_) => ApiError::store_unavailable(),
        EvaluateError::Invalid(e) => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_result",
            e.to_string(),
        ),
    })?;
    Ok(Json(answer).into_response())
}
