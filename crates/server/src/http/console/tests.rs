use super::*;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

#[test]
fn queue_percentiles_are_nearest_rank_per_pool() {
    let mut times: Vec<(String, Duration)> = (1..=100).map(|n| ("a".into(), secs(n))).collect();
    times.push(("b".into(), secs(7)));
    let stats = crate::app::history::queue_percentiles(times);
    assert_eq!(stats["a"], (100, secs(50), secs(95)));
    assert_eq!(stats["b"], (1, secs(7), secs(7)));
    assert!(crate::app::history::queue_percentiles(Vec::new()).is_empty());
}

#[test]
fn a_queued_job_names_the_runner_booting_for_it_but_not_as_its_own() {
    let job = runway_core::NewJob {
        source: JobSource::Api,
        external_id: "x".into(),
        route: runway_core::Route::Pool("p".into()),
        labels: vec!["linux".into()],
        payload: "{}".into(),
        max_attempts: 3,
        share: Default::default(),
    }
    .initial(JobId(7), Timestamp::from_millis(1_000));
    let booting = Explanation::Waiting {
        reason: runway_core::planner::WaitReason::RunnerBooting {
            runner: RunnerId(42),
            since: Timestamp::from_millis(1_000),
        },
        has_providers: true,
        offers: Vec::new(),
        warm: None,
    };
    let row = job_row(&job, Some(&booting));
    assert_eq!(row["runner"], serde_json::Value::Null);
    assert_eq!(row["runner_for"], 42);
    let paused = Explanation::Waiting {
        reason: runway_core::planner::WaitReason::PoolPaused,
        has_providers: true,
        offers: Vec::new(),
        warm: None,
    };
    assert_eq!(
        job_row(&job, Some(&paused))["runner_for"],
        serde_json::Value::Null
    );
}

#[test]
fn durations_read_as_an_operator_reads_them() {
    for (d, text) in [
        (Duration::from_millis(850), "850 ms"),
        (secs(42), "42 s"),
        (secs(185), "3 min 5 s"),
        (secs(60), "1 min"),
        (secs(7800), "2 h 10 min"),
        (secs(3600), "1 h"),
    ] {
        assert_eq!(short_duration(d), text);
    }
}
