//! Runners that register themselves: registration tokens, and registration
//! (a registration token buys a runner record and a runner token).

use std::time::Duration;

use runway_core::{Runner, RunnerEvent, RunnerOrigin, Timestamp};
use runway_store::StoreError;
use serde_json::json;

use crate::app::tokens::{new_token, token_hash};
use crate::app::{AppError, ErrorKind, Service};
use crate::clock::now;

/// The longest a registration token may live.
pub const MAX_REGISTRATION_TTL: u64 = 7 * 24 * 3600;

/// A new registration token for `pool`, valid for `ttl` seconds (one hour
/// if `None`). Returns the token and when it expires.
pub async fn create_registration_token(
    service: &Service,
    pool: &str,
    ttl: Option<u64>,
) -> Result<(String, Timestamp), AppError> {
    if service.config().pool(pool).is_none() {
        return Err(AppError::new(
            ErrorKind::Unprocessable,
            "unknown_pool",
            format!("pool: {pool:?} is not a configured pool"),
        ));
    }
    let ttl = ttl.unwrap_or(3600);
    if ttl == 0 || ttl > MAX_REGISTRATION_TTL {
        return Err(AppError::invalid(
            "invalid_body",
            format!("ttl: {ttl} is not between 1 and {MAX_REGISTRATION_TTL} seconds"),
        ));
    }
    let token = new_token("rwr_");
    let now = now();
    let expires_at = now.plus(Duration::from_secs(ttl));
    service
        .store
        .create_registration_token(&token_hash(&token), pool, None, expires_at, now)
        .await
        .map_err(|e| AppError::store(service, "create_registration_token", e))?;
    Ok((token, expires_at))
}

/// Registers a runner with a registration token: returns its record and
/// its runner token (shown once; only its hash is stored).
pub async fn register(
    service: &Service,
    registration_token: &str,
    attempt: Option<&str>,
    name: &str,
    labels: &[String],
) -> Result<(Runner, String), AppError> {
    let name = name.trim();
    if name.is_empty() || name.len() > 200 {
        return Err(AppError::invalid(
            "invalid_body",
            "name: must be 1 to 200 characters",
        ));
    }
    if labels.len() > 64 || labels.iter().any(|l| l.trim().is_empty() || l.len() > 100) {
        return Err(AppError::invalid(
            "invalid_body",
            "labels: at most 64 labels of 1 to 100 characters",
        ));
    }
    if attempt.is_some_and(|a| !(16..=128).contains(&a.len())) {
        return Err(AppError::invalid(
            "invalid_body",
            "attempt: must be 16 to 128 characters",
        ));
    }
    let runner_token = new_token("rwt_");
    let now = now();
    let registration = service
        .store
        .register_runner(
            &token_hash(registration_token),
            attempt.map(token_hash).as_deref(),
            name,
            labels,
            &token_hash(&runner_token),
            now,
        )
        .await
        .map_err(|error| match error {
            StoreError::InvalidToken => AppError::new(
                ErrorKind::Unauthenticated,
                "unauthorized",
                "the registration token is unknown, used or expired",
            ),
            StoreError::DuplicateRunnerName(name) => AppError::new(
                ErrorKind::Conflict,
                "duplicate_name",
                format!("a runner named {name:?} already exists"),
            ),
            other => AppError::store(service, "register_runner", other),
        })?;
    let runner = registration.runner;
    if registration.repeated {
        tracing::info!(target: "runway::events", event = "runner_registered_again", runner = %runner.id, name = %runner.name, pool = %runner.pool, "a registration asked again (its answer was lost): the same runner, a new runner token");
        return Ok((runner, runner_token));
    }
    // A runner runway started (its token was bound to its record) is ready
    // already, and its install time is known.
    if runner.origin() == RunnerOrigin::Registered {
        if let Err(error) = service
            .store
            .apply_runner_event(runner.id, &RunnerEvent::Ready, now)
            .await
        {
            tracing::warn!(%error, runner = %runner.id, "cannot mark a new runner idle");
        }
    } else {
        let installed = now.since(runner.requested_at);
        service.metrics.runner_installed(&runner.pool, installed);
        service.events.emit(
            "runner_installed",
            json!({
                "timestamp": now.as_millis().div_euclid(1000),
                "flavor": runner.pool,
                "duration": installed.as_secs_f64().round() as u64,
            }),
            now,
        );
        tracing::info!(target: "runway::events", event = "runner_installed", flavor = %runner.pool, duration = installed.as_secs_f64(), runner = %runner.name);
    }
    tracing::info!(target: "runway::events", event = "runner_registered", runner = %runner.id, name = %runner.name, pool = %runner.pool);
    Ok((runner, runner_token))
}
