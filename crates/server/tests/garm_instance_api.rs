//! GARM's instance API (`app::garm`): the instance token's scope and
//! lifetime, the one registration token, JIT files, and the status
//! callbacks, on a real store through the router.

use axum::http::StatusCode;
use base64::Engine as _;
use runway_core::runner::NewRunner;
use runway_core::{Runner, RunnerEvent, RunnerState};
use runway_server::app::garm;
use runway_server::config::{Config, PoolGithub, Target};
use serde_json::json;

use crate::common;
use common::{pool, Harness};

const METADATA: &str = "/api/v1/garm/metadata";
const CALLBACKS: &str = "/api/v1/garm/callbacks";

async fn harness() -> Harness {
    let mut github = pool("gh", &["gh"]);
    github.github = Some(PoolGithub {
        target: Target::Org("acme".into()),
        runner_group_id: 1,
        scale_set: None,
        runner_group: None,
    });
    Harness::new(Config {
        pools: vec![pool("agent", &["agent"]), github],
        ..Config::default()
    })
    .await
}

async fn runner(h: &Harness, pool: &str, name: &str) -> Runner {
    h.store()
        .create_runner(
            &NewRunner {
                name: name.into(),
                pool: pool.into(),
                provider: "lxd".into(),
                labels: vec![pool.into()],
                stock: false,
            },
            runway_server::clock::now(),
        )
        .await
        .unwrap()
}

#[tokio::test]
async fn a_runway_agent_machine_gets_one_registration_token_and_its_status_is_recorded() {
    let h = harness().await;
    let now = runway_server::clock::now();
    let runner = runner(&h, "agent", "agent-1").await;
    let token = garm::mint(
        &h.service,
        &runner,
        now.plus(std::time::Duration::from_secs(60)),
        None,
    )
    .await
    .unwrap();
    let path = format!("{METADATA}/runner-registration-token/");
    let (status, first) = h.get(&path, &token).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert!(first.as_str().unwrap().starts_with("rwr_"), "{first}");
    let (status, again) = h.get(&path, &token).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "replayed: {again}");
    // No trailing slash, as GARM serves both; JIT files are for JIT runners.
    let (status, _) = h
        .get(&format!("{METADATA}/credentials/runner"), &token)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, script) = h.get(&format!("{METADATA}/install-script"), &token).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        script.as_str().unwrap().contains("runway\" agent --once"),
        "{script}"
    );

    // Bad tokens change nothing.
    for bad in ["", "rwi_unknown"] {
        let (status, _) = h
            .post(
                &format!("{CALLBACKS}/status/"),
                bad,
                json!({"status": "failed", "message": "x"}),
            )
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(
        h.store()
            .get_runner(runner.id)
            .await
            .unwrap()
            .unwrap()
            .state,
        RunnerState::Requested
    );
    let (status, _) = h
        .post(
            &format!("{CALLBACKS}/status/"),
            &token,
            json!({"status": "installing", "message": "downloading runway"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = h
        .post(
            &format!("{CALLBACKS}/status"),
            &token,
            json!({"status": "failed", "message": "disk full"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let failed = h.store().get_runner(runner.id).await.unwrap().unwrap();
    assert_eq!(failed.state, RunnerState::Failed);
    assert_eq!(
        failed.reason.as_deref(),
        Some("the machine reported: disk full")
    );
    let phases: Vec<_> = h
        .store()
        .runner_reports(runner.id)
        .await
        .unwrap()
        .into_iter()
        .map(|(phase, _)| phase)
        .collect();
    assert_eq!(phases, ["garm-status", "garm-status"]);
    // Its runner failed: the token is spent.
    let (status, _) = h.get(&format!("{METADATA}/install-script/"), &token).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_github_machine_gets_its_jit_files_until_its_runner_runs_a_job() {
    let h = harness().await;
    let now = runway_server::clock::now();
    let runner = runner(&h, "gh", "gh-1").await;
    let files = json!({
        ".runner": base64::engine::general_purpose::STANDARD.encode(r#"{"agentId": 7}"#),
        ".credentials": base64::engine::general_purpose::STANDARD.encode("creds"),
        ".credentials_rsaparams": base64::engine::general_purpose::STANDARD.encode("rsa"),
    });
    let jit = base64::engine::general_purpose::STANDARD.encode(files.to_string());
    let token = garm::mint(
        &h.service,
        &runner,
        now.plus(std::time::Duration::from_secs(60)),
        Some(&jit),
    )
    .await
    .unwrap();
    let (status, body) = h
        .get(&format!("{METADATA}/credentials/runner/"), &token)
        .await;
    assert_eq!((status, body), (StatusCode::OK, json!({"agentId": 7})));
    let (_, name) = h
        .get(&format!("{METADATA}/system/service-name/"), &token)
        .await;
    assert_eq!(name, "actions.runner.acme");
    let (status, _) = h
        .get(&format!("{METADATA}/runner-registration-token/"), &token)
        .await;
    assert_eq!(
        status,
        StatusCode::UNAUTHORIZED,
        "a JIT runner has no registration token"
    );
    // Running a job: the token is spent.
    let store = h.store();
    store
        .apply_runner_event(
            runner.id,
            &RunnerEvent::ProvisioningStarted {
                instance_id: "i".into(),
            },
            now,
        )
        .await
        .unwrap();
    store
        .apply_runner_event(runner.id, &RunnerEvent::Ready, now)
        .await
        .unwrap();
    let (status, _) = h
        .get(&format!("{METADATA}/credentials/credentials/"), &token)
        .await;
    assert_eq!(
        status,
        StatusCode::OK,
        "idle, not yet seen registered by runway"
    );
    store
        .apply_runner_event(runner.id, &RunnerEvent::TerminateRequested, now)
        .await
        .unwrap();
    let (status, _) = h
        .get(&format!("{METADATA}/credentials/credentials/"), &token)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn an_expired_instance_token_is_refused() {
    let h = harness().await;
    let now = runway_server::clock::now();
    let runner = runner(&h, "agent", "agent-2").await;
    let token = garm::mint(&h.service, &runner, now, None).await.unwrap();
    let (status, body) = h.get(&format!("{METADATA}/install-script/"), &token).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"], "the instance token has expired");
}
