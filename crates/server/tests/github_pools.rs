//! GitHub pools end to end against the fake GitHub: runway's HTTP server
//! on loopback receives the fake's webhooks, the reconciler creates JIT
//! runners through a sim provider and deregisters before it deletes, and
//! the healer re-checks old queued jobs and redelivers failed webhooks.

use crate::common;
use runway_testkit::fake_github;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use fake_github::{Auth, FakeGithub, HOOK_SECRET, TOKEN};
use runway_core::planner::Offer;
use runway_core::{JobSource, JobState, RunnerState, Timestamp};
use runway_providers::sim::{BootTime, SimConfig, SimProvider};
use runway_providers::{
    Clock, CreateRequest, Instance, InstanceId, ManualClock, Provider, ProviderError,
};
use runway_server::config::{Config, GithubAuth, PoolConfig, PoolGithub, Secret};
use runway_server::config::{Hook, Target};
use runway_server::reconcile::heal::Healer;
use runway_server::reconcile::Reconciler;
use runway_server::Service;

/// A sim provider that remembers what each create was given.
struct Recording {
    inner: SimProvider,
    requests: Mutex<Vec<CreateRequest>>,
}

#[async_trait]
impl Provider for Recording {
    fn name(&self) -> &str {
        self.inner.name()
    }
    async fn create(&self, request: &CreateRequest) -> Result<Instance, ProviderError> {
        self.requests.lock().unwrap().push(request.clone());
        self.inner.create(request).await
    }
    async fn delete(&self, id: &InstanceId) -> Result<(), ProviderError> {
        self.inner.delete(id).await
    }
    async fn list(&self) -> Result<Vec<Instance>, ProviderError> {
        self.inner.list().await
    }
    fn bid(&self, pool: &str, capacity: u32) -> Vec<Offer> {
        self.inner.bid(pool, capacity)
    }
}

const LABELS: [&str; 2] = ["self-hosted", "linux"];

struct Harness {
    fake: FakeGithub,
    service: Arc<Service>,
    provider: Arc<Recording>,
    reconciler: Reconciler,
    healer: Arc<Healer>,
    _dir: tempfile::TempDir,
}

fn config(fake: &FakeGithub) -> Config {
    let mut config = Config {
        pools: vec![PoolConfig {
            name: "gh".into(),
            labels: LABELS.iter().map(|l| l.to_string()).collect(),
            min_idle: 0,
            max_runners: 4,
            idle_grace: Duration::ZERO,
            github: Some(PoolGithub {
                target: Target::Org("octo-org".into()),
                runner_group_id: 1,
                scale_set: None,
                runner_group: None,
            }),
            ..PoolConfig::default()
        }],
        ..Config::default()
    };
    config.github.api_url = fake.url.clone();
    config
        .github
        .set_auth(GithubAuth::Token(Secret::literal(TOKEN)));
    config.github.webhook_secrets = vec![Secret::literal(HOOK_SECRET)];
    config.github.deliveries = Some(hook());
    config
}

fn hook() -> Hook {
    Hook::Org {
        org: "octo-org".into(),
        hook_id: 9,
    }
}

impl Harness {
    async fn start(remaining: u32, adjust: impl FnOnce(&mut Config)) -> Harness {
        let fake = FakeGithub::start(remaining, Auth::Token).await;
        let dir = tempfile::tempdir().unwrap();
        let store = common::sqlite_store(&dir.path().join("runway.db")).await;
        let mut config = config(&fake);
        adjust(&mut config);
        let mut service = Service::new(config, store);
        service.events =
            runway_server::telemetry::events::EventLog::open(&service.config().telemetry)
                .expect("open the event log");
        let service = Arc::new(service);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        fake.lock().webhook_url = Some(format!(
            "http://{}/webhooks/github",
            listener.local_addr().unwrap()
        ));
        tokio::spawn(runway_server::serve(
            service.clone(),
            listener,
            std::future::pending(),
        ));
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(0)));
        let provider = Arc::new(Recording {
            inner: SimProvider::new(
                SimConfig {
                    boot_time: BootTime::Fixed(Duration::ZERO),
                    ..SimConfig::default()
                },
                clock,
            ),
            requests: Mutex::new(Vec::new()),
        });
        let providers: BTreeMap<String, Arc<dyn Provider>> =
            BTreeMap::from([("sim".to_owned(), provider.clone() as Arc<dyn Provider>)]);
        let reconciler = Reconciler::new(service.clone(), providers);
        let client = service.github.clone().expect("a GitHub client");
        let healer = Arc::new(Healer::new(service.clone(), client));
        Harness {
            fake,
            service,
            provider,
            reconciler,
            healer,
            _dir: dir,
        }
    }

    async fn reconcile(&self) -> runway_server::reconcile::Report {
        self.reconciler
            .reconcile_once(runway_server::clock::now())
            .await
            .unwrap()
            .0
    }

    async fn runner(&self, name: &str) -> runway_core::Runner {
        self.service.store.find_runner(name).await.unwrap().unwrap()
    }

    async fn instance_names(&self) -> Vec<String> {
        common::instance_names(self.provider.as_ref()).await
    }

    async fn job(&self, github_id: u64) -> Option<runway_core::Job> {
        self.service
            .store
            .find_job(JobSource::Github, &github_id.to_string())
            .await
            .unwrap()
    }

    /// Polls (no sleeps for events) until the job is stored, or fails.
    async fn wait_for_job(&self, github_id: u64) -> runway_core::Job {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(job) = self.job(github_id).await {
                return job;
            }
            assert!(
                Instant::now() < deadline,
                "job {github_id} never arrived; deliveries: {:?}",
                self.fake
                    .lock()
                    .deliveries
                    .iter()
                    .map(|d| (d.guid.clone(), d.status_code, d.redelivery))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn metrics(&self) -> String {
        self.service.metrics.encode_text()
    }
}

/// `GET url` with a bearer token, as JSON.
async fn get_json(url: &str, token: &str) -> serde_json::Value {
    reqwest::Client::new()
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn labels() -> Vec<&'static str> {
    LABELS.to_vec()
}

#[tokio::test]
async fn each_demand_gets_a_jit_runner_and_a_scale_down_racing_a_job_start_keeps_the_instance() {
    let h = Harness::start(4_000, |_| {}).await;
    for id in [101, 102] {
        h.fake.queue_job(id, &labels());
        assert_eq!(h.fake.deliver(id, "queued", false).await, 202);
    }
    let report = h.reconcile().await;
    assert_eq!(report.created, 2, "{report:?}");

    // One JIT configuration per runner, named after it, with the pool's
    // labels, handed to the provider.
    let requests = h.provider.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2);
    for request in &requests {
        let github_id = h
            .fake
            .runner_id(&request.name)
            .expect("registered at GitHub");
        assert_eq!(
            request.bootstrap.get("RUNWAY_JIT_CONFIG"),
            Some(&fake_github::encoded_jit(github_id, &request.name))
        );
        assert_eq!(h.fake.lock().runners[&github_id].labels, LABELS);
    }
    assert_eq!(h.fake.invalid(), Vec::<String>::new());
    h.reconcile().await;
    let (a, b) = (requests[0].name.clone(), requests[1].name.clone());
    assert_eq!(h.runner(&a).await.state, RunnerState::Idle);

    // Job 101 runs on A and ends: A goes (GitHub removed it already: a JIT
    // runner runs one job).
    h.fake.start_job(101, &a);
    assert_eq!(h.fake.deliver(101, "in_progress", false).await, 202);
    h.fake.complete_job(101, "success");
    assert_eq!(h.fake.deliver(101, "completed", false).await, 202);
    // Job 102 is cancelled before it starts: B has nothing to do.
    h.fake.complete_job(102, "cancelled");
    assert_eq!(h.fake.deliver(102, "completed", false).await, 202);

    // Meanwhile GitHub hands B a job runway has not heard of: its
    // `queued` webhook was lost and its `in_progress` is not here yet.
    h.fake.queue_job(103, &labels());
    h.fake.deliver(103, "queued", true).await;
    h.fake.start_job(103, &b);

    let report = h.reconcile().await;
    assert_eq!(report.deleted, 1, "A's instance: {report:?}");
    assert_eq!(
        report.delete_refused_busy, 1,
        "B: GitHub says it is running a job"
    );
    assert_eq!(
        h.instance_names().await,
        vec![b.clone()],
        "B's instance is kept"
    );
    let runner_b = h.runner(&b).await;
    assert_eq!((runner_b.state, runner_b.job), (RunnerState::Busy, None));
    // GitHub's busy flag still says "not busy": runway did not rely on it.
    let b_id = h.fake.runner_id(&b).unwrap();
    let shown = get_json(
        &format!("{}/orgs/octo-org/actions/runners/{b_id}", h.fake.url),
        TOKEN,
    )
    .await;
    assert_eq!(shown["busy"], false);

    // Rounds go by: a busy runner is never asked to go again.
    for _ in 0..3 {
        h.reconcile().await;
    }
    assert_eq!(
        h.fake
            .calls_starting(&format!("DELETE /orgs/octo-org/actions/runners/{b_id}")),
        1
    );
    assert_eq!(h.instance_names().await, vec![b.clone()]);

    // The job's own webhook names it; then it ends, and only then B goes.
    assert_eq!(h.fake.deliver(103, "in_progress", false).await, 202);
    let job = h.job(103).await.unwrap();
    assert_eq!(h.runner(&b).await.job, Some(job.id));
    h.reconcile().await;
    assert_eq!(h.instance_names().await, vec![b.clone()]);
    h.fake.complete_job(103, "success");
    assert_eq!(h.fake.deliver(103, "completed", false).await, 202);
    h.reconcile().await;
    assert_eq!(h.instance_names().await, Vec::<String>::new());
    assert_eq!(h.runner(&b).await.state, RunnerState::Terminated);
    assert_eq!(h.fake.invalid(), Vec::<String>::new());
}

/// With the request budget too low for deregistrations (inside their
/// reserve), a just-in-time runner whose job is over is not kept waiting
/// for one — GitHub removes it by itself — so it never holds the pool's
/// capacity from the next job.
#[tokio::test]
async fn a_finished_jit_runner_never_holds_capacity_while_the_budget_is_low() {
    // 200 of 5,000 left: JIT configurations go out, deregistrations wait.
    let h = Harness::start(200, |config| config.pools[0].max_runners = 1).await;
    h.fake.queue_job(111, &labels());
    assert_eq!(h.fake.deliver(111, "queued", false).await, 202);
    assert_eq!(h.reconcile().await.created, 1);
    h.reconcile().await;
    let a = h.provider.requests.lock().unwrap()[0].name.clone();
    assert_eq!(h.runner(&a).await.state, RunnerState::Idle);
    h.fake.start_job(111, &a);
    assert_eq!(h.fake.deliver(111, "in_progress", false).await, 202);
    h.fake.complete_job(111, "success");
    assert_eq!(h.fake.deliver(111, "completed", false).await, 202);
    // The next job: A's place is free within two rounds.
    h.fake.queue_job(112, &labels());
    assert_eq!(h.fake.deliver(112, "queued", false).await, 202);
    let mut created = 0;
    for _ in 0..2 {
        created += h.reconcile().await.created;
    }
    assert_eq!(created, 1, "a runner for job 112");
    assert_eq!(h.runner(&a).await.state, RunnerState::Terminated);
    assert!(!h.instance_names().await.contains(&a));
    assert_eq!(
        h.fake
            .calls_starting("DELETE /orgs/octo-org/actions/runners/"),
        0
    );
    assert_eq!(h.fake.invalid(), Vec::<String>::new());
}

#[tokio::test]
async fn a_dropped_queued_webhook_is_redelivered_once() {
    let h = Harness::start(4_000, |_| {}).await;
    h.fake.queue_job(201, &labels());
    assert_eq!(h.fake.deliver(201, "queued", true).await, 0, "dropped");
    // Delivered fine: nothing to heal.
    h.fake.queue_job(202, &labels());
    assert_eq!(h.fake.deliver(202, "queued", false).await, 202);
    // Stored by runway, but GitHub timed out waiting for the answer: runway
    // has it, so no redelivery is needed.
    h.fake.queue_job(203, &labels());
    h.fake.deliver(203, "queued", false).await;
    h.fake.lock().deliveries.last_mut().unwrap().status_code = 0;
    assert!(h.job(201).await.is_none());

    let now = runway_server::clock::now();
    let report = h.healer.redeliver_once(&hook(), now).await.unwrap();
    assert_eq!((report.failed, report.redelivered), (1, 1), "{report:?}");
    let job = h.wait_for_job(201).await;
    assert_eq!(job.state, JobState::Queued);
    assert_eq!(job.pool.as_deref(), Some("gh"));

    // Once each: the next interval asks for nothing.
    let report = h.healer.redeliver_once(&hook(), now).await.unwrap();
    assert_eq!(report.redelivered, 0, "{report:?}");
    assert_eq!(
        h.fake
            .calls_starting("POST /orgs/octo-org/hooks/9/deliveries/"),
        1
    );
    assert!(h.metrics().contains("runway_github_redeliveries_total 1"));
    assert_eq!(h.fake.invalid(), Vec::<String>::new());
}

#[tokio::test]
async fn the_background_task_heals_a_dropped_webhook_within_one_interval() {
    let h = Harness::start(4_000, |config| {
        config.github.redeliver_interval = Duration::from_millis(500);
    })
    .await;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(runway_server::reconcile::heal::run(
        h.healer.clone(),
        stopped,
    ));
    h.fake.queue_job(251, &labels());
    h.fake.deliver(251, "queued", true).await;
    let job = h.wait_for_job(251).await;
    assert_eq!(job.state, JobState::Queued);
    stop.send(true).unwrap();
    task.await.unwrap();
}

#[tokio::test]
async fn a_dropped_completed_webhook_is_corrected_by_the_recheck() {
    let h = Harness::start(4_000, |_| {}).await;
    // 301: cancelled before it started; 302: ran and finished; 303: still
    // queued. Every later webhook of theirs was lost.
    for id in [301, 302, 303] {
        h.fake.queue_job(id, &labels());
        assert_eq!(h.fake.deliver(id, "queued", false).await, 202);
    }
    h.fake.complete_job(301, "cancelled");
    h.fake.start_job(302, "someone-elses-runner");
    h.fake.complete_job(302, "success");

    let now = runway_server::clock::now();
    let early = h
        .healer
        .recheck_once(now.plus(Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(
        early.checked, 0,
        "younger than recheck_after: not looked up"
    );

    let later = now.plus(Duration::from_secs(301));
    let report = h.healer.recheck_once(later).await.unwrap();
    assert_eq!((report.checked, report.corrected), (3, 2), "{report:?}");
    let cancelled = h.job(301).await.unwrap();
    assert_eq!(cancelled.state, JobState::Completed);
    assert_eq!(cancelled.conclusion.map(|c| c.as_str()), Some("cancelled"));
    let finished = h.job(302).await.unwrap();
    assert_eq!(finished.state, JobState::Completed);
    assert_eq!(finished.conclusion.map(|c| c.as_str()), Some("success"));
    assert_eq!(h.job(303).await.unwrap().state, JobState::Queued);

    // The corrected jobs create no demand: one runner, for 303.
    let report = h.reconcile().await;
    assert_eq!(report.created, 1, "{report:?}");

    // 303 is not looked up again before recheck_after has passed anew.
    let again = h
        .healer
        .recheck_once(later.plus(Duration::from_secs(10)))
        .await
        .unwrap();
    assert_eq!(again.checked, 0);
    let text = h.metrics();
    assert!(
        text.contains(r#"runway_github_job_rechecks_total{reason="completed"} 2"#),
        "{text}"
    );
    assert_eq!(h.fake.invalid(), Vec::<String>::new());
}

#[tokio::test]
async fn with_the_rate_limit_nearly_spent_jit_runners_start_and_rechecks_wait() {
    // 301 of 5,000 left: inside the re-check reserve.
    let h = Harness::start(301, |_| {}).await;
    h.fake.queue_job(401, &labels());
    h.fake.deliver(401, "queued", false).await;
    let report = h.reconcile().await;
    assert_eq!(report.created, 1, "the JIT request went out: {report:?}");
    let later = runway_server::clock::now().plus(Duration::from_secs(600));
    let recheck = h.healer.recheck_once(later).await.unwrap();
    assert_eq!((recheck.checked, recheck.deferred), (0, 1), "{recheck:?}");
    assert_eq!(h.fake.calls_starting("GET /repos/"), 0);
    assert!(h
        .metrics()
        .contains("runway_github_rate_limit_remaining 300"));
}

#[tokio::test]
async fn a_runner_github_never_lets_go_of_is_settled_by_asking_again() {
    // Busy for a job whose webhooks all got lost: after recheck_after,
    // runway asks GitHub again, and once it lets go the machine goes.
    let h = Harness::start(4_000, |_| {}).await;
    h.fake.queue_job(501, &labels());
    h.fake.deliver(501, "queued", false).await;
    h.reconcile().await;
    h.reconcile().await;
    let name = h.provider.requests.lock().unwrap()[0].name.clone();
    h.fake.complete_job(501, "cancelled");
    h.fake.deliver(501, "completed", false).await;
    h.fake.queue_job(502, &labels());
    h.fake.start_job(502, &name);
    h.reconcile().await;
    assert_eq!(h.runner(&name).await.state, RunnerState::Busy);
    h.fake.complete_job(502, "success"); // And its webhooks never come.
    h.reconcile().await;
    assert_eq!(h.instance_names().await, vec![name.clone()], "not yet due");
    let later = runway_server::clock::now().plus(Duration::from_secs(301));
    h.reconciler.reconcile_once(later).await.unwrap();
    h.reconciler.reconcile_once(later).await.unwrap();
    assert_eq!(h.instance_names().await, Vec::<String>::new());
    assert_eq!(h.runner(&name).await.state, RunnerState::Terminated);
}

/// The scale-down ADR allows a runner one or two wasted deletes. A runner
/// GitHub keeps for an hour on a job runway never heard of is asked to go
/// after recheck_after and then at doubling waits — a few refused DELETEs
/// in the hour (one a round before: about 330) — and goes at the first ask
/// after its job is over; how many were refused is observed.
#[tokio::test]
async fn a_runner_busy_for_an_hour_is_asked_to_go_a_few_times_not_every_round() {
    let h = Harness::start(4_000, |_| {}).await;
    h.fake.queue_job(701, &labels());
    h.fake.deliver(701, "queued", false).await;
    h.reconcile().await;
    h.reconcile().await;
    let name = h.provider.requests.lock().unwrap()[0].name.clone();
    h.fake.complete_job(701, "cancelled");
    h.fake.deliver(701, "completed", false).await;
    h.fake.queue_job(702, &labels());
    h.fake.start_job(702, &name);
    let delete = "DELETE /orgs/octo-org/actions/runners/";
    let before = h.fake.calls_starting(delete);
    // The round asks the idle runner to go, and GitHub says it is busy.
    h.reconcile().await;
    assert_eq!(h.runner(&name).await.state, RunnerState::Busy);
    assert_eq!(h.fake.calls_starting(delete) - before, 1);
    // An hour of rounds, one every 30 s, while the job runs.
    let start = runway_server::clock::now();
    for round in 1..=120u64 {
        let at = start.plus(Duration::from_secs(30 * round));
        h.reconciler.reconcile_once(at).await.unwrap();
    }
    let refused = h.fake.calls_starting(delete) - before;
    assert_eq!(refused, 4, "asked at 0, 5, 15 and 35 minutes");
    assert_eq!(h.runner(&name).await.state, RunnerState::Busy);
    // Its job ends; the next ask (75 minutes in) lets it go.
    h.fake.complete_job(702, "success");
    for round in 121..=170u64 {
        let at = start.plus(Duration::from_secs(30 * round));
        h.reconciler.reconcile_once(at).await.unwrap();
    }
    assert_eq!(h.fake.calls_starting(delete) - before, 5);
    assert_eq!(h.runner(&name).await.state, RunnerState::Terminated);
    let metrics = h.metrics();
    assert!(
        metrics.contains("runway_runner_deregistrations_refused_count 1")
            && metrics.contains("runway_runner_deregistrations_refused_sum 4.0"),
        "{metrics}"
    );
}

/// GitHub would not let a runner go because it ran a job; then that job's
/// webhooks say it ran there and is over. Its machine goes at once, not
/// after the busy wait (`recheck_after`): a just-in-time runner that ran
/// its job needs no second ask.
#[tokio::test]
async fn a_runner_refused_busy_goes_as_soon_as_its_jobs_webhook_ends_it() {
    let h = Harness::start(4_000, |_| {}).await;
    h.fake.queue_job(711, &labels());
    h.fake.deliver(711, "queued", false).await;
    h.reconcile().await;
    h.reconcile().await;
    let name = h.provider.requests.lock().unwrap()[0].name.clone();
    h.fake.complete_job(711, "cancelled");
    h.fake.deliver(711, "completed", false).await;
    h.fake.queue_job(712, &labels());
    h.fake.start_job(712, &name);
    let delete = "DELETE /orgs/octo-org/actions/runners/";
    let before = h.fake.calls_starting(delete);
    h.reconcile().await;
    assert_eq!(h.runner(&name).await.state, RunnerState::Busy);
    assert_eq!(h.fake.calls_starting(delete) - before, 1, "refused: busy");
    // The job's webhooks: it ran on that runner, and it is over.
    assert_eq!(h.fake.deliver(712, "in_progress", false).await, 202);
    h.fake.complete_job(712, "success");
    assert_eq!(h.fake.deliver(712, "completed", false).await, 202);
    let stopping = h.runner(&name).await;
    assert_eq!(stopping.state, RunnerState::Terminating, "{stopping:?}");
    h.reconcile().await;
    h.reconcile().await;
    assert_eq!(h.instance_names().await, Vec::<String>::new());
    assert_eq!(h.runner(&name).await.state, RunnerState::Terminated);
}

#[tokio::test]
async fn a_refusing_github_is_asked_again_after_a_backoff_not_every_round() {
    let h = Harness::start(4_000, |_| {}).await;
    h.fake.lock().refuse_jit = Some(axum::http::StatusCode::FORBIDDEN);
    h.fake.queue_job(601, &labels());
    h.fake.deliver(601, "queued", false).await;
    let now = runway_server::clock::now();
    let (report, _) = h.reconciler.reconcile_once(now).await.unwrap();
    assert_eq!((report.created, report.create_failures), (0, 1));
    for _ in 0..3 {
        h.reconciler.reconcile_once(now).await.unwrap();
    }
    let jit = "POST /orgs/octo-org/actions/runners/generate-jitconfig";
    assert_eq!(h.fake.calls_starting(jit), 1, "backing off");
    assert!(
        h.instance_names().await.is_empty(),
        "no machine without a JIT config"
    );

    h.fake.lock().refuse_jit = None;
    let later = now.plus(Duration::from_secs(60));
    let (report, _) = h.reconciler.reconcile_once(later).await.unwrap();
    assert_eq!(report.created, 1, "{report:?}");
    assert_eq!(h.fake.calls_starting(jit), 2);
}

/// Waits (polling, with a deadline) until GitHub has made `n` failed
/// redelivery attempts.
async fn wait_for_failed_redeliveries(h: &Harness, n: usize) {
    let failed = || {
        h.fake
            .lock()
            .deliveries
            .iter()
            .filter(|d| d.redelivery && d.status_code == 0)
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while failed() < n {
        assert!(Instant::now() < deadline, "the redelivery never happened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A redelivery that fails too (runway still down) is asked for again at
/// the next pass — once per failed attempt, also across a restart and
/// while GitHub has not made the redelivery yet — until one gets through.
#[tokio::test]
async fn a_failed_redelivery_is_asked_again_until_one_gets_through() {
    let h = Harness::start(4_000, |_| {}).await;
    h.fake.queue_job(701, &labels());
    h.fake.deliver(701, "queued", true).await;
    // runway is unreachable for the redeliveries too.
    let url = h.fake.lock().webhook_url.take();
    h.fake.lock().hold_redeliveries = true;
    let now = runway_server::clock::now();
    let report = h.healer.redeliver_once(&hook(), now).await.unwrap();
    assert_eq!(report.redelivered, 1);
    // Not made yet: a second pass, and a restarted runway (a new healer)
    // looking back over the same deliveries, ask nothing more.
    let report = h.healer.redeliver_once(&hook(), now).await.unwrap();
    assert_eq!(report.redelivered, 0, "{report:?}");
    h.service
        .store
        .put_setting("github.deliveries.orgs/octo-org/hooks/9.checked_until", "0")
        .await
        .unwrap();
    let client = h.service.github.clone().unwrap();
    let restarted = Healer::new(h.service.clone(), client);
    let report = restarted.redeliver_once(&hook(), now).await.unwrap();
    assert_eq!(report.redelivered, 0, "{report:?}");
    // The redelivery fails too: asked again, once.
    h.fake.release_redeliveries().await;
    wait_for_failed_redeliveries(&h, 1).await;
    let report = restarted.redeliver_once(&hook(), now).await.unwrap();
    assert_eq!(report.redelivered, 1, "{report:?}");
    let report = h.healer.redeliver_once(&hook(), now).await.unwrap();
    assert_eq!(report.redelivered, 0, "asked already: {report:?}");

    // runway is back: that redelivery gets through, and nothing more is
    // asked.
    h.fake.lock().webhook_url = url;
    h.fake.release_redeliveries().await;
    assert_eq!(h.wait_for_job(701).await.state, JobState::Queued);
    let report = restarted.redeliver_once(&hook(), now).await.unwrap();
    assert_eq!(report.redelivered, 0, "{report:?}");
    assert_eq!(
        h.fake
            .calls_starting("POST /orgs/octo-org/hooks/9/deliveries/"),
        2
    );
}

/// An event runway never takes is not asked for forever.
#[tokio::test]
async fn a_delivery_that_keeps_failing_is_given_up_after_its_asks() {
    let h = Harness::start(4_000, |_| {}).await;
    h.fake.queue_job(702, &labels());
    h.fake.deliver(702, "queued", true).await;
    h.fake.lock().webhook_url = None;
    let now = runway_server::clock::now();
    for n in 1..=runway_server::reconcile::heal::MAX_ASKS as usize {
        let report = h.healer.redeliver_once(&hook(), now).await.unwrap();
        assert_eq!(report.redelivered, 1, "ask {n}: {report:?}");
        wait_for_failed_redeliveries(&h, n).await;
    }
    let report = h.healer.redeliver_once(&hook(), now).await.unwrap();
    assert_eq!(report.redelivered, 0, "{report:?}");
}

/// A delivery runway never answered (down: GitHub records no status code)
/// is not among what `status=failure` lists (400–599), yet it is the one
/// to redeliver; one answered with a 502 by a proxy too.
#[tokio::test]
async fn unanswered_and_refused_deliveries_are_both_redelivered() {
    let h = Harness::start(4_000, |_| {}).await;
    h.fake.queue_job(801, &labels());
    assert_eq!(h.fake.deliver(801, "queued", true).await, 0);
    // A proxy in front of runway answered 502; runway never saw it.
    h.fake.queue_job(802, &labels());
    h.fake.deliver(802, "queued", true).await;
    h.fake.lock().deliveries.last_mut().unwrap().status_code = 502;
    let report = h
        .healer
        .redeliver_once(&hook(), runway_server::clock::now())
        .await
        .unwrap();
    assert_eq!((report.failed, report.redelivered), (2, 2), "{report:?}");
    h.wait_for_job(801).await;
    h.wait_for_job(802).await;
}

/// A lost delivery behind more newer failed deliveries (of other events)
/// than one pass reads is reached by the next passes, which go on down
/// from where the last stopped.
#[tokio::test]
async fn a_lost_delivery_behind_many_newer_failures_is_reached() {
    let h = Harness::start(4_000, |_| {}).await;
    h.fake.queue_job(901, &labels());
    h.fake.deliver(901, "queued", true).await;
    // The fake lists two per page; a pass reads ten pages: 45 newer
    // failures of another event are more than two passes.
    h.fake.record_deliveries("push", 45, 400);
    let now = runway_server::clock::now();
    let mut asked = 0;
    for _ in 0..3 {
        asked += h
            .healer
            .redeliver_once(&hook(), now)
            .await
            .unwrap()
            .redelivered;
    }
    assert_eq!(asked, 1);
    h.wait_for_job(901).await;
    // Later passes (the last minute read again) ask nothing more.
    for _ in 0..3 {
        let report = h.healer.redeliver_once(&hook(), now).await.unwrap();
        assert_eq!(report.redelivered, 0, "{report:?}");
    }
}

#[tokio::test]
async fn a_runner_whose_machine_vanished_is_deregistered_too() {
    let h = Harness::start(4_000, |_| {}).await;
    h.fake.queue_job(801, &labels());
    h.fake.deliver(801, "queued", false).await;
    h.reconcile().await;
    h.reconcile().await;
    let name = h.provider.requests.lock().unwrap()[0].name.clone();
    let github_id = h.fake.runner_id(&name).unwrap();
    let instance = h.runner(&name).await.instance_id.unwrap();
    h.provider
        .delete(&InstanceId(instance))
        .await
        .expect("the machine disappears");
    h.reconcile().await;
    assert_eq!(h.runner(&name).await.state, RunnerState::Failed);
    assert_eq!(
        h.fake.calls_starting(&format!(
            "DELETE /orgs/octo-org/actions/runners/{github_id}"
        )),
        1
    );
    assert!(
        h.fake.runner_id(&name).is_none(),
        "no stale registration left"
    );
}

/// A JIT runner that finishes its job and exits before runway has taken
/// the completion in is not recorded crashed: its machine is gone while
/// it is still busy, and the completion that arrives after makes it
/// terminated. One whose completion never comes is judged crashed after
/// the grace.
#[tokio::test]
async fn a_runner_gone_before_its_completion_arrived_finished_and_did_not_crash() {
    let h = Harness::start(4_000, |_| {}).await;
    for id in [901, 902] {
        h.fake.queue_job(id, &labels());
        h.fake.deliver(id, "queued", false).await;
    }
    h.reconcile().await;
    h.reconcile().await;
    let names: Vec<String> = h
        .provider
        .requests
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.name.clone())
        .collect();
    for (id, name) in [901, 902].iter().zip(&names) {
        h.fake.start_job(*id, name);
        assert_eq!(h.fake.deliver(*id, "in_progress", false).await, 202);
        let instance = h.runner(name).await.instance_id.unwrap();
        h.provider
            .delete(&InstanceId(instance))
            .await
            .expect("the runner exits with its job");
    }
    // Both machines are gone while the runners are busy.
    h.reconcile().await;
    for name in &names {
        assert_eq!(h.runner(name).await.state, RunnerState::Busy, "{name}");
    }
    // 901's completion arrives: its runner ends as terminated.
    h.fake.complete_job(901, "success");
    assert_eq!(h.fake.deliver(901, "completed", false).await, 202);
    h.reconcile().await;
    assert_eq!(h.runner(&names[0]).await.state, RunnerState::Terminated);
    // 902's never does: crashed once the grace is over.
    let later = runway_server::clock::now().plus(runway_server::reconcile::COMPLETION_GRACE);
    h.reconciler.reconcile_once(later).await.unwrap();
    assert_eq!(h.runner(&names[1]).await.state, RunnerState::Crashed);
    // Counted, though a GitHub job has no lease to expire: the crash alert
    // sees GitHub pools too. The runner that finished is not counted.
    let metrics = h.metrics();
    assert!(
        metrics.contains("runway_runners_crashed_total{pool=\"gh\"} 1"),
        "{metrics}"
    );
}

/// Pool `gh` admits only octo-org's own repositories (not octo-org/secret),
/// no forks; pool `untrusted`, serving the same labels after it, admits
/// anyone (isolated machines, say).
fn trusted_and_untrusted(config: &mut Config) {
    let mut untrusted = config.pools[0].clone();
    untrusted.name = "untrusted".into();
    config.pools[0].access = Some(runway_server::config::PoolAccess {
        repositories: vec!["octo-org/*".into(), "!octo-org/secret".into()],
        forks: runway_server::config::ForksSetting::Deny,
        events: None,
    });
    config.pools.push(untrusted);
}

#[tokio::test]
async fn access_policies_send_forks_and_strangers_to_the_next_pool_and_look_each_run_up_once() {
    let h = Harness::start(4_000, trusted_and_untrusted).await;
    let cases = [
        // (job, repository, run, event, fork, pool)
        (801, "octo-org/app", 71, "push", false, "gh"),
        (802, "octo-org/app", 71, "push", false, "gh"),
        (803, "octo-org/app", 72, "pull_request", true, "untrusted"),
        (804, "octo-org/secret", 73, "push", false, "untrusted"),
        (805, "someone/else", 74, "push", false, "untrusted"),
    ];
    for (job, repository, run, event, fork, _) in cases {
        h.fake
            .queue_run_job(job, &labels(), repository, run, event, fork);
        assert_eq!(h.fake.deliver(job, "queued", false).await, 202);
    }
    for (job, repository, _, _, _, pool) in cases {
        let stored = h.wait_for_job(job).await;
        assert_eq!(
            stored.pool.as_deref(),
            Some(pool),
            "job {job} of {repository}: {stored:?}"
        );
    }
    // One lookup per run, and only where the trusted pool needed it.
    assert_eq!(
        h.fake
            .calls_starting("GET /repos/octo-org/app/actions/runs/71"),
        1
    );
    assert_eq!(
        h.fake
            .calls_starting("GET /repos/octo-org/app/actions/runs/72"),
        1
    );
    // The looked-up run also names the job's triggering event in its
    // metrics (and the event log), not the webhook's type. (It runs on a
    // runner first: a job that never had one is no completion.)
    h.fake.start_job(801, "octo-runner-1");
    assert_eq!(h.fake.deliver(801, "in_progress", false).await, 202);
    h.fake.complete_job(801, "success");
    assert_eq!(h.fake.deliver(801, "completed", false).await, 202);
    let metrics = h.metrics();
    for (rule, count) in [("fork", 1), ("repository", 2)] {
        let line = format!("runway_access_refusals_total{{pool=\"gh\",kind=\"{rule}\"}} {count}");
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("runway_jobs_completed_total") && l.contains("event=\"push\"")),
        "{metrics}"
    );
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("runway_jobs_") && l.contains("event=\"workflow_job\"")),
        "{metrics}"
    );
    assert_eq!(h.fake.invalid(), Vec::<String>::new());
}

/// The policies' globs are compiled once a configuration load, not per
/// webhook: a reload must replace them with the new configuration.
#[tokio::test]
async fn a_reload_judges_the_next_job_by_the_new_access_policy() {
    let h = Harness::start(4_000, trusted_and_untrusted).await;
    let deliver = |job: u64, run: u64| {
        h.fake
            .queue_run_job(job, &labels(), "someone/else", run, "push", false);
        h.fake.deliver(job, "queued", false)
    };
    assert_eq!(deliver(821, 91).await, 202);
    assert_eq!(h.wait_for_job(821).await.pool.as_deref(), Some("untrusted"));
    let admit_only = |glob: &str| {
        let mut config = (*h.service.config()).clone();
        config.pools[0].access = Some(runway_server::config::PoolAccess {
            repositories: vec![glob.to_owned()],
            ..Default::default()
        });
        h.service.replace_config(config);
    };
    admit_only("someone/*");
    assert_eq!(deliver(822, 92).await, 202);
    assert_eq!(h.wait_for_job(822).await.pool.as_deref(), Some("gh"));
    admit_only("octo-org/*");
    assert_eq!(deliver(823, 93).await, 202);
    assert_eq!(h.wait_for_job(823).await.pool.as_deref(), Some("untrusted"));
}

#[tokio::test]
async fn a_pool_that_denies_forks_fails_closed_when_the_run_cannot_be_looked_up() {
    let h = Harness::start(4_000, |config| {
        trusted_and_untrusted(config);
        config.pools.truncate(1);
    })
    .await;
    h.fake.lock().refuse_runs = Some(axum::http::StatusCode::BAD_GATEWAY);
    h.fake
        .queue_run_job(811, &labels(), "octo-org/app", 81, "push", false);
    // Not a decision yet: stored held (issue 58), so no outage longer
    // than GitHub's redeliveries loses it; no pool, no runner.
    assert_eq!(h.fake.deliver(811, "queued", false).await, 202);
    let held = h.wait_for_job(811).await;
    assert_eq!((held.state, held.pool.as_deref()), (JobState::Held, None));
    let reason = held.reason.clone().unwrap_or_default();
    assert!(
        reason.starts_with(runway_server::app::intake::HELD),
        "{reason}"
    );
    assert_eq!(h.reconcile().await.created, 0, "no runner on unknown facts");
    // A redelivery finds it stored.
    assert_eq!(h.fake.deliver(811, "queued", false).await, 200);
    // While GitHub still cannot say, the run is looked up again with
    // backoff: once now, not again until the backoff has passed.
    let retries = runway_server::app::intake::HeldRetries::default();
    let t0 = runway_server::clock::now();
    let looks = || {
        h.fake
            .calls_starting("GET /repos/octo-org/app/actions/runs/81")
    };
    let before = looks();
    let pass = runway_server::app::intake::held_once(&h.service, &retries, t0)
        .await
        .unwrap();
    assert_eq!((pass.held, pass.waiting, pass.released), (1, 1, 0));
    assert_eq!(looks(), before + 1);
    let soon = t0.plus(runway_server::app::intake::held::FIRST_RETRY / 2);
    runway_server::app::intake::held_once(&h.service, &retries, soon)
        .await
        .unwrap();
    assert_eq!(looks(), before + 1, "backing off");
    // GitHub answers again: the next look releases it to its pool.
    h.fake.lock().refuse_runs = None;
    let later = t0.plus(runway_server::app::intake::held::FIRST_RETRY);
    let pass = runway_server::app::intake::held_once(&h.service, &retries, later)
        .await
        .unwrap();
    assert_eq!((pass.released, pass.waiting), (1, 0));
    let admitted = h.wait_for_job(811).await;
    assert_eq!(
        (admitted.state, admitted.pool.as_deref()),
        (JobState::Queued, Some("gh"))
    );
    // A repository outside the globs says which rule refused it.
    h.fake.lock().refuse_runs = None;
    h.fake
        .queue_run_job(812, &labels(), "someone/else", 82, "push", false);
    assert_eq!(h.fake.deliver(812, "queued", false).await, 202);
    let stranger = h.wait_for_job(812).await;
    let reason = stranger.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("repository someone/else is not in [\"octo-org/*\"]"),
        "{reason}"
    );
    assert_eq!(stranger.state, JobState::Unroutable);
    assert_eq!(h.reconcile().await.created, 1, "a runner for 811 only");
    let metrics = h.metrics();
    assert!(
        metrics.contains("runway_jobs_rejected_total{reason=\"access_policy\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_runner_group_wider_than_the_pool_policy_shows_as_a_warning() {
    let h = Harness::start(4_000, |config| {
        trusted_and_untrusted(config);
        config.server.admin_tokens = vec![Secret::literal("runner-group-admin-token")];
    })
    .await;
    h.fake.lock().runner_group = ("all".into(), true);
    runway_server::app::access::check_runner_groups(&h.service)
        .await
        .unwrap();
    let pools = h.service.runner_group_warnings.lock().unwrap().clone();
    let trusted = pools.get("gh").cloned().unwrap_or_default();
    assert_eq!(trusted.len(), 2, "{trusted:?}");
    assert!(trusted[0].contains("admits every repository of octo-org"));
    assert!(trusted[1].contains("wider than the pool's forks = \"deny\""));
    let untrusted = pools.get("untrusted").cloned().unwrap_or_default();
    assert_eq!(
        untrusted.len(),
        1,
        "no repositories to widen: {untrusted:?}"
    );
    let webhooks = h.fake.lock().webhook_url.clone().unwrap();
    let base = webhooks.trim_end_matches("/webhooks/github");
    let listed = get_json(&format!("{base}/api/v1/pools"), "runner-group-admin-token").await;
    assert_eq!(listed["pools"][0]["name"], "gh");
    assert_eq!(
        listed["pools"][0]["warnings"],
        serde_json::json!(trusted),
        "GET /api/v1/pools says it"
    );
    // Narrowed at GitHub: the warnings go.
    h.fake.lock().runner_group = ("selected".into(), false);
    runway_server::app::access::check_runner_groups(&h.service)
        .await
        .unwrap();
    assert_eq!(
        h.service.runner_group_warnings.lock().unwrap().get("gh"),
        Some(&Vec::new())
    );
    assert_eq!(
        h.fake
            .calls_starting("GET /orgs/octo-org/actions/runner-groups/1"),
        4
    );
}

/// Issue 45, items 1–3: a job's triggering event labels its metrics and
/// the event log (looked up once per run in the background, or reported
/// by its runner's pre-job report when GitHub cannot say); the reports
/// give the runner's idle time and its stop's status, each event once
/// whichever source says it first; a runner that reported its job's
/// start and never its end counts as crashed, once.
#[tokio::test]
async fn the_runs_event_labels_its_job_and_runner_reports_say_idle_stop_and_crash() {
    let dir = tempfile::tempdir().unwrap();
    let event_log = dir.path().join("events.log");
    let log = event_log.display().to_string();
    let h = Harness::start(4_000, move |config| {
        config.telemetry.event_log = Some(log);
    })
    .await;
    h.fake
        .queue_run_job(811, &labels(), "octo-org/app", 81, "pull_request", false);
    h.fake
        .queue_run_job(812, &labels(), "octo-org/app", 82, "schedule", false);
    h.fake
        .queue_run_job(813, &labels(), "octo-org/app", 83, "push", false);
    // GitHub cannot say what started runs 82 and 83: only their runners can.
    h.fake.lock().runs.retain(|run, _| *run == 81);
    // Run lookups only for labels wait until GitHub has said what budget
    // is left: any call tells (here the healer's list of deliveries).
    h.healer
        .redeliver_once(&hook(), runway_server::clock::now())
        .await
        .unwrap();
    for id in [811, 812, 813] {
        assert_eq!(h.fake.deliver(id, "queued", false).await, 202);
        h.wait_for_job(id).await;
    }
    // One background lookup per run, never holding the webhook up.
    let deadline = Instant::now() + Duration::from_secs(10);
    while h
        .fake
        .calls_starting("GET /repos/octo-org/app/actions/runs/8")
        < 3
    {
        assert!(Instant::now() < deadline, "{:?}", h.fake.calls());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    h.reconcile().await;
    h.reconcile().await;
    let requests = h.provider.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 3);
    let base = h
        .fake
        .lock()
        .webhook_url
        .clone()
        .unwrap()
        .replace("/webhooks/github", "");
    let client = reqwest::Client::new();
    let report = |request: &CreateRequest, body: serde_json::Value| {
        let id = request.bootstrap["RUNWAY_RUNNER_ID"].clone();
        let token = request.bootstrap["RUNWAY_RUNNER_TOKEN"].clone();
        let url = format!("{base}/api/v1/runners/{id}/metrics");
        let client = client.clone();
        async move {
            client
                .post(url)
                .bearer_auth(token)
                .json(&body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    let unix = |t: Timestamp| t.as_millis() as f64 / 1_000.0;
    let now = runway_server::clock::now();
    // 811 starts: its run's event came from GitHub.
    h.fake.start_job(811, &requests[0].name);
    assert_eq!(h.fake.deliver(811, "in_progress", false).await, 202);
    // 812's runner reports first (idle 30 s by its clock), then GitHub.
    let pre = |run: u64, event: &str, at: Timestamp| {
        serde_json::json!({"phase": "pre-job", "workflow": "ci", "repository": "octo-org/app",
            "event": event, "workflow_run_id": run, "timestamp": unix(at)})
    };
    let started = now.plus(Duration::from_secs(30));
    assert_eq!(
        report(&requests[1], pre(82, "schedule", started)).await,
        202
    );
    h.fake.start_job(812, &requests[1].name);
    assert_eq!(h.fake.deliver(812, "in_progress", false).await, 202);
    let ended = started.plus(Duration::from_secs(90));
    let post =
        serde_json::json!({"phase": "post-job", "status": "normal", "timestamp": unix(ended)});
    assert_eq!(report(&requests[1], post).await, 202);
    for id in [811, 812] {
        h.fake.complete_job(id, "success");
        assert_eq!(h.fake.deliver(id, "completed", false).await, 202);
    }
    // 813's runner says its job started and never that it ended.
    assert_eq!(report(&requests[2], pre(83, "push", now)).await, 202);
    h.fake.start_job(813, &requests[2].name);
    assert_eq!(h.fake.deliver(813, "in_progress", false).await, 202);

    let metrics = h.metrics();
    for event in ["pull_request", "schedule", "push"] {
        assert!(
            metrics
                .lines()
                .any(|l| l.starts_with("runway_jobs_started_total")
                    && l.contains(&format!("event=\"{event}\""))),
            "{event}: {metrics}"
        );
    }
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("runway_jobs_completed_total")
                && l.contains("event=\"schedule\"")),
        "{metrics}"
    );
    // Observed once per runner: the two reports' and the webhook's (when
    // GitHub's start time is after the runner became idle).
    let observed: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("runway_runner_idle_duration_seconds_count{pool=\"gh\"} "))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!((2..=3).contains(&observed), "{metrics}");
    assert!(
        !metrics.contains("runway_runners_crashed_total{pool=\"gh\"}"),
        "{metrics}"
    );

    // Still running within the job timeout: no crash. Past it: one.
    h.reconciler
        .reconcile_once(now.plus(Duration::from_secs(600)))
        .await
        .unwrap();
    assert!(!h
        .metrics()
        .contains("runway_runners_crashed_total{pool=\"gh\"}"));
    let late = now.plus(runway_server::app::reports::JOB_TIMEOUT + Duration::from_secs(120));
    let (report_late, _) = h.reconciler.reconcile_once(late).await.unwrap();
    assert_eq!(report_late.crashed.get("gh"), Some(&1), "{report_late:?}");
    h.reconciler
        .reconcile_once(late.plus(Duration::from_secs(120)))
        .await
        .unwrap();
    assert!(
        h.metrics()
            .contains("runway_runners_crashed_total{pool=\"gh\"} 1"),
        "counted once: {}",
        h.metrics()
    );

    let logged = runway_testkit::event_log(&event_log);
    let of = |name: &str| logged.of(name);
    let starts = of("runner_start");
    let mut events: Vec<&str> = starts
        .iter()
        .map(|e| e["github_event"].as_str().unwrap())
        .collect();
    events.sort();
    assert_eq!(events, ["pull_request", "push", "schedule"], "{starts:?}");
    let scheduled = starts
        .iter()
        .find(|e| e["github_event"] == "schedule")
        .unwrap();
    assert_eq!(scheduled["timestamp"], started.as_millis() / 1_000);
    let idle = scheduled["idle"].as_u64().unwrap();
    assert!((29..=31).contains(&idle), "{scheduled}");
    let stops = of("runner_stop");
    assert_eq!(
        stops.len(),
        2,
        "811 by its webhook, 812 by its report: {stops:?}"
    );
    assert!(stops.iter().all(|e| e["status"] == "normal"), "{stops:?}");
    let reported = stops
        .iter()
        .find(|e| e["github_event"] == "schedule")
        .unwrap();
    assert_eq!(reported["duration"], 90, "{reported}");
    assert!(
        reported.get("conclusion").is_none(),
        "said by the report, not the webhook"
    );
    let installed = of("runner_installed");
    assert!(!installed.is_empty(), "{logged:?}");
    assert!(
        installed.iter().all(|e| e["timestamp"].as_i64().is_some()),
        "{installed:?}"
    );
}

/// GitHub made a runner's just-in-time registration, but its id never
/// reached the store (runway stopped, or its store failed, between
/// GitHub's answer and the write). Once its record's create is judged
/// never made, runway finds the registration by the runner's name and
/// removes it: no stale registration is left at GitHub.
#[tokio::test]
async fn a_registration_whose_id_never_reached_the_store_is_found_by_name_and_removed() {
    let h = Harness::start(4_000, |_| {}).await;
    let record = h
        .service
        .store
        .create_runner(
            &runway_core::runner::NewRunner {
                name: "gh-5eedf00d".into(),
                pool: "gh".into(),
                provider: "sim".into(),
                labels: vec![],
                stock: false,
            },
            runway_server::clock::now(),
        )
        .await
        .unwrap();
    h.fake.lock().runners.insert(
        77,
        fake_github::FakeRunner {
            name: "gh-5eedf00d".into(),
            labels: vec![],
            job: None,
            busy_shown_from: None,
        },
    );
    h.reconcile().await;
    assert!(h.runner("gh-5eedf00d").await.create_in_doubt());
    assert!(
        h.fake.runner_id("gh-5eedf00d").is_some(),
        "not before its window"
    );
    // Past list_lag (0) + boot_timeout.
    let later = runway_server::clock::now().plus(Duration::from_secs(3_600));
    h.reconciler.reconcile_once(later).await.unwrap();
    assert_eq!(
        h.fake.runner_id("gh-5eedf00d"),
        None,
        "{:?}",
        h.fake.calls()
    );
    let ended = h
        .service
        .store
        .get_runner(record.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(ended.state, RunnerState::Failed, "{ended:?}");
}

/// A webhook-fed GitHub pool's stock of stopped runners (issue 60): a
/// stock runner is prepared without a JIT configuration (nothing is
/// registered at GitHub while it is stopped), gets one minted at its
/// start when a job's `queued` webhook asks for a runner, and one retired
/// while still in the stock is never looked up at GitHub.
#[tokio::test]
async fn a_github_pools_stopped_runner_gets_its_jit_configuration_at_its_start() {
    const BOOT: Duration = Duration::from_secs(150);
    const RESUME: Duration = Duration::from_secs(20);
    let h = Harness::start(4_000, |config| {
        config.pools[0].min_stopped = 2;
        config.pools[0].max_stopped = 2;
        config.pools[0].stopped_max_age = Duration::from_secs(3_600);
        config.providers = vec![runway_server::config::ProviderConfig {
            name: "sim".into(),
            boot_seconds: (BOOT.as_secs_f64(), BOOT.as_secs_f64()),
            resume_seconds: Some(RESUME.as_secs_f64()),
            ..Default::default()
        }];
    })
    .await;
    let (reconciler, clock, sim) = common::stock_reconciler(h.service.clone(), BOOT, RESUME);
    let rounds = || async {
        for _ in 0..5 {
            reconciler.reconcile_once(clock.now()).await.unwrap();
        }
    };
    let live = || async { h.service.store.list_live_runners(Some("gh")).await.unwrap() };
    rounds().await;
    clock.advance(BOOT);
    rounds().await;
    let stocked = live().await;
    assert_eq!(stocked.len(), 2, "{stocked:?}");
    for runner in &stocked {
        assert!(
            runner.stock && runner.state == RunnerState::Stopped,
            "{runner:?}"
        );
        assert_eq!(
            h.fake.runner_id(&runner.name),
            None,
            "registered while stopped"
        );
        let boots = sim.boots(&runner.name);
        assert_eq!(boots.len(), 1);
        assert!(
            !boots[0].iter().any(|key| key == "RUNWAY_JIT_CONFIG"),
            "{boots:?}"
        );
    }
    assert_eq!(
        h.fake
            .calls_starting("POST /orgs/octo-org/actions/runners/generate-jitconfig"),
        0
    );

    h.fake.queue_job(301, &labels());
    assert_eq!(h.fake.deliver(301, "queued", false).await, 202);
    rounds().await;
    let started: Vec<runway_core::Runner> = live().await.into_iter().filter(|r| !r.stock).collect();
    assert_eq!(
        started.len(),
        1,
        "one started for the job, no cold boot: {started:?}"
    );
    let runner = &started[0];
    assert!(stocked.iter().any(|r| r.id == runner.id), "from the stock");
    let github_id = h
        .fake
        .runner_id(&runner.name)
        .expect("registered at its start");
    let boots = sim.boots(&runner.name);
    assert_eq!(boots.len(), 2, "its create, then its start");
    assert!(
        boots[1].iter().any(|key| key == "RUNWAY_JIT_CONFIG"),
        "{boots:?}"
    );
    assert_eq!(h.fake.lock().runners[&github_id].labels, LABELS);
    assert_eq!(
        h.service.store.runner_external_id(runner.id).await.unwrap(),
        Some(github_id.to_string())
    );

    // The other, still stopped, ages out: retired with no question to
    // GitHub, which has never heard of it.
    let other = stocked.iter().find(|r| r.id != runner.id).unwrap();
    clock.advance(Duration::from_secs(3_600));
    rounds().await;
    let gone = h.service.store.get_runner(other.id).await.unwrap().unwrap();
    assert!(gone.state.is_terminal(), "{gone:?}");
    assert!(
        !h.metrics().contains("operation=\"find_runner\""),
        "{:?}",
        h.fake.calls()
    );
    assert_eq!(h.fake.invalid(), Vec::<String>::new());
}
