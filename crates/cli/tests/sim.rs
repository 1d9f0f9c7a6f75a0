//! `runway sim` as a user runs it.

use std::path::Path;
use std::process::{Command, Output};

const RUNWAY: &str = env!("CARGO_BIN_EXE_runway");

fn sim(dir: &Path, args: &[&str]) -> Output {
    Command::new(RUNWAY)
        .arg("sim")
        .args(args)
        .current_dir(dir)
        .env_remove("RUNWAY_CONFIG")
        .output()
        .expect("run runway sim")
}

#[test]
fn a_trace_file_is_replayed_deterministically_in_every_format() {
    let dir = tempfile::tempdir().unwrap();
    let mut trace = String::new();
    for i in 0..300 {
        trace.push_str(&format!(
            "{{\"arrival_s\": {}, \"duration_s\": {}, \"labels\": [\"self-hosted\", \"linux\"], \"repo\": \"org/x\"}}\n",
            i * 37,
            60 + (i * 13) % 600
        ));
    }
    std::fs::write(dir.path().join("trace.jsonl"), &trace).unwrap();
    let args = [
        "--trace",
        "trace.jsonl",
        "--policy",
        "runway,arc,static:3",
        "--format",
        "json",
    ];
    let first = sim(dir.path(), &args);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert_eq!(
        first.stdout,
        sim(dir.path(), &args).stdout,
        "byte-identical"
    );
    let report: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    let policies = report["policies"].as_array().unwrap();
    assert_eq!(policies.len(), 3);
    assert_eq!(policies[0]["policy"], "runway");
    assert_eq!(policies[0]["jobs"], 300);
    assert_eq!(policies[2]["policy"], "static:3");

    let csv = sim(
        dir.path(),
        &[
            "--trace",
            "trace.jsonl",
            "--policy",
            "runway",
            "--format",
            "csv",
        ],
    );
    let text = String::from_utf8(csv.stdout).unwrap();
    assert!(text.starts_with("policy,jobs,queue_p50_s,queue_p95_s,queue_p99_s,queue_max_s,runner_hours,idle_runner_hours,cost,delete_requests,failed_creates,queue_mean_s,wait_vs_runway,wait_vs_oracle,cost_vs_runway,stopped_hours,starts\nrunway,300,"), "{text}");

    let table = sim(
        dir.path(),
        &[
            "--trace",
            "trace.jsonl",
            "--policy",
            "oracle,runway,predictive",
            "--plot",
            "charts",
        ],
    );
    assert!(table.status.success());
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.starts_with("policy "));
    // What the warm pool bought is said in words.
    let bought = text
        .lines()
        .find(|l| l.starts_with("bought: predictive idled "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        bought.contains("runner-hours") && bought.contains("less mean wait than runway, at "),
        "{bought}"
    );
    for chart in [
        "timeline.svg",
        "queue_cdf.svg",
        "cost_vs_p95.svg",
        "cost_vs_mean_wait.svg",
    ] {
        let svg = std::fs::read_to_string(dir.path().join("charts").join(chart)).unwrap();
        assert!(svg.starts_with("<svg"), "{chart}");
    }
    let plane = std::fs::read_to_string(dir.path().join("charts/cost_vs_mean_wait.svg")).unwrap();
    assert!(plane.contains("oracle (floor)") && plane.contains("runway (reactive)"));
}

#[test]
fn workloads_use_the_pools_of_a_config_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("runway.toml"),
        "[[providers]]\nname = \"fast\"\nkind = \"sim\"\nboot_seconds = 5\nmax_instances = 500\n\n\
         [[pools]]\nname = \"small\"\nlabels = [\"self-hosted\", \"small\"]\nmax_runners = 100\n\n\
         [[pools]]\nname = \"large\"\nlabels = [\"self-hosted\", \"large\"]\nmax_runners = 100\n",
    )
    .unwrap();
    let output = sim(
        dir.path(),
        &[
            "--config",
            "runway.toml",
            "--workload",
            "mixed",
            "--days",
            "2",
            "--jobs",
            "2000",
            "--policy",
            "runway",
            "--format",
            "json",
        ],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let runway = &report["policies"][0];
    assert!(runway["jobs"].as_u64().unwrap() > 1_500);
    assert!(
        runway["queue_p95_s"].as_f64().unwrap() <= 6.0,
        "boots take 5 s, rounds wait up to 1 s, and there is room: {runway}"
    );
}

#[test]
fn bad_input_is_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.csv"),
        "arrival_s,duration_s,labels\n1,abc,x\n",
    )
    .unwrap();
    for (args, expected) in [
        (
            vec!["--trace", "bad.csv"],
            "error: trace bad.csv: line 2: duration_s: \"abc\" is not a number",
        ),
        (
            vec!["--workload", "weekly"],
            "error: unknown workload \"weekly\"",
        ),
        (
            vec!["--workload", "poisson", "--policy", "kubernetes"],
            "error: unknown policy \"kubernetes\"",
        ),
        (
            vec![],
            "error: give a workload: --trace FILE or --workload NAME",
        ),
    ] {
        let output = sim(dir.path(), &args);
        assert!(!output.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

/// `runway trace export` round-trips: a store that served a trace exports
/// that trace (arrivals, durations, labels, repositories, workflow runs;
/// jobs that never ran left out) with how long after its run's earlier
/// jobs each later one came, and `runway sim --trace` replays every job of
/// it.
#[test]
fn a_trace_exported_from_the_store_is_the_trace_that_ran() {
    use runway_core::job::{NewJob, Route};
    use runway_core::{Conclusion, JobSource, RunnerId, Timestamp};
    use runway_store::{Claim, SqliteStore, Store};
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let database = dir.path().join("runway.db");
    let original = runway_sim::trace::parse(
        &(0..40)
            .map(|i| {
                format!(
                    "{{\"arrival_s\": {}, \"duration_s\": {}, \"labels\": [\"self-hosted\", \"linux\"{}], \"repo\": \"org/r{}\", \"run_id\": {}, \"workflow\": \"ci-{}\"}}\n",
                    i * 61,
                    30.5 + f64::from(i * 7 % 90),
                    if i % 3 == 0 { ", \"x64\"" } else { "" },
                    i % 4,
                    100 + i / 5,
                    i % 2
                )
            })
            .collect::<String>(),
    )
    .unwrap();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    // The trace happened over the last day.
    let start = Timestamp::from_millis(now_ms - 86_400_000);
    // When each job was first seen and finished, as stored.
    let mut times: Vec<(Timestamp, Timestamp)> = Vec::new();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = SqliteStore::open(&database.display().to_string())
            .await
            .unwrap();
        for (i, job) in original.iter().enumerate() {
            let seen = start.plus(Duration::from_millis(job.arrival_ms as u64));
            let new = NewJob {
                source: JobSource::Api,
                external_id: format!("trace-{i}"),
                route: Route::Pool("default".to_owned()),
                labels: job.labels.clone(),
                payload: serde_json::json!({
                    "repository": job.repo,
                    "run_id": job.run_id,
                    "workflow": job.workflow,
                })
                .to_string(),
                max_attempts: 3,
                share: Default::default(),
            };
            let stored = store.enqueue(&new, seen).await.unwrap().job;
            let runner = RunnerId(i as i64 + 1);
            let claim = Claim::of_pool("default", runner, 1, Duration::from_secs(600));
            // Each waits a little (its wait is not part of the trace).
            let started = seen.plus(Duration::from_secs(5 + i as u64 % 7));
            let claimed = store.claim(&claim, started).await.unwrap();
            assert_eq!(claimed[0].id, stored.id);
            store.accept(stored.id, runner, started).await.unwrap();
            let finished = started.plus(Duration::from_millis(job.duration_ms as u64));
            times.push((seen, finished));
            store
                .complete(stored.id, runner, Conclusion::Success, finished)
                .await
                .unwrap();
        }
        // A job that never ran is no part of the trace.
        let never = NewJob {
            source: JobSource::Api,
            external_id: "never".to_owned(),
            route: Route::Pool("default".to_owned()),
            labels: vec!["self-hosted".to_owned()],
            payload: "{}".to_owned(),
            max_attempts: 3,
            share: Default::default(),
        };
        store
            .enqueue(&never, start.plus(Duration::from_secs(10)))
            .await
            .unwrap();
    });

    let exported = Command::new(RUNWAY)
        .args([
            "trace",
            "export",
            "--since",
            "7d",
            "--output",
            "exported.jsonl",
        ])
        .arg("--database")
        .arg(format!("sqlite://{}", database.display()))
        .current_dir(dir.path())
        .env_remove("RUNWAY_CONFIG")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&exported.stderr);
    assert!(exported.status.success(), "{said}");
    assert!(said.contains("40 jobs exported; 1 left out"), "{said}");
    let text = std::fs::read_to_string(dir.path().join("exported.jsonl")).unwrap();
    let mut trace = runway_sim::trace::parse(&text).unwrap();
    assert!(
        trace
            .iter()
            .filter(|j| j.started_after_ms.is_some())
            .count()
            >= 10,
        "{text}"
    );
    // A later job of a run follows the last of its run's jobs that had
    // finished when it came.
    for (i, job) in trace.iter_mut().enumerate() {
        let (seen, _) = times[i];
        let after = (0..times.len())
            .filter(|j| original[*j].run_id == original[i].run_id && times[*j].1 <= seen)
            .map(|j| seen.as_millis() - times[j].1.as_millis())
            .min();
        assert_eq!(job.started_after_ms, after, "job {i}");
        job.started_after_ms = None;
    }
    assert_eq!(trace, original);

    let replayed = sim(
        dir.path(),
        &[
            "--trace",
            "exported.jsonl",
            "--policy",
            "runway",
            "--format",
            "csv",
        ],
    );
    assert!(replayed.status.success());
    let csv = String::from_utf8_lossy(&replayed.stdout);
    assert!(
        csv.lines().nth(1).unwrap().starts_with("runway,40,"),
        "{csv}"
    );
}

/// `runway sim --tune`: every swept setting with its figures, the
/// frontier, a pick or why there is none, and the chart.
#[test]
fn tune_sweeps_the_predictive_setting_and_names_the_frontier_and_a_pick() {
    let dir = tempfile::tempdir().unwrap();
    let output = sim(
        dir.path(),
        &[
            "--workload",
            "bursty",
            "--days",
            "3",
            "--jobs",
            "3000",
            "--tune",
            "--plot",
            "charts",
        ],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    let rows: Vec<&str> = text
        .lines()
        .skip(1)
        .filter(|l| !l.starts_with("pick") && !l.starts_with("no "))
        .collect();
    assert_eq!(rows.len(), 2 + runway_sim_quantiles(), "{text}");
    assert!(rows[0].starts_with("policy = \"runway\""), "{text}");
    assert!(rows[1].starts_with("oracle"), "{text}");
    assert!(
        text.contains("wait_value = 1.50 (quantile 0.5)"),
        "the swept settings name their wait_value: {text}"
    );
    assert!(rows.iter().any(|r| r.ends_with('*')), "a frontier: {text}");
    let verdict = text.lines().last().unwrap_or_default();
    assert!(
        verdict.starts_with("pick: ") || verdict.starts_with("no setting closes"),
        "{text}"
    );
    let svg = std::fs::read_to_string(dir.path().join("charts/tune.svg")).unwrap();
    assert!(
        svg.contains("oracle (floor)") && svg.contains("q 0.5"),
        "{svg}"
    );
}

/// How many quantiles `--tune` sweeps (runway_sim::tune::QUANTILES).
fn runway_sim_quantiles() -> usize {
    12
}
