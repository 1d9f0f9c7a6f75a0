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
    /// Set when the job came from a scale set's message queue, not a
    /// webhook: then `job_id` is the queue's runner request id.
    pub scale_set: Option<ScaleSetOrigin>,
}

/// Where a job from a scale set's message queue belongs: the pool whose
/// scale set announced it. Its identity is the runner request, a number of
/// the Actions service's own, distinct from a webhook's job id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScaleSetOrigin {
    pub pool: String,
    /// Whether runway holds the job at GitHub (`acquirejobs`): a job
    /// announced as available is stored first and acquired in the pool's
    /// fair-share order as the pool has room (`reconcile/scale_set.rs`).
    pub acquired: bool,
}

impl WorkflowJob {
    /// The job's key among runway's GitHub jobs: the webhook's job id, or
    /// `rr-` and the runner request id for a scale set's job (the two
    /// number spaces are GitHub's and the Actions service's, so they are
    /// kept apart).
    pub fn external_id(&self) -> String {
        match self.scale_set {
            Some(_) => format!("rr-{}", self.job_id),
            None => self.job_id.to_string(),
        }
    }
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

/// The top level of a `workflow_job` body, read shallowly: only the
/// members runway reads are kept; the rest (GitHub's `repository`,
/// `sender`, `organization` objects, a job's `steps`: most of a 7–13 kB
/// body) is skipped without building it.
#[derive(serde::Deserialize)]
struct Root {
    #[serde(default, deserialize_with = "present")]
    action: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    workflow_job: Option<Shallow<JobMembers>>,
    #[serde(default, deserialize_with = "present")]
    repository: Option<Shallow<RepositoryMembers>>,
}

/// A member that is there, even as `null` (which `Option` would take for
/// absent).
fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

/// Which members of an object are kept.
trait Members {
    const KEYS: &'static [&'static str];
}

struct JobMembers;
impl Members for JobMembers {
    const KEYS: &'static [&'static str] = &[
        "id",
        "labels",
        "run_id",
        "name",
        "runner_name",
        "conclusion",
        "workflow_name",
        "created_at",
        "started_at",
        "completed_at",
    ];
}

struct RepositoryMembers;
impl Members for RepositoryMembers {
    const KEYS: &'static [&'static str] = &["full_name"];
}

/// An object with only the members `M` names, or what else the value was.
enum Shallow<M> {
    Object(serde_json::Map<String, Value>, std::marker::PhantomData<M>),
    Other(&'static str),
}

impl<'de, M: Members> serde::Deserialize<'de> for Shallow<M> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor<M>(std::marker::PhantomData<M>);
        impl<'de, M: Members> serde::de::Visitor<'de> for Visitor<M> {
            type Value = Shallow<M>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Shallow<M>, A::Error> {
                let mut kept = serde_json::Map::new();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if M::KEYS.contains(&key.as_ref()) {
                        kept.insert(key.into_owned(), map.next_value::<Value>()?);
                    } else {
                        map.next_value::<serde::de::IgnoredAny>()?;
                    }
                }
                Ok(Shallow::Object(kept, std::marker::PhantomData))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Shallow<M>, A::Error> {
                while seq.next_element::<serde::de::IgnoredAny>()?.is_some() {}
                Ok(Shallow::Other("an array"))
            }
            fn visit_unit<E>(self) -> Result<Shallow<M>, E> {
                Ok(Shallow::Other("null"))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Shallow<M>, E> {
                Ok(Shallow::Other("a boolean"))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Shallow<M>, E> {
                Ok(Shallow::Other("a number"))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Shallow<M>, E> {
                Ok(Shallow::Other("a number"))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Shallow<M>, E> {
                Ok(Shallow::Other("a number"))
            }
            fn visit_str<E>(self, _: &str) -> Result<Shallow<M>, E> {
                Ok(Shallow::Other("a string"))
            }
        }
        deserializer.deserialize_any(Visitor(std::marker::PhantomData))
    }
}

impl WorkflowJob {
    pub fn parse(body: &[u8]) -> Result<WorkflowJob, PayloadError> {
        // A struct would also be read from an array: only an object is one.
        if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(match serde_json::from_slice::<Value>(body) {
                Ok(_) => PayloadError::NotJson("the top level must be an object".into()),
                Err(e) => PayloadError::NotJson(e.to_string()),
            });
        }
        let root: Root =
            serde_json::from_slice(body).map_err(|e| PayloadError::NotJson(e.to_string()))?;
        let action = match root.action.as_ref() {
            Some(Value::String(action)) => action.clone(),
            None => return Err(field("action", "is missing")),
            Some(other) => {
                return Err(field(
                    "action",
                    format!("must be a string, not {}", kind(other)),
                ))
            }
        };
        let job = match &root.workflow_job {
            Some(Shallow::Object(job, _)) => job,
            None => return Err(field("workflow_job", "is missing")),
            Some(Shallow::Other(kind)) => {
                return Err(field(
                    "workflow_job",
                    format!("must be an object, not {kind}"),
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
        let repository = match &root.repository {
            Some(Shallow::Object(repository, _)) => {
                optional_string(repository.get("full_name"), "repository.full_name")?
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
            scale_set: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixtures() -> Vec<(String, Vec<u8>)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/fixtures/github/webhooks");
        let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
            .expect("the shared fixtures")
            .filter_map(|entry| {
                let path = entry.ok()?.path();
                let name = path.file_name()?.to_str()?.to_owned();
                name.starts_with("workflow_job.")
                    .then(|| (name, std::fs::read(&path).expect("readable")))
            })
            .collect();
        files.sort();
        files
    }

    /// The shallow read finds what a full parse of GitHub's own examples
    /// holds, field by field.
    #[test]
    fn github_examples_read_as_a_full_parse_reads_them() {
        let files = fixtures();
        assert!(files.len() >= 5, "{files:?}");
        for (name, body) in files {
            let full: Value = serde_json::from_slice(&body).unwrap();
            let job = WorkflowJob::parse(&body).unwrap_or_else(|e| panic!("{name}: {e}"));
            let w = &full["workflow_job"];
            assert_eq!(job.action, full["action"].as_str().unwrap(), "{name}");
            assert_eq!(job.job_id, w["id"].as_u64().unwrap(), "{name}");
            assert_eq!(job.run_id, w["run_id"].as_u64(), "{name}");
            assert_eq!(
                job.workflow.as_deref(),
                w["workflow_name"].as_str(),
                "{name}"
            );
            assert_eq!(
                job.runner_name.as_deref(),
                w["runner_name"].as_str(),
                "{name}"
            );
            assert_eq!(
                job.repository.as_deref(),
                full["repository"]["full_name"].as_str(),
                "{name}"
            );
            let labels: Vec<&str> = w["labels"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l.as_str().unwrap())
                .collect();
            assert_eq!(job.labels, labels, "{name}");
        }
    }

    #[test]
    fn odd_shapes_get_the_same_answers_as_before() {
        let cases: [(&str, Result<Option<&str>, &str>); 8] = [
            (
                r#"{"action":"queued","workflow_job":"x"}"#,
                Err("workflow_job: must be an object, not a string"),
            ),
            (r#"[1]"#, Err("the top level must be an object")),
            (
                r#"{"action":null,"workflow_job":{"id":1,"labels":[]}}"#,
                Err("action: must be a string, not null"),
            ),
            (
                r#"{"action":"queued","workflow_job":null}"#,
                Err("workflow_job: must be an object, not null"),
            ),
            (
                r#"{"action":"queued","workflow_job":{"id":1,"labels":[]},"repository":"x"}"#,
                Ok(None),
            ),
            (
                r#"{"action":"queued","workflow_job":{"id":1,"labels":[]},"repository":null}"#,
                Ok(None),
            ),
            (
                r#"{"action":"queued","workflow_job":{"id":1,"labels":[]},"repository":{"id":5,"owner":{"login":"o"},"full_name":"o/r"}}"#,
                Ok(Some("o/r")),
            ),
            (
                r#"{"action":"queued","workflow_job":{"id":1,"labels":[]},"repository":{"full_name":7}}"#,
                Err("repository.full_name: must be a string, not a number"),
            ),
        ];
        for (body, want) in cases {
            let got = WorkflowJob::parse(body.as_bytes());
            match (want, got) {
                (Ok(repository), Ok(job)) => {
                    assert_eq!(job.repository.as_deref(), repository, "{body}")
                }
                (Err(message), Err(error)) => {
                    assert!(error.to_string().contains(message), "{body}: {error}")
                }
                (want, got) => panic!("{body}: want {want:?}, got {got:?}"),
            }
        }
    }
}
