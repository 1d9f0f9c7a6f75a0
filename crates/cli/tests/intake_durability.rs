//! Durability of webhook intake: `runway serve` is killed with SIGKILL while
//! clients send `queued` webhooks; after a restart, every job whose webhook
//! was answered 2xx is there.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{spawn_serve, Process};
use runway_server::github::signature::sign;

const RUNWAY: &str = env!("CARGO_BIN_EXE_runway");
const SECRET: &str = "durability-secret";
const ADMIN: &str = "durability-admin-token";
const ROUNDS: usize = 5;

fn start(dir: &Path) -> (Process, String) {
    let mut command = Command::new(RUNWAY);
    command
        .args([
            "serve",
            "--config",
            "runway.toml",
            "--listen",
            "127.0.0.1:0",
        ])
        .current_dir(dir)
        .env("RUNWAY_LOG", "info")
        .env_remove("RUNWAY_DATABASE_URL");
    spawn_serve(command)
}

fn queued(job_id: u64) -> Vec<u8> {
    serde_json::json!({
        "action": "queued",
        "workflow_job": { "id": job_id, "labels": ["self-hosted", "linux"], "run_id": 1 },
        "repository": { "full_name": "org/repo" },
    })
    .to_string()
    .into_bytes()
}

/// Sends webhooks from a few threads until told to stop; returns the job
/// ids that were answered 2xx.
fn send_until_stopped(base: &str, first_id: u64, stop: Arc<AtomicBool>) -> Vec<u64> {
    let acknowledged = Arc::new(Mutex::new(Vec::new()));
    let next = Arc::new(AtomicU64::new(first_id));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (stop, next, acknowledged) = (stop.clone(), next.clone(), acknowledged.clone());
            let url = format!("{base}/webhooks/github");
            std::thread::spawn(move || {
                let client = reqwest::blocking::Client::builder()
                    .timeout(Duration::from_secs(10))
                    .build()
                    .expect("client");
                // Bounded: at most 20,000 webhooks per thread per round.
                for _ in 0..20_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let id = next.fetch_add(1, Ordering::Relaxed);
                    let body = queued(id);
                    let response = client
                        .post(&url)
                        .header("x-github-event", "workflow_job")
                        .header("x-github-delivery", format!("delivery-{id}"))
                        .header("x-hub-signature-256", sign(SECRET.as_bytes(), &body))
                        .body(body)
                        .send();
                    match response {
                        Ok(response) if response.status().is_success() => {
                            acknowledged.lock().expect("lock").push(id);
                        }
                        Ok(_) => {}
                        // The server is gone: this round is over.
                        Err(_) => break,
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().expect("sender thread");
    }
    let ids = acknowledged.lock().expect("lock").clone();
    ids
}

fn stored_external_ids(base: &str) -> BTreeSet<u64> {
    let client = reqwest::blocking::Client::new();
    let mut ids = BTreeSet::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut request = client
            .get(format!("{base}/api/v1/jobs"))
            .bearer_auth(ADMIN)
            .query(&[("limit", "10000")]);
        if let Some(cursor) = &cursor {
            request = request.query(&[("cursor", cursor)]);
        }
        let page: serde_json::Value = request.send().expect("list jobs").json().expect("JSON");
        for job in page["jobs"].as_array().expect("jobs") {
            ids.insert(
                job["external_id"]
                    .as_str()
                    .expect("external id")
                    .parse()
                    .expect("number"),
            );
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return ids,
        }
    }
}

#[test]
fn every_acknowledged_webhook_survives_sigkill() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(
        dir.path().join("runway.toml"),
        format!(
            "[server]\nadmin_tokens = [\"{ADMIN}\"]\n[github]\nwebhook_secrets = [\"{SECRET}\"]\n\
             [[pools]]\nname = \"default\"\nlabels = [\"self-hosted\", \"linux\"]\n"
        ),
    )
    .expect("config");
    let mut acknowledged = BTreeSet::new();
    for round in 0..ROUNDS {
        let (mut server, base) = start(dir.path());
        let stop = Arc::new(AtomicBool::new(false));
        let sender = {
            let (base, stop) = (base.clone(), stop.clone());
            std::thread::spawn(move || {
                send_until_stopped(&base, (round as u64 + 1) * 1_000_000, stop)
            })
        };
        // Kill at a different moment each round, mid-stream.
        std::thread::sleep(Duration::from_millis(150 + 120 * round as u64));
        server.0.kill().expect("SIGKILL runway");
        server.0.wait().expect("reap");
        stop.store(true, Ordering::Relaxed);
        let ids = sender.join().expect("sender");
        assert!(
            !ids.is_empty(),
            "round {round}: some webhooks were acknowledged before the kill"
        );
        acknowledged.extend(ids);
    }
    let (server, base) = start(dir.path());
    let stored = stored_external_ids(&base);
    drop(server);
    let lost: Vec<&u64> = acknowledged.difference(&stored).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged jobs lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    eprintln!(
        "{} acknowledged webhooks over {ROUNDS} kills, all stored",
        acknowledged.len()
    );
}
