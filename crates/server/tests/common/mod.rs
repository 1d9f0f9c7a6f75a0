//! What the server's tests share: a [`Service`] on a real SQLite store in a
//! temporary directory, driven through the real router (no socket), with
//! helpers for webhooks, API calls and metrics.

#![allow(dead_code)] // Each test file uses a part.

use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use runway_server::config::{Config, PoolConfig};
use runway_server::github::signature::sign;
use runway_server::telemetry::events::EventLog;
use runway_server::Service;
use runway_store::{SqliteStore, Store};
use serde_json::Value;
use tower::ServiceExt;

/// The webhook secret [`Harness::webhook`] signs with.
pub const WEBHOOK_SECRET: &str = "rotate-me-1";

pub struct Harness {
    pub service: Arc<Service>,
    dir: tempfile::TempDir,
}

/// A pool serving `labels`, with room for ten runners and none kept idle.
pub fn pool(name: &str, labels: &[&str]) -> PoolConfig {
    PoolConfig {
        name: name.to_owned(),
        labels: labels.iter().map(|l| (*l).to_owned()).collect(),
        min_idle: 0,
        max_runners: 10,
        ..PoolConfig::default()
    }
}

/// A SQLite store in the file `path` (created, with migrations applied).
pub async fn sqlite_store(path: &Path) -> Arc<dyn Store> {
    let path = path.display().to_string();
    Arc::new(
        SqliteStore::open(&path)
            .await
            .expect("open the SQLite store"),
    )
}

impl Harness {
    /// A service with `config` on a fresh store, its event log opened as
    /// `config.telemetry` says.
    pub async fn new(config: Config) -> Harness {
        let dir = tempfile::tempdir().expect("temp dir");
        Harness::in_dir(config, dir).await
    }

    /// The same, with `adjust` given the temporary directory first (for
    /// paths that must live in it).
    pub async fn with(config: Config, adjust: impl FnOnce(&mut Config, &Path)) -> Harness {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = config;
        adjust(&mut config, dir.path());
        Harness::in_dir(config, dir).await
    }

    async fn in_dir(config: Config, dir: tempfile::TempDir) -> Harness {
        let store = sqlite_store(&dir.path().join("runway.db")).await;
        Harness::on(config, store, dir)
    }

    /// The same on `store` (PostgreSQL, say).
    #[allow(dead_code)] // not every test binary uses it
    pub fn with_store(config: Config, store: Arc<dyn Store>) -> Harness {
        Harness::on(config, store, tempfile::tempdir().expect("temp dir"))
    }

    fn on(config: Config, store: Arc<dyn Store>, dir: tempfile::TempDir) -> Harness {
        let mut service = Service::new(config, store);
        service.events = EventLog::open(&service.config().telemetry)
            .expect("open the event log")
            .count_errors_in(service.metrics.event_log_errors.clone());
        Harness {
            service: Arc::new(service),
            dir,
        }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.service.store
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Sends `request` through the router: the status, the headers, and
    /// the body as JSON (a string if it is not JSON, null if empty).
    pub async fn exchange(&self, request: Request<Body>) -> (StatusCode, HeaderMap, Value) {
        let response = runway_server::http::router(self.service.clone())
            .oneshot(request)
            .await
            .expect("the router answers");
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .expect("a body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        (status, headers, body)
    }

    pub async fn send(&self, request: Request<Body>) -> (StatusCode, Value) {
        let (status, _, body) = self.exchange(request).await;
        (status, body)
    }

    /// `method path` with `token` as the bearer (none if empty) and a JSON body.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        self.send(request(method, path, token, body)).await
    }

    /// `GET path` with `token` as the bearer (none if empty).
    pub async fn get(&self, path: &str, token: &str) -> (StatusCode, Value) {
        self.call("GET", path, token, None).await
    }

    /// `POST path` with `token` as the bearer and a JSON body.
    pub async fn post(&self, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
        self.call("POST", path, token, Some(body)).await
    }

    /// `PUT path` with `token` as the bearer and a JSON body.
    pub async fn put(&self, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
        self.call("PUT", path, token, Some(body)).await
    }

    /// `DELETE path` with `token` as the bearer.
    pub async fn delete(&self, path: &str, token: &str) -> (StatusCode, Value) {
        self.call("DELETE", path, token, None).await
    }

    /// A runner's long poll for a job (`POST /api/v1/jobs/request`, no body).
    pub async fn request_job(&self, token: &str) -> (StatusCode, Value) {
        self.call("POST", "/api/v1/jobs/request", token, None).await
    }

    /// A GitHub webhook delivery signed with [`WEBHOOK_SECRET`].
    pub async fn webhook(&self, event: &str, delivery: &str, body: &[u8]) -> (StatusCode, Value) {
        let request = Request::post("/webhooks/github")
            .header("x-github-event", event)
            .header("x-github-delivery", delivery)
            .header("x-hub-signature-256", sign(WEBHOOK_SECRET.as_bytes(), body))
            .header("content-type", "application/json")
            .body(Body::from(body.to_vec()))
            .expect("a request");
        self.send(request).await
    }

    /// `/metrics` as a plain client gets it.
    pub async fn metrics(&self) -> String {
        let (_, body) = self.call("GET", "/metrics", "", None).await;
        body.as_str().unwrap_or_default().to_owned()
    }
}

/// A reconciler over one simulated provider named `sim` whose runners boot
/// in `boot` and, stopped, start again in `resume`, on a manual clock set
/// to the wall clock's now (the jobs' explanations read it).
pub fn stock_reconciler(
    service: Arc<Service>,
    boot: std::time::Duration,
    resume: std::time::Duration,
) -> (
    runway_server::reconcile::Reconciler,
    Arc<runway_providers::ManualClock>,
    Arc<runway_providers::sim::SimProvider>,
) {
    use runway_providers::sim::{BootTime, SimConfig, SimProvider};
    let clock = Arc::new(runway_providers::ManualClock::new(
        runway_server::clock::now(),
    ));
    let sim = Arc::new(SimProvider::new(
        SimConfig {
            boot_time: BootTime::Fixed(boot),
            resume_time: Some(resume),
            ..SimConfig::default()
        },
        clock.clone(),
    ));
    let providers = std::collections::BTreeMap::from([(
        "sim".to_owned(),
        sim.clone() as Arc<dyn runway_providers::Provider>,
    )]);
    let reconciler = runway_server::reconcile::Reconciler::new(service, providers);
    (reconciler, clock, sim)
}

/// The names of every instance `provider` lists, sorted.
pub async fn instance_names(provider: &dyn runway_providers::Provider) -> Vec<String> {
    let mut names: Vec<String> = provider
        .list()
        .await
        .expect("the provider lists")
        .into_iter()
        .map(|i| i.name)
        .collect();
    names.sort();
    names
}

/// A request with `token` as the bearer (none if empty) and a JSON body.
pub fn request(method: &str, path: &str, token: &str, body: Option<Value>) -> Request<Body> {
    let mut request = Request::builder().method(method).uri(path);
    if !token.is_empty() {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    request
        .body(
            body.map(|b| Body::from(b.to_string()))
                .unwrap_or_else(Body::empty),
        )
        .expect("a request")
}
