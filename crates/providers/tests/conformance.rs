//! The provider conformance suite. Every provider runs the same cases; a
//! provider's harness gives the suite the provider, a way to let time pass
//! until booting instances are ready, and the provider's quota.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use runway_core::Timestamp;
use runway_providers::exec::{ExecConfig, ExecProvider, InterfaceVersion};
use runway_providers::process::{ProcessConfig, ProcessProvider};
use runway_providers::sim::{BootTime, SimConfig, SimProvider};
use runway_providers::{
    CreateRequest, Instance, InstanceId, InstanceState, ManualClock, Provider, ProviderError,
};

use runway_testkit::moto;
use runway_testkit::podman;

struct Harness {
    provider: Arc<dyn Provider>,
    /// Lets enough time pass for a booting instance to become ready.
    let_boot: Box<dyn Fn() + Send + Sync>,
    quota: u32,
}

pub(crate) fn request(name: &str) -> CreateRequest {
    CreateRequest {
        name: name.to_owned(),
        offer: String::new(),
        pool: "linux".to_owned(),
        labels: vec!["self-hosted".to_owned()],
        bootstrap: BTreeMap::from([("RUNWAY_URL".to_owned(), "http://127.0.0.1:8080".to_owned())]),
        // What a worker configuration gives an EC2 launch; the others
        // ignore it.
        launch_config: serde_json::json!({"ec2": {"ImageId": "ami-12c6146b"}}),
        instance_api: None,
        stock: false,
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
    let offers = h.provider.bid("linux", 1_000);
    // A provider's offers share its quota: each says what is left of it.
    assert!(!offers.is_empty());
    for offer in &offers {
        assert_eq!(
            offer.capacity,
            h.quota - used,
            "offers are what the quota leaves"
        );
    }
    for i in used..h.quota {
        h.provider
            .create(&request(&format!("fill-{i}")))
            .await
            .expect("within quota");
    }
    let offers = h.provider.bid("linux", 1);
    assert!(
        offers.iter().all(|o| o.capacity == 0),
        "no capacity without quota: {offers:?}"
    );
    let error = h
        .provider
        .create(&request("one-too-many"))
        .await
        .expect_err("over quota");
    assert!(matches!(error, ProviderError::Quota { .. }), "{error}");
    assert!(error.is_retryable());
}

/// Deletes whatever a case left behind (real processes, for some providers).
async fn clean_up(h: Harness) {
    for instance in h.provider.list().await.expect("list") {
        h.provider.delete(&instance.id).await.expect("delete");
    }
    assert!(h.provider.list().await.expect("list").is_empty());
}

async fn run_suite(make: impl Fn() -> Harness) {
    let h = make();
    created_instances_are_listed_and_become_running(&h).await;
    clean_up(h).await;
    let h = make();
    create_is_idempotent_by_name(&h).await;
    clean_up(h).await;
    let h = make();
    delete_is_idempotent_and_tolerates_missing_instances(&h).await;
    clean_up(h).await;
    let h = make();
    quota_is_respected_by_creates_and_bids(&h).await;
    clean_up(h).await;
}

/// An EC2 provider on a private moto server, tagged with a controller id
/// of its own.
fn ec2(url: &str) -> Harness {
    Harness {
        provider: Arc::new(runway_providers::ec2::Ec2Provider::new(
            ec2_config(url),
            Arc::new(runway_providers::SystemClock),
        )),
        // moto's instances run as soon as they are described.
        let_boot: Box::new(|| {}),
        quota: 4,
    }
}

fn ec2_config(url: &str) -> runway_providers::ec2::Ec2Config {
    moto::aws_environment();
    runway_providers::ec2::Ec2Config {
        name: "ec2".into(),
        region: "us-east-1".into(),
        endpoint_url: Some(url.to_owned()),
        profile: None,
        instance_types: vec!["m5.large".into()],
        zones: vec!["us-east-1a".into(), "us-east-1b".into()],
        purchase_options: runway_providers::ec2::Purchase::ALL.to_vec(),
        on_demand_prices: BTreeMap::new(),
        price_per_hour: 0.096,
        spot_price_refresh: Duration::from_secs(300),
        prepare_command: None,
        boot_command: None,
        max_instances: 4,
        boot_time: Duration::from_secs(60),
        list_lag: Duration::from_secs(60),
        controller_id: uuid::Uuid::new_v4().to_string(),
        legacy_controller_id: None,
    }
}

/// Two `ec2` providers of one installation in one account and region:
/// each lists only the instances tagged with its own name.
#[tokio::test]
async fn two_ec2_providers_in_one_account_list_only_their_own() {
    let Some(moto) = moto::start() else {
        return;
    };
    let controller = uuid::Uuid::new_v4().to_string();
    let make = |name: &str| {
        let mut config = ec2_config(&moto.url);
        config.name = name.into();
        config.controller_id = controller.clone();
        runway_providers::ec2::Ec2Provider::new(config, Arc::new(runway_providers::SystemClock))
    };
    let (a, b) = (make("ec2-a"), make("ec2-b"));
    let made_by_a = a.create(&request("two-ec2-a")).await.expect("a launches");
    let made_by_b = b.create(&request("two-ec2-b")).await.expect("b launches");
    for (provider, own, other) in [(&a, &made_by_a, &made_by_b), (&b, &made_by_b, &made_by_a)] {
        let listed: Vec<InstanceId> = provider
            .list()
            .await
            .expect("list")
            .into_iter()
            .map(|i| i.id)
            .collect();
        assert_eq!(listed, std::slice::from_ref(&own.id), "not {:?}", other.id);
        assert!(provider.proven_own(&own.id));
    }
    a.delete(&made_by_a.id).await.unwrap();
    b.delete(&made_by_b.id).await.unwrap();
}

/// An EC2 stopped runner (issue 60): launched with no credential, to run
/// its user data at every boot and to stop when it powers off; started
/// with its user data rewritten to hold the credential minted for the
/// start, and to terminate when it powers off after its job.
#[tokio::test]
async fn an_ec2_stopped_runner_gets_its_credential_only_at_its_start() {
    use aws_sdk_ec2::types::InstanceAttributeName;
    use base64::Engine;
    let Some(moto) = moto::start() else {
        return;
    };
    let provider = runway_providers::ec2::Ec2Provider::new(
        ec2_config(&moto.url),
        Arc::new(runway_providers::SystemClock),
    );
    let client = moto::client(&moto.url).await;
    let attribute = |id: String, name: InstanceAttributeName| {
        let client = client.clone();
        async move {
            let answer = client
                .describe_instance_attribute()
                .instance_id(id)
                .attribute(name.clone())
                .send()
                .await
                .expect("an attribute");
            if name == InstanceAttributeName::UserData {
                let encoded = answer
                    .user_data()
                    .and_then(|v| v.value())
                    .unwrap_or_default();
                String::from_utf8(
                    base64::engine::general_purpose::STANDARD
                        .decode(encoded)
                        .expect("base64"),
                )
                .expect("text")
            } else {
                answer
                    .instance_initiated_shutdown_behavior()
                    .and_then(|v| v.value())
                    .unwrap_or_default()
                    .to_owned()
            }
        }
    };
    let mut warm = request("stock-1");
    warm.stock = true;
    let instance = provider.create(&warm).await.expect("launched");
    let id = instance.id.0.clone();
    let script = attribute(id.clone(), InstanceAttributeName::UserData).await;
    assert!(
        script.contains("#cloud-config\ncloud_final_modules:\n- [scripts-user, always]"),
        "{script}"
    );
    assert!(
        script.contains("export RUNWAY_URL='http://127.0.0.1:8080'"),
        "{script}"
    );
    assert!(!script.contains("RUNWAY_REGISTRATION_TOKEN"), "{script}");
    assert!(script.contains("true\nshutdown -h now\n"), "{script}");
    assert_eq!(
        attribute(
            id.clone(),
            InstanceAttributeName::InstanceInitiatedShutdownBehavior
        )
        .await,
        "stop"
    );
    assert!(provider.stock_stops_itself());

    provider.stop(&instance.id).await.expect("stopped");
    let state = || async {
        provider
            .list()
            .await
            .unwrap()
            .into_iter()
            .find(|i| i.id == instance.id)
            .map(|i| i.state)
    };
    assert_eq!(state().await, Some(InstanceState::Stopped));

    let mut fresh = request("stock-1");
    fresh.bootstrap.insert(
        "RUNWAY_REGISTRATION_TOKEN".into(),
        "rwr_fresh-for-this-start".into(),
    );
    provider
        .start(&instance.id, Some(&fresh))
        .await
        .expect("started");
    let script = attribute(id.clone(), InstanceAttributeName::UserData).await;
    assert!(
        script.contains("export RUNWAY_REGISTRATION_TOKEN='rwr_fresh-for-this-start'"),
        "{script}"
    );
    assert!(
        script.contains("runway agent --once\nshutdown -h now\n"),
        "{script}"
    );
    assert!(
        script.contains("scripts-user, always"),
        "runs at this boot: {script}"
    );
    assert_eq!(
        attribute(
            id.clone(),
            InstanceAttributeName::InstanceInitiatedShutdownBehavior
        )
        .await,
        "terminate"
    );
    assert_eq!(state().await, Some(InstanceState::Running));
    provider.delete(&instance.id).await.unwrap();
}

#[tokio::test]
async fn ec2_provider_conforms_on_moto() {
    let Some(moto) = moto::start() else {
        return;
    };
    run_suite(|| ec2(&moto.url)).await;
}

/// A container provider on a private Podman, its containers sleeping,
/// tagged with a controller id of its own.
fn container(podman: &podman::Podman, state_dir: &std::path::Path) -> Harness {
    use runway_providers::container::ContainerProvider;
    let config = container_config(podman, state_dir);
    Harness {
        provider: Arc::new(ContainerProvider::new(config).expect("a container provider")),
        // A started container runs at once.
        let_boot: Box::new(|| {}),
        quota: 3,
    }
}

fn container_config(
    podman: &podman::Podman,
    state_dir: &std::path::Path,
) -> runway_providers::container::ContainerConfig {
    use runway_providers::container::{ContainerConfig, Pull};
    ContainerConfig {
        name: "box".into(),
        socket: Some(podman.socket.clone()),
        image: podman::IMAGE.into(),
        pull: Pull::Never,
        cpus: Some(0.5),
        memory_mb: Some(64),
        pids_limit: Some(64),
        network: "none".into(),
        read_only: true,
        user: None,
        mounts: Vec::new(),
        allowed_mounts: Vec::new(),
        capabilities: Vec::new(),
        allowed_capabilities: Vec::new(),
        command: Some("exec sleep 600".into()),
        runway_exe: None,
        environment_variables: Vec::new(),
        state_dir: state_dir.to_path_buf(),
        stop_grace: Duration::from_secs(1),
        max_instances: 3,
        price_per_hour: 0.0,
        boot_time: Duration::from_secs(1),
        controller_id: uuid::Uuid::new_v4().to_string(),
        legacy_controller_id: None,
    }
}

/// Two `container` providers of one installation on one engine: each
/// lists (so counts and judges) only the containers labelled with its own
/// name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_container_providers_on_one_engine_list_only_their_own() {
    use runway_providers::container::{ContainerConfig, ContainerProvider};
    let Some(podman) = podman::podman(&[]) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let controller = uuid::Uuid::new_v4().to_string();
    let make = |name: &str| {
        let mut config: ContainerConfig = container_config(&podman, &dir.path().join(name));
        config.name = name.into();
        config.controller_id = controller.clone();
        Arc::new(ContainerProvider::new(config).expect("a container provider"))
    };
    let (a, b) = (make("box-a"), make("box-b"));
    let made_by_a = a.create(&request("two-a")).await.expect("a creates");
    let made_by_b = b.create(&request("two-b")).await.expect("b creates");
    for (provider, own, other) in [(&a, &made_by_a, &made_by_b), (&b, &made_by_b, &made_by_a)] {
        let listed: Vec<InstanceId> = provider
            .list()
            .await
            .expect("list")
            .into_iter()
            .map(|i| i.id)
            .collect();
        assert_eq!(listed, std::slice::from_ref(&own.id), "not {:?}", other.id);
        assert!(provider.proven_own(&own.id));
    }
    a.delete(&made_by_a.id).await.unwrap();
    b.delete(&made_by_b.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_provider_conforms_on_podman() {
    let Some(podman) = podman::podman(&[]) else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    run_suite(|| container(&podman, dir.path())).await;
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

/// The state of the first instance `provider` lists.
async fn state_of(provider: &dyn Provider) -> InstanceState {
    provider.list().await.unwrap()[0].state
}

/// Stopped runners (issue 60): a sim instance with a resume time stops
/// (listed stopped, off the quota), starts ready `resume_time` later, and
/// takes quota again to start; one without refuses to stop.
#[tokio::test]
async fn a_sim_instance_stops_off_the_quota_and_starts_in_its_resume_time() {
    let clock = Arc::new(ManualClock::default());
    let provider = SimProvider::new(
        SimConfig {
            max_instances: 1,
            boot_time: BootTime::Fixed(Duration::from_secs(150)),
            resume_time: Some(Duration::from_secs(20)),
            ..SimConfig::default()
        },
        clock.clone(),
    );
    let first = provider.create(&request("stock-1")).await.unwrap();
    clock.advance(Duration::from_secs(150));
    assert_eq!(state_of(&provider).await, InstanceState::Running);
    provider.stop(&first.id).await.unwrap();
    provider
        .stop(&first.id)
        .await
        .expect("stopping again is no error");
    assert_eq!(state_of(&provider).await, InstanceState::Stopped);
    // Stopped, it leaves its quota slot to another.
    assert_eq!(provider.bid("linux", 5)[0].capacity, 1);
    let second = provider.create(&request("cold-1")).await.unwrap();
    assert!(matches!(
        provider.start(&first.id, None).await,
        Err(ProviderError::Quota { .. })
    ));
    provider.delete(&second.id).await.unwrap();
    provider.start(&first.id, None).await.unwrap();
    assert_eq!(state_of(&provider).await, InstanceState::Pending);
    clock.advance(Duration::from_secs(20));
    assert_eq!(state_of(&provider).await, InstanceState::Running);

    let cannot = SimProvider::new(SimConfig::default(), clock.clone());
    let instance = cannot.create(&request("r")).await.unwrap();
    assert!(matches!(
        cannot.stop(&instance.id).await,
        Err(ProviderError::Permanent { .. })
    ));
}

// ---- process ----

fn process_config(dir: &std::path::Path, command: &[&str]) -> ProcessConfig {
    ProcessConfig {
        name: "local".to_owned(),
        command: command.iter().map(|s| s.to_string()).collect(),
        state_dir: dir.to_path_buf(),
        stop_grace: Duration::from_secs(2),
        max_instances: 4,
        price_per_hour: 0.0,
        boot_time: Duration::from_secs(1),
        controller_id: "controller-a".to_owned(),
        legacy_controller_id: None,
        environment_variables: Vec::new(),
    }
}

#[tokio::test]
async fn process_provider_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run_suite(move || {
        let provider = ProcessProvider::new(process_config(&path, &["sleep", "60"])).unwrap();
        Harness {
            provider: Arc::new(provider),
            let_boot: Box::new(|| {}),
            quota: 4,
        }
    })
    .await;
}

/// Polls `check` until it holds or five seconds pass.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !check() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_runners_get_their_bootstrap_environment() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("env.txt");
    let script = format!(
        "echo \"$RUNWAY_URL $RUNWAY_RUNNER_NAME $RUNWAY_POOL $RUNWAY_RUNNER_LABELS\" > {}.tmp && mv {0}.tmp {0}",
        out.display()
    );
    let state = dir.path().join("state");
    let provider = ProcessProvider::new(process_config(&state, &["sh", "-c", &script])).unwrap();
    let mut request = request("env-1");
    request.labels = vec!["local".into(), "linux".into()];
    provider.create(&request).await.unwrap();
    eventually("the runner wrote its environment", || out.exists()).await;
    assert_eq!(
        std::fs::read_to_string(&out).unwrap().trim(),
        "http://127.0.0.1:8080 env-1 linux local,linux"
    );
    eventually("the runner exited", || {
        futures_lite_block(provider.list())
            .iter()
            .all(|i| i.state == InstanceState::Failed)
    })
    .await;
    provider.delete(&InstanceId("env-1".into())).await.unwrap();
    assert!(provider.list().await.unwrap().is_empty());
}

/// Runs a provider future to completion from a sync closure.
fn futures_lite_block<F: std::future::Future<Output = Result<Vec<Instance>, ProviderError>>>(
    future: F,
) -> Vec<Instance> {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(future))
        .expect("list")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_provider_adopts_its_processes_and_ignores_other_installations() {
    let dir = tempfile::tempdir().unwrap();
    let first = ProcessProvider::new(process_config(dir.path(), &["sleep", "60"])).unwrap();
    let instance = first.create(&request("kept-1")).await.unwrap();
    drop(first); // `runway serve` went away; its runner did not.

    let mut other = process_config(dir.path(), &["sleep", "60"]);
    other.controller_id = "controller-b".to_owned();
    let other = ProcessProvider::new(other).unwrap();
    assert!(
        other.list().await.unwrap().is_empty(),
        "another installation's processes are not ours"
    );
    other.delete(&instance.id).await.unwrap();

    let again = ProcessProvider::new(process_config(dir.path(), &["sleep", "60"])).unwrap();
    let listed = again.list().await.unwrap();
    assert_eq!(listed.len(), 1, "the restarted provider finds it");
    assert_eq!(listed[0].state, InstanceState::Running, "still running");
    assert_eq!(
        again.bid("linux", 10)[0].capacity,
        3,
        "it counts against the quota"
    );
    again.delete(&instance.id).await.unwrap();
    assert!(again.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_runner_that_ignores_sigterm_is_killed_after_the_grace() {
    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("ready");
    let script = format!("trap '' TERM; touch {}; sleep 60 & wait", ready.display());
    let mut config = process_config(&dir.path().join("state"), &["sh", "-c", &script]);
    config.stop_grace = Duration::from_millis(300);
    let provider = ProcessProvider::new(config).unwrap();
    let instance = provider.create(&request("stubborn")).await.unwrap();
    eventually("the runner ignores SIGTERM", || ready.exists()).await;
    let started = std::time::Instant::now();
    provider.delete(&instance.id).await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "SIGKILL only after the grace"
    );
    assert!(provider.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_process_that_cannot_start_is_a_permanent_error() {
    let dir = tempfile::tempdir().unwrap();
    let provider =
        ProcessProvider::new(process_config(dir.path(), &["/nonexistent/runway-agent"])).unwrap();
    let error = provider.create(&request("nope")).await.unwrap_err();
    assert!(!error.is_retryable(), "{error}");
    assert!(provider.list().await.unwrap().is_empty());
}

// ---- exec (GARM external provider protocol) ----

fn garm_script() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../contrib/garm-provider-local/garm-provider-local")
}

fn exec_config(dir: &std::path::Path, command: &str) -> ExecConfig {
    ExecConfig {
        max_instances: 3,
        ..crate::garm_protocol::config_running(dir, garm_script(), InterfaceVersion::V011, command)
    }
}

#[tokio::test]
async fn exec_provider_conforms_through_a_garm_provider_script() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    run_suite(move || Harness {
        provider: Arc::new(ExecProvider::new(exec_config(&path, "sleep 60"))),
        let_boot: Box::new(|| {}),
        quota: 3,
    })
    .await;
}

/// A quota slot held for a create (`reserve`) goes once the list shows its
/// instance (the list counts it) or the instance is deleted, by name or
/// id: a create in doubt whose instance another path deleted never
/// shrinks the provider's quota for good.
#[tokio::test]
async fn exec_quota_slots_go_with_their_instances() {
    let dir = tempfile::tempdir().unwrap();
    let provider = ExecProvider::new(exec_config(dir.path(), "sleep 60"));
    // The same backend through another provider value: an instance made
    // behind this one's back, as a create whose answer was lost.
    let other = ExecProvider::new(exec_config(dir.path(), "sleep 60"));
    let left = |p: &ExecProvider| p.bid("linux", 10).first().map_or(0, |o| o.capacity);
    assert_eq!(left(&provider), 3);
    provider.reserve("garm-1").unwrap();
    other.create(&request("garm-1")).await.unwrap();
    assert_eq!(left(&provider), 2, "the slot");
    provider.list().await.unwrap();
    assert_eq!(
        left(&provider),
        2,
        "the listed instance, not it and its slot"
    );
    provider.reserve("garm-2").unwrap();
    assert_eq!(left(&provider), 1);
    provider.delete(&InstanceId("garm-2".into())).await.unwrap();
    assert_eq!(left(&provider), 2, "a deleted instance's slot");
    provider.delete(&InstanceId("garm-1".into())).await.unwrap();
    provider.list().await.unwrap();
    assert_eq!(left(&provider), 3);
    provider.remove_all().await.unwrap();
}

#[tokio::test]
async fn exec_bootstrap_reaches_the_runner_and_remove_all_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("env.txt");
    let command = format!(
        "sh -c 'echo \"$RUNWAY_URL $RUNWAY_RUNNER_NAME\" > {0}.tmp && mv {0}.tmp {0}; sleep 60'",
        out.display()
    );
    let provider = ExecProvider::new(exec_config(dir.path(), &command));
    let instance = provider.create(&request("garm-1")).await.unwrap();
    assert_eq!(instance.name, "garm-1");
    eventually("the runner wrote its environment", || out.exists()).await;
    assert_eq!(
        std::fs::read_to_string(&out).unwrap().trim(),
        "http://127.0.0.1:8080 garm-1"
    );
    let state = || async { provider.get(&instance.id).await.unwrap().map(|i| i.state) };
    assert_eq!(state().await, Some(InstanceState::Running));
    provider.stop(&instance.id).await.unwrap();
    assert_eq!(state().await, Some(InstanceState::Stopped));
    provider.start(&instance.id, None).await.unwrap();
    assert_eq!(state().await, Some(InstanceState::Running));
    provider.create(&request("garm-2")).await.unwrap();
    provider.remove_all().await.unwrap();
    assert!(provider.list().await.unwrap().is_empty());
    assert_eq!(state().await, None, "gone (exit code 30)");
}

#[tokio::test]
async fn exec_failures_and_timeouts_are_reported_with_their_cause() {
    let dir = tempfile::tempdir().unwrap();
    let failing = dir.path().join("failing");
    std::fs::write(
        &failing,
        "#!/bin/sh\necho \"quota exceeded in region\" >&2\nexit 3\n",
    )
    .unwrap();
    let slow = dir.path().join("slow");
    std::fs::write(&slow, "#!/bin/sh\nexec sleep 30\n").unwrap();
    let garbage = dir.path().join("garbage");
    std::fs::write(&garbage, "#!/bin/sh\necho 'not json'\n").unwrap();
    for script in [&failing, &slow, &garbage] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(script, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let with = |executable: &std::path::Path| {
        let mut config = exec_config(dir.path(), "true");
        config.executable = executable.to_path_buf();
        config.timeout = Duration::from_millis(500);
        ExecProvider::new(config)
    };
    let error = with(&failing).list().await.unwrap_err().to_string();
    assert!(
        error.contains("ListInstances failed") && error.contains("quota exceeded in region"),
        "{error}"
    );
    let started = std::time::Instant::now();
    let error = with(&slow).list().await.unwrap_err().to_string();
    assert!(error.contains("did not finish within"), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the call was cut off"
    );
    let error = with(&garbage).list().await.unwrap_err().to_string();
    assert!(error.contains("not JSON"), "{error}");
    let missing = with(std::path::Path::new("/nonexistent/provider"));
    assert!(!missing.list().await.unwrap_err().is_retryable());
}
