//! Two `runway serve` replicas on one PostgreSQL store: both take requests,
//! exactly one (the holder of an advisory lock) reconciles; when it dies
//! (SIGKILL), the other takes over. Each replica's `sim` provider knows
//! only its own machines, so a follower that reconciled would fail the
//! leader's runners as vanished and start its own: its
//! `runway_runners_created_total` stays 0 only if it never does.

mod common;

use std::path::Path;

use common::{metric, wait_until, PgSchema, Process};

fn serve(dir: &Path, database: &str) -> (Process, String) {
    common::serve_in(dir, &["--config", "runway.toml", "--database", database])
}

#[test]
fn one_replica_reconciles_and_another_takes_over_when_it_dies() {
    let schema = PgSchema::create("runway_replicas");
    let scoped = schema.scoped.clone();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("runway.toml"),
        r#"[server]
listen = "127.0.0.1:0"

[scaling]
interval = "200ms"

[[providers]]
name = "cloud"
kind = "sim"
boot_seconds = 0

[[pools]]
name = "warm"
labels = ["self-hosted", "linux"]
min_idle = 2
max_runners = 4
providers = ["cloud"]
"#,
    )
    .unwrap();
    let (first, a) = serve(dir.path(), &scoped);
    wait_until("the first replica to lead", 30, || {
        metric(&a, "runway_leader") == 1.0
    });
    let (_second, b) = serve(dir.path(), &scoped);
    wait_until("the leader to start its two warm runners", 30, || {
        metric(&a, "runway_runners_created_total") == 2.0
            && metric(&a, "runway_runners{pool=\"warm\",state=\"idle\"}") == 2.0
    });
    // The follower serves (its /metrics answers) but does not reconcile.
    assert_eq!(metric(&b, "runway_leader"), 0.0);
    assert_eq!(metric(&b, "runway_runners_created_total"), 0.0);
    assert_eq!(
        metric(&a, "runway_runners_created_total"),
        2.0,
        "nobody failed the leader's runners"
    );

    drop(first); // SIGKILL: its session ends, and with it the lock.
    wait_until("the second replica to take the lead", 30, || {
        metric(&b, "runway_leader") == 1.0
    });
    // Its sim has none of the dead leader's machines: it starts its own.
    wait_until("the new leader to keep two runners warm", 30, || {
        metric(&b, "runway_runners{pool=\"warm\",state=\"idle\"}") == 2.0
    });
}
