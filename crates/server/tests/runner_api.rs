//! The runner API over HTTP (the real router, no socket) on a real store:
//! every transition and its refusals.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use runway_core::{JobId, JobState, RunnerEvent, RunnerState, Timestamp};
use runway_server::app::jobs::sweep_leases;
use runway_server::config::{Config, RunnerApiConfig, Secret};
use serde_json::{json, Value};
use tower::ServiceExt;

const ADMIN: &str = "runner-api-admin-token";
const READER: &str = "runner-api-read-only-token";

use crate::common;
use common::Harness;

impl Harness {
    /// One pool, `default`; admin and read tokens; short long polls; the
    /// JSON event log written to `events` if given.
    async fn runner_api(events: Option<&std::path::Path>) -> Harness {
        Harness::runner_api_polling(events, Duration::from_millis(300)).await
    }

    /// [`Harness::runner_api`] with long polls of `poll_timeout`.
    async fn runner_api_polling(
        events: Option<&std::path::Path>,
        poll_timeout: Duration,
    ) -> Harness {
        let mut config = Config::default();
        config.server.admin_tokens = vec![Secret::literal(ADMIN)];
        config.server.read_tokens = vec![Secret::literal(READER)];
        config.runner_api = RunnerApiConfig {
            poll_timeout,
            lease: Duration::from_secs(120),
        };
        config.pools = vec![common::pool("default", &["self-hosted", "linux", "gpu"])];
        if let Some(path) = events {
            config.telemetry.event_log = Some(path.display().to_string());
        }
        Harness::new(config).await
    }

    /// A registration token for pool `default`.
    async fn registration_token(&self) -> Value {
        let (status, token) = self
            .post(
                "/api/v1/registration-tokens",
                ADMIN,
                json!({"pool": "default", "ttl": 60}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{token}");
        token
    }

    /// A registered runner's token.
    async fn runner(&self, name: &str, labels: &[&str]) -> String {
        let token = self.registration_token().await;
        let (status, registered) = self
            .post(
                "/api/v1/runners/register",
                "",
                json!({"token": token["token"], "name": name, "labels": labels}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{registered}");
        registered["runner_token"].as_str().unwrap().to_owned()
    }

    /// Job `i` of `tenant` (external id `tenant-i`), on `linux`.
    async fn submit_as(&self, tenant: &str, i: usize) -> i64 {
        let (status, body) = self
            .post("/api/v1/jobs", ADMIN, json!({"labels": ["linux"], "script": "echo hi", "tenant": tenant, "external_id": format!("{tenant}-{i}")}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["id"].as_i64().unwrap()
    }

    async fn submit(&self, labels: &[&str], external_id: Option<&str>) -> i64 {
        let (status, body) = self
            .post("/api/v1/jobs", ADMIN, json!({"labels": labels, "script": "echo hi", "timeout_seconds": 60, "external_id": external_id}))
            .await;
        assert!(
            status == StatusCode::CREATED || status == StatusCode::OK,
            "{status} {body}"
        );
        body["id"].as_i64().unwrap()
    }
}

#[tokio::test]
async fn scopes_and_registration() {
    let harness = Harness::runner_api(None).await;
    let (status, _) = harness.get("/api/v1/jobs", READER).await;
    assert_eq!(status, StatusCode::OK, "a read token reads");
    let (status, body) = harness
        .post(
            "/api/v1/jobs",
            READER,
            json!({"labels": ["linux"], "script": "true"}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, _) = harness
        .post(
            "/api/v1/registration-tokens",
            READER,
            json!({"pool": "default"}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = harness
        .post(
            "/api/v1/registration-tokens",
            ADMIN,
            json!({"pool": "nope"}),
        )
        .await;
    // Well-formed but naming no configured pool: unprocessable, not malformed.
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);

    let (_, token) = harness
        .post(
            "/api/v1/registration-tokens",
            ADMIN,
            json!({"pool": "default"}),
        )
        .await;
    let register = |name: &str| json!({"token": token["token"], "name": name, "labels": ["linux"]});
    let (status, registered) = harness
        .post("/api/v1/runners/register", "", register("r1"))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _) = harness
        .post("/api/v1/runners/register", "", register("r2"))
        .await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a registration token works once"
    );
    let unknown = json!({"token": "rwr_unknown", "name": "r3"});
    assert_eq!(
        harness
            .post("/api/v1/runners/register", "", unknown)
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );
    // Expired: stored directly with a deadline in the past.
    let store = &harness.service.store;
    let expired_token = "rwr_expired-token";
    store
        .create_registration_token(
            &runway_server::app::tokens::token_hash(expired_token),
            "default",
            None,
            Timestamp::from_millis(1),
            Timestamp::from_millis(0),
        )
        .await
        .unwrap();
    let expired = json!({"token": expired_token, "name": "r4"});
    assert_eq!(
        harness
            .post("/api/v1/runners/register", "", expired)
            .await
            .0,
        StatusCode::UNAUTHORIZED
    );

    let runner = store
        .get_runner(runway_core::RunnerId(
            registered["runner_id"].as_i64().unwrap(),
        ))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (runner.state, runner.pool.as_str()),
        (RunnerState::Idle, "default")
    );
    let (status, _) = harness.request_job("rwt_not-a-runner").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

/// A registration whose answer was lost, asked again with its `attempt`,
/// gives the same runner with a new token; the lost token stops working;
/// a malformed attempt is a 400 and changes nothing.
#[tokio::test]
async fn a_registration_asked_again_with_its_attempt_is_the_same_runner() {
    let harness = Harness::runner_api(None).await;
    let token = harness.registration_token().await;
    let register = |attempt: &'static str| {
        let body = json!({"token": token["token"], "name": "again", "labels": ["linux"], "attempt": attempt});
        let harness = &harness;
        async move { harness.post("/api/v1/runners/register", "", body).await }
    };
    let (status, body) = register("short").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let attempt = "0123456789abcdef0123456789abcdef";
    let (status, first) = register(attempt).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    let (status, again) = register(attempt).await;
    assert_eq!(status, StatusCode::CREATED, "{again}");
    assert_eq!(again["runner_id"], first["runner_id"], "one runner");
    assert_ne!(again["runner_token"], first["runner_token"]);
    for (token, expected, what) in [
        (&first, StatusCode::UNAUTHORIZED, "the lost answer's token"),
        (&again, StatusCode::NO_CONTENT, "the new token works"),
    ] {
        let token = token["runner_token"].as_str().unwrap();
        let (status, _) = harness.request_job(token).await;
        assert_eq!(status, expected, "{what}");
    }
    let (status, _) = register("fedcba9876543210fedcba9876543210").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "another attempt: used");
    let runners = harness
        .service
        .store
        .list_runners(&runway_store::RunnerFilter::default())
        .await
        .unwrap();
    assert_eq!(runners.len(), 1);
}

#[tokio::test]
async fn submission_is_idempotent_and_refuses_unroutable_labels() {
    let harness = Harness::runner_api(None).await;
    let first = harness.submit(&["linux"], Some("build-7")).await;
    let again = harness.submit(&["linux"], Some("build-7")).await;
    assert_eq!(first, again);
    let (status, body) = harness
        .post(
            "/api/v1/jobs",
            ADMIN,
            json!({"labels": ["windows"], "script": "dir"}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        body["error"].as_str().unwrap().contains("windows"),
        "{body}"
    );
    let (status, _) = harness
        .post(
            "/api/v1/jobs",
            ADMIN,
            json!({"labels": ["linux"], "script": ""}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn two_phase_start_and_completion() {
    let harness = Harness::runner_api(None).await;
    let alice = harness.runner("alice", &["self-hosted", "linux"]).await;
    let bob = harness.runner("bob", &["self-hosted", "linux"]).await;
    let (status, _) = harness.request_job(&alice).await;
    assert_eq!(
        status,
        StatusCode::NO_CONTENT,
        "nothing queued: 204 after the poll timeout"
    );

    let id = harness.submit(&["linux"], None).await;
    let (status, job) = harness.request_job(&alice).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        (
            job["id"].as_i64(),
            job["script"].as_str(),
            job["lease_seconds"].as_u64()
        ),
        (Some(id), Some("echo hi"), Some(120))
    );
    let path = |what: &str| format!("/api/v1/jobs/{id}/{what}");
    let (status, _) = harness
        .post(&path("provisioning"), &bob, json!({"status": "accepted"}))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "only the holder");
    let (status, state) = harness
        .post(&path("provisioning"), &alice, json!({"status": "pending"}))
        .await;
    assert_eq!(
        (status, state["state"].as_str()),
        (StatusCode::OK, Some("provisioning"))
    );
    let (status, _) = harness
        .post(&path("provisioning"), &alice, json!({"status": "maybe"}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, state) = harness
        .post(&path("provisioning"), &alice, json!({"status": "accepted"}))
        .await;
    assert_eq!(
        (status, state["state"].as_str()),
        (StatusCode::OK, Some("running"))
    );
    // The first answer may have been lost: a repeat is answered the same,
    // and changes nothing.
    let (status, again) = harness
        .post(&path("provisioning"), &alice, json!({"status": "accepted"}))
        .await;
    assert_eq!(
        (status, again["state"].as_str(), &again["started_at"]),
        (StatusCode::OK, Some("running"), &state["started_at"])
    );
    let (status, _) = harness
        .post(&path("provisioning"), &bob, json!({"status": "accepted"}))
        .await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a running job is not bob's to accept"
    );
    let (status, _) = harness.call("POST", &path("heartbeat"), &alice, None).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = harness.call("POST", &path("heartbeat"), &bob, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let done = json!({"exit_code": 3, "log_tail": "step 1\nstep 2 failed\n"});
    let (status, state) = harness.post(&path("complete"), &alice, done.clone()).await;
    assert_eq!(
        (status, state["state"].as_str()),
        (StatusCode::OK, Some("completed"))
    );
    let stored = harness
        .service
        .store
        .get_job(JobId(id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        stored.conclusion.map(|c| c.as_str()),
        Some("failure"),
        "a non-zero exit code fails the job"
    );
    let (status, _) = harness.post(&path("complete"), &alice, done).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a completed job does not complete twice"
    );
    let request = Request::get(path("log"))
        .header("authorization", format!("Bearer {READER}"))
        .body(Body::empty())
        .unwrap();
    let response = runway_server::http::router(harness.service.clone())
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.headers()["x-runway-exit-code"], "3");
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    assert_eq!(&bytes[..], b"step 1\nstep 2 failed\n");
    let runner = harness
        .service
        .store
        .find_runner("alice")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        runner.state,
        RunnerState::Idle,
        "back to idle after its job"
    );
}

#[tokio::test]
async fn decline_excludes_the_runner_and_labels_must_fit() {
    let harness = Harness::runner_api(None).await;
    let plain = harness.runner("plain", &["self-hosted", "linux"]).await;
    let gpu = harness
        .runner("gpu", &["self-hosted", "linux", "gpu"])
        .await;
    let id = harness.submit(&["linux", "gpu"], None).await;
    let (status, _) = harness.request_job(&plain).await;
    assert_eq!(
        status,
        StatusCode::NO_CONTENT,
        "a runner without gpu never gets a gpu job"
    );
    let (_, job) = harness.request_job(&gpu).await;
    assert_eq!(job["id"].as_i64(), Some(id));
    let path = format!("/api/v1/jobs/{id}/provisioning");
    let (status, state) = harness
        .post(&path, &gpu, json!({"status": "declined"}))
        .await;
    assert_eq!(
        (status, state["state"].as_str()),
        (StatusCode::OK, Some("queued"))
    );
    let (status, _) = harness.request_job(&gpu).await;
    assert_eq!(
        status,
        StatusCode::NO_CONTENT,
        "the declining runner is excluded"
    );
    let other = harness
        .runner("gpu-2", &["self-hosted", "linux", "gpu"])
        .await;
    let (_, job) = harness.request_job(&other).await;
    assert_eq!(job["id"].as_i64(), Some(id));
}

#[tokio::test]
async fn a_long_poll_is_woken_by_a_submission() {
    let harness = Arc::new(Harness::runner_api(None).await);
    let token = harness.runner("waiter", &["linux"]).await;
    // A long poll longer than the test's patience: only a wake-up answers it in time.
    let waiter = poll_in_background(&harness, token, false);
    let id = harness.submit(&["linux"], None).await;
    let (status, job) = answer(waiter).await;
    // Either the poll was already waiting and was woken, or it started after
    // the submission and found the job at once; both answer 201.
    assert_eq!(
        (status, job["id"].as_i64()),
        (StatusCode::CREATED, Some(id))
    );
}

/// A job queued with no wake-up (one lost between replicas, say) reaches
/// a waiting runner through the safety net, not through a timed re-poll:
/// while nothing wakes it, a waiting runner makes no claim, and one look
/// per pool finds the job and wakes one waiter (issue 59).
#[tokio::test]
async fn a_job_whose_wake_up_was_missed_is_found_by_the_safety_net() {
    let harness = Arc::new(Harness::runner_api_polling(None, Duration::from_secs(20)).await);
    let token = harness.runner("quiet", &["linux"]).await;
    let waiter = poll_in_background(&harness, token, true);
    until_waiting(&harness, 1).await;
    // Straight into the store: nobody is told.
    let job = harness
        .service
        .store
        .enqueue(
            &runway_core::job::NewJob::api("missed", "default", &["linux"]),
            runway_server::clock::now(),
        )
        .await
        .unwrap()
        .job;
    assert!(!waiter.is_finished(), "answered with no wake-up");
    let woken = runway_server::app::waiters::safety_net_round(&harness.service)
        .await
        .unwrap();
    assert_eq!(woken, 1);
    let (status, answered) = answer(waiter).await;
    assert_eq!(
        (status, answered["id"].as_i64()),
        (StatusCode::CREATED, Some(job.id.0))
    );
    // Nothing queued and nobody waiting: the next look wakes no one.
    assert_eq!(
        runway_server::app::waiters::safety_net_round(&harness.service)
            .await
            .unwrap(),
        0
    );
    let metrics = harness.metrics().await;
    assert!(
        metrics.contains("runway_long_poll_safety_net_wakeups_total{pool=\"default\"} 1"),
        "{metrics}"
    );
}

/// A runner waiting on a queue with nothing it can take makes no store
/// query while it polls, however often it renews its poll: its first poll
/// looks and finds nothing, and every later one waits without a look
/// until a wake-up moves its pool on. Counted by the looks the polls make
/// (`runway_long_poll_looks_total`), not timed (issue 59).
#[tokio::test]
async fn a_runner_waiting_on_an_empty_queue_makes_no_store_query_while_it_polls() {
    let harness = Harness::runner_api_polling(None, Duration::from_millis(200)).await;
    let token = harness.runner("idle", &["linux"]).await;
    // Something is queued, but nothing this runner can take.
    let gpu = harness.submit(&["gpu"], None).await;
    // Looks at the queue, polls spared one, and reads of the runner.
    let queries = |metrics: &str| {
        let sum = |series: &str| runway_testkit::process::sum_of(metrics, series);
        (
            sum("runway_long_poll_looks_total{pool=\"default\"}"),
            sum("runway_long_poll_looks_spared_total{pool=\"default\"}"),
            sum("runway_long_poll_runner_reads_total"),
        )
    };
    let poll = || harness.request_job(&token);
    assert_eq!(poll().await.0, StatusCode::NO_CONTENT);
    assert_eq!(
        queries(&harness.metrics().await),
        (1.0, 0.0, 1.0),
        "the first poll reads its runner and looks"
    );
    for renewal in 1..=5 {
        assert_eq!(poll().await.0, StatusCode::NO_CONTENT);
        assert_eq!(
            queries(&harness.metrics().await),
            (1.0, f64::from(renewal), 1.0),
            "renewal {renewal} made no look and read no runner"
        );
    }
    // A job it can take, queued between two polls: the next poll reads
    // its runner again, looks, and takes it at once.
    let linux = harness.submit(&["linux"], None).await;
    let (status, body) = poll().await;
    assert_eq!(
        (status, body["id"].as_i64()),
        (StatusCode::CREATED, Some(linux))
    );
    assert_eq!(queries(&harness.metrics().await), (2.0, 5.0, 2.0));
    assert_ne!(gpu, linux);
}

/// A renewal waits on its runner as an earlier poll read it, but never
/// acts on that unchecked: a runner drained, or its token replaced, behind
/// this replica's back (on another replica; here straight in the store, so
/// nothing here wakes it) takes nothing it could not. Without `start` it is
/// read again by its token before its look; with `start` the start's
/// compare-and-set of its version does not hold (both changes move it on),
/// and then it is read again.
#[tokio::test]
async fn a_remembered_runner_takes_nothing_it_could_not() {
    for start in [false, true] {
        let harness = Harness::runner_api_polling(None, Duration::from_millis(200)).await;
        let store = harness.service.store.clone();
        let poll = |token: String| {
            let harness = &harness;
            async move {
                match start {
                    true => request_started(harness, &token).await,
                    false => harness.request_job(&token).await,
                }
            }
        };
        let replaced = harness.runner("replaced", &["linux"]).await;
        let drained = harness.runner("drained", &["linux"]).await;
        for token in [&replaced, &drained] {
            assert_eq!(poll(token.clone()).await.0, StatusCode::NO_CONTENT);
        }
        let id = |name: &'static str| {
            let store = store.clone();
            async move { store.find_runner(name).await.unwrap().unwrap().id }
        };
        store
            .set_runner_token(id("replaced").await, "another token's hash")
            .await
            .unwrap();
        store
            .apply_runner_event(
                id("drained").await,
                &RunnerEvent::DrainRequested,
                runway_server::clock::now(),
            )
            .await
            .unwrap();
        // Nothing was queued since: both still wait on what was read.
        for token in [&replaced, &drained] {
            assert_eq!(poll(token.clone()).await.0, StatusCode::NO_CONTENT);
        }
        let job = harness.submit(&["linux"], None).await;
        for (token, status, code) in [
            (&replaced, StatusCode::UNAUTHORIZED, "unauthorized"),
            (&drained, StatusCode::GONE, "runner_draining"),
        ] {
            let (answered, body) = poll(token.clone()).await;
            assert_eq!(
                (answered, body["code"].as_str()),
                (status, Some(code)),
                "start {start}: {body}"
            );
        }
        let queued = store.get_job(JobId(job)).await.unwrap().unwrap();
        assert_eq!(
            queued.state,
            JobState::Queued,
            "start {start}: nobody took it"
        );
    }
}

/// A runner that starts its jobs as it asks for them (`"start": true`)
/// and completes them is read by its token once, not once a call: each
/// start and each completion checks the runner as runway wrote it (its
/// version). A token replaced in between moves that version on: the
/// completion with the old token is refused, and the job keeps running
/// (issue 59: two reads of the eleven statements a job).
#[tokio::test]
async fn a_runner_working_through_jobs_is_read_once_and_a_replaced_token_still_fails() {
    let harness = Harness::runner_api_polling(None, Duration::from_millis(200)).await;
    let token = harness.runner("worker", &["linux"]).await;
    let reads = |metrics: &str| {
        runway_testkit::process::sum_of(metrics, "runway_long_poll_runner_reads_total")
    };
    assert_eq!(
        request_started(&harness, &token).await.0,
        StatusCode::NO_CONTENT
    );
    let complete = |job: i64, token: String| {
        let harness = &harness;
        async move {
            let path = format!("/api/v1/jobs/{job}/complete");
            harness
                .post(&path, &token, json!({"conclusion": "success"}))
                .await
        }
    };
    for round in 0..3 {
        let job = harness.submit(&["linux"], None).await;
        let (status, started) = request_started(&harness, &token).await;
        assert_eq!(
            (status, started["id"].as_i64()),
            (StatusCode::CREATED, Some(job)),
            "round {round}"
        );
        let (status, done) = complete(job, token.clone()).await;
        assert_eq!(
            (status, done["state"].as_str()),
            (StatusCode::OK, Some("completed"))
        );
        assert_eq!(
            reads(&harness.metrics().await),
            1.0,
            "round {round}: no read"
        );
    }
    let job = harness.submit(&["linux"], None).await;
    assert_eq!(
        request_started(&harness, &token).await.0,
        StatusCode::CREATED
    );
    let store = &harness.service.store;
    let runner = store.find_runner("worker").await.unwrap().unwrap();
    store
        .set_runner_token(runner.id, "another token's hash")
        .await
        .unwrap();
    let (status, body) = complete(job, token.clone()).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("unauthorized")),
        "{body}"
    );
    let running = store.get_job(JobId(job)).await.unwrap().unwrap();
    assert_eq!(running.state, JobState::Running, "the job keeps running");
    assert_eq!(
        reads(&harness.metrics().await),
        2.0,
        "read again, then refused"
    );
}

/// A job requeued because its lease ran out wakes a runner that waits for
/// one, at once: the requeue is a wake-up, not something the safety net
/// has to find.
#[tokio::test]
async fn a_job_requeued_by_lease_expiry_reaches_a_waiting_runner() {
    let harness = Arc::new(Harness::runner_api_polling(None, Duration::from_secs(20)).await);
    let dead = harness.runner("dead", &["linux"]).await;
    let id = harness.submit(&["linux"], None).await;
    let (status, leased) = harness.request_job(&dead).await;
    assert_eq!(
        (status, leased["id"].as_i64()),
        (StatusCode::CREATED, Some(id))
    );
    let waiting = harness.runner("waiting", &["linux"]).await;
    let waiter = poll_in_background(&harness, waiting, false);
    until_waiting(&harness, 1).await;
    let later = runway_server::clock::now().plus(Duration::from_secs(121));
    assert_eq!(sweep_leases(&harness.service, later).await.unwrap(), 1);
    let (status, job) = answer(waiter).await;
    assert_eq!(
        (status, job["id"].as_i64()),
        (StatusCode::CREATED, Some(id))
    );
    let metrics = harness.metrics().await;
    assert_eq!(
        runway_testkit::process::sum_of(&metrics, "runway_long_poll_safety_net_wakeups_total"),
        0.0,
        "{metrics}"
    );
}

/// A job wakes one waiting runner, not all: of those whose labels cover
/// the job's, the one waiting longest. (When every waiter woke, they raced
/// for each job and any could win.)
#[tokio::test]
async fn a_job_goes_to_the_runner_waiting_longest_that_can_take_it() {
    let harness = Arc::new(Harness::runner_api_polling(None, Duration::from_secs(20)).await);
    let mut polls = Vec::new();
    for (name, labels) in [
        ("first", &["self-hosted", "linux"][..]),
        ("gpu", &["self-hosted", "linux", "gpu"][..]),
        ("second", &["self-hosted", "linux"][..]),
    ] {
        let token = harness.runner(name, labels).await;
        let poll = poll_in_background(&harness, token, true);
        // Each waits before the next comes.
        let waiting = polls.len() + 1;
        until_waiting(&harness, waiting).await;
        polls.push(poll);
    }
    let metrics = harness.metrics().await;
    assert!(
        metrics.contains("runway_runners_polling{pool=\"default\"} 3"),
        "{metrics}"
    );
    let gpu_job = harness.submit(&["gpu"], None).await;
    let linux_job = harness.submit(&["linux"], None).await;
    let [first, gpu, second] = <[_; 3]>::try_from(polls).unwrap();
    let got = |poll| async move {
        let (status, body) = answer(poll).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["id"].as_i64()
    };
    assert_eq!(got(gpu).await, Some(gpu_job), "only it has gpu");
    assert_eq!(got(first).await, Some(linux_job), "waiting longest");
    assert_eq!(
        harness.service.waiters.waiting(),
        1,
        "the second still waits"
    );
    let last = harness.submit(&["linux"], None).await;
    assert_eq!(got(second).await, Some(last));
}

/// A runner drained while it long-polls for a job that starts at once is
/// told to go (410) when it wakes, and the job it woke for stays queued:
/// the claim's compare-and-set on the runner catches the drain even though
/// the poll does not read the runner again after waiting.
#[tokio::test]
async fn a_runner_drained_during_a_long_poll_that_starts_takes_no_job() {
    let harness = Arc::new(Harness::runner_api(None).await);
    let token = harness.runner("poller", &["linux"]).await;
    let poll = poll_in_background(&harness, token, true);
    // Let the poll reach its wait (it answers 410 whichever comes first).
    tokio::task::yield_now().await;
    let store = &harness.service.store;
    tell_runner(&harness, "poller", RunnerEvent::DrainRequested).await;
    let id = harness.submit(&["linux"], None).await;
    let (status, body) = answer(poll).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::GONE, Some("runner_draining")),
        "{body}"
    );
    let job = store.get_job(JobId(id)).await.unwrap().unwrap();
    assert_eq!((job.state, job.runner), (JobState::Queued, None));
}

#[tokio::test]
async fn expired_leases_requeue_and_crash_the_runner_of_a_running_job() {
    let harness = Harness::runner_api(None).await;
    let dead = harness.runner("dead", &["linux"]).await;
    let id = harness.submit(&["linux"], None).await;
    harness.request_job(&dead).await;
    harness
        .post(
            &format!("/api/v1/jobs/{id}/provisioning"),
            &dead,
            json!({"status": "accepted"}),
        )
        .await;
    let later = runway_server::clock::now().plus(Duration::from_secs(121));
    assert_eq!(sweep_leases(&harness.service, later).await.unwrap(), 1);
    let job = harness
        .service
        .store
        .get_job(JobId(id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((job.state, job.attempts), (JobState::Queued, 1));
    let runner = harness
        .service
        .store
        .find_runner("dead")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(runner.state, RunnerState::Crashed);
    let (status, _) = harness.request_job(&dead).await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a crashed runner must register again"
    );
    let fresh = harness.runner("fresh", &["linux"]).await;
    let (_, again) = harness.request_job(&fresh).await;
    assert_eq!(
        again["id"].as_i64(),
        Some(id),
        "another runner takes the requeued job"
    );
    let metrics = harness.service.metrics.encode();
    assert!(
        metrics.contains("runway_runners_crashed_total{pool=\"default\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn runner_reports_are_validated_and_stored() {
    let harness = Harness::runner_api(None).await;
    let token = harness.runner("reporter", &["linux"]).await;
    let other = harness.runner("other", &["linux"]).await;
    let runner = harness
        .service
        .store
        .find_runner("reporter")
        .await
        .unwrap()
        .unwrap();
    let path = format!("/api/v1/runners/{}/metrics", runner.id);
    let now = runway_server::clock::now().as_millis() / 1_000;
    let pre = json!({"phase": "pre-job", "workflow": "CI", "repository": "org/repo", "event": "push",
                     "workflow_run_id": 5_373_506_832u64, "timestamp": now});
    let (status, _) = harness.post(&path, &token, pre.clone()).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let post =
        json!({"phase": "post-job", "timestamp": now, "status": "repo-policy-check-failure"});
    assert_eq!(
        harness.post(&path, &token, post).await.0,
        StatusCode::ACCEPTED
    );

    let mut unknown = pre.clone();
    unknown["extra"] = json!(1);
    let mut long = pre.clone();
    long["workflow"] = json!("w".repeat(300));
    let mut old = pre.clone();
    old["timestamp"] = json!(now - 24 * 3600);
    let mut future = pre.clone();
    future["timestamp"] = json!(now + 24 * 3600);
    let bad_status = json!({"phase": "post-job", "timestamp": now, "status": "weird"});
    // Malformed is 400; well-formed with a time outside the runner's
    // lifetime is 422.
    for (body, what, expected) in [
        (unknown, "unknown field", StatusCode::BAD_REQUEST),
        (long, "over-long string", StatusCode::BAD_REQUEST),
        (
            old,
            "before the runner existed",
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (future, "in the future", StatusCode::UNPROCESSABLE_ENTITY),
        (bad_status, "unknown status", StatusCode::BAD_REQUEST),
        (
            json!({"phase": "mid-job"}),
            "unknown phase",
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let (status, answer) = harness.post(&path, &token, body).await;
        assert_eq!(status, expected, "{what}: {answer}");
    }
    let huge = json!({"phase": "post-job", "timestamp": now, "status": "normal", "pad": "x".repeat(70 * 1024)});
    assert_eq!(
        harness.post(&path, &token, huge).await.0,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    assert_eq!(
        harness.post(&path, &other, pre.clone()).await.0,
        StatusCode::FORBIDDEN,
        "only about itself"
    );
    let stored = harness
        .service
        .store
        .runner_reports(runner.id)
        .await
        .unwrap();
    let phases: Vec<&str> = stored.iter().map(|(phase, _)| phase.as_str()).collect();
    assert_eq!(
        phases,
        ["pre-job", "post-job"],
        "refused reports store nothing"
    );
    let metrics = harness.service.metrics.encode();
    assert!(
        metrics.contains("runway_runner_reports_rejected_total{reason=\"malformed\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("runway_runner_reports_rejected_total{reason=\"timestamp_out_of_range\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("runway_runner_reports_rejected_total{reason=\"too_large\"} 1"),
        "{metrics}"
    );
    // Refusals of the token and the runner are counted too.
    for token in ["not-a-runner-token", ""] {
        let (status, _) = harness.post(&path, token, pre.clone()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "token {token:?}");
    }
    let metrics = harness.service.metrics.encode();
    for (reason, count) in [("unauthorized", 2), ("not_this_runner", 1)] {
        let series = format!("runway_runner_reports_rejected_total{{reason=\"{reason}\"}} {count}");
        assert!(metrics.contains(&series), "{series}: {metrics}");
    }
}

#[tokio::test]
async fn waiting_jobs_say_why() {
    let harness = Harness::runner_api(None).await;
    let first = harness.submit(&["linux"], None).await;
    let (status, job) = harness.get(&format!("/api/v1/jobs/{first}"), READER).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(job["waiting"]["code"], "no_provider_capacity", "{job}");
    assert!(job["waiting"]["details"]["hint"]
        .as_str()
        .unwrap()
        .contains("runway agent"));

    let token = harness.runner("idle-one", &["linux"]).await;
    let (_, job) = harness.get(&format!("/api/v1/jobs/{first}"), READER).await;
    assert_eq!(job["waiting"]["code"], "runner_idle", "{job}");

    // The pool is capped at 10 runners: fill it with busy ones.
    harness.request_job(&token).await;
    harness
        .post(
            &format!("/api/v1/jobs/{first}/provisioning"),
            &token,
            json!({"status": "accepted"}),
        )
        .await;
    for i in 0..9 {
        let runner = harness.runner(&format!("busy-{i}"), &["linux"]).await;
        let id = harness.submit(&["linux"], None).await;
        let (_, claimed) = harness.request_job(&runner).await;
        assert_eq!(claimed["id"].as_i64(), Some(id));
        harness
            .post(
                &format!("/api/v1/jobs/{id}/provisioning"),
                &runner,
                json!({"status": "accepted"}),
            )
            .await;
    }
    let waiting = harness.submit(&["linux"], None).await;
    let (_, job) = harness
        .get(&format!("/api/v1/jobs/{waiting}"), READER)
        .await;
    assert_eq!(
        job["waiting"],
        json!({"code": "at_max_runners", "details": {"max_runners": 10}})
    );
    let (_, page) = harness
        .get("/api/v1/jobs?state=queued&explain=true", READER)
        .await;
    assert_eq!(
        page["jobs"][0]["waiting"]["code"], "at_max_runners",
        "{page}"
    );
    let (_, running) = harness.get(&format!("/api/v1/jobs/{first}"), READER).await;
    assert!(
        running.get("waiting").is_none(),
        "a running job does not wait: {running}"
    );
}

/// `runway_jobs_started_total` over every pool, and the metrics page.
async fn jobs_started(harness: &Harness) -> (f64, String) {
    let metrics = harness.metrics().await;
    let started = metrics
        .lines()
        .filter(|line| line.starts_with("runway_jobs_started_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    (started, metrics)
}

/// A runner that completes its job with `"next": true` gets the next one
/// started in the same call; without a queued job, or stopping after its
/// job, it gets none and the job is only completed.
async fn a_completion_can_start_the_next_job(harness: Harness) {
    let token = harness.runner("chain", &["self-hosted", "linux"]).await;
    let store = &harness.service.store;
    let first = harness.submit(&["linux"], None).await;
    let second = harness.submit(&["linux"], None).await;
    let path = |id: i64| format!("/api/v1/jobs/{id}/complete");
    let (_, job) = request_started(&harness, &token).await;
    assert_eq!(job["id"].as_i64(), Some(first), "{job}");
    let (status, done) = harness
        .post(
            &path(first),
            &token,
            json!({"exit_code": 0, "log_tail": "one\n", "next": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(
        (done["id"].as_i64(), done["state"].as_str()),
        (Some(first), Some("completed"))
    );
    assert_eq!(
        (done["next"]["id"].as_i64(), done["next"]["state"].as_str()),
        (Some(second), Some("running")),
        "{done}"
    );
    assert_eq!(done["next"]["script"].as_str(), Some("echo hi"));
    assert_eq!(
        store.get_job_log(JobId(first)).await.unwrap(),
        Some((Some(0), "one\n".to_owned()))
    );
    let runner = store.find_runner("chain").await.unwrap().unwrap();
    assert_eq!(
        (runner.state, runner.job),
        (RunnerState::Busy, Some(JobId(second)))
    );
    // Nothing queued: completed, no `next`, the runner idle.
    let (status, done) = harness
        .post(&path(second), &token, json!({"exit_code": 1, "next": true}))
        .await;
    assert_eq!(
        (status, done["state"].as_str(), done.get("next")),
        (StatusCode::OK, Some("completed"), None),
        "{done}"
    );
    let runner = store.find_runner("chain").await.unwrap().unwrap();
    assert_eq!((runner.state, runner.job), (RunnerState::Idle, None));
    // A repeat is refused as before, and starts nothing.
    let third = harness.submit(&["linux"], None).await;
    let (status, _) = harness
        .post(&path(second), &token, json!({"exit_code": 0, "next": true}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let waiting = store.get_job(JobId(third)).await.unwrap().unwrap();
    assert_eq!(waiting.state, JobState::Queued);
    // A draining runner completes its job and takes no other.
    let (_, job) = request_started(&harness, &token).await;
    assert_eq!(job["id"].as_i64(), Some(third), "{job}");
    let fourth = harness.submit(&["linux"], None).await;
    tell_runner(&harness, "chain", RunnerEvent::DrainRequested).await;
    let (status, done) = harness
        .post(&path(third), &token, json!({"exit_code": 0, "next": true}))
        .await;
    assert_eq!((status, done.get("next")), (StatusCode::OK, None), "{done}");
    let waiting = store.get_job(JobId(fourth)).await.unwrap().unwrap();
    assert_eq!(waiting.state, JobState::Queued);
    let (started, metrics) = jobs_started(&harness).await;
    assert_eq!(started, 3.0, "each start is counted:\n{metrics}");
}

#[tokio::test]
async fn a_completion_can_start_the_next_job_on_sqlite() {
    a_completion_can_start_the_next_job(Harness::runner_api(None).await).await;
}

#[tokio::test]
async fn a_completion_can_start_the_next_job_on_postgres() {
    let url = std::env::var("RUNWAY_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let schema = format!("runway_runner_api_next_{}", std::process::id());
    let store = runway_store::PostgresStore::open(
        &url,
        Some(&schema),
        &runway_store::OpenOptions::default(),
    )
    .await
    .expect("PostgreSQL for the tests");
    let config = (*Harness::runner_api(None).await.service.config()).clone();
    a_completion_can_start_the_next_job(Harness::with_store(config, Arc::new(store))).await;
    runway_store::PostgresStore::drop_schema(&url, &schema)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_job_can_start_at_once() {
    let harness = Harness::runner_api(None).await;
    let token = harness.runner("quick", &["self-hosted", "linux"]).await;
    let store = &harness.service.store;
    let (status, _) = request_started(&harness, &token).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "nothing queued");
    let first = harness.submit(&["linux"], None).await;
    let second = harness.submit(&["linux"], None).await;
    let (status, job) = request_started(&harness, &token).await;
    assert_eq!(
        (status, job["id"].as_i64(), job["state"].as_str()),
        (StatusCode::CREATED, Some(first), Some("running")),
        "{job}"
    );
    let stored = store.get_job(JobId(first)).await.unwrap().unwrap();
    let runner = store.find_runner("quick").await.unwrap().unwrap();
    assert_eq!(stored.state, JobState::Running);
    assert!(stored.lease_deadline.is_some(), "running under its lease");
    assert_eq!(
        (runner.state, runner.job),
        (RunnerState::Busy, Some(JobId(first)))
    );
    // Busy with it, the runner cannot start another; the second job waits.
    let (status, body) = request_started(&harness, &token).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("runner_unavailable")),
        "{body}"
    );
    let waiting = store.get_job(JobId(second)).await.unwrap().unwrap();
    assert_eq!(waiting.state, JobState::Queued);
    // No accept step: the job is already running.
    let path = |id: i64, what: &str| format!("/api/v1/jobs/{id}/{what}");
    let (status, _) = harness
        .call("POST", &path(first, "heartbeat"), &token, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, state) = harness
        .post(
            &path(first, "complete"),
            &token,
            json!({"exit_code": 0, "log_tail": "done\n"}),
        )
        .await;
    assert_eq!(
        (status, state["state"].as_str()),
        (StatusCode::OK, Some("completed"))
    );
    assert_eq!(
        store.get_job_log(JobId(first)).await.unwrap(),
        Some((Some(0), "done\n".to_owned()))
    );
    let runner = store.find_runner("quick").await.unwrap().unwrap();
    assert_eq!((runner.state, runner.job), (RunnerState::Idle, None));
    // Free again, it starts the next one; its history has both steps.
    let (_, job) = request_started(&harness, &token).await;
    assert_eq!(job["id"].as_i64(), Some(second));
    let steps: Vec<JobState> = store
        .job_history(JobId(second))
        .await
        .unwrap()
        .unwrap()
        .iter()
        .map(|step| step.state)
        .collect();
    assert_eq!(
        steps,
        [JobState::Queued, JobState::Provisioning, JobState::Running]
    );
    let (started, metrics) = jobs_started(&harness).await;
    assert_eq!(started, 2.0, "each start is counted:\n{metrics}");
    // A runner being scaled down is refused before anything starts.
    let leaving = harness.runner("leaving", &["self-hosted", "linux"]).await;
    let id = harness.submit(&["linux"], None).await;
    tell_runner(&harness, "leaving", RunnerEvent::TerminateRequested).await;
    let (status, body) = request_started(&harness, &leaving).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::GONE, Some("runner_terminating")),
        "{body}"
    );
    let job = store.get_job(JobId(id)).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Queued);
}

#[tokio::test]
async fn a_runner_being_scaled_down_starts_no_job() {
    let harness = Harness::runner_api(None).await;
    let token = harness.runner("leaving", &["self-hosted", "linux"]).await;
    let store = &harness.service.store;
    let runner = store.find_runner("leaving").await.unwrap().unwrap();
    let id = harness.submit(&["linux"], None).await;
    let (_, job) = harness.request_job(&token).await;
    assert_eq!(job["id"].as_i64(), Some(id));
    // The reconciler decides to remove it between its claim and its accept.
    store
        .apply_runner_event(
            runner.id,
            &RunnerEvent::TerminateRequested,
            runway_server::clock::now(),
        )
        .await
        .unwrap();
    let (status, body) = harness
        .post(
            &format!("/api/v1/jobs/{id}/provisioning"),
            &token,
            json!({"status": "accepted"}),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("runner_unavailable")),
        "{body}"
    );
    let (_, job) = harness.get(&format!("/api/v1/jobs/{id}"), ADMIN).await;
    assert_eq!(job["state"], "queued", "back in the queue: {job}");
    let (status, body) = harness.request_job(&token).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::GONE, Some("runner_terminating")),
        "{body}"
    );
    // Another runner takes the job.
    let other = harness.runner("staying", &["self-hosted", "linux"]).await;
    let (_, job) = harness.request_job(&other).await;
    assert_eq!(job["id"].as_i64(), Some(id));
    let (status, _) = harness
        .post(
            &format!("/api/v1/jobs/{id}/provisioning"),
            &other,
            json!({"status": "accepted"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let staying = store.find_runner("staying").await.unwrap().unwrap();
    assert_eq!(staying.state, RunnerState::Busy);
}

#[tokio::test]
async fn a_failed_accept_leaves_the_runner_free() {
    let harness = Harness::runner_api(None).await;
    let token = harness.runner("r", &["self-hosted", "linux"]).await;
    let id = harness.submit(&["linux"], None).await;
    // Not claimed by this runner: the accept is refused (403) …
    let (status, _) = harness
        .post(
            &format!("/api/v1/jobs/{id}/provisioning"),
            &token,
            json!({"status": "accepted"}),
        )
        .await;
    assert!(status.is_client_error(), "{status}");
    // … and the runner is not left busy with a job it never started.
    let runner = harness
        .service
        .store
        .find_runner("r")
        .await
        .unwrap()
        .unwrap();
    assert_ne!(runner.state, RunnerState::Busy);
    assert_eq!(runner.job, None);
}

#[tokio::test]
async fn the_event_log_records_queuing_start_and_stop_in_the_spec_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.log");
    let harness = Harness::runner_api(Some(&path)).await;
    let token = harness.runner("r", &["self-hosted", "linux"]).await;
    let id = harness.submit(&["linux"], None).await;
    let (_, job) = harness.request_job(&token).await;
    assert_eq!(job["id"].as_i64(), Some(id));
    for (what, body) in [
        ("provisioning", json!({"status": "accepted"})),
        ("complete", json!({"exit_code": 0, "log_tail": "ok"})),
    ] {
        let (status, answer) = harness
            .post(&format!("/api/v1/jobs/{id}/{what}"), &token, body)
            .await;
        assert_eq!(status, StatusCode::OK, "{what}: {answer}");
    }
    let events: Vec<Value> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect();
    let keys = |event: &Value| {
        let mut keys: Vec<String> = event.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    };
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["job_queuing", "runner_start", "runner_stop"]);
    assert_eq!(
        keys(&events[0]),
        ["duration", "event", "flavor", "log_timestamp"]
    );
    assert_eq!(
        keys(&events[1]),
        [
            "event",
            "flavor",
            "github_event",
            "idle",
            "log_timestamp",
            "repo",
            "timestamp",
            "workflow"
        ]
    );
    assert_eq!(
        keys(&events[2]),
        [
            "conclusion",
            "duration",
            "event",
            "flavor",
            "github_event",
            "log_timestamp",
            "repo",
            "status",
            "timestamp",
            "workflow"
        ]
    );
    // The spec's status (the runner got to its end); the job's
    // conclusion beside it.
    assert_eq!(events[2]["status"], "normal");
    assert_eq!(events[2]["conclusion"], "success");
    assert_eq!(events[0]["flavor"], "default");
    assert!(events[0]["log_timestamp"].as_i64().unwrap() > 1_700_000_000);
}

/// Moves runner `name` by `event` now, as an operator (a drain) or the
/// reconciler (a removal) would.
async fn tell_runner(harness: &Harness, name: &str, event: RunnerEvent) {
    let store = &harness.service.store;
    let row = store.find_runner(name).await.unwrap().unwrap();
    store
        .apply_runner_event(row.id, &event, runway_server::clock::now())
        .await
        .unwrap();
}

/// A `jobs/request` running in the background.
type Poll = tokio::task::JoinHandle<(StatusCode, Value)>;

/// Starts a `jobs/request` of `token`'s runner in the background (asking
/// for a job that starts at once if `start`).
fn poll_in_background(harness: &Arc<Harness>, token: String, start: bool) -> Poll {
    let harness = harness.clone();
    tokio::spawn(async move {
        if start {
            request_started(&harness, &token).await
        } else {
            harness.request_job(&token).await
        }
    })
}

/// Until `count` runners wait in long polls (10 s at most).
async fn until_waiting(harness: &Harness, count: usize) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while harness.service.waiters.waiting() < count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {count} runners wait",
            harness.service.waiters.waiting()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// What a background poll answered, within 10 s.
async fn answer(poll: Poll) -> (StatusCode, Value) {
    tokio::time::timeout(Duration::from_secs(10), poll)
        .await
        .expect("answered")
        .expect("task")
}

/// `jobs/request` for a job that starts at once (`"start": true`).
async fn request_started(harness: &Harness, token: &str) -> (StatusCode, Value) {
    harness
        .post("/api/v1/jobs/request", token, json!({"start": true}))
        .await
}

/// `[pools.share]` on a pool of 4 runners: `team-a` queues 500 jobs,
/// then `team-b` queues one; B's job is among the next 4 hand-outs (the
/// 4 runners each completing one of A's and taking the next in the same
/// call), not behind A's 496.
#[tokio::test]
async fn fair_share_serves_a_small_tenant_within_the_next_hand_outs() {
    let harness = Harness::runner_api(None).await;
    let mut config = (*harness.service.config()).clone();
    config.pools[0].max_runners = 4;
    harness.service.replace_config(config);
    let submit = |tenant: &'static str, i: usize| harness.submit_as(tenant, i);
    for i in 0..500 {
        submit("team-a", i).await;
    }
    let mut runners = Vec::new();
    let mut running = Vec::new();
    for n in 0..4 {
        let token = harness
            .runner(&format!("fair-{n}"), &["self-hosted", "linux"])
            .await;
        let (status, job) = request_started(&harness, &token).await;
        assert_eq!(status, StatusCode::CREATED, "{job}");
        running.push(job["id"].as_i64().unwrap());
        runners.push(token);
    }
    let b = submit("team-b", 0).await;
    let mut hand_outs = Vec::new();
    for (token, job) in runners.iter().zip(&running) {
        let (status, done) = harness
            .post(
                &format!("/api/v1/jobs/{job}/complete"),
                token,
                json!({"exit_code": 0, "next": true}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{done}");
        hand_outs.push(done["next"]["id"].as_i64().unwrap());
    }
    assert!(hand_outs.contains(&b), "B's job {b} not in {hand_outs:?}");
    let (_, job) = harness.get(&format!("/api/v1/jobs/{b}"), ADMIN).await;
    assert_eq!(job["share_key"], "team-b", "{job}");
    // A job without a tenant counts against its token's name.
    let untagged = harness.submit(&["linux"], None).await;
    let job = harness
        .service
        .store
        .get_job(JobId(untagged))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(job.share.key, "admin_tokens[0]");
    // A tenant that is too long is refused, nothing stored.
    let (status, body) = harness
        .post(
            "/api/v1/jobs",
            ADMIN,
            json!({"labels": ["linux"], "script": "echo", "tenant": "x".repeat(129)}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

/// With `max_running = 2`, a tenant's third job waits while two of its
/// jobs run — with a reason that says so — and another tenant's job is
/// handed out past it.
#[tokio::test]
async fn a_tenant_at_its_cap_waits_and_says_why() {
    let harness = Harness::runner_api(None).await;
    let mut config = (*harness.service.config()).clone();
    config.pools[0].share = Some(runway_server::config::PoolShare {
        max_running: Some(2),
        ..Default::default()
    });
    harness.service.replace_config(config);
    let submit = |tenant: &'static str, i: usize| harness.submit_as(tenant, i);
    let a: Vec<i64> = {
        let mut ids = Vec::new();
        for i in 0..3 {
            ids.push(submit("team-a", i).await);
        }
        ids
    };
    let mut tokens = Vec::new();
    for (n, expected) in a.iter().take(2).enumerate() {
        let token = harness
            .runner(&format!("cap-{n}"), &["self-hosted", "linux"])
            .await;
        let (_, job) = request_started(&harness, &token).await;
        assert_eq!(job["id"].as_i64(), Some(*expected), "{job}");
        tokens.push(token);
    }
    let (_, third) = harness.get(&format!("/api/v1/jobs/{}", a[2]), ADMIN).await;
    assert_eq!(third["waiting"]["code"], "key_at_cap", "{third}");
    assert_eq!(third["waiting"]["details"]["key"], "team-a", "{third}");
    let b = submit("team-b", 0).await;
    let token = harness.runner("cap-2", &["self-hosted", "linux"]).await;
    let (_, job) = request_started(&harness, &token).await;
    assert_eq!(job["id"].as_i64(), Some(b), "B passes A's held job: {job}");
    // One of A's ends: its third starts on the runner that ran it.
    let (status, done) = harness
        .post(
            &format!("/api/v1/jobs/{}/complete", a[0]),
            &tokens[0],
            json!({"exit_code": 0, "next": true}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done["next"]["id"].as_i64(), Some(a[2]), "{done}");
}
