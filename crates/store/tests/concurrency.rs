//! Concurrent claimers over one queue: every job is claimed exactly once and
//! each claimer only ever sees jobs bound to itself.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::{api_job, at, Harness};
use runway_core::{JobId, JobState, RunnerId};
use runway_store::{Claim, JobFilter, Store};

const JOBS: usize = 10_000;

async fn claim_everything_exactly_once(store: Arc<dyn Store>, claimers: i64) {
    let jobs: Vec<_> = (0..JOBS)
        .map(|i| api_job(&format!("job-{i}"), "default"))
        .collect();
    for chunk in jobs.chunks(1_000) {
        store.enqueue_many(chunk, at(0)).await.expect("enqueue");
    }
    let mut tasks = Vec::new();
    for runner in 1..=claimers {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            // Batch sizes vary so single and multi-job claims interleave.
            let mut limit = 1 + (runner as u32 % 4);
            loop {
                let claim = Claim {
                    pool: "default".into(),
                    runner: RunnerId(runner),
                    limit,
                    lease: Duration::from_secs(600),
                    runner_labels: None,
                    max_running_per_key: None,
                };
                let claimed = store.claim(&claim, at(1)).await.expect("claim");
                if claimed.is_empty() {
                    return mine;
                }
                for job in claimed {
                    assert_eq!(
                        job.runner,
                        Some(RunnerId(runner)),
                        "claimer saw another's job"
                    );
                    assert_eq!(job.state, JobState::Provisioning);
                    mine.push(job.id);
                }
                limit = limit % 7 + 1;
            }
        }));
    }
    let mut seen: HashSet<JobId> = HashSet::new();
    let mut per_claimer = Vec::new();
    for task in tasks {
        let mine = task.await.expect("claimer task");
        per_claimer.push(mine.len());
        for id in mine {
            assert!(seen.insert(id), "job {id} was claimed twice");
        }
    }
    assert_eq!(seen.len(), JOBS, "every job is claimed");
    assert!(
        per_claimer.iter().filter(|&&n| n > 0).count() > 1,
        "claims were spread over several claimers: {per_claimer:?}"
    );
    // The store agrees: nothing left queued, each job bound to the claimer that got it.
    let queued = store
        .list_jobs(&JobFilter {
            state: Some(JobState::Queued),
            ..JobFilter::default()
        })
        .await
        .unwrap();
    assert!(queued.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_postgres_claimers_take_each_job_once() {
    let harness = Harness::postgres().await;
    claim_everything_exactly_once(harness.store.clone(), 8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_sqlite_claimers_take_each_job_once() {
    let harness = Harness::sqlite().await;
    claim_everything_exactly_once(harness.store.clone(), 4).await;
}
