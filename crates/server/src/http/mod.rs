//! The HTTP surface. One router; each handler reads the [`Service`] root.

pub mod admin;
pub mod api;
pub mod auth;
pub mod charts;
pub mod console;
pub mod error;
pub mod extract;
pub mod garm;
pub mod openapi;
pub mod runner_api;
pub mod runner_reports;
pub mod webhooks;
pub mod worker_configs;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Serialize;
use tower_http::request_id::{
    MakeRequestId, PropagateRequestIdLayer, RequestId, SetRequestIdLayer,
};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::app::Service;

pub fn router(service: Arc<Service>) -> Router {
    let body_limit = service.config().github.max_body_bytes;
    let (documented, openapi) = documented().split_for_parts();
    let document = Arc::<str>::from(openapi::document(&openapi));
    Router::new()
        .route(
            "/api/v1/openapi.json",
            get(move || {
                let document = document.clone();
                async move {
                    (
                        [(header::CONTENT_TYPE, "application/json")],
                        document.to_string(),
                    )
                }
            }),
        )
        .route(
            "/webhooks/github",
            post(crate::http::webhooks::github_webhook).layer(DefaultBodyLimit::max(body_limit)),
        )
        .merge(documented)
        .merge(crate::http::console::router())
        .merge(crate::http::garm::router())
        // One middleware measures a request and scopes its audit channel,
        // not one layer each: every layer clones the route's service and
        // boxes its future again for each request, and the runner API's
        // long polls are most of what a waiting fleet costs (issue 59).
        .layer(axum::middleware::from_fn_with_state(
            service.clone(),
            measured,
        ))
        .with_state(service)
}

/// Counts and times each request by its route's template (axum's
/// `MatchedPath`), so an id in a path never becomes a series of its own;
/// a request no route matched counts as `unmatched`. Runs the request
/// with the channel its changes are audited under ([`channel_of`]).
async fn measured(
    axum::extract::State(service): axum::extract::State<Arc<Service>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let started = std::time::Instant::now();
    let method = method_label(request.method());
    let route = crate::telemetry::metrics::RouteLabel(
        request
            .extensions()
            .get::<axum::extract::MatchedPath>()
            .map_or_else(|| Arc::from("unmatched"), |path| Arc::from(path.as_str())),
    );
    let channel = channel_of(&request);
    let response = crate::app::admin::CHANNEL
        .scope(channel, next.run(request))
        .await;
    let metrics = &service.metrics;
    metrics
        .http_request_duration
        .get_or_create(&crate::telemetry::metrics::HttpRouteLabels {
            method,
            route: route.clone(),
        })
        .observe(started.elapsed().as_secs_f64());
    metrics
        .http_requests
        .get_or_create(&crate::telemetry::metrics::HttpLabels {
            method,
            route,
            status: response.status().as_u16(),
        })
        .inc();
    response
}

/// A request's method as its metrics' label: a method outside HTTP's own
/// is one series, not one each.
fn method_label(method: &axum::http::Method) -> &'static str {
    match *method {
        axum::http::Method::GET => "GET",
        axum::http::Method::POST => "POST",
        axum::http::Method::PUT => "PUT",
        axum::http::Method::PATCH => "PATCH",
        axum::http::Method::DELETE => "DELETE",
        axum::http::Method::HEAD => "HEAD",
        axum::http::Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// The channel a request's changes are audited under: the console's
/// pages, the CLI (which names itself `runway/VERSION`), or any other
/// client of the API.
fn channel_of(request: &axum::extract::Request) -> &'static str {
    let path = request.uri().path();
    if path == "/" || path.starts_with("/console/") {
        "console"
    } else if request
        .headers()
        .get(header::USER_AGENT)
        .and_then(|agent| agent.to_str().ok())
        .is_some_and(|agent| agent.starts_with("runway/"))
    {
        "cli"
    } else {
        "api"
    }
}

/// The admin and runner APIs: every route registered with its OpenAPI
/// operation. GitHub's webhook, GARM's callbacks (other parties'
/// protocols) and the HTML console are outside the document.
pub fn documented() -> OpenApiRouter<Arc<Service>> {
    OpenApiRouter::with_openapi(openapi::ApiDoc::openapi())
        .routes(routes!(status))
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics))
        .merge(crate::http::api::router())
        .merge(crate::http::admin::router())
        .merge(crate::http::worker_configs::router())
        .merge(crate::http::runner_api::router())
        .merge(crate::http::runner_reports::router())
}

/// Gives every request an id (`x-request-id`: the caller's, or a new one),
/// answers with it, and logs the request in a span that carries it.
///
/// These layers wrap the router once, as one tower service, not each
/// route (`Router::layer`): a layer given to the router wraps every route
/// in a boxed service of its own, and each request then clones that box
/// and boxes its future again, once per layer. At 10,000 long-polling
/// runners, three such layers were about a tenth of what waiting cost
/// (issue 59: BENCHMARKS.md, "eighth round").
pub fn with_request_ids(
    router: Router,
) -> impl tower::Service<
    axum::extract::Request,
    Response = Response,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone
       + Send
       + Sync
       + 'static {
    let header = axum::http::HeaderName::from_static("x-request-id");
    let trace = tower_http::trace::TraceLayer::new_for_http().make_span_with(
        |request: &axum::http::Request<axum::body::Body>| {
            let id = request
                .headers()
                .get("x-request-id")
                .and_then(|value| value.to_str().ok())
                .unwrap_or("");
            tracing::info_span!(
                "request",
                method = %request.method(),
                path = %request.uri().path(),
                request_id = %id,
            )
        },
    );
    tower::ServiceBuilder::new()
        .layer(SetRequestIdLayer::new(header.clone(), RequestIds::new()))
        .map_response(|response: Response<_>| response.map(axum::body::Body::new))
        .layer(trace)
        .layer(PropagateRequestIdLayer::new(header))
        .service(router)
}

/// Request ids: a random prefix per process and a counter.
#[derive(Clone)]
struct RequestIds {
    prefix: Arc<str>,
    next: Arc<std::sync::atomic::AtomicU64>,
}

impl RequestIds {
    fn new() -> RequestIds {
        RequestIds {
            prefix: format!("{:08x}", rand::random::<u32>()).into(),
            next: Arc::new(std::sync::atomic::AtomicU64::new(1)),
        }
    }
}

impl MakeRequestId for RequestIds {
    fn make_request_id<B>(&mut self, _: &axum::http::Request<B>) -> Option<RequestId> {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        axum::http::HeaderValue::from_str(&format!("{}-{n}", self.prefix))
            .ok()
            .map(RequestId::new)
    }
}

/// OpenMetrics for clients that ask for it (Prometheus does), the classic
/// text format for everyone else.
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, description = "Prometheus metrics", content_type = "text/plain", body = String)))]
async fn metrics(State(service): State<Arc<Service>>, headers: HeaderMap) -> Response {
    let open_metrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .any(|value| value.contains("application/openmetrics-text"));
    if open_metrics {
        (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            service.metrics.encode(),
        )
            .into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            service.metrics.encode_text(),
        )
            .into_response()
    }
}

/// The process is up and serving HTTP.
#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, description = "Up", content_type = "text/plain", body = String)))]
async fn healthz() -> &'static str {
    "ok\n"
}

/// The store answers and its migrations are applied.
#[utoipa::path(get, path = "/readyz", tag = "health",
    responses(
        (status = 200, description = "Ready", content_type = "text/plain", body = String),
        (status = 503, description = "Not ready, and why", content_type = "text/plain", body = String),
    ))]
async fn readyz(State(service): State<Arc<Service>>) -> Response {
    match service.store.check_ready().await {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(error) => {
            tracing::warn!(%error, "readiness check failed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {error}\n"),
            )
                .into_response()
        }
    }
}

#[derive(Serialize, utoipa::ToSchema)]
struct StatusDto {
    service: &'static str,
    version: &'static str,
    store: &'static str,
    pools: Vec<PoolStatusDto>,
}

#[derive(Serialize, utoipa::ToSchema)]
struct PoolStatusDto {
    name: String,
    labels: Vec<String>,
    min_idle: u32,
    max_runners: u32,
    jobs: std::collections::BTreeMap<String, u64>,
}

/// What runway is doing, at a glance: its pools and how many live jobs
/// (queued, provisioning, running) each has in each state. Finished history
/// is at `GET /api/v1/jobs?state=…`; counting it here would make every
/// request cost the whole history.
#[utoipa::path(get, path = "/api/v1/status", tag = "health",
    responses(
        (status = 200, description = "runway's pools and their live jobs", body = StatusDto),
        (status = 503, description = "The store is unavailable", content_type = "text/plain", body = String),
    ))]
async fn status(State(service): State<Arc<Service>>) -> Response {
    let counts = match service.store.live_job_counts().await {
        Ok(counts) => counts,
        Err(error) => {
            tracing::error!(%error, "cannot count jobs");
            return (StatusCode::SERVICE_UNAVAILABLE, "store unavailable\n").into_response();
        }
    };
    let pools = service
        .config()
        .pools
        .iter()
        .map(|pool| PoolStatusDto {
            name: pool.name.clone(),
            labels: pool.labels.clone(),
            min_idle: pool.min_idle,
            max_runners: pool.max_runners,
            jobs: counts
                .iter()
                .filter(|c| c.pool.as_deref() == Some(pool.name.as_str()))
                .map(|c| (c.state.as_str().to_owned(), c.count))
                .collect(),
        })
        .collect();
    let store = match service.store.backend() {
        runway_store::Backend::Sqlite => "sqlite",
        runway_store::Backend::Postgres => "postgres",
    };
    Json(StatusDto {
        service: "runway",
        version: env!("CARGO_PKG_VERSION"),
        store,
        pools,
    })
    .into_response()
}

/// Serves HTTP on `listener` until `shutdown` completes, then finishes the
/// requests in flight and returns.
pub async fn serve(
    service: Arc<Service>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = axum::ServiceExt::<axum::extract::Request>::into_make_service(with_request_ids(
        router(service),
    ));
    // As a make-service, every connection gets a clone of one router (an
    // `Arc`). Served as a plain `Router`, axum rebuilds the whole route
    // table for each connection (`Router::with_state` per accepted
    // stream): 37 KiB and its CPU per connection, held as long as the
    // connection lives — most of what 10,000 long-polling runners cost
    // the heap (issue 59).
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}
