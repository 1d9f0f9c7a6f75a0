//! A client for the GitHub REST API operations runway needs (issue 9):
//! just-in-time runner configurations, runner deregistration and job
//! re-checks. Every request first asks the budget
//! (`runway_core::github_budget`) whether it may go, and every answer's
//! rate-limit headers go back into it. Requests are counted in
//! `runway_github_requests_total{operation,status}`.
//!
//! Not yet wired into the reconciler: see issue 9's closing note.

use std::sync::Mutex;
use std::time::Duration;

use reqwest::header::HeaderMap;
use reqwest::StatusCode;
use runway_core::github_budget::{Budget, Priority};
use runway_core::Timestamp;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::config::Secret;
use crate::metrics::Metrics;

/// Where runners register: an organisation or one repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Org(String),
    Repo { owner: String, name: String },
}

impl Target {
    fn runners_path(&self) -> String {
        match self {
            Target::Org(org) => format!("/orgs/{org}/actions/runners"),
            Target::Repo { owner, name } => format!("/repos/{owner}/{name}/actions/runners"),
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

/// What GitHub says of a job.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct JobStatus {
    pub id: u64,
    /// `queued`, `in_progress`, `completed`, `waiting`, …
    pub status: String,
    pub conclusion: Option<String>,
    pub runner_name: Option<String>,
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
    token: Secret,
    budget: Mutex<Budget>,
}

fn header_number(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

impl GithubClient {
    /// `api_url`: `https://api.github.com`, or a GitHub Enterprise
    /// server's `https://HOST/api/v3`.
    pub fn new(
        api_url: &str,
        token: Secret,
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
            token,
            budget: Mutex::new(Budget::new(max_requests_per_hour)),
        })
    }

    /// What GitHub last said is left of the hour's requests.
    pub fn rate_limit_remaining(&self, now: Timestamp) -> Option<u32> {
        self.budget.lock().ok()?.github_remaining(now)
    }

    async fn send(
        &self,
        metrics: &Metrics,
        operation: &'static str,
        priority: Priority,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(StatusCode, Value), GithubError> {
        let now = crate::service::now();
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
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.api_url))
            .bearer_auth(self.token.expose())
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
        if let Ok(mut budget) = self.budget.lock() {
            budget.observe(
                remaining,
                header_number(&headers, "x-ratelimit-limit").map(|n| n as u32),
                header_number(&headers, "x-ratelimit-reset")
                    .map(|s| Timestamp::from_millis(s as i64 * 1000)),
                header_number(&headers, "retry-after").map(Duration::from_secs),
                crate::service::now(),
            );
        }
        if let Some(remaining) = remaining {
            metrics
                .github_rate_limit_remaining
                .set(i64::from(remaining));
        }
        metrics.github_request(operation, status.as_str());
        let text = response.text().await.unwrap_or_default();
        let value = serde_json::from_str(&text).unwrap_or(Value::Null);
        Ok((status, value))
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
        const OPERATION: &str = "generate_jitconfig";
        let (status, body) = self
            .send(
                metrics,
                OPERATION,
                Priority::JitConfig,
                reqwest::Method::POST,
                &format!("{}/generate-jitconfig", target.runners_path()),
                Some(json!({
                    "name": name,
                    "runner_group_id": runner_group_id,
                    "labels": labels,
                    "work_folder": "_work",
                })),
            )
            .await?;
        if status != StatusCode::CREATED {
            return Err(GithubClient::refused(OPERATION, status, &body));
        }
        match (
            body["runner"]["id"].as_u64(),
            body["encoded_jit_config"].as_str(),
        ) {
            (Some(runner_id), Some(encoded)) => Ok(JitConfig {
                runner_id,
                encoded: encoded.to_owned(),
            }),
            _ => Err(GithubError::Status {
                operation: OPERATION,
                status: status.as_u16(),
                message: "the answer has no runner.id or encoded_jit_config".into(),
            }),
        }
    }

    /// `DELETE …/actions/runners/{id}`. GitHub answers 422 while the runner
    /// runs a job: then the instance must be kept.
    pub async fn delete_runner(
        &self,
        metrics: &Metrics,
        target: &Target,
        runner_id: u64,
    ) -> Result<Deregistered, GithubError> {
        const OPERATION: &str = "delete_runner";
        let (status, body) = self
            .send(
                metrics,
                OPERATION,
                Priority::Deregister,
                reqwest::Method::DELETE,
                &format!("{}/{runner_id}", target.runners_path()),
                None,
            )
            .await?;
        match status {
            StatusCode::NO_CONTENT => Ok(Deregistered::Removed),
            StatusCode::NOT_FOUND => Ok(Deregistered::NotFound),
            StatusCode::UNPROCESSABLE_ENTITY => Err(GithubError::RunnerBusy(runner_id)),
            other => Err(GithubClient::refused(OPERATION, other, &body)),
        }
    }

    /// `GET /repos/{owner}/{repo}/actions/jobs/{job_id}`: what a queued
    /// job really is now.
    pub async fn get_job(
        &self,
        metrics: &Metrics,
        repository: &str,
        job_id: u64,
    ) -> Result<JobStatus, GithubError> {
        const OPERATION: &str = "get_job";
        let (status, body) = self
            .send(
                metrics,
                OPERATION,
                Priority::Recheck,
                reqwest::Method::GET,
                &format!("/repos/{repository}/actions/jobs/{job_id}"),
                None,
            )
            .await?;
        if status != StatusCode::OK {
            return Err(GithubClient::refused(OPERATION, status, &body));
        }
        serde_json::from_value(body).map_err(|e| GithubError::Status {
            operation: OPERATION,
            status: status.as_u16(),
            message: format!("unexpected job shape: {e}"),
        })
    }
}
