//! Two `runway serve` replicas on one PostgreSQL store: both take requests,
//! exactly one (the holder of an advisory lock) reconciles; when it dies
//! (SIGKILL), the other takes over. Each replica's `sim` provider knows
//! only its own machines, so a follower that reconciled would fail the
//! leader's runners as vanished and start its own: its
//! `runway_runners_created_total` stays 0 only if it never does.
//!
//! The tests here run up to nine replicas at once against the machine's
//! PostgreSQL: each keeps its pool at 4 connections.

use crate::common;

use std::path::Path;

use common::{metric, wait_for_lines, wait_until, PgSchema, Process};

/// The admin token of every replica here.
const ADMIN: &str = "replicas-admin-token";

fn serve(dir: &Path, database: &str) -> (Process, String) {
    common::serve_in(dir, &["--config", "runway.toml", "--database", database])
}

/// `GET /api/v1/cluster` on `base`.
fn cluster(base: &str) -> serde_json::Value {
    common::client()
        .get(format!("{base}/api/v1/cluster"))
        .bearer_auth(ADMIN)
        .send()
        .and_then(|r| r.json())
        .expect("the cluster view")
}

#[test]
fn one_replica_reconciles_and_another_takes_over_when_it_dies() {
    let schema = PgSchema::create("runway_replicas");
    let scoped = schema.scoped.clone();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("runway.toml"),
        r#"[server]
listen = "127.0.0.1:0"
database_max_connections = 4
admin_tokens = ["replicas-admin-token"]

[scaling]
interval = "200ms"

[[providers]]
name = "cloud"
kind = "sim"
boot_seconds = 0

[[pools]]
name = "warm"
labels = ["self-hosted", "linux"]
min_idle = 2
max_runners = 4
providers = ["cloud"]
"#,
    )
    .unwrap();
    let (first, a) = serve(dir.path(), &scoped);
    wait_until("the first replica to lead", 30, || {
        metric(&a, "runway_leader") == 1.0
    });
    let (mut second, b) = serve(dir.path(), &scoped);
    wait_until("the leader to start its two warm runners", 30, || {
        metric(&a, "runway_runners_created_total") == 2.0
            && metric(&a, "runway_runners{pool=\"warm\",state=\"idle\"}") == 2.0
    });
    // The follower serves (its /metrics answers) but does not reconcile.
    assert_eq!(metric(&b, "runway_leader"), 0.0);
    assert_eq!(metric(&b, "runway_runners_created_total"), 0.0);
    assert_eq!(
        metric(&a, "runway_runners_created_total"),
        2.0,
        "nobody failed the leader's runners"
    );

    wait_until("both replicas in the cluster view", 30, || {
        cluster(&b)["replicas"].as_array().map(Vec::len) == Some(2)
    });
    let before = cluster(&b);
    let first_term = before["leader"]["term"].as_i64().expect("a term");
    let first_leader = before["leader"]["replica"].clone();
    assert!(first_term >= 1, "{before}");

    drop(first); // SIGKILL: its session ends, and with it the lock.
    wait_until("the second replica to take the lead", 30, || {
        metric(&b, "runway_leader") == 1.0
    });
    // A new leader, in the next term.
    let after = cluster(&b);
    assert_eq!(
        after["leader"]["term"].as_i64(),
        Some(first_term + 1),
        "{after}"
    );
    assert_eq!(after["leader"]["replica"], after["replica"], "{after}");
    assert_ne!(after["leader"]["replica"], first_leader, "{after}");
    // The dead leader did not release its term: the new one waited one
    // silence of the lock (5 checks of 1 s) for its lease to run out.
    assert_eq!(after["lead"]["waited_ms"], 5_000, "{after}");
    assert_eq!(after["lead"]["acting"], true, "{after}");
    // Its sim has none of the dead leader's machines: it starts its own.
    wait_until("the new leader to keep two runners warm", 30, || {
        metric(&b, "runway_runners{pool=\"warm\",state=\"idle\"}") == 2.0
    });

    // A leader stopped in order (SIGTERM) releases its term: the replica
    // that takes over acts at once.
    let (_third, c) = serve(dir.path(), &scoped);
    wait_until("the third replica in the cluster view", 30, || {
        cluster(&c)["replicas"].as_array().map(Vec::len) >= Some(2)
    });
    assert!(second.terminate().success(), "a clean stop");
    wait_until("the third replica to take the lead", 30, || {
        metric(&c, "runway_leader") == 1.0
    });
    let handed = cluster(&c);
    assert_eq!(
        handed["leader"]["term"].as_i64(),
        Some(first_term + 2),
        "{handed}"
    );
    assert_eq!(handed["lead"]["waited_ms"], 0, "{handed}");
    assert_eq!(handed["lead"]["acting"], true, "{handed}");
}

/// A directory with a `runway.toml` for replicas that serve long-polling
/// runners: the admin token, a 30 s poll, pool `default` (self-hosted,
/// linux), 4 connections each.
fn runner_api_config() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("runway.toml"),
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\ndatabase_max_connections = 4\nadmin_tokens = [\"{ADMIN}\"]\n\
             [runner_api]\npoll_timeout = \"30s\"\n\
             [[pools]]\nname = \"default\"\nlabels = [\"self-hosted\", \"linux\"]\n"
        ),
    )
    .unwrap();
    dir
}

/// A job submitted on one replica reaches a runner long-polling on the
/// other through a wake-up (LISTEN/NOTIFY), not the long poll's timer, and
/// a job that arrives on a follower asks the leader for a round the same
/// way. Counted, not timed: the follower sent both kinds of wake-up and the
/// leader received them.
#[test]
fn wake_ups_cross_replicas() {
    let schema = PgSchema::create("runway_wakeups");
    let dir = runner_api_config();
    let (_leader, a) = serve(dir.path(), &schema.scoped);
    wait_until("the first replica to lead", 30, || {
        metric(&a, "runway_leader") == 1.0
    });
    let (_follower, b) = serve(dir.path(), &schema.scoped);
    let wakes = |base: &str, direction: &str, kind: &str| {
        metric(
            base,
            &format!("runway_wakeups_total{{direction=\"{direction}\",kind=\"{kind}\"}}"),
        )
    };
    // The runner polls the leader; its jobs are submitted on the follower.
    let _agent = common::agent(dir.path(), &a, ADMIN, "r", "self-hosted,linux", &[]);
    let ids: Vec<i64> = (0..5)
        .map(|i| common::submit(&b, ADMIN, &format!("echo {i}")))
        .collect();
    wait_until("every job to complete", 60, || {
        ids.iter()
            .all(|id| common::job(&b, ADMIN, *id)["state"] == "completed")
    });
    assert!(
        wakes(&b, "sent", "job") >= 1.0,
        "the follower announced its jobs"
    );
    assert!(wakes(&b, "sent", "reconcile") >= 1.0);
    assert!(
        wakes(&a, "received", "job") >= 1.0,
        "the leader heard of them"
    );
    assert!(wakes(&a, "received", "reconcile") >= 1.0);
    // Both replicas are in the cluster view, the first one leading.
    wait_until("both replicas in the cluster view", 30, || {
        cluster(&b)["replicas"].as_array().map(Vec::len) == Some(2)
    });
    let view = cluster(&b);
    let replicas = view["replicas"].as_array().expect("replicas");
    assert_eq!(replicas.len(), 2, "{view}");
    assert_eq!(replicas[0]["address"], a.as_str(), "oldest first: {view}");
    assert_eq!(replicas[0]["leader"], true, "{view}");
    assert_eq!(replicas[1]["address"], b.as_str(), "{view}");
    assert_eq!(replicas[1]["id"], view["replica"], "{view}");
    // Nobody acts on its own announcements.
    assert_eq!(
        wakes(&b, "received", "job"),
        0.0,
        "the follower sent, it did not hear"
    );
}

/// A job queued on one replica wakes *one* of the runners long-polling on
/// another that can take it, not all of them (each woken runner pays a
/// claim, and only one gets the job): four agents poll the first replica,
/// five jobs are submitted one after another on the second, and the first
/// counts five runners woken (`runway_runners_woken_total`), where waking
/// the pool would count up to twenty.
#[test]
fn a_job_from_another_replica_wakes_one_runner() {
    const AGENTS: usize = 4;
    const JOBS: usize = 5;
    let schema = PgSchema::create("runway_one_wake");
    let dir = runner_api_config();
    let (_a, a) = serve(dir.path(), &schema.scoped);
    let (_b, b) = serve(dir.path(), &schema.scoped);
    let _agents: Vec<Process> = (0..AGENTS)
        .map(|i| {
            common::agent(
                dir.path(),
                &a,
                ADMIN,
                &format!("r{i}"),
                "self-hosted,linux",
                &[],
            )
        })
        .collect();
    let polling = || metric(&a, "runway_runners_polling{pool=\"default\"}");
    let woken = || metric(&a, "runway_runners_woken_total{pool=\"default\"}");
    wait_until("every agent to poll the first replica", 60, || {
        polling() == AGENTS as f64
    });
    // Whatever woke them before (a listener's first session wakes all).
    let before = woken();
    for i in 0..JOBS {
        let id = common::submit(&b, ADMIN, &format!("echo {i}"));
        wait_until("the job to complete", 60, || {
            common::job(&b, ADMIN, id)["state"] == "completed"
        });
        wait_until("every agent to poll again", 60, || {
            polling() == AGENTS as f64
        });
    }
    assert_eq!(
        woken() - before,
        JOBS as f64,
        "one runner woken a job{}",
        common::agent_logs(dir.path())
    );
}

/// A leader that is paused (SIGSTOP), not dead, keeps its database session
/// open: it loses the lead anyway once it has been silent for
/// `SILENT_ROUNDS` checks, another replica leads in the next term, and when
/// the old one resumes (SIGCONT) it finds its term over and steps down.
#[test]
fn a_paused_leader_is_replaced_and_steps_down_when_it_resumes() {
    let schema = PgSchema::create("runway_paused");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("runway.toml"),
        "[server]\nlisten = \"127.0.0.1:0\"\ndatabase_max_connections = 4\nadmin_tokens = [\"replicas-admin-token\"]\n\
         [scaling]\ninterval = \"200ms\"\n\
         [[providers]]\nname = \"cloud\"\nkind = \"sim\"\nboot_seconds = 0\n\
         [[pools]]\nname = \"warm\"\nlabels = [\"self-hosted\", \"linux\"]\n\
         min_idle = 1\nmax_runners = 2\nproviders = [\"cloud\"]\n",
    )
    .unwrap();
    let (first, a) = serve(dir.path(), &schema.scoped);
    wait_until("the first replica to lead", 30, || {
        metric(&a, "runway_leader") == 1.0
    });
    let (_second, b) = serve(dir.path(), &schema.scoped);
    wait_until("both replicas in the cluster view", 30, || {
        cluster(&b)["replicas"].as_array().map(Vec::len) == Some(2)
    });
    let first_term = cluster(&b)["leader"]["term"].as_i64().expect("a term");

    let signal = |name: &str| {
        let status = std::process::Command::new("kill")
            .args([&format!("-{name}"), &first.0.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{name}");
    };
    signal("STOP");
    // Checks every 1 s (the 200 ms interval, clamped), silent for 5 of
    // them: the lock is freed after ~5 s, taken within ~1 s more.
    wait_until("the second replica to take the lead", 30, || {
        metric(&b, "runway_leader") == 1.0
    });
    let view = cluster(&b);
    assert_eq!(
        view["leader"]["term"].as_i64(),
        Some(first_term + 1),
        "{view}"
    );
    assert_eq!(view["leader"]["replica"], view["replica"], "{view}");

    signal("CONT");
    wait_until("the resumed replica to step down", 30, || {
        metric(&a, "runway_leader") == 0.0
    });
    assert_eq!(metric(&b, "runway_leader"), 1.0, "one leader");
    assert_eq!(
        cluster(&a)["leader"]["term"].as_i64(),
        Some(first_term + 1),
        "no term was begun by the old leader"
    );
}

/// Three replicas behind a load balancer, one PostgreSQL: webhooks and
/// runner calls go to all three; the leader is killed (SIGKILL) mid-run.
/// A new leader acts within 15 s (it keeps the warm pool warm), every job
/// runs and completes exactly once, no job's lease expires twice, and a
/// webhook delivered to two replicas is one job.
#[test]
fn three_replicas_lose_their_leader_and_no_job_runs_twice() {
    const ADMIN: &str = "replicas-admin-token";
    const SECRET: &str = "replicas-webhook-secret";
    let schema = PgSchema::create("runway_three");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("runway.toml"),
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\ndatabase_max_connections = 4\nadmin_tokens = [\"{ADMIN}\"]\n\
             [github]\nwebhook_secrets = [\"{SECRET}\"]\n\
             [runner_api]\npoll_timeout = \"2s\"\nlease = \"10s\"\n\
             [scaling]\ninterval = \"200ms\"\n\
             [[providers]]\nname = \"cloud\"\nkind = \"sim\"\nboot_seconds = 0\n\
             [[pools]]\nname = \"default\"\nlabels = [\"self-hosted\", \"linux\"]\n\
             [[pools]]\nname = \"warm\"\nlabels = [\"warm\"]\nmin_idle = 1\nmax_runners = 2\n\
             providers = [\"cloud\"]\n\
             [[pools]]\nname = \"gh\"\nlabels = [\"self-hosted\", \"gh\"]\n"
        ),
    )
    .unwrap();
    let (leader, a) = serve(dir.path(), &schema.scoped);
    wait_until("the first replica to lead", 30, || {
        metric(&a, "runway_leader") == 1.0
    });
    let (_b_process, b) = serve(dir.path(), &schema.scoped);
    let (_c_process, c) = serve(dir.path(), &schema.scoped);
    let replicas = [a.clone(), b.clone(), c.clone()];
    let balancer = common::Balancer::start(
        replicas
            .iter()
            .map(|url| url.trim_start_matches("http://").to_owned())
            .collect(),
    );
    let _agents: Vec<Process> = (0..3)
        .map(|i| {
            common::agent(
                dir.path(),
                &balancer.url,
                ADMIN,
                &format!("agent-{i}"),
                "self-hosted,linux",
                &[],
            )
        })
        .collect();

    // Jobs and webhooks, spread over the three replicas directly.
    let ran = dir.path().join("ran.log");
    let ids: Vec<i64> = (0..30)
        .map(|i| {
            let script = format!("echo {i} >> {}; sleep 0.1", ran.display());
            common::submit(&replicas[i % 3], ADMIN, &script)
        })
        .collect();
    let webhook = |base: &str, job: u64| {
        let body = serde_json::json!({
            "action": "queued",
            "workflow_job": {"id": job, "labels": ["self-hosted", "gh"], "run_id": 1},
            "repository": {"full_name": "org/repo"},
        })
        .to_string()
        .into_bytes();
        let signature = runway_server::github::signature::sign(SECRET.as_bytes(), &body);
        common::client()
            .post(format!("{base}/webhooks/github"))
            .header("x-github-event", "workflow_job")
            .header("x-github-delivery", format!("delivery-{job}"))
            .header("x-hub-signature-256", signature)
            .body(body)
            .send()
            .map(|r| r.status().as_u16())
            .unwrap_or(0)
    };
    for job in 0..15u64 {
        // Each delivered twice, to two different replicas.
        for base in [
            &replicas[job as usize % 3],
            &replicas[(job as usize + 1) % 3],
        ] {
            let status = webhook(base, 7_000 + job);
            assert!((200..300).contains(&status), "webhook {job}: {status}");
        }
    }

    wait_for_lines("some jobs to run", &ran, 5, 60);
    drop(leader); // SIGKILL, mid-run.
    let survivors = [b.clone(), c.clone()];
    let started = std::time::Instant::now();
    wait_until("a new leader", 15, || {
        survivors.iter().any(|s| metric(s, "runway_leader") == 1.0)
    });
    let new_leader = survivors
        .iter()
        .find(|s| metric(s, "runway_leader") == 1.0)
        .cloned()
        .expect("a leader");
    // It acts: its own sim knows none of the dead leader's machines, so it
    // starts a warm runner of its own.
    wait_until("the new leader to act", 15, || {
        metric(&new_leader, "runway_runners_created_total") >= 1.0
    });
    eprintln!("a new leader acted {:?} after the kill", started.elapsed());

    wait_until("every job to complete", 120, || {
        ids.iter()
            .all(|id| common::job(&b, ADMIN, *id)["state"] == "completed")
    });
    let text = std::fs::read_to_string(&ran).unwrap();
    for i in 0..30 {
        let runs = text.lines().filter(|l| *l == i.to_string()).count();
        assert_eq!(runs, 1, "job {i} ran {runs} times");
    }
    for id in &ids {
        let job = common::job(&b, ADMIN, *id);
        assert_eq!(job["conclusion"], "success", "{job}");
        assert!(
            job["attempts"].as_u64().unwrap_or(0) <= 1,
            "one lease expiry at most: {job}"
        );
    }
    let github_jobs: Vec<serde_json::Value> = common::client()
        .get(format!("{b}/api/v1/jobs?pool=gh&limit=100"))
        .bearer_auth(ADMIN)
        .send()
        .and_then(|r| r.json::<serde_json::Value>())
        .expect("jobs")["jobs"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut external: Vec<String> = github_jobs
        .iter()
        .filter_map(|j| j["external_id"].as_str().map(str::to_owned))
        .collect();
    external.sort();
    let expected: Vec<String> = (0..15u64).map(|j| (7_000 + j).to_string()).collect();
    assert_eq!(external, expected, "each webhook one job, delivered twice");
}
