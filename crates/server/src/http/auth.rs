//! Who is calling: for the admin API a token with a role (`read`,
//! `operate`, `admin`) and the pools it covers; runner tokens for the
//! runner API. Tokens are compared in constant time; runner
//! tokens are looked up by their SHA-256 hash, the only form stored.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::StatusCode;
use runway_core::Runner;
use subtle::ConstantTimeEq;

use crate::app::tokens::{token_hash, ByToken};
use crate::app::Service;
use crate::config::{Role, Scope, Secret};
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

/// Who presented a valid token: its name, role and the pools it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The token's name: `[[server.tokens]] name`, or for `admin_tokens`
    /// and `read_tokens` where it is read from (see `matching`).
    pub name: String,
    pub role: Role,
    pub scope: Scope,
}

impl Caller {
    /// The caller `token` is, if it is one of the configured tokens. Every
    /// token is compared, so the time taken says nothing about which.
    pub fn of_token(service: &Service, token: &str) -> Option<Caller> {
        let config = service.config();
        let server = &config.server;
        let admin = matching(&server.admin_tokens, "admin_tokens", token);
        let read = matching(&server.read_tokens, "read_tokens", token);
        let mut named = None;
        for configured in &server.tokens {
            if bool::from(configured.token.expose().as_bytes().ct_eq(token.as_bytes()))
                && named.is_none()
            {
                named = Some(configured.clone());
            }
        }
        if let Some(name) = admin {
            return Some(Caller::every_pool(name, Role::Admin));
        }
        if let Some(name) = read {
            return Some(Caller::every_pool(name, Role::Read));
        }
        let configured = named?;
        Some(Caller {
            name: configured.name,
            role: configured.role,
            scope: Scope::of(&configured.pools).ok()?,
        })
    }

    /// The caller named `name` with `role` as the configuration has it now
    /// (a console session's token, checked on every page), if its token
    /// `holds` (the session's fingerprint of the token it logged in with):
    /// `None` once the token is gone, replaced or its role changed.
    pub fn by_name(
        service: &Service,
        name: &str,
        role: Role,
        holds: impl Fn(&str) -> bool,
    ) -> Option<Caller> {
        let config = service.config();
        let server = &config.server;
        let legacy = |tokens: &[Secret], key: &str| {
            tokens.iter().enumerate().any(|(index, token)| {
                token.origin().unwrap_or_else(|| format!("{key}[{index}]")) == name
                    && holds(token.expose())
            })
        };
        match role {
            Role::Admin if legacy(&server.admin_tokens, "admin_tokens") => {
                return Some(Caller::every_pool(name.to_owned(), Role::Admin))
            }
            Role::Read if legacy(&server.read_tokens, "read_tokens") => {
                return Some(Caller::every_pool(name.to_owned(), Role::Read))
            }
            _ => {}
        }
        let configured = server
            .tokens
            .iter()
            .find(|t| t.name == name && t.role == role && holds(t.token.expose()))?;
        Some(Caller {
            name: configured.name.clone(),
            role,
            scope: Scope::of(&configured.pools).ok()?,
        })
    }

    fn every_pool(name: String, role: Role) -> Caller {
        Caller {
            name,
            role,
            scope: Scope::every_pool(),
        }
    }

    pub fn admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// Whether it may operate (cancel, pause, drain, submit…).
    pub fn operates(&self) -> bool {
        self.role >= Role::Operate
    }

    /// 403 unless the caller covers `pool` (`None`: a job without a pool,
    /// which only a token of every pool covers).
    pub fn require_pool(&self, pool: Option<&str>) -> Result<(), ApiError> {
        if self.scope.covers(pool) {
            Ok(())
        } else {
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "out_of_scope",
                match pool {
                    Some(pool) => format!("token {:?} does not cover pool {pool:?}", self.name),
                    None => format!(
                        "token {:?} covers only some pools; this has none",
                        self.name
                    ),
                },
            ))
        }
    }

    /// 403 unless the caller covers every pool: what is not one pool's
    /// (the audit trail, tasks, the cluster, worker configurations).
    pub fn require_every_pool(&self) -> Result<(), ApiError> {
        if self.scope.is_every_pool() {
            Ok(())
        } else {
            Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "out_of_scope",
                format!(
                    "token {:?} covers only some pools; this needs a token of every pool",
                    self.name
                ),
            ))
        }
    }
}

/// The caller may read: any valid token.
pub struct Reader(pub Caller);

/// The caller may operate: a token of role `operate` or `admin`.
pub struct Operator(pub Caller);

/// The caller may do everything: a token of role `admin`.
pub struct Admin(pub Caller);

fn needs(role: Role) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "forbidden",
        format!(
            "this token's role may not do this; it needs role {:?} or above ([server] admin_tokens, or [[server.tokens]] with role = {:?})",
            role.as_str(),
            role.as_str()
        ),
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
            if server.admin_tokens.is_empty()
                && server.read_tokens.is_empty()
                && server.tokens.is_empty()
            {
                return Err(ApiError::unauthorized(
                    "the admin API is disabled: no [server] admin_tokens, read_tokens or tokens are configured",
                ));
            }
        }
        let presented = bearer(parts)?;
        Caller::of_token(service, presented)
            .map(Reader)
            .ok_or_else(|| ApiError::unauthorized("the bearer token is not valid"))
    }
}

impl FromRequestParts<Arc<Service>> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        service: &Arc<Service>,
    ) -> Result<Operator, ApiError> {
        let Reader(caller) = Reader::from_request_parts(parts, service).await?;
        if caller.operates() {
            Ok(Operator(caller))
        } else {
            Err(needs(Role::Operate))
        }
    }
}

impl FromRequestParts<Arc<Service>> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        service: &Arc<Service>,
    ) -> Result<Admin, ApiError> {
        let Reader(caller) = Reader::from_request_parts(parts, service).await?;
        if caller.admin() {
            Ok(Admin(caller))
        } else {
            Err(needs(Role::Admin))
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

/// The runner of a long poll (`POST /api/v1/jobs/request`) or a
/// completion: read as [`RunnerAuth`] reads it, or, asked again with the
/// same token within `tokens::RENEWAL_TTL`, as runway last read or wrote
/// it for that token (`Service::renewals`; see there for when that is
/// trusted).
pub struct RememberedRunner(pub ByToken);

impl FromRequestParts<Arc<Service>> for RememberedRunner {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        service: &Arc<Service>,
    ) -> Result<RememberedRunner, ApiError> {
        let token_hash = token_hash(bearer(parts)?);
        let now = std::time::Instant::now();
        if let Some(runner) = service.renewals.get(&token_hash, now) {
            return Ok(RememberedRunner(ByToken {
                runner,
                token_hash,
                remembered: true,
            }));
        }
        service.metrics.long_poll_runner_reads.inc();
        let RunnerAuth(runner) = RunnerAuth::from_request_parts(parts, service).await?;
        let runner = Arc::new(runner);
        service.renewals.put(&token_hash, runner.clone(), now);
        Ok(RememberedRunner(ByToken {
            runner,
            token_hash,
            remembered: false,
        }))
    }
}

/// A runner, identified by its runner token or its report token: what may
/// post the runner's own reports.
pub struct ReporterAuth(pub Runner);

impl FromRequestParts<Arc<Service>> for ReporterAuth {
    type Rejection = ApiError;

    /// Every refusal is counted in `runway_runner_reports_rejected_total`
    /// by reason, as the report's own refusals are.
    async fn from_request_parts(
        parts: &mut Parts,
        service: &Arc<Service>,
    ) -> Result<ReporterAuth, ApiError> {
        let refused = |reason: &'static str, error: ApiError| {
            service.metrics.report_refused(reason);
            error
        };
        let presented = bearer(parts).map_err(|e| refused("unauthorized", e))?;
        let found = service
            .store
            .find_runner_by_token(&token_hash(presented))
            .await
            .map_err(|error| {
                service.store_failed("find_runner_by_token");
                tracing::error!(%error, "cannot look up a runner token");
                refused("store_unavailable", ApiError::store_unavailable())
            })?;
        let runner = crate::app::tokens::admitted(found)
            .map_err(|(reason, message)| refused(reason, ApiError::unauthorized(message)))?;
        Ok(ReporterAuth(runner))
    }
}

/// 403 unless `caller` covers job `id`'s pool; 404 when there is no such
/// job (asked first, so a scoped token learns nothing of other pools'
/// jobs but that they exist).
pub async fn require_job(
    service: &Service,
    caller: &Caller,
    id: runway_core::JobId,
) -> Result<(), ApiError> {
    if caller.scope.is_every_pool() {
        return Ok(());
    }
    let job = service
        .store
        .get_job(id)
        .await
        .map_err(|e| ApiError::from(crate::app::AppError::store(service, "get_job", e)))?
        .ok_or_else(|| ApiError::not_found(format!("no job {id}")))?;
    caller.require_pool(job.pool.as_deref())
}

/// The same for runner `id`.
pub async fn require_runner(
    service: &Service,
    caller: &Caller,
    id: runway_core::RunnerId,
) -> Result<(), ApiError> {
    if caller.scope.is_every_pool() {
        return Ok(());
    }
    let runner = service
        .store
        .get_runner(id)
        .await
        .map_err(|e| ApiError::from(crate::app::AppError::store(service, "get_runner", e)))?
        .ok_or_else(|| ApiError::not_found(format!("no runner {id}")))?;
    caller.require_pool(Some(&runner.pool))
}
