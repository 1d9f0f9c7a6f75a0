//! The `container` provider against a real Podman (its Docker-compatible
//! API on a unix socket), with `runway serve` and `runway submit` as a user
//! drives them. The test starts its own `podman system service` with its
//! own storage in a temporary directory and builds its image there, with
//! no registry: `podman import` of busybox-static, `/bin/sh`, and the
//! shared libraries runway links (runway itself is mounted read-only by
//! the provider). Containers use the host's network (loopback only; no
//! bridge). Needs `podman`, `runc` and `busybox` (`.ci/run` installs them):
//! without them the tests fail under CI and are skipped elsewhere.

use crate::common;
use runway_testkit::podman;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{client, wait_until};
use serde_json::{json, Value};

const ADMIN: &str = "container-admin-token";

fn write_config(dir: &Path, podman: &podman::Podman, listen: &str, max_instances: u32) {
    let head = common::server_head(listen, ADMIN, "200ms");
    std::fs::write(
        dir.join("runway.toml"),
        format!(
            r#"{head}[runner_api]
poll_timeout = "2s"

[providers.podman]
kind = "container"
socket = "{socket}"
image = "{image}"
pull = "never"
network = "host"
memory_mb = 96
pids_limit = 512
stop_grace = "2s"
max_instances = {max_instances}
boot_seconds = 1
required_keys = ["container.pids_limit"]

[[worker_configs]]
id = "boxes"
pools = ["boxes"]

[[worker_configs.rules]]
rule_id = "limits"
description = "the pool's own process limit"
values = {{ container = {{ pids_limit = 300 }} }}

[[pools]]
name = "boxes"
labels = ["box"]
max_runners = {max_instances}
idle_grace = "1s"
boot_timeout = "60s"
providers = ["podman"]
"#,
            socket = podman.socket.display(),
            image = podman::IMAGE,
        ),
    )
    .unwrap();
}

fn submit(base: &str, script: &str) -> i64 {
    common::submit_to(base, ADMIN, &["box"], script, 60)
}

fn get(base: &str, path: &str) -> Value {
    common::api_get(base, ADMIN, path)
}

/// Waits for job `id` to finish; its record and its log's tail.
fn finished(base: &str, id: i64, seconds: u64) -> (Value, String) {
    let mut job = Value::Null;
    wait_until(&format!("job {id} to finish"), seconds, || {
        job = get(base, &format!("/api/v1/jobs/{id}"));
        matches!(
            job["state"].as_str(),
            Some("completed" | "failed" | "cancelled")
        )
    });
    let log = common::log_text(base, ADMIN, id);
    (job, log)
}

#[test]
fn each_job_gets_a_fresh_container_that_is_removed_after_it() {
    let Some(podman) = podman::podman(&[PathBuf::from(common::RUNWAY)]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &podman, "127.0.0.1:0", 4);
    // Secrets in runway's own environment (as `env:` config values and
    // cloud credentials are): none may reach a container or a job.
    let mut command = common::runway(dir.path());
    command
        .args(["serve", "--config", "runway.toml"])
        .env("AWS_SECRET_ACCESS_KEY", "aws-secret-in-runways-env")
        .env("RUNWAY_WEBHOOK_SECRET", "webhook-secret-in-runways-env");
    let (_server, base) = common::spawn_serve(command);

    // In a container: PID 1 is the container's own (the agent, which the
    // entry shell became), not the host's init.
    let first = submit(
        &base,
        "echo pid1=$(tr '\\0' ' ' < /proc/1/cmdline); touch /tmp/left-behind; env",
    );
    let (job, log) = finished(&base, first, 90);
    assert_eq!(job["conclusion"], "success", "{job} {log}");
    assert!(log.contains("pid1=runway agent --once"), "{log}");
    // The job's environment holds none of runway's bootstrap.
    for secret in [
        "RUNWAY_REGISTRATION_TOKEN",
        "rwr_",
        "RUNWAY_URL",
        "aws-secret-in-runways-env",
        "webhook-secret-in-runways-env",
        ADMIN,
    ] {
        assert!(!log.contains(secret), "{secret} in the job's env:\n{log}");
    }
    // The next job's container is a fresh one (submitted as a user would).
    let output = common::runway(dir.path())
        .args([
            "submit", "--url", &base, "--token", ADMIN, "--labels", "box",
        ])
        .args(["--wait", "--wait-seconds", "90", "--"])
        .arg("test -e /tmp/left-behind && echo dirty || echo clean")
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{printed} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(printed.trim(), "clean");

    // A job over its memory limit: killed, and said to be out of memory.
    let hog = submit(&base, "x=a; while true; do x=\"$x$x$x$x\"; done");
    let (job, log) = finished(&base, hog, 120);
    assert_ne!(job["conclusion"], "success", "{job}");
    assert!(log.contains("out of memory"), "{job} {log}");

    // Every runner's container is removed once it is done.
    wait_until("no container left", 60, || podman.containers().is_empty());
}

#[test]
fn at_most_max_instances_containers_run_and_every_job_completes() {
    let Some(podman) = podman::podman(&[PathBuf::from(common::RUNWAY)]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &podman, "127.0.0.1:0", 4);
    let (_server, base) = common::serve_in(dir.path(), &["--config", "runway.toml"]);
    let ids: Vec<i64> = (0..20)
        .map(|i| submit(&base, &format!("sleep 0.$((RANDOM % 5)); echo job-{i}")))
        .collect();
    let mut most = 0;
    let mut inspected = 0;
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let containers = podman.containers();
        most = most.max(containers.len());
        // A runner's container holds no secret in its configuration: the
        // bootstrap is a file it read and deleted.
        if let Some(name) = containers.first() {
            let configuration = podman.inspect(name);
            if configuration.contains("io.runway.runner") {
                inspected += 1;
                for secret in ["rwr_", "RUNWAY_REGISTRATION_TOKEN", "RUNWAY_URL=", ADMIN] {
                    assert!(!configuration.contains(secret), "{secret}: {configuration}");
                }
            }
        }
        let done = ids
            .iter()
            .filter(|id| get(&base, &format!("/api/v1/jobs/{id}"))["state"] == "completed")
            .count();
        if done == ids.len() {
            break;
        }
        assert!(Instant::now() < deadline, "{done} of 20 completed");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(most <= 4, "at most 4 containers at once, saw {most}");
    assert!(most >= 2, "the jobs ran side by side, saw {most}");
    assert!(inspected > 0, "no runner's container was inspected");
}

/// A loopback HTTP endpoint that answers 503 until opened, then 200: what
/// a job waits on (a container on the host network reaches it) so that it
/// runs exactly as long as a test needs, not a guessed number of seconds.
struct Gate {
    url: String,
    open: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Gate {
    fn start() -> Gate {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let open = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let opened = open.clone();
        // Ends with the test process; each answer closes its connection.
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let mut request = [0u8; 1024];
                let _ = stream.read(&mut request);
                let status = if opened.load(std::sync::atomic::Ordering::SeqCst) {
                    "200 OK"
                } else {
                    "503 Service Unavailable"
                };
                let _ = stream.write_all(
                    format!("HTTP/1.0 {status}\r\ncontent-length: 0\r\n\r\n").as_bytes(),
                );
            }
        });
        Gate { url, open }
    }

    fn open(&self) {
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn kill_9_of_runway_leaves_no_container_behind_and_removes_no_busy_one() {
    let Some(podman) = podman::podman(&[PathBuf::from(common::RUNWAY)]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", common::free_port());
    write_config(dir.path(), &podman, &listen, 10);
    let (mut server, base) = common::serve_in(dir.path(), &["--config", "runway.toml"]);
    // Ten jobs that run until the test opens the gate (however slowly
    // their containers start, all ten are at work at once), then print
    // that they finished.
    let gate = Gate::start();
    let ids: Vec<i64> = (0..10)
        .map(|i| {
            submit(
                &base,
                &format!(
                    "until /bin/busybox wget -q -O /dev/null {}; do sleep 0.2; done; echo finished-{i}",
                    gate.url
                ),
            )
        })
        .collect();
    wait_until("ten jobs running", 90, || {
        ids.iter()
            .filter(|id| get(&base, &format!("/api/v1/jobs/{id}"))["state"] == "running")
            .count()
            == 10
    });
    let running = podman.containers();
    assert_eq!(running.len(), 10, "{running:?}");
    // kill -9, then start again on the same port and store.
    let pid = server.0.id() as i32;
    // SAFETY: kill(2) on the child we started.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    let _ = server.0.wait();
    drop(server);
    let (_server, base) = common::serve_in(dir.path(), &["--config", "runway.toml"]);
    gate.open();
    for id in &ids {
        let (job, log) = finished(&base, *id, 120);
        assert_eq!(job["conclusion"], "success", "{job} {log}");
        assert!(log.contains("finished-"), "{log}");
    }
    wait_until("every container adopted and removed", 60, || {
        podman.containers().is_empty()
    });
    // Each job ran once: no busy container was removed under its job.
    let metrics = common::metrics_text(&base);
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("runway_runners_crashed_total") && !l.ends_with(" 0")),
        "{metrics}"
    );
}

#[test]
fn a_stopped_engine_is_backed_off_with_its_reason_and_used_again_when_back() {
    let Some(mut podman) = podman::podman(&[PathBuf::from(common::RUNWAY)]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &podman, "127.0.0.1:0", 4);
    let (_server, base) = common::serve_in(dir.path(), &["--config", "runway.toml"]);
    let first = submit(&base, "echo before");
    assert_eq!(finished(&base, first, 90).0["conclusion"], "success");
    wait_until("the first container removed", 60, || {
        podman.containers().is_empty()
    });
    podman.stop_service();
    let id = submit(&base, "echo after");
    // The job waits on a provider that backs off, and says why.
    let mut waiting = Value::Null;
    wait_until("the engine's failure in the job's explanation", 60, || {
        waiting = get(&base, &format!("/api/v1/jobs/{id}"))["waiting"].clone();
        waiting.to_string().contains("container engine")
    });
    assert_eq!(
        get(&base, &format!("/api/v1/jobs/{id}"))["state"],
        "queued",
        "{waiting}"
    );
    // And among the replica's tasks, as the console's tasks page shows it.
    let tasks = get(&base, "/api/v1/tasks");
    let backing_off = tasks["providers_backing_off"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        backing_off.iter().any(|b| b["provider"] == "podman"
            && b["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("container engine"))),
        "{tasks}"
    );
    // Back: runway carries on, no restart.
    podman.start_service();
    let (job, log) = finished(&base, id, 180);
    assert_eq!(job["conclusion"], "success", "{job} {log}");
    assert!(log.contains("after"), "{log}");
}

#[test]
fn a_cancelled_job_and_one_past_its_timeout_have_their_containers_removed() {
    let Some(podman) = podman::podman(&[PathBuf::from(common::RUNWAY)]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &podman, "127.0.0.1:0", 4);
    let (_server, base) = common::serve_in(dir.path(), &["--config", "runway.toml"]);
    let body: Value = client()
        .post(format!("{base}/api/v1/jobs"))
        .bearer_auth(ADMIN)
        .json(&json!({"labels": ["box"], "script": "sleep 600", "timeout_seconds": 3}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let timed_out = body["id"].as_i64().unwrap();
    let cancelled = submit(&base, "sleep 600");
    wait_until("the second job running", 90, || {
        get(&base, &format!("/api/v1/jobs/{cancelled}"))["state"] == "running"
    });
    // The pool's worker configuration set its containers' process limit.
    let running = podman.containers();
    assert!(!running.is_empty());
    for name in &running {
        let inspected = podman.inspect(name);
        assert!(inspected.contains("\"PidsLimit\": 300"), "{inspected}");
    }
    let answer = client()
        .post(format!("{base}/api/v1/jobs/{cancelled}/cancel"))
        .bearer_auth(ADMIN)
        .json(&json!({"reason": "not needed"}))
        .send()
        .unwrap();
    assert!(answer.status().is_success(), "{:?}", answer.text());
    let (job, _) = finished(&base, timed_out, 90);
    assert_eq!(job["conclusion"], "timed_out", "{job}");
    let (job, _) = finished(&base, cancelled, 90);
    assert_eq!(job["state"], "cancelled", "{job}");
    wait_until("both containers removed", 90, || {
        podman.containers().is_empty()
    });
}

/// Two `container` providers of one installation on one engine serve one
/// pool: each lists only the containers labelled with its own name, so
/// neither removes the other's busy containers as orphans. Four 30-s jobs
/// run at once, two on each: every one completes on its first runner.
#[test]
fn two_container_providers_on_one_engine_never_remove_each_others_runners() {
    let Some(podman) = podman::podman(&[PathBuf::from(common::RUNWAY)]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &podman, "127.0.0.1:0", 2);
    let config = std::fs::read_to_string(dir.path().join("runway.toml")).unwrap();
    let (head, rest) = config.split_once("[providers.podman]").unwrap();
    let (provider, tail) = rest.split_once("\n\n").unwrap();
    let config =
        format!("{head}[providers.podman-a]{provider}\n\n[providers.podman-b]{provider}\n\n{tail}")
            .replace("max_runners = 2", "max_runners = 4")
            .replace(
                "providers = [\"podman\"]",
                "providers = [\"podman-a\", \"podman-b\"]",
            );
    std::fs::write(dir.path().join("runway.toml"), config).unwrap();
    let (_server, base) = common::serve_in(dir.path(), &["--config", "runway.toml"]);
    let ids: Vec<i64> = (0..4)
        .map(|i| submit(&base, &format!("sleep 30; echo long-{i}")))
        .collect();
    let mut most = 0;
    wait_until("four containers running at once", 60, || {
        most = most.max(podman.containers().len());
        most >= 4
    });
    for id in ids {
        let (job, log) = finished(&base, id, 120);
        assert_eq!(job["state"], "completed", "{job}\n{log}");
        assert_eq!(job["conclusion"], "success", "{job}\n{log}");
        assert_eq!(job["attempts"], 0, "its runner was lost: {job}");
    }
    let runners = get(&base, "/api/v1/runners");
    for runner in runners["runners"].as_array().cloned().unwrap_or_default() {
        assert_ne!(runner["state"], "crashed", "{runner}");
    }
}

#[test]
fn stopped_runners_are_containers_created_and_started_with_their_credential_for_one_job_each() {
    let Some(podman) = podman::podman(&[PathBuf::from(common::RUNWAY)]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &podman, "127.0.0.1:0", 4);
    let path = dir.path().join("runway.toml");
    let config = std::fs::read_to_string(&path)
        .unwrap()
        .replace(
            "boot_seconds = 1\n",
            "boot_seconds = 1\nresume_seconds = 1\n",
        )
        .replace(
            "idle_grace = \"1s\"\n",
            "idle_grace = \"1s\"\nmin_stopped = 2\nmax_stopped = 2\n",
        );
    std::fs::write(&path, config).unwrap();
    let (_server, base) = common::serve_in(dir.path(), &["--config", "runway.toml"]);

    // The stock: two containers created, not started, with no credential.
    wait_until("two stopped runners", 60, || {
        common::stock_runners(&base, ADMIN, "stopped").len() == 2
    });
    let stopped = common::stock_runners(&base, ADMIN, "stopped");
    for name in podman.containers() {
        let inspected = podman.inspect(&name);
        assert!(inspected.contains("\"Status\": \"created\""), "{inspected}");
        assert!(!inspected.contains("rwr_"), "{inspected}");
    }
    let pools = get(&base, "/api/v1/pools");
    let stock = &pools["pools"][0]["stock"];
    assert_eq!(stock["stopped"], 2, "{pools}");

    // Two jobs: each taken by a stopped runner started for it (its
    // registration token minted at the start), one job each, and its
    // container removed after; the stock is made up again.
    let jobs = [submit(&base, "echo one"), submit(&base, "echo two")];
    let mut runners = Vec::new();
    for job in jobs {
        let (done, log) = finished(&base, job, 90);
        assert_eq!(done["conclusion"], "success", "{done} {log}");
        runners.push(done["runner"].as_i64().unwrap());
    }
    let runners: std::collections::BTreeSet<i64> = runners.into_iter().collect();
    assert_eq!(runners, stopped, "served by the stopped runners");
    assert!(
        common::metric(
            &base,
            r#"runway_stopped_runner_starts_total{pool="boxes",kind="started"}"#
        ) >= 2.0
    );
    wait_until(
        "the stock made up again, the used containers gone",
        90,
        || {
            let fresh = common::stock_runners(&base, ADMIN, "stopped");
            fresh.len() == 2
                && fresh.iter().all(|id| !stopped.contains(id))
                && podman.containers().len() == 2
        },
    );
}
