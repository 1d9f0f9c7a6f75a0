//! GitHub intake, driven through the real router (no socket) on a real
//! SQLite store, with GitHub's own example payloads and signature vectors.

use std::path::PathBuf;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use runway_core::{JobSource, JobState, RunnerState};
use runway_server::config::{Config, GithubConfig, PoolConfig, Secret};
use runway_server::github::signature::{sign, verify};
use runway_store::{JobFilter, RunnerFilter};

const ADMIN: &str = "admin-token-0123456789";

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/github")
}

fn fixture(name: &str) -> Vec<u8> {
    std::fs::read(fixtures().join("webhooks").join(name))
        .unwrap_or_else(|e| panic!("fixture {name}: {e}"))
}

fn config(pools: Vec<PoolConfig>, required_labels: &[&str]) -> Config {
    let defaults = Config::default();
    Config {
        pools,
        github: GithubConfig {
            webhook_secrets: vec![Secret::literal("old-secret"), Secret::literal(SECRET)],
            required_labels: required_labels.iter().map(|l| (*l).to_owned()).collect(),
            max_body_bytes: 64 * 1024,
            ..defaults.github.clone()
        },
        server: runway_server::config::ServerConfig {
            admin_tokens: vec![Secret::literal(ADMIN)],
            ..defaults.server.clone()
        },
        ..defaults
    }
}

use crate::common;
use common::{pool, Harness, WEBHOOK_SECRET as SECRET};

impl Harness {
    async fn admin_get(&self, path: &str) -> (StatusCode, serde_json::Value) {
        self.get(path, ADMIN).await
    }

    async fn jobs(&self) -> Vec<runway_core::Job> {
        self.store().list_jobs(&JobFilter::default()).await.unwrap()
    }
}

#[derive(serde::Deserialize)]
struct Vectors {
    vectors: Vec<Vector>,
}

#[derive(serde::Deserialize)]
struct Vector {
    secret: String,
    body_file: String,
    x_hub_signature_256: String,
}

/// Positions to alter in a body: all of a short one, else the ends and an
/// even spread (every byte of a 10 kB body would hash 100 MB per vector).
fn positions(len: usize) -> Vec<usize> {
    if len <= 1_024 {
        return (0..len).collect();
    }
    let mut positions: Vec<usize> = (0..256).map(|i| i * len / 256).collect();
    positions.extend([1, len - 2, len - 1]);
    positions
}

#[test]
fn every_signature_vector_verifies_and_every_one_byte_change_is_refused() {
    let vectors: Vectors =
        serde_json::from_slice(&std::fs::read(fixtures().join("signatures.json")).unwrap())
            .unwrap();
    assert!(vectors.vectors.len() >= 3);
    for vector in &vectors.vectors {
        let body = std::fs::read(fixtures().join(&vector.body_file)).unwrap();
        let secrets = [
            Secret::literal("some-other-secret"),
            Secret::literal(&vector.secret),
        ];
        let header = vector.x_hub_signature_256.as_bytes();
        assert_eq!(
            verify(&secrets, &body, Some(header)),
            Ok(()),
            "{}",
            vector.body_file
        );
        assert_eq!(
            sign(vector.secret.as_bytes(), &body),
            vector.x_hub_signature_256
        );
        assert!(
            verify(&secrets[..1], &body, Some(header)).is_err(),
            "wrong secret refused"
        );
        for position in positions(body.len()) {
            let mut changed = body.clone();
            changed[position] ^= 0x01;
            assert!(
                verify(&secrets, &changed, Some(header)).is_err(),
                "{} byte {position}",
                vector.body_file
            );
        }
        for position in 0..header.len() {
            let mut changed = header.to_vec();
            changed[position] = if changed[position] == b'0' {
                b'1'
            } else {
                b'0'
            };
            assert!(
                verify(&secrets, &body, Some(&changed)).is_err(),
                "signature byte {position}"
            );
        }
    }
}

/// Outcome of each example with one default pool (as `runway serve` starts).
#[tokio::test]
async fn github_examples_with_the_default_pool() {
    let harness = Harness::new(config(
        vec![pool("default", &["self-hosted", "linux", "x64"])],
        &["self-hosted"],
    ))
    .await;
    let mut seen = Vec::new();
    for (i, name) in [
        "workflow_job.queued.5.json",
        "workflow_job.queued.6.json",
        "workflow_job.waiting.7.json",
        "workflow_job.in_progress.0.json",
        "workflow_job.in_progress.3.json",
        "workflow_job.in_progress.4.json",
        "workflow_job.completed.1.json",
        "workflow_job.completed.2.json",
    ]
    .iter()
    .enumerate()
    {
        let (status, body) = harness
            .webhook("workflow_job", &format!("d-{i}"), &fixture(name))
            .await;
        seen.push(format!(
            "{name}: {} {}",
            status.as_u16(),
            body["outcome"].as_str().unwrap_or("?")
        ));
    }
    assert_eq!(
        seen,
        [
            "workflow_job.queued.5.json: 202 ignored_github_hosted",
            "workflow_job.queued.6.json: 202 unroutable",
            "workflow_job.waiting.7.json: 202 no_change",
            "workflow_job.in_progress.0.json: 202 ignored_github_hosted",
            "workflow_job.in_progress.3.json: 202 ignored_github_hosted",
            "workflow_job.in_progress.4.json: 202 ignored_github_hosted",
            "workflow_job.completed.1.json: 202 ignored_github_hosted",
            "workflow_job.completed.2.json: 202 ignored_github_hosted",
        ]
    );
    let jobs = harness.jobs().await;
    assert_eq!(jobs.len(), 1, "only the self-hosted job is stored");
    assert_eq!(jobs[0].state, JobState::Unroutable);
    assert_eq!(jobs[0].external_id, "12877621891");
    let reason = jobs[0].reason.clone().unwrap_or_default();
    assert!(reason.contains("k8s"), "{reason}");
    // Per route, by its template: an id in the path is no series of its
    // own, and a path no route has is `unmatched`.
    for path in ["/api/v1/jobs/12345", "/api/v1/jobs/67890", "/no/such/page"] {
        harness
            .send(Request::get(path).body(Body::empty()).unwrap())
            .await;
    }
    let metrics = harness.metrics().await;
    assert!(
        metrics.contains(r#"runway_jobs_rejected_total{reason="no_matching_pool"} 1"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"runway_http_requests_total{method="POST",route="/webhooks/github",status="202"} 8"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"runway_http_requests_total{method="GET",route="/api/v1/jobs/{id}",status="401"} 2"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"runway_http_requests_total{method="GET",route="unmatched",status="404"} 1"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            r#"runway_http_request_duration_seconds_count{method="POST",route="/webhooks/github"} 8"#
        ),
        "{metrics}"
    );
    assert!(!metrics.contains("12345"), "no raw path in a label");
    assert!(
        metrics.contains(r#"runway_jobs_rejected_total{reason="github_hosted"} 6"#),
        "{metrics}"
    );
    assert!(metrics.contains(
        r#"runway_webhooks_received_total{event="workflow_job",action="queued",outcome="unroutable"} 1"#
    ));
    assert!(
        !metrics.contains("# EOF") && metrics.contains("# TYPE runway_jobs_rejected_total counter"),
        "without an Accept header, the classic text format"
    );
    let open_metrics = harness
        .send(
            Request::get("/metrics")
                .header("accept", "application/openmetrics-text; version=1.0.0")
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .1;
    let open_metrics = open_metrics.as_str().unwrap_or_default().to_owned();
    assert!(
        open_metrics.trim_end().ends_with("# EOF"),
        "OpenMetrics when asked for"
    );
    assert!(open_metrics.contains("# TYPE runway_jobs_rejected counter"));
}

/// With pools for every label set the examples use, each is routed and the
/// job 289782451 converges to completed whatever order its events come in.
#[tokio::test]
async fn github_examples_with_pools_for_their_labels() {
    let pools = vec![
        pool("k8s", &["self-hosted", "k8s"]),
        pool("gpu", &["gpu", "db-app", "dc-03"]),
        pool("hosted", &["ubuntu-latest"]),
    ];
    let events = tempfile::tempdir().unwrap();
    let event_log = events.path().join("events.log");
    let mut config = config(pools, &[]);
    config.telemetry.event_log = Some(event_log.display().to_string());
    let harness = Harness::new(config).await;
    let mut seen = Vec::new();
    for (i, name) in [
        "workflow_job.waiting.7.json",
        "workflow_job.queued.6.json",
        "workflow_job.in_progress.0.json",
        "workflow_job.completed.2.json",
        "workflow_job.in_progress.3.json",
        "workflow_job.queued.5.json",
        "workflow_job.completed.1.json",
    ]
    .iter()
    .enumerate()
    {
        let (status, body) = harness
            .webhook("workflow_job", &format!("d-{i}"), &fixture(name))
            .await;
        seen.push(format!(
            "{name}: {} {} {}",
            status.as_u16(),
            body["outcome"].as_str().unwrap_or("?"),
            body["pool"].as_str().unwrap_or("-")
        ));
    }
    assert_eq!(
        seen,
        [
            "workflow_job.waiting.7.json: 202 waiting -",
            "workflow_job.queued.6.json: 202 queued k8s",
            "workflow_job.in_progress.0.json: 202 started gpu",
            "workflow_job.completed.2.json: 202 completed hosted",
            "workflow_job.in_progress.3.json: 202 no_change hosted",
            "workflow_job.queued.5.json: 202 duplicate_job hosted",
            "workflow_job.completed.1.json: 202 no_change hosted",
        ]
    );
    let store = harness.store();
    let done = store
        .find_job(JobSource::Github, "289782451")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.state, JobState::Completed);
    assert_eq!(
        done.conclusion.map(|c| c.as_str()),
        Some("success"),
        "the first completion wins"
    );
    let running = store
        .find_job(JobSource::Github, "2832853555")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(running.state, JobState::Running);
    let runner = store
        .find_runner("my runner")
        .await
        .unwrap()
        .expect("the runner is recorded");
    assert_eq!(
        (runner.state, runner.job, runner.provider.as_str()),
        (RunnerState::Busy, Some(running.id), "external")
    );
    assert_eq!(running.runner, Some(runner.id));
    let queued = store
        .find_job(JobSource::Github, "12877621891")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (queued.state, queued.pool.as_deref()),
        (JobState::Queued, Some("k8s"))
    );
    let busy = store
        .list_runners(&RunnerFilter {
            state: Some(RunnerState::Busy),
            pool: None,
        })
        .await
        .unwrap();
    assert_eq!(busy.len(), 1);

    // Job metrics carry the repository and workflow GitHub named.
    let metrics = harness.metrics().await;
    assert!(
        metrics.contains(r#"runway_jobs_completed_total{pool="hosted",repo="Codertocat/Hello-World",workflow="CodeQL",conclusion="success"} 1"#),
        "{metrics}"
    );

    // The event log: every webhook, and the job facts GitHub reported.
    let logged = runway_testkit::event_log(&event_log);
    let of = |name: &str| logged.of(name);
    assert_eq!(of("webhook").len(), 7);
    assert_eq!(of("webhook")[1]["outcome"], "queued");
    // GitHub's in_progress example has no created_at: no queue time to log.
    assert!(of("job_queuing").is_empty(), "{logged:?}");
    let start = of("runner_start");
    assert_eq!(start.len(), 1);
    assert_eq!(
        (
            start[0]["flavor"].as_str(),
            start[0]["github_event"].as_str()
        ),
        (Some("gpu"), Some(""))
    );
    // The triggering event, not the webhook's type: unknown here (no
    // GitHub API is configured to look the run up, no runner reported).
    assert_ne!(start[0]["github_event"], "workflow_job");
    assert!(
        start[0]["repo"].as_str().is_some_and(|r| r.contains('/')),
        "{}",
        start[0]
    );
    assert_eq!(start[0]["timestamp"], 1_623_784_947, "2021-06-15T19:22:27Z");
    let stop = of("runner_stop");
    assert_eq!(stop.len(), 1);
    // The spec's status (the runner got to its job's end); how the job
    // went is its conclusion.
    assert_eq!(
        (
            stop[0]["flavor"].as_str(),
            stop[0]["status"].as_str(),
            stop[0]["conclusion"].as_str()
        ),
        (Some("hosted"), Some("normal"), Some("success"))
    );
}

#[tokio::test]
async fn refusals_change_nothing() {
    let harness = Harness::new(config(
        vec![pool("k8s", &["self-hosted", "k8s"])],
        &["self-hosted"],
    ))
    .await;
    let body = fixture("workflow_job.queued.6.json");
    let post = |signature: Option<String>, event: &str, body: Vec<u8>| {
        let mut request = Request::post("/webhooks/github")
            .header("x-github-event", event)
            .header("x-github-delivery", "refusal");
        if let Some(signature) = signature {
            request = request.header("x-hub-signature-256", signature);
        }
        request.body(Body::from(body)).unwrap()
    };
    let (status, answer) = harness.send(post(None, "workflow_job", body.clone())).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(answer["error"].as_str().unwrap().contains("missing"));
    let wrong = sign(b"not-the-secret", &body);
    assert_eq!(
        harness
            .send(post(Some(wrong), "workflow_job", body.clone()))
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        harness
            .send(post(Some("sha256=zz".into()), "workflow_job", body.clone()))
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    let big = vec![b' '; 65 * 1024];
    let (status, answer) = harness
        .send(post(
            Some(sign(SECRET.as_bytes(), &big)),
            "workflow_job",
            big,
        ))
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{answer}");
    let not_json = b"{not json".to_vec();
    let (status, answer) = harness
        .send(post(
            Some(sign(SECRET.as_bytes(), &not_json)),
            "workflow_job",
            not_json,
        ))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        answer["error"].as_str().unwrap().contains("not JSON"),
        "{answer}"
    );
    for (payload, field) in [
        (r#"{"action":"queued"}"#, "workflow_job: is missing"),
        (
            r#"{"action":"queued","workflow_job":{"labels":[]}}"#,
            "workflow_job.id: is missing",
        ),
        (
            r#"{"action":"queued","workflow_job":{"id":1}}"#,
            "workflow_job.labels: is missing",
        ),
        (
            r#"{"action":"queued","workflow_job":{"id":1,"labels":[3]}}"#,
            "workflow_job.labels: must hold only strings",
        ),
        (
            r#"{"workflow_job":{"id":1,"labels":[]}}"#,
            "action: is missing",
        ),
        (
            r#"{"action":"in_progress","workflow_job":{"id":1,"labels":["self-hosted","k8s"]}}"#,
            "workflow_job.runner_name",
        ),
    ] {
        let body = payload.as_bytes().to_vec();
        let (status, answer) = harness
            .send(post(
                Some(sign(SECRET.as_bytes(), &body)),
                "workflow_job",
                body,
            ))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{payload}");
        let message = answer["error"].as_str().unwrap().to_owned();
        assert!(message.contains(field), "{payload}: {message}");
    }
    assert!(
        harness.jobs().await.is_empty(),
        "no refused webhook stored anything"
    );
    assert!(!harness.store().delivery_seen("refusal").await.unwrap());

    let ping = fixture("ping.ghes-35.0.json");
    assert_eq!(
        harness.webhook("ping", "p-1", &ping).await.0,
        StatusCode::OK
    );
    let run = fixture("workflow_run.completed.0.json");
    let (status, answer) = harness.webhook("workflow_run", "r-1", &run).await;
    assert_eq!(
        (status, answer["outcome"].as_str()),
        (StatusCode::ACCEPTED, Some("ignored_event"))
    );
}

#[tokio::test]
async fn redeliveries_and_repeats_change_nothing() {
    let harness = Harness::new(config(
        vec![pool("k8s", &["self-hosted", "k8s"])],
        &["self-hosted"],
    ))
    .await;
    let body = fixture("workflow_job.queued.6.json");
    let (status, first) = harness.webhook("workflow_job", "delivery-1", &body).await;
    assert_eq!(
        (status, first["outcome"].as_str()),
        (StatusCode::ACCEPTED, Some("queued"))
    );
    let (status, again) = harness.webhook("workflow_job", "delivery-1", &body).await;
    assert_eq!(
        (status, again["outcome"].as_str()),
        (StatusCode::OK, Some("duplicate_delivery"))
    );
    let (status, repeat) = harness.webhook("workflow_job", "delivery-2", &body).await;
    assert_eq!(
        (status, repeat["outcome"].as_str()),
        (StatusCode::ACCEPTED, Some("duplicate_job"))
    );
    assert_eq!(harness.jobs().await.len(), 1);
}

#[tokio::test]
async fn admin_api_lists_pages_and_guards() {
    let harness = Harness::new(config(
        vec![pool("k8s", &["self-hosted", "k8s"])],
        &["self-hosted"],
    ))
    .await;
    let template: serde_json::Value =
        serde_json::from_slice(&fixture("workflow_job.queued.6.json")).unwrap();
    for id in 1..=5u64 {
        let mut payload = template.clone();
        payload["workflow_job"]["id"] = id.into();
        let body = serde_json::to_vec(&payload).unwrap();
        assert_eq!(
            harness
                .webhook("workflow_job", &format!("a-{id}"), &body)
                .await
                .0,
            StatusCode::ACCEPTED
        );
    }
    let anonymous = harness
        .send(Request::get("/api/v1/jobs").body(Body::empty()).unwrap())
        .await;
    assert_eq!(anonymous.0, StatusCode::UNAUTHORIZED);
    let wrong = Request::get("/api/v1/jobs")
        .header("authorization", "Bearer not-the-admin-token")
        .body(Body::empty())
        .unwrap();
    assert_eq!(harness.send(wrong).await.0, StatusCode::UNAUTHORIZED);

    let (status, page) = harness.admin_get("/api/v1/jobs?limit=2").await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<&str> = page["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["external_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["5", "4"], "newest first");
    let cursor = page["next_cursor"].as_str().unwrap().to_owned();
    let (_, page) = harness
        .admin_get(&format!("/api/v1/jobs?limit=2&cursor={cursor}"))
        .await;
    let ids: Vec<&str> = page["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["external_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["3", "2"]);
    let (_, page) = harness
        .admin_get("/api/v1/jobs?state=queued&pool=k8s&limit=10")
        .await;
    assert_eq!(page["jobs"].as_array().unwrap().len(), 5);
    assert!(page["next_cursor"].is_null());
    let job = &page["jobs"][0];
    for field in [
        "id",
        "source",
        "external_id",
        "pool",
        "labels",
        "state",
        "reason",
        "runner",
        "attempts",
        "created_at",
    ] {
        assert!(job.get(field).is_some(), "job has {field}: {job}");
    }
    assert_eq!(
        job["details"]["repository"],
        "lineville/elastic-machines-testing"
    );
    let id = job["id"].as_i64().unwrap();
    let (status, one) = harness.admin_get(&format!("/api/v1/jobs/{id}")).await;
    assert_eq!((status, &one["id"]), (StatusCode::OK, &job["id"]));
    assert_eq!(
        harness.admin_get("/api/v1/jobs/999999").await.0,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        harness.admin_get("/api/v1/jobs?state=bogus").await.0,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        harness.admin_get("/api/v1/jobs?limit=10001").await.0,
        StatusCode::BAD_REQUEST
    );
    let (_, pools) = harness.admin_get("/api/v1/pools").await;
    assert_eq!(pools["pools"][0]["name"], "k8s");
    assert_eq!(pools["pools"][0]["queued"], 5);
    let (status, runners) = harness.admin_get("/api/v1/runners").await;
    assert_eq!(
        (status, runners["runners"].as_array().map(Vec::len)),
        (StatusCode::OK, Some(0))
    );
}

/// `[metrics] job_labels = []`: job metrics by pool only.
#[tokio::test]
async fn job_labels_can_be_switched_off() {
    let mut config = config(vec![pool("hosted", &["ubuntu-latest"])], &[]);
    config.metrics.job_labels = Vec::new();
    let harness = Harness::new(config).await;
    let (status, _) = harness
        .webhook(
            "workflow_job",
            "d-1",
            &fixture("workflow_job.completed.2.json"),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let metrics = harness.metrics().await;
    assert!(
        metrics.contains(r#"runway_jobs_completed_total{pool="hosted",conclusion="success"} 1"#),
        "{metrics}"
    );
    assert!(!metrics.contains("repo="), "{metrics}");
}

#[tokio::test]
async fn a_webhook_for_a_scale_set_pools_job_changes_nothing() {
    // The pool learns its jobs from its scale set's message queue, which
    // keys them by runner request: a webhook job routed to it would be the
    // same job a second time.
    let mut scale_set_pool = pool("k8s", &["self-hosted", "k8s"]);
    scale_set_pool.github = Some(runway_server::config::PoolGithub {
        target: runway_server::config::Target::Org("octo-org".into()),
        runner_group_id: 1,
        scale_set: Some("k8s".into()),
        runner_group: None,
    });
    let harness = Harness::new(config(vec![scale_set_pool], &[])).await;
    let mut routed = 0;
    for (i, name) in [
        "workflow_job.queued.6.json",
        "workflow_job.in_progress.0.json",
        "workflow_job.completed.2.json",
    ]
    .iter()
    .enumerate()
    {
        let labels: serde_json::Value = serde_json::from_slice(&fixture(name)).unwrap();
        let routed_here = labels["workflow_job"]["labels"]
            .as_array()
            .is_some_and(|l| l.iter().any(|l| l == "k8s"));
        let (status, body) = harness
            .webhook("workflow_job", &format!("d-{i}"), &fixture(name))
            .await;
        if routed_here {
            routed += 1;
            assert_eq!(
                (status, body["outcome"].as_str()),
                (StatusCode::ACCEPTED, Some("scale_set_pool")),
                "{name}"
            );
        }
    }
    assert!(routed >= 1, "a fixture routed to the scale-set pool");
    assert!(
        harness
            .jobs()
            .await
            .iter()
            .all(|job| job.pool.as_deref() != Some("k8s")),
        "no job of the scale-set pool from a webhook"
    );
}

/// An org webhook for a job that asks for a scale set by its name
/// (`[self-hosted, NAME]`, `[NAME]`, with or without the pool's own
/// labels) is that scale set's job, which its queue brings: nothing is
/// stored. A job that asks for more than the scale set has is not its.
#[tokio::test]
async fn a_webhook_for_a_job_asking_for_a_scale_set_by_name_stores_nothing() {
    let mut scale_set_pool = pool("ss", &["self-hosted", "linux"]);
    scale_set_pool.github = Some(runway_server::config::PoolGithub {
        target: runway_server::config::Target::Org("octo-org".into()),
        runner_group_id: 1,
        scale_set: Some("runway-linux".into()),
        runner_group: None,
    });
    let harness = Harness::new(config(vec![scale_set_pool], &[])).await;
    let queued: serde_json::Value =
        serde_json::from_slice(&fixture("workflow_job.queued.6.json")).unwrap();
    for (i, (labels, theirs)) in [
        (vec!["self-hosted", "runway-linux"], true),
        (vec!["runway-linux"], true),
        (vec!["self-hosted", "Runway-Linux", "linux"], true),
        (vec!["self-hosted", "runway-linux", "gpu"], false),
    ]
    .into_iter()
    .enumerate()
    {
        let mut body = queued.clone();
        body["workflow_job"]["id"] = serde_json::json!(9_000 + i);
        body["workflow_job"]["labels"] = serde_json::json!(labels);
        let body = serde_json::to_vec(&body).unwrap();
        let before = harness.jobs().await.len();
        let (status, answer) = harness
            .webhook("workflow_job", &format!("by-name-{i}"), &body)
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{labels:?}: {answer}");
        let stored = harness.jobs().await.len() - before;
        if theirs {
            assert_eq!(answer["outcome"], "scale_set_pool", "{labels:?}: {answer}");
            assert_eq!(stored, 0, "{labels:?}: a second job beside the scale set's");
        } else {
            assert_eq!(answer["outcome"], "unroutable", "{labels:?}: {answer}");
        }
    }
}
