//! A pool's stock of stopped runners (issue 60) in the reconciler, on a
//! real store with the `sim` provider on a virtual clock: prepared, stopped
//! once up, started for a queued job instead of a cold boot, replaced,
//! retired past their age, and a refused start falling back to a cold boot.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use runway_core::job::NewJob;
use runway_core::planner::WaitReason;
use runway_core::{Runner, RunnerState};
use runway_providers::sim::SimProvider;
use runway_providers::{Clock, ManualClock, Provider};
use runway_server::config::{Config, PoolConfig, ProviderConfig};
use runway_server::reconcile::Reconciler;
use runway_server::Service;

use crate::common;

const BOOT: Duration = Duration::from_secs(150);
const RESUME: Duration = Duration::from_secs(20);

struct Stock {
    service: Arc<Service>,
    reconciler: Reconciler,
    clock: Arc<ManualClock>,
    sim: Arc<SimProvider>,
    _dir: tempfile::TempDir,
}

async fn stock(min_stopped: u32, max_stopped: u32, max_age: Duration) -> Stock {
    stock_with(min_stopped, max_stopped, max_age, Duration::from_secs(600)).await
}

async fn stock_with(
    min_stopped: u32,
    max_stopped: u32,
    max_age: Duration,
    boot_timeout: Duration,
) -> Stock {
    let dir = tempfile::tempdir().unwrap();
    let provider = ProviderConfig {
        name: "sim".into(),
        boot_seconds: (BOOT.as_secs_f64(), BOOT.as_secs_f64()),
        resume_seconds: Some(RESUME.as_secs_f64()),
        ..ProviderConfig::default()
    };
    let pool = PoolConfig {
        name: "linux".into(),
        labels: vec!["linux".into()],
        max_runners: 10,
        min_stopped,
        max_stopped,
        stopped_max_age: max_age,
        boot_timeout,
        ..PoolConfig::default()
    };
    let config = Config {
        pools: vec![pool],
        providers: vec![provider],
        ..Config::default()
    };
    let store = common::sqlite_store(&dir.path().join("runway.db")).await;
    let service = Arc::new(Service::new(config, store));
    let (reconciler, clock, sim) = common::stock_reconciler(service.clone(), BOOT, RESUME);
    Stock {
        service,
        reconciler,
        clock,
        sim,
        _dir: dir,
    }
}

impl Stock {
    /// A few rounds at now: the provider's list, taken by one round, is
    /// acted on by the next.
    async fn rounds(&self) -> runway_server::reconcile::Report {
        let mut total = runway_server::reconcile::Report::default();
        for _ in 0..5 {
            let (report, _) = self
                .reconciler
                .reconcile_once(self.clock.now())
                .await
                .unwrap();
            total.created += report.created;
            total.create_failures += report.create_failures;
            total.deleted += report.deleted;
        }
        total
    }

    async fn runners(&self) -> Vec<Runner> {
        self.service
            .store
            .list_live_runners(Some("linux"))
            .await
            .unwrap()
    }

    async fn runner(&self, id: runway_core::RunnerId) -> Runner {
        self.service.store.get_runner(id).await.unwrap().unwrap()
    }

    async fn in_state(&self, stock: bool, state: RunnerState) -> usize {
        self.runners()
            .await
            .iter()
            .filter(|r| r.stock == stock && r.state == state)
            .count()
    }

    async fn enqueue(&self, id: &str) -> runway_core::Job {
        self.service
            .store
            .enqueue(&NewJob::api(id, "linux", &["linux"]), self.clock.now())
            .await
            .unwrap()
            .job
    }

    /// Why job `job` waits now.
    async fn waiting(&self, job: &runway_core::Job) -> Option<WaitReason> {
        let job = self.service.store.get_job(job.id).await.unwrap().unwrap();
        match runway_server::app::explain::explain_job(&self.service, &job)
            .await
            .unwrap()
        {
            Some(runway_server::app::explain::Explanation::Waiting { reason, .. }) => Some(reason),
            _ => None,
        }
    }
}

/// A stock prepared and stopped; its runners.
async fn stopped_stock(count: u32, max_age: Duration) -> (Stock, Vec<Runner>) {
    let stock = stock(count, count, max_age).await;
    stock.rounds().await;
    stock.clock.advance(BOOT);
    stock.rounds().await;
    let stopped = stock.runners().await;
    assert!(
        stopped.iter().all(|r| r.state == RunnerState::Stopped) && stopped.len() == count as usize,
        "{stopped:?}"
    );
    (stock, stopped)
}

#[tokio::test]
async fn a_queued_job_is_served_by_a_started_stopped_runner_not_a_cold_boot() {
    let stock = stock(2, 2, Duration::from_secs(86_400)).await;
    let report = stock.rounds().await;
    assert_eq!(report.created, 2, "the stock is prepared");
    assert_eq!(stock.in_state(true, RunnerState::Provisioning).await, 2);
    stock.clock.advance(BOOT);
    stock.rounds().await;
    assert_eq!(
        stock.in_state(true, RunnerState::Stopped).await,
        2,
        "{:?}",
        stock.runners().await
    );
    // Stopped instances are off the provider's quota.
    let listed = stock.sim.list().await.unwrap();
    assert!(listed
        .iter()
        .all(|i| i.state == runway_providers::InstanceState::Stopped));

    let job = stock.enqueue("job-1").await;
    let report = stock.rounds().await;
    let runners = stock.runners().await;
    let started: Vec<&Runner> = runners.iter().filter(|r| !r.stock).collect();
    assert_eq!(started.len(), 1, "one started, no cold boot: {runners:?}");
    assert_eq!(started[0].state, RunnerState::Provisioning);
    assert_eq!(started[0].requested_at, stock.clock.now(), "requested anew");
    assert_eq!(report.created, 1, "one prepared to replace it");
    // Its create had no job's bootstrap; its start got one of its own.
    assert_eq!(stock.sim.boots(&started[0].name).len(), 2);
    // The job says what it waits for, and for how long.
    assert_eq!(
        stock.waiting(&job).await,
        Some(WaitReason::StoppedRunnerStarting {
            runner: started[0].id,
            ready_by: stock.clock.now().plus(RESUME),
        })
    );
    stock.clock.advance(RESUME);
    stock.rounds().await;
    let runners = stock.runners().await;
    let started = runners.iter().find(|r| !r.stock).unwrap();
    assert_eq!(started.state, RunnerState::Idle, "ready in resume_seconds");
    assert!(stock
        .service
        .metrics
        .encode()
        .contains("runway_stopped_runner_starts_total{pool=\"linux\",kind=\"started\"} 1"));
}

#[tokio::test]
async fn stopped_runners_past_their_age_are_replaced() {
    let (stock, first) = stopped_stock(1, Duration::from_secs(3_600)).await;
    stock.clock.advance(Duration::from_secs(3_600));
    stock.rounds().await;
    let runners = stock.runners().await;
    assert!(
        runners.iter().all(|r| r.id != first[0].id),
        "the aged one is gone: {runners:?}"
    );
    assert_eq!(runners.len(), 1, "and replaced: {runners:?}");
}

#[tokio::test]
async fn a_stopped_runner_deleted_underneath_is_replaced_and_its_job_cold_boots() {
    let (stock, stopped) = stopped_stock(1, Duration::from_secs(86_400)).await;
    let instance = runway_providers::InstanceId(stopped[0].instance_id.clone().unwrap());
    stock.sim.delete(&instance).await.unwrap();
    stock.enqueue("job-1").await;
    stock.rounds().await;
    let ended = stock.runner(stopped[0].id).await;
    assert_eq!(ended.state, RunnerState::Failed, "{ended:?}");
    let runners = stock.runners().await;
    assert_eq!(
        (
            stock.in_state(false, RunnerState::Provisioning).await,
            stock.in_state(true, RunnerState::Provisioning).await
        ),
        (1, 1),
        "a cold boot for the job and a replacement in the stock: {runners:?}"
    );
}

#[tokio::test]
async fn a_start_refused_for_capacity_falls_back_to_a_cold_boot() {
    let (stock, stopped) = stopped_stock(1, Duration::from_secs(86_400)).await;
    // Something else takes the provider's last slots: the start is refused
    // (EC2's InsufficientInstanceCapacity, a quota).
    let mut outside = Vec::new();
    for i in 0..100 {
        let request = runway_providers::CreateRequest {
            name: format!("outside-{i}"),
            pool: "other".into(),
            offer: String::new(),
            labels: vec![],
            bootstrap: BTreeMap::new(),
            launch_config: Default::default(),
            instance_api: None,
            stock: false,
        };
        match stock.sim.create(&request).await {
            Ok(instance) => outside.push(instance.id),
            Err(_) => break,
        }
    }
    stock.enqueue("job-1").await;
    let report = stock.rounds().await;
    assert!(report.create_failures >= 1, "{report:?}");
    let ended = stock.runner(stopped[0].id).await;
    assert_eq!(ended.state, RunnerState::Failed, "{ended:?}");
    assert!(
        ended
            .reason
            .as_deref()
            .unwrap_or("")
            .contains("start of its stopped instance refused"),
        "{ended:?}"
    );
    assert!(stock
        .service
        .metrics
        .encode()
        .contains("runway_stopped_runner_starts_total{pool=\"linux\",kind=\"refused\"} 1"));
    // Capacity back: the job gets a cold boot at once.
    for id in &outside {
        stock.sim.delete(id).await.unwrap();
    }
    stock.rounds().await;
    assert_eq!(
        stock.in_state(false, RunnerState::Provisioning).await,
        1,
        "{:?}",
        stock.runners().await
    );
}

/// runway stopped between a runner's start on record and its provider's
/// start: the next rounds find its machine still stopped and start it, with
/// a bootstrap minted anew, once.
#[tokio::test]
async fn a_start_on_record_that_never_reached_the_provider_is_made_again() {
    let (stock, stopped) = stopped_stock(1, Duration::from_secs(86_400)).await;
    let runner = &stopped[0];
    stock.enqueue("job-1").await;
    stock
        .service
        .store
        .apply_runner_event(
            runner.id,
            &runway_core::RunnerEvent::StartRequested,
            stock.clock.now(),
        )
        .await
        .unwrap();
    // Judged by a list taken after its start on record.
    stock.clock.advance(Duration::from_secs(1));
    stock.rounds().await;
    assert_eq!(stock.sim.boots(&runner.name).len(), 2, "started once");
    stock.clock.advance(RESUME);
    stock.rounds().await;
    assert_eq!(stock.runner(runner.id).await.state, RunnerState::Idle);
    assert_eq!(stock.sim.boots(&runner.name).len(), 2, "and not again");
}

/// A stock runner whose first boot outlasts the pool's boot timeout (it
/// never comes up to be stopped): failed with the reason, and replaced.
#[tokio::test]
async fn a_stock_runner_that_never_comes_up_is_failed_and_replaced() {
    let stock = stock_with(1, 1, Duration::from_secs(86_400), Duration::from_secs(100)).await;
    stock.rounds().await;
    let first = stock.runners().await;
    assert_eq!(first.len(), 1);
    stock.clock.advance(Duration::from_secs(101));
    stock.rounds().await;
    let ended = stock.runner(first[0].id).await;
    assert_eq!(ended.state, RunnerState::Failed, "{ended:?}");
    assert!(
        ended
            .reason
            .as_deref()
            .unwrap_or_default()
            .contains("boot_timeout"),
        "{ended:?}"
    );
    let runners = stock.runners().await;
    assert!(
        runners.iter().any(|r| r.stock && r.id != first[0].id),
        "replaced: {runners:?}"
    );
}
