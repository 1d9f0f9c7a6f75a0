//! A GARM provider and the machine it boots, against `runway serve`, as
//! GARM's own providers do it: `contrib/garm-provider-local` with
//! `boot=userdata` checks `tools` as garm-provider-common's `GetTools` does
//! and runs the pool's `runner_install_template` as the machine's boot
//! script, with nothing of the bootstrap in its environment. The script
//! fetches its install script with the instance token, downloads runway's
//! binary and checks its sha256, takes its one registration token, reports
//! its status and system info, and starts `runway agent --once`, which runs
//! the job. The instance token is useless after that.

use std::path::Path;

use serde_json::{json, Value};

use crate::common;
use common::{client, contrib_provider, runway, spawn_serve, wait_until, Process, RunnerProcesses};

const ADMIN: &str = "garm-machine-admin-token";

/// Dropped in field order: the server, its machines, then the directory.
struct Setup {
    _serve: Process,
    base: String,
    _machines: RunnerProcesses,
    dir: tempfile::TempDir,
}

/// Writes `runway.toml` (`extra` and one pool, `pool`, on the contrib
/// provider booting machines from userdata) and the provider's config, and
/// returns `runway serve` ready to start in `root`.
fn configure(root: &Path, extra: &str, pool: &str) -> std::process::Command {
    configure_boot(root, "boot=userdata", extra, "", pool)
}

/// [`configure`] with the provider's `boot` lines and `provider_keys`.
fn configure_boot(
    root: &Path,
    boot: &str,
    extra: &str,
    provider_keys: &str,
    pool: &str,
) -> std::process::Command {
    std::fs::write(
        root.join("garm.conf"),
        format!(
            "state_dir={}\n{boot}\nstop_grace=2\n",
            root.join("machines").display()
        ),
    )
    .unwrap();
    let head = common::server_head("127.0.0.1:0", ADMIN, "200ms");
    std::fs::write(
        root.join("runway.toml"),
        format!(
            r#"{head}[runner_api]
poll_timeout = "2s"

{extra}
[[providers]]
name = "lxd-like"
kind = "exec"
executable = "{provider}"
config_file = "{root}/garm.conf"
max_instances = 2
{provider_keys}

[[pools]]
max_runners = 1
boot_timeout = "120s"
providers = ["lxd-like"]
{pool}
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
        // The machine installs under $HOME.
        .env("HOME", root);
    command
}

/// The `garm-status` statuses a runner's machine reported, in order.
fn statuses(base: &str, runner: &Value) -> Vec<String> {
    let detail: Value = client()
        .get(format!("{base}/api/v1/runners/{}", runner["id"]))
        .bearer_auth(ADMIN)
        .send()
        .unwrap()
        .json()
        .unwrap();
    detail["reports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["phase"] == "garm-status")
        .filter_map(|r| r["body"]["status"].as_str().map(str::to_owned))
        .collect()
}

fn start() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let command = configure(root, "", "name = \"garm\"\nlabels = [\"garm\"]");
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
    metadata_status_at(&setup.base, token, path)
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
    let reported = statuses(&setup.base, &runner);
    assert!(
        reported.iter().any(|s| s == "installing")
            && reported.last().map(String::as_str) == Some("idle"),
        "{reported:?}"
    );
    let detail = api(&setup, &format!("/api/v1/runners/{}", runner["id"]));
    assert!(
        detail["reports"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r["phase"] == "garm-system-info")),
        "{detail}"
    );

    std::fs::write(&flag, "").unwrap();
    let mut log = String::new();
    wait_until("the job to complete", 90, || {
        let (state, text) = common::job_log(&setup.base, ADMIN, job).expect("the job's log");
        log = text;
        state == "completed"
    });
    assert!(
        log.contains(&format!("ran on {}", runner["name"].as_str().unwrap())),
        "{log}"
    );
}

use runway_testkit::fake_github;

/// The same for a GitHub pool against the fake GitHub: the machine
/// downloads GitHub's runner from the `tools` GitHub lists, fetches its
/// just-in-time configuration as GARM's three files, reports, and starts
/// the runner (here a `run.sh` that records the files it was given).
#[test]
fn a_machine_booted_from_garm_userdata_starts_a_github_jit_runner() {
    github_jit_runner(false);
}

/// The same from a GitHub pool's stock of stopped runners: the stopped
/// machine is started for the job, and the JIT configuration it fetches is
/// the one minted for that start (nothing was registered at GitHub while
/// it was stopped).
#[test]
fn a_stopped_garm_machine_of_a_github_pool_starts_its_jit_runner() {
    github_jit_runner(true);
}

fn github_jit_runner(stock: bool) {
    use fake_github::{Auth, FakeGithub, HOOK_SECRET, TOKEN};
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let fake = runtime.block_on(FakeGithub::start(4_000, Auth::Token));
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // GitHub's runner release, as the fake serves it: a run.sh that
    // records what it was started with.
    let release = root.join("release");
    std::fs::create_dir_all(&release).unwrap();
    std::fs::write(
        release.join("run.sh"),
        "#!/bin/sh\ncat .runner .credentials .credentials_rsaparams > \"$HOME/runner-started.part\"\nmv \"$HOME/runner-started.part\" \"$HOME/runner-started\"\nexec sleep 300\n",
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            release.join("run.sh"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
    }
    let tarball = root.join("runner.tar.gz");
    let status = std::process::Command::new("tar")
        .arg("czf")
        .arg(&tarball)
        .arg("-C")
        .arg(&release)
        .arg("run.sh")
        .status()
        .unwrap();
    assert!(status.success());
    fake.lock().runner_tarball = Some(std::fs::read(&tarball).unwrap());

    let _machines = RunnerProcesses(root.join("machines"));
    let (provider_keys, stock_keys) = if stock {
        ("resume_seconds = 1", "min_stopped = 1\nmax_stopped = 1\n")
    } else {
        ("", "")
    };
    let mut command = configure_boot(
        root,
        "boot=userdata",
        &format!(
            "[github]\napi_url = \"{}\"\ntoken = \"env:RUNWAY_TEST_GITHUB_TOKEN\"\nwebhook_secrets = [\"{HOOK_SECRET}\"]\n",
            fake.url
        ),
        provider_keys,
        &format!("name = \"gh\"\nlabels = [\"self-hosted\", \"linux\"]\n{stock_keys}[pools.github]\norg = \"octo-org\""),
    );
    command.env("RUNWAY_TEST_GITHUB_TOKEN", TOKEN);
    let (_serve, base) = spawn_serve(command);
    let stopped = if stock {
        wait_until("a stopped machine in the stock", 120, || {
            !common::stock_runners(&base, ADMIN, "stopped").is_empty()
        });
        assert!(fake.lock().runners.is_empty(), "registered while stopped");
        common::stock_runners(&base, ADMIN, "stopped")
            .first()
            .copied()
    } else {
        None
    };
    fake.lock().webhook_url = Some(format!("{base}/webhooks/github"));
    fake.queue_job(701, &["self-hosted", "linux"]);
    assert_eq!(runtime.block_on(fake.deliver(701, "queued", false)), 202);

    let started = root.join("runner-started");
    wait_until("the machine to start GitHub's runner", 120, || {
        started.exists()
    });
    let files = std::fs::read_to_string(&started).unwrap();
    let runners = client()
        .get(format!("{base}/api/v1/runners"))
        .bearer_auth(ADMIN)
        .send()
        .unwrap()
        .json::<Value>()
        .unwrap();
    let runner = runners["runners"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["stock"] == false))
        .expect("the started runner");
    if let Some(stopped) = stopped {
        assert_eq!(runner["id"], stopped, "started, not a cold boot: {runners}");
    }
    let name = runner["name"].as_str().expect("a runner");
    let github_id = fake.runner_id(name).expect("registered at GitHub");
    assert_eq!(
        files,
        format!(
            "{}credentials of {name}rsa parameters of {name}",
            json!({"agentId": github_id, "agentName": name, "poolId": 1})
        )
    );
    let reported = statuses(&base, runner);
    assert_eq!(
        reported.last().map(String::as_str),
        Some("idle"),
        "{reported:?}"
    );
    assert!(fake.lock().downloads_listed >= 1);
}

/// A pool's stock of stopped runners on a GARM provider (issue 60), as
/// GARM's `StartInstance` and `StopInstance` drive it: runway creates the
/// machine, which boots once (its boot script, or `runway agent`, asks the
/// instance API for its credential and is told 409: not started for a
/// job), stops it, and starts it for a job. Only then is the instance
/// token the machine was created with armed: the machine takes its one
/// registration token, runs the job, and is deleted; the stock fills up
/// again. The stopped machine's files hold no registration token, and its
/// instance token is spent after the job.
fn a_stopped_garm_machine_is_started_for_one_job(boot: &str) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let _machines = RunnerProcesses(root.join("machines"));
    let command = configure_boot(
        root,
        boot,
        "",
        "resume_seconds = 1",
        "name = \"garm\"\nlabels = [\"garm\"]\nmin_stopped = 1\nmax_stopped = 1",
    );
    let (_serve, base) = spawn_serve(command);
    let stopped = || common::stock_runners(&base, ADMIN, "stopped");
    wait_until("a stopped machine in the stock", 120, || {
        !stopped().is_empty()
    });
    let runner = *stopped().first().unwrap();
    let detail = common::api_get(&base, ADMIN, &format!("/api/v1/runners/{runner}"));
    let name = detail["name"].as_str().expect("a runner name").to_owned();
    // Stopped at GARM, and its files hold no registration token.
    let record: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("machines").join(format!("{name}.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(record["stopped"], true, "{record}");
    let files = std::fs::read_dir(root.join("machines"))
        .unwrap()
        .flatten()
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect::<String>();
    assert!(!files.contains("rwr_"), "{files}");
    // Its instance token is inert: not started for a job.
    let token = files
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        .find(|word| word.starts_with("rwi_"))
        .expect("the machine holds its instance token")
        .to_owned();
    let inert = client()
        .get(format!(
            "{base}/api/v1/garm/metadata/runner-registration-token/"
        ))
        .bearer_auth(&token)
        .send()
        .unwrap();
    assert_eq!(inert.status().as_u16(), 409);
    assert!(inert.text().unwrap().contains("instance_not_started"));

    let job = common::submit_to(
        &base,
        ADMIN,
        &["garm"],
        "echo ran on $RUNWAY_RUNNER_NAME",
        60,
    );
    let mut log = String::new();
    wait_until("the job to complete", 120, || {
        let (state, text) = common::job_log(&base, ADMIN, job).expect("the job's log");
        log = text;
        state == "completed"
    });
    assert!(
        log.contains(&format!("ran on {name}")),
        "started, not a cold boot: {log}"
    );
    assert_eq!(common::job(&base, ADMIN, job)["runner"], runner, "{log}");
    // Deleted after its one job, its token spent; the stock fills again.
    wait_until("the started machine deleted", 60, || {
        !root.join("machines").join(format!("{name}.json")).exists()
    });
    assert_eq!(
        metadata_status_at(&base, &token, "runner-registration-token/"),
        401
    );
    wait_until("a new stopped machine", 120, || {
        stopped().iter().any(|id| *id != runner)
    });
}

fn metadata_status_at(base: &str, token: &str, path: &str) -> u16 {
    client()
        .get(format!("{base}/api/v1/garm/metadata/{path}"))
        .bearer_auth(token)
        .send()
        .unwrap()
        .status()
        .as_u16()
}

/// The machine boots from the pool's install script (GARM's userdata).
#[test]
fn a_stopped_garm_machine_booted_from_userdata_is_started_for_one_job() {
    a_stopped_garm_machine_is_started_for_one_job("boot=userdata");
}

/// The machine runs `runway agent --once` itself, with the instance token
/// in its environment.
#[test]
fn a_stopped_garm_machine_running_the_agent_is_started_for_one_job() {
    let agent = format!(
        "boot=command\ncommand={} agent --once",
        env!("CARGO_BIN_EXE_runway")
    );
    a_stopped_garm_machine_is_started_for_one_job(&agent);
}
