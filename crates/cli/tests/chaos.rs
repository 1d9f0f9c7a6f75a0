//! The chaos soak: three `runway serve` replicas on one PostgreSQL schema
//! behind a round-robin balancer, an `exec` provider whose instances all
//! replicas share (`contrib/garm-provider-local`, each instance a real
//! `runway agent --once`), jobs submitted through the job API with an
//! external id, and faults at random for a set time: kill -9 and restart of
//! a replica, SIGSTOP then SIGCONT, every database connection ended,
//! provider calls that fail or hang past their timeout. Then, from the
//! store, the shared cloud and the provider's call log:
//!
//! - every job acknowledged to the client completed (none lost);
//! - no job ran twice, except after its first runner was lost (listed);
//! - no instance is left that no runner accounts for (0 leaked);
//! - `max_runners` was never exceeded (sampled);
//! - no create, delete, start or stop was made by a replica after another
//!   had begun a later term (each call logs its caller's pid and time; each
//!   replica's log says when it began leading).
//!
//! `RUNWAY_CHAOS_SECONDS` sets how long faults are injected (default 180);
//! `RUNWAY_CHAOS_SEED` the seed. The report is printed; BENCHMARKS.md has a
//! longer run.

mod common;

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{client, runway, PgSchema};
use rand::{Rng, SeedableRng};

const ADMIN: &str = "chaos-admin-token";
const REPLICAS: usize = 3;
const MAX_RUNNERS: u64 = 6;

/// Seconds since the epoch of a log line's RFC 3339 timestamp
/// (`2026-11-26T21:03:29.969740Z …`).
fn log_time(line: &str) -> Option<f64> {
    let stamp = line.split_whitespace().next()?;
    let (date, time) = stamp.trim_end_matches('Z').split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.split(':');
    let (hh, mm): (i64, i64) = (t.next()?.parse().ok()?, t.next()?.parse().ok()?);
    let ss: f64 = t.next()?.parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + hh * 3_600 + mm * 60) as f64 + ss)
}

struct Replica {
    index: usize,
    port: u16,
    child: Option<Child>,
    /// Every pid this replica ran as.
    pids: Vec<u32>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

impl Replica {
    fn start(&mut self, dir: &Path, database: &str) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("replica-{}.log", self.index)))
            .expect("the replica's log");
        let child = runway(dir)
            .args(["serve", "--config", &format!("replica-{}.toml", self.index)])
            .args(["--database", database])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("runway serve");
        self.pids.push(child.id());
        self.child = Some(child);
        let url = format!("http://127.0.0.1:{}/healthz", self.port);
        common::wait_until("a replica to answer", 30, || {
            client()
                .get(&url)
                .send()
                .is_ok_and(|r| r.status().is_success())
        });
    }

    fn signal(&self, name: &str) {
        if let Some(child) = &self.child {
            let _ = std::process::Command::new("kill")
                .args([&format!("-{name}"), &child.id().to_string()])
                .status();
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn write_configs(dir: &Path, ports: &[u16], balancer: &str) {
    let provider = dir.join("provider.sh");
    std::fs::write(
        &provider,
        format!(
            "#!/bin/sh\n\
             d='{dir}'\n\
             echo \"$(date +%s.%N) $GARM_COMMAND $GARM_INSTANCE_ID $PPID\" >> \"$d/calls.log\"\n\
             case \"$GARM_COMMAND\" in CreateInstance|DeleteInstance)\n\
               [ -f \"$d/fault.fail\" ] && {{ echo 'injected failure' >&2; exit 1; }}\n\
               [ -f \"$d/fault.hang\" ] && sleep 8 ;;\n\
             esac\n\
             exec '{garm}'\n",
            dir = dir.display(),
            garm = common::contrib_provider().display(),
        ),
    )
    .unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&provider, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::write(
        dir.join("garm.conf"),
        format!(
            "state_dir={}\nboot=command\ncommand={} agent --once\nstop_grace=2\n",
            dir.join("cloud").display(),
            common::RUNWAY
        ),
    )
    .unwrap();
    for (i, port) in ports.iter().enumerate() {
        std::fs::write(
            dir.join(format!("replica-{i}.toml")),
            format!(
                r#"[server]
listen = "127.0.0.1:{port}"
public_url = "{balancer}"
database_max_connections = 6
admin_tokens = ["{ADMIN}"]

[queue]
max_attempts = 20

[runner_api]
poll_timeout = "2s"
lease = "10s"

[scaling]
interval = "500ms"

[providers.cloud]
kind = "exec"
executable = "{provider}"
config_file = "{dir}/garm.conf"
timeout = "5s"
max_instances = {MAX_RUNNERS}
boot_seconds = 2
list_lag = "0s"

[[pools]]
name = "default"
labels = ["self-hosted", "linux"]
max_runners = {MAX_RUNNERS}
boot_timeout = "60s"
idle_grace = "2s"
providers = ["cloud"]
"#,
                provider = provider.display(),
                dir = dir.display(),
            ),
        )
        .unwrap();
    }
}

/// Instances the shared cloud holds (garm-provider-local's state files).
fn cloud_instances(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("cloud"))
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
                .count()
        })
        .unwrap_or(0)
}

/// One HTTP client per thread, kept: its connections are reused instead
/// of a new one through the balancer for every request.
fn thread_client() -> reqwest::blocking::Client {
    thread_local! {
        static CLIENT: reqwest::blocking::Client = client();
    }
    CLIENT.with(Clone::clone)
}

fn api(balancer: &str, path: &str) -> Option<serde_json::Value> {
    thread_client()
        .get(format!("{balancer}{path}"))
        .bearer_auth(ADMIN)
        .send()
        .ok()
        .filter(|r| r.status().is_success())
        .and_then(|r| r.json().ok())
}

/// Submits job `id` until some replica acknowledges it (2xx): retries with
/// the same external id make it one job however many answers were lost.
fn submit_until_acknowledged(balancer: &str, id: u32, ran: &Path, stop: &AtomicBool) -> bool {
    let body = serde_json::json!({
        "labels": ["self-hosted", "linux"],
        "script": format!("echo chaos-{id} >> '{}'; sleep 1", ran.display()),
        "external_id": format!("chaos-{id}"),
        "timeout_seconds": 120,
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline && !stop.load(SeqCst) {
        let answer = thread_client()
            .post(format!("{balancer}/api/v1/jobs"))
            .bearer_auth(ADMIN)
            .json(&body)
            .send();
        if answer.is_ok_and(|r| r.status().is_success()) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    false
}

#[test]
fn a_chaos_soak_loses_doubles_and_leaks_nothing() {
    let seconds: u64 = std::env::var("RUNWAY_CHAOS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(180);
    let seed: u64 = std::env::var("RUNWAY_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(48);
    let schema = PgSchema::create("runway_chaos");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("cloud")).unwrap();
    let ports: Vec<u16> = (0..REPLICAS).map(|_| free_port()).collect();
    // Room for every connection of the run: clients, runners, samples.
    let balancer = common::Balancer::start_for(
        ports.iter().map(|p| format!("127.0.0.1:{p}")).collect(),
        200 * seconds as usize + 50_000,
    );
    write_configs(root, &ports, &balancer.url);
    let mut replicas: Vec<Replica> = ports
        .iter()
        .enumerate()
        .map(|(index, port)| Replica {
            index,
            port: *port,
            child: None,
            pids: Vec::new(),
        })
        .collect();
    for replica in &mut replicas {
        replica.start(root, &schema.scoped);
    }

    // Load: a job every 400 ms, each retried until acknowledged.
    let ran = root.join("ran.log");
    let stop_load = Arc::new(AtomicBool::new(false));
    let acknowledged = Arc::new(Mutex::new(Vec::<u32>::new()));
    let load = {
        let (balancer, ran, stop, acknowledged) = (
            balancer.url.clone(),
            ran.clone(),
            stop_load.clone(),
            acknowledged.clone(),
        );
        std::thread::spawn(move || {
            let mut id = 0;
            while !stop.load(SeqCst) && id < 20_000 {
                if submit_until_acknowledged(&balancer, id, &ran, &stop) {
                    acknowledged.lock().unwrap().push(id);
                }
                id += 1;
                std::thread::sleep(Duration::from_millis(400));
            }
        })
    };
    // Sampling: runners of the pool never above max_runners.
    let most_runners = Arc::new(AtomicU32::new(0));
    let sampling = {
        let (balancer, stop, most) = (
            balancer.url.clone(),
            stop_load.clone(),
            most_runners.clone(),
        );
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(3_600 * 3);
            while !stop.load(SeqCst) && Instant::now() < deadline {
                if let Some(pools) = api(&balancer, "/api/v1/pools") {
                    for pool in pools["pools"].as_array().cloned().unwrap_or_default() {
                        let live: u64 =
                            ["requested", "provisioning", "idle", "busy", "terminating"]
                                .iter()
                                .map(|s| pool["runners"][*s].as_u64().unwrap_or(0))
                                .sum();
                        most.fetch_max(live as u32, SeqCst);
                    }
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };

    // Faults.
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut faults: BTreeMap<&str, u32> = BTreeMap::new();
    let end = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(rng.gen_range(2_000..6_000)));
        let which = rng.gen_range(0..REPLICAS);
        match rng.gen_range(0..5) {
            0 => {
                *faults.entry("kill -9 and restart").or_default() += 1;
                replicas[which].kill();
                std::thread::sleep(Duration::from_millis(rng.gen_range(500..3_000)));
                replicas[which].start(root, &schema.scoped);
            }
            1 => {
                *faults.entry("SIGSTOP 5-15 s").or_default() += 1;
                replicas[which].signal("STOP");
                std::thread::sleep(Duration::from_millis(rng.gen_range(5_000..15_000)));
                replicas[which].signal("CONT");
            }
            2 => {
                *faults.entry("database connections ended").or_default() += 1;
                let _ = schema.psql(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid() \
                     AND backend_type = 'client backend'",
                );
            }
            3 => {
                *faults.entry("provider calls fail").or_default() += 1;
                std::fs::write(root.join("fault.fail"), "").unwrap();
                std::thread::sleep(Duration::from_millis(rng.gen_range(2_000..5_000)));
                let _ = std::fs::remove_file(root.join("fault.fail"));
            }
            _ => {
                *faults
                    .entry("provider calls hang past their timeout")
                    .or_default() += 1;
                std::fs::write(root.join("fault.hang"), "").unwrap();
                std::thread::sleep(Duration::from_millis(rng.gen_range(3_000..9_000)));
                let _ = std::fs::remove_file(root.join("fault.hang"));
            }
        }
    }
    let last_fault = Instant::now();
    stop_load.store(true, SeqCst);
    load.join().unwrap();

    // Convergence: every acknowledged job completed, then no runner and no
    // instance left (min_idle 0, ephemeral runners).
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(
        acknowledged.len() >= 10,
        "too little load: {acknowledged:?}"
    );
    let completed = || {
        api(&balancer.url, "/api/v1/jobs?state=completed&limit=10000")
            .and_then(|v| v["jobs"].as_array().map(Vec::len))
            .unwrap_or(0)
    };
    let mut converged = None;
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        if completed() >= acknowledged.len() {
            converged = Some(last_fault.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let jobs: Vec<serde_json::Value> = api(&balancer.url, "/api/v1/jobs?limit=10000")
        .and_then(|v| v["jobs"].as_array().cloned())
        .unwrap_or_default();
    let by_external: BTreeMap<String, serde_json::Value> = jobs
        .iter()
        .map(|j| {
            (
                j["external_id"].as_str().unwrap_or_default().to_owned(),
                j.clone(),
            )
        })
        .collect();
    let lost: Vec<u32> = acknowledged
        .iter()
        .copied()
        .filter(|id| {
            by_external
                .get(&format!("chaos-{id}"))
                .is_none_or(|j| j["state"] != "completed")
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut settled = false;
    while Instant::now() < deadline {
        let live = api(&balancer.url, "/api/v1/runners")
            .and_then(|v| v["runners"].as_array().cloned())
            .map(|runners| {
                runners
                    .iter()
                    .filter(|r| {
                        !matches!(
                            r["state"].as_str(),
                            Some("terminated" | "failed" | "crashed")
                        )
                    })
                    .count()
            });
        if live == Some(0) && cloud_instances(root) == 0 {
            settled = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let leaked = cloud_instances(root);
    stop_load.store(true, SeqCst);
    sampling.join().unwrap();

    // Runs per job, from the jobs' own output.
    let runs = std::fs::read_to_string(&ran).unwrap_or_default();
    let mut counted: BTreeMap<String, u32> = BTreeMap::new();
    for line in runs.lines() {
        *counted.entry(line.trim().to_owned()).or_default() += 1;
    }
    let mut doubled = Vec::new();
    let mut requeued_runs = Vec::new();
    for (external, n) in &counted {
        if *n > 1 {
            let attempts = by_external
                .get(external)
                .and_then(|j| j["attempts"].as_u64())
                .unwrap_or(0);
            if attempts >= u64::from(*n) - 1 {
                requeued_runs.push(format!(
                    "{external} ran {n}x after {attempts} lost runner(s)"
                ));
            } else {
                doubled.push(format!("{external} ran {n}x with {attempts} requeues"));
            }
        }
    }

    // Provider calls by a replica that was not the leader.
    let mut began: Vec<(f64, u32)> = Vec::new(); // (time, pid) a term began
    for replica in &replicas {
        let log = std::fs::read_to_string(root.join(format!("replica-{}.log", replica.index)))
            .unwrap_or_default();
        // Lines are in pid order: each incarnation appended after the last.
        let mut incarnation = 0usize;
        for line in log.lines() {
            if line.contains("runway listening") {
                incarnation += 1;
            }
            if line.contains("leading: this replica runs") {
                if let (Some(at), Some(pid)) = (
                    log_time(line),
                    replica.pids.get(incarnation.saturating_sub(1)),
                ) {
                    began.push((at, *pid));
                }
            }
        }
    }
    began.sort_by(|a, b| a.0.total_cmp(&b.0));
    let calls = std::fs::read_to_string(root.join("calls.log")).unwrap_or_default();
    let mut deposed_calls = Vec::new();
    let mut mutating = 0;
    const TOLERANCE: f64 = 0.5;
    for line in calls.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        let (Some(at), Some(command), Some(pid)) = (
            parts.first().and_then(|t| t.parse::<f64>().ok()),
            parts.get(1),
            parts.last().and_then(|p| p.parse::<u32>().ok()),
        ) else {
            continue;
        };
        if !matches!(
            *command,
            "CreateInstance" | "DeleteInstance" | "StartInstance" | "StopInstance"
        ) {
            continue;
        }
        mutating += 1;
        // The caller's own latest term began before the call (its log line
        // comes after the term's commit and before any call of that term);
        // another term begun after it and more than TOLERANCE before the
        // call (the time between a term's commit and its log line) means
        // the caller no longer led.
        let own = began
            .iter()
            .rev()
            .find(|(started, p)| *p == pid && *started <= at)
            .map(|(started, _)| *started);
        let deposed = match own {
            None => true,
            Some(own) => began
                .iter()
                .any(|(started, p)| *p != pid && *started > own && *started + TOLERANCE < at),
        };
        if deposed {
            // The terms begun around it, for the report.
            let around: Vec<String> = began
                .iter()
                .filter(|(started, _)| (started - at).abs() < 30.0)
                .map(|(started, p)| format!("{:+.3}s pid {p}", started - at))
                .collect();
            let led = if began.iter().any(|(_, p)| *p == pid) {
                ""
            } else {
                " (never led)"
            };
            deposed_calls.push(format!("{line}{led}; terms begun {around:?}"));
        }
    }
    for replica in &mut replicas {
        replica.kill();
    }

    let mut report = String::new();
    let _ = writeln!(
        report,
        "chaos soak: {seconds} s of faults, seed {seed}; faults {faults:?}"
    );
    let _ = writeln!(
        report,
        "jobs acknowledged {}, lost {}, ran twice without a lost runner {}, re-run after a lost runner {}",
        acknowledged.len(),
        lost.len(),
        doubled.len(),
        requeued_runs.len()
    );
    let _ = writeln!(
        report,
        "provider calls that change something {mutating}, by a replica that did not lead {}; most runners at once {} (max {MAX_RUNNERS}); instances leaked {leaked}; converged {:?} after the last fault",
        deposed_calls.len(),
        most_runners.load(SeqCst),
        converged
    );
    for line in requeued_runs.iter().chain(&doubled).chain(&deposed_calls) {
        let _ = writeln!(report, "  {line}");
    }
    eprintln!("{report}");
    assert!(lost.is_empty(), "lost jobs {lost:?}\n{report}");
    assert!(doubled.is_empty(), "{report}");
    assert!(deposed_calls.is_empty(), "{report}");
    assert!(settled && leaked == 0, "{report}");
    assert!(
        u64::from(most_runners.load(SeqCst)) <= MAX_RUNNERS,
        "{report}"
    );
    assert!(converged.is_some(), "{report}");
}
