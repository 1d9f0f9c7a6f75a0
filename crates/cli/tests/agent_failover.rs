//! `runway agent` across a failover: in front of `runway serve`, a
//! loopback proxy answers 503 (what a replica says while its database is
//! away) to the agent's first registration, heartbeats and completions;
//! the agent carries on through each and the job completes once.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use common::{runway, wait_until, Process};

const ADMIN: &str = "agent-failover-admin-token";

/// How many of the next requests whose path ends with each key the proxy
/// refuses with 503, and how many it refused.
#[derive(Default)]
struct Faults {
    refuse: Mutex<BTreeMap<&'static str, u32>>,
    refused: Mutex<BTreeMap<&'static str, u32>>,
}

struct Proxy {
    url: String,
    faults: Arc<Faults>,
    _runtime: tokio::runtime::Runtime,
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
                {
                    let mut refuse = faults.refuse.lock().unwrap();
                    if let Some((key, left)) = refuse
                        .iter_mut()
                        .find(|(k, n)| path.ends_with(**k) && **n > 0)
                    {
                        *left -= 1;
                        *faults.refused.lock().unwrap().entry(key).or_default() += 1;
                        return (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            [("content-type", "application/json")],
                            r#"{"code":"store_unavailable","error":"the store cannot be reached"}"#,
                        )
                            .into_response();
                    }
                }
                match common::forward(&forward, &upstream, method, &uri, &headers, body).await {
                    Ok(answer) => {
                        let status = answer.status();
                        let bytes = answer.bytes().await.unwrap_or_default();
                        (status, [("content-type", "application/json")], bytes).into_response()
                    }
                    Err(error) => {
                        (axum::http::StatusCode::BAD_GATEWAY, error.to_string()).into_response()
                    }
                }
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

#[test]
fn an_agent_carries_on_through_503s_at_registration_heartbeat_and_completion() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let (_server, base) = common::serve_in(dir.path(), &["--config", "runway.toml"]);
    let proxy = proxy(&base);
    proxy.faults.refuse.lock().unwrap().extend([
        ("/runners/register", 3),
        ("/heartbeat", 1),
        ("/complete", 3),
    ]);
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
    // first is refused, the second keeps the lease.
    let job = common::submit(&base, ADMIN, "sleep 5; echo carried on");
    let agent_log = || std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default();
    wait_until("the job to complete through the 503s", 60, || {
        common::job(&base, ADMIN, job)["state"] == "completed"
    });
    let done = common::job(&base, ADMIN, job);
    assert_eq!(
        done["attempts"],
        0,
        "ran once, never requeued: {done}\n{}",
        agent_log()
    );
    let refused = proxy.faults.refused.lock().unwrap().clone();
    assert_eq!(
        refused,
        BTreeMap::from([
            ("/complete", 3),
            ("/heartbeat", 1),
            ("/runners/register", 3)
        ]),
        "every step met its 503s: {}",
        agent_log()
    );
}

/// `runway submit` through two 503s: it asks again with the same external
/// id (its own, random, when none is given) and the job is one job.
#[test]
fn submit_asks_again_through_503s_and_makes_one_job() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let (_server, base) = common::serve_in(dir.path(), &["--config", "runway.toml"]);
    let proxy = proxy(&base);
    proxy
        .faults
        .refuse
        .lock()
        .unwrap()
        .insert("/api/v1/jobs", 2);
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
    assert_eq!(
        proxy.faults.refused.lock().unwrap().get("/api/v1/jobs"),
        Some(&2)
    );
    let jobs = common::client()
        .get(format!("{base}/api/v1/jobs"))
        .bearer_auth(ADMIN)
        .send()
        .and_then(|r| r.json::<serde_json::Value>())
        .expect("jobs");
    assert_eq!(jobs["jobs"].as_array().map(Vec::len), Some(1), "{jobs}");
}
