//! The web console in a real browser: Debian's Chromium driven by
//! playwright-core (npm) through `tests/browser/console.cjs`, against the
//! real binary. A read token sees a queued job's wait reason change live
//! when a runner boots; an admin drains a runner, pauses a pool and is
//! asked before terminating a busy runner; a forged cross-site POST is
//! refused; logging out, a token replaced and reloaded, and an admin's
//! "end all sessions" each end sessions for good; a pool page draws its seeded hour of history and the overview
//! its sparkline; a 10,000-deep paused queue keeps every shown job's wait
//! reason while it streams, and Older and Newer walk every job once; and the screenshots of docs/ are taken on a
//! laptop-sized screen. `.ci/run` installs Chromium and playwright-core; without them
//! this test is skipped, except under CI, where that is a failure.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{required, run_checker, runway, spawn_serve, tool, Process};

const ADMIN: &str = "browser-test-admin-token";
const READ: &str = "browser-test-read-token";
/// An operate token under a name (`[[server.tokens]]`), replaced by the
/// test in the config file and reloaded: its sessions end.
const OPS: &str = "browser-test-ops-token";

/// Minutes of history seeded for pool "ci" before the server starts: the
/// last hour but its last two minutes and its first two (the server's own
/// sampler records the last ones while the test runs, so a chart holds 57
/// to 60 points; and should the minute turn before the page is drawn, the
/// oldest seeded minute is still in its hour).
const SEEDED_MINUTES: i64 = 57;

/// Records an hour of pool "ci" in the store the server will open: a
/// morning's queue rising and draining, runners following it, queue times
/// and cost — what the pool page and the overview draw.
fn seed_history(dir: &Path) {
    const MINUTE: i64 = 60_000;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_millis() as i64;
    let this_minute = now - now % MINUTE;
    let samples: Vec<runway_store::PoolSample> = (2..2 + SEEDED_MINUTES)
        .map(|back| {
            let phase = (SEEDED_MINUTES + 2 - back) as f64 / SEEDED_MINUTES as f64;
            let wave = (phase * std::f64::consts::PI).sin();
            let queued = (wave * wave * 14.0).round() as i64;
            let busy = (wave * 6.0).round().clamp(0.0, 6.0) as i64;
            let booting = i64::from(queued > busy);
            let started = busy + booting;
            runway_store::PoolSample {
                pool: "ci".to_owned(),
                at: runway_core::Timestamp::from_millis(this_minute - back * MINUTE),
                queued,
                running: busy,
                booting,
                idle: i64::from(busy < 2),
                busy,
                stopped: 0,
                started,
                wait_p50_ms: (started > 0).then_some(5_000 + queued * 2_000),
                wait_p95_ms: (started > 0).then_some(20_000 + queued * 6_000),
                runner_seconds: (busy + booting + i64::from(busy < 2)) * 60,
                cost_micros: (busy + booting + i64::from(busy < 2)) * 1_667,
                waits: [
                    ("runner_booting", booting * 2),
                    ("at_max_runners", (queued - 6).max(0)),
                ]
                .into_iter()
                .filter(|(_, jobs)| *jobs > 0)
                .map(|(reason, jobs)| (reason.to_owned(), jobs))
                .collect(),
            }
        })
        .collect();
    // And pool "deep": DEEP queued jobs, paused (each waits, and says so).
    let deep: Vec<runway_core::NewJob> = (0..DEEP)
        .map(|n| runway_core::NewJob {
            source: runway_core::JobSource::Api,
            external_id: format!("deep-{n}"),
            route: runway_core::Route::Pool("deep".to_owned()),
            labels: vec!["deep".to_owned()],
            payload: r#"{"script":"true"}"#.to_owned(),
            max_attempts: 3,
            share: Default::default(),
        })
        .collect();
    let url = format!("sqlite://{}", dir.join("runway.db").display());
    tokio::runtime::Runtime::new()
        .expect("a runtime")
        .block_on(async {
            use runway_store::Store as _;
            let store = runway_store::SqliteStore::open(&url).await?;
            store.record_pool_samples(&samples).await?;
            let at = runway_core::Timestamp::from_millis(this_minute);
            for chunk in deep.chunks(1_000) {
                store.enqueue_many(chunk, at).await?;
            }
            store
                .set_pool_paused("deep", Some("browser-test"), at)
                .await?;
            Ok::<_, runway_store::StoreError>(())
        })
        .expect("seed the pool history and the deep queue");
}

/// Jobs queued in the paused pool "deep".
const DEEP: usize = 10_000;

fn serve(dir: &Path) -> (Process, String) {
    let port = common::free_port();
    std::fs::write(
        dir.join("runway.toml"),
        format!(
            r#"[server]
listen = "127.0.0.1:{port}"
admin_tokens = ["{ADMIN}"]
read_tokens = ["{READ}"]

[[server.tokens]]
name = "ops"
role = "operate"
token = "{OPS}"

[runner_api]
poll_timeout = "2s"
lease = "5s"

[scaling]
interval = "200ms"

# Runners take three seconds to boot, so the console can show it.
[[providers]]
name = "local"
kind = "process"
command = ["sh", "-c", "sleep 3; exec {runway} agent --once"]
state_dir = "processes"
stop_grace = "2s"
max_instances = 2

[[pools]]
name = "ci"
labels = ["linux"]
max_runners = 2
providers = ["local"]

# A deep queue, paused before the server starts (seed_history).
[[pools]]
name = "deep"
labels = ["deep"]
max_runners = 0

# Registered runners only: no provider starts any.
[[pools]]
name = "gpu"
labels = ["gpu"]
max_runners = 0
idle_grace = "1h"
"#,
            runway = common::RUNWAY,
        ),
    )
    .expect("write the config");
    let mut command = runway(dir);
    command.args(["serve", "--config", "runway.toml"]);
    spawn_serve(command)
}

/// Where `require("playwright-core")` resolves: `NODE_PATH` (`.ci/run`
/// sets it to the node_modules it installs into).
fn playwright_core() -> Option<PathBuf> {
    let found = std::env::var_os("NODE_PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("playwright-core"))
            .find(|dir| dir.join("package.json").is_file())
    });
    required(
        found,
        "playwright-core",
        "playwright-core from npm on NODE_PATH",
    )
}

#[test]
fn the_console_in_chromium() {
    let (Some(node), Some(chromium)) = (
        tool("node", "Node.js"),
        tool("chromium", "Debian's chromium package"),
    ) else {
        return;
    };
    if playwright_core().is_none() {
        return;
    }
    let dir = tempfile::tempdir().expect("a temp dir");
    seed_history(dir.path());
    let (_server, base) = serve(dir.path());
    let shots = dir.path().join("screenshots");
    std::fs::create_dir_all(&shots).expect("a screenshot dir");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser/console.cjs");
    let mut command = Command::new(node);
    command
        .arg(&script)
        .env("RUNWAY_URL", &base)
        .env("ADMIN_TOKEN", ADMIN)
        .env("READ_TOKEN", READ)
        .env("OPS_TOKEN", OPS)
        .env("CONFIG_FILE", dir.path().join("runway.toml"))
        .env("SEEDED_MINUTES", SEEDED_MINUTES.to_string())
        .env("DEEP", DEEP.to_string())
        .env("CHROMIUM", chromium)
        .env("SCREENSHOTS", &shots);
    run_checker(command, "the browser test");
    for name in [
        "console-overview.png",
        "console-jobs.png",
        "console-pool.png",
    ] {
        let png = std::fs::read(shots.join(name)).expect("a screenshot");
        assert!(png.starts_with(b"\x89PNG"), "{name} is a PNG");
        // Keep a copy when asked (how docs/ got its screenshots).
        if let Some(keep) = std::env::var_os("RUNWAY_KEEP_SCREENSHOTS") {
            std::fs::write(Path::new(&keep).join(name), &png).expect("keep the screenshot");
        }
    }
}
