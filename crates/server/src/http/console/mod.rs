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

mod actions;
mod jobs;
mod ops;
mod pools;
mod runners;
mod session;
mod stream;
#[cfg(test)]
mod tests;

use actions::*;
use jobs::*;
use ops::*;
use pools::*;
use runners::*;
use session::*;
use stream::*;

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
            ("layout.html", include_str!("templates/layout.html")),
            ("login.html", include_str!("templates/login.html")),
            ("overview.html", include_str!("templates/overview.html")),
            ("pool.html", include_str!("templates/pool.html")),
            ("jobs.html", include_str!("templates/jobs.html")),
            ("job.html", include_str!("templates/job.html")),
            ("runners.html", include_str!("templates/runners.html")),
            ("runner.html", include_str!("templates/runner.html")),
            ("audit.html", include_str!("templates/audit.html")),
            ("tasks.html", include_str!("templates/tasks.html")),
            ("cluster.html", include_str!("templates/cluster.html")),
            (
                "worker_configs.html",
                include_str!("templates/worker_configs.html"),
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
