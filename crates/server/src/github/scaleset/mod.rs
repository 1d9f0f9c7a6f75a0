//! A client for GitHub's runner scale-set API: the Actions service that
//! actions-runner-controller's scale-set mode and GitHub's Go client
//! `actions/scaleset` speak. GitHub does not document it; this follows the
//! Go client's protocol:
//!
//! 1. A runner registration token (GitHub's REST API, through
//!    [`GithubClient`] and its budget) is exchanged at
//!    `POST {api}/actions/runner-registration` (`RemoteAuth`) for the
//!    Actions service's URL and an admin token (a JWT, fetched again a
//!    minute before its `exp`, or at once when the service answers 401).
//! 2. With the admin token, under `{service}_apis/runtime/…` and
//!    `?api-version=6.0-preview`: runner groups, scale sets, message
//!    sessions, just-in-time runner configurations; runners are removed at
//!    `_apis/distributedtask/pools/0/agents/{id}`.
//! 3. With a session's queue token: long polls of the message queue
//!    (`X-ScaleSetMaxCapacity`), acknowledgements (`DELETE` of a message)
//!    and `acquirejobs`.
//!
//! Every request is counted in
//! `runway_github_requests_total{operation,status}`.
//! Tokens are [`Secret`]s: never logged, never in an error.

mod call;
mod messages;

pub use call::*;
pub use messages::*;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use reqwest::{Method, StatusCode};
use runway_core::Timestamp;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::config::{Secret, Target};
use crate::github::api::{Deregistered, GithubClient, GithubError, JitConfig};
use crate::telemetry::metrics::{Metrics, PoolKindLabels};

/// The Actions service API version the Go client sends.
const API_VERSION: &str = "6.0-preview";

/// How long the service holds an idle poll is about 50 s; a poll is given
/// this long before runway gives up on it.
const POLL_TIMEOUT: Duration = Duration::from_secs(75);

/// An admin token is fetched again this long before it expires.
const ADMIN_REFRESH_MARGIN: Duration = Duration::from_secs(60);

/// A scale set as the service describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleSet {
    pub id: i64,
    pub name: String,
    pub runner_group_id: i64,
    pub labels: Vec<String>,
}

/// The Actions service's address and admin token.
struct Admin {
    /// Ends with `/`.
    url: String,
    token: Secret,
    expires_at: Option<Timestamp>,
}

/// The scale-set client of one pool: its target's admin connection.
pub struct ScaleSetClient {
    github: Arc<GithubClient>,
    target: Target,
    /// The web address the runners register at (GitHub's "config URL").
    config_url: String,
    /// The pool, for the metrics.
    pool: String,
    admin: tokio::sync::Mutex<Option<Admin>>,
    /// No request before this: GitHub rate-limited the pool's calls
    /// (429, or 403 with `Retry-After` or a rate-limit message), and every
    /// call of this client — the listener's, the reconciler's — waits.
    hold: std::sync::Mutex<Option<Timestamp>>,
}

impl ScaleSetClient {
    pub fn new(github: Arc<GithubClient>, target: Target, pool: &str) -> ScaleSetClient {
        let config_url = target.web_url(github.api_url());
        ScaleSetClient {
            github,
            target,
            config_url,
            pool: pool.to_owned(),
            admin: tokio::sync::Mutex::new(None),
            hold: std::sync::Mutex::new(None),
        }
    }

    /// The id of the runner group called `name`.
    pub async fn runner_group_id(&self, metrics: &Metrics, name: &str) -> Result<i64, GithubError> {
        let call = Call::new(
            "scale_set_runner_group",
            Method::GET,
            "_apis/runtime/runnergroups/".into(),
        )
        .query("groupName", name.to_owned());
        let answer = self.service(metrics, call).await?.expect(OK)?;
        answer.body["value"]
            .as_array()
            .and_then(|groups| {
                groups.iter().find(|g| {
                    g["name"]
                        .as_str()
                        .is_some_and(|n| n.eq_ignore_ascii_case(name))
                })
            })
            .and_then(|g| g["id"].as_i64())
            .ok_or_else(|| GithubError::Status {
                operation: answer.operation,
                status: 404,
                message: format!("no runner group named {name:?}"),
            })
    }

    /// The scale set called `name` in the runner group, if there is one.
    pub async fn find_scale_set(
        &self,
        metrics: &Metrics,
        name: &str,
        runner_group_id: i64,
    ) -> Result<Option<ScaleSet>, GithubError> {
        let call = Call::new(
            "scale_set_get",
            Method::GET,
            "_apis/runtime/runnerscalesets".into(),
        )
        .query("runnerGroupId", runner_group_id.to_string())
        .query("name", name.to_owned());
        let answer = self.service(metrics, call).await?.expect(OK)?;
        let found = answer.body["value"]
            .as_array()
            .and_then(|sets| sets.iter().find(|s| s["name"].as_str() == Some(name)));
        found.map(|set| answer.scale_set(set)).transpose()
    }

    /// Creates the scale set, or (`id`) brings an existing one to these
    /// labels and group.
    pub async fn put_scale_set(
        &self,
        metrics: &Metrics,
        id: Option<i64>,
        name: &str,
        runner_group_id: i64,
        labels: &[String],
    ) -> Result<ScaleSet, GithubError> {
        let call = match id {
            Some(id) => Call::new(
                "scale_set_update",
                Method::PATCH,
                format!("_apis/runtime/runnerscalesets/{id}"),
            ),
            None => Call::new(
                "scale_set_create",
                Method::POST,
                "_apis/runtime/runnerscalesets".into(),
            ),
        }
        .body(json!({
            "name": name,
            "runnerGroupId": runner_group_id,
            "labels": labels.iter().map(|l| json!({"name": l, "type": "System"})).collect::<Vec<_>>(),
            "RunnerSetting": {"disableUpdate": false},
        }));
        let answer = self.service(metrics, call).await?.expect(OK_OR_CREATED)?;
        answer.scale_set(&answer.body)
    }

    /// Registers a just-in-time runner named `name` in the scale set.
    pub async fn generate_jit_config(
        &self,
        metrics: &Metrics,
        scale_set_id: i64,
        name: &str,
    ) -> Result<JitConfig, GithubError> {
        let call = Call::new(
            "scale_set_generate_jitconfig",
            Method::POST,
            format!("_apis/runtime/runnerscalesets/{scale_set_id}/generatejitconfig"),
        )
        .body(json!({"name": name, "workFolder": "_work"}));
        let answer = self.service(metrics, call).await?.expect(OK_OR_CREATED)?;
        match (
            answer.body["runner"]["id"].as_u64(),
            answer.body["encodedJITConfig"].as_str(),
        ) {
            (Some(runner_id), Some(encoded)) => Ok(JitConfig {
                runner_id,
                encoded: encoded.to_owned(),
            }),
            _ => Err(answer.malformed("the answer has no runner.id or encodedJITConfig")),
        }
    }

    /// Removes a runner's registration. The service refuses while the
    /// runner runs a job (`JobStillRunningException`): then its machine
    /// must be kept.
    pub async fn delete_runner(
        &self,
        metrics: &Metrics,
        runner_id: u64,
    ) -> Result<Deregistered, GithubError> {
        let call = Call::new(
            "scale_set_delete_runner",
            Method::DELETE,
            format!("_apis/distributedtask/pools/0/agents/{runner_id}"),
        );
        let answer = self.service(metrics, call).await?;
        let still_running = answer.body["typeName"]
            .as_str()
            .or(answer.body["message"].as_str())
            .is_some_and(|text| text.contains("JobStillRunning") || text.contains("still running"));
        match answer.status {
            StatusCode::OK | StatusCode::NO_CONTENT => Ok(Deregistered::Removed),
            StatusCode::NOT_FOUND => Ok(Deregistered::NotFound),
            StatusCode::UNPROCESSABLE_ENTITY => Err(GithubError::RunnerBusy(runner_id)),
            status if status.is_client_error() && still_running => {
                Err(GithubError::RunnerBusy(runner_id))
            }
            status => Err(refusal(answer.operation, status, &answer.body)),
        }
    }
}

/// A scale-set pool's handle, shared by its listener (which finds or
/// creates the scale set) and the reconciler (which registers and removes
/// its runners).
pub struct PoolScaleSet {
    pub client: ScaleSetClient,
    /// The scale set's id once the listener has found or created it.
    id: std::sync::atomic::AtomicI64,
    /// Whether this process holds the scale set's message session.
    session: std::sync::atomic::AtomicBool,
    /// GitHub's statistics with the last message (or session), and when.
    statistics: std::sync::Mutex<Option<(Statistics, Timestamp)>>,
}

impl PoolScaleSet {
    pub fn new(client: ScaleSetClient) -> PoolScaleSet {
        PoolScaleSet {
            client,
            id: std::sync::atomic::AtomicI64::new(0),
            session: std::sync::atomic::AtomicBool::new(false),
            statistics: std::sync::Mutex::new(None),
        }
    }

    pub fn holds_session(&self) -> bool {
        self.session.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn set_session(&self, held: bool) {
        self.session
            .store(held, std::sync::atomic::Ordering::SeqCst);
    }

    /// The statistics GitHub sent last, and when.
    pub fn statistics(&self) -> Option<(Statistics, Timestamp)> {
        self.statistics.lock().ok()?.clone()
    }

    pub fn observe(&self, statistics: &Statistics, at: Timestamp) {
        if let Ok(mut slot) = self.statistics.lock() {
            *slot = Some((statistics.clone(), at));
        }
    }

    /// The scale set's id, `None` until it is known (or after it vanished).
    pub fn id(&self) -> Option<i64> {
        Some(self.id.load(std::sync::atomic::Ordering::SeqCst)).filter(|id| *id > 0)
    }

    pub fn set_id(&self, id: Option<i64>) {
        self.id
            .store(id.unwrap_or(0), std::sync::atomic::Ordering::SeqCst);
    }
}

/// The scale-set pools of this process, by pool name.
#[derive(Default)]
pub struct ScaleSets(std::sync::Mutex<std::collections::BTreeMap<String, Arc<PoolScaleSet>>>);

impl ScaleSets {
    pub fn get(&self, pool: &str) -> Option<Arc<PoolScaleSet>> {
        self.0.lock().ok()?.get(pool).cloned()
    }

    /// The pool's handle, made with `make` the first time.
    pub fn get_or_insert(
        &self,
        pool: &str,
        make: impl FnOnce() -> PoolScaleSet,
    ) -> Option<Arc<PoolScaleSet>> {
        let mut map = self.0.lock().ok()?;
        Some(
            map.entry(pool.to_owned())
                .or_insert_with(|| Arc::new(make()))
                .clone(),
        )
    }

    pub fn remove(&self, pool: &str) {
        if let Ok(mut map) = self.0.lock() {
            map.remove(pool);
        }
    }
}

#[cfg(test)]
mod tests;
