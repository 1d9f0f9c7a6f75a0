//! The message session: creating, refreshing and deleting it, long-polling its
//! queue, and the job messages it carries (available, assigned, started,
//! completed) with the statistics.

use super::*;

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
    pub(super) queue_url: String,
    pub(super) queue_token: Secret,
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
    pub(super) fn from_wire(value: &Value) -> Message {
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
    pub(super) fn from_wire(entry: &Value) -> JobMessage {
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

impl ScaleSetClient {
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
}
