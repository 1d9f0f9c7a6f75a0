use super::*;

#[test]
fn json_lines_and_csv_read_the_same() {
    let json = "{\"arrival_s\": 12.5, \"duration_s\": 340, \"labels\": [\"self-hosted\",\"large\"], \"repo\": \"org/x\"}\n\n# a comment\n{\"arrival_s\": 3, \"duration_s\": 60, \"labels\": [\"self-hosted\"]}\n";
    let csv =
        "arrival_s,duration_s,labels,repo\n12.5,340,self-hosted;large,org/x\n3,60,self-hosted,\n";
    let from_json = parse(json).unwrap();
    assert_eq!(from_json, parse(csv).unwrap());
    assert_eq!(from_json[0].arrival_ms, 3_000, "sorted by arrival");
    assert_eq!(from_json[1].labels, ["self-hosted", "large"]);
    assert_eq!(from_json[1].repo.as_deref(), Some("org/x"));
}

#[test]
fn workflow_runs_are_read_from_json_and_csv() {
    let json = "{\"arrival_s\": 1, \"duration_s\": 60, \"labels\": [\"a\"], \"run_id\": 7, \"workflow\": \"ci\"}\n{\"arrival_s\": 70, \"duration_s\": 30, \"labels\": [\"a\"], \"run_id\": 7, \"workflow\": \"ci\", \"started_after\": 4.5}\n";
    let csv = "arrival_s,duration_s,labels,repo,run_id,workflow,started_after\n1,60,a,,7,ci\n70,30,a,,7,ci,4.5\n";
    let jobs = parse(json).unwrap();
    assert_eq!(jobs, parse(csv).unwrap());
    assert_eq!(jobs[1].run_id, Some(7));
    assert_eq!(jobs[1].workflow.as_deref(), Some("ci"));
    assert_eq!(jobs[1].started_after_ms, Some(4_500));
    assert_eq!(jobs[0].started_after_ms, None);
    assert_eq!(
        parse("{\"arrival_s\": 1, \"duration_s\": 1, \"labels\": [], \"started_after\": 2}")
            .unwrap_err()
            .to_string(),
        "line 1: started_after needs the job's run_id (it follows its run's earlier jobs)"
    );
    assert!(parse("arrival_s,duration_s,labels,repo,run_id\n1,1,a,,x\n")
        .unwrap_err()
        .to_string()
        .contains("run_id"));
}

#[test]
fn the_monorepo_workload_has_a_weekday_batch_and_quiet_weekends() {
    let jobs = Workload {
        kind: WorkloadKind::Monorepo,
        days: 14,
        jobs: 20_000,
        seed: 2,
        pools: vec![],
    }
    .generate();
    let nightly = |day: i64| {
        jobs.iter()
            .filter(|j| j.workflow.as_deref() == Some("nightly"))
            .filter(|j| j.arrival_ms / 86_400_000 == day)
            .count()
    };
    assert_eq!(nightly(0), BATCH_JOBS as usize, "Monday");
    assert_eq!(nightly(5), 0, "Saturday");
    let on = |day: i64| {
        jobs.iter()
            .filter(|j| j.arrival_ms / 86_400_000 == day)
            .count()
    };
    assert!(
        on(2) > 5 * on(6),
        "a Wednesday {} vs a Sunday {}",
        on(2),
        on(6)
    );
    // A push's fan-out follows its plan job.
    assert!(jobs
        .iter()
        .any(|j| j.started_after_ms.is_some() && j.run_id.is_some()));
}

#[test]
fn scheduled_batches_drift_and_fanouts_have_no_runs() {
    let jobs = Workload {
        kind: WorkloadKind::Scheduled,
        days: 14,
        jobs: 10_000,
        seed: 4,
        pools: vec![],
    }
    .generate();
    let starts: Vec<i64> = (0..14)
        .filter(|day| day % 7 < 5)
        .filter_map(|day| {
            jobs.iter()
                .filter(|j| j.workflow.as_deref() == Some("nightly"))
                .find(|j| j.arrival_ms / 86_400_000 == day)
                .map(|j| j.arrival_ms % 86_400_000)
        })
        .collect();
    assert_eq!(starts.len(), 10);
    let (first, last) = (starts.iter().min().unwrap(), starts.iter().max().unwrap());
    assert!(*first >= 2 * 3_600_000 && *last <= 2 * 3_600_000 + 900_000);
    assert!(last - first > 300_000, "the start drifts: {starts:?}");
    let holiday = jobs
        .iter()
        .filter(|j| j.arrival_ms / 86_400_000 == 9 && j.workflow.is_none())
        .count();
    assert_eq!(holiday, 0, "no pushes on the holiday");

    let fanout = Workload {
        kind: WorkloadKind::Fanout,
        days: 7,
        jobs: 10_000,
        seed: 4,
        pools: vec![],
    }
    .generate();
    assert!(fanout
        .iter()
        .all(|j| j.run_id.is_none() && j.workflow.is_none()));
    assert!(fanout.iter().all(|j| j.repo.is_some()));
    // Groups: most arrivals within seconds of the one before.
    let close = fanout
        .windows(2)
        .filter(|w| w[1].arrival_ms - w[0].arrival_ms <= 10_000)
        .count();
    assert!(close * 10 > fanout.len() * 8, "{close} of {}", fanout.len());
}

#[test]
fn bad_traces_name_the_line() {
    assert_eq!(
        parse("{\"arrival_s\": -1, \"duration_s\": 1, \"labels\": []}").unwrap_err(),
        TraceError::Line {
            line: 1,
            message: "arrival_s: -1 is not a number of seconds ≥ 0".into()
        }
    );
    let error = parse("arrival_s,duration_s,labels\n1,x,a\n")
        .unwrap_err()
        .to_string();
    assert_eq!(error, "line 2: duration_s: \"x\" is not a number");
    assert!(
        parse("{\"arrival_s\": 1, \"duration_s\": 1, \"labels\": [], \"extra\": 1}")
            .unwrap_err()
            .to_string()
            .contains("unknown field")
    );
    assert_eq!(parse("# nothing\n"), Err(TraceError::Empty));
}

#[test]
fn workloads_are_seeded_and_about_the_size_asked() {
    for kind in [
        "poisson",
        "diurnal",
        "bursty",
        "mixed",
        "monorepo",
        "scheduled",
        "fanout",
        "changing",
    ] {
        let workload = Workload {
            kind: kind.parse().unwrap(),
            days: 7,
            jobs: 20_000,
            seed: 3,
            pools: vec![vec!["a".into()], vec!["b".into()]],
        };
        let jobs = workload.generate();
        assert_eq!(jobs, workload.generate(), "{kind}: same seed, same jobs");
        let n = jobs.len() as f64;
        assert!((n - 20_000.0).abs() < 2_000.0, "{kind}: {n} jobs");
        assert!(jobs.windows(2).all(|w| w[0].arrival_ms <= w[1].arrival_ms));
        assert!(jobs.iter().all(|j| j.arrival_ms < 7 * 86_400_000));
    }
}

#[test]
fn diurnal_days_are_busier_than_nights() {
    let jobs = Workload {
        kind: WorkloadKind::Diurnal,
        days: 14,
        jobs: 50_000,
        seed: 1,
        pools: vec![],
    }
    .generate();
    let hour = |j: &TraceJob| (j.arrival_ms / 3_600_000) % 24;
    let afternoon = jobs.iter().filter(|j| (12..16).contains(&hour(j))).count();
    let night = jobs.iter().filter(|j| (0..4).contains(&hour(j))).count();
    assert!(afternoon > 3 * night, "{afternoon} vs {night}");
}
