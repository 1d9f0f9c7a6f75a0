//! `POST /webhooks/github`: read and verify the delivery, parse the
//! `workflow_job` payload, hand it to `app::intake`, answer, and count it.
//! A 2xx answer means the effect is committed; anything refused changes
//! nothing.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use runway_core::github::WorkflowJobAction;
use runway_core::Job;
use serde::Serialize;

use crate::app::intake::{self, WebhookOutcome};
use crate::app::Service;
use crate::clock::now;
use crate::github::payload::{action_of, WorkflowJob};
use crate::github::signature::{verify, SignatureError};
use crate::http::error::ApiError;

/// Events we name in metrics; anything else is counted as `other`, so an
/// unauthenticated caller cannot invent label values.
const KNOWN_EVENTS: &[&str] = &[
    "ping",
    "workflow_job",
    "workflow_run",
    "check_run",
    "check_suite",
    "push",
    "pull_request",
];

#[derive(Serialize)]
struct Answer {
    outcome: WebhookOutcome,
    #[serde(skip_serializing_if = "Option::is_none")]
    job: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pool: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

impl Answer {
    fn outcome(outcome: WebhookOutcome) -> Answer {
        Answer {
            outcome,
            job: None,
            pool: None,
            reason: None,
        }
    }

    fn for_job(outcome: WebhookOutcome, job: &Job) -> Answer {
        Answer {
            outcome,
            job: Some(job.id.0),
            pool: job.pool.clone(),
            reason: job.reason.clone(),
        }
    }
}

/// What one delivery was, for metrics and the event log.
struct Received<'a> {
    delivery: Option<&'a str>,
    event: &'a str,
    action: String,
    job_id: Option<u64>,
}

impl Received<'_> {
    fn finish(&self, service: &Service, status: StatusCode, outcome: &str) {
        let event = if KNOWN_EVENTS.contains(&self.event) {
            self.event
        } else {
            "other"
        };
        service.metrics.webhook(event, &self.action, outcome);
        service.events.emit(
            "webhook",
            serde_json::json!({
                "delivery": self.delivery.unwrap_or(""),
                "github_event": event,
                "action": self.action,
                "job_id": self.job_id,
                "outcome": outcome,
                "status": status.as_u16(),
            }),
            crate::clock::now(),
        );
        tracing::info!(
            target: "runway::events",
            event = "webhook",
            delivery = self.delivery.unwrap_or(""),
            github_event = event,
            action = %self.action,
            job_id = self.job_id.map(|id| id.to_string()).unwrap_or_default(),
            outcome,
            status = status.as_u16(),
        );
    }
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

pub async fn github_webhook(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let event = header(&headers, "x-github-event").unwrap_or("");
    let mut received = Received {
        delivery: header(&headers, "x-github-delivery").filter(|d| !d.is_empty() && d.len() <= 200),
        event,
        action: String::new(),
        job_id: None,
    };
    let result = handle(&service, &headers, body, &mut received).await;
    match result {
        Ok((status, answer)) => {
            received.finish(&service, status, answer.outcome.as_str());
            (status, Json(answer)).into_response()
        }
        Err(error) => {
            received.finish(&service, error.status, error.code);
            error.into_response()
        }
    }
}

async fn handle(
    service: &Arc<Service>,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
    received: &mut Received<'_>,
) -> Result<(StatusCode, Answer), ApiError> {
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                format!(
                    "the body is larger than [github] max_body_bytes ({} bytes)",
                    service.config().github.max_body_bytes
                ),
            )
        } else {
            ApiError::bad_request(
                "unreadable_body",
                format!("cannot read the body: {rejection}"),
            )
        }
    })?;
    let signature = headers
        .get("x-hub-signature-256")
        .map(|value| value.as_bytes());
    verify(&service.config().github.webhook_secrets, &body, signature).map_err(|error| {
        if error == SignatureError::NoSecretsConfigured {
            tracing::warn!("a webhook arrived but [github] webhook_secrets is empty");
        }
        ApiError::unauthorized(error.to_string())
    })?;
    if received.event.is_empty() {
        return Err(ApiError::bad_request(
            "missing_event",
            "the X-GitHub-Event header is missing",
        ));
    }
    match received.event {
        "ping" => return Ok((StatusCode::OK, Answer::outcome(WebhookOutcome::Pong))),
        "workflow_job" => {}
        _ => {
            received.action = action_of(&body).unwrap_or_default();
            return Ok((
                StatusCode::ACCEPTED,
                Answer::outcome(WebhookOutcome::IgnoredEvent),
            ));
        }
    }
    let payload = WorkflowJob::parse(&body)
        .map_err(|e| ApiError::bad_request("invalid_payload", e.to_string()))?;
    received.action = payload.action.clone();
    received.job_id = Some(payload.job_id);
    let Some(action) = WorkflowJobAction::parse(&payload.action) else {
        // GitHub may add actions; they are not errors of the sender.
        return Ok((
            StatusCode::ACCEPTED,
            Answer::outcome(WebhookOutcome::IgnoredAction),
        ));
    };
    let applied = intake::receive(service, &payload, action, received.delivery, now()).await?;
    if applied.job.is_some() {
        // Its run's event, for the job's labels when it starts and ends
        // (nothing is asked when it is known or being asked already).
        crate::app::access::learn_event(service, payload.repository.as_deref(), payload.run_id);
    }
    let status = match applied.outcome {
        WebhookOutcome::Pong | WebhookOutcome::DuplicateDelivery => StatusCode::OK,
        _ => StatusCode::ACCEPTED,
    };
    let answer = match &applied.job {
        Some(job) => Answer::for_job(applied.outcome, job),
        None => Answer::outcome(applied.outcome),
    };
    Ok((status, answer))
}
