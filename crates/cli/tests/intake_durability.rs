//! Durability of webhook intake: `runway serve` is killed with SIGKILL while
//! clients send `queued` webhooks; after a restart, every job whose webhook
//! was answered 2xx is there.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
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

fn start(dir: &Path, args: &[&str]) -> (Process, String) {
    let mut command = Command::new(RUNWAY);
    command
        .args([
            "serve",
            "--config",
            "runway.toml",
            "--listen",
            "127.0.0.1:0",
        ])
        .args(args)
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

/// Webhook load from a few threads, each sending `queued` webhooks with
/// fresh job ids until stopped (or until the server is gone), recording
/// which ids were answered 2xx and how often each status came.
struct Load {
    stop: Arc<AtomicBool>,
    acknowledged: Arc<Mutex<Vec<u64>>>,
    statuses: Arc<Mutex<BTreeMap<String, u64>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(base: &str, first_id: u64) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let acknowledged = Arc::new(Mutex::new(Vec::new()));
        let statuses = Arc::new(Mutex::new(BTreeMap::new()));
        let next = Arc::new(AtomicU64::new(first_id));
        let threads = (0..4)
            .map(|_| {
                let (stop, next) = (stop.clone(), next.clone());
                let (acknowledged, statuses) = (acknowledged.clone(), statuses.clone());
                let url = format!("{base}/webhooks/github");
                std::thread::spawn(move || {
                    let client = reqwest::blocking::Client::builder()
                        .timeout(Duration::from_secs(10))
                        .build()
                        .expect("client");
                    // Bounded: at most 20,000 webhooks per thread.
                    for _ in 0..20_000 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let id = next.fetch_add(1, Ordering::Relaxed);
                        let (status, gone) = match send(&client, &url, id) {
                            Ok(status) => (status.as_u16().to_string(), false),
                            Err(error) if error.is_timeout() => ("timeout".to_owned(), false),
                            // The server is gone: this load is over.
                            Err(_) => ("connection error".to_owned(), true),
                        };
                        if status.starts_with('2') {
                            acknowledged.lock().expect("lock").push(id);
                        }
                        *statuses.lock().expect("lock").entry(status).or_insert(0) += 1;
                        if gone {
                            break;
                        }
                    }
                })
            })
            .collect();
        Load {
            stop,
            acknowledged,
            statuses,
            threads,
        }
    }

    fn acknowledged(&self) -> usize {
        self.acknowledged.lock().expect("lock").len()
    }

    fn count(&self, status: &str) -> u64 {
        self.statuses
            .lock()
            .expect("lock")
            .get(status)
            .copied()
            .unwrap_or(0)
    }

    /// Stops the senders; the acknowledged ids and the status counts.
    fn finish(self) -> (Vec<u64>, BTreeMap<String, u64>) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads {
            thread.join().expect("sender thread");
        }
        let acknowledged = self.acknowledged.lock().expect("lock").clone();
        let statuses = self.statuses.lock().expect("lock").clone();
        (acknowledged, statuses)
    }
}

fn send(
    client: &reqwest::blocking::Client,
    url: &str,
    id: u64,
) -> reqwest::Result<reqwest::StatusCode> {
    let body = queued(id);
    client
        .post(url)
        .header("x-github-event", "workflow_job")
        .header("x-github-delivery", format!("delivery-{id}"))
        .header("x-hub-signature-256", sign(SECRET.as_bytes(), &body))
        .body(body)
        .send()
        .map(|response| response.status())
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

fn write_config(dir: &Path) {
    std::fs::write(
        dir.join("runway.toml"),
        format!(
            "[server]\nadmin_tokens = [\"{ADMIN}\"]\n[github]\nwebhook_secrets = [\"{SECRET}\"]\n\
             [telemetry]\nevent_log = \"events.log\"\n\
             [[pools]]\nname = \"default\"\nlabels = [\"self-hosted\", \"linux\"]\n"
        ),
    )
    .expect("config");
}

/// What a store outage may and may not have done under webhook load:
/// answers only 2xx or 503 (`during` names the outage), every 2xx'd job
/// stored, and the `probe` refused with 503 not stored.
fn assert_outage_answered_honestly(
    base: &str,
    statuses: &BTreeMap<String, u64>,
    acknowledged: &[u64],
    probe: u64,
    during: &str,
) {
    let unexpected: Vec<(&String, &u64)> = statuses
        .iter()
        .filter(|(status, _)| !status.starts_with('2') && status.as_str() != "503")
        .collect();
    assert!(
        unexpected.is_empty(),
        "only 2xx and 503 {during}, got {statuses:?}"
    );
    let stored = stored_external_ids(base);
    let lost: Vec<&u64> = acknowledged
        .iter()
        .filter(|id| !stored.contains(id))
        .collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged jobs lost, e.g. {:?}",
        lost.len(),
        &lost[..lost.len().min(5)]
    );
    assert!(!stored.contains(&probe), "a 503 changed nothing");
}

#[test]
fn every_acknowledged_webhook_survives_sigkill() {
    let dir = tempfile::tempdir().expect("dir");
    write_config(dir.path());
    let mut acknowledged = BTreeSet::new();
    for round in 0..ROUNDS {
        let (mut server, base) = start(dir.path(), &[]);
        let load = Load::start(&base, (round as u64 + 1) * 1_000_000);
        // Kill at a different moment each round, mid-stream.
        std::thread::sleep(Duration::from_millis(150 + 120 * round as u64));
        server.0.kill().expect("SIGKILL runway");
        server.0.wait().expect("reap");
        let (ids, _) = load.finish();
        assert!(
            !ids.is_empty(),
            "round {round}: some webhooks were acknowledged before the kill"
        );
        acknowledged.extend(ids);
    }
    let (server, base) = start(dir.path(), &[]);
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

/// PostgreSQL crashes and comes back under webhook load: while it is down,
/// `/readyz` is not ready and webhooks get 503 (never a 2xx for something
/// not committed, never a hang); runway recovers by itself, and every
/// webhook answered 2xx, before or after, is stored.
#[test]
fn a_postgres_outage_gets_503s_and_runway_recovers_without_a_restart() {
    let postgres = common::PrivatePostgres::start();
    let dir = tempfile::tempdir().expect("dir");
    write_config(dir.path());
    let url = postgres.url();
    let (_server, base) = start(dir.path(), &["--database", &url]);
    let load = Load::start(&base, 1_000_000);
    common::wait_until("webhooks acknowledged before the outage", 60, || {
        load.acknowledged() >= 200
    });

    postgres.crash();
    common::wait_until("/readyz to say not ready", 30, || {
        common::get(&base, "/readyz").0 == 503
    });
    // A hung database answers each write after the 5 s connect timeout:
    // the load's four threads see about four 503s every 5 s.
    common::wait_until("webhooks to get 503 during the outage", 60, || {
        load.count("503") >= 8
    });
    // One more, answered while the database is surely down: a 503 that
    // says nothing was changed, and indeed nothing is.
    let probe = 999_999_999;
    let client = common::client();
    let asked = std::time::Instant::now();
    let status = send(&client, &format!("{base}/webhooks/github"), probe).expect("an answer");
    eprintln!("probe answered {status} in {:?}", asked.elapsed());
    assert_eq!(status.as_u16(), 503);
    assert_eq!(common::get(&base, "/readyz").0, 503);

    postgres.resume();
    common::wait_until("/readyz to be ready again", 60, || {
        common::get(&base, "/readyz").0 == 200
    });
    let before = load.acknowledged();
    common::wait_until("webhooks acknowledged after the outage", 60, || {
        load.acknowledged() >= before + 200
    });
    let (acknowledged, statuses) = load.finish();

    assert_outage_answered_honestly(&base, &statuses, &acknowledged, probe, "during an outage");
    eprintln!(
        "{} acknowledged webhooks across a PostgreSQL crash, all stored; statuses {statuses:?}",
        acknowledged.len()
    );
    // The outage is in the event log, once a minute at most, not once per
    // failed request.
    let events = std::fs::read_to_string(dir.path().join("events.log")).unwrap_or_default();
    let said: Vec<serde_json::Value> = events
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|event| event["event"] == "store_unavailable")
        .collect();
    assert!(
        !said.is_empty() && said.len() <= 5,
        "store_unavailable events: {said:?}"
    );
    assert!(said
        .iter()
        .all(|e| e["failures"].as_u64().is_some_and(|n| n >= 1)));
}

/// A small file system of its own (tmpfs), unmounted when dropped: the
/// disk that fills up. Needs the right to mount, as CI's root has.
struct SmallDisk {
    path: std::path::PathBuf,
}

impl SmallDisk {
    fn mount(path: &Path, megabytes: u32) -> SmallDisk {
        std::fs::create_dir_all(path).expect("mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={megabytes}m"), "tmpfs"])
            .arg(path)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "this test mounts a small tmpfs to fill it up, which needs root (CI runs as root)"
        );
        SmallDisk {
            path: path.to_owned(),
        }
    }

    /// Fills the disk and keeps it full: a file takes every free byte, and
    /// every byte freed later (SQLite truncating its WAL, say), until the
    /// filler is removed.
    fn fill(&self) -> Filler {
        let path = self.path.join("filler");
        let stop = Arc::new(AtomicBool::new(false));
        let (filled, filled_flag) = (Arc::new(AtomicBool::new(false)), stop.clone());
        let (file_path, filled_at) = (path.clone(), filled.clone());
        let thread = std::thread::spawn(move || {
            use std::io::Write;
            let mut file = std::fs::File::create(&file_path).expect("filler");
            let chunk = vec![0u8; 4096];
            // Bounded: at most 10 minutes of top-ups.
            let deadline = std::time::Instant::now() + Duration::from_secs(600);
            while !filled_flag.load(Ordering::Relaxed) && std::time::Instant::now() < deadline {
                if file.write_all(&chunk).is_err() {
                    while file.write_all(&[0u8; 512]).is_ok() {}
                    filled_at.store(true, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        });
        common::wait_until("the disk to be full", 60, || filled.load(Ordering::Relaxed));
        Filler {
            path,
            stop,
            thread: Some(thread),
        }
    }
}

/// What keeps a [`SmallDisk`] full.
struct Filler {
    path: std::path::PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Filler {
    /// Stops topping up and frees the space.
    fn remove(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.join().expect("filler thread");
        }
        std::fs::remove_file(&self.path).expect("make room");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// The SQLite file's disk fills up under webhook load: webhooks get 503
/// (never a 2xx for something not committed), nothing is half-written (a
/// delivery refused while the disk was full is taken as new afterwards,
/// not as a duplicate of a delivery recorded without its job), and runway
/// takes writes again by itself once there is room, without a restart.
#[test]
fn a_full_disk_gets_503s_and_runway_recovers_when_there_is_room() {
    let dir = tempfile::tempdir().expect("dir");
    write_config(dir.path());
    let disk = SmallDisk::mount(&dir.path().join("data"), 24);
    let database = format!("sqlite://{}/runway.db", disk.path.display());
    let (_server, base) = start(dir.path(), &["--database", &database]);
    let load = Load::start(&base, 1_000_000);
    common::wait_until("webhooks acknowledged before the disk fills", 60, || {
        load.acknowledged() >= 200
    });

    let filler = disk.fill();
    common::wait_until("webhooks to get 503 on a full disk", 60, || {
        load.count("503") >= 20
    });
    // A delivery refused while the disk is full. (Not every write need
    // fail: SQLite reuses its WAL file's space after a checkpoint, so a
    // commit may still fit, and its 2xx is as durable as any.)
    let client = common::client();
    let url = format!("{base}/webhooks/github");
    let probe = (999_000_000..999_000_500)
        .find(|&id| send(&client, &url, id).expect("an answer").as_u16() == 503)
        .expect("a webhook refused with 503 while the disk is full");
    filler.remove();
    let before = load.acknowledged();
    common::wait_until("webhooks acknowledged once there is room", 60, || {
        load.acknowledged() >= before + 200
    });
    let (acknowledged, statuses) = load.finish();

    assert_outage_answered_honestly(
        &base,
        &statuses,
        &acknowledged,
        probe,
        "while the disk is full",
    );
    // The refused delivery again, now that there is room: taken as new,
    // so its job exists (no delivery was recorded without its job).
    let status = send(&client, &url, probe).expect("an answer");
    assert!(
        status.is_success(),
        "redelivery after the disk freed: {status}"
    );
    assert!(stored_external_ids(&base).contains(&probe));
    eprintln!(
        "{} acknowledged webhooks across a full disk, all stored; statuses {statuses:?}",
        acknowledged.len()
    );
}
