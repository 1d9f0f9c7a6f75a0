//! `runway serve` with a GitHub pool, as a user runs it, against the fake
//! GitHub of the server's tests: a lost `queued` webhook is redelivered by
//! the background task, the runner starts from its JIT configuration (a
//! `process` provider whose "machine" records what it was given), and once
//! its job is done it is stopped (GitHub removes a just-in-time runner
//! after its job itself).

mod common;
#[path = "../../server/tests/fake_github/mod.rs"]
mod fake_github;

use std::path::Path;

use common::{metric, runway, spawn_serve, wait_until, RunnerProcesses};
use fake_github::{Auth, FakeGithub, HOOK_SECRET, TOKEN};

fn write_config(dir: &Path, github: &str) {
    let log = dir.join("jit.log");
    std::fs::write(
        dir.join("runway.toml"),
        format!(
            r#"[server]
listen = "127.0.0.1:0"

[scaling]
interval = "200ms"

[github]
api_url = "{github}"
token = "env:RUNWAY_TEST_GITHUB_TOKEN"
webhook_secrets = ["{HOOK_SECRET}"]
deliveries = "orgs/octo-org/hooks/9"
redeliver_interval = "1s"

[[providers]]
name = "machines"
kind = "process"
command = ["sh", "-c", "echo \"$RUNWAY_RUNNER_NAME $RUNWAY_JIT_CONFIG\" >> '{log}'; exec sleep 300"]
state_dir = "processes"
stop_grace = "2s"

[[pools]]
name = "gh"
labels = ["self-hosted", "linux"]
max_runners = 3
idle_grace = "0s"
providers = ["machines"]
[pools.github]
org = "octo-org"
"#,
            log = log.display()
        ),
    )
    .unwrap();
}

#[test]
fn a_github_pool_heals_a_lost_webhook_starts_a_jit_runner_and_stops_it_after_its_job() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let fake = runtime.block_on(FakeGithub::start(4_000, Auth::Token));
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &fake.url);
    // Kills whatever runner processes are left if the test fails.
    let processes = RunnerProcesses(dir.path().join("processes"));
    let mut command = runway(dir.path());
    command
        .args(["serve", "--config", "runway.toml"])
        .env("RUNWAY_TEST_GITHUB_TOKEN", TOKEN);
    let (_serve, base) = spawn_serve(command);
    fake.lock().webhook_url = Some(format!("{base}/webhooks/github"));

    // The queued webhook never reaches runway.
    fake.queue_job(601, &["self-hosted", "linux"]);
    assert_eq!(runtime.block_on(fake.deliver(601, "queued", true)), 0);

    // Redelivered within an interval; a runner starts from its JIT config.
    let log = dir.path().join("jit.log");
    wait_until("a runner started with a JIT configuration", 30, || {
        std::fs::read_to_string(&log).is_ok_and(|text| {
            text.lines()
                .any(|l| l.split_once(' ').is_some_and(|(_, jit)| !jit.is_empty()))
        })
    });
    let line = std::fs::read_to_string(&log).unwrap();
    let (name, jit) = line.trim().split_once(' ').unwrap();
    let github_id = fake
        .runner_id(name)
        .expect("registered at GitHub under its name");
    assert_eq!(jit, fake_github::encoded_jit(github_id, name));

    // GitHub runs the job on it; when it is over the runner goes.
    fake.start_job(601, name);
    assert_eq!(
        runtime.block_on(fake.deliver(601, "in_progress", false)),
        202
    );
    fake.complete_job(601, "success");
    assert_eq!(runtime.block_on(fake.deliver(601, "completed", false)), 202);
    wait_until("the runner's process to be stopped", 30, || {
        processes.tracked().is_empty()
    });
    assert_eq!(
        fake.calls_starting(&format!(
            "DELETE /orgs/octo-org/actions/runners/{github_id}"
        )),
        0,
        "a JIT runner leaves GitHub after its job by itself: not asked"
    );
    assert_eq!(metric(&base, "runway_github_redeliveries_total"), 1.0);
    assert_eq!(
        metric(
            &base,
            r#"runway_github_requests_total{operation="generate_jitconfig",status="201"}"#
        ),
        1.0
    );
    assert_eq!(fake.invalid(), Vec::<String>::new());
    assert_eq!(
        fake.calls_starting("POST /orgs/octo-org/actions/runners/generate-jitconfig"),
        1,
        "one runner for one job"
    );
}
