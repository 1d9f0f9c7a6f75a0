//! The admin write API end to end, on the real binary with a real agent:
//! cancel and retry, drain and terminate, pause and resume, config reload
//! (API and SIGHUP), the audit trail and a job's history. Every refusal is
//! a clear 4xx that changes nothing.

use crate::common;

use std::path::Path;

use common::{client, runway, wait_until, Process};
use serde_json::{json, Value};

const ADMIN: &str = "admin-write-test-admin-token";
const READ: &str = "admin-write-test-read-token";

fn config(listen: &str, extra: &str) -> String {
    format!(
        "[server]\nlisten = \"{listen}\"\nadmin_tokens = [\"{ADMIN}\"]\nread_tokens = [\"{READ}\"]\n\
         [runner_api]\npoll_timeout = \"1s\"\nlease = \"2s\"\n\
         [[pools]]\nname = \"default\"\nlabels = [\"self-hosted\", \"linux\"]\n{extra}"
    )
}

struct Api {
    base: String,
}

impl Api {
    fn call(&self, method: &str, token: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let request = match method {
            "GET" => client().get(url),
            _ => client().post(url),
        };
        let request = match body {
            Some(body) => request.json(&body),
            None => request,
        };
        let response = request.bearer_auth(token).send().expect("runway answers");
        let status = response.status().as_u16();
        (status, response.json().unwrap_or(Value::Null))
    }

    fn get(&self, path: &str) -> Value {
        let (status, body) = self.call("GET", ADMIN, path, None);
        assert_eq!(status, 200, "GET {path}: {body}");
        body
    }

    fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.call("POST", ADMIN, path, Some(body))
    }

    fn submit(&self, script: &str) -> i64 {
        let (status, body) = self.post(
            "/api/v1/jobs",
            json!({"labels": ["linux"], "script": script, "timeout_seconds": 60}),
        );
        assert!(status == 201 || status == 200, "{body}");
        body["id"].as_i64().expect("a job id")
    }

    fn job(&self, id: i64) -> Value {
        self.get(&format!("/api/v1/jobs/{id}"))
    }

    fn runner(&self, id: i64) -> Value {
        self.get(&format!("/api/v1/runners/{id}"))
    }

    fn events(&self, id: i64) -> Vec<String> {
        self.get(&format!("/api/v1/jobs/{id}/events"))["events"]
            .as_array()
            .expect("events")
            .iter()
            .map(|e| e["event"].as_str().unwrap_or("").to_owned())
            .collect()
    }

    fn pool(&self, name: &str) -> Option<Value> {
        self.get("/api/v1/pools")["pools"]
            .as_array()?
            .iter()
            .find(|p| p["name"] == name)
            .cloned()
    }
}

fn serve(dir: &Path) -> (Process, Api) {
    let (process, base) = common::serve_in(dir, &["--config", "runway.toml"]);
    (process, Api { base })
}

fn cli(dir: &Path, base: &str, args: &[&str]) -> (bool, String) {
    let output = runway(dir)
        .args(args)
        .args(["--url", base, "--token", ADMIN])
        .output()
        .expect("run the CLI");
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), text)
}

#[test]
fn jobs_are_cancelled_and_retried_and_refusals_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("runway.toml"), config("127.0.0.1:0", "")).unwrap();
    let (_server, api) = serve(dir.path());
    let job = api.submit("echo never runs");

    // A read token may look, never change.
    let (status, body) = api.call(
        "POST",
        READ,
        &format!("/api/v1/jobs/{job}/cancel"),
        Some(json!({})),
    );
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["code"], "forbidden");
    let (status, _) = api.call("GET", READ, &format!("/api/v1/jobs/{job}/events"), None);
    assert_eq!(status, 200, "a read token reads a job's history");
    assert_eq!(
        api.job(job)["state"],
        "queued",
        "the refused cancel changed nothing"
    );

    // Bad input is a 400 and changes nothing.
    let (status, body) = api.post(&format!("/api/v1/jobs/{job}/cancel"), json!({"why": 1}));
    assert_eq!(status, 400, "{body}");
    assert_eq!(api.job(job)["state"], "queued");
    let (status, _) = api.post("/api/v1/jobs/nope/cancel", json!({}));
    assert_eq!(status, 400);
    let (status, _) = api.post("/api/v1/jobs/999999/cancel", json!({}));
    assert_eq!(status, 404);

    // A queued job that is not failed or cancelled cannot be retried.
    let (status, body) = api.post(&format!("/api/v1/jobs/{job}/retry"), json!({}));
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("not_retryable")),
        "{body}"
    );

    let (status, body) = api.post(
        &format!("/api/v1/jobs/{job}/cancel"),
        json!({"reason": "wrong branch"}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "cancelled");
    assert_eq!(body["reason"], "wrong branch");
    let (status, body) = api.post(&format!("/api/v1/jobs/{job}/cancel"), json!({}));
    assert_eq!(status, 409, "a finished job stays finished: {body}");

    // The CLI retries it: a new job with the same script, queued.
    let (ok, out) = cli(dir.path(), &api.base, &["retry", &job.to_string()]);
    assert!(ok, "{out}");
    let retried: i64 = out
        .split_whitespace()
        .nth(1)
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("a new job id in {out:?}"));
    assert_ne!(retried, job);
    let new_job = api.job(retried);
    assert_eq!(new_job["state"], "queued");
    assert_eq!(new_job["details"]["script"], "echo never runs");
    assert_eq!(api.events(job), ["created", "cancelled"]);

    // Who did what, newest first.
    let audit = api.get("/api/v1/audit")["entries"].clone();
    let actions: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["job.retry", "job.cancel"], "{audit}");
    assert_eq!(audit[0]["actor"], "admin_tokens[0]");
    assert_eq!(audit[1]["target"], format!("job {job}"));
    assert_eq!(audit[1]["details"]["reason"], "wrong branch");
    // Through what: the retry with the CLI, the cancel by another client.
    assert_eq!(audit[0]["details"]["channel"], "cli", "{audit}");
    assert_eq!(audit[1]["details"]["channel"], "api", "{audit}");
}

#[test]
fn a_running_job_is_cancelled_at_its_next_heartbeat_and_a_drained_runner_stops_after_its_job() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("runway.toml"), config("127.0.0.1:0", "")).unwrap();
    let (_server, api) = serve(dir.path());
    let _agent = common::agent(dir.path(), &api.base, ADMIN, "a1", "self-hosted,linux", &[]);

    let long = api.submit("sleep 60");
    wait_until("the long job runs", 30, || {
        api.job(long)["state"] == "running"
    });
    let runner = api.job(long)["runner"].as_i64().expect("its runner");
    let (status, body) = api.post(&format!("/api/v1/jobs/{long}/cancel"), json!({}));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["state"], "cancelled");
    assert_eq!(
        api.runner(runner)["state"],
        "idle",
        "the runner is free in the same move"
    );
    // The agent hears it at its next heartbeat, stops the job and takes the next.
    let next = api.submit("echo after the cancel");
    wait_until("the agent takes the next job", 30, || {
        api.job(next)["state"] == "completed"
    });
    assert_eq!(
        api.events(long),
        ["created", "claimed", "started", "cancelled"],
        "{}",
        common::agent_logs(dir.path())
    );
    assert!(
        common::agent_logs(dir.path()).contains("cancelled"),
        "the agent says it stopped a cancelled job"
    );

    // Drain while busy: it finishes its job, takes no other, then stops.
    let job = api.submit("sleep 2");
    wait_until("the job runs", 30, || api.job(job)["state"] == "running");
    let (status, body) = api.post(&format!("/api/v1/runners/{runner}/terminate"), json!({}));
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("runner_busy")),
        "{body}"
    );
    assert_eq!(
        api.job(job)["state"],
        "running",
        "the refusal changed nothing"
    );
    let (ok, out) = cli(dir.path(), &api.base, &["drain", &runner.to_string()]);
    assert!(ok && out.contains("after its current job"), "{out}");
    let waiting = api.submit("echo not on a drained runner");
    wait_until("the drained runner's job completes", 30, || {
        api.job(job)["state"] == "completed"
    });
    wait_until("the drained runner stops", 30, || {
        api.runner(runner)["state"] != "busy" && api.runner(runner)["state"] != "idle"
    });
    assert_eq!(api.runner(runner)["draining"], true);
    assert_eq!(
        api.job(waiting)["state"],
        "queued",
        "a drained runner takes no new job"
    );
}

#[test]
fn a_paused_pool_says_so_and_a_reload_applies_a_valid_file_and_refuses_a_bad_one() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let listen = format!("127.0.0.1:{port}");
    std::fs::write(dir.path().join("runway.toml"), config(&listen, "")).unwrap();
    let (server, api) = serve(dir.path());
    let job = api.submit("echo paused");

    let (ok, out) = cli(dir.path(), &api.base, &["pause", "default"]);
    assert!(ok && out.contains("pool default paused"), "{out}");
    let (ok, out) = cli(dir.path(), &api.base, &["pause", "default"]);
    assert!(ok && out.contains("(already)"), "{out}");
    assert_eq!(api.pool("default").unwrap()["paused"], true);
    let waiting = api.job(job)["waiting"].clone();
    assert_eq!(waiting["code"], "pool_paused", "{waiting}");
    let (status, body) = api.post("/api/v1/pools/nope/pause", json!({}));
    assert_eq!(
        (status, body["code"].as_str()),
        (404, Some("not_found")),
        "{body}"
    );
    let (ok, out) = cli(dir.path(), &api.base, &["resume", "default"]);
    assert!(ok && out.contains("pool default running"), "{out}");
    assert_eq!(api.pool("default").unwrap()["paused"], false);
    assert_ne!(api.job(job)["waiting"]["code"], "pool_paused");

    // A valid file: the new pool is served at once, by the API's reload.
    let extra = "[[pools]]\nname = \"gpu\"\nlabels = [\"self-hosted\", \"gpu\"]\n";
    std::fs::write(dir.path().join("runway.toml"), config(&listen, extra)).unwrap();
    let (status, body) = api.post("/api/v1/config/reload", json!({}));
    assert_eq!(status, 200, "{body}");
    assert!(body["changed"].to_string().contains("pools"), "{body}");
    assert!(api.pool("gpu").is_some());

    // An invalid file is refused with config check's words; nothing changes.
    std::fs::write(
        dir.path().join("runway.toml"),
        config(
            &listen,
            "[[pools]]\nname = \"gpu\"\nlabels = []\nmax_runners = \"many\"\n",
        ),
    )
    .unwrap();
    let (status, body) = api.post("/api/v1/config/reload", json!({}));
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_config")),
        "{body}"
    );
    let check = runway(dir.path())
        .args(["config", "check", "--config", "runway.toml"])
        .output()
        .unwrap();
    let check_error = String::from_utf8_lossy(&check.stderr);
    assert!(
        check_error.contains("max_runners"),
        "config check names the key: {check_error}"
    );
    assert!(
        body["error"].as_str().unwrap_or("").contains("max_runners"),
        "the refusal names the key as config check does: {body}"
    );
    assert!(api.pool("gpu").is_some(), "the running config stays");

    // SIGHUP reloads too: the gpu pool is gone, a third one is there.
    let third = "[[pools]]\nname = \"arm\"\nlabels = [\"self-hosted\", \"arm64\"]\n";
    std::fs::write(dir.path().join("runway.toml"), config(&listen, third)).unwrap();
    let pid = server.0.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    wait_until("SIGHUP reloads the config", 10, || {
        api.pool("arm").is_some() && api.pool("gpu").is_none()
    });
    // The reload swaps the config, then records itself: the pools can show
    // the new file a moment before the audit trail does.
    wait_until("the SIGHUP reload in the audit trail", 10, || {
        api.get("/api/v1/audit?limit=1")["entries"][0]["actor"] == "signal:SIGHUP"
    });
    let audit = api.get("/api/v1/audit?limit=2")["entries"].clone();
    assert_eq!(audit[0]["action"], "config.reload");
    assert_eq!(audit[0]["actor"], "signal:SIGHUP");
    assert_eq!(audit[0]["details"]["channel"], "runway", "{audit}");
    assert_eq!(audit[1]["actor"], "admin_tokens[0]");
    assert!(audit[1]["details"]["changed"].to_string().contains("pools"));
}

#[test]
fn a_reload_that_brings_the_first_provider_starts_runners() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let listen = format!("127.0.0.1:{port}");
    std::fs::write(dir.path().join("runway.toml"), config(&listen, "")).unwrap();
    let (_server, api) = serve(dir.path());
    let job = api.submit("echo started by a reloaded provider");
    wait_until("the job waits for a runner to register", 10, || {
        api.job(job)["waiting"]["code"] == "no_provider_capacity"
    });

    // The same file with a process provider: no restart needed, the
    // reconciler starts, a runner boots and runs the job.
    let provider = "[scaling]\ninterval = \"200ms\"\n\
         [[providers]]\nname = \"local\"\nkind = \"process\"\n\
         command = [\"runway\", \"agent\", \"--once\"]\nstate_dir = \"processes\"\n\
         stop_grace = \"2s\"\nmax_instances = 2\n";
    std::fs::write(dir.path().join("runway.toml"), config(&listen, provider)).unwrap();
    let (status, body) = api.post("/api/v1/config/reload", json!({}));
    assert_eq!(status, 200, "{body}");
    assert!(
        !body["restart_needed"].to_string().contains("providers"),
        "{body}"
    );
    wait_until("the job completes on the new provider's runner", 60, || {
        api.job(job)["state"] == "completed"
    });
    let runner = api.job(job)["runner"].as_i64().expect("a runner ran it");
    assert_eq!(api.runner(runner)["provider"], "local");
}
