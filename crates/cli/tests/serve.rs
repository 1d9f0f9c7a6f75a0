//! End-to-end: the real `runway` binary, started as a user would, on an
//! ephemeral loopback port.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

use common::{client, PgSchema};
use serde_json::json;

/// `runway ARGS` in `dir` (the shared command: a clean `RUNWAY_*` environment).
fn runway(dir: &Path, args: &[&str]) -> Command {
    let mut command = common::runway(dir);
    command.args(args);
    command
}

/// `runway ARGS` in `dir`, run to its end.
fn run(dir: &Path, args: &[&str]) -> Output {
    runway(dir, args).output().unwrap()
}

/// `runway serve` on an ephemeral port and the database `database`, run to
/// its end (the cases where it cannot start).
fn serve_on_database(dir: &Path, database: &str) -> Output {
    run(
        dir,
        &["serve", "--listen", "127.0.0.1:0", "--database", database],
    )
}

/// A running `runway serve` (the shared harness's), killed on drop if a
/// test fails half-way.
struct Server {
    process: common::Process,
    base: String,
}

impl Server {
    fn start(dir: &Path, extra: &[&str]) -> Server {
        let mut args = vec!["--listen", "127.0.0.1:0"];
        args.extend_from_slice(extra);
        let (process, base) = common::serve_in(dir, &args);
        Server { process, base }
    }

    fn spawn(command: Command) -> Server {
        let (process, base) = common::spawn_serve(command);
        Server { process, base }
    }

    fn get(&self, path: &str) -> (u16, String) {
        common::get(&self.base, path)
    }

    /// Sends SIGTERM and waits (with a deadline) for a clean exit.
    fn terminate(mut self) -> std::process::ExitStatus {
        self.process.terminate()
    }
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Exactly one line on stderr, and a non-zero exit.
fn assert_one_line_failure(output: &Output) -> String {
    assert!(
        !output.status.success(),
        "expected failure, got {:?}",
        output.status
    );
    let stderr = stderr_of(output);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "expected a one-line error, got: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    lines[0].to_owned()
}

/// The product binary lists what operators use; the load generators are
/// `runway-bench`'s.
#[test]
fn help_lists_the_operators_commands_and_no_load_generator() {
    let dir = tempfile::tempdir().unwrap();
    let output = run(dir.path(), &["--help"]);
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for command in ["serve", "submit", "jobs", "agent", "sim"] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(command)),
            "{command} in {help}"
        );
    }
    for generator in ["bench", "soak", "longpoll", "intake"] {
        assert!(
            !help.lines().any(|l| l.trim_start().starts_with(generator)),
            "no {generator} in {help}"
        );
    }
}

#[test]
fn serve_with_no_config_answers_health_readiness_and_status_then_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    assert_eq!(server.get("/healthz"), (200, "ok\n".to_owned()));
    // Every answer carries a request id: the caller's, or a fresh one.
    let client = reqwest::blocking::Client::new();
    let id = |given: Option<&str>| {
        let mut request = client.get(format!("{}/healthz", server.base));
        if let Some(given) = given {
            request = request.header("x-request-id", given);
        }
        let response = request.send().unwrap();
        response.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .to_owned()
    };
    let (first, second) = (id(None), id(None));
    assert!(!first.is_empty() && first != second, "{first} {second}");
    assert_eq!(id(Some("trace-42")), "trace-42");
    assert_eq!(server.get("/readyz"), (200, "ready\n".to_owned()));
    let (status, body) = server.get("/api/v1/status");
    assert_eq!(status, 200);
    let status: serde_json::Value = serde_json::from_str(&body).expect("status is JSON");
    assert_eq!(status["store"], "sqlite");
    assert_eq!(
        status["pools"][0]["name"], "local",
        "the out-of-the-box pool"
    );
    assert!(
        dir.path().join("runway.db").exists(),
        "the default store is runway.db in the working directory"
    );
    let exit = server.terminate();
    assert!(exit.success(), "graceful shutdown exits 0: {exit:?}");
}

#[test]
fn serve_on_postgres_is_ready() {
    let dir = tempfile::tempdir().unwrap();
    let schema = PgSchema::create("runway_cli_test");
    let scoped = schema.scoped.clone();
    let server = Server::start(dir.path(), &["--database", &scoped]);
    assert_eq!(server.get("/readyz").0, 200);
    let (_, body) = server.get("/api/v1/status");
    assert!(body.contains(r#""store":"postgres""#), "{body}");
    assert!(server.terminate().success());
    let tables = schema.psql(&format!(
        "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = '{}' AND table_name IN ('jobs', 'runners')",
        schema.schema
    ));
    assert_eq!(
        String::from_utf8_lossy(&tables.stdout).trim(),
        "2",
        "migrations ran in the schema"
    );
}

#[test]
fn config_file_values_and_flag_overrides() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("runway.toml"),
        "[server]\nlisten = \"127.0.0.1:1\"\ndatabase = \"sqlite://from-file.db\"\n\n[[pools]]\nname = \"linux-large\"\nlabels = [\"self-hosted\", \"large\"]\n",
    )
    .unwrap();
    // --listen beats the file's (unusable) port 1; --database beats its file name.
    let server = Server::start(
        dir.path(),
        &["--config", "runway.toml", "--database", "sqlite://flag.db"],
    );
    let (_, body) = server.get("/api/v1/status");
    assert!(body.contains("linux-large"), "{body}");
    assert!(server.terminate().success());
    assert!(dir.path().join("flag.db").exists());
    assert!(!dir.path().join("from-file.db").exists());
}

#[test]
fn malformed_config_fails_in_one_line_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.toml"),
        "[server]\nlisten = \"127.0.0.1:0\"\nmax_conections = 3\n",
    )
    .unwrap();
    let output = run(dir.path(), &["serve", "--config", "bad.toml"]);
    let line = assert_one_line_failure(&output);
    assert!(line.contains("bad.toml"), "{line}");
    assert!(
        line.contains("[server] max_conections (line 3, column 1)"),
        "{line}"
    );
    assert!(
        !dir.path().join("runway.db").exists(),
        "nothing was created"
    );

    let output = run(dir.path(), &["serve", "--config", "missing.toml"]);
    let line = assert_one_line_failure(&output);
    assert!(
        line.contains("cannot read config file missing.toml"),
        "{line}"
    );
}

#[test]
fn corrupt_database_file_fails_in_one_line_and_is_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("corrupt.db");
    let garbage =
        b"this is not a SQLite database, just bytes that happen to be here.\n".repeat(100);
    std::fs::write(&path, &garbage).unwrap();
    let output = serve_on_database(dir.path(), "corrupt.db");
    let line = assert_one_line_failure(&output);
    assert!(
        line.contains("corrupt.db") && line.contains("not a database"),
        "{line}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        garbage,
        "the file is unchanged"
    );
    assert!(!dir.path().join("corrupt.db-wal").exists());
}

#[test]
fn unwritable_database_path_fails_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    // A path below a regular file can never be created, even as root.
    std::fs::write(dir.path().join("plain-file"), "x").unwrap();
    let output = serve_on_database(dir.path(), "plain-file/runway.db");
    let line = assert_one_line_failure(&output);
    assert!(
        line.contains("plain-file/runway.db") && line.contains("unable to open"),
        "{line}"
    );
}

#[test]
fn unreachable_postgres_fails_in_one_line_without_leaking_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let output = serve_on_database(dir.path(), "postgres://runway:s3cret@127.0.0.1:1/runway");
    let line = assert_one_line_failure(&output);
    assert!(
        line.contains("127.0.0.1:1") && line.contains("refused"),
        "{line}"
    );
    assert!(!line.contains("s3cret"), "{line}");
}

#[test]
fn config_check_prints_the_effective_config_with_secrets_redacted() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("db-url"),
        "postgres://runway:from-file-secret@db/runway\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("runway.toml"),
        "[server]\ndatabase = \"file:db-url\"\n",
    )
    .unwrap();
    let output = run(dir.path(), &["config", "check", "--config", "runway.toml"]);
    assert!(output.status.success(), "{}", stderr_of(&output));
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.contains("database = \"file:"), "{printed}");
    assert!(!printed.contains("from-file-secret"), "{printed}");
    assert!(printed.contains("[[pools]]"), "{printed}");

    let output = run(
        dir.path(),
        &[
            "config",
            "check",
            "--database",
            "postgres://runway:literal-secret@db/runway",
        ],
    );
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        printed.contains("postgres://runway:***@db/runway"),
        "{printed}"
    );
    assert!(!printed.contains("literal-secret"));

    std::fs::write(
        dir.path().join("bad.toml"),
        "[[pools]]\nname = \"x\"\nlabels = []\n",
    )
    .unwrap();
    let output = run(dir.path(), &["config", "check", "--config", "bad.toml"]);
    let line = assert_one_line_failure(&output);
    assert!(line.contains("pools[0].labels"), "{line}");
}

#[test]
fn load_generator_and_admin_commands_against_a_running_server() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("runway.toml"),
        "[server]\nadmin_tokens = [\"env:TEST_ADMIN_TOKEN\"]\n[github]\nwebhook_secrets = [\"env:TEST_WEBHOOK_SECRET\"]\n",
    )
    .unwrap();
    let token = "cli-test-admin-token-0123";
    let secret = "cli-test-webhook-secret";
    let mut command = runway(
        dir.path(),
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--config",
            "runway.toml",
        ],
    );
    command
        .env("TEST_ADMIN_TOKEN", token)
        .env("TEST_WEBHOOK_SECRET", secret);
    let server = Server::spawn(command);
    let url = format!("{}/webhooks/github", server.base);
    let output = common::runway_bench(dir.path())
        .args([
            "intake",
            "--url",
            &url,
            "--count",
            "40",
            "--concurrency",
            "4",
        ])
        .env("RUNWAY_BENCH_SECRET", secret)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr_of(&output));
    let report = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(report.contains("sent        40 webhooks"), "{report}");
    assert!(report.contains("statuses    202: 40"), "{report}");
    assert!(report.contains("p99"), "{report}");

    let admin = |args: &[&str]| {
        let mut full = args.to_vec();
        full.extend_from_slice(&["--url", &server.base]);
        let output = runway(dir.path(), &full)
            .env("RUNWAY_TOKEN", token)
            .output()
            .unwrap();
        assert!(output.status.success(), "{args:?}: {}", stderr_of(&output));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let jobs = admin(&["jobs", "--limit", "10"]);
    let lines: Vec<&str> = jobs.lines().collect();
    assert!(
        lines[0].starts_with("ID  ") && lines[0].contains("STATE"),
        "{jobs}"
    );
    assert_eq!(
        lines.len(),
        12,
        "header, 10 jobs, and a note that there are more: {jobs}"
    );
    assert!(
        lines[1].contains("github") && lines[1].contains("queued") && lines[1].contains("default")
    );
    let pools = admin(&["pools"]);
    assert!(pools.lines().nth(1).unwrap_or("").contains("40"), "{pools}");
    let runners = admin(&["runners"]);
    assert_eq!(runners.lines().count(), 1, "only the header: {runners}");

    let output = run(
        dir.path(),
        &["jobs", "--url", &server.base, "--token", "wrong-token"],
    );
    let line = assert_one_line_failure(&output);
    assert!(line.contains("401") && line.contains("not valid"), "{line}");
    assert!(server.terminate().success());
}

/// `runway config eval build.json [--config CONFIG] --set S…` in `dir`.
fn config_eval(dir: &Path, config: Option<&str>, sets: &[&str]) -> Output {
    let mut command = runway(dir, &["config", "eval", "build.json"]);
    if let Some(config) = config {
        command.args(["--config", config]);
    }
    for set in sets {
        command.args(["--set", set]);
    }
    command.output().unwrap()
}

fn example_worker_config() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/worker-config.json");
    std::fs::read_to_string(path).unwrap()
}

#[test]
fn config_eval_standalone_and_with_declared_providers() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("build.json"), example_worker_config()).unwrap();
    let output = config_eval(
        dir.path(),
        None,
        &[
            "provider=ec2",
            "region=us-east-1",
            "availabilityZone=us-east-1a",
        ],
    );
    assert!(output.status.success(), "{}", stderr_of(&output));
    let result: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        result,
        serde_json::json!({
            "scalingRatio": 1,
            "owner": "build-team@my-open-source-project.com",
            "description": "configuration for builds",
            "ec2": {"ImageId": "ami-12345abcdef", "SubnetID": "sn-302433abcdef"},
        })
    );
    // A provider that does not declare availabilityZone makes the rule an error.
    std::fs::write(
        dir.path().join("runway.toml"),
        "[providers.ec2]\nkind = \"exec\"\nexecutable = \"garm-provider-ec2\"\nrequired_keys = [\"ec2.ImageId\"]\n",
    )
    .unwrap();
    let output = config_eval(dir.path(), Some("runway.toml"), &["provider=ec2"]);
    let line = assert_one_line_failure(&output);
    assert!(
        line.contains("us-east-1a subnets") && line.contains("availabilityZone"),
        "{line}"
    );
    // A declared condition with no value at launch is refused at load:
    // every rule conditioned on it would silently never apply.
    std::fs::write(
        dir.path().join("runway.toml"),
        "[providers.ec2]\nkind = \"exec\"\nexecutable = \"garm-provider-ec2\"\nconditions = [\"availabilityZone\"]\nrequired_keys = [\"ec2.ImageId\"]\n",
    )
    .unwrap();
    let output = run(dir.path(), &["config", "check", "--config", "runway.toml"]);
    let line = assert_one_line_failure(&output);
    assert!(
        line.contains("[providers.ec2] conditions")
            && line.contains("availabilityZone")
            && line.contains("inputs"),
        "{line}"
    );
    std::fs::write(
        dir.path().join("runway.toml"),
        "[providers.ec2]\nkind = \"exec\"\nexecutable = \"garm-provider-ec2\"\nconditions = [\"availabilityZone\"]\ninputs = { availabilityZone = \"us-east-1a\" }\nrequired_keys = [\"ec2.ImageId\"]\n",
    )
    .unwrap();
    // The provider's inputs apply as at launch: its zone's subnet rule holds.
    let output = config_eval(
        dir.path(),
        Some("runway.toml"),
        &["provider=ec2", "region=us-east-1"],
    );
    assert!(output.status.success(), "{}", stderr_of(&output));
    let result: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(result["ec2"]["SubnetID"], "sn-302433abcdef", "{result}");
    let output = config_eval(
        dir.path(),
        Some("runway.toml"),
        &["provider=ec2", "region=us-west-2"],
    );
    let line = assert_one_line_failure(&output);
    assert!(
        line.contains("ec2.ImageId") && line.contains("basic-options"),
        "{line}"
    );
}

#[test]
fn worker_configs_from_the_config_file_are_installed_at_start() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("build.json"), example_worker_config()).unwrap();
    // A GARM provider with no instances, never asked to create one here.
    let provider = dir.path().join("garm-provider-ec2");
    std::fs::write(&provider, "#!/bin/sh\necho '[]'\n").unwrap();
    std::fs::set_permissions(
        &provider,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("runway.toml"),
        r#"[server]
admin_tokens = ["worker-config-cli-token"]

[providers.ec2]
kind = "exec"
executable = "garm-provider-ec2"
conditions = ["availabilityZone"]
inputs = { availabilityZone = "us-east-1a" }

[[worker_configs]]
file = "build.json"

[[worker_configs]]
id = "tests"
pools = ["tests"]

[[worker_configs.rules]]
rule_id = "base"
description = "inline in TOML"
values = { scalingRatio = 2 }
"#,
    )
    .unwrap();
    let check = run(dir.path(), &["config", "check", "--config", "runway.toml"]);
    assert!(check.status.success(), "{}", stderr_of(&check));
    let server = Server::start(dir.path(), &["--config", "runway.toml"]);
    let listed = |base: &str| -> Vec<(String, i64)> {
        let response = reqwest::blocking::Client::new()
            .get(format!("{base}/api/v1/worker-configs"))
            .bearer_auth("worker-config-cli-token")
            .send()
            .unwrap();
        let body: serde_json::Value = response.json().unwrap();
        body["worker_configs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["id"].as_str().unwrap().to_owned(),
                    c["version"].as_i64().unwrap(),
                )
            })
            .collect()
    };
    let installed = listed(&server.base);
    let ids: Vec<&str> = installed.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["build", "tests"]);
    assert!(server.terminate().success());
    // Started again with the same file: nothing changed, so no version
    // moves (launch configurations and the console name versions).
    let server = Server::start(dir.path(), &["--config", "runway.toml"]);
    assert_eq!(listed(&server.base), installed, "unchanged, same versions");
    assert!(server.terminate().success());

    std::fs::write(
        dir.path().join("bad.toml"),
        "[[worker_configs]]\nid = \"a\"\npools = [\"p\"]\n[[worker_configs]]\nid = \"b\"\npools = [\"p\"]\n",
    )
    .unwrap();
    let output = run(dir.path(), &["config", "check", "--config", "bad.toml"]);
    let line = assert_one_line_failure(&output);
    assert!(
        line.contains("worker_configs[1].pools") && line.contains("\"a\""),
        "{line}"
    );
}

/// `GET /api/v1/tasks`: every background worker with its state, and when
/// the database goes away (its schema dropped), the failing workers' last
/// error and consecutive failures.
#[test]
fn background_workers_show_their_state_and_failures() {
    let dir = tempfile::tempdir().unwrap();
    let schema = PgSchema::create("runway_cli_tasks");
    std::fs::write(
        dir.path().join("runway.toml"),
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_tokens = [\"tasks-admin-token\"]\n\
         [runner_api]\nlease = \"2s\"\n[scaling]\ninterval = \"200ms\"\n\
         [[providers]]\nname = \"sim\"\nkind = \"sim\"\n\
         [[pools]]\nname = \"p\"\nlabels = [\"x\"]\nproviders = [\"sim\"]\n",
    )
    .unwrap();
    let (_server, base) = common::serve_in(
        dir.path(),
        &["--config", "runway.toml", "--database", &schema.scoped],
    );
    let tasks =
        || -> serde_json::Value { common::api_get(&base, "tasks-admin-token", "/api/v1/tasks") };
    let task = |all: &serde_json::Value, name: &str| -> serde_json::Value {
        all["tasks"]
            .as_array()
            .and_then(|tasks| tasks.iter().find(|t| t["name"] == name).cloned())
            .unwrap_or_default()
    };
    common::wait_until("every worker to have run", 30, || {
        let all = tasks();
        ["leadership", "sweep_leases", "reconcile"]
            .iter()
            .all(|name| task(&all, name)["runs"].as_u64().unwrap_or(0) > 0)
    });
    let all = tasks();
    assert_eq!(all["leading"], true, "{all}");
    let reconcile = task(&all, "reconcile");
    assert_eq!(reconcile["leader_only"], true, "{all}");
    assert_eq!(reconcile["consecutive_failures"], 0, "{all}");
    assert!(reconcile["last_error"].is_null(), "{all}");

    schema.psql(&format!("DROP SCHEMA {} CASCADE", schema.schema));
    common::wait_until("the sweeper to fail twice in a row", 60, || {
        task(&tasks(), "sweep_leases")["consecutive_failures"]
            .as_u64()
            .unwrap_or(0)
            >= 2
    });
    let sweeper = task(&tasks(), "sweep_leases");
    assert!(
        ["backing_off", "running"].contains(&sweeper["state"].as_str().unwrap_or("")),
        "{sweeper}"
    );
    assert!(
        sweeper["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("database")),
        "{sweeper}"
    );
}

/// A worker configuration with a key its pool's EC2 provider does not
/// know is refused where the operator is: by `runway config check` and by
/// `serve` at start, each naming the key (not when a job first needs a
/// runner, at 3 a.m.).
#[test]
fn an_unknown_ec2_key_is_refused_by_config_check_and_serve() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("runway.toml"),
        r#"[server]
listen = "127.0.0.1:0"

[providers.aws]
kind = "ec2"
region = "us-east-1"
instance_types = ["m5.large"]
zones = ["us-east-1a"]

[[pools]]
name = "linux"
labels = ["linux"]
providers = ["aws"]

[[worker_configs]]
id = "linux"
pools = ["linux"]
[[worker_configs.rules]]
rule_id = "network"
values = { ec2 = { ImageId = "ami-1", SecurityGroupId = ["sg-1"] } }
"#,
    )
    .unwrap();
    for command in [
        &["config", "check", "--config", "runway.toml"][..],
        &["serve", "--config", "runway.toml"][..],
    ] {
        let output = run(dir.path(), command);
        let line = assert_one_line_failure(&output);
        assert!(
            line.contains("ec2.SecurityGroupId") && line.contains("worker_configs[0]"),
            "{command:?}: {line}"
        );
    }
}

/// A worker configuration that mounts a host path outside the container
/// provider's `allowed_mounts` (or climbs out of one with `..`), or adds a
/// capability outside its `allowed_capabilities`, is refused where it is
/// written — `runway config check`, `serve`, and a PUT to a running
/// runway — naming the rule, the key and the value; not first at launch,
/// where the operator would learn of it from a stuck job.
#[test]
fn forbidden_container_values_are_refused_where_they_are_written() {
    const ADMIN: &str = "forbidden-values-admin-token";
    let dir = tempfile::tempdir().unwrap();
    let config = |values: &str| {
        format!(
            r#"[server]
listen = "127.0.0.1:0"
admin_tokens = ["{ADMIN}"]

[providers.box]
kind = "container"
socket = "/nonexistent/engine.sock"
image = "debian:bookworm-slim"
allowed_mounts = ["/srv/shared"]
allowed_capabilities = ["CAP_NET_ADMIN"]

[[pools]]
name = "linux"
labels = ["linux"]
providers = ["box"]

[[worker_configs]]
id = "linux"
pools = ["linux"]
[[worker_configs.rules]]
rule_id = "risky"
values = {values}
"#
        )
    };
    let forbidden = [
        (
            r#"{ container = { mounts = [{ source = "/etc", target = "/host-etc" }] } }"#,
            "container.mounts",
            "/etc",
        ),
        (
            r#"{ container = { mounts = [{ source = "/srv/shared/../../etc", target = "/x" }] } }"#,
            "container.mounts",
            "/srv/shared/../../etc",
        ),
        (
            r#"{ container = { capabilities = ["CAP_SYS_ADMIN"] } }"#,
            "container.capabilities",
            "CAP_SYS_ADMIN",
        ),
    ];
    for (values, key, value) in forbidden {
        std::fs::write(dir.path().join("runway.toml"), config(values)).unwrap();
        for command in [
            &["config", "check", "--config", "runway.toml"][..],
            &["serve", "--config", "runway.toml"][..],
        ] {
            let output = run(dir.path(), command);
            let line = assert_one_line_failure(&output);
            assert!(
                line.contains("\"risky\"") && line.contains(key) && line.contains(value),
                "{command:?}: {line}"
            );
        }
    }

    // What is allowed starts; a PUT of a forbidden rule is a 422 naming
    // it, and the stored configuration is unchanged.
    let allowed = r#"{ container = { mounts = [{ source = "/srv/shared/cache", target = "/cache" }], capabilities = ["CAP_NET_ADMIN"] } }"#;
    std::fs::write(dir.path().join("runway.toml"), config(allowed)).unwrap();
    let (_server, base) = common::serve_in(dir.path(), &["--config", "runway.toml"]);
    let before = common::api_get(&base, ADMIN, "/api/v1/worker-configs/linux");
    assert_eq!(before["rules"][0]["rule_id"], "risky", "{before}");
    for (mounts, capabilities, key, value) in [
        (
            json!([{"source": "/etc", "target": "/host-etc"}]),
            json!([]),
            "container.mounts",
            "/etc",
        ),
        (
            json!([]),
            json!(["CAP_SYS_ADMIN"]),
            "container.capabilities",
            "CAP_SYS_ADMIN",
        ),
    ] {
        let body = json!({
            "id": "linux",
            "pools": ["linux"],
            "rules": [{"rule_id": "risky", "description": "", "conditions": null,
                       "values": {"container": {"mounts": mounts, "capabilities": capabilities}}}],
        });
        let answer = client()
            .put(format!("{base}/api/v1/worker-configs/linux"))
            .bearer_auth(ADMIN)
            .json(&body)
            .send()
            .unwrap();
        assert_eq!(answer.status(), 422, "{key}");
        let text = answer.text().unwrap();
        assert!(
            text.contains("risky") && text.contains(key) && text.contains(value),
            "{text}"
        );
    }
    let after = common::api_get(&base, ADMIN, "/api/v1/worker-configs/linux");
    assert_eq!(after, before, "a refused PUT changes nothing");
}

/// Stopped runners on the real binary with the `sim` provider (issue 60):
/// `config check`, `sim` and `serve` take a pool that keeps them; `serve`
/// prepares the stock, stops it once up, and starts one for a submitted job
/// instead of a cold boot, as `GET /api/v1/runners` shows. A GitHub pool
/// is refused the keys in one line.
#[test]
fn serve_keeps_a_stock_of_stopped_runners_and_starts_one_for_a_job() {
    const ADMIN: &str = "stock-admin-token-0123456789";
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("runway.toml"),
        format!(
            "[server]\nadmin_tokens = [\"{ADMIN}\"]\n\n[scaling]\ninterval = \"1s\"\n\n[providers.cloud]\nkind = \"sim\"\nboot_seconds = 1\nresume_seconds = 1\n\n[[pools]]\nname = \"linux\"\nlabels = [\"linux\"]\nmin_stopped = 2\nmax_stopped = 2\n"
        ),
    )
    .unwrap();
    let check = run(dir.path(), &["config", "check", "--config", "runway.toml"]);
    assert!(check.status.success(), "{}", stderr_of(&check));
    let sim = run(
        dir.path(),
        &[
            "sim",
            "--config",
            "runway.toml",
            "--workload",
            "poisson",
            "--days",
            "1",
            "--jobs",
            "200",
            "--policy",
            "runway,runway+stopped",
        ],
    );
    assert!(sim.status.success(), "{}", stderr_of(&sim));
    assert!(String::from_utf8_lossy(&sim.stdout).contains("runway+stopped"));

    let server = Server::start(dir.path(), &["--config", "runway.toml"]);
    let runners = || {
        common::api_get(&server.base, ADMIN, "/api/v1/runners")["runners"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let stock_in = |runners: &[serde_json::Value], state: &str| {
        runners
            .iter()
            .filter(|r| r["stock"] == true && r["state"] == state)
            .count()
    };
    common::wait_until("two stopped runners", 30, || {
        stock_in(&runners(), "stopped") == 2
    });
    let stopped = runners();
    assert!(
        stopped.iter().all(|r| r["stopped_at"].is_string()),
        "{stopped:?}"
    );
    let pools = common::api_get(&server.base, ADMIN, "/api/v1/pools");
    let stock = &pools["pools"][0]["stock"];
    assert_eq!(
        (&stock["stopped"], &stock["max_stopped"]),
        (&serde_json::json!(2), &serde_json::json!(2)),
        "{pools}"
    );
    // Two disks at 3 % of the sim provider's default $0.10 an hour.
    let cost = stock["cost_per_hour"].as_f64().unwrap_or(0.0);
    assert!((cost - 0.006).abs() < 1e-9, "{pools}");
    common::submit(&server.base, ADMIN, "true");
    common::wait_until("a started runner, idle", 30, || {
        runners()
            .iter()
            .any(|r| r["stock"] == false && r["state"] == "idle")
    });
    let all = runners();
    assert_eq!(
        all.iter().filter(|r| r["stock"] == false).count(),
        1,
        "one started, no cold boot: {all:?}"
    );
    assert!(server.terminate().success());

    // A webhook-fed GitHub pool keeps a stock (its JIT configurations are
    // minted at the starts); a scale-set pool cannot yet.
    let github = "[github]\ntoken = \"ghp_not-a-real-token\"\n[providers.cloud]\nkind = \"sim\"\nresume_seconds = 20\n\n[[pools]]\nname = \"gh\"\nlabels = [\"linux\"]\nmax_stopped = 4\n[pools.github]\norg = \"acme\"\n";
    std::fs::write(dir.path().join("github.toml"), github).unwrap();
    let checked = run(dir.path(), &["config", "check", "--config", "github.toml"]);
    assert!(checked.status.success(), "{checked:?}");
    std::fs::write(
        dir.path().join("scale-set.toml"),
        format!("{github}scale_set = \"linux\"\n"),
    )
    .unwrap();
    let refused = run(
        dir.path(),
        &["config", "check", "--config", "scale-set.toml"],
    );
    let line = assert_one_line_failure(&refused);
    assert!(
        line.contains("max_stopped") && line.contains("scale-set"),
        "{line}"
    );
}
