//! The parts of a `workflow_job` webhook runway needs, read field by field
//! so that a bad payload is refused with the name of the field at fault.
//! Optional facts (repository, workflow, timestamps) are tolerated missing,
//! as GitHub's own examples show they can be.

use runway_core::Timestamp;
use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowJob {
    pub action: String,
    pub job_id: u64,
    pub run_id: Option<u64>,
    pub name: Option<String>,
    pub labels: Vec<String>,
    pub runner_name: Option<String>,
    pub conclusion: Option<String>,
    pub repository: Option<String>,
    pub workflow: Option<String>,
    pub created_at: Option<Timestamp>,
    pub started_at: Option<Timestamp>,
    pub completed_at: Option<Timestamp>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    #[error("the body is not JSON: {0}")]
    NotJson(String),
    #[error("{field}: {problem}")]
    Field {
        field: &'static str,
        problem: String,
    },
}

fn field(field: &'static str, problem: impl Into<String>) -> PayloadError {
    PayloadError::Field {
        field,
        problem: problem.into(),
    }
}

fn optional_string(
    value: Option<&Value>,
    name: &'static str,
) -> Result<Option<String>, PayloadError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(field(
            name,
            format!("must be a string, not {}", kind(other)),
        )),
    }
}

fn optional_time(
    value: Option<&Value>,
    name: &'static str,
) -> Result<Option<Timestamp>, PayloadError> {
    let Some(text) = optional_string(value, name)? else {
        return Ok(None);
    };
    super::api::parse_time(&text)
        .map(Some)
        .ok_or_else(|| field(name, format!("{text:?} is not an RFC 3339 timestamp")))
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The `action` of any webhook body, for events we only count.
pub fn action_of(body: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(body).ok()?;
    value.get("action")?.as_str().map(str::to_owned)
}

impl WorkflowJob {
    pub fn parse(body: &[u8]) -> Result<WorkflowJob, PayloadError> {
        let root: Value =
            serde_json::from_slice(body).map_err(|e| PayloadError::NotJson(e.to_string()))?;
        let Value::Object(root) = root else {
            return Err(PayloadError::NotJson(
                "the top level must be an object".into(),
            ));
        };
        let action = match root.get("action") {
            Some(Value::String(action)) => action.clone(),
            None => return Err(field("action", "is missing")),
            Some(other) => {
                return Err(field(
                    "action",
                    format!("must be a string, not {}", kind(other)),
                ))
            }
        };
        let job = match root.get("workflow_job") {
            Some(Value::Object(job)) => job,
            None => return Err(field("workflow_job", "is missing")),
            Some(other) => {
                return Err(field(
                    "workflow_job",
                    format!("must be an object, not {}", kind(other)),
                ))
            }
        };
        let job_id = match job.get("id") {
            Some(Value::Number(n)) => n.as_u64().ok_or_else(|| {
                field("workflow_job.id", format!("{n} is not a positive integer"))
            })?,
            None => return Err(field("workflow_job.id", "is missing")),
            Some(other) => {
                return Err(field(
                    "workflow_job.id",
                    format!("must be an integer, not {}", kind(other)),
                ))
            }
        };
        let labels = match job.get("labels") {
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| match item {
                    Value::String(label) => Ok(label.clone()),
                    other => Err(field(
                        "workflow_job.labels",
                        format!("must hold only strings, found {}", kind(other)),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?,
            None => return Err(field("workflow_job.labels", "is missing")),
            Some(other) => {
                return Err(field(
                    "workflow_job.labels",
                    format!("must be an array of strings, not {}", kind(other)),
                ))
            }
        };
        let run_id = match job.get("run_id") {
            None | Some(Value::Null) => None,
            Some(Value::Number(n)) => n.as_u64(),
            Some(other) => {
                return Err(field(
                    "workflow_job.run_id",
                    format!("must be an integer, not {}", kind(other)),
                ))
            }
        };
        let repository = match root.get("repository") {
            Some(Value::Object(repo)) => {
                optional_string(repo.get("full_name"), "repository.full_name")?
            }
            _ => None,
        };
        Ok(WorkflowJob {
            action,
            job_id,
            run_id,
            name: optional_string(job.get("name"), "workflow_job.name")?,
            labels,
            runner_name: optional_string(job.get("runner_name"), "workflow_job.runner_name")?,
            conclusion: optional_string(job.get("conclusion"), "workflow_job.conclusion")?,
            repository,
            workflow: optional_string(job.get("workflow_name"), "workflow_job.workflow_name")?,
            created_at: optional_time(job.get("created_at"), "workflow_job.created_at")?,
            started_at: optional_time(job.get("started_at"), "workflow_job.started_at")?,
            completed_at: optional_time(job.get("completed_at"), "workflow_job.completed_at")?,
        })
    }
}
