//! Who is calling: admin and read-only tokens for the admin API, runner
//! tokens for the runner API. Tokens are compared in constant time; runner
//! tokens are looked up by their SHA-256 hash, the only form stored.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::StatusCode;
use runway_core::Runner;
use subtle::ConstantTimeEq;

use crate::app::tokens::token_hash;
use crate::app::Service;
use crate::config::Secret;
use crate::http::error::ApiError;

pub(crate) fn bearer(parts: &Parts) -> Result<&str, ApiError> {
    parts
        .headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim)
        .ok_or_else(|| ApiError::unauthorized("an Authorization: Bearer TOKEN header is required"))
}

/// The name of the token in `tokens` that `presented` is, if any: where
/// it is read from (`env:NAME`, `file:NAME`) or, written in the file,
/// `KEY[i]` — what the audit trail records as who acted.
fn matching(tokens: &[Secret], key: &str, presented: &str) -> Option<String> {
    let mut found = None;
    // Every token is compared, so the time taken says nothing about which.
    for (index, token) in tokens.iter().enumerate() {
        if bool::from(token.expose().as_bytes().ct_eq(presented.as_bytes())) && found.is_none() {
            found = Some(token.origin().unwrap_or_else(|| format!("{key}[{index}]")));
        }
    }
    found
}

/// Who presented a valid token, and whether it may change things.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The token's name (see `matching`).
    pub name: String,
    pub admin: bool,
}

impl Caller {
    /// The caller `token` is, if it is an admin or read token.
    pub fn of_token(service: &Service, token: &str) -> Option<Caller> {
        let config = service.config();
        let server = &config.server;
        if let Some(name) = matching(&server.admin_tokens, "admin_tokens", token) {
            return Some(Caller { name, admin: true });
        }
        matching(&server.read_tokens, "read_tokens", token)
            .map(|name| Caller { name, admin: false })
    }
}

/// The caller may read: an admin token or a read-only token.
pub struct Reader(pub Caller);

/// The caller may change things: an admin token. A read-only token is 403.
pub struct Writer(pub Caller);

/// The refusal of a read token's change.
pub fn read_only() -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        "this token may only read; changes need a token from [server] admin_tokens",
    )
}

impl FromRequestParts<Arc<Service>> for Reader {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        service: &Arc<Service>,
    ) -> Result<Reader, ApiError> {
        {
            let config = service.config();
            let server = &config.server;
            if server.admin_tokens.is_empty() && server.read_tokens.is_empty() {
                return Err(ApiError::unauthorized(
                    "the admin API is disabled: no [server] admin_tokens or read_tokens are configured",
                ));
            }
        }
        let presented = bearer(parts)?;
        Caller::of_token(service, presented)
            .map(Reader)
            .ok_or_else(|| ApiError::unauthorized("the bearer token is not valid"))
    }
}

impl FromRequestParts<Arc<Service>> for Writer {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        service: &Arc<Service>,
    ) -> Result<Writer, ApiError> {
        let Reader(caller) = Reader::from_request_parts(parts, service).await?;
        if caller.admin {
            Ok(Writer(caller))
        } else {
            Err(read_only())
        }
    }
}

/// A registered runner, identified by its runner token (not a report
/// token: that one only posts reports, [`ReporterAuth`]).
pub struct RunnerAuth(pub Runner);

impl FromRequestParts<Arc<Service>> for RunnerAuth {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        service: &Arc<Service>,
    ) -> Result<RunnerAuth, ApiError> {
        if bearer(parts)?.starts_with(crate::app::tokens::REPORT_TOKEN_PREFIX) {
            return Err(ApiError::unauthorized(
                "a report token only posts its runner's reports",
            ));
        }
        ReporterAuth::from_request_parts(parts, service)
            .await
            .map(|ReporterAuth(runner)| RunnerAuth(runner))
    }
}

/// A runner, identified by its runner token or its report token: what may
/// post the runner's own reports.
pub struct ReporterAuth(pub Runner);

impl FromRequestParts<Arc<Service>> for ReporterAuth {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        service: &Arc<Service>,
    ) -> Result<ReporterAuth, ApiError> {
        let presented = bearer(parts)?;
        let runner = service
            .store
            .find_runner_by_token(&token_hash(presented))
            .await
            .map_err(|error| {
                service.metrics.store_error("find_runner_by_token");
                tracing::error!(%error, "cannot look up a runner token");
                ApiError::store_unavailable()
            })?
            .ok_or_else(|| ApiError::unauthorized("the runner token is not valid"))?;
        if runner.state.is_terminal() {
            return Err(ApiError::unauthorized(format!(
                "runner {} is {}; register a new one",
                runner.name, runner.state
            )));
        }
        Ok(ReporterAuth(runner))
    }
}
