//! `runway serve` with a GitHub pool, as a user runs it, against the fake
//! GitHub of the server's tests: a lost `queued` webhook is redelivered by
//! the background task, the runner starts from its JIT configuration (a
//! `process` provider whose "machine" records what it was given), and once
//! its job is done it is stopped (GitHub removes a just-in-time runner
//! after its job itself).

use crate::common;
use runway_testkit::fake_github;

use std::path::Path;

use common::{metric, runway, spawn_serve, wait_for_lines, wait_until, RunnerProcesses};
use fake_github::{Auth, FakeGithub, HOOK_SECRET, TOKEN};

fn write_config(dir: &Path, github: &str) {
    let log = dir.join("jit.log");
    std::fs::write(
        dir.join("runway.toml"),
        format!(
            r#"[server]
listen = "127.0.0.1:0"

[scaling]
interval = "200ms"

[github]
api_url = "{github}"
token = "env:RUNWAY_TEST_GITHUB_TOKEN"
webhook_secrets = ["{HOOK_SECRET}"]
deliveries = "orgs/octo-org/hooks/9"
redeliver_interval = "1s"

{machines}[[pools]]
name = "gh"
labels = ["self-hosted", "linux"]
max_runners = 3
idle_grace = "0s"
providers = ["machines"]
[pools.github]
org = "octo-org"
"#,
            machines = common::jit_log_provider(&log, "2s"),
        ),
    )
    .unwrap();
}

/// `runway serve` on `dir/runway.toml`, the fake's webhooks pointed at it;
/// the runner processes it starts are killed when the last is dropped
/// (a failing test leaves none behind).
fn serve(dir: &Path, fake: &FakeGithub) -> (common::Process, String, RunnerProcesses) {
    let processes = RunnerProcesses(dir.join("processes"));
    let mut command = runway(dir);
    command
        .args(["serve", "--config", "runway.toml"])
        .env("RUNWAY_TEST_GITHUB_TOKEN", TOKEN);
    let (serve, base) = spawn_serve(command);
    fake.lock().webhook_url = Some(format!("{base}/webhooks/github"));
    (serve, base, processes)
}

#[test]
fn a_github_pool_heals_a_lost_webhook_starts_a_jit_runner_and_stops_it_after_its_job() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let fake = runtime.block_on(FakeGithub::start(4_000, Auth::Token));
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &fake.url);
    let (_serve, base, processes) = serve(dir.path(), &fake);

    // The queued webhook never reaches runway.
    fake.queue_job(601, &["self-hosted", "linux"]);
    assert_eq!(runtime.block_on(fake.deliver(601, "queued", true)), 0);

    // Redelivered within an interval; a runner starts from its JIT config.
    let log = dir.path().join("jit.log");
    wait_until("a runner started with a JIT configuration", 30, || {
        std::fs::read_to_string(&log).is_ok_and(|text| {
            text.lines()
                .any(|l| l.split_once(' ').is_some_and(|(_, jit)| !jit.is_empty()))
        })
    });
    let line = std::fs::read_to_string(&log).unwrap();
    let (name, jit) = line.trim().split_once(' ').unwrap();
    let github_id = fake
        .runner_id(name)
        .expect("registered at GitHub under its name");
    assert_eq!(jit, fake_github::encoded_jit(github_id, name));

    // GitHub runs the job on it; when it is over the runner goes.
    fake.start_job(601, name);
    assert_eq!(
        runtime.block_on(fake.deliver(601, "in_progress", false)),
        202
    );
    fake.complete_job(601, "success");
    assert_eq!(runtime.block_on(fake.deliver(601, "completed", false)), 202);
    wait_until("the runner's process to be stopped", 30, || {
        processes.tracked().is_empty()
    });
    assert_eq!(
        fake.calls_starting(&format!(
            "DELETE /orgs/octo-org/actions/runners/{github_id}"
        )),
        0,
        "a JIT runner leaves GitHub after its job by itself: not asked"
    );
    assert_eq!(metric(&base, "runway_github_redeliveries_total"), 1.0);
    assert_eq!(
        metric(
            &base,
            r#"runway_github_requests_total{operation="generate_jitconfig",status="201"}"#
        ),
        1.0
    );
    assert_eq!(fake.invalid(), Vec::<String>::new());
    assert_eq!(
        fake.calls_starting("POST /orgs/octo-org/actions/runners/generate-jitconfig"),
        1,
        "one runner for one job"
    );
}

/// A JIT runner of a pool admitting only octo-org's repositories is handed
/// (as GitHub may) a job of another repository: its job-started hook,
/// holding only the report token runway gave the runner, fails that job;
/// the event log says `repo-policy-check-failure`. A job the pool admits
/// passes the same hook; the report token does nothing else.
#[test]
fn the_job_started_hook_fails_a_job_its_runners_pool_does_not_admit() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let fake = runtime.block_on(FakeGithub::start(4_000, Auth::Token));
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &fake.url);
    let env_log = dir.path().join("env.log");
    let config = std::fs::read_to_string(dir.path().join("runway.toml")).unwrap();
    let config = config
        .replace(
            "echo \\\"$RUNWAY_RUNNER_NAME $RUNWAY_JIT_CONFIG\\\"",
            &format!(
                "echo \\\"$RUNWAY_RUNNER_ID $RUNWAY_RUNNER_TOKEN\\\" > '{}'; echo \\\"$RUNWAY_RUNNER_NAME $RUNWAY_JIT_CONFIG\\\"",
                env_log.display()
            ),
        )
        .replace(
            "[server]\n",
            "[server]\nadmin_tokens = [\"github-test-admin-token\"]\n",
        )
        + "[pools.access]\nrepositories = [\"octo-org/*\"]\n\n[telemetry]\nevent_log = \"events.log\"\n";
    std::fs::write(dir.path().join("runway.toml"), config).unwrap();
    let (_serve, base, processes) = serve(dir.path(), &fake);
    fake.queue_run_job(
        701,
        &["self-hosted", "linux"],
        "octo-org/app",
        91,
        "push",
        false,
    );
    assert_eq!(runtime.block_on(fake.deliver(701, "queued", false)), 202);
    wait_until("a runner started with its report token", 30, || {
        std::fs::read_to_string(&env_log).is_ok_and(|t| t.contains("rwp_"))
    });
    let text = std::fs::read_to_string(&env_log).unwrap();
    let (id, token) = text.trim().split_once(' ').unwrap();
    let hook = |repository: &str| {
        std::process::Command::new("sh")
            .arg(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../../contrib/github-runner-hooks/job-started.sh"),
            )
            .env("RUNWAY_URL", &base)
            .env("RUNWAY_RUNNER_ID", id)
            .env("RUNWAY_RUNNER_TOKEN", token)
            .env("GITHUB_WORKFLOW", "CI")
            .env("GITHUB_REPOSITORY", repository)
            .env("GITHUB_EVENT_NAME", "push")
            .env("GITHUB_RUN_ID", "91")
            .output()
            .unwrap()
    };
    let admitted = hook("octo-org/app");
    assert!(admitted.status.success(), "{admitted:?}");
    let refused = hook("someone/else");
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("someone/else is not in"));
    let events = std::fs::read_to_string(dir.path().join("events.log")).unwrap_or_default();
    let stop = events
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|e| e["event"] == "runner_stop")
        .unwrap_or_default();
    assert_eq!(stop["status"], "repo-policy-check-failure", "{events}");
    assert_eq!(
        metric(
            &base,
            r#"runway_access_refusals_total{pool="gh",kind="repository"}"#
        ),
        1.0
    );
    // The report token takes no job and reads nothing.
    let client = common::client();
    let request = client
        .post(format!("{base}/api/v1/jobs/request"))
        .bearer_auth(token)
        .send()
        .unwrap();
    assert_eq!(request.status(), 401);
    let listing = client
        .get(format!("{base}/api/v1/jobs"))
        .bearer_auth(token)
        .send()
        .unwrap();
    assert_eq!(listing.status(), 401);
    drop(processes);
}

/// GitHub hands a just-in-time runner a job runway's access policy refused
/// (docs/github.md warns it can): the runner runs it (its hook fails it)
/// and is used up. Its `in_progress` and `completed` name the runner: it
/// is let go and its place under `max_runners` (1 here) goes to a new
/// runner for the job the pool admits, which otherwise would wait forever.
#[test]
fn a_runner_used_up_by_a_refused_job_is_let_go_and_replaced() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let fake = runtime.block_on(FakeGithub::start(4_000, Auth::Token));
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &fake.url);
    let config = std::fs::read_to_string(dir.path().join("runway.toml")).unwrap();
    let config = config.replace("max_runners = 3", "max_runners = 1")
        + "[pools.access]\nrepositories = [\"octo-org/*\"]\n";
    std::fs::write(dir.path().join("runway.toml"), config).unwrap();
    let (_serve, _base, processes) = serve(dir.path(), &fake);
    let labels = ["self-hosted", "linux"];
    fake.queue_run_job(1001, &labels, "octo-org/app", 91, "push", false);
    assert_eq!(runtime.block_on(fake.deliver(1001, "queued", false)), 202);
    let log = dir.path().join("jit.log");
    let runners = || -> Vec<String> {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once(' ').map(|(name, _)| name.to_owned()))
            .collect()
    };
    wait_until("a runner for the admitted job", 30, || runners().len() == 1);
    let first = runners().remove(0);
    // Another repository's job, refused by the pool's access policy …
    fake.queue_run_job(1002, &labels, "someone/else", 92, "push", false);
    assert_eq!(runtime.block_on(fake.deliver(1002, "queued", false)), 202);
    // … is what GitHub gives the runner; its hook fails it.
    fake.start_job(1002, &first);
    assert_eq!(
        runtime.block_on(fake.deliver(1002, "in_progress", false)),
        202
    );
    fake.complete_job(1002, "failure");
    assert_eq!(
        runtime.block_on(fake.deliver(1002, "completed", false)),
        202
    );
    wait_until("the used-up runner to be stopped", 30, || {
        !processes.tracked().iter().any(|(name, _)| name == &first)
    });
    wait_until("a new runner for the admitted job", 30, || {
        runners().len() == 2
    });
}

/// The metrics spec's stop and completion, with runner machines running
/// `contrib/github-runner-hooks` as GitHub's runner runs them (`bash -e`,
/// the job's `GITHUB_*` variables):
/// - a runner killed -9 mid-job (its pre-job report, never a post-job
///   one) gets no `runner_stop` from GitHub's `completed`, and its job is
///   not counted completed: it crashed;
/// - a job cancelled while still queued, which never had a runner, gets no
///   stop, no run time, and is not a completion;
/// - a runner that ran both hooks stops `normal`, and its job is the one
///   completion, with one run time.
#[test]
fn stops_and_completions_follow_the_metrics_spec_as_githubs_runner_runs_the_hooks() {
    const ADMIN: &str = "github-spec-admin-token";
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let fake = runtime.block_on(FakeGithub::start(4_000, Auth::Token));
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &fake.url);
    let env_log = dir.path().join("env.log");
    let config = std::fs::read_to_string(dir.path().join("runway.toml"))
        .unwrap()
        .replace(
            "echo \\\"$RUNWAY_RUNNER_NAME $RUNWAY_JIT_CONFIG\\\"",
            &format!(
                "echo \\\"$RUNWAY_RUNNER_NAME $RUNWAY_RUNNER_ID $RUNWAY_RUNNER_TOKEN\\\" >> '{}'; echo \\\"$RUNWAY_RUNNER_NAME $RUNWAY_JIT_CONFIG\\\"",
                env_log.display()
            ),
        )
        .replace("[server]\n", &format!("[server]\nadmin_tokens = [\"{ADMIN}\"]\n"))
        + "\n[telemetry]\nevent_log = \"events.log\"\n";
    std::fs::write(dir.path().join("runway.toml"), config).unwrap();
    let (_serve, base, _processes) = serve(dir.path(), &fake);
    // The runner started for the newest queued job: (name, id, token).
    let runner_for = |lines: usize| -> (String, String, String) {
        wait_for_lines(
            "a runner started with its report token",
            &env_log,
            lines,
            30,
        );
        let text = std::fs::read_to_string(&env_log).unwrap();
        let mut words = text.lines().nth(lines - 1).unwrap().split_whitespace();
        let mut next = || words.next().unwrap().to_owned();
        (next(), next(), next())
    };
    let hook = |script: &str, (_, id, token): &(String, String, String), run: u64| {
        let output = std::process::Command::new("bash")
            .arg("-e")
            .arg(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("../../contrib/github-runner-hooks")
                    .join(script),
            )
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("RUNWAY_URL", &base)
            .env("RUNWAY_RUNNER_ID", id)
            .env("RUNWAY_RUNNER_TOKEN", token)
            .env("GITHUB_ACTIONS", "true")
            .env("GITHUB_WORKFLOW", "CI")
            .env("GITHUB_REPOSITORY", "octo-org/app")
            .env("GITHUB_EVENT_NAME", "push")
            .env("GITHUB_RUN_ID", run.to_string())
            .env("GITHUB_RUN_ATTEMPT", "1")
            .env("GITHUB_JOB", "build")
            .output()
            .unwrap();
        assert!(output.status.success(), "{script}: {output:?}");
    };
    let deliver = |id: u64, action: &str| {
        assert_eq!(
            runtime.block_on(fake.deliver(id, action, false)),
            202,
            "{id} {action}"
        );
    };

    // Killed -9 mid-job: pre-job reported, post-job never.
    fake.queue_run_job(
        801,
        &["self-hosted", "linux"],
        "octo-org/app",
        91,
        "push",
        false,
    );
    deliver(801, "queued");
    let killed = runner_for(1);
    fake.start_job(801, &killed.0);
    deliver(801, "in_progress");
    hook("job-started.sh", &killed, 91);
    fake.complete_job(801, "failure");
    deliver(801, "completed");

    // Ran to its end, both hooks. (The second runner runway started: the
    // first was the killed one's.)
    fake.queue_run_job(
        803,
        &["self-hosted", "linux"],
        "octo-org/app",
        93,
        "push",
        false,
    );
    deliver(803, "queued");
    let finished = runner_for(2);
    fake.start_job(803, &finished.0);
    deliver(803, "in_progress");
    hook("job-started.sh", &finished, 93);
    hook("job-completed.sh", &finished, 93);
    fake.complete_job(803, "success");
    deliver(803, "completed");

    // Cancelled while queued: no runner ever ran it.
    fake.queue_run_job(
        802,
        &["self-hosted", "linux"],
        "octo-org/app",
        92,
        "push",
        false,
    );
    deliver(802, "queued");
    fake.complete_job(802, "cancelled");
    deliver(802, "completed");

    let stops = || {
        runway_testkit::event_log(&dir.path().join("events.log"))
            .of("runner_stop")
            .into_iter()
            .cloned()
            .collect::<Vec<_>>()
    };
    wait_until("the finished runner's stop", 30, || !stops().is_empty());
    let stops = stops();
    assert_eq!(stops.len(), 1, "one stop, the finished runner's: {stops:?}");
    assert_eq!(stops[0]["status"], "normal", "{stops:?}");
    assert_eq!(
        metric(&base, "runway_jobs_completed_total"),
        1.0,
        "{}",
        common::metrics_text(&base)
    );
    assert_eq!(
        metric(&base, "runway_job_run_duration_seconds_count"),
        1.0,
        "{}",
        common::metrics_text(&base)
    );
    assert_eq!(metric(&base, "runway_jobs_started_total"), 2.0);
}

/// The GitHub pool of [`write_config`] behind an access policy that needs
/// the run's facts (`forks = "deny"`), with an admin token and `extra`
/// keys in `[github]`.
fn write_fork_denying_config(dir: &Path, github: &str, admin: &str, extra: &str) {
    write_config(dir, github);
    let config = std::fs::read_to_string(dir.join("runway.toml"))
        .unwrap()
        .replace(
            "[server]\n",
            &format!("[server]\nadmin_tokens = [\"{admin}\"]\n"),
        )
        .replace(
            "redeliver_interval = \"1s\"\n",
            &format!("redeliver_interval = \"1s\"\n{extra}"),
        )
        + "\n[pools.access]\nrepositories = [\"octo-org/*\"]\nforks = \"deny\"\n";
    std::fs::write(dir.join("runway.toml"), config).unwrap();
}

/// The stored job of GitHub job `github_id`, by the API.
fn github_job(base: &str, admin: &str, github_id: u64) -> serde_json::Value {
    let listed = common::api_get(base, admin, "/api/v1/jobs?limit=100");
    let wanted = github_id.to_string();
    listed["jobs"]
        .as_array()
        .and_then(|jobs| {
            jobs.iter()
                .find(|job| job["external_id"] == wanted.as_str())
                .cloned()
        })
        .unwrap_or_default()
}

/// Issue 58, item 7: the workflow-run lookup fails for longer than GitHub
/// redelivers, for a job whose only pool denies forks. The job is stored
/// held (the webhook gets 202, a redelivery is a duplicate), nothing
/// starts for it while GitHub cannot say, the run is looked up again with
/// backoff, and when GitHub answers the job runs on its pool, once.
#[test]
fn a_job_held_through_a_run_lookup_outage_runs_on_its_pool_exactly_once() {
    const ADMIN: &str = "github-held-admin-token";
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let fake = runtime.block_on(FakeGithub::start(4_000, Auth::Token));
    let dir = tempfile::tempdir().unwrap();
    write_fork_denying_config(dir.path(), &fake.url, ADMIN, "");
    let (_serve, base, processes) = serve(dir.path(), &fake);
    fake.lock().refuse_runs = Some(axum::http::StatusCode::BAD_GATEWAY);
    fake.queue_run_job(
        901,
        &["self-hosted", "linux"],
        "octo-org/app",
        91,
        "push",
        false,
    );
    assert_eq!(runtime.block_on(fake.deliver(901, "queued", false)), 202);
    let held = github_job(&base, ADMIN, 901);
    assert_eq!(held["state"], "held", "{held}");
    assert_eq!(held["pool"], serde_json::Value::Null, "{held}");
    let explained = common::job(&base, ADMIN, held["id"].as_i64().unwrap());
    assert_eq!(explained["waiting"]["code"], "held", "{explained}");
    assert!(
        explained["waiting"]["details"]["gives_up_at"].is_string(),
        "{explained}"
    );
    // GitHub redelivers it: stored already.
    assert_eq!(runtime.block_on(fake.deliver(901, "queued", false)), 200);
    // The outage goes on past the webhook's own lookup and the leader's
    // next two; nothing starts for a job whose facts are unknown.
    let lookups = || fake.calls_starting("GET /repos/octo-org/app/actions/runs/91");
    wait_until("the run looked up again, with backoff", 40, || {
        lookups() >= 3
    });
    assert_eq!(
        fake.calls_starting("POST /orgs/octo-org/actions/runners/generate-jitconfig"),
        0,
        "no runner for a held job"
    );
    assert_eq!(github_job(&base, ADMIN, 901)["state"], "held");
    assert_eq!(metric(&base, "runway_jobs_held_total"), 1.0);
    // GitHub answers again: the job is released to its pool and runs.
    fake.lock().refuse_runs = None;
    let log = dir.path().join("jit.log");
    wait_until("a runner started for the released job", 60, || {
        std::fs::read_to_string(&log).is_ok_and(|text| !text.trim().is_empty())
    });
    let line = std::fs::read_to_string(&log).unwrap();
    let (name, _) = line.trim().split_once(' ').unwrap();
    let released = github_job(&base, ADMIN, 901);
    assert_eq!(
        (&released["state"], &released["pool"]),
        (&serde_json::json!("queued"), &serde_json::json!("gh")),
        "{released}"
    );
    fake.start_job(901, name);
    assert_eq!(
        runtime.block_on(fake.deliver(901, "in_progress", false)),
        202
    );
    fake.complete_job(901, "success");
    assert_eq!(runtime.block_on(fake.deliver(901, "completed", false)), 202);
    wait_until("the runner's process to be stopped", 30, || {
        processes.tracked().is_empty()
    });
    let done = github_job(&base, ADMIN, 901);
    assert_eq!(
        (&done["state"], &done["pool"]),
        (&serde_json::json!("completed"), &serde_json::json!("gh")),
        "{done}"
    );
    assert_eq!(
        fake.calls_starting("POST /orgs/octo-org/actions/runners/generate-jitconfig"),
        1,
        "one runner for one job"
    );
    assert_eq!(metric(&base, "runway_jobs_held_current"), 0.0);
    assert_eq!(fake.invalid(), Vec::<String>::new());
}

/// A held job whose run GitHub never describes is given up after
/// `[github] run_facts_wait`, as `unroutable` with the reason, counted.
#[test]
fn a_held_job_is_given_up_after_run_facts_wait_with_its_reason() {
    const ADMIN: &str = "github-held-wait-admin-token";
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let fake = runtime.block_on(FakeGithub::start(4_000, Auth::Token));
    let dir = tempfile::tempdir().unwrap();
    write_fork_denying_config(dir.path(), &fake.url, ADMIN, "run_facts_wait = \"2s\"\n");
    let (_serve, base, _processes) = serve(dir.path(), &fake);
    fake.lock().refuse_runs = Some(axum::http::StatusCode::BAD_GATEWAY);
    fake.queue_run_job(
        902,
        &["self-hosted", "linux"],
        "octo-org/app",
        92,
        "push",
        false,
    );
    assert_eq!(runtime.block_on(fake.deliver(902, "queued", false)), 202);
    wait_until("the held job given up", 30, || {
        github_job(&base, ADMIN, 902)["state"] == "unroutable"
    });
    let given_up = github_job(&base, ADMIN, 902);
    let reason = given_up["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("run_facts_wait = \"2s\"") && reason.contains("forks"),
        "{given_up}"
    );
    assert_eq!(
        metric(
            &base,
            r#"runway_jobs_rejected_total{reason="run_facts_unknown"}"#
        ),
        1.0
    );
    assert_eq!(
        fake.calls_starting("POST /orgs/octo-org/actions/runners/generate-jitconfig"),
        0
    );
}
