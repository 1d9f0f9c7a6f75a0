//! `runway agent` across a failover: in front of `runway serve`, a
//! loopback proxy answers 503 (what a replica says while its database is
//! away) to the agent's registration, heartbeats and completions, or cuts
//! the connection before the request reaches runway or after runway acted
//! on it; the agent carries on through each and the job runs and completes
//! once.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use common::{runway, wait_until, Process};

const ADMIN: &str = "agent-failover-admin-token";

/// What the proxy does to a request instead of passing it on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    /// Answers 503, as a replica whose database is away does.
    Refuse,
    /// Cuts the connection before the request reaches runway.
    CutBefore,
    /// Passes the request on, then cuts the connection before the answer
    /// reaches the agent: runway did it, the agent cannot know.
    CutAfter,
}

/// The faults still to meet, in order, for requests whose path ends with
/// each key; and those met.
#[derive(Default)]
struct Faults {
    planned: Mutex<Vec<(&'static str, Fault)>>,
    met: Mutex<Vec<(&'static str, Fault)>>,
}

struct Proxy {
    url: String,
    faults: Arc<Faults>,
    _runtime: tokio::runtime::Runtime,
}

/// Ends the connection's task without an answer: the client sees the
/// connection closed (`resume_unwind` skips the panic hook, so nothing is
/// printed; axum serves each connection in its own task).
fn cut_connection() -> ! {
    std::panic::resume_unwind(Box::new("connection cut by the test proxy"))
}

fn proxy(upstream: &str) -> Proxy {
    let faults = Arc::new(Faults::default());
    let (upstream, state) = (upstream.to_owned(), faults.clone());
    let forward = reqwest::Client::new();
    let app = axum::Router::new().fallback(
        move |method: axum::http::Method,
              uri: axum::http::Uri,
              headers: axum::http::HeaderMap,
              body: axum::body::Bytes| {
            let (upstream, faults, forward) = (upstream.clone(), state.clone(), forward.clone());
            async move {
                use axum::response::IntoResponse;
                let path = uri.path().to_owned();
                let fault = {
                    let mut planned = faults.planned.lock().unwrap();
                    let next = planned.iter().position(|(k, _)| path.ends_with(*k));
                    next.map(|i| planned.remove(i))
                };
                if let Some(met) = fault {
                    faults.met.lock().unwrap().push(met);
                }
                match fault.map(|(_, f)| f) {
                    Some(Fault::Refuse) => {
                        return (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            [("content-type", "application/json")],
                            r#"{"code":"store_unavailable","error":"the store cannot be reached"}"#,
                        )
                            .into_response();
                    }
                    Some(Fault::CutBefore) => cut_connection(),
                    Some(Fault::CutAfter) | None => {}
                }
                let answer = match common::forward(
                    &forward, &upstream, method, &uri, &headers, body,
                )
                .await
                {
                    Ok(answer) => {
                        let status = answer.status();
                        let bytes = answer.bytes().await.unwrap_or_default();
                        (status, [("content-type", "application/json")], bytes).into_response()
                    }
                    Err(error) => {
                        (axum::http::StatusCode::BAD_GATEWAY, error.to_string()).into_response()
                    }
                };
                if fault.is_some_and(|(_, f)| f == Fault::CutAfter) {
                    cut_connection();
                }
                answer
            }
        },
    );
    let (url, runtime) = common::serve_router(app);
    Proxy {
        url,
        faults,
        _runtime: runtime,
    }
}

fn write_config(dir: &Path) {
    std::fs::write(
        dir.join("runway.toml"),
        format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_tokens = [\"{ADMIN}\"]\n\
             [runner_api]\npoll_timeout = \"1s\"\nlease = \"6s\"\n\
             [[pools]]\nname = \"default\"\nlabels = [\"self-hosted\", \"linux\"]\n"
        ),
    )
    .unwrap();
}

/// Runs one job on a `runway agent --once` behind the proxy with `faults`
/// planned, and checks it ran once, was never requeued, and that every
/// fault was met.
fn an_agent_carries_on_through(faults: &[(&'static str, Fault)]) {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let (_server, base) = common::serve_in(dir.path(), &["--config", "runway.toml"]);
    let proxy = proxy(&base);
    proxy.faults.planned.lock().unwrap().extend(faults);
    let log = std::fs::File::create(dir.path().join("agent.log")).unwrap();
    let _agent = Process(
        runway(dir.path())
            .args(["agent", "--once", "--url", &proxy.url])
            .args(["--labels", "self-hosted,linux", "--name", "failover"])
            .arg("--work-dir")
            .arg(dir.path().join("work"))
            .env(
                "RUNWAY_REGISTRATION_TOKEN",
                common::registration_token(&base, ADMIN, "default"),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start runway agent"),
    );
    // Long enough for two heartbeats (every 2 s with a 6 s lease): the
    // first may be refused or cut, the second keeps the lease.
    let job = common::submit(
        &base,
        ADMIN,
        &format!(
            "echo ran >> '{}'; sleep 5; echo carried on",
            dir.path().join("ran.log").display()
        ),
    );
    let agent_log = || std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default();
    wait_until("the job to complete through the faults", 60, || {
        common::job(&base, ADMIN, job)["state"] == "completed"
    });
    let done = common::job(&base, ADMIN, job);
    assert_eq!(
        done["attempts"],
        0,
        "ran once, never requeued: {done}\n{}",
        agent_log()
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("ran.log")).unwrap_or_default(),
        "ran\n",
        "the job ran once"
    );
    let mut met = proxy.faults.met.lock().unwrap().clone();
    let mut expected = faults.to_vec();
    met.sort();
    expected.sort();
    assert_eq!(met, expected, "every fault was met: {}", agent_log());
    // The agent's own runner record ended with its one job.
    let runners = common::client()
        .get(format!("{base}/api/v1/runners"))
        .bearer_auth(ADMIN)
        .send()
        .and_then(|r| r.json::<serde_json::Value>())
        .expect("runners");
    assert_eq!(
        runners["runners"].as_array().map(Vec::len),
        Some(1),
        "one runner record: {runners}"
    );
}

#[test]
fn an_agent_carries_on_through_503s_at_registration_heartbeat_and_completion() {
    an_agent_carries_on_through(&[
        ("/runners/register", Fault::Refuse),
        ("/runners/register", Fault::Refuse),
        ("/runners/register", Fault::Refuse),
        ("/heartbeat", Fault::Refuse),
        ("/complete", Fault::Refuse),
        ("/complete", Fault::Refuse),
        ("/complete", Fault::Refuse),
    ]);
}

#[test]
fn an_agent_carries_on_through_cut_connections_at_registration() {
    an_agent_carries_on_through(&[
        ("/runners/register", Fault::CutBefore),
        ("/runners/register", Fault::CutAfter),
    ]);
}

#[test]
fn an_agent_carries_on_through_cut_connections_at_heartbeat() {
    an_agent_carries_on_through(&[
        ("/heartbeat", Fault::CutBefore),
        ("/heartbeat", Fault::CutAfter),
    ]);
}

#[test]
fn an_agent_carries_on_through_cut_connections_at_completion() {
    an_agent_carries_on_through(&[
        ("/complete", Fault::CutBefore),
        ("/complete", Fault::CutAfter),
    ]);
}

/// `runway submit` through two 503s: it asks again with the same external
/// id (its own, random, when none is given) and the job is one job.
#[test]
fn submit_asks_again_through_503s_and_makes_one_job() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let (_server, base) = common::serve_in(dir.path(), &["--config", "runway.toml"]);
    let proxy = proxy(&base);
    proxy.faults.planned.lock().unwrap().extend([
        ("/api/v1/jobs", Fault::Refuse),
        ("/api/v1/jobs", Fault::Refuse),
    ]);
    let output = runway(dir.path())
        .args([
            "submit",
            "--url",
            &proxy.url,
            "--labels",
            "self-hosted,linux",
        ])
        .args(["--", "true"])
        .env("RUNWAY_TOKEN", ADMIN)
        .output()
        .expect("runway submit");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(proxy.faults.met.lock().unwrap().len(), 2);
    let jobs = common::client()
        .get(format!("{base}/api/v1/jobs"))
        .bearer_auth(ADMIN)
        .send()
        .and_then(|r| r.json::<serde_json::Value>())
        .expect("jobs");
    assert_eq!(jobs["jobs"].as_array().map(Vec::len), Some(1), "{jobs}");
}
