//! Helpers shared by the end-to-end tests that run the real binary.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Stdio};

pub use runway_testkit::*;

pub const RUNWAY: &str = env!("CARGO_BIN_EXE_runway");

/// `runway` run in `dir`, logging at info, with none of the caller's own
/// `RUNWAY_*` settings leaking in.
pub fn runway(dir: &Path) -> Command {
    clean_command(Path::new(RUNWAY), dir)
}

/// `runway-bench` (the load generators, their own binary in
/// `crates/bench`) run in `dir` as [`runway`] runs. Cargo builds it beside
/// `runway` when the workspace's tests are built (`cargo test --workspace`,
/// as `.ci/run` does); alone, build it first: `cargo build -p runway-bench`.
pub fn runway_bench(dir: &Path) -> Command {
    let exe =
        Path::new(RUNWAY).with_file_name(format!("runway-bench{}", std::env::consts::EXE_SUFFIX));
    assert!(
        exe.exists(),
        "no runway-bench at {}: build it first (cargo build -p runway-bench)",
        exe.display()
    );
    clean_command(&exe, dir)
}

fn clean_command(exe: &Path, dir: &Path) -> Command {
    let mut command = Command::new(exe);
    command
        .current_dir(dir)
        .env("RUNWAY_LOG", "info")
        .env_remove("RUNWAY_CONFIG")
        .env_remove("RUNWAY_DATABASE_URL")
        .env_remove("RUNWAY_URL")
        .env_remove("RUNWAY_TOKEN");
    command
}

/// `runway serve ARGS` in `dir`, with its base URL.
pub fn serve_in(dir: &Path, args: &[&str]) -> (Process, String) {
    let mut command = runway(dir);
    command.arg("serve").args(args);
    spawn_serve(command)
}

/// `contrib/garm-provider-local`, the GARM provider the exec tests drive.
pub fn contrib_provider() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../contrib/garm-provider-local/garm-provider-local")
        .canonicalize()
        .expect("contrib/garm-provider-local")
}

/// A registration token for pool `pool`, minted on `base` with `admin`.
pub fn registration_token(base: &str, admin: &str, pool: &str) -> String {
    let body: serde_json::Value = client()
        .post(format!("{base}/api/v1/registration-tokens"))
        .bearer_auth(admin)
        .json(&serde_json::json!({"pool": pool, "ttl": 600}))
        .send()
        .expect("mint a registration token")
        .json()
        .expect("a JSON answer");
    body["token"]
        .as_str()
        .expect("a registration token")
        .to_owned()
}

/// `runway agent` named `name` with `labels` in pool `default` of the
/// server at `base`, working under `dir/work-NAME` and logging to
/// `dir/agent-NAME.log` (see [`agent_logs`]).
pub fn agent(
    dir: &Path,
    base: &str,
    admin: &str,
    name: &str,
    labels: &str,
    extra: &[&str],
) -> Process {
    let log = std::fs::File::create(dir.join(format!("agent-{name}.log")))
        .expect("create the agent's log");
    Process(
        runway(dir)
            .args(["agent", "--url", base, "--labels", labels, "--name", name])
            .args(extra)
            .arg("--work-dir")
            .arg(dir.join(format!("work-{name}")))
            .env(
                "RUNWAY_REGISTRATION_TOKEN",
                registration_token(base, admin, "default"),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start runway agent"),
    )
}

/// What every agent started in `dir` wrote to its log, for a failing
/// test's message.
pub fn agent_logs(dir: &Path) -> String {
    let mut logs = String::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("agent-") && name.ends_with(".log") {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            logs.push_str(&format!("\n--- {name}\n{text}"));
        }
    }
    logs
}

/// The `[[providers]]` table of a `process` provider `machines` whose
/// runners only append their name and JIT config to `log` and sleep:
/// what GitHub's side of a test reads to see which runner got which
/// credential.
pub fn jit_log_provider(log: &Path, stop_grace: &str) -> String {
    format!(
        "[[providers]]\nname = \"machines\"\nkind = \"process\"\n\
         command = [\"sh\", \"-c\", \"echo \\\"$RUNWAY_RUNNER_NAME $RUNWAY_JIT_CONFIG\\\" >> '{}'; exec sleep 300\"]\n\
         state_dir = \"processes\"\nstop_grace = \"{stop_grace}\"\n\n",
        log.display()
    )
}

/// Submits a job running `script` (labels `linux`); its id.
pub fn submit(base: &str, admin: &str, script: &str) -> i64 {
    submit_to(base, admin, &["linux"], script, 60)
}

/// Submits a job with `labels` running `script`, given `timeout` seconds;
/// its id.
pub fn submit_to(base: &str, admin: &str, labels: &[&str], script: &str, timeout: u64) -> i64 {
    let body: serde_json::Value = client()
        .post(format!("{base}/api/v1/jobs"))
        .bearer_auth(admin)
        .json(&serde_json::json!({"labels": labels, "script": script, "timeout_seconds": timeout}))
        .send()
        .expect("submit a job")
        .json()
        .expect("a JSON answer");
    body["id"]
        .as_i64()
        .unwrap_or_else(|| panic!("a job id in {body}"))
}

/// GET `base` + `path` with `token`: its JSON (null if the server does
/// not answer).
pub fn api_get(base: &str, token: &str, path: &str) -> serde_json::Value {
    client()
        .get(format!("{base}{path}"))
        .bearer_auth(token)
        .send()
        .and_then(|r| r.json())
        .unwrap_or_default()
}

/// Job `id`'s log and its state (the `x-runway-job-state` header), or
/// None if the server does not answer.
pub fn job_log(base: &str, token: &str, id: i64) -> Option<(String, String)> {
    let response = client()
        .get(format!("{base}/api/v1/jobs/{id}/log"))
        .bearer_auth(token)
        .send()
        .ok()?;
    let state = response
        .headers()
        .get("x-runway-job-state")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    Some((state, response.text().unwrap_or_default()))
}

/// A job's log as `GET /api/v1/jobs/{id}/log` answers it (empty if the
/// server does not answer).
pub fn log_text(base: &str, token: &str, id: i64) -> String {
    job_log(base, token, id)
        .map(|(_, text)| text)
        .unwrap_or_default()
}

/// `GET /api/v1/jobs/{id}` (null if the server does not answer).
pub fn job(base: &str, admin: &str, id: i64) -> serde_json::Value {
    api_get(base, admin, &format!("/api/v1/jobs/{id}"))
}

/// The ids of the runners of pools' stocks of stopped runners in `state`.
pub fn stock_runners(base: &str, admin: &str, state: &str) -> std::collections::BTreeSet<i64> {
    api_get(base, admin, "/api/v1/runners")["runners"]
        .as_array()
        .map(|runners| {
            runners
                .iter()
                .filter(|r| r["stock"] == true && r["state"] == state)
                .filter_map(|r| r["id"].as_i64())
                .collect()
        })
        .unwrap_or_default()
}
