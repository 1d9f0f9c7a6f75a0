//! End-to-end with real processes: `runway serve`, `runway agent`s and
//! `runway submit`, on loopback.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{runway, wait_for_lines, wait_until, Process};

const ADMIN: &str = "agent-test-admin-token";

fn write_config(dir: &Path, listen: &str) {
    write_config_with_lease(dir, listen, "2s");
}

fn write_config_with_lease(dir: &Path, listen: &str, lease: &str) {
    std::fs::write(
        dir.join("runway.toml"),
        format!(
            "[server]\nlisten = \"{listen}\"\nadmin_tokens = [\"{ADMIN}\"]\n\
             [runner_api]\npoll_timeout = \"1s\"\nlease = \"{lease}\"\n\
             [[pools]]\nname = \"default\"\nlabels = [\"self-hosted\", \"linux\"]\n"
        ),
    )
    .unwrap();
}

/// Starts `runway serve` and returns it with its base URL.
fn serve(dir: &Path) -> (Process, String) {
    common::serve_in(dir, &["--config", "runway.toml"])
}

fn api(base: &str) -> reqwest::blocking::Client {
    let _ = base;
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

fn agent(dir: &Path, base: &str, name: &str) -> Process {
    agent_with(dir, base, name, &[])
}

fn agent_with(dir: &Path, base: &str, name: &str, extra: &[&str]) -> Process {
    common::agent(dir, base, ADMIN, name, "self-hosted,linux", extra)
}

/// `GET /api/v1/runners`.
fn runners(base: &str) -> serde_json::Value {
    api(base)
        .get(format!("{base}/api/v1/runners"))
        .bearer_auth(ADMIN)
        .send()
        .unwrap()
        .json()
        .unwrap()
}

fn submit(base: &str, script: &str) -> i64 {
    common::submit(base, ADMIN, script)
}

fn job(base: &str, id: i64) -> serde_json::Value {
    common::job(base, ADMIN, id)
}

#[test]
fn agents_run_submitted_jobs_exactly_once_each() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), "127.0.0.1:0");
    let (_server, base) = serve(dir.path());
    let _agents: Vec<Process> = (0..3)
        .map(|i| agent(dir.path(), &base, &format!("a{i}")))
        .collect();
    let ids: Vec<i64> = (0..20)
        .map(|i| {
            submit(
                &base,
                &format!(
                    "echo job {i} >> {}/ran.log; echo out-{i}",
                    dir.path().display()
                ),
            )
        })
        .collect();
    wait_until("20 jobs to complete", 60, || {
        ids.iter().all(|id| job(&base, *id)["state"] == "completed")
    });
    for (i, id) in ids.iter().enumerate() {
        let job = job(&base, *id);
        assert_eq!(job["conclusion"], "success");
        assert_eq!(log(&base, *id), format!("out-{i}\n"));
    }
    let ran = std::fs::read_to_string(dir.path().join("ran.log")).unwrap();
    assert_eq!(
        ran.lines().count(),
        20,
        "every job ran exactly once:\n{ran}"
    );

    // runway submit --wait prints the log and exits with the job's code.
    let output = runway(dir.path())
        .args([
            "submit", "--url", &base, "--token", ADMIN, "--labels", "linux", "--wait", "--",
        ])
        .args(["sh", "-c", "echo waited; exit 4"])
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout), "waited\n");
}

fn log(base: &str, id: i64) -> String {
    common::log_text(base, ADMIN, id)
}

/// `--job-user`: the job runs as another user, who can read neither the
/// agent's files nor its process's environment. Needs root (CI is root).
#[test]
fn a_job_user_cannot_read_the_agents_files() {
    let uid = std::process::Command::new("id").arg("-u").output().unwrap();
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        eprintln!(
            "skipped: --job-user needs the agent to run as root, and this test runs as uid {}",
            String::from_utf8_lossy(&uid.stdout).trim()
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The job user must be able to pass through to its work directory.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    }
    write_config(dir.path(), "127.0.0.1:0");
    let (_server, base) = serve(dir.path());
    let _agent = agent_with(dir.path(), &base, "j", &["--job-user", "nobody", "--once"]);
    let work = dir.path().join("work-j");
    let script = format!(
        "echo \"uid=$(id -u)\"; echo \"cwd=$(pwd)\"; \
         ls {w} >/dev/null 2>&1 && echo listed-work-root || echo cannot-list-work-root; \
         cat {w}/job-$RUNWAY_JOB_ID.log >/dev/null 2>&1 && echo read-agent-log || echo cannot-read-agent-log; \
         cat /proc/$PPID/environ >/dev/null 2>&1 && echo read-agent-environ || echo cannot-read-agent-environ; \
         touch written-in-workspace && echo wrote-workspace",
        w = work.display()
    );
    let id = submit(&base, &script);
    wait_until("the job to complete", 60, || {
        job(&base, id)["state"] == "completed"
    });
    let output = log(&base, id);
    let nobody = std::process::Command::new("id")
        .args(["-u", "nobody"])
        .output()
        .unwrap();
    let nobody = String::from_utf8_lossy(&nobody.stdout).trim().to_owned();
    assert!(output.contains(&format!("uid={nobody}\n")), "{output}");
    assert!(
        output.contains(&format!("cwd={}/job-{id}\n", work.display())),
        "{output}"
    );
    for line in [
        "cannot-list-work-root",
        "cannot-read-agent-log",
        "cannot-read-agent-environ",
        "wrote-workspace",
    ] {
        assert!(output.contains(line), "{line}:\n{output}");
    }
    // The work directory is removed afterwards.
    wait_until("the job's directory to be removed", 10, || {
        !work.join(format!("job-{id}")).exists()
    });
}

#[test]
fn a_job_whose_agent_is_killed_is_finished_by_another_agent() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), "127.0.0.1:0");
    let (_server, base) = serve(dir.path());
    let marker = dir.path().join("first-attempt");
    let mut doomed = agent(dir.path(), &base, "doomed");
    // The first attempt marks itself and hangs; a second attempt finishes.
    let script = format!(
        "if [ -e {m} ]; then echo second attempt; else touch {m}; sleep 60; fi",
        m = marker.display()
    );
    let id = submit(&base, &script);
    wait_until("the first attempt to start", 30, || marker.exists());
    assert_eq!(job(&base, id)["state"], "running");
    doomed.0.kill().expect("SIGKILL the agent");
    let _ = doomed.0.wait();
    let _rescuer = agent(dir.path(), &base, "rescuer");
    // The 2 s lease expires, the sweeper requeues the job, the rescuer runs it.
    wait_until("the job to complete", 60, || {
        job(&base, id)["state"] == "completed"
    });
    let finished = job(&base, id);
    assert_eq!(
        (
            finished["conclusion"].as_str(),
            finished["attempts"].as_u64()
        ),
        (Some("success"), Some(1))
    );
    let runners = runners(&base);
    let doomed_state = runners["runners"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "doomed")
        .map(|r| r["state"].clone());
    assert_eq!(doomed_state, Some(serde_json::json!("crashed")));
}

#[test]
fn jobs_complete_once_each_across_a_sigkill_of_the_server() {
    let dir = tempfile::tempdir().unwrap();
    // A fixed port, so the runners find the restarted server where they left it.
    let port = common::free_port();
    // A lease longer than a restart on a loaded machine takes (a restarted
    // server gives its runners one lease to be heard from).
    write_config_with_lease(dir.path(), &format!("127.0.0.1:{port}"), "10s");
    let (server, base) = serve(dir.path());
    let _agents: Vec<Process> = (0..2)
        .map(|i| agent(dir.path(), &base, &format!("s{i}")))
        .collect();
    let ran = dir.path().join("ran.log");
    let ids: Vec<i64> = (0..30)
        .map(|i| submit(&base, &format!("sleep 0.05; echo {i} >> {}", ran.display())))
        .collect();
    wait_for_lines("some jobs to run", &ran, 5, 30);
    drop(server); // SIGKILL
    let (_server, base) = serve(dir.path());
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let unfinished: Vec<serde_json::Value> = ids
            .iter()
            .map(|id| job(&base, *id))
            .filter(|job| job["state"] != "completed")
            .collect();
        if unfinished.is_empty() {
            break;
        }
        if std::time::Instant::now() >= deadline {
            let runners = runners(&base);
            panic!(
                "timed out waiting for every job to complete after the restart; \
                 still open: {}; runners: {runners:#}; agents said: {}",
                serde_json::Value::from(unfinished),
                common::agent_logs(dir.path())
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = std::fs::read_to_string(&ran).unwrap();
    for i in 0..30 {
        assert!(text.lines().any(|l| l == i.to_string()), "job {i} ran");
    }
    for id in &ids {
        let job = job(&base, *id);
        assert_eq!(job["conclusion"], "success", "{job}");
    }
}

/// `runway-bench KIND ARGS… EXTRA…` as the admin, on the pool's labels:
/// its report, after checking it succeeded.
fn bench(dir: &Path, args: &[&str], extra: &[&str]) -> String {
    let output = common::runway_bench(dir)
        .args(args)
        .args(["--token", ADMIN, "--labels", "self-hosted,linux"])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn the_long_poll_benchmark_runs() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), "127.0.0.1:0");
    let (_server, base) = serve(dir.path());
    let report = bench(
        dir.path(),
        &["longpoll", "--url", &base, "--runners", "5", "--jobs", "10"],
        &["--gap-ms", "5"],
    );
    assert!(
        report.contains("5 runners waiting, 10 of 10 jobs received"),
        "{report}"
    );
    assert!(report.contains("p99"), "{report}");
}

#[test]
fn the_drain_benchmark_takes_every_job_through_to_success() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), "127.0.0.1:0");
    let (_server, base) = serve(dir.path());
    let report = bench(
        dir.path(),
        &["drain", "--url", &base, "--runners", "4", "--jobs", "30"],
        &[],
    );
    assert!(
        report.contains("1 replicas, 4 runners, 30 jobs"),
        "{report}"
    );
    assert!(report.contains("(30 in "), "{report}");
    let jobs: serde_json::Value = api(&base)
        .get(format!("{base}/api/v1/jobs?limit=100"))
        .bearer_auth(ADMIN)
        .send()
        .unwrap()
        .json()
        .unwrap();
    let jobs = jobs["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 30);
    for job in jobs {
        assert_eq!(job["conclusion"], "success", "{job}");
    }
}

#[test]
fn the_github_runner_hook_scripts_report_to_runway() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), "127.0.0.1:0");
    let (_server, base) = serve(dir.path());
    let registered: serde_json::Value = api(&base)
        .post(format!("{base}/api/v1/runners/register"))
        .json(&serde_json::json!({"token": common::registration_token(&base, ADMIN, "default"), "name": "hooked", "labels": ["linux"]}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let hooks = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/github-runner-hooks");
    for script in ["job-started.sh", "job-completed.sh"] {
        let status = Command::new("sh")
            .arg(hooks.join(script))
            .env("RUNWAY_URL", &base)
            .env("RUNWAY_RUNNER_ID", registered["runner_id"].to_string())
            .env(
                "RUNWAY_RUNNER_TOKEN",
                registered["runner_token"].as_str().unwrap(),
            )
            .env("GITHUB_WORKFLOW", "CI \"main\"")
            .env("GITHUB_REPOSITORY", "org/repo")
            .env("GITHUB_EVENT_NAME", "push")
            .env("GITHUB_RUN_ID", "5373506832")
            .status()
            .unwrap();
        assert!(status.success(), "{script}");
    }
    let metrics = common::metrics_text(&base);
    assert!(
        metrics.contains("runway_runner_reports_total{phase=\"pre-job\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("runway_runner_reports_total{phase=\"post-job\"} 1"),
        "{metrics}"
    );
    // Without runway's variables a hook does nothing and still succeeds.
    let status = Command::new("sh")
        .arg(hooks.join("job-started.sh"))
        .env_remove("RUNWAY_URL")
        .status()
        .unwrap();
    assert!(status.success());
}
