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
//! A second workload moves jobs *and their runners*: accepts (the runner
//! becomes busy with the job), completions (the runner is free again) and
//! lease sweeps (a running job's runner crashes), each one store operation —
//! half the starts and completions through the one-write hot path
//! (`claim_and_start`, `apply_guarded_with_runner` with the log).
//! After every kill, besides the checks above: every runner keeps its
//! invariants, and a job and its runner agree — a running job's runner is
//! busy with it, a busy runner's job is running on it. Two separate writes
//! would leave them disagreeing after a kill between them.
//!
//! The child is this same test binary, re-executed to run
//! [`crash_child_entry_point`] with `RUNWAY_CRASH_CHILD` set; it reports each
//! acknowledged operation on stdout only after the store returned.

use crate::common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{api_job, at, Harness};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use runway_core::job::NewJob;
use runway_core::runner::NewRunner;
use runway_core::{
    Conclusion, Job, JobEvent, JobId, JobSource, JobState, Runner, RunnerEvent, RunnerId,
    RunnerState, Timestamp,
};
use runway_store::{
    Claim, ClaimStart, JobFilter, OpenOptions, PostgresStore, RunnerFilter, SqliteStore, Store,
    StoreError,
};
use sqlx::Connection;

const KILLS: u64 = 30;
/// The most lives a workload gets to do enough acknowledged work.
const MAX_KILLS: u64 = 150;
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
    match std::env::var("RUNWAY_CRASH_WORKLOAD").as_deref() {
        Ok("moves") => runtime.block_on(moves_workload(&target, life)),
        _ => runtime.block_on(child_workload(&target, life)),
    }
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
                    max_running_per_key: None,
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

/// A ready runner of this life, created through the store as the
/// reconciler creates one.
async fn ready_runner(store: &Arc<dyn Store>, name: String, now: i64) -> Runner {
    let new = NewRunner {
        name,
        pool: "default".into(),
        provider: "sim".into(),
        labels: vec![],
        stock: false,
    };
    let runner = store
        .create_runner(&new, at(now))
        .await
        .expect("create runner");
    store
        .apply_runner_event(runner.id, &RunnerEvent::Ready, at(now))
        .await
        .expect("runner ready")
}

fn start_on(
    _: &Job,
    after: &Job,
    runner: &Runner,
    now: Timestamp,
) -> Result<Option<Runner>, StoreError> {
    runway_core::moves::start(after, runner, now)
        .map(Some)
        .map_err(StoreError::from)
}

fn finish_on(
    _: &Job,
    after: &Job,
    runner: &Runner,
    now: Timestamp,
) -> Result<Option<Runner>, StoreError> {
    Ok(runway_core::moves::finish(after, runner, false, now))
}

/// Claims, accepts, completes and sweeps leases through the atomic moves,
/// with time jumping past the lease now and then so sweeps crash runners.
async fn moves_workload(target: &str, life: i64) {
    let store = open_target(target, life).await;
    let mut rng = StdRng::seed_from_u64(life as u64 ^ 0x6d6f766573);
    let mut now = life * MILLIS_PER_LIFE;
    let mut counter = 0u64;
    let mut runners: Vec<RunnerId> = Vec::new();
    for i in 0..3 {
        runners.push(
            ready_runner(&store, format!("life{life}-r{i}"), now)
                .await
                .id,
        );
    }
    report("ready".into());
    loop {
        now += 1;
        let slot = rng.gen_range(0..runners.len());
        match rng.gen_range(0..10) {
            0..=2 => {
                counter += 1;
                let external_id = format!("life{life}-job{counter}");
                let job = NewJob {
                    max_attempts: 1_000,
                    ..api_job(&external_id, "default")
                };
                store.enqueue(&job, at(now)).await.expect("enqueue");
                report(format!("enqueued {external_id}"));
            }
            3..=5 => {
                let id = runners[slot];
                let runner = store.get_runner(id).await.expect("read").expect("runner");
                if runner.state != RunnerState::Idle {
                    continue;
                }
                let claim = Claim {
                    pool: "default".into(),
                    runner: id,
                    limit: 1,
                    lease: LEASE,
                    runner_labels: None,
                    max_running_per_key: None,
                };
                if rng.gen_bool(0.5) {
                    // The one-step start: the claim starts the job and
                    // makes the runner busy in one write.
                    match store.claim_and_start(&claim, &runner, at(now)).await {
                        Ok(ClaimStart::Started(moved)) => {
                            report(format!("started {}", moved.job.id))
                        }
                        Ok(ClaimStart::NoJob | ClaimStart::RunnerChanged(_)) => {}
                        Err(other) => panic!("claim and start: {other}"),
                    }
                    continue;
                }
                for job in store.claim(&claim, at(now)).await.expect("claim") {
                    let accept = JobEvent::Accept { runner: id };
                    match store
                        .move_job_and_runner(job.id, &accept, Some(id), &start_on, at(now))
                        .await
                    {
                        Ok(_) => report(format!("started {}", job.id)),
                        Err(StoreError::RunnerTransition(_)) => {}
                        Err(other) => panic!("accept: {other}"),
                    }
                }
            }
            6..=7 => {
                let id = runners[slot];
                let runner = store.get_runner(id).await.expect("read").expect("runner");
                let (RunnerState::Busy, Some(job)) = (runner.state, runner.job) else {
                    continue;
                };
                let complete = JobEvent::Complete {
                    runner: id,
                    conclusion: Conclusion::Success,
                };
                // The hot path half the time: the job, its runner and the
                // log in one write, the general move if its guard fails.
                let hot = match (
                    rng.gen_bool(0.5),
                    complete.guarded(at(now)),
                    runway_core::moves::finish_by_id(job, &runner, false, at(now)),
                ) {
                    (true, Some(change), Some(free)) => store
                        .apply_guarded_with_runner(
                            job,
                            &change,
                            (&runner, &free),
                            Some((Some(0), "ok")),
                        )
                        .await
                        .expect("complete in one write")
                        .is_some(),
                    _ => false,
                };
                if !hot {
                    store
                        .move_job_and_runner(job, &complete, Some(id), &finish_on, at(now))
                        .await
                        .expect("complete");
                }
                report(format!("completed {job}"));
            }
            _ => {
                // Past every lease: the sweep requeues running jobs and
                // crashes their runners, which are then replaced.
                now += LEASE.as_millis() as i64 + 1;
                store.expire_leases(at(now)).await.expect("sweep");
                for (i, slot) in runners.iter_mut().enumerate() {
                    let runner = store
                        .get_runner(*slot)
                        .await
                        .expect("read")
                        .expect("runner");
                    if runner.state.is_terminal() {
                        counter += 1;
                        *slot = ready_runner(&store, format!("life{life}-r{i}-{counter}"), now)
                            .await
                            .id;
                    }
                }
            }
        }
    }
}

/// Runs one child life and kills it after `delay`; returns the lines it
/// completed before dying.
fn run_and_kill(target: &str, workload: Workload, life: u64, delay: Duration) -> Vec<String> {
    let mut child = Command::new(std::env::current_exe().expect("test binary path"))
        .args([
            "crash::crash_child_entry_point",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("RUNWAY_CRASH_CHILD", target)
        .env("RUNWAY_CRASH_LIFE", life.to_string())
        .env("RUNWAY_CRASH_WORKLOAD", workload.name())
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

async fn check_after_kill(
    store: &Arc<dyn Store>,
    workload: Workload,
    lines: &[String],
    life: u64,
) -> (usize, usize) {
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
    check_invariants(store, workload, life, "after the kill").await;
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
    check_invariants(store, workload, life, "after the sweep").await;
    (enqueued, completed)
}

/// Every job keeps its invariants; in the moves workload, every runner too,
/// and each job agrees with its runner. (The queue workload claims for
/// runner ids that have no record.)
async fn check_invariants(store: &Arc<dyn Store>, workload: Workload, life: u64, when: &str) {
    match workload {
        Workload::Queue => {
            for job in store.list_jobs(&JobFilter::default()).await.expect("list") {
                let problems = job.invariant_violations();
                assert!(problems.is_empty(), "life {life} {when}: {problems:?}");
            }
        }
        Workload::Moves => assert_jobs_and_runners_agree(store, life, when).await,
    }
}

/// Every job and every runner keeps its invariants, and each job and its
/// runner agree: a running job's runner is busy with it, and a busy
/// runner's named job is running on it.
async fn assert_jobs_and_runners_agree(store: &Arc<dyn Store>, life: u64, when: &str) {
    let jobs = store
        .list_jobs(&JobFilter::default())
        .await
        .expect("list jobs");
    let runners = store
        .list_runners(&RunnerFilter::default())
        .await
        .expect("list runners");
    for runner in &runners {
        let problems = runner.invariant_violations();
        assert!(problems.is_empty(), "life {life} {when}: {problems:?}");
    }
    let runner_of = |id: RunnerId| runners.iter().find(|r| r.id == id);
    for job in &jobs {
        let problems = job.invariant_violations();
        assert!(problems.is_empty(), "life {life} {when}: {problems:?}");
        if job.state == JobState::Running {
            let runner = job.runner.and_then(runner_of);
            assert!(
                matches!(runner, Some(r) if r.state == RunnerState::Busy && r.job == Some(job.id)),
                "life {life} {when}: job {} runs on {:?}, whose record is {runner:?}",
                job.id,
                job.runner
            );
        }
    }
    for runner in &runners {
        if let (RunnerState::Busy, Some(id)) = (runner.state, runner.job) {
            let job = jobs.iter().find(|j| j.id == id);
            assert!(
                matches!(job, Some(j) if j.state == JobState::Running && j.runner == Some(runner.id)),
                "life {life} {when}: runner {} is busy with job {id}, which is {job:?}",
                runner.id
            );
        }
    }
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

#[derive(Debug, Clone, Copy)]
enum Workload {
    /// Enqueue, claim, accept, decline, complete, keepalive: jobs only.
    Queue,
    /// Accept, complete and sweep moving jobs with their runners.
    Moves,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Queue => "queue",
            Workload::Moves => "moves",
        }
    }
}

async fn survive_random_kills(harness: &Harness, target: &str, workload: Workload) {
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let mut acknowledged = (0, 0);
    let started = Instant::now();
    // At least KILLS lives, and more (up to MAX_KILLS) until the children
    // did enough acknowledged work to make the check mean something: on a
    // machine whose disk flushes slowly a life gets less done.
    let enough = |acknowledged: (usize, usize)| acknowledged.0 > 100 && acknowledged.1 > 10;
    let mut lives = 0;
    for life in 0..MAX_KILLS {
        if life >= KILLS && enough(acknowledged) {
            break;
        }
        lives += 1;
        // Some kills land while the child is still opening the store (and
        // creating its runners, in the moves workload).
        let delay = match workload {
            Workload::Queue => Duration::from_millis(rng.gen_range(5..250)),
            Workload::Moves => Duration::from_millis(rng.gen_range(20..500)),
        };
        let lines = run_and_kill(target, workload, life, delay);
        if target.starts_with("postgres-schema:") {
            wait_for_postgres_backends_to_exit(life).await;
        }
        let (enqueued, completed) = check_after_kill(&harness.store, workload, &lines, life).await;
        acknowledged.0 += enqueued;
        acknowledged.1 += completed;
    }
    eprintln!(
        "{} workload, {lives} kills in {:?}: {} acknowledged enqueues and {} completions all survived",
        workload.name(),
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

/// What a child life opens: the SQLite file, or the PostgreSQL schema.
fn child_target(harness: &Harness) -> String {
    match harness.postgres_schema() {
        Some(schema) => format!("postgres-schema:{schema}"),
        None => harness.url.clone(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_survives_sigkill_at_random_moments() {
    let harness = Harness::sqlite().await;
    survive_random_kills(&harness, &child_target(&harness), Workload::Queue).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_survives_sigkill_at_random_moments() {
    let harness = Harness::postgres().await;
    survive_random_kills(&harness, &child_target(&harness), Workload::Queue).await;
}

/// Accept, complete and sweep, killed at random: jobs and runners agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_job_and_runner_moves_survive_sigkill() {
    let harness = Harness::sqlite().await;
    survive_random_kills(&harness, &child_target(&harness), Workload::Moves).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_job_and_runner_moves_survive_sigkill() {
    let harness = Harness::postgres().await;
    survive_random_kills(&harness, &child_target(&harness), Workload::Moves).await;
}
