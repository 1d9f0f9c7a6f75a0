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
    assert!(text.starts_with("policy,jobs,queue_p50_s,queue_p95_s,queue_p99_s,queue_max_s,runner_hours,idle_runner_hours,cost,delete_requests,failed_creates,queue_mean_s,wait_vs_runway,wait_vs_oracle,cost_vs_runway\nrunway,300,"), "{text}");

    let table = sim(
        dir.path(),
        &[
            "--trace",
            "trace.jsonl",
            "--policy",
            "runway",
            "--plot",
            "charts",
        ],
    );
    assert!(table.status.success());
    assert!(String::from_utf8_lossy(&table.stdout).starts_with("policy "));
    for chart in ["timeline.svg", "queue_cdf.svg", "cost_vs_p95.svg"] {
        let svg = std::fs::read_to_string(dir.path().join("charts").join(chart)).unwrap();
        assert!(svg.starts_with("<svg"), "{chart}");
    }
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
