//! The reconciler on a real store with sim providers on a virtual clock.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use runway_core::job::{NewJob, Route};
use runway_core::planner::Offer;
use runway_core::{JobSource, RunnerEvent, RunnerState, Timestamp};
use runway_providers::sim::{BootTime, SimConfig, SimProvider};
use runway_providers::{
    Clock, CreateRequest, Instance, InstanceId, ManualClock, Provider, ProviderError,
};
use runway_server::config::{Config, PoolConfig};
use runway_server::reconcile::Reconciler;
use runway_server::Service;
use runway_store::RunnerFilter;

use crate::common;

fn job(id: u32) -> NewJob {
    NewJob::api(format!("job-{id}"), "linux", &["linux"])
}

async fn service(dir: &tempfile::TempDir, pool: PoolConfig) -> Arc<Service> {
    let config = Config {
        pools: vec![pool],
        ..Config::default()
    };
    let store = common::sqlite_store(&dir.path().join("runway.db")).await;
    Arc::new(Service::new(config, store))
}

fn linux_pool(min_idle: u32, max_runners: u32) -> PoolConfig {
    PoolConfig {
        name: "linux".into(),
        labels: vec!["linux".into()],
        min_idle,
        max_runners,
        idle_grace: Duration::from_secs(60),
        ..PoolConfig::default()
    }
}

async fn count(service: &Service, state: RunnerState) -> usize {
    service
        .store
        .list_runners(&RunnerFilter {
            state: Some(state),
            pool: None,
        })
        .await
        .unwrap()
        .len()
}

#[tokio::test]
async fn scales_up_to_max_marks_ready_and_scales_down_to_min_idle_without_touching_busy_runners() {
    let dir = tempfile::tempdir().unwrap();
    let service = service(&dir, linux_pool(1, 5)).await;
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
    let sim = SimProvider::new(
        SimConfig {
            boot_time: BootTime::Fixed(Duration::from_secs(1)),
            ..SimConfig::default()
        },
        clock.clone(),
    );
    let providers: BTreeMap<String, Arc<dyn Provider>> =
        BTreeMap::from([("sim".to_owned(), Arc::new(sim) as Arc<dyn Provider>)]);
    let reconciler = Reconciler::new(service.clone(), providers);
    let mut jobs = Vec::new();
    for i in 0..8 {
        jobs.push(
            service
                .store
                .enqueue(&job(i), clock.now())
                .await
                .unwrap()
                .job,
        );
    }
    let (report, plan) = reconciler.reconcile_once(clock.now()).await.unwrap();
    assert_eq!(
        report.created, 5,
        "want = 8 + 1 warm, capped at max_runners = 5"
    );
    assert_eq!(count(&service, RunnerState::Provisioning).await, 5);
    assert_eq!(plan.waiting[&jobs[7].id].code(), "at_max_runners");
    // Why the 8 wait, per pool and reason: 5 for the runners just
    // requested, 3 beyond max_runners.
    let metrics = service.metrics.encode();
    for expected in [
        "runway_jobs_waiting{pool=\"linux\",reason=\"runner_requested\"} 5",
        "runway_jobs_waiting{pool=\"linux\",reason=\"at_max_runners\"} 3",
    ] {
        assert!(metrics.contains(expected), "{expected} in {metrics}");
    }
    let explained = runway_server::app::explain::explain_job(&service, &jobs[7])
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(
            explained,
            runway_server::app::explain::Explanation::Waiting {
                reason: runway_core::planner::WaitReason::AtMaxRunners { max_runners: 5 },
                ..
            }
        ),
        "{explained:?}"
    );
    let (again, _) = reconciler.reconcile_once(clock.now()).await.unwrap();
    assert_eq!(again.created, 0, "level-triggered: nothing more to do");

    clock.advance(Duration::from_secs(2));
    let (report, _) = reconciler.reconcile_once(clock.now()).await.unwrap();
    assert_eq!(report.marked_ready, 5);
    assert_eq!(count(&service, RunnerState::Idle).await, 5);

    // One runner takes a job; the queue is then emptied.
    let idle = service
        .store
        .list_runners(&RunnerFilter {
            state: Some(RunnerState::Idle),
            pool: None,
        })
        .await
        .unwrap();
    let busy = idle[0].id;
    service
        .store
        .apply_runner_event(
            busy,
            &RunnerEvent::JobAssigned { job: jobs[0].id },
            clock.now(),
        )
        .await
        .unwrap();
    for job in &jobs {
        service
            .store
            .cancel(job.id, "done elsewhere", clock.now())
            .await
            .unwrap();
    }
    let (report, _) = reconciler.reconcile_once(clock.now()).await.unwrap();
    assert_eq!(
        report.deleted, 0,
        "idle runners stay through the grace period"
    );
    clock.advance(Duration::from_secs(61));
    let (report, _) = reconciler.reconcile_once(clock.now()).await.unwrap();
    assert_eq!(
        (report.deleted, report.delete_refused_busy),
        (3, 0),
        "down to min_idle = 1 idle, the busy one untouched"
    );
    assert_eq!(count(&service, RunnerState::Idle).await, 1);
    assert_eq!(count(&service, RunnerState::Busy).await, 1);
    assert_eq!(count(&service, RunnerState::Terminated).await, 3);
    let metrics = service.metrics.encode();
    assert!(
        metrics.contains("runway_runners_created_total{pool=\"linux\",provider=\"sim\"} 5"),
        "{metrics}"
    );
    assert!(
        metrics.contains("runway_runner_delete_requests_total{pool=\"linux\",result=\"ok\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("runway_runners{pool=\"linux\",state=\"busy\"} 1"),
        "{metrics}"
    );
}

/// Claims perfect reliability and a low price, and fails every create.
struct Broken;

#[async_trait]
impl Provider for Broken {
    fn name(&self) -> &str {
        "broken"
    }
    async fn create(&self, _: &CreateRequest) -> Result<Instance, ProviderError> {
        Err(ProviderError::Transient {
            provider: "broken".into(),
            message: "API unavailable".into(),
        })
    }
    async fn delete(&self, _: &InstanceId) -> Result<(), ProviderError> {
        Ok(())
    }
    async fn list(&self) -> Result<Vec<Instance>, ProviderError> {
        Ok(Vec::new())
    }
    fn bid(&self, _: &str, capacity: u32) -> Vec<Offer> {
        vec![Offer {
            provider: "broken".into(),
            key: String::new(),
            capacity,
            price_per_hour: 0.01,
            boot_time: Duration::from_secs(1),
            reliability: 1.0,
        }]
    }
}

#[tokio::test]
async fn a_failing_provider_is_backed_off_and_capacity_comes_from_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let service = service(&dir, linux_pool(0, 10)).await;
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
    let steady = SimProvider::new(
        SimConfig {
            name: "steady".into(),
            price_per_hour: 1.0,
            boot_time: BootTime::Fixed(Duration::from_secs(1)),
            ..SimConfig::default()
        },
        clock.clone(),
    );
    let providers: BTreeMap<String, Arc<dyn Provider>> = BTreeMap::from([
        ("broken".to_owned(), Arc::new(Broken) as Arc<dyn Provider>),
        ("steady".to_owned(), Arc::new(steady) as Arc<dyn Provider>),
    ]);
    let reconciler = Reconciler::new(service.clone(), providers);
    let mut jobs = Vec::new();
    for i in 0..3 {
        jobs.push(
            service
                .store
                .enqueue(&job(i), clock.now())
                .await
                .unwrap()
                .job,
        );
    }
    let mut rounds = 0;
    while count(&service, RunnerState::Provisioning).await < 3 {
        rounds += 1;
        assert!(
            rounds <= 3,
            "capacity came from the second provider within three reconciles"
        );
        let (_, plan) = reconciler.reconcile_once(clock.now()).await.unwrap();
        if rounds == 1 {
            assert!(plan.actions.iter().any(|a| matches!(a, runway_core::planner::Action::Create { provider, .. } if provider == "broken")));
        }
        clock.advance(Duration::from_millis(100));
    }
    let failed = count(&service, RunnerState::Failed).await;
    assert!(
        failed >= 1,
        "the broken create was recorded as a failed runner"
    );
    let metrics = service.metrics.encode();
    assert!(
        metrics.contains("runway_provider_errors_total{provider=\"broken\",operation=\"create\"}"),
        "{metrics}"
    );
}

/// A `sim` pool (boot 1 s) with one queued job and the runner started for
/// it, booted and idle.
struct ReadyRunner {
    service: Arc<Service>,
    clock: Arc<ManualClock>,
    sim: Arc<SimProvider>,
    reconciler: Reconciler,
    queued: runway_core::Job,
    runner: runway_core::Runner,
}

async fn ready_runner(dir: &tempfile::TempDir, pool: PoolConfig) -> ReadyRunner {
    let service = service(dir, pool).await;
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
    let sim = Arc::new(SimProvider::new(
        SimConfig {
            boot_time: BootTime::Fixed(Duration::from_secs(1)),
            ..SimConfig::default()
        },
        clock.clone(),
    ));
    let providers: BTreeMap<String, Arc<dyn Provider>> =
        BTreeMap::from([("sim".to_owned(), sim.clone() as Arc<dyn Provider>)]);
    let reconciler = Reconciler::new(service.clone(), providers);
    let queued = service
        .store
        .enqueue(&job(1), clock.now())
        .await
        .unwrap()
        .job;
    reconciler.reconcile_once(clock.now()).await.unwrap();
    clock.advance(Duration::from_secs(2));
    reconciler.reconcile_once(clock.now()).await.unwrap();
    let runner = service
        .store
        .list_runners(&RunnerFilter::default())
        .await
        .unwrap()[0]
        .clone();
    assert_eq!(runner.state, RunnerState::Idle);
    ReadyRunner {
        service,
        clock,
        sim,
        reconciler,
        queued,
        runner,
    }
}

#[tokio::test]
async fn ephemeral_runners_are_removed_after_their_job_and_reusable_ones_stay() {
    for ephemeral in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let pool = PoolConfig {
            ephemeral,
            ..linux_pool(0, 5)
        };
        let ReadyRunner {
            service,
            clock,
            sim,
            reconciler,
            queued,
            runner,
        } = ready_runner(&dir, pool).await;
        service
            .store
            .apply_runner_event(
                runner.id,
                &RunnerEvent::JobAssigned { job: queued.id },
                clock.now(),
            )
            .await
            .unwrap();
        service
            .store
            .cancel(queued.id, "finished", clock.now())
            .await
            .unwrap();
        service.finish_runner_job(runner.id, clock.now()).await;
        let (report, _) = reconciler.reconcile_once(clock.now()).await.unwrap();
        let after = service.store.get_runner(runner.id).await.unwrap().unwrap();
        if ephemeral {
            assert_eq!((after.state, report.deleted), (RunnerState::Terminated, 1));
            assert!(sim.list().await.unwrap().is_empty(), "its instance is gone");
        } else {
            assert_eq!(
                (after.state, report.deleted),
                (RunnerState::Idle, 0),
                "kept through its idle grace"
            );
        }
    }
}

/// Declares perfect reliability at a low price, and fails every other create.
struct Alternating(std::sync::atomic::AtomicU32);

#[async_trait]
impl Provider for Alternating {
    fn name(&self) -> &str {
        "alternating"
    }
    async fn create(&self, request: &CreateRequest) -> Result<Instance, ProviderError> {
        let n = self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if n % 2 == 1 {
            return Err(ProviderError::Transient {
                provider: "alternating".into(),
                message: "flaky API".into(),
            });
        }
        Ok(Instance {
            id: InstanceId(format!("alt-{n}")),
            name: request.name.clone(),
            state: runway_providers::InstanceState::Pending,
        })
    }
    async fn delete(&self, _: &InstanceId) -> Result<(), ProviderError> {
        Ok(())
    }
    async fn list(&self) -> Result<Vec<Instance>, ProviderError> {
        Ok(Vec::new())
    }
    fn bid(&self, _: &str, capacity: u32) -> Vec<Offer> {
        vec![Offer {
            provider: "alternating".into(),
            key: String::new(),
            capacity,
            price_per_hour: 0.10,
            boot_time: Duration::from_secs(1),
            reliability: 1.0,
        }]
    }
}

#[tokio::test]
async fn reliability_is_learnt_from_create_outcomes() {
    let dir = tempfile::tempdir().unwrap();
    let service = service(&dir, linux_pool(0, 40)).await;
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
    let steady = SimProvider::new(
        SimConfig {
            name: "steady".into(),
            price_per_hour: 0.15,
            boot_time: BootTime::Fixed(Duration::from_secs(60)),
            ..SimConfig::default()
        },
        clock.clone(),
    );
    let providers: BTreeMap<String, Arc<dyn Provider>> = BTreeMap::from([
        (
            "alternating".to_owned(),
            Arc::new(Alternating(Default::default())) as Arc<dyn Provider>,
        ),
        ("steady".to_owned(), Arc::new(steady) as Arc<dyn Provider>),
    ]);
    let reconciler = Reconciler::new(service.clone(), providers);
    for i in 0..30 {
        service.store.enqueue(&job(i), clock.now()).await.unwrap();
    }
    // First round: the cheap provider as declared; half its creates fail.
    let (first, _) = reconciler.reconcile_once(clock.now()).await.unwrap();
    assert!(first.create_failures > 0 && first.created > 0, "{first:?}");
    // Its learnt reliability (~0.5) now makes it dearer per reliable runner
    // (0.10 / 0.5 = 0.20) than the steady provider (0.15): the rest goes there.
    reconciler.reconcile_once(clock.now()).await.unwrap();
    let by_provider = |name: &str| {
        let name = name.to_owned();
        let service = service.clone();
        async move {
            service
                .store
                .list_runners(&RunnerFilter::default())
                .await
                .unwrap()
                .into_iter()
                .filter(|r| r.provider == name && r.state == RunnerState::Provisioning)
                .count()
        }
    };
    assert!(
        by_provider("steady").await > 0,
        "capacity moved to the provider that delivers"
    );
    assert_eq!(
        by_provider("alternating").await + by_provider("steady").await,
        30
    );
    // Each offer's price, learnt reliability and create outcomes show.
    let metrics = service.metrics.encode();
    let value = |series: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("{series} in {metrics}"))
    };
    assert_eq!(
        value(r#"runway_offer_price_per_hour{provider="alternating",offer=""}"#),
        0.10
    );
    assert!(value(r#"runway_offer_reliability{provider="alternating",offer=""}"#) < 0.9);
    assert_eq!(
        value(r#"runway_offer_reliability{provider="steady",offer=""}"#),
        1.0
    );
    assert!(
        value(r#"runway_offer_creates_total{provider="alternating",offer="",result="failed"}"#)
            >= 1.0
    );
    assert!(value(r#"runway_offer_creates_total{provider="steady",offer="",result="ok"}"#) >= 1.0);
}

/// The environment a runner process wrote to `file` (KEY=VALUE lines).
fn read_env(file: &std::path::Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn self_registering_runners_adopt_their_record_and_orphans_are_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let service = service(&dir, linux_pool(1, 3)).await;
    // The pool's worker configuration: its result reaches the runner.
    service
        .store
        .put_worker_config(
            "linux",
            r#"{"id":"linux","pools":["linux"],"rules":[{"rule_id":"base","description":"image","conditions":null,"values":{"image":"ubuntu-24.04"}}]}"#,
            &["linux".to_owned()],
            runway_store::Expect::Any,
            Timestamp::from_millis(0),
        )
        .await
        .unwrap();
    let env_dir = dir.path().join("env");
    std::fs::create_dir_all(&env_dir).unwrap();
    let script = format!(
        "env > {d}/$RUNWAY_RUNNER_NAME.tmp && mv {d}/$RUNWAY_RUNNER_NAME.tmp {d}/$RUNWAY_RUNNER_NAME; exec sleep 60",
        d = env_dir.display()
    );
    let process =
        runway_providers::process::ProcessProvider::new(runway_providers::process::ProcessConfig {
            name: "local".into(),
            command: vec!["sh".into(), "-c".into(), script],
            state_dir: dir.path().join("processes"),
            stop_grace: Duration::from_secs(2),
            max_instances: 5,
            price_per_hour: 0.0,
            boot_time: Duration::from_secs(1),
            controller_id: "test-controller".into(),
            legacy_controller_id: None,
            environment_variables: Vec::new(),
        })
        .unwrap();
    let process: Arc<dyn Provider> = Arc::new(process);
    let providers = BTreeMap::from([("local".to_owned(), process.clone())]);
    let reconciler = Reconciler::new(service.clone(), providers);
    let now = Timestamp::from_millis(1_000_000);

    // min_idle = 1: one runner, its process started, its record waiting.
    let (report, plan) = reconciler.reconcile_once(now).await.unwrap();
    assert_eq!(report.created, 1, "{plan:?}");
    let runners = service
        .store
        .list_runners(&RunnerFilter::default())
        .await
        .unwrap();
    let [runner] = &runners[..] else {
        panic!("{runners:?}")
    };
    let env_file = env_dir.join(&runner.name);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !env_file.exists() {
        assert!(std::time::Instant::now() < deadline, "the runner started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let env = read_env(&env_file);
    assert_eq!(env["RUNWAY_RUNNER_NAME"], runner.name);
    assert_eq!(env["RUNWAY_RUNNER_LABELS"], "linux");
    assert_eq!(env["RUNWAY_POOL"], "linux");
    assert_eq!(env["RUNWAY_URL"], "http://127.0.0.1:8080");
    assert_eq!(env["RUNWAY_LAUNCH_CONFIG"], r#"{"image":"ubuntu-24.04"}"#);
    let token = env["RUNWAY_REGISTRATION_TOKEN"].clone();
    assert!(token.starts_with("rwr_"));

    // A running process is not yet a ready runner: it says so itself.
    reconciler
        .reconcile_once(now.plus(Duration::from_secs(1)))
        .await
        .unwrap();
    assert_eq!(count(&service, RunnerState::Provisioning).await, 1);
    let registered = service
        .store
        .register_runner(
            &runway_server::app::tokens::token_hash(&token),
            None,
            "whatever-it-calls-itself",
            &[],
            "runner-token-hash",
            now.plus(Duration::from_secs(2)),
        )
        .await
        .unwrap()
        .runner;
    assert_eq!(
        (registered.id, registered.state),
        (runner.id, RunnerState::Idle)
    );
    assert_eq!(
        service
            .store
            .list_runners(&RunnerFilter::default())
            .await
            .unwrap()
            .len(),
        1
    );

    // An instance no record accounts for is kept while a create that
    // answered late could still be adopted (its in-flight window), then
    // deleted (no GitHub pool: no registration to let go first); the
    // adopted one is kept.
    process
        .create(&CreateRequest {
            name: "linux-orphan".into(),
            offer: String::new(),
            pool: "linux".into(),
            labels: vec!["linux".into()],
            bootstrap: BTreeMap::new(),
            launch_config: serde_json::json!({}),
            instance_api: None,
            stock: false,
        })
        .await
        .unwrap();
    let (report, _) = reconciler
        .reconcile_once(now.plus(Duration::from_secs(3)))
        .await
        .unwrap();
    assert_eq!(
        (report.orphans_deleted, report.orphans_kept, report.created),
        (0, 1, 0),
        "within its window: kept"
    );
    let (report, _) = reconciler
        .reconcile_once(now.plus(Duration::from_secs(3600)))
        .await
        .unwrap();
    assert_eq!((report.orphans_deleted, report.created), (1, 0));
    let names = common::instance_names(process.as_ref()).await;
    assert_eq!(names, std::slice::from_ref(&runner.name));

    // Its process vanishes behind runway's back: the idle runner fails and is replaced.
    process
        .delete(&InstanceId(runner.name.clone()))
        .await
        .unwrap();
    let (report, _) = reconciler
        .reconcile_once(now.plus(Duration::from_secs(3601)))
        .await
        .unwrap();
    assert_eq!(report.marked_lost, 1, "a vanished idle runner fails");
    assert_eq!(report.created, 1, "and is replaced");
    for instance in process.list().await.unwrap() {
        process.delete(&instance.id).await.unwrap();
    }
}

/// A service and reconciler for one predictive pool on a `sim` provider
/// that boots in 100 s.
async fn predictive(dir: &tempfile::TempDir, mut pool: PoolConfig) -> (Arc<Service>, Reconciler) {
    pool.policy = runway_server::config::ScalingPolicy::Predictive;
    pool.providers = vec!["sim".into()];
    let store = common::sqlite_store(&dir.path().join("runway.db")).await;
    let provider = runway_server::config::ProviderConfig {
        boot_seconds: (100.0, 100.0),
        ..Default::default()
    };
    let config = Config {
        pools: vec![pool],
        providers: vec![provider],
        ..Config::default()
    };
    let service = Arc::new(Service::new(config, store));
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(0)));
    let sim = SimProvider::new(
        SimConfig {
            boot_time: BootTime::Fixed(Duration::from_secs(100)),
            ..SimConfig::default()
        },
        clock.clone(),
    );
    let providers: BTreeMap<String, Arc<dyn Provider>> =
        BTreeMap::from([("sim".to_owned(), Arc::new(sim) as Arc<dyn Provider>)]);
    let reconciler = Reconciler::new(service.clone(), providers);
    (service, reconciler)
}

/// A job routed to `linux` at `at` (a GitHub job of workflow run `run`, if
/// given) and taken at once by someone else: in the store, none queued.
async fn arrived(service: &Service, at: Timestamp, run: Option<(u64, &str)>) {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (source, payload) = match run {
        Some((run, workflow)) => (
            JobSource::Github,
            serde_json::json!({ "run_id": run, "workflow": workflow }).to_string(),
        ),
        None => (JobSource::Api, "{}".to_owned()),
    };
    let job = service
        .store
        .enqueue(
            &NewJob {
                source,
                external_id: format!("arrived-{id}"),
                route: Route::Pool("linux".into()),
                labels: vec!["linux".into()],
                payload,
                max_attempts: 3,
                share: Default::default(),
            },
            at,
        )
        .await
        .unwrap()
        .job;
    let cancel = runway_core::job::JobEvent::Cancel {
        reason: "taken elsewhere".into(),
    };
    let done = job.apply(&cancel, at).unwrap();
    assert!(service.store.replace_job(&job, &done).await.unwrap());
}

#[tokio::test]
async fn a_predictive_pool_keeps_the_expected_arrivals_warm() {
    let dir = tempfile::tempdir().unwrap();
    let mut pool = linux_pool(0, 10);
    pool.forecast_quantile = Some(0.9);
    let (service, reconciler) = predictive(&dir, pool).await;
    let at = |s: i64| Timestamp::from_millis(s * 1_000);
    // Nothing seen yet: nothing warm.
    let (report, _) = reconciler.reconcile_once(at(1_000)).await.unwrap();
    assert_eq!(report.created, 0);
    // A job every 20 s for ten minutes (taken at once by someone else:
    // none is queued now). The forecast looks 110 s ahead (the 100 s boot
    // and a 10 s round): the last hour's 110 s windows held 5 or 6 jobs,
    // so at the 0.9 quantile six are kept warm.
    for i in 0..30 {
        arrived(&service, at(1_000 + i * 20), None).await;
    }
    let (report, plan) = reconciler.reconcile_once(at(1_600)).await.unwrap();
    assert_eq!(report.created, 6, "{plan:?}");
    assert_eq!(plan.pools[0].want, 6);
}

/// A predictive pool that keeps stopped runners (issue 60) keeps its warm
/// pool stopped, not idle, as `runway sim`'s `predictive+stopped` does:
/// the same arrivals prepare a stock sized at the stopped quantile, and
/// no idle runner beyond `min_idle`.
#[tokio::test]
async fn a_predictive_pool_with_a_stock_keeps_its_warm_pool_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let mut pool = linux_pool(0, 10);
    pool.max_stopped = 20;
    let (service, reconciler) = predictive(&dir, pool).await;
    let mut config = (*service.config()).clone();
    config.providers[0].resume_seconds = Some(20.0);
    service.replace_config(config);
    let at = |s: i64| Timestamp::from_millis(s * 1_000);
    reconciler.reconcile_once(at(1_000)).await.unwrap();
    for i in 0..30 {
        arrived(&service, at(1_000 + i * 20), None).await;
    }
    let (report, plan) = reconciler.reconcile_once(at(1_600)).await.unwrap();
    let runners = service
        .store
        .list_live_runners(Some("linux"))
        .await
        .unwrap();
    let stock = runners.iter().filter(|r| r.stock).count();
    assert_eq!(stock as u32, report.created, "{runners:?}");
    // The 110 s windows held 5 or 6 jobs: at the stopped quantile (0.98),
    // six.
    assert_eq!(stock, 6, "{runners:?}");
    assert_eq!(plan.pools[0].want, 0, "no idle runner kept warm: {plan:?}");
}

/// A predictive pool learns a workflow's fan-out from the runs it saw
/// (GitHub's `run_id` and `workflow_name`, read from the store each round,
/// whichever replica took the job in) and, when a new run's first job
/// arrives, boots for the jobs that will follow it; `GET /api/v1/pools`'s
/// `warm` says so.
#[tokio::test]
async fn a_predictive_pool_boots_for_the_jobs_a_workflow_run_will_bring() {
    let dir = tempfile::tempdir().unwrap();
    let (service, reconciler) = predictive(&dir, linux_pool(0, 20)).await;
    let at = |s: i64| Timestamp::from_millis(s * 1_000);
    reconciler.reconcile_once(at(0)).await.unwrap();
    // Five runs of `ci`, two hours apart: a plan job, then six jobs 90 s
    // later. Another workflow's runs bring nothing after their first jobs.
    for run in 0..5u64 {
        let start = run as i64 * 7_200;
        arrived(&service, at(start), Some((run, "ci"))).await;
        for _ in 0..6 {
            arrived(&service, at(start + 90), Some((run, "ci"))).await;
        }
        arrived(&service, at(start + 600), Some((100 + run, "lint"))).await;
    }
    let (report, _) = reconciler.reconcile_once(at(5 * 7_200 - 10)).await.unwrap();
    assert_eq!(report.created, 0, "nothing is coming");
    // A new run's plan job: its six followers are expected within the
    // 110 s horizon (the 100 s boot and a round).
    arrived(&service, at(5 * 7_200), Some((7, "ci"))).await;
    let (report, plan) = reconciler.reconcile_once(at(5 * 7_200 + 1)).await.unwrap();
    assert_eq!(report.created, 6, "{plan:?}");
    let warm = service.warm.lock().unwrap()["linux"].clone();
    assert_eq!((warm.target, warm.forecast.following), (6, 6));
    // Once they have arrived, nothing more is expected of the run.
    for _ in 0..6 {
        arrived(&service, at(5 * 7_200 + 90), Some((7, "ci"))).await;
    }
    reconciler.reconcile_once(at(5 * 7_200 + 91)).await.unwrap();
    let warm = service.warm.lock().unwrap()["linux"].clone();
    assert_eq!(warm.forecast.following, 0);
}

/// A restarted runway (or a new leader) does not start its forecast from
/// nothing: the first round reads the predictive pools' jobs of the last
/// four weeks from the store, with their workflow runs; jobs older than
/// that are not read.
#[tokio::test]
async fn a_new_leader_seeds_its_forecast_from_the_jobs_in_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let (service, reconciler) = predictive(&dir, linux_pool(0, 20)).await;
    let at = |s: i64| Timestamp::from_millis(s * 1_000);
    let week = 7 * 86_400;
    // Long ago, a workflow whose runs brought twenty jobs each.
    for run in 0..5u64 {
        let start = run as i64 * 7_200;
        arrived(&service, at(start), Some((run, "ci"))).await;
        for _ in 0..20 {
            arrived(&service, at(start + 90), Some((run, "ci"))).await;
        }
    }
    // Within the last four weeks, its runs bring six.
    let recent = 5 * week;
    for run in 10..15u64 {
        let start = recent + run as i64 * 7_200;
        arrived(&service, at(start), Some((run, "ci"))).await;
        for _ in 0..6 {
            arrived(&service, at(start + 90), Some((run, "ci"))).await;
        }
    }
    let start = recent + 15 * 7_200;
    arrived(&service, at(start), Some((15, "ci"))).await;
    let (report, plan) = reconciler.reconcile_once(at(start + 1)).await.unwrap();
    let warm = service.warm.lock().unwrap()["linux"].clone();
    assert_eq!(warm.forecast.following, 6, "{warm:?}");
    assert_eq!(report.created, 6, "{plan:?}");
}

/// A pool made predictive by a config reload gets its forecast at the
/// next round, seeded from the store; made reactive again, it keeps only
/// `min_idle`.
#[tokio::test]
async fn a_reload_that_makes_a_pool_predictive_takes_effect_at_the_next_round() {
    let dir = tempfile::tempdir().unwrap();
    let (service, reconciler) = predictive(&dir, linux_pool(0, 20)).await;
    let reactive = || {
        let mut config = (*service.config()).clone();
        config.pools[0].policy = runway_server::config::ScalingPolicy::Runway;
        config
    };
    service.replace_config(reactive());
    let at = |s: i64| Timestamp::from_millis(s * 1_000);
    // A job every 20 s for ten minutes, while the pool is reactive.
    for i in 0..30 {
        arrived(&service, at(1_000 + i * 20), None).await;
    }
    let (report, _) = reconciler.reconcile_once(at(1_600)).await.unwrap();
    assert_eq!(report.created, 0);
    assert!(service.warm.lock().unwrap().get("linux").is_none());
    // Made predictive (the 0.9 quantile): the history is read at once.
    let mut predictive = reactive();
    predictive.pools[0].policy = runway_server::config::ScalingPolicy::Predictive;
    predictive.pools[0].forecast_quantile = Some(0.9);
    service.replace_config(predictive);
    let (report, plan) = reconciler.reconcile_once(at(1_601)).await.unwrap();
    assert_eq!(report.created, 6, "{plan:?}");
    assert_eq!(service.warm.lock().unwrap()["linux"].target, 6);
    // Reactive again: no warm pool to show.
    service.replace_config(reactive());
    reconciler.reconcile_once(at(1_602)).await.unwrap();
    assert!(service.warm.lock().unwrap().get("linux").is_none());
}

/// A history longer than one round reads (20,000 jobs) is read over
/// several rounds; the pool acts on the forecast only once all of it is
/// in, including its oldest jobs.
#[tokio::test]
async fn a_long_history_is_read_over_rounds_before_the_forecast_is_used() {
    let dir = tempfile::tempdir().unwrap();
    let mut pool = linux_pool(0, 10);
    pool.forecast_quantile = Some(0.9);
    let (service, reconciler) = predictive(&dir, pool).await;
    let at = |s: i64| Timestamp::from_millis(s * 1_000);
    // The pool's jobs come first (a job every 20 s for ten minutes), then
    // 25,000 newer jobs no pool took.
    for i in 0..30 {
        arrived(&service, at(1_000 + i * 20), None).await;
    }
    let others: Vec<NewJob> = (0..5_000)
        .map(|i| NewJob {
            route: Route::Unroutable {
                reason: "no pool".into(),
            },
            ..job(i)
        })
        .collect();
    for batch in 0..5 {
        let renamed: Vec<NewJob> = others
            .iter()
            .map(|j| NewJob {
                external_id: format!("{}-{batch}", j.external_id),
                ..j.clone()
            })
            .collect();
        service
            .store
            .enqueue_many(&renamed, at(1_599))
            .await
            .unwrap();
    }
    let (report, _) = reconciler.reconcile_once(at(1_600)).await.unwrap();
    assert_eq!(report.created, 0, "still reading");
    assert!(service.warm.lock().unwrap().get("linux").is_none());
    let (report, plan) = reconciler.reconcile_once(at(1_601)).await.unwrap();
    assert_eq!(report.created, 6, "{plan:?}");
}

/// One instance per create whose reported state the test sets; records the
/// instances it was asked to start.
#[derive(Default)]
struct Reporting {
    state: std::sync::Mutex<Option<runway_providers::InstanceState>>,
    instances: std::sync::Mutex<Vec<Instance>>,
    started: std::sync::Mutex<Vec<InstanceId>>,
}

impl Reporting {
    fn report(&self, state: runway_providers::InstanceState) {
        *self.state.lock().unwrap() = Some(state);
    }
}

#[async_trait]
impl Provider for Reporting {
    fn name(&self) -> &str {
        "reporting"
    }
    async fn create(&self, request: &CreateRequest) -> Result<Instance, ProviderError> {
        let mut instances = self.instances.lock().unwrap();
        let instance = Instance {
            id: InstanceId(format!("r-{}", instances.len())),
            name: request.name.clone(),
            state: runway_providers::InstanceState::Pending,
        };
        instances.push(instance.clone());
        Ok(instance)
    }
    async fn delete(&self, id: &InstanceId) -> Result<(), ProviderError> {
        self.instances.lock().unwrap().retain(|i| &i.id != id);
        Ok(())
    }
    async fn start(
        &self,
        id: &InstanceId,
        _fresh: Option<&CreateRequest>,
    ) -> Result<(), ProviderError> {
        self.started.lock().unwrap().push(id.clone());
        Ok(())
    }
    async fn list(&self) -> Result<Vec<Instance>, ProviderError> {
        let state = *self.state.lock().unwrap();
        Ok(self
            .instances
            .lock()
            .unwrap()
            .iter()
            .cloned()
            .map(|mut i| {
                i.state = state.unwrap_or(i.state);
                i
            })
            .collect())
    }
    fn bid(&self, _: &str, capacity: u32) -> Vec<Offer> {
        vec![Offer {
            provider: "reporting".into(),
            key: String::new(),
            capacity: capacity.min(1),
            price_per_hour: 0.10,
            boot_time: Duration::from_secs(1),
            reliability: 1.0,
        }]
    }
}

/// GARM's statuses: `unknown` changes nothing, `stopped` is started again,
/// `error` fails the runner.
#[tokio::test]
async fn unknown_instances_are_left_alone_and_stopped_ones_started_again() {
    use runway_providers::InstanceState::{Failed, Running, Stopped, Unknown};
    let dir = tempfile::tempdir().unwrap();
    let service = service(&dir, linux_pool(1, 1)).await;
    let provider = Arc::new(Reporting::default());
    let providers = BTreeMap::from([(
        "reporting".to_owned(),
        provider.clone() as Arc<dyn Provider>,
    )]);
    let reconciler = Reconciler::new(service.clone(), providers);
    let mut now = Timestamp::from_millis(1_000_000);
    let mut round = || {
        now = now.plus(Duration::from_secs(1));
        let reconciler = &reconciler;
        async move { reconciler.reconcile_once(now).await.unwrap().0 }
    };
    assert_eq!(round().await.created, 1);
    provider.report(Running);
    assert_eq!(round().await.marked_ready, 1);
    assert_eq!(count(&service, RunnerState::Idle).await, 1);

    provider.report(Unknown);
    for _ in 0..3 {
        let report = round().await;
        assert_eq!((report.marked_lost, report.created), (0, 0), "{report:?}");
    }
    assert_eq!(count(&service, RunnerState::Idle).await, 1, "left alone");
    assert!(provider.started.lock().unwrap().is_empty());

    provider.report(Stopped);
    let report = round().await;
    assert_eq!((report.marked_lost, report.created), (0, 0), "{report:?}");
    assert_eq!(count(&service, RunnerState::Idle).await, 1, "kept");
    assert_eq!(
        *provider.started.lock().unwrap(),
        [InstanceId("r-0".into())],
        "started again"
    );

    provider.report(Failed);
    assert_eq!(round().await.marked_lost, 1);
    assert_eq!(count(&service, RunnerState::Failed).await, 1);
}

/// A provider whose calls take as long as the test says; its creates then
/// succeed or fail (a call killed at its timeout).
struct Hanging {
    list_takes: Duration,
    create_takes: Duration,
    create_fails: bool,
    creates_started: std::sync::atomic::AtomicU32,
    creates_ended: std::sync::atomic::AtomicU32,
}

impl Hanging {
    fn new(list_takes: Duration, create_takes: Duration, create_fails: bool) -> Hanging {
        Hanging {
            list_takes,
            create_takes,
            create_fails,
            creates_started: Default::default(),
            creates_ended: Default::default(),
        }
    }
}

#[async_trait]
impl Provider for Hanging {
    fn name(&self) -> &str {
        "hanging"
    }
    async fn create(&self, request: &CreateRequest) -> Result<Instance, ProviderError> {
        use std::sync::atomic::Ordering::SeqCst;
        self.creates_started.fetch_add(1, SeqCst);
        tokio::time::sleep(self.create_takes).await;
        self.creates_ended.fetch_add(1, SeqCst);
        if self.create_fails {
            return Err(ProviderError::Transient {
                provider: "hanging".into(),
                message: "CreateInstance did not finish within 6s".into(),
            });
        }
        Ok(Instance {
            id: InstanceId(request.name.clone()),
            name: request.name.clone(),
            state: runway_providers::InstanceState::Pending,
        })
    }
    async fn delete(&self, _: &InstanceId) -> Result<(), ProviderError> {
        Ok(())
    }
    async fn list(&self) -> Result<Vec<Instance>, ProviderError> {
        tokio::time::sleep(self.list_takes).await;
        Ok(Vec::new())
    }
    fn bid(&self, _: &str, capacity: u32) -> Vec<Offer> {
        vec![Offer {
            provider: "hanging".into(),
            key: String::new(),
            capacity,
            price_per_hour: 0.01,
            boot_time: Duration::from_secs(1),
            reliability: 1.0,
        }]
    }
}

fn pool_on(name: &str, provider: &str) -> PoolConfig {
    PoolConfig {
        name: name.into(),
        labels: vec![name.into()],
        max_runners: 5,
        idle_grace: Duration::from_secs(60),
        providers: vec![provider.into()],
        ..PoolConfig::default()
    }
}

fn job_for(pool: &str, id: u32) -> NewJob {
    NewJob {
        route: Route::Pool(pool.into()),
        labels: vec![pool.into()],
        ..job(id)
    }
}

/// Two pools on two providers: one provider's calls hang (its list, then
/// its create), and the other pool's runner is still created in the same
/// round, which ends long before the hang does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_provider_does_not_stall_another_pools_creates() {
    const HANG: Duration = Duration::from_secs(60);
    for (list_takes, create_takes) in [(HANG, Duration::ZERO), (Duration::ZERO, HANG)] {
        let dir = tempfile::tempdir().unwrap();
        let config = Config {
            pools: vec![pool_on("fast", "steady"), pool_on("slow", "hanging")],
            ..Config::default()
        };
        let store = common::sqlite_store(&dir.path().join("runway.db")).await;
        let service = Arc::new(Service::new(config, store));
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
        let steady = SimProvider::new(
            SimConfig {
                name: "steady".into(),
                ..SimConfig::default()
            },
            clock.clone(),
        );
        let hanging = Arc::new(Hanging::new(list_takes, create_takes, false));
        let providers: BTreeMap<String, Arc<dyn Provider>> = BTreeMap::from([
            ("steady".to_owned(), Arc::new(steady) as Arc<dyn Provider>),
            ("hanging".to_owned(), hanging.clone() as Arc<dyn Provider>),
        ]);
        let reconciler = Reconciler::new(service.clone(), providers);
        for (i, pool) in ["slow", "fast"].into_iter().enumerate() {
            service
                .store
                .enqueue(&job_for(pool, i as u32), clock.now())
                .await
                .unwrap();
        }
        let started = std::time::Instant::now();
        let (report, _) = reconciler.reconcile_once(clock.now()).await.unwrap();
        assert!(
            started.elapsed() < HANG / 4,
            "the round waited {:?} for a hanging provider",
            started.elapsed()
        );
        let fast = service.store.list_live_runners(Some("fast")).await.unwrap();
        assert_eq!(
            (fast.len(), fast[0].state, report.created >= 1),
            (1, RunnerState::Provisioning, true),
            "the fast pool's runner was created in the same round ({list_takes:?}, {create_takes:?})"
        );
        // The hanging create is still under way: no second one is started
        // for the same demand in the next round.
        clock.advance(Duration::from_secs(1));
        reconciler.reconcile_once(clock.now()).await.unwrap();
        assert!(
            hanging
                .creates_started
                .load(std::sync::atomic::Ordering::SeqCst)
                <= 1
        );
    }
}

/// A create that fails after hanging until its timeout is backed off from
/// when it ended, not from the round that started it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backoff_after_a_timed_out_create_counts_from_its_end() {
    use std::sync::atomic::Ordering::SeqCst;
    const HANG: Duration = Duration::from_secs(6);
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        pools: vec![pool_on("slow", "hanging")],
        ..Config::default()
    };
    let store = common::sqlite_store(&dir.path().join("runway.db")).await;
    let service = Arc::new(Service::new(config, store));
    let hanging = Arc::new(Hanging::new(Duration::ZERO, HANG, true));
    let providers = BTreeMap::from([("hanging".to_owned(), hanging.clone() as Arc<dyn Provider>)]);
    let reconciler = Reconciler::new(service.clone(), providers);
    let start = Timestamp::from_millis(1_000_000);
    service
        .store
        .enqueue(&job_for("slow", 1), start)
        .await
        .unwrap();
    reconciler.reconcile_once(start).await.unwrap();
    assert_eq!(hanging.creates_started.load(SeqCst), 1);
    let deadline = std::time::Instant::now() + HANG * 3;
    while hanging.creates_ended.load(SeqCst) == 0 || count(&service, RunnerState::Failed).await == 0
    {
        assert!(std::time::Instant::now() < deadline, "the create ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The shortest backoff is 2.5 s: counted from the round it would be
    // over by now; counted from the create's end it is not.
    let (_, plan) = reconciler
        .reconcile_once(start.plus(HANG + Duration::from_millis(500)))
        .await
        .unwrap();
    assert_eq!(
        hanging.creates_started.load(SeqCst),
        1,
        "no create within the backoff: {plan:?}"
    );
    let reasons: Vec<_> = plan.waiting.iter().map(|(_, r)| r.code()).collect();
    assert_eq!(reasons, ["provider_backoff"], "{plan:?}");
}

/// A queue deeper than the planner lists: the rest counts towards demand,
/// waits as the last listed job waits (in "why is my job waiting?" and in
/// the gauges), and the round reads no more of it than it lists.
#[tokio::test]
async fn a_queue_deeper_than_the_planner_lists_still_counts_and_is_explained() {
    use runway_server::app::explain::{explain_job, Explanation, LISTED_QUEUE};
    let dir = tempfile::tempdir().unwrap();
    let deep = LISTED_QUEUE + 300;
    let mut pool = linux_pool(0, 5);
    pool.scaling_ratio = 1.0;
    let service = service(&dir, pool).await;
    let now = Timestamp::from_millis(1_000_000);
    let jobs: Vec<NewJob> = (0..deep).map(job).collect();
    service.store.enqueue_many(&jobs, now).await.unwrap();
    // Demand beyond the listed window still counts (the round's runners
    // stay few: max_runners 5).
    let clock = Arc::new(ManualClock::new(now));
    let sim = SimProvider::new(
        SimConfig {
            boot_time: BootTime::Fixed(Duration::from_secs(60)),
            ..SimConfig::default()
        },
        clock.clone(),
    );
    let providers: BTreeMap<String, Arc<dyn Provider>> =
        BTreeMap::from([("sim".to_owned(), Arc::new(sim) as Arc<dyn Provider>)]);
    let reconciler = Reconciler::new(service.clone(), providers);
    let (_, plan) = reconciler.reconcile_once(now).await.unwrap();
    assert_eq!(
        plan.waiting.len(),
        LISTED_QUEUE as usize,
        "only the listed get a reason"
    );
    assert_eq!(
        (plan.pools[0].queued, plan.pools[0].want),
        (deep, deep),
        "the unlisted 300 count towards demand"
    );

    // The gauges count every queued job.
    let metrics = service.metrics.encode();
    let waiting: i64 = metrics
        .lines()
        .filter(|l| l.starts_with("runway_jobs_waiting{pool=\"linux\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<i64>().ok())
        .sum();
    assert_eq!(waiting, i64::from(deep), "{metrics}");

    // The last job, far behind the listed window, is explained.
    let last = service
        .store
        .find_job(JobSource::Api, &format!("job-{}", deep - 1))
        .await
        .unwrap()
        .unwrap();
    let explained = explain_job(&service, &last).await.unwrap();
    assert!(
        matches!(explained, Some(Explanation::Waiting { .. })),
        "{explained:?}"
    );
}

/// A runway-API job's runner whose machine vanishes mid-job crashes, and
/// in the same move the job goes back to the queue at once, long before
/// its lease would have expired (a spot instance AWS took back, say).
#[tokio::test]
async fn a_job_whose_runners_machine_vanishes_is_requeued_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let ReadyRunner {
        service,
        clock,
        sim,
        reconciler,
        queued,
        runner,
    } = ready_runner(&dir, linux_pool(0, 5)).await;
    // The job starts on the runner: running under its lease, the runner busy.
    let started = service
        .store
        .claim_and_start(
            &runway_store::Claim::of_pool("linux", runner.id, 1, Duration::from_secs(600)),
            &runner,
            clock.now(),
        )
        .await
        .unwrap();
    assert!(
        matches!(&started, runway_store::ClaimStart::Started(moved) if moved.job.id == queued.id),
        "{started:?}"
    );
    // The machine goes behind runway's back, ten minutes before the lease ends.
    let instance = runner.instance_id.clone().expect("an instance");
    sim.delete(&InstanceId(instance)).await.unwrap();
    clock.advance(Duration::from_secs(1));
    reconciler.reconcile_once(clock.now()).await.unwrap();
    let runner = service.store.get_runner(runner.id).await.unwrap().unwrap();
    assert_eq!(runner.state, RunnerState::Crashed);
    let job = service.store.get_job(queued.id).await.unwrap().unwrap();
    assert_eq!(
        (job.state, job.attempts, job.runner),
        (runway_core::JobState::Queued, 1, None),
        "requeued at once: {job:?}"
    );
}

/// A cloud whose list shows an instance only `hide` after its create
/// returned (EC2's eventual consistency), with a quota it holds for creates
/// in flight (`Provider::reserve`). Every create counted.
struct Lagging {
    clock: Arc<ManualClock>,
    hide: Duration,
    quota: u32,
    state: std::sync::Mutex<LaggingState>,
}

#[derive(Default)]
struct LaggingState {
    /// (instance, when its create returned)
    instances: Vec<(Instance, Timestamp)>,
    reserved: std::collections::BTreeSet<String>,
    creates: u32,
    most_at_once: u32,
}

impl LaggingState {
    fn used(&self) -> u32 {
        (self.instances.len() + self.reserved.len()) as u32
    }
}

#[async_trait]
impl Provider for Lagging {
    fn name(&self) -> &str {
        "lagging"
    }
    fn reserve(&self, name: &str) -> Result<(), ProviderError> {
        let mut state = self.state.lock().unwrap();
        if state.used() >= self.quota {
            return Err(ProviderError::Quota {
                provider: "lagging".into(),
                limit: self.quota,
            });
        }
        state.reserved.insert(name.to_owned());
        Ok(())
    }
    fn unreserve(&self, name: &str) {
        self.state.lock().unwrap().reserved.remove(name);
    }
    async fn create(&self, request: &CreateRequest) -> Result<Instance, ProviderError> {
        let mut state = self.state.lock().unwrap();
        if !state.reserved.remove(&request.name) && state.used() >= self.quota {
            return Err(ProviderError::Quota {
                provider: "lagging".into(),
                limit: self.quota,
            });
        }
        let instance = Instance {
            id: InstanceId(format!("i-{}", request.name)),
            name: request.name.clone(),
            state: runway_providers::InstanceState::Running,
        };
        state.instances.push((instance.clone(), self.clock.now()));
        state.creates += 1;
        state.most_at_once = state.most_at_once.max(state.instances.len() as u32);
        Ok(instance)
    }
    async fn delete(&self, id: &InstanceId) -> Result<(), ProviderError> {
        self.state
            .lock()
            .unwrap()
            .instances
            .retain(|(i, _)| &i.id != id);
        Ok(())
    }
    async fn list(&self) -> Result<Vec<Instance>, ProviderError> {
        let now = self.clock.now();
        Ok(self
            .state
            .lock()
            .unwrap()
            .instances
            .iter()
            .filter(|(_, at)| now.since(*at) >= self.hide)
            .map(|(i, _)| i.clone())
            .collect())
    }
    fn bid(&self, _: &str, capacity: u32) -> Vec<Offer> {
        let used = self.state.lock().unwrap().used();
        runway_providers::quota_offer(
            "lagging",
            self.quota,
            used,
            capacity,
            0.1,
            Duration::from_secs(60),
            1.0,
        )
    }
    fn runners_register(&self) -> bool {
        true
    }
}

/// Each new instance is missing from the list for `hide`; the provider
/// declares `list_lag`. With the lag covered: one launch per job, never
/// over the quota, no runner failed. With `list_lag` 0 (the old
/// behaviour) the same weather fails runners and launches again: the test
/// can fail.
#[tokio::test]
async fn instances_a_lagging_list_does_not_show_yet_are_not_vanished() {
    for (hide_secs, list_lag_secs, holds) in
        [(1, 10, true), (2, 10, true), (5, 10, true), (2, 0, false)]
    {
        let dir = tempfile::tempdir().unwrap();
        let mut declared = runway_server::config::ProviderConfig::new(
            "lagging",
            runway_providers::factory::ProviderKind::Sim {
                fail_rate: 0.0,
                seed: 0,
            },
        );
        declared.list_lag = Duration::from_secs(list_lag_secs);
        let config = Config {
            pools: vec![PoolConfig {
                providers: vec!["lagging".into()],
                ..linux_pool(0, 10)
            }],
            providers: vec![declared],
            ..Config::default()
        };
        let store = common::sqlite_store(&dir.path().join("runway.db")).await;
        let service = Arc::new(Service::new(config, store));
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
        let cloud = Arc::new(Lagging {
            clock: clock.clone(),
            hide: Duration::from_secs(hide_secs),
            quota: 3,
            state: Default::default(),
        });
        let providers: BTreeMap<String, Arc<dyn Provider>> =
            BTreeMap::from([("lagging".to_owned(), cloud.clone() as Arc<dyn Provider>)]);
        let reconciler = Reconciler::new(service.clone(), providers);
        for i in 0..5 {
            service.store.enqueue(&job(i), clock.now()).await.unwrap();
        }
        // Twelve seconds of rounds every 300 ms.
        for _ in 0..40 {
            reconciler.reconcile_once(clock.now()).await.unwrap();
            clock.advance(Duration::from_millis(300));
        }
        let failed = count(&service, RunnerState::Failed).await;
        let state = cloud.state.lock().unwrap();
        let fine = (state.creates, state.most_at_once, failed) == (3, 3, 0);
        assert_eq!(
            fine, holds,
            "hidden {hide_secs}s, list_lag {list_lag_secs}s: {} launches for 5 jobs at quota 3, {} at once, {failed} runners failed",
            state.creates, state.most_at_once
        );
        assert!(state.most_at_once <= 3, "over the quota");
    }
}

/// A runner record written by a replica that stopped (or lost the lead)
/// around its create — a create batch writes every record first, and the
/// call may have gone out — has an unknown outcome: it stays in flight,
/// holding its place under `max_runners` but not counted as booting, so
/// its job gets a runner at once; an instance that appears with its name
/// within the in-flight window (`list_lag` + `boot_timeout`) is adopted;
/// past the window with none, it is failed as never made.
#[tokio::test]
async fn a_runner_whose_create_was_cut_off_is_in_doubt_then_adopted_or_failed() {
    for appears in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let mut pool = linux_pool(0, 5);
        pool.boot_timeout = Duration::from_secs(300);
        let service = service(&dir, pool).await;
        let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
        let sim = Arc::new(SimProvider::new(
            SimConfig {
                boot_time: BootTime::Fixed(Duration::from_secs(30)),
                ..SimConfig::default()
            },
            clock.clone(),
        ));
        let providers: BTreeMap<String, Arc<dyn Provider>> =
            BTreeMap::from([("sim".to_owned(), sim.clone() as Arc<dyn Provider>)]);
        service.store.enqueue(&job(1), clock.now()).await.unwrap();
        // What a deposed replica left: a record for the job, its create's
        // outcome unknown.
        let left = service
            .store
            .create_runner(
                &runway_core::runner::NewRunner {
                    name: "linux-deadbeef".into(),
                    pool: "linux".into(),
                    provider: "sim".into(),
                    labels: vec!["linux".into()],
                    stock: false,
                },
                clock.now(),
            )
            .await
            .unwrap();
        clock.advance(Duration::from_secs(1));
        let reconciler = Reconciler::new(service.clone(), providers);
        let (report, _) = reconciler.reconcile_once(clock.now()).await.unwrap();
        let seen = service.store.get_runner(left.id).await.unwrap().unwrap();
        assert_eq!(seen.state, RunnerState::Requested, "{seen:?}");
        assert!(seen.create_in_doubt(), "{seen:?}");
        assert_eq!(
            (report.created, report.creates_in_doubt),
            (1, 1),
            "the job's runner, in the same round: {report:?}"
        );
        if appears {
            // The cut-off create made its instance after all.
            sim.create(&CreateRequest {
                name: "linux-deadbeef".into(),
                pool: "linux".into(),
                ..CreateRequest::default()
            })
            .await
            .unwrap();
        }
        // Still within its window: nothing concluded.
        clock.advance(Duration::from_secs(200));
        let (report, _) = reconciler.reconcile_once(clock.now()).await.unwrap();
        let seen = service.store.get_runner(left.id).await.unwrap().unwrap();
        if appears {
            assert_eq!(report.adopted, 1, "{report:?}");
            assert_eq!(seen.state, RunnerState::Provisioning, "{seen:?}");
            assert!(seen.instance_id.is_some() && seen.reason.is_none());
            continue;
        }
        assert_eq!(seen.state, RunnerState::Requested, "{seen:?}");
        // Past list_lag (0) + boot_timeout since it was first seen.
        clock.advance(Duration::from_secs(101));
        reconciler.reconcile_once(clock.now()).await.unwrap();
        let seen = service.store.get_runner(left.id).await.unwrap().unwrap();
        assert_eq!(seen.state, RunnerState::Failed, "{seen:?}");
        assert!(
            seen.reason
                .as_deref()
                .unwrap_or_default()
                .contains("never made"),
            "{seen:?}"
        );
    }
}

/// `[pools.share] max_running = 2`: of repository A's 6 queued jobs only
/// 2 count as demand (a webhook pool's runners take whatever GitHub hands
/// them, so the cap limits the runners runway starts for a key), B's one
/// counts too; A's others wait with the reason `key_at_cap`.
#[tokio::test]
async fn the_cap_per_key_limits_the_runners_started_for_one_key() {
    let dir = tempfile::tempdir().unwrap();
    let mut pool = linux_pool(0, 10);
    pool.share = Some(runway_server::config::PoolShare {
        max_running: Some(2),
        ..Default::default()
    });
    let service = service(&dir, pool).await;
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
    let sim = SimProvider::new(SimConfig::default(), clock.clone());
    let providers: BTreeMap<String, Arc<dyn Provider>> =
        BTreeMap::from([("sim".to_owned(), Arc::new(sim) as Arc<dyn Provider>)]);
    let reconciler = Reconciler::new(service.clone(), providers);
    let keyed = |id: u32, key: &str| NewJob {
        source: JobSource::Github,
        share: runway_core::share::Share::new(key, Default::default()),
        ..job(id)
    };
    let mut a = Vec::new();
    for i in 0..6 {
        let stored = service
            .store
            .enqueue(&keyed(i, "octo/a"), clock.now())
            .await;
        a.push(stored.unwrap().job);
    }
    let b = service
        .store
        .enqueue(&keyed(100, "octo/b"), clock.now())
        .await
        .unwrap()
        .job;
    let (report, plan) = reconciler.reconcile_once(clock.now()).await.unwrap();
    assert_eq!(report.created, 3, "2 for A (its cap), 1 for B");
    assert_eq!(plan.waiting[&a[5].id].code(), "key_at_cap");
    assert_eq!(plan.waiting[&b.id].code(), "runner_requested");
    let explained = runway_server::app::explain::explain_job(&service, &a[4])
        .await
        .unwrap()
        .unwrap();
    assert!(
        format!("{explained:?}").contains("KeyAtCap"),
        "{explained:?}"
    );
}

/// A provider that records each create's launch configuration; its
/// instances boot for ever.
#[derive(Default)]
struct Recording(std::sync::Mutex<Vec<(serde_json::Value, Instance)>>);

#[async_trait]
impl Provider for Recording {
    fn name(&self) -> &str {
        "garm"
    }
    async fn create(&self, request: &CreateRequest) -> Result<Instance, ProviderError> {
        let mut seen = self.0.lock().unwrap();
        let instance = Instance {
            id: InstanceId(format!("rec-{}", seen.len())),
            name: request.name.clone(),
            state: runway_providers::InstanceState::Pending,
        };
        seen.push((request.launch_config.clone(), instance.clone()));
        Ok(instance)
    }
    async fn delete(&self, _: &InstanceId) -> Result<(), ProviderError> {
        Ok(())
    }
    async fn list(&self) -> Result<Vec<Instance>, ProviderError> {
        Ok(self
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|(_, i)| i.clone())
            .collect())
    }
    fn bid(&self, _: &str, capacity: u32) -> Vec<Offer> {
        vec![Offer {
            provider: "garm".into(),
            key: String::new(),
            capacity,
            price_per_hour: 0.01,
            boot_time: Duration::from_secs(60),
            reliability: 1.0,
        }]
    }
}

/// Issue 45, items 10 and 11: the pool's worker configuration sets the
/// planner's scaling ratio (`scalingRatio`, RFC 124), and a provider's
/// configured `inputs` reach the evaluation of every launch through it (a
/// GARM provider has no offers to say its zone).
#[tokio::test]
async fn worker_configurations_set_the_scaling_ratio_and_provider_inputs_reach_launches() {
    use runway_server::config::ProviderConfig;
    let dir = tempfile::tempdir().unwrap();
    let mut pool = linux_pool(0, 50);
    pool.providers = vec!["garm".into()];
    pool.scaling_ratio = 1.0;
    let garm = ProviderConfig {
        name: "garm".into(),
        conditions: vec!["availabilityZone".into()],
        inputs: BTreeMap::from([("availabilityZone".to_owned(), "zone-b".to_owned())]),
        ..ProviderConfig::default()
    };
    let config = Config {
        pools: vec![pool],
        providers: vec![garm],
        ..Config::default()
    };
    let store = common::sqlite_store(&dir.path().join("runway.db")).await;
    let service = Arc::new(Service::new(config, store));
    let body = |ratio: f64| {
        serde_json::json!({
            "id": "linux",
            "pools": ["linux"],
            "rules": [
                {"rule_id": "base", "description": "", "conditions": null,
                 "values": {"scalingRatio": ratio}},
                {"rule_id": "zone-b", "description": "",
                 "conditions": [{"provider": "garm", "availabilityZone": "zone-b"}],
                 "values": {"image": "img-b"}},
                {"rule_id": "zone-a", "description": "",
                 "conditions": [{"availabilityZone": "zone-a"}],
                 "values": {"image": "img-a", "scalingRatio": 3}}
            ]
        })
        .to_string()
    };
    let now = Timestamp::from_millis(1_000_000);
    let version = service
        .store
        .put_worker_config(
            "linux",
            &body(0.25),
            &["linux".into()],
            runway_store::Expect::Any,
            now,
        )
        .await
        .unwrap();
    let recording = Arc::new(Recording::default());
    let providers: BTreeMap<String, Arc<dyn Provider>> =
        BTreeMap::from([("garm".to_owned(), recording.clone() as Arc<dyn Provider>)]);
    let reconciler = Reconciler::new(service.clone(), providers);
    let jobs: Vec<NewJob> = (0..8).map(job).collect();
    service.store.enqueue_many(&jobs, now).await.unwrap();
    let (report, plan) = reconciler.reconcile_once(now).await.unwrap();
    // ceil(8 × 0.25), not the pool's own 1.0 (nor zone-a's 3: the
    // provider's zone is zone-b).
    assert_eq!(report.created, 2, "{plan:?}");
    let waiting = plan
        .waiting
        .iter()
        .filter(|(_, w)| w.code() == "scaling_ratio")
        .count();
    assert_eq!(waiting, 6, "the other six wait for the ratio");
    for (launch, _) in recording.0.lock().unwrap().iter() {
        assert_eq!(launch["image"], "img-b", "{launch}");
        assert_eq!(launch["scalingRatio"], 0.25, "{launch}");
    }
    // A new version of the configuration applies at the next round.
    service
        .store
        .put_worker_config(
            "linux",
            &body(1.0),
            &["linux".into()],
            runway_store::Expect::Version(version),
            now,
        )
        .await
        .unwrap();
    let (report, _) = reconciler
        .reconcile_once(Timestamp::from_millis(1_001_000))
        .await
        .unwrap();
    assert_eq!(report.created, 6, "8 queued at ratio 1, 2 already booting");
}

/// Issue 47: a predictive pool recognises a nightly batch whose start
/// drifts (30 jobs queued over a minute, starting a few minutes later each
/// night) from its store, warms its runners one horizon before its
/// earliest start on the fourth night, and says so: `warm` in
/// `GET /api/v1/pools` lists the batch, and a job waiting for one of those
/// runners is explained as "kept warm for the batch expected at 02:00 UTC".
#[tokio::test]
async fn a_drifting_nightly_batch_is_kept_warm_for_and_explained() {
    use tower::ServiceExt;
    let dir = tempfile::tempdir().unwrap();
    let (service, reconciler) = predictive(&dir, linux_pool(0, 50)).await;
    let mut config = (*service.config()).clone();
    config.server.admin_tokens = vec![runway_server::config::Secret::literal("admin-token")];
    service.replace_config(config);
    let at = |s: i64| Timestamp::from_millis(s * 1_000);
    let day = 86_400;
    // The fourth night is now (explaining a job reads the wall clock):
    // its batch is due 100 s from now, at a whole five minutes (the cron's
    // minute), the first three nights' at that time, 170 s later and 340 s
    // later. The horizon is the 100 s boot and a 10 s round.
    let now = runway_server::clock::now().as_millis() / 1_000;
    let due = (now + 100 + 299) / 300 * 300;
    let when = due - 100;
    for night in 0..3 {
        let start = due - (3 - night) * day + night * 170;
        for i in 0..30 {
            arrived(&service, at(start + 2 * i), None).await;
        }
    }
    let (report, plan) = reconciler.reconcile_once(at(when)).await.unwrap();
    let warm = service.warm.lock().unwrap()["linux"].clone();
    assert_eq!(warm.forecast.batch, 30, "{warm:?}");
    assert_eq!(report.created, 30, "{plan:?}");
    let why = warm.why().unwrap();
    let clock = format!("{} UTC", runway_server::clock::hh_mm(at(due)));
    assert!(
        why.contains(&format!(
            "kept warm for the batch expected at {clock} (30 jobs"
        )),
        "{why}"
    );

    let request = axum::http::Request::get("/api/v1/pools")
        .header("authorization", "Bearer admin-token")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = runway_server::http::router(service.clone())
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    let pools: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let warm = &pools["pools"][0]["warm"];
    assert_eq!(warm["target"], 30, "{warm}");
    let batch = &warm["batches"][0];
    assert_eq!(batch["jobs"], 30, "{warm}");
    assert_eq!(batch["warm"], true);
    assert_eq!(batch["seen"], 3);
    let rfc3339 = |t: Timestamp| runway_server::clock::rfc3339(t);
    assert_eq!(batch["earliest"], rfc3339(at(due)));
    assert_eq!(batch["latest"], rfc3339(at(due + 340)));

    // A job queued now waits for one of those runners: its explanation
    // says why the runner is there.
    let job = service
        .store
        .enqueue(&job(1), at(when + 1))
        .await
        .unwrap()
        .job;
    let explained = runway_server::app::explain::explain_job(&service, &job)
        .await
        .unwrap()
        .unwrap();
    let runway_server::app::explain::Explanation::Waiting { warm, .. } = explained else {
        panic!("{explained:?}");
    };
    assert!(
        warm.as_deref()
            .is_some_and(|w| w.contains(&format!("the batch expected at {clock}"))),
        "{warm:?}"
    );
}

/// A record left `terminating` with no instance (a scale-down of a runner
/// whose create never answered) is ended once its in-flight window has
/// passed with no instance under its name, not kept forever.
#[tokio::test]
async fn a_terminating_record_with_no_instance_ends_after_its_window() {
    let dir = tempfile::tempdir().unwrap();
    let mut pool = linux_pool(0, 5);
    pool.boot_timeout = Duration::from_secs(60);
    let service = service(&dir, pool).await;
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(1_000_000)));
    let sim = Arc::new(SimProvider::new(SimConfig::default(), clock.clone()));
    let providers: BTreeMap<String, Arc<dyn Provider>> =
        BTreeMap::from([("sim".to_owned(), sim as Arc<dyn Provider>)]);
    let runner = service
        .store
        .create_runner(
            &runway_core::runner::NewRunner {
                name: "linux-0badf00d".into(),
                pool: "linux".into(),
                provider: "sim".into(),
                labels: vec!["linux".into()],
                stock: false,
            },
            clock.now(),
        )
        .await
        .unwrap();
    service
        .store
        .apply_runner_event(runner.id, &RunnerEvent::TerminateRequested, clock.now())
        .await
        .unwrap();
    let reconciler = Reconciler::new(service.clone(), providers);
    clock.advance(Duration::from_secs(1));
    reconciler.reconcile_once(clock.now()).await.unwrap();
    let seen = service.store.get_runner(runner.id).await.unwrap().unwrap();
    assert_eq!(seen.state, RunnerState::Terminating, "within its window");
    clock.advance(Duration::from_secs(61));
    reconciler.reconcile_once(clock.now()).await.unwrap();
    let seen = service.store.get_runner(runner.id).await.unwrap().unwrap();
    assert_eq!(seen.state, RunnerState::Terminated, "{seen:?}");
}
