//! The provider conformance suite. Every provider runs the same cases; a
//! provider's harness gives the suite the provider, a way to let time pass
//! until booting instances are ready, and the provider's quota.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use runway_core::Timestamp;
use runway_providers::sim::{BootTime, SimConfig, SimProvider};
use runway_providers::{
    CreateRequest, InstanceId, InstanceState, ManualClock, Provider, ProviderError,
};

struct Harness {
    provider: Arc<dyn Provider>,
    /// Lets enough time pass for a booting instance to become ready.
    let_boot: Box<dyn Fn() + Send + Sync>,
    quota: u32,
}

fn request(name: &str) -> CreateRequest {
    CreateRequest {
        name: name.to_owned(),
        pool: "linux".to_owned(),
        labels: vec!["self-hosted".to_owned()],
        bootstrap: BTreeMap::from([("RUNWAY_URL".to_owned(), "http://127.0.0.1:8080".to_owned())]),
        launch_config: serde_json::json!({}),
    }
}

async fn created_instances_are_listed_and_become_running(h: &Harness) {
    let instance = h
        .provider
        .create(&request("linux-0001"))
        .await
        .expect("create");
    assert_eq!(instance.name, "linux-0001");
    let listed = h.provider.list().await.expect("list");
    assert!(
        listed.iter().any(|i| i.id == instance.id),
        "a created instance is listed"
    );
    (h.let_boot)();
    let listed = h.provider.list().await.expect("list");
    let state = listed.iter().find(|i| i.id == instance.id).map(|i| i.state);
    assert_eq!(state, Some(InstanceState::Running));
}

async fn create_is_idempotent_by_name(h: &Harness) {
    let first = h
        .provider
        .create(&request("linux-0002"))
        .await
        .expect("create");
    let again = h
        .provider
        .create(&request("linux-0002"))
        .await
        .expect("create again");
    assert_eq!(
        first.id, again.id,
        "a retried create finds the first instance"
    );
    let named: Vec<_> = h
        .provider
        .list()
        .await
        .expect("list")
        .into_iter()
        .filter(|i| i.name == "linux-0002")
        .collect();
    assert_eq!(named.len(), 1);
}

async fn delete_is_idempotent_and_tolerates_missing_instances(h: &Harness) {
    let instance = h
        .provider
        .create(&request("linux-0003"))
        .await
        .expect("create");
    h.provider.delete(&instance.id).await.expect("delete");
    assert!(!h
        .provider
        .list()
        .await
        .expect("list")
        .iter()
        .any(|i| i.id == instance.id));
    h.provider
        .delete(&instance.id)
        .await
        .expect("deleting again is fine");
    h.provider
        .delete(&InstanceId("never-created".to_owned()))
        .await
        .expect("deleting an unknown instance is fine");
}

async fn quota_is_respected_by_creates_and_bids(h: &Harness) {
    let used = h.provider.list().await.expect("list").len() as u32;
    let offered: u32 = h
        .provider
        .bid("linux", 1_000)
        .iter()
        .map(|o| o.capacity)
        .sum();
    assert_eq!(offered, h.quota - used, "offers are what the quota leaves");
    for i in used..h.quota {
        h.provider
            .create(&request(&format!("fill-{i}")))
            .await
            .expect("within quota");
    }
    assert!(
        h.provider.bid("linux", 1).is_empty(),
        "no offer without quota"
    );
    let error = h
        .provider
        .create(&request("one-too-many"))
        .await
        .expect_err("over quota");
    assert!(matches!(error, ProviderError::Quota { .. }), "{error}");
    assert!(error.is_retryable());
}

async fn run_suite(make: impl Fn() -> Harness) {
    created_instances_are_listed_and_become_running(&make()).await;
    create_is_idempotent_by_name(&make()).await;
    delete_is_idempotent_and_tolerates_missing_instances(&make()).await;
    quota_is_respected_by_creates_and_bids(&make()).await;
}

fn sim(config: SimConfig) -> Harness {
    let clock = Arc::new(ManualClock::new(Timestamp::from_millis(0)));
    let quota = config.max_instances;
    let boot = match config.boot_time {
        BootTime::Fixed(d) => d,
        BootTime::Uniform(_, high) => high,
    };
    let advance = clock.clone();
    Harness {
        provider: Arc::new(SimProvider::new(config, clock)),
        let_boot: Box::new(move || advance.advance(boot)),
        quota,
    }
}

#[tokio::test]
async fn sim_provider_conforms() {
    run_suite(|| {
        sim(SimConfig {
            max_instances: 5,
            ..SimConfig::default()
        })
    })
    .await;
}

#[tokio::test]
async fn sim_failures_follow_the_fail_rate_and_the_seed() {
    let failures = |seed: u64| async move {
        let provider = SimProvider::new(
            SimConfig {
                fail_rate: 0.3,
                max_instances: 10_000,
                boot_time: BootTime::Fixed(Duration::from_secs(1)),
                seed,
                ..SimConfig::default()
            },
            Arc::new(ManualClock::default()),
        );
        let mut failed = 0;
        for i in 0..1_000 {
            if provider.create(&request(&format!("r{i}"))).await.is_err() {
                failed += 1;
            }
        }
        failed
    };
    let first = failures(7).await;
    assert_eq!(
        first,
        failures(7).await,
        "the same seed fails the same creates"
    );
    assert!(
        (230..370).contains(&first),
        "about 30% of 1,000 creates fail: {first}"
    );
    let offer = SimProvider::new(
        SimConfig {
            fail_rate: 0.3,
            ..SimConfig::default()
        },
        Arc::new(ManualClock::default()),
    )
    .bid("linux", 3);
    assert_eq!(offer[0].capacity, 3);
    assert!((offer[0].reliability - 0.7).abs() < 1e-9);
}
