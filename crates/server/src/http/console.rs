//! The web console at `/`: server-rendered HTML (minijinja templates
//! compiled into the binary, autoescaped), no JavaScript build step and no
//! third-party assets; one small script takes live updates from
//! Server-Sent Events (`/console/stream`).
//!
//! Login is with a token, exchanged for a session cookie (HttpOnly,
//! SameSite=Strict) that is signed with this installation's key (a store
//! setting, so every replica accepts it and it outlives a restart) and
//! carries a session id, its expiry, and the name and a fingerprint of the
//! token it came from. What ends a session is kept in the store, so it
//! holds on every replica and across restarts: logging out (the id is
//! recorded as ended until it would have expired anyway, then pruned with
//! the store's other once-keys), an admin's "end all sessions" (sessions
//! begun before it are refused), and removing or replacing the token in
//! the config (checked on every page and every few seconds of the live
//! stream). Logins and logouts go to the audit trail. Every
//! form that changes something carries a CSRF token derived from the
//! session, and a POST whose `Origin` is another site is refused. Read
//! tokens see no buttons, and their POSTs are refused anyway.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use base64::Engine;
use hmac::{Hmac, Mac};
use runway_core::{JobId, JobSource, JobState, RunnerId, Timestamp};
use runway_store::JobFilter;
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::Sha256;

use crate::app::explain::Explanation;
use crate::app::{admin, Service};
use crate::clock::{now, rfc3339};
use crate::http::auth::Caller;

const COOKIE: &str = "runway_session";
/// A session lasts this long; then the token is asked for again.
const SESSION: Duration = Duration::from_secs(12 * 3600);
/// Jobs per console page.
const PAGE: u32 = 50;
/// How often the live view is refreshed.
const TICK: Duration = Duration::from_secs(1);
/// Every this many ticks the live stream checks its session still holds.
const SESSION_RECHECK_TICKS: u32 = 5;

pub fn router() -> Router<Arc<Service>> {
    Router::new()
        .route("/", get(overview))
        .route("/console/login", post(login))
        .route("/console/logout", post(logout))
        .route("/console/sessions/end", post(end_sessions))
        .route("/console/jobs", get(jobs))
        .route("/console/jobs/{id}", get(job))
        .route("/console/jobs/bulk", post(bulk_job_action))
        .route("/console/jobs/{id}/{action}", post(job_action))
        .route("/console/runners", get(runners))
        .route("/console/runners/{id}", get(runner_page))
        .route("/console/runners/{id}/{action}", post(runner_action))
        .route("/console/pools/{name}", get(pool_page))
        .route("/console/pools/{name}/{action}", post(pool_action))
        .route("/console/audit", get(audit))
        .route("/console/tasks", get(tasks))
        .route("/console/cluster", get(cluster))
        .route("/console/worker-configs", get(worker_configs))
        .route("/console/stream", get(stream))
}

fn templates() -> &'static minijinja::Environment<'static> {
    static TEMPLATES: std::sync::OnceLock<minijinja::Environment<'static>> =
        std::sync::OnceLock::new();
    TEMPLATES.get_or_init(|| {
        let mut env = minijinja::Environment::new();
        for (name, source) in [
            ("layout.html", include_str!("console/layout.html")),
            ("login.html", include_str!("console/login.html")),
            ("overview.html", include_str!("console/overview.html")),
            ("pool.html", include_str!("console/pool.html")),
            ("jobs.html", include_str!("console/jobs.html")),
            ("job.html", include_str!("console/job.html")),
            ("runners.html", include_str!("console/runners.html")),
            ("runner.html", include_str!("console/runner.html")),
            ("audit.html", include_str!("console/audit.html")),
            ("tasks.html", include_str!("console/tasks.html")),
            ("cluster.html", include_str!("console/cluster.html")),
            (
                "worker_configs.html",
                include_str!("console/worker_configs.html"),
            ),
        ] {
            if let Err(error) = env.add_template(name, source) {
                tracing::error!(%error, name, "a console template does not parse");
            }
        }
        env
    })
}

fn render(status: StatusCode, name: &str, context: minijinja::Value) -> Response {
    match templates()
        .get_template(name)
        .and_then(|template| template.render(context))
    {
        Ok(html) => (
            status,
            [
                (header::CACHE_CONTROL, "no-store"),
                (
                    header::CONTENT_SECURITY_POLICY,
                    "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; frame-ancestors 'none'",
                ),
            ],
            Html(html),
        )
            .into_response(),
        Err(error) => {
            tracing::error!(%error, name, "cannot render a console page");
            (StatusCode::INTERNAL_SERVER_ERROR, "cannot render this page\n").into_response()
        }
    }
}

/// This installation's key for sessions and CSRF tokens.
async fn key(service: &Service) -> Option<Vec<u8>> {
    service
        .console_key
        .get_or_try_init(|| async {
            let candidate = hex::encode(rand::random::<[u8; 32]>());
            service
                .store
                .init_setting("console_session_key", &candidate)
                .await
                .map(|key| key.into_bytes())
        })
        .await
        .inspect_err(|error| tracing::error!(%error, "cannot read the console's session key"))
        .ok()
        .cloned()
}

fn mac(key: &[u8], text: &str) -> String {
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(key) else {
        return String::new();
    };
    mac.update(text.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

fn same(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// A logged-in browser: who, the CSRF token its forms carry, and its id.
struct Session {
    caller: Caller,
    csrf: String,
    id: String,
}

/// The store's record that session `id` was logged out.
fn ended_key(id: &str) -> String {
    format!("console_session_ended:{id}")
}

/// The store setting that holds when an admin last ended every session:
/// sessions begun before it are refused.
const SESSIONS_SINCE: &str = "console_sessions_since";

/// The fingerprint of `token` a session carries: enough to tell the token
/// it logged in with from another under the same name, nothing to log in
/// with.
fn fingerprint(key: &[u8], token: &str) -> String {
    mac(key, &format!("token.{token}"))[..16].to_owned()
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// The session `headers` carry, if it is valid, unexpired, and its token
/// is still configured with the same rights.
async fn session(service: &Service, headers: &HeaderMap) -> Option<Session> {
    let value = cookie(headers, COOKIE)?;
    let key = key(service).await?;
    let (signed, signature) = value.rsplit_once('.')?;
    if !same(&mac(&key, signed), signature) {
        return None;
    }
    let mut parts = signed.splitn(5, '.');
    let (role, expires, name, id, print) = (
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
        parts.next()?,
    );
    let expires = Timestamp::from_millis(expires.parse::<i64>().ok()?);
    if expires < now() {
        return None;
    }
    // Ended by an admin, or logged out: the store says.
    let begun = expires.as_millis() - SESSION.as_millis() as i64;
    match service.store.get_setting(SESSIONS_SINCE).await {
        Ok(Some(since)) if since.parse::<i64>().is_ok_and(|since| begun < since) => return None,
        Ok(_) => {}
        Err(error) => {
            tracing::warn!(%error, "cannot read when sessions were last ended; refusing the session");
            return None;
        }
    }
    match service.store.once_claimed(&ended_key(id)).await {
        Ok(false) => {}
        Ok(true) => return None,
        Err(error) => {
            tracing::warn!(%error, "cannot read whether a session was ended; refusing it");
            return None;
        }
    }
    let name = String::from_utf8(
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(name)
            .ok()?,
    )
    .ok()?;
    let role = match role {
        "admin" => crate::config::Role::Admin,
        "operate" => crate::config::Role::Operate,
        "read" => crate::config::Role::Read,
        _ => return None,
    };
    // The token must still be configured, the same one, with the same role.
    let caller = Caller::by_name(service, &name, role, |token| {
        same(&fingerprint(&key, token), print)
    })?;
    Some(Session {
        caller,
        csrf: mac(&key, &format!("csrf.{value}")),
        id: id.to_owned(),
    })
}

/// The login form. It says where a token is only when runway wrote one
/// (started without a config file); otherwise the operator's config holds
/// the tokens.
fn login_page(service: &Service, status: StatusCode, flash: Option<&str>) -> Response {
    let wrote_token = service
        .reload_source
        .get()
        .is_some_and(|source| source.generated_admin_token.is_some());
    render(
        status,
        "login.html",
        minijinja::context! { flash => flash, wrote_token => wrote_token },
    )
}

fn page(session: &Session, name: &str, page: &str, mut context: serde_json::Value) -> Response {
    context["caller"] = json!({
        "name": session.caller.name,
        "role": session.caller.role.as_str(),
        "admin": session.caller.admin(),
        "operate": session.caller.operates(),
    });
    context["csrf"] = json!(session.csrf);
    context["page"] = json!(page);
    render(
        StatusCode::OK,
        name,
        minijinja::Value::from_serialize(&context),
    )
}

#[derive(Deserialize)]
struct LoginForm {
    token: String,
}

async fn login(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    if let Err(refused) = same_origin(&headers) {
        return refused.into_response();
    }
    let Some(caller) = Caller::of_token(&service, form.token.trim()) else {
        return login_page(
            &service,
            StatusCode::UNAUTHORIZED,
            Some("That token is not valid."),
        );
    };
    let Some(key) = key(&service).await else {
        return login_page(
            &service,
            StatusCode::SERVICE_UNAVAILABLE,
            Some("The store is unavailable; try again."),
        );
    };
    let role = caller.role.as_str();
    let expires = now().plus(SESSION).as_millis();
    let name = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(caller.name.as_bytes());
    let id = hex::encode(rand::random::<[u8; 16]>());
    let print = fingerprint(&key, form.token.trim());
    let signed = format!("{role}.{expires}.{name}.{id}.{print}");
    let value = format!("{signed}.{}", mac(&key, &signed));
    let cookie = format!(
        "{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}",
        SESSION.as_secs()
    );
    audit_session(&service, &caller.name, "console.login", &id).await;
    ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
}

#[derive(Deserialize, Default)]
struct ActionForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    force: Option<String>,
    /// The console page to return to (the jobs list an action was made
    /// from); only a console path is followed.
    #[serde(default)]
    back: Option<String>,
}

/// `back` if it is a path of the console's own (no other site, no
/// scheme-relative `//host`), else `default`.
fn back_to(back: Option<&str>, default: &str) -> String {
    match back {
        Some(path)
            if path.starts_with("/console/") && !path.contains("//") && !path.contains('\\') =>
        {
            path.to_owned()
        }
        _ => default.to_owned(),
    }
}

/// A POST from another site is refused: its `Origin` (or, without one,
/// its `Referer`) must name this host. Browsers send `Origin` on every
/// cross-site POST.
fn same_origin(headers: &HeaderMap) -> Result<(), Refusal> {
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let from = headers
        .get(header::ORIGIN)
        .or_else(|| headers.get(header::REFERER))
        .and_then(|h| h.to_str().ok());
    match from {
        None => Ok(()),
        Some(from) => {
            let authority = from
                .split_once("://")
                .map(|(_, rest)| rest.split('/').next().unwrap_or(""))
                .unwrap_or("");
            if !host.is_empty() && authority == host {
                Ok(())
            } else {
                Err(Refusal::Forbidden(
                    "This request came from another site and was refused.",
                ))
            }
        }
    }
}

/// Why a console POST is not done.
enum Refusal {
    /// No valid session: back to the login page.
    Login,
    Forbidden(&'static str),
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::Login => Redirect::to("/").into_response(),
            Refusal::Forbidden(message) => refused(message),
        }
    }
}

/// The refusal of a page or an action outside the session's pools.
const OUT_OF_SCOPE: &str = "This token does not cover that pool.";

/// The refusal of a page that belongs to no one pool, for a token of some.
const EVERY_POOL_ONLY: &str = "This page needs a token of every pool; this one covers only some.";

/// The page for the API's scope check refusing an action: the store
/// unavailable, or (out of scope, or no such job or runner for a token of
/// some pools) refused.
fn scope_refusal(error: crate::http::error::ApiError) -> Response {
    if error.status == StatusCode::SERVICE_UNAVAILABLE {
        unavailable()
    } else {
        refused(OUT_OF_SCOPE)
    }
}

fn refused(message: &str) -> Response {
    (
        StatusCode::FORBIDDEN,
        Html(format!(
            "<!doctype html><title>Refused</title><p>{}</p><p><a href=\"/\">Back to runway</a></p>",
            minijinja::HtmlEscape(message)
        )),
    )
        .into_response()
}

/// The session of a POST that changes something: logged in, an admin,
/// same-origin, carrying its CSRF token.
async fn writer(
    service: &Service,
    headers: &HeaderMap,
    form: &ActionForm,
) -> Result<Session, Refusal> {
    same_origin(headers)?;
    let Some(session) = session(service, headers).await else {
        return Err(Refusal::Login);
    };
    if !same(&session.csrf, &form.csrf) {
        return Err(Refusal::Forbidden(
            "The form's CSRF token is missing or stale; reload the page and try again.",
        ));
    }
    if !session.caller.operates() {
        return Err(Refusal::Forbidden(
            "This token may only read; changes need a token of role operate or admin.",
        ));
    }
    Ok(session)
}

async fn logout(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Response {
    if let Err(refused) = same_origin(&headers) {
        return refused.into_response();
    }
    if let Some(session) = session(&service, &headers).await {
        if !same(&session.csrf, &form.csrf) {
            return refused("The form's CSRF token is missing or stale.");
        }
        // Ended in the store, for every replica, until it would have
        // expired anyway (then pruned with the other once-keys).
        let ended = service
            .store
            .claim_once(&ended_key(&session.id), now(), Timestamp::from_millis(0))
            .await;
        if let Err(error) = ended {
            tracing::error!(%error, "cannot end a console session");
            return login_page(
                &service,
                StatusCode::SERVICE_UNAVAILABLE,
                Some("The store is unavailable, so the session could not be ended; try again."),
            );
        }
        audit_session(
            &service,
            &session.caller.name,
            "console.logout",
            &session.id,
        )
        .await;
    }
    let cookie = format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
}

/// Ends every console session (an admin's action): sessions begun before
/// now are refused on every replica from here on, this one's too.
async fn end_sessions(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Response {
    let session = match writer(&service, &headers, &form).await {
        Ok(session) => session,
        Err(refusal) => return refusal.into_response(),
    };
    if !session.caller.admin() || !session.caller.scope.is_every_pool() {
        return refused("Only an admin token of every pool may end every session.");
    }
    let since = now().as_millis().to_string();
    if let Err(error) = service.store.put_setting(SESSIONS_SINCE, &since).await {
        tracing::error!(%error, "cannot end the console's sessions");
        return refused("The store is unavailable; no session was ended.");
    }
    audit_session(
        &service,
        &session.caller.name,
        "console.end_sessions",
        "all",
    )
    .await;
    let cookie = format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0");
    ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
}

/// A login, logout or end of sessions in the audit trail (the session is
/// named by the start of its id, never its cookie).
async fn audit_session(service: &Service, actor: &str, action: &str, id: &str) {
    let entry = runway_store::AuditEntry {
        id: 0,
        at: now(),
        actor: actor.to_owned(),
        action: action.to_owned(),
        target: format!("session {}", &id[..id.len().min(8)]),
        details: json!({"channel": "console"}).to_string(),
    };
    if let Err(error) = service.store.add_audit(&entry).await {
        tracing::error!(%error, action, "cannot write the audit trail");
    }
    tracing::info!(target: "runway::audit", %actor, action, "console session");
}

#[derive(Serialize)]
struct PoolRow {
    name: String,
    labels: Vec<String>,
    queued: u64,
    running: u64,
    booting: u64,
    idle: u64,
    busy: u64,
    max_runners: u32,
    paused: bool,
    /// What its runner group admits beyond its access policy.
    warnings: Vec<String>,
}

/// Every configured pool with its live counts: what the overview shows and
/// the stream refreshes.
async fn pool_rows(service: &Service) -> Result<Vec<PoolRow>, runway_store::StoreError> {
    let counts = service.store.live_job_counts().await?;
    let runners = service.store.list_live_runners(None).await?;
    let paused = service.store.paused_pools().await?;
    Ok(pool_rows_of(service, &counts, &runners, &paused))
}

/// [`pool_rows`] from what was read.
fn pool_rows_of(
    service: &Service,
    counts: &[runway_store::JobCount],
    runners: &[runway_core::Runner],
    paused: &[runway_store::PausedPool],
) -> Vec<PoolRow> {
    let config = service.config();
    let warnings = service
        .runner_group_warnings
        .lock()
        .map(|w| w.clone())
        .unwrap_or_default();
    config
        .pools
        .iter()
        .map(|pool| {
            let jobs = |state: JobState| {
                counts
                    .iter()
                    .filter(|c| c.pool.as_deref() == Some(pool.name.as_str()) && c.state == state)
                    .map(|c| c.count)
                    .sum()
            };
            let runners_in = |states: &[runway_core::RunnerState]| {
                runners
                    .iter()
                    .filter(|r| r.pool == pool.name && states.contains(&r.state))
                    .count() as u64
            };
            use runway_core::RunnerState as R;
            PoolRow {
                name: pool.name.clone(),
                labels: pool.labels.clone(),
                queued: jobs(JobState::Queued),
                running: jobs(JobState::Running),
                booting: runners_in(&[R::Requested, R::Provisioning]),
                idle: runners_in(&[R::Idle]),
                busy: runners_in(&[R::Busy]),
                max_runners: pool.max_runners,
                paused: paused.iter().any(|p| p.pool == pool.name),
                warnings: warnings.get(&pool.name).cloned().unwrap_or_default(),
            }
        })
        .collect()
}

fn unavailable() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        "the store is unavailable; try again\n",
    )
        .into_response()
}

/// The window of the overview's queue times.
const QUEUE_WINDOW: Duration = Duration::from_secs(3600);
/// The most jobs the queue times are computed over (the newest).
const QUEUE_SAMPLE: u32 = 50_000;

/// `d` as an operator reads it: "850 ms", "42 s", "3 min 5 s", "2 h 10 min".
fn short_duration(d: Duration) -> String {
    let seconds = d.as_secs();
    match seconds {
        0 => format!("{} ms", d.as_millis()),
        1..=59 => format!("{seconds} s"),
        60..=3599 if seconds.is_multiple_of(60) => format!("{} min", seconds / 60),
        60..=3599 => format!("{} min {} s", seconds / 60, seconds % 60),
        _ if seconds % 3600 < 60 => format!("{} h", seconds / 3600),
        _ => format!("{} h {} min", seconds / 3600, seconds % 3600 / 60),
    }
}

/// Per pool: queue times over the last hour, and the providers it may use
/// that the reconciler backs off from.
async fn pool_health(
    service: &Service,
    now: Timestamp,
) -> Result<std::collections::BTreeMap<String, serde_json::Value>, runway_store::StoreError> {
    let times = service
        .store
        .queue_times(now.minus(QUEUE_WINDOW), QUEUE_SAMPLE)
        .await?;
    let stats = crate::app::history::queue_percentiles(times);
    let backoffs = service
        .provider_backoffs
        .lock()
        .map(|b| b.clone())
        .unwrap_or_default();
    let config = service.config();
    Ok(config
        .pools
        .iter()
        .map(|pool| {
            let queue = stats.get(&pool.name).map(|(started, p50, p95)| {
                json!({"started": started, "p50": short_duration(*p50), "p95": short_duration(*p95)})
            });
            // A pool that names no provider may use any.
            let backing_off: Vec<serde_json::Value> = backoffs
                .iter()
                .filter(|b| {
                    b.retry_at > now
                        && (pool.providers.is_empty() || pool.providers.contains(&b.provider))
                })
                .map(|b| {
                    json!({"provider": b.provider, "until": rfc3339(b.retry_at), "error": b.last_error})
                })
                .collect();
            (
                pool.name.clone(),
                json!({"queue": queue, "backoffs": backing_off}),
            )
        })
        .collect())
}

/// A chart's time range: how far back, and the width of one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Range {
    Hour,
    Day,
    Week,
}

impl Range {
    fn parse(text: Option<&str>) -> Range {
        match text {
            Some("day") => Range::Day,
            Some("week") => Range::Week,
            _ => Range::Hour,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Range::Hour => "hour",
            Range::Day => "day",
            Range::Week => "week",
        }
    }

    /// (span, bucket): 60 one-minute points, 288 of five minutes, 168 of
    /// an hour.
    fn span_and_bucket(self) -> (Duration, Duration) {
        match self {
            Range::Hour => (Duration::from_secs(3600), Duration::from_secs(60)),
            Range::Day => (Duration::from_secs(24 * 3600), Duration::from_secs(300)),
            Range::Week => (
                Duration::from_secs(7 * 24 * 3600),
                Duration::from_secs(3600),
            ),
        }
    }

    /// The buckets' starts, oldest first, the last one holding `now`;
    /// and where reading starts.
    fn buckets(self, now: Timestamp) -> (Vec<Timestamp>, Timestamp) {
        let (span, bucket) = self.span_and_bucket();
        let width = bucket.as_millis() as i64;
        let count = (span.as_millis() / bucket.as_millis()) as i64;
        let last = now.as_millis().div_euclid(width) * width;
        let starts: Vec<Timestamp> = (0..count)
            .map(|i| Timestamp::from_millis(last - (count - 1 - i) * width))
            .collect();
        let since = starts.first().copied().unwrap_or(now);
        (starts, since)
    }
}

/// `points` (one pool's, in time order) as one value per bucket of
/// `starts`, by `value`; `None` where no sample fell.
fn per_bucket(
    starts: &[Timestamp],
    points: &[&runway_store::PoolHistoryPoint],
    value: impl Fn(&runway_store::PoolHistoryPoint) -> Option<f64>,
) -> Vec<Option<f64>> {
    let by_start: std::collections::BTreeMap<i64, &runway_store::PoolHistoryPoint> =
        points.iter().map(|p| (p.at.as_millis(), *p)).collect();
    starts
        .iter()
        .map(|at| by_start.get(&at.as_millis()).and_then(|p| value(p)))
        .collect()
}

/// What a wait reason's code means, as the pool page's breakdown says it.
fn wait_reason_words(code: &str) -> &'static str {
    match code {
        "runner_idle" => "a runner was idle for it (taken at its next poll)",
        "runner_booting" => "a runner was booting for it",
        "runner_requested" => "a runner was being started for it",
        "at_max_runners" => "the pool was at max_runners",
        "provider_backoff" => "a provider was backing off after errors",
        "no_provider_capacity" => "no provider had capacity",
        "scaling_ratio" => "the scaling ratio held it back",
        "lease_expired_requeued" => "requeued after its runner's lease expired",
        "pool_paused" => "the pool was paused",
        "key_at_cap" => "its repository was at its running cap (fair share)",
        _ => "another reason",
    }
}

fn money(micros: i64) -> String {
    format!("${:.2}", micros as f64 / 1e6)
}

#[derive(Deserialize)]
struct RangeQuery {
    range: Option<String>,
}

/// One pool over the last hour, day or week: its jobs, runners, queue
/// times and cost as charts, and why its jobs waited.
async fn pool_page(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(query): Query<RangeQuery>,
) -> Response {
    let Some(session) = session(&service, &headers).await else {
        return Redirect::to("/").into_response();
    };
    let Ok(pools) = pool_rows(&service).await else {
        return unavailable();
    };
    let Some(pool) = pools.into_iter().find(|p| p.name == name) else {
        return not_found("No such pool.", "/", "Overview");
    };
    if !session.caller.scope.covers(Some(&pool.name)) {
        return refused(OUT_OF_SCOPE);
    }
    let now = now();
    let range = Range::parse(query.range.as_deref());
    let (starts, since) = range.buckets(now);
    let (_, bucket) = range.span_and_bucket();
    let (Ok(history), Ok(waits), Ok(health)) = (
        service
            .store
            .pool_history(Some(&pool.name), since, bucket)
            .await,
        service.store.pool_waits(&pool.name, since).await,
        pool_health(&service, now).await,
    ) else {
        return unavailable();
    };
    let points: Vec<&runway_store::PoolHistoryPoint> = history.iter().collect();
    use crate::http::charts::{line_chart, Series};
    let count = |v: f64| format!("{v:.0}");
    let jobs_chart = line_chart(
        "Jobs queued and running",
        &starts,
        &[
            Series {
                name: "queued",
                color: "#b26a00",
                values: per_bucket(&starts, &points, |p| Some(p.queued)),
            },
            Series {
                name: "running",
                color: "#0969da",
                values: per_bucket(&starts, &points, |p| Some(p.running)),
            },
        ],
        count,
    );
    let runners_chart = line_chart(
        "Runners by state",
        &starts,
        &[
            Series {
                name: "booting",
                color: "#b26a00",
                values: per_bucket(&starts, &points, |p| Some(p.booting)),
            },
            Series {
                name: "idle",
                color: "#2e7d32",
                values: per_bucket(&starts, &points, |p| Some(p.idle)),
            },
            Series {
                name: "busy",
                color: "#0969da",
                values: per_bucket(&starts, &points, |p| Some(p.busy)),
            },
        ],
        count,
    );
    let seconds = |ms: Option<i64>| ms.map(|ms| ms as f64 / 1000.0);
    let wait_chart = line_chart(
        "Queue time of the jobs that started",
        &starts,
        &[
            Series {
                name: "p50",
                color: "#0969da",
                values: per_bucket(&starts, &points, |p| seconds(p.wait_p50_ms)),
            },
            Series {
                name: "p95",
                color: "#c62828",
                values: per_bucket(&starts, &points, |p| seconds(p.wait_p95_ms)),
            },
        ],
        crate::http::charts::axis_duration,
    );
    let cost_chart = line_chart(
        "Cost per bucket",
        &starts,
        &[Series {
            name: "cost",
            color: "#66707c",
            values: per_bucket(&starts, &points, |p| Some(p.cost_micros as f64 / 1e6)),
        }],
        |v| format!("${v:.2}"),
    );
    let cost: i64 = history.iter().map(|p| p.cost_micros).sum();
    let runner_seconds: i64 = history.iter().map(|p| p.runner_seconds).sum();
    let started: i64 = history.iter().map(|p| p.started).sum();
    let waited: i64 = waits.iter().map(|(_, jobs)| jobs).sum();
    let waits: Vec<serde_json::Value> = waits
        .iter()
        .map(|(code, jobs)| {
            json!({
                "code": code,
                "words": wait_reason_words(code),
                "job_minutes": jobs,
                "share": format!("{:.0} %", 100.0 * *jobs as f64 / waited.max(1) as f64),
            })
        })
        .collect();
    let health = health.get(&pool.name).cloned().unwrap_or_default();
    let warm = service
        .warm
        .lock()
        .ok()
        .and_then(|warm| warm.get(&pool.name).cloned())
        .map(|w| {
            json!({
                "target": w.target,
                "expected": w.forecast.jobs,
                "why": w.why(),
                "batches": w.forecast.batches.iter().map(|b| json!({
                    "earliest": format!("{} UTC", crate::clock::hh_mm(b.earliest)),
                    "latest": format!("{} UTC", crate::clock::hh_mm(b.latest)),
                    "jobs": b.jobs,
                    "remaining": b.remaining,
                    "seen": b.seen,
                    "of": b.of,
                    "weekly": b.weekly,
                    "warm": b.warm,
                })).collect::<Vec<_>>(),
            })
        });
    page(
        &session,
        "pool.html",
        "overview",
        json!({
            "pool": pool,
            "health": health,
            "range": range.name(),
            "sampled": history.len(),
            "charts": [jobs_chart, runners_chart, wait_chart, cost_chart],
            "cost": money(cost),
            "runner_hours": format!("{:.1}", runner_seconds as f64 / 3600.0),
            "started": started,
            "waits": waits,
            "warm": warm,
        }),
    )
}

/// Per pool, a sparkline of its queued jobs over the last hour, and its
/// runner time and cost over the last day.
async fn overview_history(
    service: &Service,
    now: Timestamp,
) -> Result<std::collections::BTreeMap<String, serde_json::Value>, runway_store::StoreError> {
    let (starts, since) = Range::Hour.buckets(now);
    let hour = service
        .store
        .pool_history(None, since, Duration::from_secs(60))
        .await?;
    // The last 24 hours in buckets wider than the window (at most two
    // rows a pool, where the window crosses a bucket's edge), summed below.
    let day = service
        .store
        .pool_history(
            None,
            now.minus(Duration::from_secs(24 * 3600)),
            Duration::from_secs(24 * 3600 * 2),
        )
        .await?;
    let config = service.config();
    Ok(config
        .pools
        .iter()
        .map(|pool| {
            let points: Vec<&runway_store::PoolHistoryPoint> =
                hour.iter().filter(|p| p.pool == pool.name).collect();
            let queued = per_bucket(&starts, &points, |p| Some(p.queued));
            let (cost, seconds) = day
                .iter()
                .filter(|p| p.pool == pool.name)
                .fold((0, 0), |(c, s), p| (c + p.cost_micros, s + p.runner_seconds));
            (
                pool.name.clone(),
                json!({
                    "sparkline": crate::http::charts::sparkline(&format!("{} queued, last hour", pool.name), &queued),
                    "cost": money(cost),
                    "runner_hours": format!("{:.1}", seconds as f64 / 3600.0),
                }),
            )
        })
        .collect())
}

async fn overview(State(service): State<Arc<Service>>, headers: HeaderMap) -> Response {
    let Some(session) = session(&service, &headers).await else {
        return login_page(&service, StatusCode::OK, None);
    };
    let Ok(mut pools) = pool_rows(&service).await else {
        return unavailable();
    };
    pools.retain(|pool| session.caller.scope.covers(Some(&pool.name)));
    let Ok(health) = pool_health(&service, now()).await else {
        return unavailable();
    };
    let Ok(history) = overview_history(&service, now()).await else {
        return unavailable();
    };
    let store = match service.store.backend() {
        runway_store::Backend::Sqlite => "sqlite",
        runway_store::Backend::Postgres => "postgres",
    };
    page(
        &session,
        "overview.html",
        "overview",
        json!({"pools": pools, "health": health, "history": history, "version": env!("CARGO_PKG_VERSION"), "store": store}),
    )
}

/// `text`, and — where a pool's providers make several offers — which
/// one bidding chose and why.
fn bidding(offers: &[crate::app::explain::OfferChoice], text: String) -> String {
    if offers.len() < 2 {
        return text;
    }
    let Some(chosen) = offers.iter().find(|c| c.chosen) else {
        return format!("{text}; every offer is backing off or full");
    };
    let offer = &chosen.offer;
    let name = if offer.key.is_empty() {
        offer.provider.clone()
    } else {
        format!("{} {}", offer.provider, offer.key)
    };
    format!(
        "{text}; bidding chose {name} at ${:.4}/h, reliability {:.2}, over {} other offers",
        offer.price_per_hour,
        offer.reliability,
        offers.len() - 1
    )
}

/// A wait reason in a sentence.
fn waiting_text(explanation: &Explanation) -> String {
    use runway_core::planner::WaitReason as W;
    match explanation {
        Explanation::Waiting {
            reason,
            has_providers,
            offers,
            warm,
        } => {
            let text = bidding(
                offers,
                match reason {
                    W::RunnerIdle { runner } => {
                        format!("runner {runner} is idle and takes it at its next poll")
                    }
                    W::RunnerBooting { runner, since } => {
                        format!(
                            "runner {runner} is booting for it (since {})",
                            rfc3339(*since)
                        )
                    }
                    W::RunnerRequested { provider } => {
                        format!("a runner is being started by {provider}")
                    }
                    W::AtMaxRunners { max_runners } => {
                        format!("the pool is at max_runners ({max_runners})")
                    }
                    W::ProviderBackoff {
                        provider,
                        last_error,
                        retry_at,
                    } => format!(
                        "provider {provider} is backing off until {} after: {last_error}",
                        rfc3339(*retry_at)
                    ),
                    W::NoProviderCapacity if !has_providers => {
                        "no provider starts runners for this pool; waiting for a runner to register"
                            .to_owned()
                    }
                    W::NoProviderCapacity => "no provider has capacity left".to_owned(),
                    W::ScalingRatio { scaling_ratio } => {
                        format!(
                            "scaling_ratio {scaling_ratio} starts fewer runners than queued jobs"
                        )
                    }
                    W::LeaseExpiredRequeued { attempts } => {
                        format!("requeued after a runner's lease expired ({attempts} attempts)")
                    }
                    W::PoolPaused => "the pool is paused".to_owned(),
                    W::KeyAtCap { key, max_running } => format!(
                        "{} already has {max_running} jobs running here (the pool's cap per key)",
                        if key.is_empty() {
                            "its key"
                        } else {
                            key.as_str()
                        }
                    ),
                },
            );
            match warm {
                Some(warm) => format!("{text}; {warm}"),
                None => text,
            }
        }
        Explanation::Unroutable { reason } => {
            format!(
                "unroutable: {}",
                reason.as_deref().unwrap_or("no pool serves its labels")
            )
        }
        Explanation::PoolNotConfigured { .. } => {
            "its pool is no longer in the configuration".to_owned()
        }
    }
}

fn repository(job: &runway_core::Job) -> Option<String> {
    let details: serde_json::Value = serde_json::from_str(&job.payload).ok()?;
    details["repository"]
        .as_str()
        .or_else(|| details["repo"].as_str())
        .map(str::to_owned)
}

#[derive(Deserialize, Default)]
struct JobsQuery {
    pool: Option<String>,
    state: Option<String>,
    repository: Option<String>,
    /// Older than this job (the "Older" link).
    cursor: Option<i64>,
    /// Newer than this job (the "Newer" link).
    after: Option<i64>,
}

fn job_row(job: &runway_core::Job, waiting: Option<&Explanation>) -> serde_json::Value {
    json!({
        "id": job.id.0,
        "pool": job.pool,
        "labels": job.labels,
        "state": job.state.as_str(),
        "waiting": waiting.map(waiting_text).unwrap_or_default(),
        "runner": job.runner.map(|r| r.0),
        // A queued job has no runner yet; the one booting (or idle) for it
        // is named beside it, as its reason names it.
        "runner_for": match waiting {
            Some(Explanation::Waiting {
                reason:
                    runway_core::planner::WaitReason::RunnerBooting { runner, .. }
                    | runway_core::planner::WaitReason::RunnerIdle { runner },
                ..
            }) if job.runner.is_none() => Some(runner.0),
            _ => None,
        },
        "enqueued_at": rfc3339(job.enqueued_at),
        "queued_ago": age(now(), job.enqueued_at),
        "repository": repository(job),
        "source": job.source.as_str(),
        "external_id": job.external_id,
        "share_key": job.share.key,
        "live": !job.state.is_terminal(),
        "retryable": job.source == JobSource::Api
            && matches!(job.state, JobState::Failed | JobState::Cancelled),
    })
}

async fn jobs(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Query(query): Query<JobsQuery>,
) -> Response {
    let Some(session) = session(&service, &headers).await else {
        return Redirect::to("/").into_response();
    };
    let pool = query.pool.clone().filter(|p| !p.is_empty());
    if pool
        .as_deref()
        .is_some_and(|p| !session.caller.scope.covers(Some(p)))
    {
        return refused(OUT_OF_SCOPE);
    }
    let state = query
        .state
        .as_deref()
        .filter(|s| !s.is_empty())
        .and_then(|s| s.parse::<JobState>().ok());
    let repository_filter = query.repository.clone().filter(|r| !r.is_empty());
    let newer = query.after.is_some() && query.cursor.is_none();
    let from = if newer { query.after } else { query.cursor }.map(JobId);
    let Ok((mut shown, further)) = read_jobs_page(
        &service,
        &session,
        state,
        pool.as_ref(),
        repository_filter.as_deref(),
        from,
        newer,
    )
    .await
    else {
        return unavailable();
    };
    // Newest first on every page, whichever way it was read.
    if newer {
        shown.reverse();
    }
    // Older: where an older read stopped; from a newer read, below the
    // page (the page it came from). Newer: where a newer read stopped;
    // from an older read that began at a cursor, above the page.
    let (older, newer_than) = if newer {
        (shown.last().map(|j| j.id), further)
    } else {
        (further, from.and(shown.first().map(|j| j.id)))
    };
    let Ok(explained) = crate::app::explain::explain_jobs(&service, &shown).await else {
        return unavailable();
    };
    let rows: Vec<_> = shown
        .iter()
        .map(|job| job_row(job, explained.get(&job.id)))
        .collect();
    let link = |key: &str, id: JobId| {
        let mut link = format!("/console/jobs?{key}={}", id.0);
        for (key, value) in [
            ("pool", &pool),
            ("state", &query.state),
            ("repository", &repository_filter),
        ] {
            if let Some(value) = value.as_ref().filter(|v| !v.is_empty()) {
                link.push_str(&format!("&{key}={}", url_encode(value)));
            }
        }
        link
    };
    let next_page = older.map(|id| link("cursor", id));
    let newer_page = newer_than.map(|id| link("after", id));
    // This page, for an action to come back to.
    let here = match (query.cursor, query.after) {
        (Some(cursor), _) => link("cursor", JobId(cursor)),
        (None, Some(after)) => link("after", JobId(after)),
        (None, None) => link("cursor", JobId(i64::MAX)),
    };
    let config = service.config();
    page(
        &session,
        "jobs.html",
        "jobs",
        json!({
            "jobs": rows,
            "followed": shown.iter().map(|j| j.id.0).collect::<Vec<_>>(),
            "next_page": next_page,
            "newer_page": newer_page,
            "here": here,
            "pool_names": config
                .pools
                .iter()
                .filter(|p| session.caller.scope.covers(Some(&p.name)))
                .map(|p| p.name.clone())
                .collect::<Vec<_>>(),
            "states": JobState::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
            "filter": {"pool": pool, "state": query.state, "repository": repository_filter},
        }),
    )
}

/// One page of jobs from `from` (exclusive), older (newest first) or
/// `newer` (oldest first), keeping those the session may see and the
/// repository filter wants; and the cursor to read on from when more lie
/// that way. A filter that hides most reads on until the page is full,
/// up to 20 reads; where that bound stops it, the cursor is where reading
/// stopped.
async fn read_jobs_page(
    service: &Service,
    session: &Session,
    state: Option<JobState>,
    pool: Option<&String>,
    repository_filter: Option<&str>,
    from: Option<JobId>,
    newer: bool,
) -> Result<(Vec<runway_core::Job>, Option<JobId>), runway_store::StoreError> {
    let mut shown = Vec::new();
    let mut position = from;
    for _ in 0..20 {
        let filter = JobFilter {
            state,
            pool: pool.cloned(),
            limit: Some(PAGE + 1),
            newest_first: !newer,
            oldest_first: newer,
            before: if newer { None } else { position },
            after: if newer { position } else { None },
        };
        let mut read = service.store.list_jobs(&filter).await?;
        let more = read.len() > PAGE as usize;
        read.truncate(PAGE as usize);
        position = read.last().map(|j| j.id);
        let fetched = read.len();
        for (index, job) in read.into_iter().enumerate() {
            let keep = session.caller.scope.covers(job.pool.as_deref())
                && repository_filter
                    .is_none_or(|wanted| repository(&job).as_deref() == Some(wanted));
            if keep {
                shown.push(job);
            }
            if shown.len() == PAGE as usize {
                // Full: more lie beyond if anything is left after it.
                let left = index + 1 < fetched || more;
                let further = left.then(|| shown.last().map(|j| j.id)).flatten();
                return Ok((shown, further));
            }
        }
        if !more {
            return Ok((shown, None));
        }
    }
    Ok((shown, position))
}

fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

async fn job(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Path(id): Path<i64>,
) -> Response {
    let Some(session) = session(&service, &headers).await else {
        return Redirect::to("/").into_response();
    };
    let id = JobId(id);
    let Ok(found) = service.store.get_job(id).await else {
        return unavailable();
    };
    let Some(found) = found else {
        return not_found("No such job.", "/console/jobs", "Jobs");
    };
    if !session.caller.scope.covers(found.pool.as_deref()) {
        return refused(OUT_OF_SCOPE);
    }
    let explanation = crate::app::explain::explain_job(&service, &found)
        .await
        .ok()
        .flatten();
    let steps = service
        .store
        .job_history(id)
        .await
        .ok()
        .flatten()
        .unwrap_or_default();
    let mut before = None;
    let events: Vec<_> = steps
        .iter()
        .map(|step| {
            let event = crate::http::admin::event_name(before, step);
            before = Some(step.state);
            json!({
                "at": rfc3339(step.at),
                "event": event,
                "state": step.state.as_str(),
                "runner": step.runner.map(|r| r.0),
                "conclusion": step.conclusion.map(|c| c.as_str()),
                "reason": step.reason,
            })
        })
        .collect();
    let log = service
        .store
        .get_job_log(id)
        .await
        .ok()
        .flatten()
        .map(|(_, log)| log);
    // What an operator asks of one job: what it runs, for how long it may,
    // how long it waited and ran, and how it ended.
    let payload: serde_json::Value = serde_json::from_str(&found.payload).unwrap_or_default();
    let at = now();
    let span =
        |from: Timestamp, to: Option<Timestamp>| short_duration(to.unwrap_or(at).since(from));
    let facts = json!({
        "script": payload["script"].as_str(),
        "timeout": payload["timeout_seconds"].as_u64().map(|s| short_duration(Duration::from_secs(s))),
        "queued_for": span(found.created_at, found.started_at.or(found.finished_at)),
        "ran_for": found.started_at.map(|started| span(started, found.finished_at)),
        "reason": found.reason,
        "conclusion": found.conclusion.map(|c| c.as_str()),
        "created_at": rfc3339(found.created_at),
        "finished_at": found.finished_at.map(rfc3339),
    });
    page(
        &session,
        "job.html",
        "jobs",
        json!({"job": job_row(&found, explanation.as_ref()), "facts": facts, "events": events, "log": log, "followed": [found.id.0]}),
    )
}

#[derive(Deserialize)]
struct RunnersQuery {
    pool: Option<String>,
}

async fn runners(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Query(query): Query<RunnersQuery>,
) -> Response {
    let Some(session) = session(&service, &headers).await else {
        return Redirect::to("/").into_response();
    };
    let pool = query.pool.filter(|p| !p.is_empty());
    let Ok(live) = service.store.list_live_runners(pool.as_deref()).await else {
        return unavailable();
    };
    let at = now();
    let rows: Vec<_> = live
        .iter()
        .filter(|runner| session.caller.scope.covers(Some(&runner.pool)))
        .map(|runner| {
            json!({
                "id": runner.id.0,
                "name": runner.name,
                "pool": runner.pool,
                "provider": runner.provider,
                "state": runner.state.as_str(),
                "job": runner.job.map(|j| j.0),
                "draining": runner.draining,
                "age": age(at, runner.requested_at),
            })
        })
        .collect();
    page(
        &session,
        "runners.html",
        "runners",
        json!({"runners": rows, "pool": pool}),
    )
}

/// One runner, live or ended (a finished job's page links here): its
/// states with their times, why it ended, and what it reported.
async fn runner_page(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Path(id): Path<i64>,
) -> Response {
    let Some(session) = session(&service, &headers).await else {
        return Redirect::to("/").into_response();
    };
    let Ok(found) = service.store.get_runner(RunnerId(id)).await else {
        return unavailable();
    };
    let Some(runner) = found else {
        return not_found(
            "No such runner (ended runners are kept for [retention] ended_runners).",
            "/console/runners",
            "Runners",
        );
    };
    if !session.caller.scope.covers(Some(&runner.pool)) {
        return refused(OUT_OF_SCOPE);
    }
    let reports = service
        .store
        .runner_reports(runner.id)
        .await
        .unwrap_or_default();
    let at = now();
    let when = |t: Option<Timestamp>| t.map(|t| format!("{} ({} ago)", rfc3339(t), age(at, t)));
    let steps: Vec<serde_json::Value> = [
        ("requested", Some(runner.requested_at)),
        ("provisioning", runner.provisioning_at),
        ("idle", runner.idle_at),
        ("busy", runner.busy_at),
        ("terminating", runner.terminating_at),
        ("ended", runner.ended_at),
    ]
    .into_iter()
    .filter_map(|(step, t)| when(t).map(|w| json!({"step": step, "at": w})))
    .collect();
    page(
        &session,
        "runner.html",
        "runners",
        json!({
            "runner": {
                "id": runner.id.0,
                "name": runner.name,
                "pool": runner.pool,
                "provider": runner.provider,
                "instance": runner.instance_id,
                "state": runner.state.as_str(),
                "job": runner.job.map(|j| j.0),
                "reason": runner.reason,
                "draining": runner.draining,
                "labels": runner.labels,
            },
            "steps": steps,
            "reports": reports.iter().map(|(kind, body)| json!({"kind": kind, "body": body})).collect::<Vec<_>>(),
        }),
    )
}

fn age(now: Timestamp, since: Timestamp) -> String {
    let seconds = now.since(since).as_secs();
    match seconds {
        0..=119 => format!("{seconds}s"),
        120..=7199 => format!("{}m", seconds / 60),
        7200..=172_799 => format!("{}h", seconds / 3600),
        _ => format!("{}d", seconds / 86_400),
    }
}

/// Audit entries per page.
const AUDIT_PAGE: u32 = 50;

#[derive(Deserialize)]
struct AuditQuery {
    /// Entries older than this one.
    before: Option<i64>,
}

/// The console page an audit target names, if it has one.
fn audit_link(target: &str) -> Option<String> {
    let (kind, name) = target.split_once(' ')?;
    match kind {
        "job" => name
            .parse::<i64>()
            .ok()
            .map(|id| format!("/console/jobs/{id}")),
        "runner" => name
            .parse::<i64>()
            .ok()
            .map(|id| format!("/console/runners/{id}")),
        "pool" => Some(format!("/console/pools/{}", url_encode(name))),
        _ => None,
    }
}

/// An entry's details as `key: value` pairs (its channel apart), not JSON.
fn audit_details(details: &str) -> (String, Vec<(String, String)>) {
    let Ok(serde_json::Value::Object(fields)) = serde_json::from_str::<serde_json::Value>(details)
    else {
        return (
            "api".to_owned(),
            vec![("details".to_owned(), details.to_owned())],
        );
    };
    let mut channel = "runway".to_owned();
    let mut pairs = Vec::new();
    for (key, value) in fields {
        let text = match value {
            serde_json::Value::String(text) => text,
            serde_json::Value::Null => continue,
            other => other.to_string(),
        };
        if key == "channel" {
            channel = text;
        } else {
            pairs.push((key, text));
        }
    }
    (channel, pairs)
}

async fn audit(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Query(query): Query<AuditQuery>,
) -> Response {
    let Some(session) = session(&service, &headers).await else {
        return Redirect::to("/").into_response();
    };
    if !session.caller.scope.is_every_pool() {
        return refused(EVERY_POOL_ONLY);
    }
    let Ok(mut entries) = service.store.list_audit(AUDIT_PAGE + 1, query.before).await else {
        return unavailable();
    };
    let older = entries.len() > AUDIT_PAGE as usize;
    entries.truncate(AUDIT_PAGE as usize);
    let at = now();
    let rows: Vec<_> = entries
        .iter()
        .map(|e| {
            let (channel, details) = audit_details(&e.details);
            json!({
                "id": e.id,
                "at": rfc3339(e.at),
                "ago": age(at, e.at),
                "actor": e.actor,
                "channel": channel,
                "action": e.action,
                "target": e.target,
                "link": audit_link(&e.target),
                "details": details,
            })
        })
        .collect();
    let next_page = older
        .then(|| {
            entries
                .last()
                .map(|e| format!("/console/audit?before={}", e.id))
        })
        .flatten();
    page(
        &session,
        "audit.html",
        "audit",
        json!({"entries": rows, "next_page": next_page, "paged": query.before.is_some()}),
    )
}

async fn tasks(State(service): State<Arc<Service>>, headers: HeaderMap) -> Response {
    let Some(session) = session(&service, &headers).await else {
        return Redirect::to("/").into_response();
    };
    if !session.caller.scope.is_every_pool() {
        return refused(EVERY_POOL_ONLY);
    }
    let tasks = crate::http::api::tasks_dto(&service);
    page(
        &session,
        "tasks.html",
        "tasks",
        json!({"tasks": tasks, "replica": service.replica}),
    )
}

async fn cluster(State(service): State<Arc<Service>>, headers: HeaderMap) -> Response {
    let Some(session) = session(&service, &headers).await else {
        return Redirect::to("/").into_response();
    };
    if !session.caller.scope.is_every_pool() {
        return refused(EVERY_POOL_ONLY);
    }
    let Ok(cluster) = crate::http::api::cluster_dto(&service).await else {
        return unavailable();
    };
    page(
        &session,
        "cluster.html",
        "cluster",
        json!({"cluster": cluster}),
    )
}

#[derive(Deserialize)]
struct EvaluateQuery {
    /// The configuration to evaluate.
    id: Option<String>,
    /// Condition inputs, one `name=value` per line.
    inputs: Option<String>,
}

/// `name=value` lines as condition inputs, or which line is not one.
fn parse_inputs(text: &str) -> Result<std::collections::BTreeMap<String, String>, String> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(|line| match line.split_once('=') {
            Some((name, value)) if !name.trim().is_empty() => {
                Ok((name.trim().to_owned(), value.trim().to_owned()))
            }
            _ => Err(format!("{line:?} is not name=value")),
        })
        .collect()
}

/// Every worker configuration with its rules, and one evaluated with the
/// inputs the form gives (read-only: evaluating changes nothing).
async fn worker_configs(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Query(query): Query<EvaluateQuery>,
) -> Response {
    let Some(session) = session(&service, &headers).await else {
        return Redirect::to("/").into_response();
    };
    if !session.caller.scope.is_every_pool() {
        return refused(EVERY_POOL_ONLY);
    }
    let Ok(stored) = service.store.list_worker_configs().await else {
        return unavailable();
    };
    let configs: Vec<serde_json::Value> = stored
        .iter()
        .map(|config| {
            let rules = crate::config::worker_config::parse(&config.body, &config.id)
                .map(|parsed| {
                    crate::config::worker_config::WorkerConfigDto::from_core(&parsed)
                        .rules
                        .into_iter()
                        .map(|rule| {
                            json!({
                                "rule_id": rule.rule_id,
                                "description": rule.description,
                                "conditions": rule.conditions.map(|c| json!(c).to_string()).unwrap_or_else(|| "always".to_owned()),
                                "values": rule.values.to_string(),
                            })
                        })
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default();
            json!({"id": config.id, "version": config.version, "pools": config.pools, "updated_at": rfc3339(config.updated_at), "rules": rules})
        })
        .collect();
    let inputs_text = query.inputs.clone().unwrap_or_default();
    let evaluation = match query.id.as_deref().filter(|id| !id.is_empty()) {
        None => serde_json::Value::Null,
        Some(id) => match (
            stored.iter().find(|c| c.id == id),
            parse_inputs(&inputs_text),
        ) {
            (None, _) => json!({"error": format!("no worker configuration {id:?}")}),
            (Some(_), Err(error)) => json!({"error": error}),
            (Some(config), Ok(inputs)) => {
                match crate::app::worker_configs::evaluate(&service, config, &inputs) {
                    Ok(answer) => json!({
                        "config": serde_json::to_string_pretty(&answer["config"]).unwrap_or_default(),
                        "applied_rules": answer["applied_rules"],
                    }),
                    Err(error) => json!({"error": error.to_string()}),
                }
            }
        },
    };
    page(
        &session,
        "worker_configs.html",
        "worker_configs",
        json!({"configs": configs, "evaluation": evaluation, "chosen": query.id, "inputs": inputs_text}),
    )
}

/// Where an action goes once done (`Ok`: the page to show), or its
/// refusal as a page that says why, with a link `back`.
fn after_action(done: Result<String, crate::app::AppError>, back: &str) -> Response {
    match done {
        Ok(to) => Redirect::to(&to).into_response(),
        Err(error) => {
            let api: crate::http::error::ApiError = error.into();
            (
                api.status,
                Html(format!(
                    "<!doctype html><title>Not done</title><p role=\"alert\">{}</p><p><a href=\"{back}\">Back</a></p>",
                    minijinja::HtmlEscape(&api.message)
                )),
            )
                .into_response()
        }
    }
}

/// A 404 page: `what` is missing, with a link back to `back` (`label`).
fn not_found(what: &str, back: &str, label: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        Html(format!(
            "<!doctype html><p>{}</p><p><a href=\"{back}\">{label}</a></p>",
            minijinja::HtmlEscape(what)
        )),
    )
        .into_response()
}

fn no_such_action() -> Response {
    (StatusCode::NOT_FOUND, "no such action\n").into_response()
}

impl From<Refusal> for Response {
    fn from(refusal: Refusal) -> Response {
        refusal.into_response()
    }
}

async fn job_action(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Path((id, action)): Path<(i64, String)>,
    Form(form): Form<ActionForm>,
) -> Result<Response, Response> {
    let session = writer(&service, &headers, &form).await?;
    crate::http::auth::require_job(&service, &session.caller, JobId(id))
        .await
        .map_err(scope_refusal)?;
    let actor = &session.caller.name;
    let done = match action.as_str() {
        "cancel" => admin::cancel_job(&service, actor, JobId(id), None).await,
        "retry" => admin::retry_job(&service, actor, JobId(id)).await,
        _ => return Err(no_such_action()),
    };
    // Back to the list it was made from, else to the job (a retry: the
    // new job).
    let shown = done.map(|job| match &form.back {
        Some(_) => back_to(form.back.as_deref(), "/console/jobs"),
        None => format!("/console/jobs/{}", job.id.0),
    });
    Ok(after_action(shown, &format!("/console/jobs/{id}")))
}

/// Cancels or retries every selected job of the jobs page (`ids`, one
/// field each), each as its own change, then returns to the list. A job
/// that cannot be changed (finished meanwhile, out of the token's scope)
/// is skipped and said; the others are done.
async fn bulk_job_action(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, Response> {
    let mut form = ActionForm::default();
    let mut action = String::new();
    let mut ids = Vec::new();
    for (key, value) in url::form_urlencoded::parse(&body) {
        match key.as_ref() {
            "csrf" => form.csrf = value.into_owned(),
            "back" => form.back = Some(value.into_owned()),
            "action" => action = value.into_owned(),
            "ids" => match value.parse::<i64>() {
                Ok(id) => ids.push(JobId(id)),
                Err(_) => {
                    return Err(
                        (StatusCode::BAD_REQUEST, "ids must be job numbers\n").into_response()
                    )
                }
            },
            _ => {}
        }
    }
    let session = writer(&service, &headers, &form).await?;
    if action != "cancel" && action != "retry" {
        return Err(no_such_action());
    }
    if ids.len() > PAGE as usize * 2 {
        return Err((StatusCode::BAD_REQUEST, "at most 100 jobs at once\n").into_response());
    }
    let actor = &session.caller.name;
    let mut refused = Vec::new();
    for id in ids {
        if let Err(error) = crate::http::auth::require_job(&service, &session.caller, id).await {
            refused.push(format!("job {id}: {}", error.message));
            continue;
        }
        let done = match action.as_str() {
            "cancel" => admin::cancel_job(&service, actor, id, None).await,
            _ => admin::retry_job(&service, actor, id).await,
        };
        if let Err(error) = done {
            // The message names the job.
            refused.push(error.message);
        }
    }
    let back = back_to(form.back.as_deref(), "/console/jobs");
    if refused.is_empty() {
        return Ok(Redirect::to(&back).into_response());
    }
    let items: String = refused
        .iter()
        .map(|line| format!("<li>{}</li>", minijinja::HtmlEscape(line)))
        .collect();
    Ok((
        StatusCode::CONFLICT,
        Html(format!(
            "<!doctype html><title>Partly done</title><p role=\"alert\">The other selected jobs were done; these were not:</p><ul>{items}</ul><p><a href=\"{}\">Back</a></p>",
            minijinja::HtmlEscape(&back)
        )),
    )
        .into_response())
}

async fn runner_action(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Path((id, action)): Path<(i64, String)>,
    Form(form): Form<ActionForm>,
) -> Result<Response, Response> {
    let session = writer(&service, &headers, &form).await?;
    crate::http::auth::require_runner(&service, &session.caller, RunnerId(id))
        .await
        .map_err(scope_refusal)?;
    let actor = &session.caller.name;
    let force = form.force.as_deref() == Some("true");
    let done = match action.as_str() {
        "drain" => admin::drain_runner(&service, actor, RunnerId(id)).await,
        "terminate" => admin::terminate_runner(&service, actor, RunnerId(id), force).await,
        _ => return Err(no_such_action()),
    };
    let back = "/console/runners";
    Ok(after_action(done.map(|_| back.to_owned()), back))
}

async fn pool_action(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Path((name, action)): Path<(String, String)>,
    Form(form): Form<ActionForm>,
) -> Result<Response, Response> {
    let session = writer(&service, &headers, &form).await?;
    if !session.caller.scope.covers(Some(&name)) {
        return Err(refused(OUT_OF_SCOPE));
    }
    let paused = match action.as_str() {
        "pause" => true,
        "resume" => false,
        _ => return Err(no_such_action()),
    };
    let done = admin::set_pool_paused(&service, &session.caller.name, &name, paused).await;
    Ok(after_action(done.map(|_| "/".to_owned()), "/"))
}

/// What a tab's page shows live, from its `page` parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shows {
    /// The overview and pool pages: each pool's counts and state.
    Pools,
    /// The jobs and job pages: the followed jobs' states and reasons.
    Jobs,
    /// The runners pages: each live runner's state and job.
    Runners,
    /// Nothing live.
    Nothing,
    /// A stream that names no page (a script's): all of the above.
    All,
}

impl Shows {
    fn of(page: Option<&str>) -> Shows {
        match page {
            None | Some("") => Shows::All,
            Some("overview") => Shows::Pools,
            Some("jobs") => Shows::Jobs,
            Some("runners") => Shows::Runners,
            Some(_) => Shows::Nothing,
        }
    }

    fn includes(self, part: Shows) -> bool {
        self == part || self == Shows::All
    }
}

/// The cells of `snapshot` a tab showing `shows`, following `followed`,
/// may see under `scope`. A followed job the snapshot lacks (pruned) gets
/// no cell: a reason is never blanked that was not computed.
fn cells_for(
    service: &Service,
    snapshot: &crate::app::live::Snapshot,
    shows: Shows,
    scope: &crate::config::Scope,
    followed: &[JobId],
) -> serde_json::Map<String, serde_json::Value> {
    let mut cells = serde_json::Map::new();
    if shows.includes(Shows::Pools) {
        for pool in pool_rows_of(
            service,
            &snapshot.counts,
            &snapshot.runners,
            &snapshot.paused,
        ) {
            if !scope.covers(Some(&pool.name)) {
                continue;
            }
            let name = &pool.name;
            for (field, value) in [
                ("queued", pool.queued),
                ("running", pool.running),
                ("booting", pool.booting),
                ("idle", pool.idle),
                ("busy", pool.busy),
            ] {
                cells.insert(format!("pool:{name}:{field}"), json!(value.to_string()));
            }
            let state = if pool.paused { "paused" } else { "active" };
            cells.insert(format!("pool:{name}:state"), json!(state));
        }
    }
    if shows.includes(Shows::Jobs) {
        for id in followed {
            let Some((job, why)) = snapshot.jobs.get(id) else {
                continue;
            };
            if !scope.covers(job.pool.as_deref()) {
                continue;
            }
            cells.insert(format!("job:{id}:state"), json!(job.state.as_str()));
            let waiting = why.as_ref().map(waiting_text).unwrap_or_default();
            cells.insert(format!("job:{id}:waiting"), json!(waiting));
        }
    }
    if shows.includes(Shows::Runners) {
        for runner in &snapshot.runners {
            if !scope.covers(Some(&runner.pool)) {
                continue;
            }
            cells.insert(
                format!("runner:{}:state", runner.id),
                json!(runner.state.as_str()),
            );
            let job = runner
                .job
                .map(|j| j.0.to_string())
                .unwrap_or_else(|| "-".to_owned());
            cells.insert(format!("runner:{}:job", runner.id), json!(job));
        }
    }
    cells
}

#[derive(Deserialize)]
struct StreamQuery {
    /// The page the tab shows (`overview`, `jobs`, `runners`, …): what it
    /// is sent.
    page: Option<String>,
    /// The jobs the page shows (comma-separated ids): their cells follow
    /// them after they finish too.
    jobs: Option<String>,
}

/// The most jobs one stream follows by id (a page shows [`PAGE`]).
const FOLLOWED: usize = 100;

/// A tab's live updates: each tick, the cells its page shows, taken from
/// the replica's one snapshot of the tick (`app/live.rs`); a tick whose
/// snapshot could not be read sends nothing rather than blanks.
async fn stream(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Query(query): Query<StreamQuery>,
) -> Response {
    let Some(opened) = session(&service, &headers).await else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let scope = opened.caller.scope;
    let shows = Shows::of(query.page.as_deref());
    let followed: Vec<JobId> = if shows.includes(Shows::Jobs) {
        query
            .jobs
            .unwrap_or_default()
            .split(',')
            .filter_map(|id| id.trim().parse().ok().map(JobId))
            .take(FOLLOWED)
            .collect()
    } else {
        Vec::new()
    };
    let following = Arc::new(service.console.follow(followed.clone()));
    // Nothing older than the tab: its page was rendered before it opened.
    let seen = std::time::Instant::now();
    let start = (service, scope, followed, headers, following, seen, 0u32);
    let updates = futures_util::stream::unfold(
        start,
        move |(service, scope, followed, headers, following, mut seen, mut tick)| async move {
            loop {
                if tick > 0 {
                    tokio::time::sleep(TICK).await;
                }
                // A session ended meanwhile (logout, its token removed, every
                // session ended) ends its stream within a few ticks.
                if tick > 0 && tick % SESSION_RECHECK_TICKS == 0 {
                    session(&service, &headers).await?;
                }
                tick = tick.wrapping_add(1);
                if shows == Shows::Nothing {
                    // Nothing to send; the keep-alive holds the connection
                    // and the session is still checked.
                    continue;
                }
                let Ok(snapshot) = service.console.snapshot(&service, TICK, seen).await else {
                    continue;
                };
                seen = snapshot.taken;
                let cells = cells_for(&service, &snapshot, shows, &scope, &followed);
                let event = Event::default()
                    .event("update")
                    .data(json!({"cells": cells}).to_string());
                return Some((
                    Ok::<_, std::convert::Infallible>(event),
                    (service, scope, followed, headers, following, seen, tick),
                ));
            }
        },
    );
    Sse::new(updates)
        .keep_alive(KeepAlive::default())
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn queue_percentiles_are_nearest_rank_per_pool() {
        let mut times: Vec<(String, Duration)> = (1..=100).map(|n| ("a".into(), secs(n))).collect();
        times.push(("b".into(), secs(7)));
        let stats = crate::app::history::queue_percentiles(times);
        assert_eq!(stats["a"], (100, secs(50), secs(95)));
        assert_eq!(stats["b"], (1, secs(7), secs(7)));
        assert!(crate::app::history::queue_percentiles(Vec::new()).is_empty());
    }

    #[test]
    fn a_queued_job_names_the_runner_booting_for_it_but_not_as_its_own() {
        let job = runway_core::NewJob {
            source: JobSource::Api,
            external_id: "x".into(),
            route: runway_core::Route::Pool("p".into()),
            labels: vec!["linux".into()],
            payload: "{}".into(),
            max_attempts: 3,
            share: Default::default(),
        }
        .initial(JobId(7), Timestamp::from_millis(1_000));
        let booting = Explanation::Waiting {
            reason: runway_core::planner::WaitReason::RunnerBooting {
                runner: RunnerId(42),
                since: Timestamp::from_millis(1_000),
            },
            has_providers: true,
            offers: Vec::new(),
            warm: None,
        };
        let row = job_row(&job, Some(&booting));
        assert_eq!(row["runner"], serde_json::Value::Null);
        assert_eq!(row["runner_for"], 42);
        let paused = Explanation::Waiting {
            reason: runway_core::planner::WaitReason::PoolPaused,
            has_providers: true,
            offers: Vec::new(),
            warm: None,
        };
        assert_eq!(
            job_row(&job, Some(&paused))["runner_for"],
            serde_json::Value::Null
        );
    }

    #[test]
    fn durations_read_as_an_operator_reads_them() {
        for (d, text) in [
            (Duration::from_millis(850), "850 ms"),
            (secs(42), "42 s"),
            (secs(185), "3 min 5 s"),
            (secs(60), "1 min"),
            (secs(7800), "2 h 10 min"),
            (secs(3600), "1 h"),
        ] {
            assert_eq!(short_duration(d), text);
        }
    }
}
