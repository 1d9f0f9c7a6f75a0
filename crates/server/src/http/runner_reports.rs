//! `POST /api/v1/runners/{id}/metrics`: what a runner reports about the job
//! it is running, in the shapes of the GitHub-runner metrics spec:
//!
//! - pre-job `{phase: "pre-job", workflow, repository, event, workflow_run_id, timestamp}`
//! - post-job `{phase: "post-job", timestamp, status: "normal" | "repo-policy-check-failure"}`
//!
//! The runner is untrusted: the body is size-limited, unknown fields are
//! refused, strings are bounded, and a timestamp (Unix seconds) must fall
//! within the runner's lifetime. A refused report is counted by reason and
//! stores nothing.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use runway_core::access::Verdict;

use crate::app::access::judge_started_job;
use crate::app::reports::{self, PreJob};
use crate::app::{AppError, Service};
use crate::clock::now;
use crate::http::auth::ReporterAuth;
use crate::http::error::{ApiError, ErrorBody};
use crate::http::extract::Path;
use crate::http::openapi::RunnerRefusals;

pub const MAX_REPORT_BYTES: usize = 64 * 1024;
const MAX_STRING: usize = 256;
/// Clock skew tolerated between a runner and runway.
const SKEW: Duration = Duration::from_secs(300);

pub fn router() -> OpenApiRouter<Arc<Service>> {
    OpenApiRouter::new()
        .routes(routes!(report))
        .layer(DefaultBodyLimit::max(MAX_REPORT_BYTES))
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(tag = "phase", deny_unknown_fields)]
enum Report {
    #[serde(rename = "pre-job")]
    PreJob {
        #[schema(schema_with = report_string)]
        workflow: String,
        #[schema(schema_with = report_string)]
        repository: String,
        #[schema(schema_with = report_string)]
        event: String,
        #[schema(schema_with = run_id)]
        workflow_run_id: RunId,
        /// Unix seconds, within the runner's lifetime.
        timestamp: f64,
    },
    #[serde(rename = "post-job")]
    PostJob {
        /// Unix seconds, within the runner's lifetime.
        timestamp: f64,
        status: PostJobStatus,
    },
}

/// 1 to [`MAX_STRING`] characters, none of them a control character.
fn report_string() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .min_length(Some(1))
        .max_length(Some(MAX_STRING))
        .pattern(Some("^[^\\u0000-\\u001f\\u007f-\\u009f]*$"))
        .build()
}

/// A positive number, or up to 32 digits as a string.
fn run_id() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
    Schema::OneOf(
        OneOfBuilder::new()
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(1)),
            )
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some("^[0-9]{1,32}$")),
            )
            .build(),
    )
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RunId {
    Number(u64),
    Text(String),
}

#[derive(Deserialize, utoipa::ToSchema)]
enum PostJobStatus {
    #[serde(rename = "normal")]
    Normal,
    #[serde(rename = "repo-policy-check-failure")]
    RepoPolicyCheckFailure,
}

impl PostJobStatus {
    fn as_str(&self) -> &'static str {
        match self {
            PostJobStatus::Normal => "normal",
            PostJobStatus::RepoPolicyCheckFailure => "repo-policy-check-failure",
        }
    }
}

/// Unix seconds as a time.
fn seconds(seconds: f64) -> runway_core::Timestamp {
    runway_core::Timestamp::from_millis((seconds * 1_000.0).round() as i64)
}

fn refuse(
    service: &Service,
    reason: &'static str,
    status: StatusCode,
    message: String,
) -> ApiError {
    count_refusal(
        service,
        reason,
        ApiError::new(status, "invalid_report", message),
    )
}

/// `error`, counted in `runway_runner_reports_rejected_total{reason}`.
fn count_refusal(service: &Service, reason: &'static str, error: ApiError) -> ApiError {
    service.metrics.report_refused(reason);
    error
}

/// What a runner reports about the job it runs (pre-job, post-job), in
/// the GitHub-runner metrics spec's shapes. Timestamps are Unix seconds
/// within the runner's lifetime.
#[utoipa::path(post, path = "/api/v1/runners/{id}/metrics", tag = "runner-api",
    params(("id" = i64, Path, description = "The reporting runner's own id")),
    request_body = Report,
    security(("runner_token" = [])),
    responses(
        (status = 202, description = "Stored"),
        (status = 400, description = "Not a valid report", body = ErrorBody),
        (status = 403, description = "A runner may only report about itself (`not_this_runner`); or, to a pre-job report, the runner's pool does not admit that job (`repo_policy_denied`, the reason in `error`): the hook fails the job before its first step. Stored either way", body = ErrorBody),
        (status = 413, description = "Larger than 64 KiB", body = ErrorBody),
        (status = 422, description = "A timestamp outside the runner's lifetime", body = ErrorBody),
        RunnerRefusals,
    ))]
async fn report(
    ReporterAuth(runner): ReporterAuth,
    State(service): State<Arc<Service>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            refuse(
                &service,
                "too_large",
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("a report is at most {MAX_REPORT_BYTES} bytes"),
            )
        } else {
            refuse(
                &service,
                "unreadable",
                StatusCode::BAD_REQUEST,
                rejection.to_string(),
            )
        }
    })?;
    if id != runner.id.0.to_string() {
        let error = ApiError::new(
            StatusCode::FORBIDDEN,
            "not_this_runner",
            format!("runner {} may only report about itself", runner.id),
        );
        return Err(count_refusal(&service, "not_this_runner", error));
    }
    let parsed: Report = serde_json::from_slice(&body).map_err(|e| {
        refuse(
            &service,
            "malformed",
            StatusCode::BAD_REQUEST,
            format!("body: {e}"),
        )
    })?;
    let now = now();
    let earliest = runner.requested_at.minus(SKEW);
    let latest = now.plus(SKEW);
    let check_time = |seconds: f64| -> Result<(), ApiError> {
        let millis = (seconds * 1_000.0).round();
        let fits = millis.is_finite()
            && millis >= earliest.as_millis() as f64
            && millis <= latest.as_millis() as f64;
        if fits {
            Ok(())
        } else {
            Err(refuse(
                &service,
                "timestamp_out_of_range",
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("timestamp: {seconds} is outside this runner's lifetime"),
            ))
        }
    };
    let check_string = |field: &str, value: &str| -> Result<(), ApiError> {
        if value.is_empty()
            || value.chars().count() > MAX_STRING
            || value.chars().any(char::is_control)
        {
            Err(refuse(
                &service,
                "bad_string",
                StatusCode::BAD_REQUEST,
                format!("{field}: must be 1 to {MAX_STRING} printable characters"),
            ))
        } else {
            Ok(())
        }
    };
    let mut denied = None;
    let mut pre_job = None;
    let mut post_job = None;
    let phase = match &parsed {
        Report::PreJob {
            workflow,
            repository,
            event,
            workflow_run_id,
            timestamp,
        } => {
            check_string("workflow", workflow)?;
            check_string("repository", repository)?;
            check_string("event", event)?;
            let valid_run_id = match workflow_run_id {
                RunId::Number(number) => *number > 0,
                RunId::Text(text) => {
                    !text.is_empty() && text.len() <= 32 && text.chars().all(|c| c.is_ascii_digit())
                }
            };
            {
                if !valid_run_id {
                    return Err(refuse(
                        &service,
                        "bad_string",
                        StatusCode::BAD_REQUEST,
                        "workflow_run_id: must be a positive number".to_owned(),
                    ));
                }
            }
            check_time(*timestamp)?;
            let run = match workflow_run_id {
                RunId::Number(number) => Some(*number),
                RunId::Text(text) => text.parse().ok(),
            };
            if let Verdict::Refused { rule, detail } =
                judge_started_job(&service, &runner.pool, repository, run).await
            {
                denied = Some((rule, detail));
            }
            pre_job = Some(PreJob {
                workflow: workflow.clone(),
                repository: repository.clone(),
                event: event.clone(),
                run_id: run,
                at: seconds(*timestamp),
            });
            "pre-job"
        }
        // The status was checked by deserialisation: only the two values parse.
        Report::PostJob { timestamp, status } => {
            check_time(*timestamp)?;
            tracing::debug!(runner = %runner.id, status = status.as_str(), "post-job report");
            post_job = Some((status.as_str(), seconds(*timestamp)));
            "post-job"
        }
    };
    let text = String::from_utf8_lossy(&body);
    service
        .store
        .add_runner_report(runner.id, phase, &text, now)
        .await
        .map_err(|error| {
            let error = ApiError::from(AppError::store(&service, "add_runner_report", error));
            count_refusal(&service, "store_unavailable", error)
        })?;
    service
        .metrics
        .runner_reports
        .get_or_create(&crate::telemetry::metrics::PhaseLabel { phase })
        .inc();
    tracing::info!(target: "runway::events", event = "runner_report", runner = %runner.id, phase);
    if let Some(pre) = &pre_job {
        reports::pre_job(&service, &runner, pre, now).await;
    }
    if let Some((status, at)) = post_job {
        reports::post_job(&service, &runner, status, at, serde_json::json!({}), now).await;
    }
    if let (Some((rule, detail)), Some(pre)) = (denied, &pre_job) {
        // The hook fails the job before any step runs: the runner stops
        // with the spec's status for it, as if it had written the spec's
        // post-job file (so it is no crash).
        let post = serde_json::json!({
            "phase": "post-job",
            "timestamp": now.as_millis() as f64 / 1_000.0,
            "status": "repo-policy-check-failure",
        });
        service
            .store
            .add_runner_report(runner.id, "post-job", &post.to_string(), now)
            .await
            .map_err(|error| AppError::store(&service, "add_runner_report", error))?;
        reports::post_job(
            &service,
            &runner,
            "repo-policy-check-failure",
            now.max(pre.at),
            serde_json::json!({"rule": rule.as_str(), "reason": detail}),
            now,
        )
        .await;
        tracing::warn!(target: "runway::events", event = "runner_stop", runner = %runner.id, pool = %runner.pool, status = "repo-policy-check-failure", rule = rule.as_str(), %detail, "a runner was handed a job its pool does not admit");
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "repo_policy_denied",
            format!("pool {:?} does not admit this job: {detail}", runner.pool),
        ));
    }
    Ok(StatusCode::ACCEPTED.into_response())
}
