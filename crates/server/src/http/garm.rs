//! GARM's instance API on runway's listener (`app::garm`): the metadata
//! and callback endpoints a machine booted by a GARM provider calls with its
//! instance token, each with and without a trailing slash as GARM serves
//! them, and the download of runway's own binary.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::{Json, Router};

use crate::app::garm::{self, Instance, CALLBACKS_PATH, METADATA_PATH, TOOLS_PATH};
use crate::app::Service;
use crate::clock::now;
use crate::http::error::ApiError;

pub fn router() -> Router<Arc<Service>> {
    let both = |router: Router<Arc<Service>>, path: String, route: MethodRouter<Arc<Service>>| {
        router
            .route(&format!("{path}/"), route.clone())
            .route(&path, route)
    };
    let routes: Vec<(String, MethodRouter<Arc<Service>>)> = vec![
        (
            format!("{METADATA_PATH}/runner-registration-token"),
            get(registration_token),
        ),
        (
            format!("{METADATA_PATH}/credentials/{{file}}"),
            get(credentials),
        ),
        (
            format!("{METADATA_PATH}/system/service-name"),
            get(service_name),
        ),
        (format!("{METADATA_PATH}/systemd/unit-file"), get(unit_file)),
        (
            format!("{METADATA_PATH}/system/cert-bundle"),
            get(cert_bundle),
        ),
        (
            format!("{METADATA_PATH}/runner-metadata"),
            get(runner_metadata),
        ),
        (
            format!("{METADATA_PATH}/install-script"),
            get(install_script),
        ),
        (
            format!("{CALLBACKS_PATH}/status"),
            post(status).layer(DefaultBodyLimit::max(garm::MAX_CALLBACK_BYTES)),
        ),
        (
            format!("{CALLBACKS_PATH}/system-info"),
            post(system_info).layer(DefaultBodyLimit::max(garm::MAX_CALLBACK_BYTES)),
        ),
        (TOOLS_PATH.to_owned(), get(download_runway)),
    ];
    routes
        .into_iter()
        .fold(Router::new(), |router, (path, route)| {
            both(router, path, route)
        })
}

/// The caller: a machine with a valid instance token.
pub struct InstanceAuth {
    instance: Instance,
    bearer: String,
}

impl FromRequestParts<Arc<Service>> for InstanceAuth {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        service: &Arc<Service>,
    ) -> Result<InstanceAuth, ApiError> {
        let bearer = crate::http::auth::bearer(parts)?.to_owned();
        let instance = garm::authenticate(service, &bearer, now()).await?;
        Ok(InstanceAuth { instance, bearer })
    }
}

fn text(body: impl Into<String>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body.into(),
    )
        .into_response()
}

async fn registration_token(
    State(service): State<Arc<Service>>,
    auth: InstanceAuth,
) -> Result<Response, ApiError> {
    let token = garm::registration_token(&service, &auth.instance, now()).await?;
    Ok(text(token))
}

async fn credentials(auth: InstanceAuth, Path(file): Path<String>) -> Result<Response, ApiError> {
    let data = garm::jit_file(&auth.instance, &file)?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=.{file}"),
            ),
        ],
        data,
    )
        .into_response())
}

async fn service_name(State(service): State<Arc<Service>>, auth: InstanceAuth) -> Response {
    text(garm::service_name(&service, &auth.instance.runner))
}

#[derive(serde::Deserialize)]
struct UnitFileQuery {
    #[serde(rename = "runAsUser")]
    run_as_user: Option<String>,
}

async fn unit_file(
    State(service): State<Arc<Service>>,
    auth: InstanceAuth,
    Query(query): Query<UnitFileQuery>,
) -> Response {
    text(garm::unit_file(
        &service,
        &auth.instance.runner,
        query.run_as_user.as_deref(),
    ))
}

async fn cert_bundle(_auth: InstanceAuth) -> Response {
    Json(garm::cert_bundle()).into_response()
}

async fn runner_metadata(State(service): State<Arc<Service>>, auth: InstanceAuth) -> Response {
    Json(garm::runner_metadata(&service, &auth.instance.runner)).into_response()
}

async fn install_script(State(service): State<Arc<Service>>, auth: InstanceAuth) -> Response {
    let target = service
        .config()
        .pool(&auth.instance.runner.pool)
        .and_then(|p| p.github.as_ref())
        .map(|g| g.target.clone());
    let tools = match &target {
        Some(target) => garm::github_tools(&service, target, now()).await,
        None => Vec::new(),
    };
    text(garm::install_script(
        &service,
        &auth.instance,
        &auth.bearer,
        &tools,
    ))
}

fn json_body<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "invalid_body", e.to_string()))
}

async fn status(
    State(service): State<Arc<Service>>,
    auth: InstanceAuth,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let update: garm::StatusUpdate = json_body(&body)?;
    garm::status(&service, &auth.instance, &update, now()).await?;
    Ok(StatusCode::OK)
}

async fn system_info(
    State(service): State<Arc<Service>>,
    auth: InstanceAuth,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let info: serde_json::Value = json_body(&body)?;
    garm::system_info(&service, &auth.instance, &info, now()).await?;
    Ok(StatusCode::OK)
}

async fn download_runway(_auth: InstanceAuth) -> Result<Response, ApiError> {
    let (_, path) = garm::runway_binary()
        .ok_or_else(|| ApiError::not_found("runway's own binary cannot be read"))?;
    let bytes = tokio::fs::read(&path)
        .await
        .map_err(|e| ApiError::not_found(format!("runway's own binary cannot be read: {e}")))?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}
