//! What the PostgreSQL hot path costs in round trips to the server, counted
//! on the wire by a proxy (`common::RoundTrips`), so a change that adds one
//! (a read before a write, a ping before every statement) fails here, not
//! only in a benchmark: an enqueue (with or without its webhook delivery), a
//! claim that starts its job, a claim that finds nothing, a completion with its runner and log, and a completion that
//! starts the runner's next job are one round trip each — a job handed out
//! in one step costs two, a runner working through a queue one — and so are
//! the reads of a runner by its token or id and of a job by its id.

use crate::common;

use std::time::Duration;

use common::{api_job, at, Harness, RoundTrips, Trips};
use runway_core::runner::NewRunner;
use runway_core::{moves, Conclusion, Job, JobEvent, Runner, RunnerEvent};
use runway_store::{Claim, ClaimStart, Store};

fn claim(runner: &Runner) -> Claim {
    Claim::of_pool(runner.pool.clone(), runner.id, 1, Duration::from_secs(120))
}

fn success(runner: &Runner) -> runway_core::GuardedChange {
    JobEvent::Complete {
        runner: runner.id,
        conclusion: Conclusion::Success,
    }
    .guarded(at(5))
    .expect("a completion has a guarded form")
}

async fn idle_runner(store: &dyn Store, name: &str) -> Runner {
    let new = NewRunner {
        name: name.to_owned(),
        pool: "p".to_owned(),
        provider: "test".to_owned(),
        labels: vec![],
        stock: false,
    };
    let runner = store.create_runner(&new, at(1)).await.expect("runner");
    store
        .apply_runner_event(runner.id, &RunnerEvent::Ready, at(1))
        .await
        .expect("ready")
}

/// The trips `step` makes through `proxy`.
async fn trips<T>(proxy: &RoundTrips, step: impl std::future::Future<Output = T>) -> (T, Trips) {
    let before = proxy.trips();
    let out = step.await;
    (out, proxy.trips() - before)
}

const ONE: Trips = Trips {
    statements: 1,
    pings: 0,
};

/// A job claimed and started for `runner` (one must be queued for it):
/// the job, the runner busy with it, and the trips of the write.
async fn start(proxy: &RoundTrips, store: &dyn Store, runner: &Runner) -> (Job, Runner, Trips) {
    let (started, cost) = trips(proxy, store.claim_and_start(&claim(runner), runner, at(3))).await;
    let ClaimStart::Started(moved) = started.expect("claim and start") else {
        panic!("a job is queued for an idle runner");
    };
    (moved.job, moved.runner.expect("the runner moved"), cost)
}

/// One job through `runner` in one step (claim and start, then the
/// completion), returning the runner freed and the trips of each write.
async fn one_step(proxy: &RoundTrips, store: &dyn Store, runner: Runner) -> (Runner, [Trips; 2]) {
    let (job, busy, start) = start(proxy, store, &runner).await;
    let free = moves::finish(&job, &busy, false, at(5)).expect("busy with it");
    let (completed, complete) = trips(
        proxy,
        store.apply_guarded_with_runner(
            job.id,
            &success(&busy),
            (&busy, &free),
            Some((Some(0), "ok")),
        ),
    )
    .await;
    completed.expect("complete").expect("the holder completes");
    (free, [start, complete])
}

/// `job` completed on `busy` with the runner's next job started in the
/// same write: the runner after, its next job if one was queued, the trips.
async fn complete_next(
    proxy: &RoundTrips,
    store: &dyn Store,
    job: &Job,
    busy: &Runner,
) -> (Runner, Option<Job>, Trips) {
    let free = moves::finish(job, busy, false, at(5)).expect("busy with it");
    let (done, cost) = trips(
        proxy,
        store.complete_and_start_next(
            job.id,
            &success(busy),
            (busy, &free),
            Some((Some(0), "ok")),
            &claim(busy),
            at(5),
        ),
    )
    .await;
    let (ended, next) = done.expect("complete").expect("the holder completes");
    (ended.runner.expect("the runner moved"), next, cost)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hot_path_is_one_round_trip_a_write() {
    let proxy = RoundTrips::start().await;
    let harness = Harness::postgres_through(&proxy.url).await;
    let store = &*harness.store;
    let mut runner = idle_runner(store, "r1").await;

    // Each statement's first use prepares it (a round trip of its own);
    // the counts below are of statements already prepared, as in steady use.
    for i in 0..2 {
        store
            .enqueue(&api_job(&format!("warm-{i}"), "p"), at(2))
            .await
            .expect("enqueue");
    }
    runner = one_step(&proxy, store, runner).await.0;
    let (job, busy, _) = start(&proxy, store, &runner).await;
    let (free, next, _) = complete_next(&proxy, store, &job, &busy).await;
    assert!(next.is_none(), "two jobs were queued for the warm-up");
    runner = free;
    let (claimed, nothing) = trips(
        &proxy,
        store.claim_and_start(&claim(&runner), &runner, at(6)),
    )
    .await;
    assert!(matches!(claimed.expect("claim"), ClaimStart::NoJob));

    // Measured: twenty enqueues, ten jobs handed out in one step, ten chained.
    let mut enqueues = Vec::new();
    for i in 0..20 {
        let (enqueued, cost) = trips(
            &proxy,
            store.enqueue(&api_job(&format!("j{i}"), "p"), at(7)),
        )
        .await;
        assert!(enqueued.expect("enqueue").created);
        enqueues.push(cost);
    }
    // A webhook's job with its delivery (warmed by the first).
    let mut deliveries = Vec::new();
    for i in 0..6 {
        let delivery = runway_store::Delivery {
            id: format!("delivery-{i}"),
            event: "workflow_job".to_owned(),
            action: Some("queued".to_owned()),
            external_id: Some(format!("hook-{i}")),
            outcome: "queued".to_owned(),
            received_at: at(7),
        };
        let (stored, cost) = trips(
            &proxy,
            store.enqueue_with_delivery(
                &api_job(&format!("hook-{i}"), "other"),
                Some(&delivery),
                at(7),
            ),
        )
        .await;
        assert_eq!(
            stored.map(|(e, new)| (e.created, new)).expect("enqueue"),
            (true, true)
        );
        if i > 0 {
            deliveries.push(cost);
        }
    }
    let mut one_step_writes = Vec::new();
    for _ in 0..10 {
        let (free, writes) = one_step(&proxy, store, runner).await;
        runner = free;
        one_step_writes.extend(writes);
    }
    let (mut job, mut busy, first) = start(&proxy, store, &runner).await;
    let mut chained = vec![first];
    for left in (0..10).rev() {
        let (free, next, cost) = complete_next(&proxy, store, &job, &busy).await;
        chained.push(cost);
        busy = free;
        match next {
            Some(next) => job = next,
            None => assert_eq!(left, 0, "a job was left queued"),
        }
    }

    // The reads every runner API call and hand-out makes.
    let mut reads = Vec::new();
    for round in 0..6 {
        let (found, cost) = trips(&proxy, store.find_runner_by_token("no-such-token")).await;
        assert!(found.expect("read").is_none());
        reads.push(cost);
        let (found, cost) = trips(&proxy, store.get_runner(runner.id)).await;
        assert!(found.expect("read").is_some());
        reads.push(cost);
        let (found, cost) = trips(&proxy, store.get_job(job.id)).await;
        assert!(found.expect("read").is_some());
        reads.push(cost);
        if round == 0 {
            // The first round prepared the statements.
            reads.clear();
        }
    }

    assert_eq!(nothing, ONE, "a claim that finds no job");
    // A ping is a round trip too, before a statement on a connection idle
    // for over a second; none belongs here, but a stalled test machine may
    // cause one, so each list is checked for its statements and allowed at
    // most a pause or two.
    for (what, costs) in [
        ("an enqueue", &enqueues),
        ("an enqueue with its delivery", &deliveries),
        ("a write of the one-step hand-out", &one_step_writes),
        ("a chained completion", &chained),
        ("a read by token or id", &reads),
    ] {
        assert!(
            costs.iter().all(|cost| cost.statements == 1),
            "{what}: one statement each, got {costs:?}"
        );
        let pings: u64 = costs.iter().map(|cost| cost.pings).sum();
        assert!(
            pings <= 2,
            "{what}: a ping before statements of a connection in steady use: {costs:?}"
        );
    }
}

/// A connection the server dropped while it sat idle in the pool is found
/// dead by a ping before its next statement and replaced: the statement
/// succeeds. (Connections in steady use are not pinged.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_dropped_while_idle_is_replaced_before_a_statement() {
    let proxy = RoundTrips::start().await;
    let harness = Harness::postgres_through(&proxy.url).await;
    let store = &*harness.store;
    store
        .enqueue(&api_job("before", "p"), at(1))
        .await
        .expect("enqueue");
    proxy.sever();
    // Idle long enough that the pool pings before handing a connection out.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let (enqueued, cost) = trips(&proxy, store.enqueue(&api_job("after", "p"), at(2))).await;
    assert!(
        enqueued
            .expect("the enqueue after the drop succeeds")
            .created
    );
    assert!(cost.statements >= 1, "{cost:?}");
}

/// A kept connection idle for over a second is pinged before use; a server
/// that has gone silent does not answer, and the caller gets an error within
/// the acquire timeout instead of waiting for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_fails_a_statement_within_the_acquire_timeout() {
    let proxy = RoundTrips::start().await;
    let options = runway_store::OpenOptions {
        max_connections: 4,
        connect_timeout: Duration::from_secs(1),
    };
    let harness = Harness::postgres_with(&proxy.url, options).await;
    let store = &*harness.store;
    store
        .enqueue(&api_job("before", "p"), at(1))
        .await
        .expect("enqueue");
    proxy.go_silent();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let asked = std::time::Instant::now();
    let answered = tokio::time::timeout(
        Duration::from_secs(30),
        store.enqueue(&api_job("after", "p"), at(2)),
    )
    .await
    .expect("an answer, not a hang");
    assert!(
        answered.is_err(),
        "nothing reached the server: {answered:?}"
    );
    // The kept connection's ping (1 s), then the pool's connection attempt
    // (1 s); generous for a loaded machine, far from "for ever".
    assert!(
        asked.elapsed() < Duration::from_secs(10),
        "{:?}",
        asked.elapsed()
    );
}
