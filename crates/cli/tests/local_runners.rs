//! End-to-end with runners runway starts itself: `runway serve` with a
//! `process` provider whose runners are `runway agent --once`, jobs through
//! `POST /api/v1/jobs`. Nothing here registers an agent by hand.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::{metric, wait_for_lines, wait_until, Process, RunnerProcesses};
use serde_json::Value;

const ADMIN: &str = "local-runners-admin-token";

fn write_config(dir: &Path, listen: &str, min_idle: u32, max_runners: u32) {
    common::write_config(
        dir,
        listen,
        ADMIN,
        "200ms",
        &format!(
            r#"[runner_api]
poll_timeout = "2s"
lease = "3s"

[[providers]]
name = "local"
kind = "process"
command = ["runway", "agent", "--once"]
state_dir = "processes"
stop_grace = "5s"
max_instances = 20

[[pools]]
name = "local"
labels = ["local", "linux"]
min_idle = {min_idle}
max_runners = {max_runners}
idle_grace = "2s"
boot_timeout = "30s"
providers = ["local"]
"#
        ),
    );
}

fn serve(dir: &Path) -> (Process, String) {
    common::serve_in(dir, &["--config", "runway.toml"])
}

fn get(base: &str, path: &str) -> Value {
    common::api_get(base, ADMIN, path)
}

fn submit(base: &str, script: &str) -> i64 {
    common::submit_to(base, ADMIN, &["local"], script, 120)
}

/// Runners that are neither terminated, failed nor crashed.
fn live_runners(base: &str) -> Vec<Value> {
    get(base, "/api/v1/runners")["runners"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|r| {
            !matches!(
                r["state"].as_str(),
                Some("terminated" | "failed" | "crashed")
            )
        })
        .collect()
}

#[test]
fn a_hundred_jobs_on_at_most_eight_local_runners_then_back_to_one() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), "127.0.0.1:0", 1, 8);
    let processes = RunnerProcesses(dir.path().join("processes"));
    let (_server, base) = serve(dir.path());
    wait_until("the warm runner (min_idle = 1)", 30, || {
        live_runners(&base).iter().any(|r| r["state"] == "idle")
    });
    let ran = dir.path().join("ran.log");
    let ids: Vec<i64> = (0..100)
        .map(|i| {
            submit(
                &base,
                &format!("echo {i} >> {}; echo out-{i}", ran.display()),
            )
        })
        .collect();
    let mut most = 0;
    wait_until("100 jobs to complete", 240, || {
        most = most.max(live_runners(&base).len());
        most = most.max(processes.tracked().len());
        let completed = get(&base, "/api/v1/jobs?state=completed&limit=500")["jobs"]
            .as_array()
            .map_or(0, Vec::len);
        completed == 100
    });
    assert!(most <= 8, "at most 8 runners at once, saw {most}");
    let text = std::fs::read_to_string(&ran).unwrap();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort_unstable();
    lines.dedup();
    assert_eq!(lines.len(), 100, "every job ran");
    assert_eq!(text.lines().count(), 100, "and each exactly once");
    for (i, id) in ids.iter().enumerate().step_by(17) {
        assert_eq!(common::log_text(&base, ADMIN, *id), format!("out-{i}\n"));
    }
    assert_eq!(metric(&base, "runway_jobs_completed_total"), 100.0);
    // Each runner ran one job (ephemeral), and runway deleted it after.
    wait_until("the pool to fall back to min_idle", 60, || {
        live_runners(&base).len() == 1 && processes.tracked().len() == 1
    });
    let runners = get(&base, "/api/v1/runners")["runners"]
        .as_array()
        .cloned()
        .unwrap();
    assert!(
        runners.len() > 100,
        "one runner per job plus the warm one: {}",
        runners.len()
    );
    assert!(runners.iter().all(|r| r["provider"] == "local"));
    assert_eq!(
        metric(
            &base,
            "runway_runner_delete_requests_total{pool=\"local\",result=\"refused_busy\"}"
        ),
        0.0
    );
}

#[test]
fn a_killed_runner_s_job_is_finished_by_a_new_one() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), "127.0.0.1:0", 0, 2);
    let processes = RunnerProcesses(dir.path().join("processes"));
    let (_server, base) = serve(dir.path());
    let marker = dir.path().join("first-attempt");
    let script = format!(
        "if [ -e {m} ]; then echo second attempt; else touch {m}; sleep 120; fi",
        m = marker.display()
    );
    let id = submit(&base, &script);
    wait_until("the first attempt to start", 60, || marker.exists());
    let tracked = processes.tracked();
    let [(name, pid)] = &tracked[..] else {
        panic!("one runner process: {tracked:?}");
    };
    let (name, pid) = (name.clone(), *pid);
    // kill -9 the agent and what it started.
    Command::new("kill")
        .args(["-KILL", "--", &format!("-{pid}")])
        .status()
        .unwrap();
    wait_until("the job to complete on another runner", 90, || {
        get(&base, &format!("/api/v1/jobs/{id}"))["state"] == "completed"
    });
    let job = get(&base, &format!("/api/v1/jobs/{id}"));
    assert_eq!(job["conclusion"], "success", "{job}");
    assert_eq!(job["attempts"], 1, "one lease expired: {job}");
    let runners = get(&base, "/api/v1/runners")["runners"]
        .as_array()
        .cloned()
        .unwrap();
    let killed = runners.iter().find(|r| r["name"] == name.as_str()).unwrap();
    assert_eq!(killed["state"], "crashed", "{killed}");
    wait_until("the dead runner's process to be forgotten", 30, || {
        processes.tracked().iter().all(|(n, _)| n != &name)
    });
}

#[test]
fn runners_survive_a_sigkill_of_the_server_and_are_adopted() {
    let dir = tempfile::tempdir().unwrap();
    // A fixed port, so the runners find the restarted server where they left it.
    let port = common::free_port();
    write_config(dir.path(), &format!("127.0.0.1:{port}"), 0, 4);
    let processes = RunnerProcesses(dir.path().join("processes"));
    let (server, base) = serve(dir.path());
    let ran = dir.path().join("ran.log");
    let ids: Vec<i64> = (0..12)
        .map(|i| submit(&base, &format!("sleep 0.3; echo {i} >> {}", ran.display())))
        .collect();
    wait_for_lines("some jobs to run", &ran, 3, 60);
    drop(server); // SIGKILL; its runner processes live on.
    let (server, base) = serve(dir.path());
    wait_until("every job to complete after the restart", 120, || {
        ids.iter()
            .all(|id| get(&base, &format!("/api/v1/jobs/{id}"))["state"] == "completed")
    });
    let text = std::fs::read_to_string(&ran).unwrap();
    for i in 0..12 {
        assert_eq!(
            text.lines().filter(|l| *l == i.to_string()).count(),
            1,
            "job {i} ran exactly once:\n{text}"
        );
    }
    wait_until("every runner process to be gone (min_idle = 0)", 60, || {
        processes.tracked().is_empty()
    });
    drop(server);
}
