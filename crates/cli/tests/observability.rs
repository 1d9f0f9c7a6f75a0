//! Observability as an operator checks it: the alert and recording rules
//! pass promtool (and their unit tests), a real scrape of `runway serve`
//! that has run jobs passes `promtool check metrics`, and a real Prometheus
//! scraping it reads the series back. Needs Debian's `prometheus` package
//! (`.ci/run` installs it); without it these tests say so and, under CI,
//! fail.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{client, wait_until, Process, RunnerProcesses};
use serde_json::Value;

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn tool(name: &str) -> Option<PathBuf> {
    common::tool(name, "Debian's prometheus package")
}

#[test]
fn alert_and_recording_rules_pass_promtool_and_their_unit_tests() {
    let Some(promtool) = tool("promtool") else {
        return;
    };
    let rules = repository().join("deploy/prometheus");
    let check = Command::new(&promtool)
        .args(["check", "rules", "alerts.yml", "recording.yml"])
        .current_dir(&rules)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let test = Command::new(&promtool)
        .args(["test", "rules", "alerts_test.yml"])
        .current_dir(&rules)
        .output()
        .unwrap();
    assert!(
        test.status.success(),
        "{}{}",
        String::from_utf8_lossy(&test.stdout),
        String::from_utf8_lossy(&test.stderr)
    );
}

/// `runway serve` in `dir` with the event log at `event_log`, one pool of
/// `runway agent --once` runners, and one job run to completion: the
/// server, its address and the job's id.
fn serve_and_run_one_job(dir: &Path, admin: &str, event_log: &str) -> (Process, String, i64) {
    common::write_config(
        dir,
        "127.0.0.1:0",
        admin,
        "200ms",
        &format!(
            r#"[telemetry]
event_log = "{event_log}"

[[providers]]
name = "local"
kind = "process"
command = ["runway", "agent", "--once"]
state_dir = "processes"
max_instances = 1

[[pools]]
name = "linux"
labels = ["linux"]
max_runners = 1
providers = ["local"]
"#
        ),
    );
    let (server, base) = common::serve_in(dir, &["--config", "runway.toml"]);
    let id = common::submit(&base, admin, "echo done");
    wait_until("the job to complete", 90, || {
        common::job(&base, admin, id)["state"] == "completed"
    });
    (server, base, id)
}

/// A full disk under the event log (`/dev/full` answers every write with
/// ENOSPC): the job still runs, each dropped line is counted in
/// `runway_event_log_errors_total`, which the `RunwayEventLogErrors` alert
/// watches (its promtool unit test runs in the test above).
#[test]
fn a_full_disk_under_the_event_log_is_counted_and_jobs_still_run() {
    if !Path::new("/dev/full").exists() {
        eprintln!("skipped: this system has no /dev/full");
        return;
    }
    const ADMIN: &str = "event-log-admin-token";
    let dir = tempfile::tempdir().unwrap();
    let _runners = RunnerProcesses(dir.path().join("processes"));
    let (_server, base, _) = serve_and_run_one_job(dir.path(), ADMIN, "/dev/full");
    wait_until("the dropped lines to be counted", 30, || {
        common::metric(&base, "runway_event_log_errors_total") >= 2.0
    });
}

/// Issue 58, items 1 and 5, on the real binary: a job of runway's own API
/// ends its runner with the seed's `runner_stop` (`status` "normal", the
/// job's conclusion apart in `conclusion`), and runner reports refused
/// for their token are counted by reason.
#[test]
fn an_api_job_stops_its_runner_as_the_seed_says_and_refused_reports_are_counted() {
    const ADMIN: &str = "seed-stop-admin-token";
    let dir = tempfile::tempdir().unwrap();
    let _runners = RunnerProcesses(dir.path().join("processes"));
    let (_server, base, id) = serve_and_run_one_job(dir.path(), ADMIN, "events.log");
    let log = dir.path().join("events.log");
    wait_until("the runner's stop in the event log", 30, || {
        !common::event_log(&log).of("runner_stop").is_empty()
    });
    let events = common::event_log(&log);
    let stops = events.of("runner_stop");
    assert_eq!(stops.len(), 1, "{stops:?}");
    assert_eq!(stops[0]["status"], "normal", "{}", stops[0]);
    assert_eq!(stops[0]["conclusion"], "success", "{}", stops[0]);
    // Reports refused for their token: none, or one that is no runner's.
    let runner = common::job(&base, ADMIN, id)["runner"]
        .as_i64()
        .unwrap_or(1);
    let url = format!("{base}/api/v1/runners/{runner}/metrics");
    let report = serde_json::json!({"phase": "pre-job", "timestamp": 1_700_000_000});
    for token in [None, Some("not-a-runner-token")] {
        let mut request = common::client().post(&url).json(&report);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let status = request.send().unwrap().status().as_u16();
        assert_eq!(status, 401, "token {token:?}");
    }
    assert_eq!(
        common::metric(
            &base,
            r#"runway_runner_reports_rejected_total{reason="unauthorized"}"#
        ),
        2.0
    );
}

#[test]
fn a_real_scrape_passes_promtool_and_prometheus_reads_the_series_back() {
    let (Some(promtool), Some(prometheus)) = (tool("promtool"), tool("prometheus")) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Out of the box (no config): pool `local`, runners started by runway.
    let _runners = RunnerProcesses(dir.path().join("runway-processes/local"));
    let (_server, base) = common::serve_in(dir.path(), &["--listen", "127.0.0.1:0"]);
    let token = std::fs::read_to_string(dir.path().join("runway-admin.token"))
        .unwrap()
        .trim()
        .to_owned();
    // The login page says where that token is (it does only when runway
    // wrote one).
    let login = client()
        .get(format!("{base}/"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(
        login.contains("wrote an admin token to <code>runway-admin.token</code>"),
        "{login}"
    );
    for i in 0..5 {
        let submitted = client()
            .post(format!("{base}/api/v1/jobs"))
            .bearer_auth(&token)
            .json(&serde_json::json!({"labels": ["local"], "script": format!("echo {i}"), "timeout_seconds": 60}))
            .send()
            .unwrap();
        assert_eq!(submitted.status(), 201);
    }
    let metrics = |accept: Option<&str>| {
        let mut request = client().get(format!("{base}/metrics"));
        if let Some(accept) = accept {
            request = request.header("accept", accept);
        }
        request.send().unwrap().text().unwrap()
    };
    wait_until("5 jobs completed", 60, || {
        metrics(None)
            .contains(r#"runway_jobs_completed_total{pool="local",conclusion="success"} 5"#)
    });

    // promtool's linter, on the classic text a plain client gets.
    let mut check = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    check
        .stdin
        .take()
        .unwrap()
        .write_all(metrics(None).as_bytes())
        .unwrap();
    let checked = check.wait_with_output().unwrap();
    assert!(
        checked.status.success() && checked.stdout.is_empty() && checked.stderr.is_empty(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );

    // A real Prometheus on loopback, scraping every second (OpenMetrics).
    let port = common::free_port();
    let target = base.trim_start_matches("http://");
    std::fs::write(
        dir.path().join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: runway\n    static_configs:\n      - targets: ['{target}']\nrule_files:\n  - {}\n",
            repository().join("deploy/prometheus/recording.yml").display()
        ),
    )
    .unwrap();
    let _prometheus = Process(
        Command::new(&prometheus)
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let query = |expr: &str| -> Option<f64> {
        let answer: Value = client()
            .get(format!("http://127.0.0.1:{port}/api/v1/query"))
            .query(&[("query", expr)])
            .send()
            .ok()?
            .json()
            .ok()?;
        answer["data"]["result"][0]["value"][1]
            .as_str()?
            .parse()
            .ok()
    };
    wait_until("Prometheus to read runway's series", 60, || {
        query(r#"sum(runway_jobs_completed_total{pool="local"})"#) == Some(5.0)
    });
    assert_eq!(
        query(r#"sum(runway_jobs_started_total{pool="local"})"#),
        Some(5.0)
    );
    assert_eq!(
        query(r#"sum(runway_job_queue_duration_seconds_count{pool="local"})"#),
        Some(5.0)
    );
    assert!(query("sum(runway_runners_created_total)").is_some_and(|n| n >= 5.0));
    assert!(
        query("sum(runway_runner_install_duration_seconds_count)").is_some_and(|n| n >= 5.0),
        "every runner's install time is measured"
    );
    assert!(query("up{job=\"runway\"}") == Some(1.0));
}

/// `runway-bench soak` end to end, small: two servers, a seeded history
/// that retention keeps, every figure in the table.
#[test]
fn the_soak_benchmark_compares_an_empty_store_with_a_long_history() {
    let dir = tempfile::tempdir().unwrap();
    let output = common::runway_bench(dir.path())
        .args(["soak", "--history", "500", "--webhooks", "40"])
        .args(["--concurrency", "4", "--requests", "5", "--rounds", "2"])
        .args(["--repeat", "2"])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{log}");
    assert!(
        log.contains("seeded 500 finished jobs, ended runners and deliveries"),
        "{log}"
    );
    assert!(log.contains("history: retention pruned 0 rows"), "{log}");
    let table = String::from_utf8_lossy(&output.stdout).into_owned();
    // Two runs of each phase, alternating: four servers in all.
    assert_eq!(
        log.matches("history: retention pruned 0 rows").count(),
        2,
        "{log}"
    );
    for row in [
        "| SQLite (median of 2) |",
        "| reconcile round (mean) |",
        "| `GET /api/v1/pools` p99 |",
        "| `GET /api/v1/jobs?limit=50` p99 |",
        "| intake p99 |",
        "| intake (4 connections) |",
    ] {
        assert!(table.contains(row), "{row} in {table}");
    }
}
