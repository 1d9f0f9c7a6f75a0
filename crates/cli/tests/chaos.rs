//! The chaos soak: three `runway serve` replicas on one PostgreSQL (a
//! private cluster, so that it can be restarted) behind a round-robin
//! balancer, with two kinds of work:
//!
//! - runway-API jobs submitted with an external id to a pool whose `exec`
//!   provider's instances all replicas share (`contrib/garm-provider-local`,
//!   each instance a real `runway agent --once`);
//! - GitHub jobs from the fake GitHub of the server's tests, whose
//!   `workflow_job` webhooks are dropped, duplicated and reordered, run on
//!   just-in-time runners (a script that says it is online and waits for
//!   the fake GitHub to give it a job) of a second shared `exec` pool.
//!
//! Each pool is served by two `exec` providers of the same kind on the
//! same backend (one executable, configuration and cloud): each must list,
//! count and delete only its own instances.
//!
//! Faults at random for a set time: kill -9 and restart of a replica,
//! SIGSTOP then SIGCONT, PostgreSQL crashed and restarted, every database
//! connection ended, provider calls that fail, hang past their timeout or
//! answer slowly, GitHub answering bursts of 5xx and 429 to runner
//! deregistrations (for 2-8 s each), and late creates (the call hangs
//! past its timeout while the instance appears 1-20 s later: most
//! register and take a job, a third are duds whose runner exits at once).
//! Then, from the store, the shared clouds, the provider's call log and
//! the fake GitHub's:
//!
//! - every job acknowledged to the client completed, and every GitHub job
//!   ran (none lost);
//! - no job ran twice, except after its first runner was lost (listed);
//! - no instance is left that no runner accounts for (0 leaked), no
//!   runner is left registered at GitHub (0 stale registrations), and no
//!   runner with a job was stopped under it;
//! - each pool's `max_runners` was never exceeded (sampled);
//! - no create, delete, start or stop (the first pool keeps a stock of
//!   stopped runners, so its machines are stopped and started), and no
//!   GitHub JIT configuration,
//!   deregistration or redelivery request, was made by a replica after
//!   another had begun acting in a later term (each provider call logs
//!   its caller's pid and time; each replica incarnation presents GitHub a
//!   token of its own; each replica's log says when it began acting, which
//!   a replica that took the lead over does one silence after it took the
//!   lock, once any lease of the replica before it has run out).
//!
//! A second, directed test ends the leader's database session three times
//! while provider calls are slow, and checks no call is made by a replica
//! between its "lost the lead" log line and its next term (it fails with
//! `RUNWAY_CHAOS_UNFENCED=1`: calls 1.7 s after the loss).
//!
//! `RUNWAY_CHAOS_SECONDS` sets how long faults are injected (default 180);
//! `RUNWAY_CHAOS_SEED` the seed; `RUNWAY_CHAOS_UNFENCED=1` runs the
//! replicas with fencing switched off (`RUNWAY_UNSAFE_NO_FENCING`), a
//! control run that must fail. The report is printed; BENCHMARKS.md has a
//! longer run and a control run.

use crate::common;
use runway_testkit::fake_github;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use common::{client, runway, PrivatePostgres};
use fake_github::{Auth, FakeGithub, HOOK_SECRET};
use rand::{Rng, SeedableRng};

const ADMIN: &str = "chaos-admin-token";
const REPLICAS: usize = 3;
/// The runway-API pool's bound, and the GitHub pool's.
const MAX_RUNNERS: u64 = 6;
const MAX_GITHUB_RUNNERS: u64 = 4;
/// Jobs submitted but not yet run that the load keeps at most: it follows
/// what the pool gets through instead of outrunning it.
const MOST_OUTSTANDING: usize = 12;
/// GitHub jobs queued or running at most.
const MOST_GITHUB_OUTSTANDING: usize = 8;

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
    /// Every pid this replica ran as, and the GitHub token each
    /// incarnation presented.
    pids: Vec<u32>,
    tokens: Vec<String>,
}

impl Replica {
    fn start(&mut self, dir: &Path, database: &str, github: &FakeGithub) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("replica-{}.log", self.index)))
            .expect("the replica's log");
        let token = format!("ghp_chaos-replica-{}-{}", self.index, self.pids.len());
        github.lock().also_accepted.push(token.clone());
        let child = runway(dir)
            .args(["serve", "--config", &format!("replica-{}.toml", self.index)])
            .args(["--database", database])
            .env("RUNWAY_CHAOS_GITHUB_TOKEN", &token)
            // The control run: fencing off, the soak must fail.
            .env(
                "RUNWAY_UNSAFE_NO_FENCING",
                std::env::var("RUNWAY_CHAOS_UNFENCED").unwrap_or_default(),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("runway serve");
        self.pids.push(child.id());
        self.tokens.push(token);
        self.child = Some(child);
        let url = format!("http://127.0.0.1:{}/healthz", self.port);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !client()
            .get(&url)
            .send()
            .is_ok_and(|r| r.status().is_success())
        {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() || Instant::now() > deadline {
                let log = std::fs::read_to_string(dir.join(format!("replica-{}.log", self.index)))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                panic!(
                    "replica {} did not come up ({exited:?}); its log ends:\n{}",
                    self.index,
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
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

fn executable(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn write_configs(dir: &Path, ports: &[u16], balancer: &str, github: &str) {
    // Every provider call is logged with its time and caller; the fault
    // files make the mutating ones fail, hang past the 5 s timeout, or
    // answer slowly within it; `fault.late` makes a create hang past its
    // timeout while its instance appears 1-20 s later, a third of them
    // duds (their runner exits at once).
    let provider = dir.join("provider.sh");
    executable(
        &provider,
        &format!(
            "#!/bin/sh\n\
             d='{dir}'\n\
             echo \"$(date +%s.%N) $GARM_COMMAND $GARM_INSTANCE_ID $PPID\" >> \"$d/calls.log\"\n\
             if [ \"$GARM_COMMAND\" = CreateInstance ] && [ -f \"$d/fault.late\" ]; then\n\
               cat > \"$d/late.$$\"\n\
               n=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[\"name\"])' \"$d/late.$$\")\n\
               r=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')\n\
               [ $((r % 3)) = 0 ] && touch \"$d/dud/$n\"\n\
               ( sleep $((r % 20 + 1)); exec '{garm}' < \"$d/late.$$\" > /dev/null 2>&1 ) &\n\
               exec sleep 8\n\
             fi\n\
             case \"$GARM_COMMAND\" in CreateInstance|DeleteInstance)\n\
               [ -f \"$d/fault.fail\" ] && {{ echo 'injected failure' >&2; exit 1; }}\n\
               [ -f \"$d/fault.hang\" ] && sleep 8\n\
               [ -f \"$d/fault.slow\" ] && sleep 3 ;;\n\
             esac\n\
             exec '{garm}'\n",
            dir = dir.display(),
            garm = common::contrib_provider().display(),
        ),
    );
    // A just-in-time runner: says it is online (its pid, under its name)
    // and waits until the fake GitHub has run a job on it.
    let github_runner = dir.join("github-runner.sh");
    executable(
        &github_runner,
        &format!(
            "#!/bin/sh\n\
             d='{dir}'\n\
             [ -n \"$RUNWAY_JIT_CONFIG\" ] || {{ echo 'no JIT configuration' >&2; exit 3; }}\n\
             [ -e \"$d/dud/$RUNWAY_RUNNER_NAME\" ] && exit 4\n\
             echo $$ > \"$d/online/$RUNWAY_RUNNER_NAME\"\n\
             i=0\n\
             while [ $i -lt 1500 ] && [ ! -e \"$d/done/$RUNWAY_RUNNER_NAME\" ]; do sleep 0.2; i=$((i+1)); done\n",
            dir = dir.display(),
        ),
    );
    // A runway-API runner: `runway agent --once`, unless it is a dud.
    let agent = dir.join("agent.sh");
    executable(
        &agent,
        &format!(
            "#!/bin/sh\n\
             [ -e '{dir}/dud/'\"$RUNWAY_RUNNER_NAME\" ] && exit 4\n\
             exec '{runway}' agent --once\n",
            dir = dir.display(),
            runway = common::RUNWAY,
        ),
    );
    for (name, state, command) in [
        ("garm.conf", "cloud", agent.display().to_string()),
        (
            "garm-github.conf",
            "cloud-github",
            github_runner.display().to_string(),
        ),
    ] {
        std::fs::write(
            dir.join(name),
            format!(
                "state_dir={}\nboot=command\ncommand={command}\nstop_grace=2\n",
                dir.join(state).display(),
            ),
        )
        .unwrap();
    }
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

[github]
api_url = "{github}"
token = "env:RUNWAY_CHAOS_GITHUB_TOKEN"
webhook_secrets = ["{HOOK_SECRET}"]
deliveries = "orgs/octo-org/hooks/9"
redeliver_interval = "2s"

# It keeps the pool's stock of stopped runners: its machines are
# stopped (StopInstance) once up and started (StartInstance) for jobs.
[providers.cloud]
kind = "exec"
executable = "{provider}"
config_file = "{dir}/garm.conf"
timeout = "5s"
max_instances = {half_runners}
boot_seconds = 2
list_lag = "0s"
resume_seconds = 1

# A second provider of the same kind on the same backend (the same
# executable, configuration and cloud): each must see only its own.
[providers.cloud-2]
kind = "exec"
executable = "{provider}"
config_file = "{dir}/garm.conf"
timeout = "5s"
max_instances = {half_runners}
boot_seconds = 2
list_lag = "0s"

[providers.github-cloud]
kind = "exec"
executable = "{provider}"
config_file = "{dir}/garm-github.conf"
timeout = "5s"
max_instances = {half_github}
boot_seconds = 2
list_lag = "0s"

[providers.github-cloud-2]
kind = "exec"
executable = "{provider}"
config_file = "{dir}/garm-github.conf"
timeout = "5s"
max_instances = {half_github}
boot_seconds = 2
list_lag = "0s"

[[pools]]
name = "default"
labels = ["self-hosted", "linux"]
max_runners = {MAX_RUNNERS}
boot_timeout = "60s"
idle_grace = "2s"
min_stopped = 1
max_stopped = 2
providers = ["cloud", "cloud-2"]

[[pools]]
name = "github"
labels = ["self-hosted", "chaos"]
max_runners = {MAX_GITHUB_RUNNERS}
boot_timeout = "60s"
idle_grace = "2s"
providers = ["github-cloud", "github-cloud-2"]
[pools.github]
org = "octo-org"
"#,
                provider = provider.display(),
                dir = dir.display(),
                half_runners = MAX_RUNNERS / 2,
                half_github = MAX_GITHUB_RUNNERS / 2,
            ),
        )
        .unwrap();
    }
}

/// Instances a shared cloud holds (garm-provider-local's state files).
fn cloud_instances(cloud: &Path) -> usize {
    std::fs::read_dir(cloud)
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

/// Distinct jobs that ran, from their own output.
fn jobs_run(ran: &Path) -> usize {
    std::fs::read_to_string(ran)
        .map(|text| text.lines().collect::<BTreeSet<_>>().len())
        .unwrap_or(0)
}

/// Whether process `pid` runs (exists and is not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// What the fake GitHub's side of the soak did.
#[derive(Debug, Default)]
struct GithubFigures {
    queued: u64,
    completed: u64,
    webhooks: u64,
    dropped: u64,
    duplicated: u64,
    reordered: u64,
    /// Runners stopped while GitHub had given them a job.
    busy_stopped: Vec<String>,
}

/// GitHub's side: queues jobs (while `stop_queueing` is unset), sends
/// their webhooks with faults, hands each queued job to an online runner
/// as GitHub would (any runner with matching labels, oldest job first),
/// and completes it a moment later; until `stop` is set.
fn drive_github(
    fake: FakeGithub,
    runtime: tokio::runtime::Handle,
    root: PathBuf,
    seed: u64,
    stop_queueing: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> GithubFigures {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x6769_7468);
    let mut figures = GithubFigures::default();
    let mut held: Vec<(u64, &'static str)> = Vec::new();
    // name -> (pid, job, since)
    let mut running: BTreeMap<String, (u32, u64, Instant)> = BTreeMap::new();
    let mut served: BTreeSet<String> = BTreeSet::new();
    let mut next_job = 9_000u64;
    let mut last_queued = Instant::now();
    let deliver = |id: u64, action: &'static str, drop: bool| {
        let fake = FakeGithub {
            url: fake.url.clone(),
            state: fake.state.clone(),
        };
        runtime.spawn(async move { fake.deliver(id, action, drop).await });
    };
    let send = |rng: &mut rand::rngs::StdRng,
                figures: &mut GithubFigures,
                held: &mut Vec<(u64, &'static str)>,
                id: u64,
                action: &'static str| {
        figures.webhooks += 1;
        match rng.gen_range(0..100) {
            0..15 => {
                figures.dropped += 1;
                deliver(id, action, true);
            }
            15..30 => {
                figures.duplicated += 1;
                deliver(id, action, false);
                deliver(id, action, false);
            }
            30..45 => {
                figures.reordered += 1;
                held.push((id, action));
            }
            _ => deliver(id, action, false),
        }
    };
    let deadline = Instant::now() + Duration::from_secs(3_600 * 3);
    while !stop.load(SeqCst) && Instant::now() < deadline {
        // Queue a job now and then, while fewer than the bound wait.
        let outstanding = fake
            .lock()
            .jobs
            .values()
            .filter(|j| j.status != "completed")
            .count();
        if !stop_queueing.load(SeqCst)
            && last_queued.elapsed() > Duration::from_millis(1_500)
            && outstanding < MOST_GITHUB_OUTSTANDING
        {
            next_job += 1;
            fake.queue_job(next_job, &["self-hosted", "chaos"]);
            figures.queued += 1;
            last_queued = Instant::now();
            send(&mut rng, &mut figures, &mut held, next_job, "queued");
        }
        // Held webhooks go out later, behind newer ones.
        let mut index = 0;
        while index < held.len() {
            if stop_queueing.load(SeqCst) || rng.gen_range(0..4) == 0 {
                let (id, action) = held.remove(index);
                deliver(id, action, false);
            } else {
                index += 1;
            }
        }
        // GitHub gives the oldest queued job to an online runner.
        let online: Vec<(String, u32)> = std::fs::read_dir(root.join("online"))
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter_map(|e| {
                        let name = e.file_name().to_string_lossy().into_owned();
                        let pid = std::fs::read_to_string(e.path())
                            .ok()?
                            .trim()
                            .parse()
                            .ok()?;
                        Some((name, pid))
                    })
                    .collect()
            })
            .unwrap_or_default();
        for (name, pid) in online {
            if served.contains(&name) || !alive(pid) {
                continue;
            }
            let job = fake.give_oldest_queued_job(&name);
            if let Some(job) = job {
                served.insert(name.clone());
                running.insert(name, (pid, job, Instant::now()));
                send(&mut rng, &mut figures, &mut held, job, "in_progress");
            }
        }
        // A job runs 1.5 s; a runner stopped meanwhile fails it.
        let finished: Vec<String> = running
            .iter()
            .filter(|(_, (_, _, since))| since.elapsed() > Duration::from_millis(1_500))
            .map(|(name, _)| name.clone())
            .collect();
        for name in finished {
            let Some((pid, job, _)) = running.remove(&name) else {
                continue;
            };
            let conclusion = if alive(pid) {
                "success"
            } else {
                figures.busy_stopped.push(format!("{name} (job {job})"));
                "failure"
            };
            fake.complete_job(job, conclusion);
            figures.completed += 1;
            let _ = std::fs::write(root.join("done").join(&name), "");
            send(&mut rng, &mut figures, &mut held, job, "completed");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    figures
}

/// When each term's holder began acting (making side effects): (time,
/// pid) from every replica's log. No call of a term comes before it: the
/// line is logged right after the flag every gate reads is set.
fn terms_begun(root: &Path, replicas: &[Replica]) -> Vec<(f64, u32)> {
    logged(root, replicas, "acting: this replica runs")
}

/// When a line holding `needle` was logged: (time, pid) from every
/// replica's log, in time order.
fn logged(root: &Path, replicas: &[Replica], needle: &str) -> Vec<(f64, u32)> {
    let mut found = Vec::new();
    for replica in replicas {
        let log = std::fs::read_to_string(root.join(format!("replica-{}.log", replica.index)))
            .unwrap_or_default();
        // Lines are in pid order: each incarnation appended after the last.
        let mut incarnation = 0usize;
        for line in log.lines() {
            if line.contains("runway listening") {
                incarnation += 1;
            }
            if line.contains(needle) {
                if let (Some(at), Some(pid)) = (
                    log_time(line),
                    replica.pids.get(incarnation.saturating_sub(1)),
                ) {
                    found.push((at, *pid));
                }
            }
        }
    }
    found.sort_by(|a, b| a.0.total_cmp(&b.0));
    found
}

/// The provider calls that change something: (time, command, pid).
fn mutating_calls(root: &Path) -> Vec<(f64, String, u32)> {
    std::fs::read_to_string(root.join("calls.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let parts: Vec<&str> = line.split_whitespace().collect();
            let at = parts.first()?.parse::<f64>().ok()?;
            let command = *parts.get(1)?;
            let pid = parts.last()?.parse::<u32>().ok()?;
            matches!(
                command,
                "CreateInstance" | "DeleteInstance" | "StartInstance" | "StopInstance"
            )
            .then(|| (at, command.to_owned(), pid))
        })
        .collect()
}

/// Why a side effect by `pid` at `at` was made by a replica that no longer
/// led, or `None` when its caller led. The caller's own latest term began
/// acting before the call; another term that began acting after it and
/// before the call means two replicas' side effects overlapped. No
/// tolerance: a replica that takes the lead over acts one whole silence
/// (5 s here) after it took the lock, and the lease of the one before ran
/// out a fifth of that earlier by its own clock, so only a call spawned
/// more than a second after it passed its last gate could land there.
fn deposed(began: &[(f64, u32)], pid: u32, at: f64) -> Option<String> {
    let own = began
        .iter()
        .rev()
        .find(|(started, p)| *p == pid && *started <= at)
        .map(|(started, _)| *started);
    let deposed = match own {
        None => true,
        Some(own) => began
            .iter()
            .any(|(started, p)| *p != pid && *started > own && *started < at),
    };
    deposed.then(|| {
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
        format!("by pid {pid}{led}; terms begun {around:?}")
    })
}

/// Replicas on a private PostgreSQL behind a balancer, with the fake
/// GitHub and the shared clouds, all started.
struct Cluster {
    database: PrivatePostgres,
    runtime: tokio::runtime::Runtime,
    github: FakeGithub,
    dir: tempfile::TempDir,
    balancer: common::Balancer,
    replicas: Vec<Replica>,
}

impl Cluster {
    /// `count` replicas; the balancer serves at most `connections`.
    fn start(count: usize, connections: usize) -> Cluster {
        let database = PrivatePostgres::start();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let github = runtime.block_on(FakeGithub::start(1_000_000, Auth::Token));
        github.lock().busy_lag = Duration::from_secs(2);
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for sub in ["cloud", "cloud-github", "online", "done", "dud"] {
            std::fs::create_dir_all(root.join(sub)).unwrap();
        }
        let ports: Vec<u16> = (0..count).map(|_| common::free_port()).collect();
        let balancer = common::Balancer::start_for(
            ports.iter().map(|p| format!("127.0.0.1:{p}")).collect(),
            connections,
        );
        github.lock().webhook_url = Some(format!("{}/webhooks/github", balancer.url));
        write_configs(root, &ports, &balancer.url, &github.url);
        let mut replicas: Vec<Replica> = ports
            .iter()
            .enumerate()
            .map(|(index, port)| Replica {
                index,
                port: *port,
                child: None,
                pids: Vec::new(),
                tokens: Vec::new(),
            })
            .collect();
        for replica in &mut replicas {
            replica.start(root, &database.url(), &github);
        }
        Cluster {
            database,
            runtime,
            github,
            dir,
            balancer,
            replicas,
        }
    }
}

/// A leader whose database session is ended (every client connection, as
/// an administrator or a failover would) makes no provider call from the
/// moment it logs the loss until it leads again: however its rounds in
/// flight go on, nothing passes the gates; and none after the replica that
/// took over began acting (the ended session freed the lock at once, while
/// the old holder's lease still ran). Three times, under load.
#[test]
fn a_leader_whose_database_session_ends_makes_no_call_until_it_leads_again() {
    let Cluster {
        database,
        runtime: _runtime,
        github: _github,
        dir,
        balancer,
        mut replicas,
    } = Cluster::start(2, 5_000);
    let root = dir.path();
    let stop = AtomicBool::new(false);
    let ran = root.join("ran.log");
    let calls_now = || mutating_calls(root).len();
    for round in 0..3u32 {
        let before = calls_now();
        for id in round * 12..(round + 1) * 12 {
            assert!(submit_until_acknowledged(&balancer.url, id, &ran, &stop));
        }
        common::wait_until("the leader to make calls", 60, || calls_now() > before + 2);
        let lost_before = logged(root, &replicas, "lost the lead").len();
        // Slow provider calls: some are in flight or queued when the
        // session ends.
        std::fs::write(root.join("fault.slow"), "").unwrap();
        std::thread::sleep(Duration::from_millis(1_500));
        let _ = database.psql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'",
        );
        common::wait_until(
            &format!("round {round}: a leader to log its loss"),
            30,
            || logged(root, &replicas, "lost the lead").len() > lost_before,
        );
        // Let whatever was in flight run its course.
        std::thread::sleep(Duration::from_secs(4));
        let _ = std::fs::remove_file(root.join("fault.slow"));
    }
    let lost = logged(root, &replicas, "lost the lead");
    let began = terms_begun(root, &replicas);
    let mut after_loss = Vec::new();
    for (at, command, pid) in mutating_calls(root) {
        // The caller's latest loss and latest term before the call.
        let last_lost = lost
            .iter()
            .rev()
            .find(|(t, p)| *p == pid && *t <= at)
            .map(|(t, _)| *t);
        let last_began = began
            .iter()
            .rev()
            .find(|(t, p)| *p == pid && *t <= at)
            .map(|(t, _)| *t);
        if let Some(lost_at) = last_lost {
            if last_began.is_none_or(|began_at| began_at < lost_at) {
                after_loss.push(format!(
                    "{at:.3} {command} by {pid}, {:.3} s after it logged the loss",
                    at - lost_at
                ));
            }
        }
    }
    for replica in &mut replicas {
        replica.kill();
    }
    // Nor does its last call overlap the next leader's: that one acts only
    // once the lease the ended session's holder renewed has run out.
    let overlapping: Vec<String> = mutating_calls(root)
        .into_iter()
        .filter_map(|(at, command, pid)| {
            deposed(&began, pid, at).map(|why| format!("{at:.3} {command} {pid}: {why}"))
        })
        .collect();
    assert!(lost.len() >= 3, "{lost:?}");
    assert!(after_loss.is_empty(), "{after_loss:#?}");
    assert!(overlapping.is_empty(), "{overlapping:#?}");
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
    let Cluster {
        database,
        runtime,
        github,
        dir,
        balancer,
        mut replicas,
    } = Cluster::start(REPLICAS, 300 * seconds as usize + 50_000);
    let root = dir.path();

    // Load: a job every 400 ms while fewer than MOST_OUTSTANDING wait, each
    // retried until acknowledged.
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
                let outstanding = acknowledged
                    .lock()
                    .unwrap()
                    .len()
                    .saturating_sub(jobs_run(&ran));
                if outstanding < MOST_OUTSTANDING {
                    if submit_until_acknowledged(&balancer, id, &ran, &stop) {
                        acknowledged.lock().unwrap().push(id);
                    }
                    id += 1;
                }
                std::thread::sleep(Duration::from_millis(400));
            }
        })
    };
    let stop_github = Arc::new(AtomicBool::new(false));
    let driver = {
        let fake = FakeGithub {
            url: github.url.clone(),
            state: github.state.clone(),
        };
        let (handle, root, stop_queueing, stop) = (
            runtime.handle().clone(),
            root.to_owned(),
            stop_load.clone(),
            stop_github.clone(),
        );
        std::thread::spawn(move || drive_github(fake, handle, root, seed, stop_queueing, stop))
    };
    // Sampling: each pool's runners never above its max_runners.
    let most_runners = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));
    let sampling = {
        let (balancer, stop, most) = (
            balancer.url.clone(),
            stop_github.clone(),
            most_runners.clone(),
        );
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(3_600 * 3);
            while !stop.load(SeqCst) && Instant::now() < deadline {
                // A stopped runner of the stock counts only once started.
                if let Some(runners) = api(&balancer, "/api/v1/runners") {
                    let mut live = BTreeMap::<String, u64>::new();
                    for runner in runners["runners"].as_array().into_iter().flatten() {
                        let counted = matches!(
                            runner["state"].as_str(),
                            Some("requested" | "provisioning" | "idle" | "busy" | "terminating")
                        ) && runner["stock"] != true;
                        if counted {
                            let pool = runner["pool"].as_str().unwrap_or_default().to_owned();
                            *live.entry(pool).or_default() += 1;
                        }
                    }
                    let mut most = most.lock().unwrap();
                    for (pool, live) in live {
                        let entry = most.entry(pool).or_default();
                        *entry = (*entry).max(live);
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
    let provider_fault = |name: &str, millis: u64| {
        std::fs::write(root.join(name), "").unwrap();
        std::thread::sleep(Duration::from_millis(millis));
        let _ = std::fs::remove_file(root.join(name));
    };
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(rng.gen_range(2_000..6_000)));
        let which = rng.gen_range(0..REPLICAS);
        match rng.gen_range(0..9) {
            0 => {
                *faults.entry("kill -9 and restart").or_default() += 1;
                replicas[which].kill();
                std::thread::sleep(Duration::from_millis(rng.gen_range(500..3_000)));
                replicas[which].start(root, &database.url(), &github);
            }
            1 => {
                *faults.entry("SIGSTOP 5-20 s").or_default() += 1;
                replicas[which].signal("STOP");
                std::thread::sleep(Duration::from_millis(rng.gen_range(5_000..20_000)));
                replicas[which].signal("CONT");
            }
            2 => {
                *faults.entry("database connections ended").or_default() += 1;
                let _ = database.psql(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'",
                );
            }
            3 => {
                *faults
                    .entry("PostgreSQL crashed and restarted")
                    .or_default() += 1;
                database.crash();
                std::thread::sleep(Duration::from_millis(rng.gen_range(1_000..5_000)));
                database.resume();
            }
            4 => {
                *faults.entry("provider calls fail").or_default() += 1;
                provider_fault("fault.fail", rng.gen_range(2_000..5_000));
            }
            5 => {
                *faults.entry("provider calls answer slowly").or_default() += 1;
                provider_fault("fault.slow", rng.gen_range(3_000..9_000));
            }
            7 => {
                *faults
                    .entry("GitHub answers 5xx and 429 to deregistrations")
                    .or_default() += 1;
                let statuses = [
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    axum::http::StatusCode::TOO_MANY_REQUESTS,
                    axum::http::StatusCode::BAD_GATEWAY,
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                ];
                let burst = rng.gen_range(2..6);
                {
                    let mut github = github.lock();
                    for _ in 0..burst {
                        github
                            .delete_faults
                            .push_back(statuses[rng.gen_range(0..statuses.len())]);
                    }
                }
                // A burst lasts a while, not until enough deregistrations
                // met it: left queued, it would refuse the few tries a
                // quiet GitHub pool makes, each after a longer backoff,
                // until those outlast the settling (seeds 1 and 2 did).
                std::thread::sleep(Duration::from_millis(rng.gen_range(2_000..8_000)));
                github.lock().delete_faults.clear();
            }
            6 => {
                *faults
                    .entry("creates time out, their instances appear 1-20 s later")
                    .or_default() += 1;
                provider_fault("fault.late", rng.gen_range(3_000..9_000));
            }
            _ => {
                *faults
                    .entry("provider calls hang past their timeout")
                    .or_default() += 1;
                provider_fault("fault.hang", rng.gen_range(3_000..9_000));
            }
        }
    }
    let last_fault = Instant::now();
    stop_load.store(true, SeqCst);
    load.join().unwrap();

    // Convergence: every acknowledged job completed and every GitHub job
    // ran, then no runner and no instance left but the stock's stopped
    // ones (min_idle 0, ephemeral runners).
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(
        acknowledged.len() >= 10,
        "too little load: {acknowledged:?}"
    );
    // Every acknowledged job completed (a job whose acknowledgement was
    // lost when the load stopped may have completed too: not counted).
    let all_completed = || {
        api(&balancer.url, "/api/v1/jobs?state=completed&limit=10000")
            .and_then(|v| v["jobs"].as_array().cloned())
            .is_some_and(|jobs| {
                let done: BTreeSet<&str> = jobs
                    .iter()
                    .filter_map(|j| j["external_id"].as_str())
                    .collect();
                acknowledged
                    .iter()
                    .all(|id| done.contains(format!("chaos-{id}").as_str()))
            })
    };
    let github_waiting = || {
        github
            .lock()
            .jobs
            .values()
            .filter(|j| j.status != "completed")
            .count()
    };
    let mut converged = None;
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        if all_completed() && github_waiting() == 0 {
            converged = Some(last_fault.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let github_lost: Vec<u64> = github
        .lock()
        .jobs
        .values()
        .filter(|j| j.status != "completed")
        .map(|j| j.id)
        .collect();
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
    let instances =
        || cloud_instances(&root.join("cloud")) + cloud_instances(&root.join("cloud-github"));
    // The runner records still live at the last look: what a soak that
    // does not settle reports.
    let mut still_live: Vec<String> = Vec::new();
    let mut stocked = 0;
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
                    .cloned()
                    .collect::<Vec<_>>()
            });
        if let Some(live) = &live {
            still_live = live.iter().map(|r| format!("live runner: {r}")).collect();
        }
        // The stock's stopped runners stay, each with its instance.
        let stock = live.as_ref().map(|live| {
            live.iter()
                .all(|r| r["stock"] == true && r["state"] == "stopped")
                .then_some(live.len())
        });
        if let Some(Some(stock)) = stock {
            stocked = stock;
        }
        if matches!(stock, Some(Some(n)) if instances() == n) && github.lock().runners.is_empty() {
            settled = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let leaked = instances().saturating_sub(stocked);
    let registrations_left: Vec<String> = github
        .lock()
        .runners
        .values()
        .map(|r| format!("registration left at GitHub: {}", r.name))
        .collect();
    stop_github.store(true, SeqCst);
    let github_figures = driver.join().unwrap();
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

    // Side effects by a replica that no longer led: provider calls ...
    let began = terms_begun(root, &replicas);
    let mut deposed_calls = Vec::new();
    let calls = mutating_calls(root);
    let mutating = calls.len();
    let count = |name: &str| calls.iter().filter(|(_, c, _)| c == name).count();
    let (starts, stops) = (count("StartInstance"), count("StopInstance"));
    for (at, command, pid) in calls {
        if let Some(why) = deposed(&began, pid, at) {
            deposed_calls.push(format!("{at:.3} {command} {pid}: {why}"));
        }
    }
    // ... and GitHub calls, told apart by each incarnation's token.
    let pid_of: BTreeMap<&str, u32> = replicas
        .iter()
        .flat_map(|r| {
            r.tokens
                .iter()
                .map(String::as_str)
                .zip(r.pids.iter().copied())
        })
        .collect();
    let mut github_mutating = 0;
    for (when, call, token) in github.lock().callers.clone() {
        let changes = (call.starts_with("POST ") && call.ends_with("/generate-jitconfig"))
            || call.starts_with("DELETE ")
            || call.ends_with("/attempts");
        if !changes {
            continue;
        }
        github_mutating += 1;
        let at = when
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let Some(pid) = pid_of.get(token.as_str()) else {
            deposed_calls.push(format!("{at:.3} {call} with an unknown token"));
            continue;
        };
        if let Some(why) = deposed(&began, *pid, at) {
            deposed_calls.push(format!("{at:.3} {call}: {why}"));
        }
    }
    for replica in &mut replicas {
        replica.kill();
    }
    let jit_configurations = github
        .calls()
        .iter()
        .filter(|c| c.ends_with("/generate-jitconfig"))
        .count();
    let most_runners = most_runners.lock().unwrap().clone();

    let mut report = String::new();
    let _ = writeln!(
        report,
        "chaos soak: {seconds} s of faults, seed {seed}; faults {faults:?}"
    );
    let _ = writeln!(
        report,
        "API jobs acknowledged {}, lost {}, ran twice without a lost runner {}, re-run after a lost runner {}",
        acknowledged.len(),
        lost.len(),
        doubled.len(),
        requeued_runs.len()
    );
    let _ = writeln!(
        report,
        "GitHub jobs {}, ran {}, lost {}, runners stopped during their job {}; webhooks {} (dropped {}, duplicated {}, reordered {}); JIT configurations {}",
        github_figures.queued,
        github_figures.completed,
        github_lost.len(),
        github_figures.busy_stopped.len(),
        github_figures.webhooks,
        github_figures.dropped,
        github_figures.duplicated,
        github_figures.reordered,
        jit_configurations,
    );
    let _ = writeln!(
        report,
        "side effects: provider calls that change something {mutating} ({starts} starts and {stops} stops of stopped runners), GitHub calls that do {github_mutating}; by a replica that did not lead {}; most runners at once {most_runners:?} (max {MAX_RUNNERS} and {MAX_GITHUB_RUNNERS}); instances leaked {leaked}; registrations left at GitHub {}; converged {:?} after the last fault",
        deposed_calls.len(),
        registrations_left.len(),
        converged
    );
    for line in requeued_runs
        .iter()
        .chain(&doubled)
        .chain(&deposed_calls)
        .chain(&github_figures.busy_stopped)
        .chain(&registrations_left)
        .chain(if settled { &[][..] } else { &still_live[..] })
    {
        let _ = writeln!(report, "  {line}");
    }
    let failed = !(lost.is_empty()
        && github_lost.is_empty()
        && doubled.is_empty()
        && deposed_calls.is_empty()
        && github_figures.busy_stopped.is_empty()
        && settled
        && leaked == 0
        && starts > 0
        && stops > 0
        && registrations_left.is_empty());
    if failed {
        // The logs, the clouds' state and the call log, for a post-mortem,
        // with what the API says now: why each queued job waits, the
        // pools, the runners.
        for (file, path) in [
            (
                "queued.json",
                "/api/v1/jobs?state=queued&explain=true&limit=1000",
            ),
            ("pools.json", "/api/v1/pools"),
            ("runners.json", "/api/v1/runners"),
        ] {
            let answer = api(&balancer.url, path).unwrap_or_default();
            let _ = std::fs::write(dir.path().join(file), answer.to_string());
        }
        let kept = dir.keep();
        let _ = writeln!(report, "kept for inspection: {}", kept.display());
    }
    eprintln!("{report}");
    assert!(lost.is_empty(), "lost jobs {lost:?}\n{report}");
    assert!(
        github_lost.is_empty(),
        "lost GitHub jobs {github_lost:?}\n{report}"
    );
    assert!(doubled.is_empty(), "{report}");
    assert!(deposed_calls.is_empty(), "{report}");
    assert!(github_figures.busy_stopped.is_empty(), "{report}");
    assert!(settled && leaked == 0, "{report}");
    // The fencing check above covered starts and stops of stopped runners.
    assert!(
        starts > 0 && stops > 0,
        "no stopped runner started or stopped\n{report}"
    );
    assert!(registrations_left.is_empty(), "{report}");
    assert!(
        most_runners.get("default").copied().unwrap_or(0) <= MAX_RUNNERS
            && most_runners.get("github").copied().unwrap_or(0) <= MAX_GITHUB_RUNNERS,
        "{report}"
    );
    assert!(
        github_figures.queued >= 5,
        "too little GitHub load\n{report}"
    );
    assert!(converged.is_some(), "{report}");
    assert_eq!(github.invalid(), Vec::<String>::new(), "{report}");
}
