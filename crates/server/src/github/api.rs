//! A client for the GitHub REST API operations runway needs: just-in-time
//! runner configurations, runner deregistration, job re-checks and webhook
//! redelivery. Every request first asks the budget
//! (`runway_core::github_budget`) whether it may go, and every answer's
//! rate-limit headers go back into it. Requests are counted in
//! `runway_github_requests_total{operation,status}`.
//!
//! Authentication is a token, or a GitHub App: a JWT signed with the App's
//! key mints installation tokens (kept until five minutes before they
//! expire) and itself authenticates the App's own webhook endpoints.
//!
//! Why one file of over 800 lines: every call shares the budget, the App's
//! token cache and the mapping of GitHub's answers to errors; what the
//! scale-set service needs is its own module (`scaleset`).

use std::sync::Mutex;
use std::time::Duration;

use reqwest::header::HeaderMap;
use reqwest::StatusCode;
use runway_core::github_budget::{Budget, Priority};
use runway_core::Timestamp;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::config::Secret;
pub use crate::config::{Hook, Target};
use crate::telemetry::metrics::Metrics;

impl Target {
    fn runners_path(&self) -> String {
        match self {
            Target::Org(org) => format!("/orgs/{org}/actions/runners"),
            Target::Repo { owner, name } => format!("/repos/{owner}/{name}/actions/runners"),
            Target::Enterprise(slug) => format!("/enterprises/{slug}/actions/runners"),
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GithubError {
    /// The budget holds this request back until then.
    #[error("GitHub request budget spent for {operation}; retry at {retry_at:?}")]
    Budget {
        operation: &'static str,
        retry_at: Timestamp,
    },
    /// GitHub refused to delete a runner that is running a job.
    #[error("GitHub refuses to remove runner {0}: it is running a job")]
    RunnerBusy(u64),
    #[error("GitHub answered {status} to {operation}: {message}")]
    Status {
        operation: &'static str,
        status: u16,
        message: String,
    },
    #[error("GitHub {operation}: {message}")]
    Transport {
        operation: &'static str,
        message: String,
    },
}

/// A runner's just-in-time configuration: what the runner binary runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JitConfig {
    pub runner_id: u64,
    /// Secret: never logged.
    pub encoded: String,
}

/// A runner group, as far as who may use it: `visibility` is `all` (every
/// repository of the organisation), `selected` or `private`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct RunnerGroup {
    pub id: u64,
    pub name: String,
    pub visibility: String,
    #[serde(default)]
    pub allows_public_repositories: bool,
}

/// What GitHub says of a workflow run, as an access policy needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunInfo {
    /// The triggering event (`push`, `pull_request`, `schedule`, …).
    pub event: String,
    /// The run's head repository is not its repository (a pull request
    /// from a fork), or is unknown.
    pub fork: bool,
}

/// What GitHub says of a job.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct JobStatus {
    pub id: u64,
    /// `queued`, `in_progress`, `completed`, `waiting`, …
    pub status: String,
    pub conclusion: Option<String>,
    pub runner_name: Option<String>,
    #[serde(default)]
    pub started_at: Option<String>,
    #[serde(default)]
    pub completed_at: Option<String>,
}

/// One webhook delivery as GitHub lists it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Delivery {
    pub id: u64,
    /// The `X-GitHub-Delivery` of the event, shared by its redeliveries.
    pub guid: String,
    pub delivered_at: String,
    pub redelivery: bool,
    /// `OK`, or what went wrong ("Invalid HTTP Response: 503", a timeout).
    #[serde(default)]
    pub status: String,
    /// The HTTP status runway answered with; 0 or absent when it did not
    /// answer at all.
    #[serde(default)]
    pub status_code: u16,
    pub event: String,
    pub action: Option<String>,
}

impl Delivery {
    /// Whether this attempt failed: GitHub's documented rule is a `status`
    /// other than `OK` (which also covers an attempt runway never
    /// answered, whose `status_code` is outside the 400–599 range the
    /// `status=failure` filter selects); without a `status`, an answer
    /// outside 2xx–3xx.
    pub fn failed(&self) -> bool {
        if self.status.is_empty() {
            !(200..400).contains(&self.status_code)
        } else {
            !self.status.eq_ignore_ascii_case("OK")
        }
    }
}

/// One page of deliveries, newest first, and the cursor of the next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryPage {
    pub deliveries: Vec<Delivery>,
    pub next_cursor: Option<String>,
}

/// How runway proves who it is.
pub enum Credentials {
    Token(Secret),
    App {
        app_id: u64,
        key: Box<jsonwebtoken::EncodingKey>,
        installation_id: u64,
    },
}

impl Credentials {
    /// From `[github]`: a token, or an App whose PEM key must parse.
    pub fn from_config(auth: &crate::config::GithubAuth) -> Result<Credentials, String> {
        match auth {
            crate::config::GithubAuth::Token(token) => Ok(Credentials::Token(token.clone())),
            crate::config::GithubAuth::App {
                app_id,
                private_key,
                installation_id,
            } => {
                let key = jsonwebtoken::EncodingKey::from_rsa_pem(private_key.expose().as_bytes())
                    .map_err(|e| format!("not an RSA private key in PEM form ({e})"))?;
                Ok(Credentials::App {
                    app_id: *app_id,
                    key: Box::new(key),
                    installation_id: *installation_id,
                })
            }
        }
    }
}

/// Which identity a request goes out as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum As {
    /// The token, or the App's installation.
    Installation,
    /// The App itself (its webhook's deliveries).
    App,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deregistered {
    Removed,
    /// It was not registered (any more): nothing to do.
    NotFound,
}

pub struct GithubClient {
    http: reqwest::Client,
    api_url: String,
    credentials: Credentials,
    /// The App installation's token and when it expires.
    installation_token: tokio::sync::Mutex<Option<(Secret, Timestamp)>>,
    budget: Mutex<Budget>,
}

/// How long a secondary rate limit without `Retry-After` stops requests.
const SECONDARY_LIMIT_WAIT: Duration = Duration::from_secs(60);

/// An installation token is replaced this long before it expires.
const TOKEN_REFRESH_MARGIN: Duration = Duration::from_secs(300);

#[derive(serde::Serialize)]
struct AppClaims {
    iat: i64,
    exp: i64,
    iss: String,
}

/// The `cursor` of a `Link` header's `rel="next"` URL.
fn next_cursor(headers: &HeaderMap) -> Option<String> {
    let link = headers.get("link")?.to_str().ok()?;
    link.split(',').find_map(|part| {
        let (url, params) = part.split_once(';')?;
        if !params.contains("rel=\"next\"") {
            return None;
        }
        let url = url.trim().trim_start_matches('<').trim_end_matches('>');
        let query = url.split_once('?')?.1;
        query.split('&').find_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            (key == "cursor").then(|| value.to_owned())
        })
    })
}

fn header_number(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

impl GithubClient {
    /// `api_url`: `https://api.github.com`, or a GitHub Enterprise
    /// server's `https://HOST/api/v3`.
    pub fn new(
        api_url: &str,
        credentials: Credentials,
        max_requests_per_hour: u32,
    ) -> Result<GithubClient, String> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .user_agent(concat!("runway/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot build the GitHub HTTP client: {e}"))?;
        Ok(GithubClient {
            http,
            api_url: api_url.trim_end_matches('/').to_owned(),
            credentials,
            installation_token: tokio::sync::Mutex::new(None),
            budget: Mutex::new(Budget::new(max_requests_per_hour)),
        })
    }

    /// The client `[github]` describes, or `None` without credentials.
    pub fn from_config(
        config: &crate::config::GithubConfig,
    ) -> Result<Option<GithubClient>, String> {
        let Some(auth) = config.auth() else {
            return Ok(None);
        };
        GithubClient::new(
            &config.api_url,
            Credentials::from_config(&auth)?,
            config.max_requests_per_hour,
        )
        .map(Some)
    }

    /// A JWT for the App, valid for nine minutes (GitHub allows ten), dated
    /// a minute back for clock drift.
    fn app_jwt(&self, operation: &'static str) -> Result<String, GithubError> {
        let Credentials::App { app_id, key, .. } = &self.credentials else {
            return Err(GithubError::Transport {
                operation,
                message: "this needs GitHub App credentials".into(),
            });
        };
        let now = crate::clock::now().as_millis() / 1000;
        let claims = AppClaims {
            iat: now - 60,
            exp: now + 540,
            iss: app_id.to_string(),
        };
        jsonwebtoken::encode(
            &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
            &claims,
            key,
        )
        .map_err(|e| GithubError::Transport {
            operation,
            message: format!("cannot sign the App's JWT: {e}"),
        })
    }

    /// The bearer credential for a request: the token, the App's JWT, or an
    /// installation token (minted or refreshed first when needed).
    async fn bearer(
        &self,
        metrics: &Metrics,
        operation: &'static str,
        who: As,
    ) -> Result<String, GithubError> {
        let installation_id = match (&self.credentials, who) {
            (Credentials::Token(token), _) => return Ok(token.expose().to_owned()),
            (Credentials::App { .. }, As::App) => return self.app_jwt(operation),
            (
                Credentials::App {
                    installation_id, ..
                },
                As::Installation,
            ) => *installation_id,
        };
        let mut cached = self.installation_token.lock().await;
        let now = crate::clock::now();
        if let Some((token, expires_at)) = cached.as_ref() {
            if now.plus(TOKEN_REFRESH_MARGIN) < *expires_at {
                return Ok(token.expose().to_owned());
            }
        }
        const MINT: &str = "installation_token";
        let jwt = self.app_jwt(MINT)?;
        let response = self
            .http
            .post(format!(
                "{}/app/installations/{installation_id}/access_tokens",
                self.api_url
            ))
            .bearer_auth(jwt)
            .header("accept", "application/vnd.github+json")
            .header("x-github-api-version", "2022-11-28")
            .send()
            .await
            .map_err(|error| {
                metrics.github_request(MINT, "error");
                GithubError::Transport {
                    operation: MINT,
                    message: error.without_url().to_string(),
                }
            })?;
        let status = response.status();
        metrics.github_request(MINT, status.as_str());
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if status != StatusCode::CREATED {
            return Err(GithubClient::refused(MINT, status, &body));
        }
        let token = body["token"].as_str().map(str::to_owned);
        let expires_at = body["expires_at"].as_str().and_then(parse_time);
        let (Some(token), Some(expires_at)) = (token, expires_at) else {
            return Err(GithubError::Status {
                operation: MINT,
                status: status.as_u16(),
                message: "the answer has no token or expires_at".into(),
            });
        };
        *cached = Some((Secret::literal(&token), expires_at));
        Ok(token)
    }

    /// What GitHub last said is left of the hour's requests.
    pub fn rate_limit_remaining(&self, now: Timestamp) -> Option<u32> {
        self.budget.lock().ok()?.github_remaining(now)
    }

    async fn send(&self, metrics: &Metrics, call: Call) -> Result<Answer, GithubError> {
        let Call {
            operation,
            priority,
            who,
            method,
            path,
            body,
        } = call;
        let now = crate::clock::now();
        {
            let mut budget = self.budget.lock().map_err(|_| GithubError::Transport {
                operation,
                message: "budget poisoned".into(),
            })?;
            budget
                .permit(priority, now)
                .map_err(|retry_at| GithubError::Budget {
                    operation,
                    retry_at,
                })?;
            budget.spend(now);
        }
        let bearer = self.bearer(metrics, operation, who).await?;
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.api_url))
            .bearer_auth(bearer)
            .header("accept", "application/vnd.github+json")
            .header("x-github-api-version", "2022-11-28");
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => {
                metrics.github_request(operation, "error");
                return Err(GithubError::Transport {
                    operation,
                    message: error.without_url().to_string(),
                });
            }
        };
        let status = response.status();
        let headers = response.headers().clone();
        let remaining = header_number(&headers, "x-ratelimit-remaining").map(|n| n as u32);
        metrics.github_request(operation, status.as_str());
        if let Some(remaining) = remaining.filter(|_| who == As::Installation) {
            metrics
                .github_rate_limit_remaining
                .set(i64::from(remaining));
        }
        let text = response.text().await.unwrap_or_default();
        let value = serde_json::from_str(&text).unwrap_or(Value::Null);
        // The App's own requests have a budget of their own.
        if who == As::Installation || matches!(self.credentials, Credentials::Token(_)) {
            self.observe(status, &headers, remaining, &value);
        }
        Ok(Answer {
            operation,
            status,
            headers,
            body: value,
        })
    }

    fn observe(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        remaining: Option<u32>,
        body: &Value,
    ) {
        let mut retry_after = header_number(headers, "retry-after").map(Duration::from_secs);
        // A secondary rate limit without Retry-After: GitHub says to wait
        // at least a minute.
        let limited = status == StatusCode::TOO_MANY_REQUESTS
            || (status == StatusCode::FORBIDDEN
                && body["message"]
                    .as_str()
                    .is_some_and(|m| m.to_lowercase().contains("rate limit")));
        if limited && retry_after.is_none() && remaining != Some(0) {
            retry_after = Some(SECONDARY_LIMIT_WAIT);
        }
        if let Ok(mut budget) = self.budget.lock() {
            budget.observe(
                remaining,
                header_number(headers, "x-ratelimit-limit").map(|n| n as u32),
                header_number(headers, "x-ratelimit-reset")
                    .map(|s| Timestamp::from_millis(s as i64 * 1000)),
                retry_after,
                crate::clock::now(),
            );
        }
    }

    fn refused(operation: &'static str, status: StatusCode, body: &Value) -> GithubError {
        GithubError::Status {
            operation,
            status: status.as_u16(),
            message: body["message"]
                .as_str()
                .unwrap_or("no message")
                .chars()
                .take(300)
                .collect(),
        }
    }

    /// `POST …/actions/runners/generate-jitconfig`: registers an ephemeral
    /// runner named `name` and returns its configuration.
    pub async fn generate_jitconfig(
        &self,
        metrics: &Metrics,
        target: &Target,
        name: &str,
        labels: &[String],
        runner_group_id: u64,
    ) -> Result<JitConfig, GithubError> {
        let call = Call::new(
            "generate_jitconfig",
            Priority::JitConfig,
            As::Installation,
            reqwest::Method::POST,
            format!("{}/generate-jitconfig", target.runners_path()),
        )
        .with_body(json!({
            "name": name,
            "runner_group_id": runner_group_id,
            "labels": labels,
            "work_folder": "_work",
        }));
        let answer = self
            .send(metrics, call)
            .await?
            .expect(StatusCode::CREATED)?;
        match (
            answer.body["runner"]["id"].as_u64(),
            answer.body["encoded_jit_config"].as_str(),
        ) {
            (Some(runner_id), Some(encoded)) => Ok(JitConfig {
                runner_id,
                encoded: encoded.to_owned(),
            }),
            _ => Err(answer.malformed("the answer has no runner.id or encoded_jit_config")),
        }
    }

    /// `POST …/actions/runners/registration-token`: a short-lived token
    /// that registers runners, which the Actions service also takes in
    /// exchange for its own admin connection (scale sets).
    pub async fn registration_token(
        &self,
        metrics: &Metrics,
        target: &Target,
    ) -> Result<Secret, GithubError> {
        let call = Call::new(
            "registration_token",
            Priority::JitConfig,
            As::Installation,
            reqwest::Method::POST,
            format!("{}/registration-token", target.runners_path()),
        );
        let answer = self
            .send(metrics, call)
            .await?
            .expect(StatusCode::CREATED)?;
        match answer.body["token"].as_str() {
            Some(token) if !token.is_empty() => Ok(Secret::literal(token)),
            _ => Err(answer.malformed("the answer has no token")),
        }
    }

    /// The REST API's root this client talks to.
    pub fn api_url(&self) -> &str {
        &self.api_url
    }

    /// The HTTP client, shared with the scale-set client (`scaleset`).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// `GET …/actions/runners/downloads`: the GitHub runner's downloads
    /// (GARM's `tools`), each `{os, architecture, download_url, filename}`
    /// and, when GitHub gives them, `temp_download_token`, `sha256_checksum`.
    pub async fn runner_downloads(
        &self,
        metrics: &Metrics,
        target: &Target,
    ) -> Result<Vec<Value>, GithubError> {
        let call = Call::new(
            "runner_downloads",
            Priority::JitConfig,
            As::Installation,
            reqwest::Method::GET,
            format!("{}/downloads", target.runners_path()),
        );
        let answer = self.send(metrics, call).await?.expect(StatusCode::OK)?;
        const FIELDS: [&str; 6] = [
            "os",
            "architecture",
            "download_url",
            "filename",
            "temp_download_token",
            "sha256_checksum",
        ];
        let downloads = answer
            .body
            .as_array()
            .ok_or_else(|| answer.malformed("the answer is not an array"))?
            .iter()
            .filter(|d| d["download_url"].is_string() && d["filename"].is_string())
            .map(|d| {
                Value::Object(
                    FIELDS
                        .iter()
                        .filter_map(|f| Some((f.to_string(), d.get(*f)?.clone())))
                        .collect(),
                )
            })
            .collect();
        Ok(downloads)
    }

    /// `DELETE …/actions/runners/{id}`. GitHub answers 422 while the runner
    /// runs a job: then the instance must be kept.
    pub async fn delete_runner(
        &self,
        metrics: &Metrics,
        target: &Target,
        runner_id: u64,
    ) -> Result<Deregistered, GithubError> {
        let call = Call::new(
            "delete_runner",
            Priority::Deregister,
            As::Installation,
            reqwest::Method::DELETE,
            format!("{}/{runner_id}", target.runners_path()),
        );
        let answer = self.send(metrics, call).await?;
        match answer.status {
            StatusCode::NO_CONTENT => Ok(Deregistered::Removed),
            StatusCode::NOT_FOUND => Ok(Deregistered::NotFound),
            StatusCode::UNPROCESSABLE_ENTITY => Err(GithubError::RunnerBusy(runner_id)),
            _ => Err(answer.refused()),
        }
    }

    /// `GET …/actions/runners?name=NAME`: the id of the self-hosted runner
    /// registered under `name`, if any. What deregistration asks when the
    /// id GitHub gave a just-in-time runner never reached the store (runway
    /// stopped, or the store failed, between GitHub's answer and the write).
    pub async fn find_runner_id(
        &self,
        metrics: &Metrics,
        target: &Target,
        name: &str,
    ) -> Result<Option<u64>, GithubError> {
        let encoded: String = url::form_urlencoded::byte_serialize(name.as_bytes()).collect();
        let call = Call::new(
            "find_runner",
            Priority::Deregister,
            As::Installation,
            reqwest::Method::GET,
            format!("{}?name={encoded}", target.runners_path()),
        );
        let answer = self.send(metrics, call).await?.expect(StatusCode::OK)?;
        Ok(answer.body["runners"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|runner| runner["name"].as_str() == Some(name))
            .and_then(|runner| runner["id"].as_u64()))
    }

    /// `GET /repos/{owner}/{repo}/actions/jobs/{job_id}`: what a queued
    /// job really is now.
    pub async fn get_job(
        &self,
        metrics: &Metrics,
        repository: &str,
        job_id: u64,
    ) -> Result<JobStatus, GithubError> {
        let call = Call::new(
            "get_job",
            Priority::Recheck,
            As::Installation,
            reqwest::Method::GET,
            format!("/repos/{repository}/actions/jobs/{job_id}"),
        );
        self.send(metrics, call)
            .await?
            .expect(StatusCode::OK)?
            .parse("job")
    }

    /// `GET /repos/{repository}/actions/runs/{run_id}`: the facts of a
    /// workflow run an access policy judges by. A run whose head repository
    /// is another (or gone) than its own comes from a fork.
    pub async fn get_run(
        &self,
        metrics: &Metrics,
        repository: &str,
        run_id: u64,
        priority: Priority,
    ) -> Result<RunInfo, GithubError> {
        let call = Call::new(
            "get_run",
            priority,
            As::Installation,
            reqwest::Method::GET,
            format!("/repos/{repository}/actions/runs/{run_id}"),
        );
        let answer = self.send(metrics, call).await?.expect(StatusCode::OK)?;
        let body = &answer.body;
        let Some(event) = body["event"].as_str() else {
            return Err(GithubError::Transport {
                operation: "get_run",
                message: "the workflow run has no event".into(),
            });
        };
        let own = body["repository"]["id"].as_u64();
        let head = body["head_repository"]["id"].as_u64();
        Ok(RunInfo {
            event: event.to_owned(),
            fork: own.is_none() || head.is_none() || own != head,
        })
    }

    /// `GET /orgs/{org}/actions/runner-groups/{id}`: who the runner group
    /// admits.
    pub async fn get_runner_group(
        &self,
        metrics: &Metrics,
        org: &str,
        id: u64,
    ) -> Result<RunnerGroup, GithubError> {
        let call = Call::new(
            "get_runner_group",
            Priority::Recheck,
            As::Installation,
            reqwest::Method::GET,
            format!("/orgs/{org}/actions/runner-groups/{id}"),
        );
        self.send(metrics, call)
            .await?
            .expect(StatusCode::OK)?
            .parse("runner group")
    }

    fn hook_identity(hook: &Hook) -> As {
        match hook {
            Hook::App => As::App,
            Hook::Org { .. } | Hook::Repo { .. } => As::Installation,
        }
    }

    /// One page (up to 100, newest first) of the hook's deliveries, from
    /// `cursor` on. Unfiltered: `status=failure` selects answers in the
    /// 400–599 range only, which leaves out a delivery runway never
    /// answered (down, timed out) — the one that most needs redelivering.
    pub async fn list_deliveries(
        &self,
        metrics: &Metrics,
        hook: &Hook,
        cursor: Option<&str>,
    ) -> Result<DeliveryPage, GithubError> {
        let mut path = format!("{}?per_page=100", hook.deliveries_path());
        if let Some(cursor) = cursor {
            path.push_str("&cursor=");
            path.push_str(cursor);
        }
        let call = Call::new(
            "list_deliveries",
            Priority::Redeliver,
            GithubClient::hook_identity(hook),
            reqwest::Method::GET,
            path,
        );
        let answer = self.send(metrics, call).await?.expect(StatusCode::OK)?;
        let next_cursor = next_cursor(&answer.headers);
        Ok(DeliveryPage {
            deliveries: answer.parse("deliveries")?,
            next_cursor,
        })
    }

    /// Asks GitHub to deliver `delivery` again.
    pub async fn redeliver(
        &self,
        metrics: &Metrics,
        hook: &Hook,
        delivery: u64,
    ) -> Result<(), GithubError> {
        let call = Call::new(
            "redeliver",
            Priority::Redeliver,
            GithubClient::hook_identity(hook),
            reqwest::Method::POST,
            format!("{}/{delivery}/attempts", hook.deliveries_path()),
        );
        self.send(metrics, call)
            .await?
            .expect(StatusCode::ACCEPTED)?;
        Ok(())
    }
}

/// One request to GitHub's REST API, as [`GithubClient::send`] takes it.
struct Call {
    /// The name in errors and in `runway_github_requests_total`.
    operation: &'static str,
    priority: Priority,
    who: As,
    method: reqwest::Method,
    /// From the API root on, with any query.
    path: String,
    body: Option<Value>,
}

impl Call {
    fn new(
        operation: &'static str,
        priority: Priority,
        who: As,
        method: reqwest::Method,
        path: String,
    ) -> Call {
        Call {
            operation,
            priority,
            who,
            method,
            path,
            body: None,
        }
    }

    fn with_body(self, body: Value) -> Call {
        Call {
            body: Some(body),
            ..self
        }
    }
}

/// GitHub's answer to a [`Call`]: the body is JSON, `Null` when it is not.
struct Answer {
    operation: &'static str,
    status: StatusCode,
    headers: HeaderMap,
    body: Value,
}

impl Answer {
    /// The answer if its status is `ok`, GitHub's refusal otherwise.
    fn expect(self, ok: StatusCode) -> Result<Answer, GithubError> {
        if self.status == ok {
            Ok(self)
        } else {
            Err(self.refused())
        }
    }

    fn refused(&self) -> GithubError {
        GithubClient::refused(self.operation, self.status, &self.body)
    }

    /// An answer with the right status and the wrong shape.
    fn malformed(&self, message: impl Into<String>) -> GithubError {
        GithubError::Status {
            operation: self.operation,
            status: self.status.as_u16(),
            message: message.into(),
        }
    }

    /// The body as a `T`; `what` names it in the error.
    fn parse<T: serde::de::DeserializeOwned>(self, what: &str) -> Result<T, GithubError> {
        let operation = self.operation;
        let status = self.status.as_u16();
        serde_json::from_value(self.body).map_err(|e| GithubError::Status {
            operation,
            status,
            message: format!("unexpected {what} shape: {e}"),
        })
    }
}

/// An RFC 3339 time as a [`Timestamp`].
pub fn parse_time(text: &str) -> Option<Timestamp> {
    let parsed =
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(parsed.unix_timestamp_nanos() / 1_000_000)
        .ok()
        .map(Timestamp::from_millis)
}
