//! The GitHub client against a fake GitHub API: a test-only axum server on
//! loopback that answers with the shapes of GitHub's own examples
//! (`../shared/fixtures/github/openapi/examples`), checks the requests
//! against the OpenAPI request schemas, counts down a rate limit, refuses to
//! delete a busy runner with 422, and records every call.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use runway_server::config::Secret;
use runway_server::github::api::{Deregistered, GithubClient, GithubError, Target};
use runway_server::metrics::Metrics;
use serde_json::Value;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/github/openapi")
}

fn example(name: &str) -> Value {
    let text = std::fs::read_to_string(fixtures().join("examples").join(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The request schema of an operation, from the OpenAPI subset.
fn request_schema(operation: &str) -> Value {
    let text = std::fs::read_to_string(fixtures().join("operations-summary.deref.json")).unwrap();
    let operations: Vec<Value> = serde_json::from_str(&text).unwrap();
    operations
        .into_iter()
        .find(|o| o["operationId"] == operation)
        .unwrap()["requestBody"]
        .clone()
}

/// Checks `body` against an object schema: required keys, no unknown keys,
/// and the types of the properties.
fn validate(body: &Value, schema: &Value) -> Result<(), String> {
    let object = body.as_object().ok_or("not an object")?;
    for required in schema["required"].as_array().into_iter().flatten() {
        let key = required.as_str().unwrap();
        if !object.contains_key(key) {
            return Err(format!("missing {key}"));
        }
    }
    for (key, value) in object {
        let property = &schema["properties"][key];
        let ok = match property["type"].as_str() {
            None => return Err(format!("unknown property {key}")),
            Some("string") => value.is_string(),
            Some("integer") => value.is_u64() || value.is_i64(),
            Some("array") => value
                .as_array()
                .is_some_and(|items| !items.is_empty() && items.iter().all(Value::is_string)),
            Some(_) => true,
        };
        if !ok {
            return Err(format!("{key} is not a {}", property["type"]));
        }
    }
    Ok(())
}

#[derive(Default)]
struct Fake {
    calls: Vec<String>,
    remaining: u32,
    busy: BTreeSet<u64>,
    registered: BTreeSet<u64>,
    invalid_requests: Vec<String>,
}

type Shared = Arc<Mutex<Fake>>;

fn answer(fake: &Shared, status: StatusCode, body: Value) -> Response {
    let mut fake = fake.lock().unwrap();
    fake.remaining = fake.remaining.saturating_sub(1);
    let mut headers = HeaderMap::new();
    headers.insert("x-ratelimit-limit", "5000".parse().unwrap());
    headers.insert(
        "x-ratelimit-remaining",
        fake.remaining.to_string().parse().unwrap(),
    );
    let reset = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 3600;
    headers.insert("x-ratelimit-reset", reset.to_string().parse().unwrap());
    (status, headers, Json(body)).into_response()
}

async fn jitconfig(
    State(fake): State<Shared>,
    Path(org): Path<String>,
    Json(body): Json<Value>,
) -> Response {
    {
        let mut state = fake.lock().unwrap();
        state.calls.push(format!(
            "POST /orgs/{org}/actions/runners/generate-jitconfig"
        ));
        if let Err(problem) = validate(
            &body,
            &request_schema("actions/generate-runner-jitconfig-for-org"),
        ) {
            state.invalid_requests.push(problem);
        }
    }
    let mut answer_body = example("actions__generate-runner-jitconfig-for-org.201.default.json");
    answer_body["runner"]["name"] = body["name"].clone();
    let id = answer_body["runner"]["id"].as_u64().unwrap();
    fake.lock().unwrap().registered.insert(id);
    answer(&fake, StatusCode::CREATED, answer_body)
}

async fn delete_runner(
    State(fake): State<Shared>,
    Path((org, id)): Path<(String, u64)>,
) -> Response {
    let status = {
        let mut state = fake.lock().unwrap();
        state
            .calls
            .push(format!("DELETE /orgs/{org}/actions/runners/{id}"));
        if state.busy.contains(&id) {
            StatusCode::UNPROCESSABLE_ENTITY
        } else if state.registered.remove(&id) {
            StatusCode::NO_CONTENT
        } else {
            StatusCode::NOT_FOUND
        }
    };
    let body = match status {
        StatusCode::UNPROCESSABLE_ENTITY => {
            serde_json::json!({"message": "Bad request - Runner \"runner\" is still running a job\"", "documentation_url": "https://docs.github.com/rest"})
        }
        StatusCode::NOT_FOUND => serde_json::json!({"message": "Not Found"}),
        _ => Value::Null,
    };
    answer(&fake, status, body)
}

async fn get_job(
    State(fake): State<Shared>,
    Path((owner, repo, id)): Path<(String, String, u64)>,
) -> Response {
    fake.lock()
        .unwrap()
        .calls
        .push(format!("GET /repos/{owner}/{repo}/actions/jobs/{id}"));
    let mut body = example("actions__get-job-for-workflow-run.200.default.json");
    body["id"] = Value::from(id);
    answer(&fake, StatusCode::OK, body)
}

async fn fake_github(remaining: u32) -> (String, Shared) {
    let fake: Shared = Arc::new(Mutex::new(Fake {
        remaining,
        ..Fake::default()
    }));
    let router = Router::new()
        .route(
            "/orgs/{org}/actions/runners/generate-jitconfig",
            post(jitconfig),
        )
        .route("/orgs/{org}/actions/runners/{id}", delete(delete_runner))
        .route("/repos/{owner}/{repo}/actions/jobs/{id}", get(get_job))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    (format!("http://{address}"), fake)
}

fn org() -> Target {
    Target::Org("octo-org".into())
}

#[tokio::test]
async fn jit_configs_are_requested_as_the_schema_says_and_busy_runners_are_kept() {
    let (url, fake) = fake_github(4_000).await;
    let client =
        GithubClient::new(&url, Secret::literal("ghp_test-token-not-real"), 3_000).unwrap();
    let metrics = Metrics::new();
    let labels = vec!["self-hosted".to_owned(), "linux".to_owned()];
    let jit = client
        .generate_jitconfig(&metrics, &org(), "linux-0001", &labels, 1)
        .await
        .unwrap();
    assert_eq!(jit.runner_id, 23);
    assert!(!jit.encoded.is_empty());
    assert_eq!(fake.lock().unwrap().invalid_requests, Vec::<String>::new());

    // A runner that took a job: GitHub refuses, the caller keeps the instance.
    fake.lock().unwrap().busy.insert(23);
    assert_eq!(
        client.delete_runner(&metrics, &org(), 23).await,
        Err(GithubError::RunnerBusy(23))
    );
    fake.lock().unwrap().busy.clear();
    assert_eq!(
        client.delete_runner(&metrics, &org(), 23).await,
        Ok(Deregistered::Removed)
    );
    assert_eq!(
        client.delete_runner(&metrics, &org(), 23).await,
        Ok(Deregistered::NotFound),
        "already gone is fine"
    );
    let job = client
        .get_job(&metrics, "octo-org/hello", 399444496)
        .await
        .unwrap();
    assert_eq!((job.id, job.status.as_str()), (399444496, "completed"));

    assert_eq!(
        fake.lock().unwrap().calls,
        [
            "POST /orgs/octo-org/actions/runners/generate-jitconfig",
            "DELETE /orgs/octo-org/actions/runners/23",
            "DELETE /orgs/octo-org/actions/runners/23",
            "DELETE /orgs/octo-org/actions/runners/23",
            "GET /repos/octo-org/hello/actions/jobs/399444496",
        ]
    );
    let text = metrics.encode_text();
    assert!(
        text.contains(r#"runway_github_requests_total{operation="delete_runner",status="422"} 1"#),
        "{text}"
    );
    assert!(text.contains(
        r#"runway_github_requests_total{operation="generate_jitconfig",status="201"} 1"#
    ));
    assert!(
        text.contains("runway_github_rate_limit_remaining 3995"),
        "{text}"
    );
}

#[tokio::test]
async fn with_the_rate_limit_nearly_spent_jit_goes_out_and_rechecks_wait() {
    // 300 left of GitHub's 5,000: below the re-check reserve (20 %), above
    // nothing JIT needs.
    let (url, fake) = fake_github(301).await;
    let client =
        GithubClient::new(&url, Secret::literal("ghp_test-token-not-real"), 3_000).unwrap();
    let metrics = Metrics::new();
    let labels = vec!["self-hosted".to_owned()];
    client
        .generate_jitconfig(&metrics, &org(), "linux-0002", &labels, 1)
        .await
        .unwrap();
    let recheck = client.get_job(&metrics, "octo-org/hello", 1).await;
    assert!(
        matches!(
            recheck,
            Err(GithubError::Budget {
                operation: "get_job",
                ..
            })
        ),
        "{recheck:?}"
    );
    client
        .generate_jitconfig(&metrics, &org(), "linux-0003", &labels, 1)
        .await
        .expect("JIT configs still go out");
    assert_eq!(
        fake.lock().unwrap().calls.len(),
        2,
        "the re-check never reached GitHub"
    );
}
