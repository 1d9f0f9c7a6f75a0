//! The load generators' binary on its own: it lists every benchmark, and
//! refuses a soak with no `runway` to serve with in words that say how to
//! get one. (Each benchmark itself runs against the real server in
//! `crates/cli/tests`, `agent.rs` and `observability.rs`.)

use std::process::Command;

const BENCH: &str = env!("CARGO_BIN_EXE_runway-bench");

#[test]
fn help_lists_every_benchmark() {
    let output = Command::new(BENCH).arg("--help").output().unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for command in [
        "intake",
        "longpoll",
        "drain",
        "soak",
        "forecast-seed",
        "deep-queue",
        "pollers",
        "first-start",
    ] {
        assert!(help.contains(command), "{command} in {help}");
    }
}

#[test]
fn a_soak_without_a_runway_binary_says_where_it_looked() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-runway");
    let output = Command::new(BENCH)
        .args(["soak", "--history", "1", "--runway"])
        .arg(&missing)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cannot start runway serve"), "{stderr}");
}
