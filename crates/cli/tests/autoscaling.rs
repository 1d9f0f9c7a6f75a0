//! End-to-end autoscaling: `runway serve` with a `sim` provider (boot 1 s),
//! 200 queued webhooks into a pool capped at 50 runners, then `in_progress`
//! and `completed` webhooks for every job on the runners runway started.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{client, wait_until, Process};

use runway_server::github::signature::sign;
use serde_json::{json, Value};

const ADMIN: &str = "autoscaling-admin-token";
const SECRET: &str = "autoscaling-webhook-secret";

fn serve(dir: &Path, fail_rate: f64) -> (Process, String) {
    common::write_config(
        dir,
        "127.0.0.1:0",
        ADMIN,
        "200ms",
        &format!(
            r#"[github]
webhook_secrets = ["{SECRET}"]

[[providers]]
name = "sim"
kind = "sim"
boot_seconds = 1
max_instances = 200
fail_rate = {fail_rate}

[[pools]]
name = "linux"
labels = ["self-hosted", "linux"]
min_idle = 1
max_runners = 50
idle_grace = "2s"
providers = ["sim"]
ephemeral = false
"#
        ),
    );
    common::serve_in(dir, &["--config", "runway.toml"])
}

fn webhook(base: &str, delivery: &str, action: &str, job: u64, runner: Option<&str>) {
    let body = json!({
        "action": action,
        "workflow_job": {
            "id": job,
            "run_id": 1,
            "labels": ["self-hosted", "linux"],
            "runner_name": runner,
            "conclusion": if action == "completed" { Some("success") } else { None },
            "created_at": "2026-11-22T10:00:00Z",
            "started_at": "2026-11-22T10:00:05Z",
            "completed_at": if action == "completed" { Some("2026-11-22T10:01:05Z") } else { None },
        },
        "repository": { "full_name": "org/repo" },
    })
    .to_string();
    let response = client()
        .post(format!("{base}/webhooks/github"))
        .header("x-github-event", "workflow_job")
        .header("x-github-delivery", delivery)
        .header(
            "x-hub-signature-256",
            sign(SECRET.as_bytes(), body.as_bytes()),
        )
        .body(body)
        .send()
        .unwrap();
    assert!(
        response.status().is_success(),
        "{action} {job}: {}",
        response.status()
    );
}

fn get(base: &str, path: &str) -> Value {
    client()
        .get(format!("{base}{path}"))
        .bearer_auth(ADMIN)
        .send()
        .unwrap()
        .json()
        .unwrap()
}

fn runners(base: &str, state: &str) -> Vec<Value> {
    get(base, &format!("/api/v1/runners?state={state}"))["runners"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Live runners, from one listing (separate listings per state could count
/// a runner twice while it changes state).
fn live_runners(base: &str) -> usize {
    get(base, "/api/v1/runners")["runners"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter(|r| {
                    !matches!(
                        r["state"].as_str(),
                        Some("terminated" | "failed" | "crashed")
                    )
                })
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn two_hundred_jobs_fifty_runners_and_back_to_min_idle() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, base) = serve(dir.path(), 0.0);
    let mut max_seen = 0;
    for job in 1..=200u64 {
        webhook(&base, &format!("q-{job}"), "queued", job, None);
    }
    wait_until("50 runners to be ready", 60, || {
        let live = live_runners(&base);
        max_seen = max_seen.max(live);
        runners(&base, "idle").len() == 50
    });
    // A job beyond the cap says why it waits.
    let page = get(&base, "/api/v1/jobs?state=queued&limit=1");
    let id = page["jobs"][0]["id"].as_i64().unwrap();
    let job = get(&base, &format!("/api/v1/jobs/{id}"));
    assert_eq!(job["waiting"]["code"], "at_max_runners", "{job}");

    // Four waves: 50 jobs start on the 50 runners, then complete.
    for wave in 0..4u64 {
        let idle: Vec<String> = runners(&base, "idle")
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_owned())
            .collect();
        assert!(idle.len() >= 50, "wave {wave}: {} idle runners", idle.len());
        for (i, name) in idle.iter().take(50).enumerate() {
            let job = wave * 50 + i as u64 + 1;
            webhook(&base, &format!("s-{job}"), "in_progress", job, Some(name));
        }
        max_seen = max_seen.max(live_runners(&base));
        assert_eq!(runners(&base, "busy").len(), 50, "wave {wave}");
        for (i, name) in idle.iter().take(50).enumerate() {
            let job = wave * 50 + i as u64 + 1;
            webhook(&base, &format!("c-{job}"), "completed", job, Some(name));
        }
    }
    assert!(
        max_seen <= 50,
        "never more than max_runners: saw {max_seen}"
    );
    let queued = get(&base, "/api/v1/jobs?state=queued&limit=10");
    assert_eq!(queued["jobs"].as_array().map(Vec::len), Some(0));
    wait_until("the pool to return to min_idle = 1", 60, || {
        live_runners(&base) == 1 && runners(&base, "idle").len() == 1
    });
    let metrics = common::metrics_text(&base);
    assert!(
        !metrics.contains("result=\"refused_busy\""),
        "no delete request for a busy runner:\n{metrics}"
    );
    assert!(
        metrics.contains("runway_runner_delete_requests_total{pool=\"linux\",result=\"ok\"} 49"),
        "{metrics}"
    );
}

#[test]
fn with_thirty_percent_of_creates_failing_every_job_still_gets_a_runner() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, base) = serve(dir.path(), 0.3);
    for job in 1..=100u64 {
        webhook(&base, &format!("q-{job}"), "queued", job, None);
    }
    let mut started = 0u64;
    let deadline = Instant::now() + Duration::from_secs(60);
    while started < 100 {
        assert!(
            Instant::now() < deadline,
            "every job got a runner within 60 s; {started} started"
        );
        std::thread::sleep(Duration::from_millis(100));
        let idle: Vec<String> = runners(&base, "idle")
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_owned())
            .collect();
        for name in &idle {
            if started == 100 {
                break;
            }
            started += 1;
            webhook(
                &base,
                &format!("s-{started}"),
                "in_progress",
                started,
                Some(name),
            );
            webhook(
                &base,
                &format!("c-{started}"),
                "completed",
                started,
                Some(name),
            );
        }
    }
    let failed = get(&base, "/api/v1/runners?state=failed")["runners"]
        .as_array()
        .map(Vec::len)
        .unwrap_or(0);
    assert!(failed > 0, "some creates failed, as configured");
    let queued = get(&base, "/api/v1/jobs?state=queued&limit=10");
    assert_eq!(
        queued["jobs"].as_array().map(Vec::len),
        Some(0),
        "no job was left without a runner"
    );
}

/// A job whose only provider is backing off after failed creates says so:
/// `provider_backoff`, with the provider's last error in words, not "no
/// provider has capacity" with a hint about `max_instances`.
#[test]
fn a_job_whose_every_provider_backs_off_says_provider_backoff_with_the_error() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("provider.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n\
         case \"$GARM_COMMAND\" in\n\
           CreateInstance) echo 'InsufficientInstanceCapacity: no m5.large left in us-east-1a' >&2; exit 1 ;;\n\
           ListInstances) echo '[]' ;;\n\
         esac\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    common::write_config(
        dir.path(),
        "127.0.0.1:0",
        ADMIN,
        "200ms",
        &format!(
            r#"[providers.cloud]
kind = "exec"
executable = "{}"
max_instances = 4

[[pools]]
name = "linux"
labels = ["linux"]
max_runners = 4
providers = ["cloud"]
"#,
            script.display()
        ),
    );
    let (_server, base) = common::serve_in(dir.path(), &["--config", "runway.toml"]);
    let id = common::submit(&base, ADMIN, "true");
    let mut waiting = Value::Null;
    wait_until("the job to say its provider backs off", 60, || {
        waiting = common::job(&base, ADMIN, id)["waiting"].clone();
        waiting["code"] == "provider_backoff"
    });
    assert_eq!(waiting["details"]["provider"], "cloud", "{waiting}");
    assert!(
        waiting["details"]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("InsufficientInstanceCapacity")),
        "{waiting}"
    );
}
