//! No runway secret reaches a runner, a job or a provider (issue 22).
//!
//! `runway serve` runs as an operator runs it: secrets from the
//! environment (`env:` admin token, webhook secret, GitHub token,
//! `RUNWAY_DATABASE_URL`), one more written in the file, a `process` pool of
//! `runway agent --once` and an `exec` pool whose GARM provider records the
//! environment of every call. Each spawn path is checked for every secret's
//! value and for runway's tokens: the runner process (through
//! `/proc/PPID/environ`, read by its job), the job (`env`), the provider
//! executable (its own `env`), and `runway serve` itself.

use crate::common;

use std::path::PathBuf;

use common::{client, contrib_provider, runway, spawn_serve, wait_until, Process, RunnerProcesses};
use serde_json::{json, Value};

const ADMIN_SECRET: &str = "admin-secret-4f1c9a7e2b";
const HOOK_SECRET: &str = "hook-secret-9d2e77a1c0";
const GITHUB_SECRET: &str = "ghp_githubsecret5a6b7c8d9e";
const FILE_SECRET: &str = "read-secret-written-in-the-file-83hd";
const HIDDEN: &str = "unlisted-host-value-0c7e";

/// runway's secrets: no child, and not runway's own environment once
/// loaded, may hold one.
const SECRETS: [&str; 4] = [ADMIN_SECRET, HOOK_SECRET, GITHUB_SECRET, FILE_SECRET];

/// Dropped in field order: the server, its runners, then the directory.
struct Setup {
    serve: Process,
    base: String,
    _runners: RunnerProcesses,
    _garm_runners: RunnerProcesses,
    dir: tempfile::TempDir,
}

/// `runway serve --config runway.toml` in `root`, with runway's secrets
/// in its environment (the config names them `env:`), an allow-listed host
/// variable and one nobody allowed.
fn serve_with_secrets(root: &std::path::Path) -> std::process::Command {
    let mut command = runway(root);
    command
        .args(["serve", "--config", "runway.toml"])
        .env("MY_ADMIN", ADMIN_SECRET)
        .env("MY_HOOK_SECRET", HOOK_SECRET)
        .env("MY_GITHUB_TOKEN", GITHUB_SECRET)
        .env("RUNWAY_DATABASE_URL", "sqlite://runway.db")
        .env("ALLOWED_FLAG", "visible")
        .env("UNLISTED_VAR", HIDDEN);
    command
}

/// `runway serve` with its secrets in its environment and config.
fn start() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // The exec provider: a wrapper that records each call's environment,
    // then hands the call to the contrib GARM provider.
    let wrapper = root.join("provider.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nenv > \"{calls}/$GARM_COMMAND.$$\"\nexec python3 {provider} \"$@\"\n",
            calls = root.join("calls").display(),
            provider = contrib_provider().display(),
        ),
    )
    .unwrap();
    std::fs::create_dir_all(root.join("calls")).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::write(
        root.join("garm.conf"),
        format!(
            "state_dir={}\ncommand={} agent --once\nstop_grace=2\n",
            root.join("garm-state").display(),
            common::RUNWAY
        ),
    )
    .unwrap();
    std::fs::write(
        root.join("runway.toml"),
        format!(
            r#"[server]
listen = "127.0.0.1:0"
admin_tokens = ["env:MY_ADMIN"]
read_tokens = ["{FILE_SECRET}"]

[github]
webhook_secrets = ["env:MY_HOOK_SECRET"]
token = "env:MY_GITHUB_TOKEN"
# Nothing listens there, and nothing here needs GitHub.
api_url = "http://127.0.0.1:9"

[runner_api]
poll_timeout = "2s"
lease = "5s"

[scaling]
interval = "200ms"

[[providers]]
name = "local"
kind = "process"
command = ["runway", "agent", "--once"]
state_dir = "processes"
stop_grace = "2s"
max_instances = 2
environment_variables = ["ALLOWED_"]

[[providers]]
name = "garm"
kind = "exec"
executable = "{wrapper}"
config_file = "{root}/garm.conf"
max_instances = 2

[[pools]]
name = "local"
labels = ["local"]
max_runners = 1
boot_timeout = "60s"
providers = ["local"]

[[pools]]
name = "garm"
labels = ["garm"]
max_runners = 1
boot_timeout = "60s"
providers = ["garm"]
"#,
            wrapper = wrapper.display(),
            root = root.display(),
        ),
    )
    .unwrap();
    let (serve, base) = spawn_serve(serve_with_secrets(root));
    Setup {
        _runners: RunnerProcesses(root.join("processes")),
        // The GARM provider's records have the same `name` and `pid`.
        _garm_runners: RunnerProcesses(root.join("garm-state")),
        dir,
        serve,
        base,
    }
}

/// Submits `script` to the pool with `label` and returns its log once it
/// has finished.
fn run_job(setup: &Setup, label: &str, script: &str) -> String {
    let submitted: Value = client()
        .post(format!("{}/api/v1/jobs", setup.base))
        .bearer_auth(ADMIN_SECRET)
        .json(&json!({"labels": [label], "script": script, "timeout_seconds": 60}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let id = submitted["id"].as_i64().expect("a job id");
    let mut log = String::new();
    wait_until("the job to finish", 90, || {
        let Some((state, text)) = common::job_log(&setup.base, ADMIN_SECRET, id) else {
            return false;
        };
        log = text;
        state == "completed"
    });
    log
}

/// Fails naming the secret when a child's environment holds one, a runway
/// token, or a host variable nobody allowed.
fn assert_clean_child(what: &str, text: &str) {
    assert_clean(what, text);
    assert!(
        !text.contains(HIDDEN),
        "{what} inherited a host variable nobody allowed:\n{text}"
    );
}

/// Fails naming the secret when `text` (what `what` saw) holds one, or a
/// runway token.
fn assert_clean(what: &str, text: &str) {
    for secret in SECRETS {
        assert!(!text.contains(secret), "{what} holds {secret:?}:\n{text}");
    }
    for token in ["rwr_", "rwt_", "rwa_"] {
        assert!(
            !text.contains(token),
            "{what} holds a runway token ({token}…):\n{text}"
        );
    }
    assert!(
        !text.contains("sqlite://runway.db"),
        "{what} holds RUNWAY_DATABASE_URL:\n{text}"
    );
}

fn section<'a>(log: &'a str, start: &str, end: &str) -> &'a str {
    let from = log.find(start).map(|i| i + start.len()).unwrap_or(0);
    let to = log[from..].find(end).map(|i| from + i).unwrap_or(log.len());
    &log[from..to]
}

#[test]
fn serve_forgets_its_env_secrets_once_loaded() {
    let setup = start();
    let pid = setup.serve.0.id();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ).replace('\0', "\n");
    assert_clean("runway serve's /proc/PID/environ", &environ);
    // What is not a secret stays.
    assert!(environ.contains("ALLOWED_FLAG=visible"), "{environ}");
    // And it still works with what it read: the admin token is accepted.
    let status = client()
        .get(format!("{}/api/v1/jobs", setup.base))
        .bearer_auth(ADMIN_SECRET)
        .send()
        .unwrap()
        .status();
    assert_eq!(status, 200);
}

#[test]
fn a_process_runner_and_its_job_get_a_clean_environment() {
    let setup = start();
    let log = run_job(
        &setup,
        "local",
        "echo '== job =='; env; echo '== runner =='; tr '\\0' '\\n' < /proc/$PPID/environ; echo '== end =='",
    );
    let job = section(&log, "== job ==", "== runner ==");
    let runner = section(&log, "== runner ==", "== end ==");
    assert!(job.contains("RUNWAY_JOB_ID="), "{log}");
    assert!(job.contains("RUNWAY_JOB_LABELS=local"), "{log}");
    assert!(job.contains("PATH="), "{log}");
    assert_clean_child("the job's environment", job);
    // The job gets nothing of the runner's own: no bootstrap variables, no
    // allow-listed host variable.
    for name in ["RUNWAY_URL", "RUNWAY_REGISTRATION_TOKEN", "ALLOWED_FLAG"] {
        assert!(!job.contains(name), "the job saw {name}:\n{job}");
    }
    // The runner process (the job's parent, `runway agent`): its bootstrap,
    // the allow-listed host variable, and nothing else of runway's. Its
    // registration token was scrubbed once read.
    assert!(runner.contains("RUNWAY_RUNNER_NAME=local-"), "{log}");
    assert!(runner.contains("ALLOWED_FLAG=visible"), "{log}");
    assert!(!runner.contains("UNLISTED_VAR"), "{runner}");
    assert_clean_child("the runner's /proc/PID/environ", runner);
}

#[test]
fn an_exec_provider_gets_a_clean_environment() {
    let setup = start();
    let log = run_job(&setup, "garm", "echo ran on $RUNWAY_RUNNER_NAME; env");
    assert!(log.contains("ran on garm-"), "{log}");
    assert_clean_child("a job of the exec pool", &log);
    let calls: Vec<PathBuf> = std::fs::read_dir(setup.dir.path().join("calls"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        calls.iter().any(|p| p
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("CreateInstance."))),
        "{calls:?}"
    );
    for call in &calls {
        let environment = std::fs::read_to_string(call).unwrap();
        assert!(environment.contains("GARM_COMMAND="), "{environment}");
        assert!(environment.contains("GARM_CONTROLLER_ID="), "{environment}");
        assert_clean_child(
            &format!("the provider call {}", call.display()),
            &environment,
        );
        // Not allow-listed for this provider.
        assert!(!environment.contains("ALLOWED_FLAG"), "{environment}");
        assert!(!environment.contains("MY_ADMIN"), "{environment}");
    }
}

use runway_testkit::podman;

/// A `container` runner (a real Podman): its job, its agent (PID 1 of the
/// container) and the container's configuration (`podman inspect`) hold
/// none of runway's secrets; the allow-listed host variable alone passes.
#[test]
fn a_container_runner_its_job_and_its_configuration_hold_no_secret() {
    let Some(podman) = podman::podman(&[PathBuf::from(common::RUNWAY)]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(
        root.join("runway.toml"),
        format!(
            r#"[server]
listen = "127.0.0.1:0"
admin_tokens = ["env:MY_ADMIN"]
read_tokens = ["{FILE_SECRET}"]

[github]
webhook_secrets = ["env:MY_HOOK_SECRET"]
token = "env:MY_GITHUB_TOKEN"
api_url = "http://127.0.0.1:9"

[runner_api]
poll_timeout = "2s"

[scaling]
interval = "200ms"

[providers.box]
kind = "container"
socket = "{socket}"
image = "{image}"
pull = "never"
network = "host"
max_instances = 1
environment_variables = ["ALLOWED_"]

[[pools]]
name = "box"
labels = ["box"]
max_runners = 1
boot_timeout = "60s"
providers = ["box"]
"#,
            socket = podman.socket.display(),
            image = podman::IMAGE,
        ),
    )
    .unwrap();
    let (serve, base) = spawn_serve(serve_with_secrets(root));
    let setup = Setup {
        serve,
        base,
        _runners: RunnerProcesses(root.join("none")),
        _garm_runners: RunnerProcesses(root.join("none")),
        dir,
    };
    let script = "echo '== job =='; env; echo '== runner =='; tr '\\0' '\\n' < /proc/1/environ; \
                  echo '== inspect =='; sleep 2; echo '== end =='";
    let submitted: Value = client()
        .post(format!("{}/api/v1/jobs", setup.base))
        .bearer_auth(ADMIN_SECRET)
        .json(&json!({"labels": ["box"], "script": script, "timeout_seconds": 60}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let id = submitted["id"].as_i64().expect("a job id");
    // While it runs: the container's configuration as the engine shows it.
    let mut inspected = String::new();
    wait_until("the runner's container", 60, || {
        let names = podman.containers();
        if let Some(name) = names.first() {
            inspected = podman.inspect(name);
        }
        inspected.contains("io.runway.runner")
    });
    assert_clean_child("podman inspect of the runner's container", &inspected);
    assert!(inspected.contains("ALLOWED_FLAG=visible"), "{inspected}");
    for name in ["RUNWAY_REGISTRATION_TOKEN", "RUNWAY_URL="] {
        assert!(!inspected.contains(name), "{name} in:\n{inspected}");
    }
    let mut log = String::new();
    wait_until("the job to finish", 90, || {
        log = common::log_text(&setup.base, ADMIN_SECRET, id);
        log.contains("== end ==")
    });
    let job = section(&log, "== job ==", "== runner ==");
    let runner = section(&log, "== runner ==", "== inspect ==");
    assert!(job.contains("RUNWAY_JOB_ID="), "{log}");
    assert_clean_child("the container job's environment", job);
    for name in ["RUNWAY_URL", "RUNWAY_REGISTRATION_TOKEN", "ALLOWED_FLAG"] {
        assert!(!job.contains(name), "the job saw {name}:\n{job}");
    }
    // The agent (the container's PID 1): its bootstrap and the allowed
    // host variable; its registration token scrubbed once read.
    assert!(runner.contains("RUNWAY_RUNNER_NAME=box-"), "{log}");
    assert!(runner.contains("ALLOWED_FLAG=visible"), "{log}");
    assert_clean_child("the container agent's /proc/1/environ", runner);
}
