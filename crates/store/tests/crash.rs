//! Crash safety: a child process enqueues, claims, accepts, declines and
//! completes jobs as fast as it can and is killed with SIGKILL at a random
//! moment, 30 times per backend against the same database. After every kill:
//!
//! - every enqueue the child saw return `Ok` is stored;
//! - every completion the child saw return `Ok` is stored;
//! - no job breaks the state machine's invariants;
//! - once the lease deadline has passed, every claimed but unfinished job is
//!   back in the queue.
//!
//! The child is this same test binary, re-executed to run
//! [`crash_child_entry_point`] with `RUNWAY_CRASH_CHILD` set; it reports each
//! acknowledged operation on stdout only after the store returned.

mod common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{api_job, at, Harness};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use runway_core::job::NewJob;
use runway_core::{Conclusion, JobId, JobSource, JobState, RunnerId, Timestamp};
use runway_store::{Claim, JobFilter, OpenOptions, PostgresStore, SqliteStore, Store};
use sqlx::Connection;

const KILLS: u64 = 30;
const LEASE: Duration = Duration::from_secs(60);
/// Each child life gets its own span of virtual time, so leases granted in
/// one life are certainly expired when the parent checks after it.
const MILLIS_PER_LIFE: i64 = 1_000_000_000;

/// Not a test of its own: the body of the child process. Without
/// `RUNWAY_CRASH_CHILD` it returns at once.
#[test]
fn crash_child_entry_point() {
    let Ok(target) = std::env::var("RUNWAY_CRASH_CHILD") else {
        return;
    };
    let life: i64 = std::env::var("RUNWAY_CRASH_LIFE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(child_workload(&target, life));
}

/// The PostgreSQL URL a child life connects with: tagged with the life so
/// the parent can wait until the server has noticed the child's death.
fn child_postgres_url(life: i64) -> String {
    let url = common::postgres_url();
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}application_name=runway-crash-child-{life}")
}

async fn open_target(target: &str, life: i64) -> Arc<dyn Store> {
    match target.strip_prefix("postgres-schema:") {
        Some(schema) => Arc::new(
            PostgresStore::open(
                &child_postgres_url(life),
                Some(schema),
                &OpenOptions::default(),
            )
            .await
            .expect("open PostgreSQL"),
        ),
        None => Arc::new(SqliteStore::open(target).await.expect("open SQLite")),
    }
}

fn report(line: String) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

async fn child_workload(target: &str, life: i64) {
    let store = open_target(target, life).await;
    let mut rng = StdRng::seed_from_u64(life as u64);
    let runner = RunnerId(life + 1);
    let mut now = life * MILLIS_PER_LIFE;
    let mut counter = 0u64;
    report("ready".into());
    loop {
        now += 1;
        match rng.gen_range(0..10) {
            0..=3 => {
                counter += 1;
                let external_id = format!("life{life}-job{counter}");
                let job = NewJob {
                    max_attempts: 1_000,
                    ..api_job(&external_id, "default")
                };
                store.enqueue(&job, at(now)).await.expect("enqueue");
                report(format!("enqueued {external_id}"));
            }
            4 => {
                let batch: Vec<NewJob> = (0..5)
                    .map(|i| NewJob {
                        max_attempts: 1_000,
                        ..api_job(&format!("life{life}-batch{counter}-{i}"), "default")
                    })
                    .collect();
                counter += 1;
                store
                    .enqueue_many(&batch, at(now))
                    .await
                    .expect("enqueue_many");
                for job in batch {
                    report(format!("enqueued {}", job.external_id));
                }
            }
            _ => {
                let claim = Claim {
                    pool: "default".into(),
                    runner,
                    limit: rng.gen_range(1..4),
                    lease: LEASE,
                    runner_labels: None,
                };
                for job in store.claim(&claim, at(now)).await.expect("claim") {
                    report(format!("claimed {}", job.id));
                    match rng.gen_range(0..4) {
                        0 => {
                            store
                                .decline(job.id, runner, at(now))
                                .await
                                .expect("decline");
                        }
                        1 => {
                            store.accept(job.id, runner, at(now)).await.expect("accept");
                            store
                                .complete(job.id, runner, Conclusion::Success, at(now))
                                .await
                                .expect("complete");
                            report(format!("completed {}", job.id));
                        }
                        2 => {
                            store.accept(job.id, runner, at(now)).await.expect("accept");
                        }
                        _ => {
                            store
                                .keepalive(job.id, runner, LEASE, at(now))
                                .await
                                .expect("keepalive");
                        }
                    }
                }
            }
        }
    }
}

/// Runs one child life and kills it after `delay`; returns the lines it
/// completed before dying.
fn run_and_kill(target: &str, life: u64, delay: Duration) -> Vec<String> {
    let mut child = Command::new(std::env::current_exe().expect("test binary path"))
        .args([
            "crash_child_entry_point",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("RUNWAY_CRASH_CHILD", target)
        .env("RUNWAY_CRASH_LIFE", life.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn child");
    let mut stdout = child.stdout.take().expect("child stdout");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stdout.read_to_string(&mut text);
        text
    });
    std::thread::sleep(delay);
    child.kill().expect("SIGKILL the child"); // Child::kill sends SIGKILL on Unix.
    let status = child.wait().expect("reap child");
    assert!(
        !status.success(),
        "the child must have been killed, not finished: {status}"
    );
    let text = reader.join().expect("reader thread");
    // A line cut by the kill has no newline and is not an acknowledgement.
    let complete = match text.rfind('\n') {
        Some(end) => &text[..end],
        None => "",
    };
    complete.lines().map(str::to_owned).collect()
}

async fn check_after_kill(store: &Arc<dyn Store>, lines: &[String], life: u64) -> (usize, usize) {
    let mut enqueued = 0;
    let mut completed = 0;
    for line in lines {
        if let Some(external_id) = line.strip_prefix("enqueued ") {
            let job = store
                .find_job(JobSource::Api, external_id)
                .await
                .expect("read");
            assert!(
                job.is_some(),
                "life {life}: acknowledged enqueue {external_id} was lost"
            );
            enqueued += 1;
        } else if let Some(id) = line.strip_prefix("completed ") {
            let id = JobId(id.parse().expect("job id"));
            let job = store
                .get_job(id)
                .await
                .expect("read")
                .expect("completed job exists");
            assert_eq!(
                job.state,
                JobState::Completed,
                "life {life}: acknowledged completion of {id} was lost"
            );
            completed += 1;
        }
    }
    let all = store.list_jobs(&JobFilter::default()).await.expect("list");
    for job in &all {
        let problems = job.invariant_violations();
        assert!(problems.is_empty(), "life {life}: {problems:?}");
    }
    // Past every lease granted so far, nothing may stay bound to a dead runner.
    let after_deadline = Timestamp::from_millis((life as i64 + 1) * MILLIS_PER_LIFE - 1);
    store
        .expire_leases(after_deadline)
        .await
        .expect("expire leases");
    for job in store.list_jobs(&JobFilter::default()).await.expect("list") {
        assert!(
            job.state == JobState::Queued || job.state.is_terminal(),
            "life {life}: job {} is still {} after its lease deadline",
            job.id,
            job.state
        );
    }
    (enqueued, completed)
}

/// A statement the child sent just before SIGKILL may still be running in
/// its server backend, and commit after we look. Wait until the server has
/// closed every connection of that life, as a later sweep would in production.
async fn wait_for_postgres_backends_to_exit(life: u64) {
    let mut admin = sqlx::postgres::PgConnection::connect(&common::postgres_url())
        .await
        .expect("connect");
    let name = format!("runway-crash-child-{life}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let alive: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM pg_stat_activity WHERE application_name = $1")
                .bind(&name)
                .fetch_one(&mut admin)
                .await
                .expect("pg_stat_activity");
        if alive == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "backends of {name} still alive after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn survive_random_kills(harness: &Harness, target: &str) {
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let mut acknowledged = (0, 0);
    let started = Instant::now();
    for life in 0..KILLS {
        // Some kills land while the child is still opening the store.
        let delay = Duration::from_millis(rng.gen_range(5..250));
        let lines = run_and_kill(target, life, delay);
        if target.starts_with("postgres-schema:") {
            wait_for_postgres_backends_to_exit(life).await;
        }
        let (enqueued, completed) = check_after_kill(&harness.store, &lines, life).await;
        acknowledged.0 += enqueued;
        acknowledged.1 += completed;
    }
    eprintln!(
        "{KILLS} kills in {:?}: {} acknowledged enqueues and {} completions all survived",
        started.elapsed(),
        acknowledged.0,
        acknowledged.1
    );
    assert!(
        acknowledged.0 > 100,
        "the child did real work before its kills: {acknowledged:?}"
    );
    assert!(
        acknowledged.1 > 10,
        "the child completed jobs before its kills: {acknowledged:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_survives_sigkill_at_random_moments() {
    let harness = Harness::sqlite().await;
    let target = harness.url.clone();
    survive_random_kills(&harness, &target).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_survives_sigkill_at_random_moments() {
    let harness = Harness::postgres().await;
    let target = format!(
        "postgres-schema:{}",
        harness.postgres_schema().expect("schema")
    );
    survive_random_kills(&harness, &target).await;
}
