//! The GitHub client against the fake GitHub (`fake_github`): requests and
//! answers checked against GitHub's OpenAPI schemas, 422 for a busy
//! runner, the rate-limit budget, App authentication, delivery paging.

use runway_testkit::fake_github;

use fake_github::{Auth, FakeGithub, TOKEN};
use runway_server::config::{GithubAuth, Secret};
use runway_server::github::api::{
    Credentials, Deregistered, GithubClient, GithubError, Hook, Target,
};
use runway_server::telemetry::metrics::Metrics;

fn org() -> Target {
    Target::Org("octo-org".into())
}

fn token_client(url: &str) -> GithubClient {
    GithubClient::new(url, Credentials::Token(Secret::literal(TOKEN)), 3_000).unwrap()
}

#[tokio::test]
async fn jit_configs_are_requested_as_the_schema_says_and_busy_runners_are_kept() {
    let fake = FakeGithub::start(4_000, Auth::Token).await;
    let client = token_client(&fake.url);
    let metrics = Metrics::new();
    let labels = vec!["self-hosted".to_owned(), "linux".to_owned()];
    let jit = client
        .generate_jitconfig(&metrics, &org(), "linux-0001", &labels, 1)
        .await
        .unwrap();
    assert_eq!(jit.runner_id, 23);
    assert_eq!(jit.encoded, fake_github::encoded_jit(23, "linux-0001"));

    // A runner that took a job: GitHub refuses, the caller keeps the instance.
    fake.queue_job(7, &["self-hosted"]);
    fake.start_job(7, "linux-0001");
    assert_eq!(
        client.delete_runner(&metrics, &org(), 23).await,
        Err(GithubError::RunnerBusy(23))
    );
    fake.lock().runners.get_mut(&23).unwrap().job = None;
    assert_eq!(
        client.delete_runner(&metrics, &org(), 23).await,
        Ok(Deregistered::Removed)
    );
    assert_eq!(
        client.delete_runner(&metrics, &org(), 23).await,
        Ok(Deregistered::NotFound),
        "already gone is fine"
    );
    let job = client.get_job(&metrics, "octo-org/hello", 7).await.unwrap();
    assert_eq!((job.id, job.status.as_str()), (7, "in_progress"));
    assert_eq!(job.runner_name.as_deref(), Some("linux-0001"));

    assert_eq!(
        fake.calls(),
        [
            "POST /orgs/octo-org/actions/runners/generate-jitconfig",
            "DELETE /orgs/octo-org/actions/runners/23",
            "DELETE /orgs/octo-org/actions/runners/23",
            "DELETE /orgs/octo-org/actions/runners/23",
            "GET /repos/octo-org/hello/actions/jobs/7",
        ]
    );
    assert_eq!(fake.invalid(), Vec::<String>::new());
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
async fn repository_runners_use_the_repository_endpoints() {
    let fake = FakeGithub::start(4_000, Auth::Token).await;
    let client = token_client(&fake.url);
    let metrics = Metrics::new();
    let repo = Target::Repo {
        owner: "octo-org".into(),
        name: "hello".into(),
    };
    let jit = client
        .generate_jitconfig(&metrics, &repo, "r-1", &["self-hosted".to_owned()], 1)
        .await
        .unwrap();
    client
        .delete_runner(&metrics, &repo, jit.runner_id)
        .await
        .unwrap();
    assert_eq!(
        fake.calls(),
        [
            "POST /repos/octo-org/hello/actions/runners/generate-jitconfig",
            "DELETE /repos/octo-org/hello/actions/runners/23",
        ]
    );
    assert_eq!(fake.invalid(), Vec::<String>::new());
}

#[tokio::test]
async fn with_the_rate_limit_nearly_spent_jit_goes_out_and_rechecks_wait() {
    // 300 left of GitHub's 5,000: below the re-check reserve (20 %), above
    // nothing JIT needs.
    let fake = FakeGithub::start(301, Auth::Token).await;
    let client = token_client(&fake.url);
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
    assert_eq!(fake.calls().len(), 2, "the re-check never reached GitHub");
}

#[tokio::test]
async fn failed_deliveries_are_listed_page_by_page_and_redelivered() {
    let fake = FakeGithub::start(4_000, Auth::Token).await;
    let client = token_client(&fake.url);
    let metrics = Metrics::new();
    for id in 1..=5 {
        fake.queue_job(id, &["self-hosted"]);
        fake.deliver(id, "queued", true).await; // Nowhere to deliver: failed.
    }
    let hook: Hook = "orgs/octo-org/hooks/9".parse().unwrap();
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = client
            .list_deliveries(&metrics, &hook, cursor.as_deref())
            .await
            .unwrap();
        seen.extend(page.deliveries.iter().map(|d| d.guid.clone()));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(
        seen,
        [
            "guid-5-queued",
            "guid-4-queued",
            "guid-3-queued",
            "guid-2-queued",
            "guid-1-queued"
        ],
        "newest first, across three pages"
    );
    client.redeliver(&metrics, &hook, 1001).await.unwrap();
    assert_eq!(
        client.redeliver(&metrics, &hook, 4242).await,
        Err(GithubError::Status {
            operation: "redeliver",
            status: 404,
            message: "Not Found".into()
        })
    );
    assert_eq!(fake.invalid(), Vec::<String>::new());
    assert_eq!(
        fake.calls_starting("GET /orgs/octo-org/hooks/9/deliveries"),
        3
    );
}

#[tokio::test]
async fn an_app_mints_installation_tokens_and_signs_its_own_requests() {
    let dir = tempfile::tempdir().unwrap();
    let Some((private_pem, public_pem)) = fake_github::rsa_key_pair(dir.path()) else {
        panic!("openssl is needed to make a test key (Debian package openssl)");
    };
    let fake = FakeGithub::start(
        4_000,
        Auth::App {
            app_id: 4242,
            public_pem,
            installation_id: 77,
        },
    )
    .await;
    let credentials = Credentials::from_config(&GithubAuth::App {
        app_id: 4242,
        private_key: Secret::literal(&private_pem),
        installation_id: 77,
    })
    .unwrap();
    let client = GithubClient::new(&fake.url, credentials, 3_000).unwrap();
    let metrics = Metrics::new();
    let labels = vec!["self-hosted".to_owned()];
    for name in ["a", "b"] {
        client
            .generate_jitconfig(&metrics, &org(), name, &labels, 1)
            .await
            .unwrap();
    }
    // The App's own hook is called with the App's JWT, not the installation token.
    client
        .list_deliveries(&metrics, &Hook::App, None)
        .await
        .unwrap();
    assert_eq!(
        fake.invalid(),
        Vec::<String>::new(),
        "every call authorised"
    );
    assert_eq!(
        fake.calls(),
        [
            "POST /app/installations/77/access_tokens",
            "POST /orgs/octo-org/actions/runners/generate-jitconfig",
            "POST /orgs/octo-org/actions/runners/generate-jitconfig",
            "GET /app/hook/deliveries",
        ],
        "one installation token, reused until near its expiry"
    );
    // A token about to expire is replaced before it is used again.
    fake.lock().token_lifetime = std::time::Duration::from_secs(120);
    let fresh = GithubClient::new(
        &fake.url,
        Credentials::from_config(&GithubAuth::App {
            app_id: 4242,
            private_key: Secret::literal(&private_pem),
            installation_id: 77,
        })
        .unwrap(),
        3_000,
    )
    .unwrap();
    for name in ["c", "d"] {
        fresh
            .generate_jitconfig(&metrics, &org(), name, &labels, 1)
            .await
            .unwrap();
    }
    assert_eq!(
        fake.calls_starting("POST /app/installations/77/access_tokens"),
        3,
        "a token with two minutes left is not used: one new token per request"
    );
    assert_eq!(fake.invalid(), Vec::<String>::new());
    assert!(Credentials::from_config(&GithubAuth::App {
        app_id: 1,
        private_key: Secret::literal("not a key"),
        installation_id: 1,
    })
    .is_err());
}

#[test]
fn the_schema_check_catches_what_github_would_refuse() {
    let schema = fake_github::request_schema("actions/generate-runner-jitconfig-for-org");
    let check = |body: serde_json::Value| fake_github::validate(&body, &schema, "jit request");
    assert!(check(serde_json::json!({"name": "r", "runner_group_id": 1, "labels": ["x"]})).is_ok());
    assert!(
        check(serde_json::json!({"name": "r", "labels": ["x"]})).is_err(),
        "group missing"
    );
    assert!(check(serde_json::json!({"name": "r", "runner_group_id": 1, "labels": []})).is_err());
    assert!(
        check(serde_json::json!({"name": "r", "runner_group_id": "1", "labels": ["x"]})).is_err()
    );
    // GitHub's own job example lacks the required created_at.
    let job = fake_github::example("actions__get-job-for-workflow-run.200.default.json");
    let job_schema =
        &fake_github::operation("actions/get-job-for-workflow-run")["responses"]["200"]["schema"];
    assert!(fake_github::validate(&job, job_schema, "job").is_err());
}

#[tokio::test]
async fn a_secondary_rate_limit_without_retry_after_stops_requests_for_a_minute() {
    let fake = FakeGithub::start(4_000, Auth::Token).await;
    fake.lock().secondary_limited = 1;
    let client = token_client(&fake.url);
    let metrics = Metrics::new();
    let labels = vec!["self-hosted".to_owned()];
    let first = client
        .generate_jitconfig(&metrics, &org(), "r-1", &labels, 1)
        .await;
    assert!(
        matches!(first, Err(GithubError::Status { status: 403, .. })),
        "{first:?}"
    );
    let second = client
        .generate_jitconfig(&metrics, &org(), "r-2", &labels, 1)
        .await;
    assert!(
        matches!(second, Err(GithubError::Budget { .. })),
        "even JIT waits out a secondary limit: {second:?}"
    );
    assert_eq!(fake.calls().len(), 1, "the second never reached GitHub");
}
