//! `runway agent`: the reference runner. It registers with a one-time
//! token, long-polls for jobs, keeps its claim alive while it prepares a
//! fresh work directory, accepts, runs the script with `sh -c` under the
//! job's timeout (output to a local log), heartbeats while it runs, and
//! reports the exit code and the log's tail.
//!
//! SIGTERM (or Ctrl-C): while idle it exits; while preparing it declines the
//! job so another runner takes it; while running it lets the job finish for
//! up to `--grace-seconds`, then kills it and reports it failed.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::sync::watch;

const LOG_TAIL: u64 = 64 * 1024;

#[derive(Args, Debug, Clone)]
pub struct AgentArgs {
    /// The runway server.
    #[arg(long, env = "RUNWAY_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// A one-time registration token (POST /api/v1/registration-tokens).
    #[arg(long, env = "RUNWAY_REGISTRATION_TOKEN", hide_env_values = true)]
    token: String,
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
}

struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    async fn post(&self, path: &str, body: Value) -> anyhow::Result<(StatusCode, Value)> {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .with_context(|| format!("cannot reach {}{path}", self.base))?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
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
        .timeout(Duration::from_secs(15 * 60))
        .build()
        .context("cannot build the HTTP client")?;
    let name = args.name.clone().unwrap_or_else(default_name);
    let registration = Client {
        http: http.clone(),
        base: base.clone(),
        token: String::new(),
    };
    let (status, registered) = registration
        .post(
            "/api/v1/runners/register",
            json!({"token": args.token, "name": name, "labels": args.labels}),
        )
        .await?;
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
    std::fs::create_dir_all(&work_root)
        .with_context(|| format!("cannot create {}", work_root.display()))?;
    tracing::info!(runner = %name, id = registered["runner_id"].as_i64().unwrap_or(0), work_dir = %work_root.display(), "agent registered");
    let mut terminating = termination();
    let mut failures: u32 = 0;
    loop {
        let request = client.post("/api/v1/jobs/request", json!({"labels": args.labels}));
        let answer = tokio::select! {
            _ = terminating.wait_for(|t| *t) => {
                tracing::info!("terminating while idle");
                return Ok(());
            }
            answer = request => answer,
        };
        let job = match answer {
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
        run_job(
            &client,
            &job,
            &work_root,
            &mut terminating,
            Duration::from_secs(args.grace_seconds),
        )
        .await?;
        if args.once || *terminating.borrow() {
            return Ok(());
        }
    }
}

async fn run_job(
    client: &Client,
    job: &Value,
    work_root: &std::path::Path,
    terminating: &mut watch::Receiver<bool>,
    grace: Duration,
) -> anyhow::Result<()> {
    let id = job["id"].as_i64().unwrap_or_default();
    let script = job["script"].as_str().unwrap_or_default().to_owned();
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
    let job_dir = work_root.join(format!("job-{id}"));
    let prepared = (|| -> std::io::Result<()> {
        if job_dir.exists() {
            std::fs::remove_dir_all(&job_dir)?;
        }
        std::fs::create_dir_all(&job_dir)
    })();
    if prepared.is_err() || *terminating.borrow() {
        tracing::info!(job = id, ?prepared, "declining the job");
        let _ = client
            .post(&path("provisioning"), json!({"status": "declined"}))
            .await;
        return Ok(());
    }
    match client
        .post(&path("provisioning"), json!({"status": "accepted"}))
        .await
    {
        Ok((StatusCode::OK, _)) => {}
        other => {
            tracing::warn!(
                job = id,
                ?other,
                "accept refused or lost; leaving the job to the queue"
            );
            return Ok(());
        }
    }
    let log_path = work_root.join(format!("job-{id}.log"));
    let log = std::fs::File::create(&log_path)
        .with_context(|| format!("cannot create {}", log_path.display()))?;
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(&script)
        .current_dir(&job_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log.try_clone()?))
        .stderr(Stdio::from(log))
        .kill_on_drop(true)
        .spawn()
        .context("cannot start sh")?;
    let heartbeats = {
        let http = client.http.clone();
        let url = format!("{}{}", client.base, path("heartbeat"));
        let token = client.token.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(lease / 3).await;
                let _ = http.post(&url).bearer_auth(&token).send().await;
            }
        })
    };
    let outcome = tokio::select! {
        status = child.wait() => Outcome::Exited(status?),
        () = tokio::time::sleep(timeout) => Outcome::TimedOut,
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
    let log_tail = read_tail(&log_path);
    let report = match outcome {
        Outcome::Exited(status) => match status.code() {
            Some(code) => json!({"exit_code": code, "log_tail": log_tail}),
            None => json!({"conclusion": "failure", "log_tail": log_tail}),
        },
        Outcome::TimedOut => json!({"conclusion": "timed_out", "log_tail": log_tail}),
        Outcome::Terminated => {
            json!({"conclusion": "failure", "log_tail": log_tail + "\n[runway agent: terminated]\n"})
        }
    };
    report_completion(client, &path("complete"), id, report).await;
    Ok(())
}

/// Reports a finished job, retrying while the server cannot be reached (it
/// may be restarting) for up to ten minutes. Any answer ends it: a refusal
/// means the job is no longer ours (its lease ran out and it was requeued).
async fn report_completion(client: &Client, path: &str, id: i64, report: Value) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
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
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
}

enum Outcome {
    Exited(std::process::ExitStatus),
    TimedOut,
    Terminated,
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
