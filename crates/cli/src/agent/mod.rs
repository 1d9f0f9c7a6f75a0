//! `runway agent`: the reference runner. It registers with a one-time
//! token, long-polls for jobs, keeps its claim alive while it prepares a
//! fresh work directory, accepts, runs the script with `sh -c` under the
//! job's timeout (output to a local log), heartbeats while it runs, and
//! reports the exit code and the log's tail.
//!
//! SIGTERM (or Ctrl-C): while idle it exits; while preparing it declines the
//! job so another runner takes it; while running it lets the job finish for
//! up to `--grace-seconds`, then kills it and reports it failed.
//!
//! A job gets nothing of the agent's: a clean environment (the base of
//! `runway_providers::environment` and the job's own `RUNWAY_JOB_*`
//! variables, never the agent's tokens), its own work directory (removed
//! afterwards) and its own process group (killed when the job ends, so
//! nothing it started outlives it). With `--job-user` (the agent running as
//! root) it also runs as another user, who can read neither the agent's
//! memory nor its files. Untrusted jobs still need a machine of their own
//! per job: see docs/security.md.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::sync::watch;

mod job_user;

use job_user::{reachable_by, JobUser};

const LOG_TAIL: u64 = 64 * 1024;

#[derive(Args, Debug, Clone)]
pub struct AgentArgs {
    /// The runway server.
    #[arg(long, env = "RUNWAY_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// A one-time registration token (POST /api/v1/registration-tokens).
    #[arg(
        long,
        env = "RUNWAY_REGISTRATION_TOKEN",
        hide_env_values = true,
        required_unless_present = "instance_token"
    )]
    token: Option<String>,
    /// Instead of --token: the GARM instance token of a machine of a
    /// pool's stock of stopped runners. The agent asks runway's instance
    /// API for its one-time registration token with it, and waits while
    /// runway answers that the machine is not started for a job yet.
    #[arg(long, env = "RUNWAY_INSTANCE_TOKEN", hide_env_values = true)]
    instance_token: Option<String>,
    /// The labels this runner serves, comma-separated.
    #[arg(
        long,
        env = "RUNWAY_RUNNER_LABELS",
        value_delimiter = ',',
        default_value = "self-hosted,linux,x64"
    )]
    labels: Vec<String>,
    /// The runner's name; unique per runway. Default: host name, pid and a random suffix.
    #[arg(long, env = "RUNWAY_RUNNER_NAME")]
    name: Option<String>,
    /// Exit after one job (an ephemeral runner).
    #[arg(long)]
    once: bool,
    /// Where job work directories and logs go. Default: a new temporary directory.
    #[arg(long, env = "RUNWAY_AGENT_WORK_DIR")]
    work_dir: Option<PathBuf>,
    /// On SIGTERM while a job runs, how long to let it finish before killing it.
    #[arg(long, default_value_t = 30)]
    grace_seconds: u64,
    /// Run each job as this user (a name, or UID[:GID]) instead of the
    /// agent's own. Needs the agent to run as root. The job cannot then read
    /// the agent's memory, its token or its other files.
    #[arg(long, env = "RUNWAY_AGENT_JOB_USER", value_name = "USER")]
    job_user: Option<String>,
}

/// Creates `dir` (and what is missing above it) with `mode`, and sets that
/// mode even if it existed.
fn create_private_dir(dir: &std::path::Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
}

struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

/// How long one request may take, unless said otherwise: a replica that
/// was paused or cut off mid-request must not hold a runner for longer
/// (without a load balancer that cuts such connections, nothing else
/// would end it).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a job request may take: the server holds it for its
/// `[runner_api] poll_timeout` (30 s by default) before answering 204.
const JOB_REQUEST_TIMEOUT: Duration = Duration::from_secs(300);

/// How long the agent keeps trying to register while the server cannot
/// answer (a restart, a database failover: 503s and refused connections):
/// a runner that gives up at the first 503 wastes its boot.
const REGISTRATION_PATIENCE: Duration = Duration::from_secs(300);

impl Client {
    async fn post(&self, path: &str, body: Value) -> anyhow::Result<(StatusCode, Value)> {
        self.post_within(path, body, REQUEST_TIMEOUT).await
    }

    /// One POST that takes at most `timeout`.
    async fn post_within(
        &self,
        path: &str,
        body: Value,
        timeout: Duration,
    ) -> anyhow::Result<(StatusCode, Value)> {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .timeout(timeout)
            .json(&body)
            .send()
            .await
            .with_context(|| format!("cannot reach {}{path}", self.base))?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    /// Posts until the server answers (anything but a server error), for
    /// requests the server may have applied although its answer was lost;
    /// the server answers a repeat as it answered the first. Retries come
    /// at least every third of `within` and stop after `within`; the last
    /// outcome is returned.
    async fn post_until_answered(
        &self,
        path: &str,
        body: Value,
        within: Duration,
    ) -> anyhow::Result<(StatusCode, Value)> {
        let deadline = tokio::time::Instant::now() + within;
        let longest = (within / 3).max(Duration::from_millis(100));
        let mut wait = Duration::from_millis(100);
        loop {
            let outcome = self.post(path, body.clone()).await;
            let answered = matches!(&outcome, Ok((status, _)) if !status.is_server_error());
            if answered || tokio::time::Instant::now() + wait >= deadline {
                return outcome;
            }
            tracing::warn!(path, ?outcome, ?wait, "no answer yet; asking again");
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(longest);
        }
    }
}

fn default_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "agent".to_owned());
    let suffix: u32 = rand::random::<u32>() % 1_000_000;
    format!("{host}-{}-{suffix:06}", std::process::id())
}

/// Completes once SIGTERM or Ctrl-C arrives; the flag stays set.
fn termination() -> watch::Receiver<bool> {
    let (sender, receiver) = watch::channel(false);
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            if let Ok(mut term) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            } else {
                let _ = ctrl_c.await;
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        let _ = sender.send(true);
    });
    receiver
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let base = args.url.trim_end_matches('/').to_owned();
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .build()
        .context("cannot build the HTTP client")?;
    let name = args.name.clone().unwrap_or_else(default_name);
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let job_user = match &args.job_user {
        Some(_) if !root => bail!("--job-user needs the agent to run as root"),
        Some(spec) => Some(JobUser::resolve(spec)?),
        None => None,
    };
    if root && job_user.is_none() {
        tracing::warn!(
            "the agent runs as root and so do its jobs; use --job-user to run them as another user"
        );
    }
    let registration = Client {
        http: http.clone(),
        base: base.clone(),
        token: String::new(),
    };
    let token = match (&args.token, &args.instance_token) {
        (Some(token), _) => token.clone(),
        (None, Some(instance)) => registration_token_of_instance(&http, &base, instance).await?,
        (None, None) => bail!("give --token (RUNWAY_REGISTRATION_TOKEN) or --instance-token"),
    };
    let (status, registered) = register(&registration, &args, &token, &name).await?;
    if status != StatusCode::CREATED {
        bail!(
            "registration as {name:?} refused ({status}): {}",
            registered["error"].as_str().unwrap_or("no reason given")
        );
    }
    let client = Client {
        http,
        base,
        token: registered["runner_token"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    };
    let work_root = match &args.work_dir {
        Some(dir) => dir.clone(),
        None => std::env::temp_dir().join(format!("runway-agent-{name}")),
    };
    // Only the agent may list or read its work root; a job user may pass
    // through it to its own directory (mode 0711), nothing more.
    create_private_dir(&work_root, if job_user.is_some() { 0o711 } else { 0o700 })
        .with_context(|| format!("cannot create {}", work_root.display()))?;
    if let Some(user) = &job_user {
        if let Err(blocked) = reachable_by(user, &work_root) {
            bail!(
                "--job-user {}: that user cannot reach the work directory {} ({} is not searchable for it); choose another --work-dir",
                user.name,
                work_root.display(),
                blocked.display()
            );
        }
    }
    let job = JobContext {
        runner_name: name.clone(),
        work_root: work_root.clone(),
        user: job_user,
        grace: Duration::from_secs(args.grace_seconds),
    };
    tracing::info!(runner = %name, id = registered["runner_id"].as_i64().unwrap_or(0), work_dir = %work_root.display(), "agent registered");
    let mut terminating = termination();
    let mut failures: u32 = 0;
    loop {
        let request = client.post_within(
            "/api/v1/jobs/request",
            json!({"labels": args.labels}),
            JOB_REQUEST_TIMEOUT,
        );
        let answer = tokio::select! {
            _ = terminating.wait_for(|t| *t) => {
                tracing::info!("terminating while idle");
                return Ok(());
            }
            answer = request => answer,
        };
        let offered = match answer {
            Ok((StatusCode::CREATED, job)) => {
                failures = 0;
                job
            }
            Ok((StatusCode::NO_CONTENT, _)) => {
                failures = 0;
                continue;
            }
            Ok((StatusCode::GONE, body)) => {
                // Scaled down: runway will stop this process; leave first.
                tracing::info!(
                    reason = body["error"].as_str().unwrap_or(""),
                    "runner retired by the server"
                );
                return Ok(());
            }
            Ok((StatusCode::UNAUTHORIZED, body)) => {
                bail!(
                    "the server no longer accepts this runner: {}",
                    body["error"].as_str().unwrap_or("")
                );
            }
            other => {
                failures += 1;
                let wait = Duration::from_millis(250 * u64::from(failures.min(20)));
                tracing::warn!(?other, ?wait, "job request failed; retrying");
                tokio::time::sleep(wait).await;
                continue;
            }
        };
        run_job(&client, &job, &offered, &mut terminating).await?;
        if args.once || *terminating.borrow() {
            return Ok(());
        }
    }
}

/// Registers, asking again while the server cannot answer — refused
/// connections, timeouts, 429 and 5xx (a 503 is what a replica answers
/// while its database is away) — with jittered doubling waits for up to
/// A stock machine's registration token, from runway's GARM instance API
/// with its `instance` token. While runway answers 409 (the machine's warm
/// boot: it is in its pool's stock, and runway stops it) the agent asks
/// again every few seconds, for as long as it runs; network failures and
/// server errors are retried too. Any other refusal ends it.
async fn registration_token_of_instance(
    http: &reqwest::Client,
    base: &str,
    instance: &str,
) -> anyhow::Result<String> {
    let url = format!("{base}/api/v1/garm/metadata/runner-registration-token/");
    let mut announced = false;
    loop {
        let outcome = http
            .get(&url)
            .bearer_auth(instance)
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await;
        match outcome {
            Ok(response) if response.status() == StatusCode::OK => {
                let token = response
                    .text()
                    .await
                    .context("reading the registration token")?;
                return Ok(token.trim().to_owned());
            }
            Ok(response) if response.status() == StatusCode::CONFLICT => {
                if !announced {
                    tracing::info!(
                        "in the pool's stock of stopped runners: waiting to be started for a job"
                    );
                    announced = true;
                }
            }
            Ok(response)
                if response.status().is_server_error()
                    || response.status() == StatusCode::TOO_MANY_REQUESTS => {}
            Ok(response) => {
                let status = response.status();
                let body: Value = response.json().await.unwrap_or(Value::Null);
                bail!(
                    "runway refused this machine's registration token ({status}): {}",
                    body["error"].as_str().unwrap_or("no reason given")
                );
            }
            Err(error) => {
                tracing::warn!(%error, "cannot reach runway's instance API; asking again")
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// [`REGISTRATION_PATIENCE`]. A refusal (401: the token is unknown, used
/// or expired; 409: the name is taken) ends it: asking again cannot help.
/// Every try carries the same `attempt` key, made here and kept only in
/// memory: a registration applied whose answer was lost (the connection
/// cut after runway acted) is answered again, with the same runner,
/// instead of a 401 for a used one-time token.
async fn register(
    client: &Client,
    args: &AgentArgs,
    token: &str,
    name: &str,
) -> anyhow::Result<(StatusCode, Value)> {
    let attempt: String = (0..32)
        .map(|_| char::from_digit(rand::random::<u32>() % 16, 16).unwrap_or('0'))
        .collect();
    let body = json!({"token": token, "name": name, "labels": args.labels, "attempt": attempt});
    let deadline = tokio::time::Instant::now() + REGISTRATION_PATIENCE;
    let mut wait = Duration::from_millis(200);
    let mut retried = false;
    loop {
        let outcome = client.post("/api/v1/runners/register", body.clone()).await;
        let again = match &outcome {
            Ok((status, _)) => status.is_server_error() || *status == StatusCode::TOO_MANY_REQUESTS,
            Err(_) => true,
        };
        if !again || tokio::time::Instant::now() + wait >= deadline {
            if retried {
                if let Ok((StatusCode::UNAUTHORIZED, _)) = &outcome {
                    bail!("registration as {name:?} refused after a retry: the one-time token was used by another registration or has expired");
                }
            }
            return outcome;
        }
        tracing::warn!(
            runner = name,
            ?outcome,
            ?wait,
            "cannot register yet; asking again"
        );
        let jitter = rand::random::<f64>() * 0.5 + 0.75;
        tokio::time::sleep(wait.mul_f64(jitter)).await;
        wait = (wait * 2).min(Duration::from_secs(5));
        retried = true;
    }
}

/// What every job of this agent shares.
struct JobContext {
    runner_name: String,
    work_root: PathBuf,
    user: Option<JobUser>,
    grace: Duration,
}

impl JobContext {
    /// The job's whole environment: the base inherited from the agent, then
    /// the job's own variables. Nothing else of the agent's — not its
    /// registration token, runner token or anything it inherited.
    fn environment(&self, id: i64, labels: &str, dir: &std::path::Path) -> Vec<(String, String)> {
        let mut variables: Vec<(String, String)> =
            runway_providers::environment::inherited_from_host(&[])
                .into_iter()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .collect();
        variables.extend([
            ("RUNWAY_JOB_ID".to_owned(), id.to_string()),
            ("RUNWAY_JOB_LABELS".to_owned(), labels.to_owned()),
            ("RUNWAY_RUNNER_NAME".to_owned(), self.runner_name.clone()),
            ("RUNWAY_WORKSPACE".to_owned(), dir.display().to_string()),
        ]);
        if let Some(user) = &self.user {
            variables.extend([
                ("HOME".to_owned(), user.home.display().to_string()),
                ("USER".to_owned(), user.name.clone()),
                ("LOGNAME".to_owned(), user.name.clone()),
            ]);
        }
        variables
    }

    /// A fresh, empty work directory for the job, owned by whoever runs it.
    fn prepare(&self, dir: &std::path::Path) -> std::io::Result<()> {
        if dir.exists() {
            std::fs::remove_dir_all(dir)?;
        }
        create_private_dir(dir, 0o700)?;
        if let Some(user) = &self.user {
            std::os::unix::fs::chown(dir, Some(user.uid), Some(user.gid))?;
        }
        Ok(())
    }

    fn command(
        &self,
        script: &str,
        dir: &std::path::Path,
        environment: Vec<(String, String)>,
    ) -> tokio::process::Command {
        let mut command = tokio::process::Command::new("sh");
        command
            .arg("-c")
            .arg(script)
            .current_dir(dir)
            .env_clear()
            .envs(environment)
            // Its own group: when the job ends, whatever it left running is
            // killed with it.
            .process_group(0)
            .kill_on_drop(true);
        if let Some(user) = &self.user {
            // The standard library drops the supplementary groups too
            // (setgroups) when it changes the user of a child of root.
            command.uid(user.uid).gid(user.gid);
        }
        command
    }
}

async fn run_job(
    client: &Client,
    context: &JobContext,
    job: &Value,
    terminating: &mut watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let id = job["id"].as_i64().unwrap_or_default();
    let script = job["script"].as_str().unwrap_or_default().to_owned();
    let labels = job["labels"]
        .as_array()
        .map(|labels| {
            labels
                .iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(",")
        })
        .unwrap_or_default();
    let timeout = Duration::from_secs(job["timeout_seconds"].as_u64().unwrap_or(3600));
    let lease = Duration::from_secs(job["lease_seconds"].as_u64().unwrap_or(120));
    let path = |what: &str| format!("/api/v1/jobs/{id}/{what}");
    tracing::info!(job = id, "job received; preparing");
    // Preparing: keep the claim alive, then make a fresh work directory.
    // If the server cannot be told, the lease runs out and the job goes
    // back to the queue: skipping it is safe, running it unannounced is not.
    if let Err(error) = client
        .post(&path("provisioning"), json!({"status": "pending"}))
        .await
    {
        tracing::warn!(job = id, %error, "cannot keep the claim alive; leaving the job to the queue");
        return Ok(());
    }
    let job_dir = context.work_root.join(format!("job-{id}"));
    let prepared = context.prepare(&job_dir);
    if prepared.is_err() || *terminating.borrow() {
        tracing::info!(job = id, ?prepared, "declining the job");
        let _ = client
            .post(&path("provisioning"), json!({"status": "declined"}))
            .await;
        return Ok(());
    }
    // An accept whose answer is lost may still have been applied: ask
    // again (the server answers a repeat the same) while the lease lasts.
    match client
        .post_until_answered(&path("provisioning"), json!({"status": "accepted"}), lease)
        .await
    {
        Ok((StatusCode::OK, _)) => {}
        other => {
            tracing::warn!(
                job = id,
                ?other,
                "accept refused or lost; leaving the job to the queue"
            );
            let _ = std::fs::remove_dir_all(&job_dir);
            return Ok(());
        }
    }
    // The log is the agent's, outside the job's directory and readable by
    // the agent alone: the job writes to it only through its stdout.
    let log_path = context.work_root.join(format!("job-{id}.log"));
    let log = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&log_path)
            .with_context(|| format!("cannot create {}", log_path.display()))?
    };
    let environment = context.environment(id, &labels, &job_dir);
    let spawned = context
        .command(&script, &job_dir, environment)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log))
        .spawn();
    // Kills for memory in this agent's cgroup so far: one more after the
    // job means the kernel killed it (or part of it) at the memory limit.
    let oom_kills_before = oom_kills();
    let mut child = match spawned {
        Ok(child) => child,
        Err(error) => {
            // Accepted but not startable: say so, rather than leave the
            // job to run out its lease and fail the same way elsewhere.
            tracing::error!(job = id, %error, "cannot start the job");
            let report = json!({"conclusion": "failure", "log_tail": format!("[runway agent: cannot start the job: {error}]\n")});
            report_completion(client, &path("complete"), id, lease, report).await;
            finish(&job_dir, &log_path, None);
            return Ok(());
        }
    };
    let group = child.id().and_then(|pid| i32::try_from(pid).ok());
    // Heartbeats; an operator's cancel comes back as `job_cancelled`.
    let (cancelled_tx, mut cancelled) = watch::channel(false);
    let heartbeats = {
        let http = client.http.clone();
        let url = format!("{}{}", client.base, path("heartbeat"));
        let token = client.token.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(lease / 3).await;
                // Each heartbeat gives up within a third of the lease, so
                // one that hangs on a paused replica does not stop the next.
                let sent = http
                    .post(&url)
                    .bearer_auth(&token)
                    .timeout(lease / 3)
                    .send()
                    .await;
                let Ok(answer) = sent else {
                    continue;
                };
                if answer.status() == StatusCode::CONFLICT {
                    let body: Value = answer.json().await.unwrap_or_default();
                    if body["code"] == "job_cancelled" {
                        let _ = cancelled_tx.send(true);
                        return;
                    }
                }
            }
        })
    };
    let grace = context.grace;
    let outcome = tokio::select! {
        status = child.wait() => Outcome::Exited(status?),
        () = tokio::time::sleep(timeout) => Outcome::TimedOut,
        _ = cancelled.wait_for(|c| *c) => {
            tracing::info!(job = id, "the job was cancelled; stopping it");
            Outcome::Cancelled
        }
        _ = terminating.wait_for(|t| *t) => {
            tracing::info!(job = id, ?grace, "terminating: letting the job finish within the grace period");
            match tokio::time::timeout(grace, child.wait()).await {
                Ok(status) => Outcome::Exited(status?),
                Err(_) => Outcome::Terminated,
            }
        }
    };
    if !matches!(outcome, Outcome::Exited(_)) {
        let _ = child.kill().await;
    }
    heartbeats.abort();
    let mut log_tail = read_tail(&log_path);
    let sigkilled = match &outcome {
        Outcome::Exited(status) => {
            use std::os::unix::process::ExitStatusExt;
            status.signal() == Some(libc::SIGKILL) || status.code() == Some(137)
        }
        _ => false,
    };
    if sigkilled && oom_kills() > oom_kills_before {
        log_tail.push_str(
            "\n[runway agent: out of memory: the kernel killed the job at its memory limit]\n",
        );
    }
    finish(&job_dir, &log_path, group);
    let report = match outcome {
        Outcome::Exited(status) => match status.code() {
            Some(code) => json!({"exit_code": code, "log_tail": log_tail}),
            None => json!({"conclusion": "failure", "log_tail": log_tail}),
        },
        Outcome::TimedOut => json!({"conclusion": "timed_out", "log_tail": log_tail}),
        Outcome::Cancelled => {
            json!({"conclusion": "cancelled", "log_tail": log_tail + "\n[runway agent: cancelled]\n"})
        }
        Outcome::Terminated => {
            json!({"conclusion": "failure", "log_tail": log_tail + "\n[runway agent: terminated]\n"})
        }
    };
    report_completion(client, &path("complete"), id, lease, report).await;
    Ok(())
}

/// How many processes the kernel has killed for memory in this process's
/// memory cgroup (cgroup v2 `memory.events`, v1 `memory.oom_control`: the
/// container's own, in a container); 0 where neither can be read.
fn oom_kills() -> u64 {
    [
        "/sys/fs/cgroup/memory.events",
        "/sys/fs/cgroup/memory/memory.oom_control",
    ]
    .iter()
    .filter_map(|path| std::fs::read_to_string(path).ok())
    .find_map(|text| {
        text.lines()
            .find_map(|line| line.strip_prefix("oom_kill "))
            .and_then(|n| n.trim().parse().ok())
    })
    .unwrap_or(0)
}

/// After a job: kills what is left of its process group and removes its
/// work directory and log (the report carries the log's tail).
fn finish(job_dir: &std::path::Path, log_path: &std::path::Path, group: Option<i32>) {
    if let Some(pid) = group.filter(|pid| *pid > 1) {
        // SAFETY: kill(2) has no memory effects; the negative pid names the
        // job's own process group (it was started with process_group(0)).
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
    }
    if let Err(error) = std::fs::remove_dir_all(job_dir) {
        tracing::warn!(dir = %job_dir.display(), %error, "cannot remove the job's work directory");
    }
    let _ = std::fs::remove_file(log_path);
}

/// Reports a finished job, retrying while the server cannot be reached (it
/// may be restarting) for up to ten minutes. Any answer ends it: a refusal
/// means the job is no longer ours (its lease ran out and it was requeued).
/// Retries come at least every third of the `lease`, so a restarted server
/// (which gives its runners one lease to be heard from) hears it in time.
async fn report_completion(client: &Client, path: &str, id: i64, lease: Duration, report: Value) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    let longest = (lease / 3).clamp(Duration::from_millis(100), Duration::from_secs(5));
    let mut wait = Duration::from_millis(100);
    loop {
        match client.post(path, report.clone()).await {
            Ok((status, answer)) if !status.is_server_error() => {
                tracing::info!(job = id, %status, state = answer["state"].as_str().unwrap_or(""), "job reported");
                return;
            }
            other => {
                if tokio::time::Instant::now() >= deadline {
                    tracing::error!(job = id, ?other, "giving up reporting the job");
                    return;
                }
                tracing::warn!(
                    job = id,
                    ?other,
                    ?wait,
                    "cannot report the job yet; retrying"
                );
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(longest);
            }
        }
    }
}

enum Outcome {
    Exited(std::process::ExitStatus),
    TimedOut,
    Terminated,
    /// An operator cancelled it (the server said so at a heartbeat).
    Cancelled,
}

fn read_tail(path: &std::path::Path) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut file) = std::fs::File::open(path) else {
        return String::new();
    };
    let length = file.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = file.seek(SeekFrom::Start(length.saturating_sub(LOG_TAIL)));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}
