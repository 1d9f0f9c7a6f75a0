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

fn any_matches(tokens: &[Secret], presented: &str) -> bool {
    tokens
        .iter()
        .any(|token| bool::from(token.expose().as_bytes().ct_eq(presented.as_bytes())))
}

/// The caller may read: an admin token or a read-only token.
pub struct Reader;

/// The caller may change things: an admin token. A read-only token is 403.
pub struct Writer;

impl FromRequestParts<Arc<Service>> for Reader {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        service: &Arc<Service>,
    ) -> Result<Reader, ApiError> {
        let server = &service.config.server;
        if server.admin_tokens.is_empty() && server.read_tokens.is_empty() {
            return Err(ApiError::unauthorized(
                "the admin API is disabled: no [server] admin_tokens or read_tokens are configured",
            ));
        }
        let presented = bearer(parts)?;
        if any_matches(&server.admin_tokens, presented)
            || any_matches(&server.read_tokens, presented)
        {
            Ok(Reader)
        } else {
            Err(ApiError::unauthorized("the bearer token is not valid"))
        }
    }
}

impl FromRequestParts<Arc<Service>> for Writer {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        service: &Arc<Service>,
    ) -> Result<Writer, ApiError> {
        Reader::from_request_parts(parts, service).await?;
        let presented = bearer(parts)?;
        if any_matches(&service.config.server.admin_tokens, presented) {
            Ok(Writer)
        } else {
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "this token may only read; changes need a token from [server] admin_tokens",
            ))
        }
    }
}

/// A registered runner, identified by its runner token.
pub struct RunnerAuth(pub Runner);

impl FromRequestParts<Arc<Service>> for RunnerAuth {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        service: &Arc<Service>,
    ) -> Result<RunnerAuth, ApiError> {
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
        Ok(RunnerAuth(runner))
    }
}
