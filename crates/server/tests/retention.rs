//! `[retention]`: a pass prunes old finished history in batches, never
//! live work, and reports what it did and what is left as metrics.

use std::time::Duration;

use runway_core::job::NewJob;
use runway_core::runner::NewRunner;
use runway_core::{JobState, RunnerEvent, Timestamp};
use runway_server::app::retention;
use runway_server::config::Config;

use crate::common;
use common::{pool, Harness};

const DAY: i64 = 24 * 3600 * 1000;

fn job(id: usize) -> NewJob {
    NewJob::api(format!("job-{id}"), "linux", &["linux"])
}

#[tokio::test]
async fn a_pass_prunes_old_history_in_batches_and_never_live_work() {
    let mut config = Config {
        pools: vec![pool("linux", &["linux"])],
        ..Config::default()
    };
    config.retention.batch = 7;
    let h = Harness::new(config).await;
    let store = h.store();
    let t0 = Timestamp::from_millis(1_000 * DAY);
    // 25 jobs finished 40 days ago (more than three batches), 2 finished
    // yesterday, and one queued 40 days ago.
    for i in 0..27 {
        let enqueued = store.enqueue(&job(i), t0).await.unwrap().job;
        let finished = if i < 25 {
            t0
        } else {
            t0.plus(Duration::from_secs(39 * 86_400))
        };
        store.cancel(enqueued.id, "done", finished).await.unwrap();
    }
    let queued = store.enqueue(&job(99), t0).await.unwrap().job;
    for i in 0..3 {
        let runner = store
            .create_runner(
                &NewRunner {
                    name: format!("r-{i}"),
                    pool: "linux".into(),
                    provider: "sim".into(),
                    labels: vec![],
                    stock: false,
                },
                t0,
            )
            .await
            .unwrap();
        if i > 0 {
            let failed = RunnerEvent::Failed {
                reason: "gone".into(),
            };
            store
                .apply_runner_event(runner.id, &failed, t0)
                .await
                .unwrap();
        }
    }
    let now = t0.plus(Duration::from_secs(40 * 86_400));
    let pruned = retention::prune(&h.service, now).await.unwrap();
    let of = |table: &str| {
        pruned
            .iter()
            .find(|(what, _)| what.table() == table)
            .map(|(_, n)| *n)
            .unwrap_or(0)
    };
    assert_eq!((of("jobs"), of("runners")), (25, 2));
    assert_eq!(
        store.get_job(queued.id).await.unwrap().map(|j| j.state),
        Some(JobState::Queued),
        "live work stays, however old"
    );
    assert_eq!(store.list_live_runners(None).await.unwrap().len(), 1);
    let metrics = h.metrics().await;
    for series in [
        "runway_retention_pruned_total{table=\"jobs\"} 25",
        "runway_retention_pruned_total{table=\"runners\"} 2",
        "runway_store_rows{table=\"jobs\"} 3",
        "runway_store_rows{table=\"runners\"} 1",
    ] {
        assert!(metrics.contains(series), "{series} in\n{metrics}");
    }
    // A second pass finds nothing more.
    let again = retention::prune(&h.service, now).await.unwrap();
    assert!(again.iter().all(|(_, n)| *n == 0), "{again:?}");
}

#[test]
fn retention_shorter_than_github_redelivery_is_refused_by_name() {
    for (key, text) in [
        ("finished_jobs", "[retention]\nfinished_jobs = \"1d\"\n"),
        ("deliveries", "[retention]\ndeliveries = \"3d\"\n"),
    ] {
        let error = Config::parse(text, "runway.toml", None)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains(&format!("[retention] {key}")) && error.contains("at least 4 days"),
            "{error}"
        );
    }
    let forever = Config::parse("[retention]\nfinished_jobs = \"0\"\n", "runway.toml", None)
        .expect("0 keeps forever");
    assert!(forever.retention.finished_jobs.is_zero());
    assert_eq!(
        Config::default().retention.finished_jobs,
        Duration::from_secs(30 * 86_400)
    );
}
