//! `runway serve` with a scale-set pool, as a user runs it, against the
//! `scaleset` crate's emulator of GitHub's runner scale-set service (an
//! implementation runway's authors did not write): runway creates the scale
//! set, holds its message session, acquires and stores each job, starts one
//! JIT runner per job (a `process` provider whose "machine" records its
//! configuration), keeps a runner that runs a job, removes it when the job
//! completes, and survives the emulator's faults and its own kill -9.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::{client, metric, runway, spawn_serve, wait_until, Process, RunnerProcesses};
use scaleset::testing::{Emulator, EmulatorBuilder, Endpoint, Fault, JobState, DEFAULT_PAT};
use scaleset::ScaleSetId;
use serde_json::Value;

const ADMIN: &str = "scale-set-admin-token";
const SCALE_SET: &str = "runway-linux";

struct Harness {
    runtime: tokio::runtime::Runtime,
    emulator: Emulator,
    dir: tempfile::TempDir,
    serve: Option<Process>,
    base: String,
    processes: RunnerProcesses,
}

fn write_config(dir: &Path, github: &str, max_runners: u32, min_idle: u32) {
    let log = dir.join("jit.log");
    let head = common::server_head("127.0.0.1:0", ADMIN, "200ms");
    std::fs::write(
        dir.join("runway.toml"),
        format!(
            r#"{head}[github]
api_url = "{github}/api/v3"
token = "env:RUNWAY_TEST_GITHUB_TOKEN"

{machines}[[pools]]
name = "ss"
labels = ["self-hosted", "linux"]
max_runners = {max_runners}
min_idle = {min_idle}
idle_grace = "0s"
providers = ["machines"]
[pools.github]
org = "org"
scale_set = "{SCALE_SET}"
"#,
            machines = common::jit_log_provider(&log, "1s"),
        ),
    )
    .unwrap();
}

impl Harness {
    /// An emulator (300 ms long polls) and runway serving a scale-set pool.
    fn start(max_runners: u32, min_idle: u32) -> Harness {
        let mut harness = Harness::prepare(|emulator| emulator, max_runners, min_idle);
        harness.serve();
        harness
    }

    /// An emulator (300 ms long polls, then whatever `emulator` sets) and
    /// the config, runway not started yet: the test may set the emulator
    /// up or change the config first.
    fn prepare(
        emulator: impl FnOnce(EmulatorBuilder) -> EmulatorBuilder,
        max_runners: u32,
        min_idle: u32,
    ) -> Harness {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let emulator = runtime
            .block_on(emulator(Emulator::builder().long_poll(Duration::from_millis(300))).start());
        let dir = tempfile::tempdir().unwrap();
        write_config(dir.path(), &emulator.uri(), max_runners, min_idle);
        let processes = RunnerProcesses(dir.path().join("processes"));
        Harness {
            runtime,
            emulator,
            dir,
            serve: None,
            base: String::new(),
            processes,
        }
    }

    fn config(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("runway.toml")).unwrap()
    }

    fn set_config(&self, text: &str) {
        std::fs::write(self.dir.path().join("runway.toml"), text).unwrap();
    }

    /// `POST /api/v1/config/reload`: its answer.
    fn reload(&self) -> Value {
        client()
            .post(format!("{}/api/v1/config/reload", self.base))
            .bearer_auth(ADMIN)
            .json(&serde_json::json!({}))
            .send()
            .and_then(|r| r.json())
            .unwrap_or_default()
    }

    /// (Re)starts `runway serve` on the same store and config.
    fn serve(&mut self) {
        let mut command = runway(self.dir.path());
        command
            .args(["serve", "--config", "runway.toml"])
            .env("RUNWAY_TEST_GITHUB_TOKEN", DEFAULT_PAT);
        let (serve, base) = spawn_serve(command);
        self.serve = Some(serve);
        self.base = base;
    }

    fn kill(&mut self) {
        if let Some(mut serve) = self.serve.take() {
            serve.0.kill().unwrap();
            serve.0.wait().unwrap();
        }
    }

    /// The scale set's id, once runway has created it with a session.
    fn scale_set(&self) -> ScaleSetId {
        let mut id = None;
        wait_until(
            "runway to create the scale set and open its session",
            30,
            || {
                let state = self.emulator.state();
                id = state
                    .scale_sets
                    .iter()
                    .find(|s| s.name == SCALE_SET)
                    .map(|s| s.id)
                    .filter(|id| state.sessions.iter().any(|s| s.scale_set_id == *id));
                id.is_some()
            },
        );
        id.unwrap()
    }

    /// Deletes scale set `set` as GitHub does (with its jobs).
    fn delete_scale_set(&self, set: ScaleSetId) {
        self.runtime.block_on(async {
            self.emulator
                .client()
                .delete_runner_scale_set(set)
                .await
                .unwrap();
        });
    }

    fn api(&self, path: &str) -> Value {
        common::api_get(&self.base, ADMIN, path)
    }

    /// runway's jobs of the pool, oldest first.
    fn jobs(&self) -> Vec<Value> {
        let mut jobs = self.api("/api/v1/jobs?pool=ss&limit=200")["jobs"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        jobs.reverse();
        jobs
    }

    fn job_states(&self) -> Vec<String> {
        self.jobs()
            .iter()
            .map(|j| j["state"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    fn runners(&self) -> Vec<Value> {
        self.api("/api/v1/runners")["runners"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    fn live_runners(&self) -> Vec<Value> {
        self.runners()
            .into_iter()
            .filter(|r| !matches!(r["state"].as_str(), Some("terminated" | "failed" | "lost")))
            .collect()
    }

    /// Names of the runners whose process was started with a JIT config.
    fn started_with_jit(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("jit.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(_, jit)| !jit.trim().is_empty())
            .map(|(name, _)| name.to_owned())
            .collect()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.kill();
    }
}

#[test]
fn each_job_gets_its_own_jit_runner_a_busy_runner_is_kept_and_the_pool_returns_to_min_idle() {
    let h = Harness::start(4, 1);
    let set = h.scale_set();
    let state = h.emulator.state();
    let created = state.scale_sets.iter().find(|s| s.id == set).unwrap();
    let labels: Vec<&str> = created.labels.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(labels, vec![SCALE_SET, "self-hosted", "linux"]);

    // min_idle: one runner registered in the scale set, waiting.
    wait_until(
        "the min_idle runner to start from its JIT config",
        30,
        || h.started_with_jit().len() == 1,
    );

    let jobs: Vec<_> = (0..3)
        .map(|_| h.emulator.queue_job(set, [SCALE_SET]))
        .collect();
    wait_until("runway to store the three jobs, acquired", 30, || {
        h.jobs().len() == 3
            && h.emulator
                .state()
                .jobs
                .iter()
                .all(|j| j.state == JobState::Assigned)
    });
    // The pools API says what the scale set is doing.
    wait_until("the scale set's statistics in the pools API", 30, || {
        let pools = h.api("/api/v1/pools");
        let scale_set = &pools["pools"][0]["scale_set"];
        scale_set["name"] == SCALE_SET
            && scale_set["id"] == set.0
            && scale_set["session"] == true
            && scale_set["statistics"]["assigned_jobs"] == 3
    });
    let stored = h.jobs();
    for (job, request) in stored.iter().zip(&jobs) {
        assert_eq!(job["source"], "github");
        assert_eq!(job["external_id"], format!("rr-{}", request.0));
        assert_eq!(job["pool"], "ss");
    }
    // One runner per job beside the idle one (max_runners 4).
    wait_until("a JIT runner per job", 30, || {
        h.started_with_jit().len() == 4
    });
    let registered: Vec<String> = h
        .emulator
        .state()
        .runners
        .iter()
        .map(|r| r.name.clone())
        .collect();
    for name in h.started_with_jit() {
        assert!(
            registered.contains(&name),
            "{name} registered in the scale set"
        );
    }
    // What each machine got is the scale set's own configuration for it.
    let log = std::fs::read_to_string(h.dir.path().join("jit.log")).unwrap();
    for line in log.lines() {
        let (name, jit) = line.split_once(' ').unwrap();
        let decoded =
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, jit.trim()).unwrap();
        let config: Value = serde_json::from_slice(&decoded).unwrap();
        assert_eq!(config["runnerName"], name);
        assert_eq!(config["scaleSetId"], set.0);
    }

    // GitHub starts the first job on one of them: runway marks it busy.
    let name = h.started_with_jit()[1].clone();
    h.emulator.start_job(jobs[0], Some(&name));
    wait_until("the job to run on its runner", 30, || {
        h.job_states()[0] == "running"
            && h.runners()
                .iter()
                .any(|r| r["name"] == name.as_str() && r["state"] == "busy")
    });

    // The other two end before they start (cancelled): their demand goes,
    // and idle runners beyond min_idle are removed — but never the busy one.
    h.emulator.complete_job(jobs[1], Some("canceled"));
    h.emulator.complete_job(jobs[2], Some("canceled"));
    wait_until(
        "the cancelled jobs to end and spare runners to go",
        30,
        || {
            let jobs = h.jobs();
            jobs[1..]
                .iter()
                .all(|j| j["state"] == "completed" && j["conclusion"] == "cancelled")
                && h.live_runners().len() == 2
        },
    );
    assert!(
        h.live_runners().iter().any(|r| r["name"] == name.as_str()),
        "the busy runner is kept"
    );
    assert!(h.processes.tracked().iter().any(|(n, _)| *n == name));

    // The job completes: its runner goes, the pool is back at min_idle.
    h.emulator.complete_job(jobs[0], None);
    wait_until("the job to succeed and its runner to go", 30, || {
        h.job_states()[0] == "completed"
            && h.live_runners().len() == 1
            && !h.processes.tracked().iter().any(|(n, _)| *n == name)
    });
    assert_eq!(h.jobs()[0]["conclusion"], "success");
    assert_eq!(h.jobs().len(), 3, "no job stored twice");
    assert!(
        metric(
            &h.base,
            r#"runway_scale_set_messages_total{pool="ss",kind="acknowledged"}"#
        ) >= 3.0
    );
    assert_eq!(
        metric(
            &h.base,
            r#"runway_scale_set_sessions_total{pool="ss",kind="opened"}"#
        ),
        1.0
    );
    assert!(h
        .emulator
        .requests_to(Endpoint::GetMessage)
        .iter()
        .all(|r| r.max_capacity == Some(4)));
    // The message queue's URL is used as given, as GitHub's Go client
    // does: no api-version on polls and acknowledgements.
    for endpoint in [Endpoint::GetMessage, Endpoint::DeleteMessage] {
        for request in h.emulator.requests_to(endpoint) {
            assert!(
                !request
                    .query
                    .as_deref()
                    .unwrap_or("")
                    .contains("api-version"),
                "{request:?}"
            );
        }
    }
}

/// Waits until runway has stored `n` jobs of the pool.
fn stores(h: &Harness, n: usize, what: &str) {
    wait_until(what, 60, || h.jobs().len() == n);
}

/// A job queued after a fault still reaches runway, and gets a runner.
fn survives(h: &Harness, set: ScaleSetId, what: &str) {
    h.emulator.queue_job(set, [SCALE_SET]);
    stores(h, 1, what);
    wait_until("a JIT runner for it", 30, || {
        !h.started_with_jit().is_empty()
    });
}

#[test]
fn a_burst_of_5xx_on_the_message_poll_is_survived() {
    let h = Harness::start(2, 0);
    let set = h.scale_set();
    h.emulator
        .inject(Fault::status(Endpoint::GetMessage, 503).times(4));
    let refused = || {
        h.emulator
            .requests_to(Endpoint::GetMessage)
            .iter()
            .filter(|r| r.status == 503)
            .count()
    };
    wait_until("four polls refused with 503", 60, || refused() == 4);
    survives(&h, set, "a job after a burst of 503s on the poll");
    assert!(
        metric(
            &h.base,
            r#"runway_github_requests_total{operation="scale_set_get_message",status="503"}"#
        ) == 4.0
    );
}

#[test]
fn revoked_admin_tokens_are_fetched_again() {
    let h = Harness::start(2, 0);
    let set = h.scale_set();
    h.emulator.expire_admin_tokens();
    survives(&h, set, "a job after the admin tokens expired");
    // The JIT configuration needed the admin token: a new one was fetched.
    assert!(
        metric(
            &h.base,
            r#"runway_scale_set_token_refreshes_total{pool="ss",kind="admin"}"#
        ) >= 1.0
    );
}

#[test]
fn an_expired_queue_token_is_refreshed() {
    let h = Harness::start(2, 0);
    let set = h.scale_set();
    h.emulator.expire_queue_token(set);
    survives(&h, set, "a job after the queue token expired");
    assert!(
        metric(
            &h.base,
            r#"runway_scale_set_token_refreshes_total{pool="ss",kind="queue"}"#
        ) >= 1.0
    );
}

#[test]
fn a_dropped_session_is_opened_again() {
    let h = Harness::start(2, 0);
    let set = h.scale_set();
    h.emulator.expire_session(set);
    survives(&h, set, "a job after the session was dropped");
    assert!(
        metric(
            &h.base,
            r#"runway_scale_set_sessions_total{pool="ss",kind="lost"}"#
        ) >= 1.0
    );
    assert!(
        metric(
            &h.base,
            r#"runway_scale_set_sessions_total{pool="ss",kind="opened"}"#
        ) >= 2.0
    );
    assert_eq!(
        metric(
            &h.base,
            r#"runway_scale_set_sessions_total{pool="ss",kind="replaced"}"#
        ),
        0.0,
        "the remembered session was GitHub's to drop: nothing replaced"
    );
}

#[test]
fn a_scale_set_github_deleted_is_created_again() {
    let h = Harness::start(2, 0);
    let set = h.scale_set();
    h.delete_scale_set(set);
    let mut again = None;
    wait_until("the scale set created again, with a session", 30, || {
        let state = h.emulator.state();
        again = state
            .scale_sets
            .iter()
            .find(|s| s.name == SCALE_SET)
            .map(|s| s.id)
            .filter(|id| state.sessions.iter().any(|s| s.scale_set_id == *id));
        again.is_some()
    });
    let again = again.unwrap();
    assert_ne!(again, set);
    survives(&h, again, "a job of the recreated scale set");
}

#[test]
fn a_kill_between_storing_and_acknowledging_loses_nothing_and_applies_nothing_twice() {
    let mut h = Harness::start(2, 0);
    let set = h.scale_set();
    // Acknowledgements fail: each message is stored, never acknowledged.
    h.emulator
        .inject(Fault::status(Endpoint::DeleteMessage, 500));
    let jobs: Vec<_> = (0..3)
        .map(|_| h.emulator.queue_job(set, [SCALE_SET]))
        .collect();
    stores(&h, 3, "the three jobs stored though unacknowledged");
    wait_until("a redelivery of the unacknowledged message", 30, || {
        h.emulator.requests_to(Endpoint::DeleteMessage).len() >= 2
    });
    h.kill();
    assert!(!h.emulator.state().unacknowledged.is_empty());
    h.emulator.clear_faults();

    // The next runway replaces its old session at once and takes the
    // redelivered message again: still three jobs, at most max_runners.
    h.serve();
    wait_until("the redelivered message acknowledged", 30, || {
        h.emulator
            .state()
            .unacknowledged
            .values()
            .all(Vec::is_empty)
            && h.emulator
                .state()
                .sessions
                .iter()
                .any(|s| s.scale_set_id == set)
    });
    assert_eq!(
        metric(
            &h.base,
            r#"runway_scale_set_sessions_total{pool="ss",kind="replaced"}"#
        ),
        1.0
    );
    assert_eq!(
        metric(
            &h.base,
            r#"runway_scale_set_sessions_total{pool="ss",kind="conflict"}"#
        ),
        0.0,
        "no wait for the session runway itself left"
    );
    let stored = h.jobs();
    assert_eq!(stored.len(), 3);
    let keys: Vec<String> = stored
        .iter()
        .map(|j| j["external_id"].as_str().unwrap_or_default().to_owned())
        .collect();
    let wanted: Vec<String> = jobs.iter().map(|j| format!("rr-{}", j.0)).collect();
    assert_eq!(keys, wanted);
    wait_until("runners for the queued jobs", 30, || {
        h.started_with_jit().len() >= 2
    });
    for _ in 0..20 {
        assert!(h.live_runners().len() <= 2, "never more than max_runners");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_session_held_by_another_listener_is_waited_out() {
    let mut h = Harness::prepare(|emulator| emulator, 2, 0);
    // Someone else's listener holds the scale set's session.
    let other = h.emulator.client();
    let (set, session) = h.runtime.block_on(async {
        let set = other
            .create_runner_scale_set(&scaleset::RunnerScaleSetSpec::new(SCALE_SET))
            .await
            .unwrap();
        let session = other
            .create_message_session(set.id, "someone-else")
            .await
            .unwrap();
        (set.id, session)
    });
    h.serve();
    wait_until("runway to report the conflict", 30, || {
        metric(
            &h.base,
            r#"runway_scale_set_sessions_total{pool="ss",kind="conflict"}"#,
        ) >= 1.0
    });
    let task = h.api("/api/v1/tasks")["tasks"]
        .as_array()
        .and_then(|t| {
            t.iter()
                .find(|t| t["name"] == "github_scale_set:ss")
                .cloned()
        })
        .unwrap_or_default();
    assert!(
        task["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("already has a message session")),
        "{task}"
    );
    // Meanwhile the other listener takes a job (acquires it and
    // acknowledges its messages): runway never hears of it.
    let emulator = &h.emulator;
    let job = emulator.queue_job(set, [SCALE_SET]);
    h.runtime.block_on(async {
        let mut last = None;
        while emulator
            .state()
            .jobs
            .iter()
            .any(|j| j.id == job && j.state == JobState::Available)
            || !emulator.state().unacknowledged.values().all(Vec::is_empty)
            || emulator.state().undelivered.values().any(|n| *n > 0)
        {
            let Some(message) = session.get_message(last, 2).await.unwrap() else {
                continue;
            };
            session.acquire_jobs(&[job]).await.unwrap();
            session.delete_message(message.id).await.unwrap();
            last = Some(message.id);
        }
    });
    // Its owner lets go: runway takes the session, the labels are the pool's.
    h.runtime.block_on(async { session.close().await.unwrap() });
    wait_until("runway to open the session", 60, || {
        emulator
            .state()
            .sessions
            .iter()
            .any(|s| s.scale_set_id == set && s.owner_name.starts_with("runway-"))
    });
    // GitHub's statistics say a job is assigned and waiting that the store
    // does not hold: demand all the same, so a runner starts for it.
    wait_until("a runner for the job runway never stored", 30, || {
        h.processes.tracked().len() == 1
    });
    let stored = h.api("/api/v1/jobs");
    assert_eq!(stored["jobs"].as_array().map(Vec::len), Some(0), "{stored}");
    let state = emulator.state();
    let labels: Vec<&str> = state.scale_sets[0]
        .labels
        .iter()
        .map(|l| l.name.as_str())
        .collect();
    assert_eq!(
        labels,
        vec![SCALE_SET, "self-hosted", "linux"],
        "updated to the pool's"
    );
}

#[test]
fn with_two_replicas_only_the_leader_holds_the_session_and_it_passes_on_when_the_leader_dies() {
    let schema = common::PgSchema::create("runway_scale_set");
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let emulator = runtime.block_on(
        Emulator::builder()
            .long_poll(Duration::from_millis(300))
            .start(),
    );
    let replica = |dir: &Path| {
        write_config(dir, &emulator.uri(), 2, 0);
        let mut command = runway(dir);
        command
            .args([
                "serve",
                "--config",
                "runway.toml",
                "--database",
                &schema.scoped,
            ])
            .env("RUNWAY_TEST_GITHUB_TOKEN", DEFAULT_PAT);
        spawn_serve(command)
    };
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let _processes = (
        RunnerProcesses(dir_a.path().join("processes")),
        RunnerProcesses(dir_b.path().join("processes")),
    );
    let (first, a) = replica(dir_a.path());
    wait_until("the first replica to lead", 30, || {
        metric(&a, "runway_leader") == 1.0
    });
    let (_second, b) = replica(dir_b.path());
    wait_until("the leader's session", 30, || {
        emulator.state().sessions.len() == 1
    });
    let set = emulator.state().sessions[0].scale_set_id;
    emulator.queue_job(set, [SCALE_SET]);
    let stored = |base: &str| -> usize {
        client()
            .get(format!("{base}/api/v1/jobs?pool=ss"))
            .bearer_auth(ADMIN)
            .send()
            .and_then(|r| r.json::<Value>())
            .ok()
            .and_then(|v| v["jobs"].as_array().map(Vec::len))
            .unwrap_or(0)
    };
    wait_until("the job stored, seen by the follower too", 30, || {
        stored(&b) == 1
    });
    for (base, sessions) in [(&a, 1.0), (&b, 0.0)] {
        let opened = r#"runway_scale_set_sessions_total{pool="ss",kind="opened"}"#;
        let conflicts = r#"runway_scale_set_sessions_total{pool="ss",kind="conflict"}"#;
        assert_eq!(metric(base, opened), sessions, "{base}");
        assert_eq!(
            metric(base, conflicts),
            0.0,
            "{base}: the follower never tried"
        );
    }

    drop(first); // SIGKILL: the lead passes, the session stays at GitHub.
    wait_until(
        "the second replica to lead and hold the session",
        30,
        || {
            metric(
                &b,
                r#"runway_scale_set_sessions_total{pool="ss",kind="opened"}"#,
            ) == 1.0
        },
    );
    assert_eq!(
        metric(
            &b,
            r#"runway_scale_set_sessions_total{pool="ss",kind="replaced"}"#
        ),
        1.0,
        "the dead leader's session replaced, not waited out"
    );
    assert_eq!(emulator.state().sessions.len(), 1);
    emulator.queue_job(set, [SCALE_SET]);
    wait_until("the next job stored by the new leader", 30, || {
        stored(&b) == 2
    });
}

#[test]
fn a_stopping_runway_closes_its_session_during_a_long_poll() {
    // GitHub holds an idle poll about 50 s; so does this emulator.
    let mut h = Harness::prepare(|e| e.long_poll(Duration::from_secs(50)), 2, 0);
    h.serve();
    h.scale_set();
    // The poll is in flight (the emulator records a request once answered).
    wait_until("a poll in flight", 30, || {
        h.emulator.requests_to(Endpoint::GetMessage).is_empty()
    });
    let status = h.serve.as_mut().unwrap().terminate();
    assert!(status.success(), "{status:?}");
    assert!(
        h.emulator.state().sessions.is_empty(),
        "the session is closed on the way out, so the next start need not replace it"
    );
}

#[test]
fn a_github_app_runs_a_scale_set_pool() {
    let mut h = Harness::prepare(|e| e.github_app(77), 2, 0);
    let key = h.dir.path().join("app.pem");
    let made = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&key)
        .output()
        .expect("openssl (Debian package openssl) makes the App's test key");
    assert!(made.status.success(), "{made:?}");
    h.set_config(&h.config().replace(
        "token = \"env:RUNWAY_TEST_GITHUB_TOKEN\"",
        &format!(
            "app_id = 4242\ninstallation_id = 77\nprivate_key = \"file:{}\"",
            key.display()
        ),
    ));
    h.serve();
    let set = h.scale_set();
    h.emulator.queue_job(set, [SCALE_SET]);
    wait_until("a JIT runner for the job", 30, || {
        h.processes.tracked().len() == 1
    });
    assert!(
        !h.emulator.requests_to(Endpoint::AccessToken).is_empty(),
        "installation tokens minted"
    );
    assert!(
        metric(
            &h.base,
            r#"runway_github_requests_total{operation="installation_token",status="201"}"#
        ) >= 1.0
    );
}

#[test]
fn a_reload_that_makes_a_pool_a_scale_set_pool_starts_its_listener() {
    let mut h = Harness::prepare(|emulator| emulator, 2, 0);
    let with_scale_set = h.config();
    // First a webhook-only GitHub pool.
    let without = with_scale_set.replace(&format!("scale_set = \"{SCALE_SET}\"\n"), "");
    assert_ne!(without, with_scale_set);
    h.set_config(&without);
    h.serve();
    assert!(h.emulator.state().scale_sets.is_empty());

    h.set_config(&with_scale_set);
    let reloaded = h.reload();
    assert_eq!(
        reloaded["restart_needed"],
        serde_json::json!([]),
        "{reloaded}"
    );
    let set = h.scale_set();
    h.emulator.queue_job(set, [SCALE_SET]);
    stores(&h, 1, "the job stored, without a restart");

    // And a reload that takes the scale set away lets go of the session.
    h.set_config(&without);
    h.reload();
    wait_until("the session closed", 30, || {
        h.emulator.state().sessions.is_empty()
    });
}

#[test]
fn jobs_github_runs_at_once_end_with_their_runners() {
    // The emulator plays the runners: an assigned job starts on an idle
    // registered runner as soon as both exist (here: as soon as runway
    // asks for the JIT configuration, before its machine has booted) and
    // completes a moment later.
    let mut h = Harness::prepare(|e| e.auto_run_jobs(Duration::from_millis(500)), 3, 0);
    h.serve();
    let set = h.scale_set();
    for _ in 0..5 {
        h.emulator.queue_job(set, [SCALE_SET]);
    }
    wait_until(
        "all five jobs to succeed in runway and at GitHub",
        60,
        || {
            let stored = h.jobs();
            stored.len() == 5
                && stored
                    .iter()
                    .all(|j| j["state"] == "completed" && j["conclusion"] == "success")
                && h.emulator
                    .state()
                    .jobs
                    .iter()
                    .all(|j| j.state == JobState::Completed)
        },
    );
    wait_until("every runner gone", 60, || {
        h.processes.tracked().is_empty()
            && h.runners()
                .iter()
                .all(|r| matches!(r["state"].as_str(), Some("terminated" | "failed")))
    });
}

/// GitHub rate-limits the message poll (a secondary limit: 403 with
/// `Retry-After: 5`, and a 429 with the same): runway makes no poll and
/// asks for no token until the five seconds are over (a 403 is not an
/// expired token), then carries on, and counts the refusal by cause.
#[test]
fn a_rate_limited_poll_waits_for_retry_after_and_asks_for_no_token() {
    let h = Harness::start(2, 0);
    let set = h.scale_set();
    for (fault, status) in [
        (
            Fault::secondary_rate_limit(Endpoint::GetMessage, Some(Duration::from_secs(5))),
            403,
        ),
        (
            Fault::too_many_requests(Endpoint::GetMessage, Some(Duration::from_secs(5))),
            429,
        ),
    ] {
        let refused = || {
            h.emulator
                .requests_to(Endpoint::GetMessage)
                .iter()
                .filter(|r| r.status == status)
                .count()
        };
        let polls = || h.emulator.requests_to(Endpoint::GetMessage).len();
        let sessions = || h.emulator.requests_to(Endpoint::Sessions).len();
        h.emulator.inject(fault.times(1));
        wait_until("a poll refused by the rate limit", 30, || refused() == 1);
        let limited_at = std::time::Instant::now();
        let (polls_then, sessions_then) = (polls(), sessions());
        wait_until("the next poll", 30, || polls() > polls_then);
        let waited = limited_at.elapsed();
        assert!(
            waited >= Duration::from_millis(4_800),
            "polled again {waited:?} after a {status} with Retry-After: 5"
        );
        assert_eq!(
            sessions(),
            sessions_then,
            "a {status} rate limit refreshed or reopened the session"
        );
    }
    survives(&h, set, "a job after the rate limits");
    assert!(
        metric(
            &h.base,
            r#"runway_scale_set_refusals_total{pool="ss",kind="rate_limited"}"#
        ) >= 2.0
    );
}

/// GitHub deletes the scale set, with its jobs, while two acquired jobs
/// wait for runners: once runway has created the scale set again, those
/// jobs end (cancelled, saying why) and the pool returns to `min_idle`.
#[test]
fn jobs_of_a_deleted_scale_set_end_when_it_is_created_again() {
    let h = Harness::start(2, 0);
    let set = h.scale_set();
    for _ in 0..2 {
        h.emulator.queue_job(set, [SCALE_SET]);
    }
    stores(&h, 2, "the two jobs stored");
    wait_until("two JIT runners for them", 30, || {
        h.started_with_jit().len() == 2
    });
    h.delete_scale_set(set);
    wait_until("both jobs ended", 30, || {
        h.job_states() == ["cancelled", "cancelled"]
    });
    let reasons: Vec<String> = h
        .jobs()
        .iter()
        .map(|j| j["reason"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert!(
        reasons.iter().all(|r| r.contains("scale set was deleted")),
        "{reasons:?}"
    );
    wait_until("the pool back at min_idle (0)", 30, || {
        h.live_runners().is_empty()
    });
}

/// Fair share in a scale-set pool, against the emulator: runway acquires
/// only what the pool has room for (`max_runners` 4), in fair-share order
/// by repository. Repository A's 500 jobs are announced, then
/// repository B's one; as A's acquired jobs end one by one, B's job is
/// among the next 4 acquisitions, not behind A's 496. The emulator gives
/// every job one repository, so a loopback proxy in front of it names
/// each job's repository in the messages (and points the URLs the
/// emulator hands out at itself, so every call passes through it).
#[test]
fn a_small_repository_is_acquired_within_the_next_acquisitions_after_a_big_one() {
    use common::proxy;
    use std::collections::BTreeSet;
    use std::sync::{Arc, Mutex};

    /// Names each job's repository in the messages, and points the URLs
    /// the emulator hands out at the proxy.
    #[derive(Default)]
    struct Repositories {
        b_jobs: Mutex<BTreeSet<i64>>,
    }
    impl proxy::Faults for Repositories {
        fn after(&self, seen: &proxy::Seen, mut answer: proxy::Answer) -> proxy::After {
            let text = String::from_utf8_lossy(&answer.body).replace(&seen.upstream, &seen.proxy);
            answer.body = text.clone().into();
            if let Ok(mut message) = serde_json::from_str::<Value>(&text) {
                let body = message["body"].as_str().map(str::to_owned);
                if let Some(Ok(mut jobs)) = body.map(|b| serde_json::from_str::<Value>(&b)) {
                    for job in jobs.as_array_mut().into_iter().flatten() {
                        let request = job["runnerRequestId"].as_i64().unwrap_or_default();
                        let repository = if self.b_jobs.lock().unwrap().contains(&request) {
                            "repo-b"
                        } else {
                            "repo-a"
                        };
                        if job.get("repositoryName").is_some() {
                            job["repositoryName"] = repository.into();
                        }
                    }
                    message["body"] = jobs.to_string().into();
                    answer.body = message.to_string().into();
                }
            }
            answer.content_type = Some(axum::http::HeaderValue::from_static("application/json"));
            proxy::After::Pass(answer)
        }
    }

    let mut h = Harness::prepare(|emulator| emulator, 4, 0);
    let repositories = Arc::new(Repositories::default());
    let proxy = proxy::FaultProxy::start(&h.emulator.uri(), repositories.clone());
    let url = proxy.url.clone();
    write_config(h.dir.path(), &url, 4, 0);
    h.serve();
    let set = h.scale_set();

    let a: Vec<_> = (0..500)
        .map(|_| h.emulator.queue_job(set, [SCALE_SET]))
        .collect();
    let queued = |h: &Harness| h.api("/api/v1/pools")["pools"][0]["queued"].as_u64();
    let assigned = |h: &Harness| -> BTreeSet<i64> {
        h.emulator
            .state()
            .jobs_in(set, JobState::Assigned)
            .map(|j| j.id.0)
            .collect()
    };
    wait_until("runway to store A's 500 jobs and acquire 4", 60, || {
        queued(&h) == Some(500) && assigned(&h).len() == 4
    });
    // Only what there is room for: the rest stay available at GitHub.
    assert_eq!(
        h.emulator.state().jobs_in(set, JobState::Available).count(),
        496
    );
    let b = {
        // Named B's before the emulator announces it.
        let b = h.emulator.queue_job(set, [SCALE_SET]);
        repositories.b_jobs.lock().unwrap().insert(b.0);
        b
    };
    // (The proxy names B's repository from the first message on: the job
    // is queued before the next poll reads it.)
    wait_until("runway to store B's job", 60, || queued(&h) == Some(501));
    let mut acquisitions = Vec::new();
    for _ in 0..4 {
        let before = assigned(&h);
        let end = *before.iter().next().unwrap();
        h.emulator
            .complete_job(scaleset::JobRequestId(end), Some("canceled"));
        let mut next = BTreeSet::new();
        wait_until("runway to acquire the next job", 60, || {
            let now = assigned(&h);
            next = now.difference(&before).copied().collect();
            !next.is_empty()
        });
        acquisitions.extend(next);
        if acquisitions.contains(&b.0) {
            break;
        }
    }
    assert!(
        acquisitions.contains(&b.0),
        "B's job {} among the next acquisitions {acquisitions:?}",
        b.0
    );
    assert!(a.iter().all(|j| j.0 != b.0));
    let stored_b = h.api("/api/v1/jobs?pool=ss&limit=5");
    assert!(
        stored_b["jobs"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|j| j["external_id"] == format!("rr-{}", b.0)),
        "{stored_b}"
    );
}
