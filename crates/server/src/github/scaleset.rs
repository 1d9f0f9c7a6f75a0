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
//! Every request is counted in `runway_github_requests_total{operation,status}`.
//! Tokens are [`Secret`]s: never logged, never in an error.

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

/// Job and runner counts of a scale set, sent with every message.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Statistics {
    pub total_available_jobs: i64,
    pub total_acquired_jobs: i64,
    pub total_assigned_jobs: i64,
    pub total_running_jobs: i64,
    pub total_registered_runners: i64,
    pub total_busy_runners: i64,
    pub total_idle_runners: i64,
}

/// An open message session: its queue and the token that reads it.
#[derive(Debug, Clone)]
pub struct Session {
    pub id: String,
    pub scale_set_id: i64,
    queue_url: String,
    queue_token: Secret,
    pub statistics: Option<Statistics>,
}

/// What the service says of one job in a message.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct JobInfo {
    pub runner_request_id: i64,
    pub repository_name: String,
    pub owner_name: String,
    pub job_display_name: String,
    pub job_workflow_ref: String,
    pub workflow_run_id: i64,
    pub request_labels: Vec<String>,
    pub queue_time: Option<String>,
    pub finish_time: Option<String>,
}

/// One job message of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobMessage {
    Available(JobInfo),
    Assigned(JobInfo),
    Started {
        runner_name: String,
        job: JobInfo,
    },
    Completed {
        result: String,
        runner_name: String,
        job: JobInfo,
    },
    /// A message type runway does not act on (named), acknowledged all the same.
    Other(String),
}

/// A batch of job messages, redelivered until it is acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub id: i64,
    pub statistics: Option<Statistics>,
    pub jobs: Vec<JobMessage>,
}

impl Message {
    /// Reads a queue answer. A body it cannot read is a message without
    /// jobs (it is still acknowledged and its statistics used): failing
    /// instead would be redelivered forever.
    fn from_wire(value: &Value) -> Message {
        let id = value["messageId"].as_i64().unwrap_or_default();
        let statistics = serde_json::from_value(value["statistics"].clone()).ok();
        let entries: Vec<Value> = match (value["messageType"].as_str(), value["body"].as_str()) {
            (Some("RunnerScaleSetJobMessages"), Some(body)) if !body.is_empty() => {
                serde_json::from_str(body).unwrap_or_else(|error| {
                    tracing::warn!(message = id, %error, "a scale-set message body that is not a list of job messages; acknowledged without effect");
                    Vec::new()
                })
            }
            (kind, _) => {
                if kind != Some("RunnerScaleSetJobMessages") {
                    tracing::warn!(message = id, kind = ?kind, "a scale-set message of a type runway does not know; acknowledged without effect");
                }
                Vec::new()
            }
        };
        let jobs = entries.iter().map(JobMessage::from_wire).collect();
        Message {
            id,
            statistics,
            jobs,
        }
    }
}

impl JobMessage {
    fn from_wire(entry: &Value) -> JobMessage {
        let kind = entry["messageType"].as_str().unwrap_or_default();
        let job = || serde_json::from_value::<JobInfo>(entry.clone()).unwrap_or_default();
        let text = |key: &str| entry[key].as_str().unwrap_or_default().to_owned();
        match kind {
            "JobAvailable" => JobMessage::Available(job()),
            "JobAssigned" => JobMessage::Assigned(job()),
            "JobStarted" => JobMessage::Started {
                runner_name: text("runnerName"),
                job: job(),
            },
            "JobCompleted" => JobMessage::Completed {
                result: text("result"),
                runner_name: text("runnerName"),
                job: job(),
            },
            other => JobMessage::Other(other.to_owned()),
        }
    }
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

/// How long a rate limit with no `Retry-After` and no reset time holds
/// the calls back: GitHub's documentation says to wait at least a minute.
const RATE_LIMIT_WAIT: Duration = Duration::from_secs(60);

/// How long GitHub asks the client to wait, if the answer is a rate
/// limit: `Retry-After` (seconds), else the reset time of a spent primary
/// limit, else [`RATE_LIMIT_WAIT`]; `None` for any other answer (a 403 that
/// is not a rate limit is a refusal, never a reason to refresh a token).
fn rate_limit_wait(
    status: StatusCode,
    headers: &reqwest::header::HeaderMap,
    body: &Value,
    now: Timestamp,
) -> Option<Duration> {
    let number =
        |name: &str| -> Option<u64> { headers.get(name)?.to_str().ok()?.trim().parse().ok() };
    let retry_after = number("retry-after").map(Duration::from_secs);
    let spent = number("x-ratelimit-remaining") == Some(0);
    let says_so = body["message"]
        .as_str()
        .is_some_and(|m| m.to_lowercase().contains("rate limit"));
    let limited = status == StatusCode::TOO_MANY_REQUESTS
        || (status == StatusCode::FORBIDDEN && (retry_after.is_some() || spent || says_so));
    if !limited {
        return None;
    }
    let reset = number("x-ratelimit-reset")
        .filter(|_| spent)
        .map(|at| Timestamp::from_millis(at as i64 * 1000).since(now));
    Some(retry_after.or(reset).unwrap_or(RATE_LIMIT_WAIT))
}

/// The `exp` of a JWT, if it has one (the signature is the service's
/// business, not runway's).
fn jwt_expiry(token: &str) -> Option<Timestamp> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: Value = serde_json::from_slice(&bytes).ok()?;
    claims["exp"]
        .as_i64()
        .map(|s| Timestamp::from_millis(s * 1000))
}

/// The service's message for a refusal: `message`, else GitHub's `typeName`.
fn refusal(operation: &'static str, status: StatusCode, body: &Value) -> GithubError {
    let message = body["message"]
        .as_str()
        .or(body["typeName"].as_str())
        .unwrap_or("no message");
    GithubError::Status {
        operation,
        status: status.as_u16(),
        message: message.chars().take(300).collect(),
    }
}

/// The HTTP status of a refusal, if the error is one.
pub fn status_of(error: &GithubError) -> Option<u16> {
    match error {
        GithubError::Status { status, .. } => Some(*status),
        _ => None,
    }
}

fn transport(operation: &'static str, error: reqwest::Error) -> GithubError {
    GithubError::Transport {
        operation,
        message: error.without_url().to_string(),
    }
}

/// A request's answer: status and JSON body (`Null` when not JSON).
struct Answer {
    operation: &'static str,
    status: StatusCode,
    body: Value,
}

impl Answer {
    /// The answer if its status is one of `ok`, the service's refusal
    /// otherwise.
    fn expect(self, ok: &[StatusCode]) -> Result<Answer, GithubError> {
        if ok.contains(&self.status) {
            Ok(self)
        } else {
            Err(refusal(self.operation, self.status, &self.body))
        }
    }

    /// An answer with the right status and the wrong shape.
    fn malformed(&self, message: &str) -> GithubError {
        GithubError::Status {
            operation: self.operation,
            status: self.status.as_u16(),
            message: message.to_owned(),
        }
    }
}

/// One request, as [`ScaleSetClient::send`] takes it: to the Actions
/// service (`path` from its URL on), to a session's message queue, or for
/// the admin connection.
struct Call {
    operation: &'static str,
    method: Method,
    /// From the service URL on.
    path: String,
    query: Vec<(&'static str, String)>,
    headers: Vec<(&'static str, String)>,
    body: Option<Value>,
    /// The Actions service's `api-version` query (not on the message
    /// queue's URL nor the admin connection, as GitHub's Go client sends them).
    api_version: bool,
    /// Instead of the HTTP client's own (a long poll is held longer).
    timeout: Option<Duration>,
}

/// How a request authenticates.
enum Auth<'a> {
    /// The admin token, or a session's queue token.
    Bearer(&'a Secret),
    /// A runner registration token, for the admin connection.
    RemoteAuth(&'a Secret),
}

impl Call {
    fn new(operation: &'static str, method: Method, path: String) -> Call {
        Call {
            operation,
            method,
            path,
            query: Vec::new(),
            headers: Vec::new(),
            body: None,
            api_version: true,
            timeout: None,
        }
    }

    /// A call outside the Actions service's versioned API.
    fn unversioned(mut self) -> Call {
        self.api_version = false;
        self
    }

    fn header(mut self, name: &'static str, value: String) -> Call {
        self.headers.push((name, value));
        self
    }

    fn timeout(mut self, timeout: Duration) -> Call {
        self.timeout = Some(timeout);
        self
    }

    fn query(mut self, key: &'static str, value: String) -> Call {
        self.query.push((key, value));
        self
    }

    fn body(mut self, body: Value) -> Call {
        self.body = Some(body);
        self
    }
}

const OK: &[StatusCode] = &[StatusCode::OK];
const OK_OR_CREATED: &[StatusCode] = &[StatusCode::OK, StatusCode::CREATED];

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

    fn count_refresh(&self, metrics: &Metrics, kind: &'static str) {
        metrics
            .scale_set_token_refreshes
            .get_or_create(&PoolKindLabels {
                pool: self.pool.clone(),
                kind,
            })
            .inc();
    }

    /// The service URL and admin token, fetched (again) when there is none
    /// or it is about to expire.
    async fn admin(&self, metrics: &Metrics) -> Result<(String, Secret), GithubError> {
        let mut admin = self.admin.lock().await;
        let now = crate::clock::now();
        if let Some(current) = admin.as_ref() {
            if current
                .expires_at
                .is_none_or(|at| now.plus(ADMIN_REFRESH_MARGIN) < at)
            {
                return Ok((current.url.clone(), current.token.clone()));
            }
        }
        let fresh = admin.is_none();
        let registration = self
            .github
            .registration_token(metrics, &self.target)
            .await?;
        let call = Call::new(
            "scale_set_admin_connection",
            Method::POST,
            "actions/runner-registration".into(),
        )
        .unversioned()
        .body(json!({"url": self.config_url, "runner_event": "register"}));
        let url = format!("{}/{}", self.github.api_url(), call.path);
        let answer = self
            .send(metrics, &call, &url, Auth::RemoteAuth(&registration))
            .await?;
        if !answer.status.is_success() {
            return Err(refusal(answer.operation, answer.status, &answer.body));
        }
        let (Some(url), Some(token)) = (answer.body["url"].as_str(), answer.body["token"].as_str())
        else {
            return Err(answer.malformed("the answer has no url or token"));
        };
        let url = format!("{}/", url.trim_end_matches('/'));
        let token = Secret::literal(token);
        if !fresh {
            self.count_refresh(metrics, "admin");
        }
        *admin = Some(Admin {
            url: url.clone(),
            token: token.clone(),
            expires_at: jwt_expiry(token.expose()),
        });
        Ok((url, token))
    }

    /// One request to the Actions service with the admin token; a 401
    /// (the token expired or was revoked early) fetches a new one and tries
    /// once more.
    async fn service(&self, metrics: &Metrics, call: Call) -> Result<Answer, GithubError> {
        for attempt in 0..2 {
            let (url, token) = self.admin(metrics).await?;
            let answer = self
                .send(
                    metrics,
                    &call,
                    &format!("{url}{}", call.path),
                    Auth::Bearer(&token),
                )
                .await?;
            if answer.status == StatusCode::UNAUTHORIZED && attempt == 0 {
                // Revoked or expired early: a new one.
                *self.admin.lock().await = None;
                self.count_refresh(metrics, "admin");
                continue;
            }
            return Ok(answer);
        }
        unreachable!("the loop returns on its second attempt")
    }

    async fn send(
        &self,
        metrics: &Metrics,
        call: &Call,
        url: &str,
        auth: Auth<'_>,
    ) -> Result<Answer, GithubError> {
        let operation = call.operation;
        let now = crate::clock::now();
        if let Some(until) = self.hold.lock().ok().and_then(|hold| *hold) {
            if now < until {
                // Rate-limited: not sent, so the limit is not extended.
                return Err(GithubError::Budget {
                    operation,
                    retry_at: until,
                });
            }
        }
        let authorization = match auth {
            Auth::Bearer(token) => format!("Bearer {}", token.expose()),
            Auth::RemoteAuth(token) => format!("RemoteAuth {}", token.expose()),
        };
        let mut request = self
            .github
            .http()
            .request(call.method.clone(), url)
            .query(&call.query)
            .header("authorization", authorization);
        if call.api_version {
            request = request.query(&[("api-version", API_VERSION)]);
        }
        for (name, value) in &call.headers {
            request = request.header(*name, value);
        }
        if let Some(timeout) = call.timeout {
            request = request.timeout(timeout);
        }
        if let Some(body) = &call.body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|error| {
            metrics.github_request(operation, "error");
            transport(operation, error)
        })?;
        let status = response.status();
        metrics.github_request(operation, status.as_str());
        let headers = response.headers().clone();
        let text = response.text().await.unwrap_or_default();
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        let now = crate::clock::now();
        if let Some(wait) = rate_limit_wait(status, &headers, &body, now) {
            // Jittered up to a fifth longer, so the pools' clients do not
            // all come back in the same second.
            let wait = wait.mul_f64(1.0 + rand::random::<f64>() * 0.2);
            let until = now.plus(wait);
            if let Ok(mut hold) = self.hold.lock() {
                *hold = Some(hold.map_or(until, |held| held.max(until)));
            }
            metrics
                .scale_set_refusals
                .get_or_create(&PoolKindLabels {
                    pool: self.pool.clone(),
                    kind: "rate_limited",
                })
                .inc();
            tracing::warn!(pool = %self.pool, operation, status = status.as_u16(), wait_ms = wait.as_millis() as u64, "GitHub rate-limited the scale set's calls; none before the wait is over");
            return Err(GithubError::Budget {
                operation,
                retry_at: until,
            });
        }
        if status.is_client_error() || status.is_server_error() {
            let kind = match status.as_u16() {
                401 => "unauthorized",
                403 => "forbidden",
                404 => "not_found",
                409 => "conflict",
                code if code >= 500 => "server_error",
                _ => "other",
            };
            metrics
                .scale_set_refusals
                .get_or_create(&PoolKindLabels {
                    pool: self.pool.clone(),
                    kind,
                })
                .inc();
        }
        Ok(Answer {
            operation,
            status,
            body,
        })
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

    /// Opens the scale set's message session. 409: another session holds
    /// it.
    pub async fn create_session(
        &self,
        metrics: &Metrics,
        scale_set_id: i64,
        owner: &str,
    ) -> Result<Session, GithubError> {
        let call = Call::new(
            "scale_set_session_create",
            Method::POST,
            format!("_apis/runtime/runnerscalesets/{scale_set_id}/sessions"),
        )
        .body(json!({"ownerName": owner}));
        let answer = self.service(metrics, call).await?.expect(OK_OR_CREATED)?;
        answer.session(scale_set_id)
    }

    /// A new queue token for the session. 404: the session is gone.
    pub async fn refresh_session(
        &self,
        metrics: &Metrics,
        session: &Session,
    ) -> Result<Session, GithubError> {
        let call = Call::new(
            "scale_set_session_refresh",
            Method::PATCH,
            format!(
                "_apis/runtime/runnerscalesets/{}/sessions/{}",
                session.scale_set_id, session.id
            ),
        );
        let answer = self.service(metrics, call).await?.expect(OK)?;
        self.count_refresh(metrics, "queue");
        answer.session(session.scale_set_id)
    }

    /// Closes a session; one already gone is no error. `true` when it
    /// was still there.
    pub async fn delete_session(
        &self,
        metrics: &Metrics,
        scale_set_id: i64,
        session_id: &str,
    ) -> Result<bool, GithubError> {
        let call = Call::new(
            "scale_set_session_delete",
            Method::DELETE,
            format!("_apis/runtime/runnerscalesets/{scale_set_id}/sessions/{session_id}"),
        );
        let answer = self.service(metrics, call).await?.expect(GONE)?;
        Ok(answer.status != StatusCode::NOT_FOUND)
    }

    /// One long poll of the session's queue: the next message after
    /// `last`, or `None` when the service had nothing within its hold.
    /// 401: the queue token expired; 404: the session is gone.
    pub async fn get_message(
        &self,
        metrics: &Metrics,
        session: &Session,
        last: i64,
        max_capacity: u32,
    ) -> Result<Option<Message>, GithubError> {
        let mut call = Call::new("scale_set_get_message", Method::GET, String::new())
            .unversioned()
            .timeout(POLL_TIMEOUT)
            .header(
                "accept",
                format!("application/json; api-version={API_VERSION}"),
            )
            .header("x-scalesetmaxcapacity", max_capacity.to_string());
        if last > 0 {
            call = call.query("lastMessageId", last.to_string());
        }
        let answer = self
            .send(
                metrics,
                &call,
                &session.queue_url,
                Auth::Bearer(&session.queue_token),
            )
            .await?;
        match answer.status {
            StatusCode::ACCEPTED => Ok(None),
            StatusCode::OK => Ok(Some(Message::from_wire(&answer.body))),
            status => Err(refusal(answer.operation, status, &answer.body)),
        }
    }

    /// Acknowledges a message: it is not delivered again. One already
    /// gone is no error.
    pub async fn delete_message(
        &self,
        metrics: &Metrics,
        session: &Session,
        message: i64,
    ) -> Result<(), GithubError> {
        let url = format!("{}/{message}", session.queue_url.trim_end_matches('/'));
        let call = Call::new("scale_set_delete_message", Method::DELETE, String::new())
            .unversioned()
            .header("content-type", "application/json".into());
        self.send(metrics, &call, &url, Auth::Bearer(&session.queue_token))
            .await?
            .expect(GONE)?;
        Ok(())
    }

    /// Acquires available jobs for the scale set; returns those acquired
    /// (acquiring one twice is harmless).
    pub async fn acquire_jobs(
        &self,
        metrics: &Metrics,
        session: &Session,
        request_ids: &[i64],
    ) -> Result<Vec<i64>, GithubError> {
        let (url, _) = self.admin(metrics).await?;
        let call = Call::new(
            "scale_set_acquire_jobs",
            Method::POST,
            format!(
                "_apis/runtime/runnerscalesets/{}/acquirejobs",
                session.scale_set_id
            ),
        )
        .body(json!(request_ids));
        let answer = self
            .send(
                metrics,
                &call,
                &format!("{url}{}", call.path),
                Auth::Bearer(&session.queue_token),
            )
            .await?
            .expect(OK)?;
        Ok(answer.body["value"]
            .as_array()
            .map(|ids| ids.iter().filter_map(Value::as_i64).collect())
            .unwrap_or_default())
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

/// A delete's answers that mean "gone": done now, or already.
const GONE: &[StatusCode] = &[
    StatusCode::OK,
    StatusCode::NO_CONTENT,
    StatusCode::NOT_FOUND,
];

impl Answer {
    fn scale_set(&self, value: &Value) -> Result<ScaleSet, GithubError> {
        match (value["id"].as_i64(), value["name"].as_str()) {
            (Some(id), Some(name)) => Ok(ScaleSet {
                id,
                name: name.to_owned(),
                runner_group_id: value["runnerGroupId"].as_i64().unwrap_or_default(),
                labels: value["labels"]
                    .as_array()
                    .map(|labels| {
                        labels
                            .iter()
                            .filter_map(|l| l["name"].as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default(),
            }),
            _ => Err(self.malformed("the answer has no scale set id or name")),
        }
    }

    fn session(&self, scale_set_id: i64) -> Result<Session, GithubError> {
        let value = &self.body;
        match (
            value["sessionId"].as_str(),
            value["messageQueueUrl"].as_str(),
            value["messageQueueAccessToken"].as_str(),
        ) {
            (Some(id), Some(url), Some(token)) => Ok(Session {
                id: id.to_owned(),
                scale_set_id,
                queue_url: url.to_owned(),
                queue_token: Secret::literal(token),
                statistics: serde_json::from_value(value["statistics"].clone()).ok(),
            }),
            _ => Err(self.malformed("the answer has no session id, queue URL or queue token")),
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
mod tests {
    use super::*;

    #[test]
    fn a_jwt_expiry_is_read_from_its_claims() {
        let claims =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(br#"{"exp":1700000000}"#);
        assert_eq!(
            jwt_expiry(&format!("e30.{claims}.")),
            Some(Timestamp::from_millis(1_700_000_000_000))
        );
        assert_eq!(jwt_expiry("not a jwt"), None);
    }

    #[test]
    fn a_message_is_read_and_an_unreadable_body_has_no_jobs() {
        let body = json!([
            {"messageType": "JobAvailable", "runnerRequestId": 7, "repositoryName": "r", "ownerName": "o", "workflowRunId": 9, "requestLabels": ["x"], "jobDisplayName": "build"},
            {"messageType": "JobStarted", "runnerRequestId": 7, "runnerName": "pool-1", "runnerId": 3},
            {"messageType": "JobCompleted", "runnerRequestId": 7, "result": "succeeded", "runnerName": "pool-1"},
            {"messageType": "SomethingNew"}
        ])
        .to_string();
        let message = Message::from_wire(&json!({
            "messageId": 4,
            "messageType": "RunnerScaleSetJobMessages",
            "body": body,
            "statistics": {"totalAssignedJobs": 2, "totalBusyRunners": 1}
        }));
        assert_eq!(message.id, 4);
        assert_eq!(
            message.statistics.as_ref().map(|s| s.total_assigned_jobs),
            Some(2)
        );
        assert_eq!(message.jobs.len(), 4);
        assert!(
            matches!(&message.jobs[0], JobMessage::Available(job) if job.runner_request_id == 7 && job.workflow_run_id == 9)
        );
        assert!(
            matches!(&message.jobs[1], JobMessage::Started { runner_name, .. } if runner_name == "pool-1")
        );
        assert!(
            matches!(&message.jobs[2], JobMessage::Completed { result, .. } if result == "succeeded")
        );
        assert_eq!(message.jobs[3], JobMessage::Other("SomethingNew".into()));
        let broken = Message::from_wire(&json!({
            "messageId": 5, "messageType": "RunnerScaleSetJobMessages", "body": "{not json"
        }));
        assert_eq!((broken.id, broken.jobs.len()), (5, 0));
    }
}
