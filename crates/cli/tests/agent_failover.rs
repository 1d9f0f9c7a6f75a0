//! `runway agent` across a failover: in front of `runway serve`, a
//! loopback proxy answers 503 (what a replica says while its database is
//! away) to the agent's registration, heartbeats and completions, or cuts
//! the connection before the request reaches runway or after runway acted
//! on it; the agent carries on through each and the job runs and completes
//! once.

use crate::common;

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use axum::response::IntoResponse;
use common::proxy::{self, After, Answer, Before, FaultProxy, Seen};
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
    /// Paths of requests on their way to runway that are to be cut after.
    cut_after: Mutex<Vec<String>>,
}

impl Faults {
    /// The planned fault for this request, if any, moved to those met.
    fn take(&self, seen: &Seen) -> Option<Fault> {
        let path = seen.uri.path();
        let mut planned = self.planned.lock().unwrap();
        let next = planned.iter().position(|(k, _)| path.ends_with(*k))?;
        let met = planned.remove(next);
        self.met.lock().unwrap().push(met);
        Some(met.1)
    }
}

impl proxy::Faults for Faults {
    fn before(&self, seen: &Seen) -> Before {
        match self.take(seen) {
            Some(Fault::Refuse) => Before::Answer(
                (
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    [("content-type", "application/json")],
                    r#"{"code":"store_unavailable","error":"the store cannot be reached"}"#,
                )
                    .into_response(),
            ),
            Some(Fault::CutBefore) => Before::Cut,
            // Remembered for `after`, which cuts once runway has answered.
            Some(Fault::CutAfter) => {
                self.cut_after
                    .lock()
                    .unwrap()
                    .push(seen.uri.path().to_owned());
                Before::Forward
            }
            None => Before::Forward,
        }
    }

    fn after(&self, seen: &Seen, answer: Answer) -> After {
        let mut cut = self.cut_after.lock().unwrap();
        match cut.iter().position(|p| p == seen.uri.path()) {
            Some(i) => {
                cut.remove(i);
                After::Cut
            }
            None => After::Pass(answer),
        }
    }
}

struct Proxy {
    url: String,
    faults: Arc<Faults>,
    _proxy: FaultProxy,
}

fn proxy(upstream: &str) -> Proxy {
    let faults = Arc::new(Faults::default());
    let proxy = FaultProxy::start(upstream, faults.clone());
    Proxy {
        url: proxy.url.clone(),
        faults,
        _proxy: proxy,
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
