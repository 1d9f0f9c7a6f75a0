//! A GARM provider and the machine it boots, against `runway serve`, as
//! GARM's own providers do it: `contrib/garm-provider-local` with
//! `boot=userdata` checks `tools` as garm-provider-common's `GetTools` does
//! and runs the pool's `runner_install_template` as the machine's boot
//! script, with nothing of the bootstrap in its environment. The script
//! fetches its install script with the instance token, downloads runway's
//! binary and checks its sha256, takes its one registration token, reports
//! its status and system info, and starts `runway agent --once`, which runs
//! the job. The instance token is useless after that.

use serde_json::{json, Value};

mod common;
use common::{client, contrib_provider, runway, spawn_serve, wait_until, Process, RunnerProcesses};

const ADMIN: &str = "garm-machine-admin-token";

/// Dropped in field order: the server, its machines, then the directory.
struct Setup {
    _serve: Process,
    base: String,
    _machines: RunnerProcesses,
    dir: tempfile::TempDir,
}

fn start() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(
        root.join("garm.conf"),
        format!(
            "state_dir={}\nboot=userdata\nstop_grace=2\n",
            root.join("machines").display()
        ),
    )
    .unwrap();
    std::fs::write(
        root.join("runway.toml"),
        format!(
            r#"[server]
listen = "127.0.0.1:0"
admin_tokens = ["{ADMIN}"]

[runner_api]
poll_timeout = "2s"

[scaling]
interval = "200ms"

[[providers]]
name = "lxd-like"
kind = "exec"
executable = "{provider}"
config_file = "{root}/garm.conf"
max_instances = 1

[[pools]]
name = "garm"
labels = ["garm"]
max_runners = 1
boot_timeout = "120s"
providers = ["lxd-like"]
"#,
            provider = contrib_provider().display(),
            root = root.display(),
        ),
    )
    .unwrap();
    let mut command = runway(root);
    command
        .args(["serve", "--config", "runway.toml"])
        .env("RUNWAY_DATABASE_URL", "sqlite://runway.db")
        // The machine installs runway under $HOME/runway-agent.
        .env("HOME", root);
    let (serve, base) = spawn_serve(command);
    Setup {
        _serve: serve,
        base,
        _machines: RunnerProcesses(root.join("machines")),
        dir,
    }
}

fn api(setup: &Setup, path: &str) -> Value {
    client()
        .get(format!("{}{path}", setup.base))
        .bearer_auth(ADMIN)
        .send()
        .unwrap()
        .json()
        .unwrap()
}

/// The instance token the machine booted with, from its boot script.
fn instance_token(setup: &Setup) -> Option<String> {
    let machines = std::fs::read_dir(setup.dir.path().join("machines")).ok()?;
    for entry in machines.flatten() {
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) != Some("userdata") {
            continue;
        }
        let script = std::fs::read_to_string(&path).ok()?;
        let line = script.lines().find(|l| l.starts_with("BEARER_TOKEN="))?;
        return Some(line["BEARER_TOKEN=".len()..].trim_matches('\'').to_owned());
    }
    None
}

fn metadata_status(setup: &Setup, token: &str, path: &str) -> u16 {
    client()
        .get(format!("{}/api/v1/garm/metadata/{path}", setup.base))
        .bearer_auth(token)
        .send()
        .unwrap()
        .status()
        .as_u16()
}

#[test]
fn a_machine_booted_from_garm_userdata_runs_a_runway_job() {
    let setup = start();
    let flag = setup.dir.path().join("release");
    let submitted: Value = client()
        .post(format!("{}/api/v1/jobs", setup.base))
        .bearer_auth(ADMIN)
        .json(&json!({
            "labels": ["garm"],
            // Holds the job until the test has checked the spent token.
            "script": format!("while [ ! -e {} ]; do sleep 0.1; done; echo ran on $RUNWAY_RUNNER_NAME", flag.display()),
            "timeout_seconds": 120,
        }))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let job = submitted["id"].as_i64().expect("a job id");

    // The machine boots, installs runway, registers and takes the job.
    let mut runner = Value::Null;
    wait_until("the machine's runner to run the job", 120, || {
        runner = api(&setup, "/api/v1/runners")["runners"]
            .as_array()
            .and_then(|r| r.first().cloned())
            .unwrap_or(Value::Null);
        runner["state"] == "busy"
    });
    let token = instance_token(&setup).expect("the boot script holds the instance token");
    assert!(token.starts_with("rwi_"), "{token}");
    // Spent: the runner registered and runs a job.
    for path in [
        "runner-registration-token/",
        "install-script/",
        "system/service-name",
    ] {
        assert_eq!(metadata_status(&setup, &token, path), 401, "{path}");
    }
    assert_eq!(
        metadata_status(&setup, "rwi_not-a-token", "install-script/"),
        401
    );

    // What the machine reported is on the runner.
    let detail = api(&setup, &format!("/api/v1/runners/{}", runner["id"]));
    let reports = detail["reports"].as_array().expect("reports");
    let statuses: Vec<&str> = reports
        .iter()
        .filter(|r| r["phase"] == "garm-status")
        .filter_map(|r| r["body"]["status"].as_str())
        .collect();
    assert!(
        statuses.contains(&"installing") && statuses.last() == Some(&"idle"),
        "{detail}"
    );
    assert!(
        reports.iter().any(|r| r["phase"] == "garm-system-info"),
        "{detail}"
    );

    std::fs::write(&flag, "").unwrap();
    let mut state = String::new();
    let mut log = String::new();
    wait_until("the job to complete", 90, || {
        let response = client()
            .get(format!("{}/api/v1/jobs/{job}/log", setup.base))
            .bearer_auth(ADMIN)
            .send()
            .unwrap();
        state = response
            .headers()
            .get("x-runway-job-state")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        log = response.text().unwrap_or_default();
        state == "completed"
    });
    assert!(
        log.contains(&format!("ran on {}", runner["name"].as_str().unwrap())),
        "{log}"
    );
}
