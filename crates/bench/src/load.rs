//! `runway-bench intake`: a load generator that sends distinct, signed
//! `workflow_job` `queued` webhooks to a runway, at a fixed rate or as fast
//! as it can, bounded in count and in time, and reports throughput and
//! latency percentiles.
//!
//! Latency is measured from the moment a request was *due* (its slot in the
//! fixed-rate schedule), not from when it was sent, so a stalled server is
//! not hidden by the generator waiting for it (coordinated omission).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use runway_server::github::signature::sign;
use tokio::sync::Mutex;

#[derive(Args, Debug, Clone)]
pub struct IntakeArgs {
    /// The webhook endpoint; several (comma-separated or repeated), e.g.
    /// one per replica, share the webhooks in turn.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "http://127.0.0.1:8080/webhooks/github"
    )]
    pub(crate) url: Vec<String>,
    /// The webhook secret to sign with (one of the server's [github] webhook_secrets).
    #[arg(long, env = "RUNWAY_BENCH_SECRET", hide_env_values = true)]
    pub(crate) secret: String,
    /// How many webhooks to send at most.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) count: u64,
    /// Webhooks per second; 0 sends as fast as the server answers.
    #[arg(long, default_value_t = 0)]
    pub(crate) rate: u64,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 32)]
    pub(crate) concurrency: u64,
    /// Stop after this many seconds even if `count` was not reached.
    #[arg(long, default_value_t = 60)]
    pub(crate) max_seconds: u64,
    /// The labels of every job, comma-separated.
    #[arg(long, default_value = "self-hosted,linux,x64")]
    pub(crate) labels: String,
    /// Each webhook body's size at least, padded with the URL fields of
    /// GitHub's repository object (GitHub's `workflow_job` bodies are
    /// 7–13 kB); 0 sends only the fields runway reads.
    #[arg(long, default_value_t = 7_168)]
    pub(crate) body_bytes: usize,
    /// The PID of the runway server, to report the CPU time it spent a
    /// webhook over the run and its peak memory (VmHWM) after it.
    #[arg(long)]
    pub(crate) server_pid: Option<u32>,
}

/// The URL fields of GitHub's repository object, as the padding of a
/// realistic body.
const REPOSITORY_URLS: [&str; 30] = [
    "forks",
    "keys",
    "collaborators",
    "teams",
    "hooks",
    "issue_events",
    "events",
    "assignees",
    "branches",
    "tags",
    "blobs",
    "git_tags",
    "git_refs",
    "trees",
    "statuses",
    "languages",
    "stargazers",
    "contributors",
    "subscribers",
    "subscription",
    "commits",
    "git_commits",
    "comments",
    "issue_comment",
    "contents",
    "compare",
    "merges",
    "archive",
    "downloads",
    "issues",
];

/// A realistic `queued` payload: the fields runway reads, the usual
/// repository block, and its URL fields until the body has `at_least`
/// bytes (GitHub's are 7–13 kB).
fn payload(job_id: u64, labels: &[&str], at_least: usize) -> Vec<u8> {
    let mut body = serde_json::json!({
        "action": "queued",
        "workflow_job": {
            "id": job_id,
            "run_id": job_id / 4,
            "run_attempt": 1,
            "name": "build (ubuntu, stable)",
            "workflow_name": "CI",
            "head_branch": "main",
            "head_sha": "d6fde92930d4715a2b49857d24b940956b26d2d3",
            "status": "queued",
            "conclusion": null,
            "labels": labels,
            "runner_id": null,
            "runner_name": null,
            "created_at": "2026-11-21T10:00:00Z",
            "started_at": "2026-11-21T10:00:00Z",
            "completed_at": null,
            "steps": [],
            "html_url": format!("https://github.com/org/repo/actions/runs/{}/job/{job_id}", job_id / 4),
        },
        "repository": {
            "id": 186853002,
            "name": "repo",
            "full_name": "org/repo",
            "private": true,
            "owner": { "login": "org", "id": 21031067, "type": "Organization" },
            "default_branch": "main",
        },
        "organization": { "login": "org", "id": 21031067 },
        "sender": { "login": "octocat", "id": 583231, "type": "User" },
    });
    // One field at a time, so the body ends just past `at_least`.
    let mut size = body.to_string().len();
    let mut added = 0;
    while size < at_least {
        let Some(repository) = body["repository"].as_object_mut() else {
            break;
        };
        let name = REPOSITORY_URLS[added % REPOSITORY_URLS.len()];
        let key = match added / REPOSITORY_URLS.len() {
            0 => format!("{name}_url"),
            round => format!("{name}_url_{round}"),
        };
        let value = format!("https://api.github.com/repos/org/repo/{name}{{/sha}}");
        size += key.len() + value.len() + 6; // Quotes, colon, comma.
        repository.insert(key, value.into());
        added += 1;
    }
    body.to_string().into_bytes()
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// What one intake run measured.
pub struct IntakeReport {
    pub elapsed: Duration,
    /// Each webhook's latency, sorted.
    pub latencies: Vec<Duration>,
    /// Answers by status code (or "timeout", "connection error").
    pub statuses: BTreeMap<String, u64>,
}

impl IntakeReport {
    pub fn sent(&self) -> u64 {
        self.latencies.len() as u64
    }

    pub fn accepted(&self) -> u64 {
        self.statuses
            .iter()
            .filter(|(code, _)| code.starts_with('2'))
            .map(|(_, n)| n)
            .sum()
    }

    pub fn per_second(&self) -> f64 {
        self.sent() as f64 / self.elapsed.as_secs_f64()
    }

    pub fn percentile(&self, p: f64) -> Duration {
        percentile(&self.latencies, p)
    }
}

pub async fn intake(args: IntakeArgs) -> anyhow::Result<()> {
    let cpu_before = args.server_pid.map(crate::procfs::cpu_time).transpose()?;
    let report = run_intake(&args).await?;
    let cpu_after = args.server_pid.map(crate::procfs::cpu_time).transpose()?;
    let (sent, accepted, elapsed) = (report.sent(), report.accepted(), report.elapsed);
    let latencies = &report.latencies;
    println!(
        "sent        {sent} webhooks in {:.2} s",
        elapsed.as_secs_f64()
    );
    println!(
        "throughput  {:.0} webhooks/s ({:.0} answered 2xx/s)",
        sent as f64 / elapsed.as_secs_f64(),
        accepted as f64 / elapsed.as_secs_f64()
    );
    if args.rate > 0 {
        println!("target rate {} webhooks/s", args.rate);
    }
    let ms = |d: Duration| d.as_secs_f64() * 1_000.0;
    println!(
        "latency ms  p50 {:.2}  p90 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}",
        ms(percentile(latencies, 50.0)),
        ms(percentile(latencies, 90.0)),
        ms(percentile(latencies, 99.0)),
        ms(percentile(latencies, 99.9)),
        ms(latencies.last().copied().unwrap_or_default())
    );
    let statuses: Vec<String> = report
        .statuses
        .iter()
        .map(|(code, n)| format!("{code}: {n}"))
        .collect();
    println!("statuses    {}", statuses.join(", "));
    if let (Some(before), Some(after)) = (cpu_before, cpu_after) {
        let cpu = after.saturating_sub(before);
        println!(
            "server CPU  {:.3} ms a webhook ({:.1} % of a core over the run)",
            cpu.as_secs_f64() * 1_000.0 / sent.max(1) as f64,
            cpu.as_secs_f64() / elapsed.as_secs_f64() * 100.0
        );
    }
    if let Some(pid) = args.server_pid {
        match crate::procfs::peak_rss_kib(pid) {
            Some(kib) => println!(
                "server peak RSS {:.1} MiB (VmHWM of pid {pid})",
                kib as f64 / 1024.0
            ),
            None => println!("server peak RSS unknown (cannot read /proc/{pid}/status)"),
        }
    }
    if accepted < sent {
        bail!(
            "{} of {sent} webhooks were not answered 2xx",
            sent - accepted
        );
    }
    Ok(())
}

/// Sends the webhooks `args` asks for and measures each answer.
pub async fn run_intake(args: &IntakeArgs) -> anyhow::Result<IntakeReport> {
    if args.concurrency == 0 {
        bail!("--concurrency must be at least 1");
    }
    if args.url.is_empty() {
        bail!("--url: name at least one webhook endpoint");
    }
    let labels = split_labels(&args.labels);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency as usize)
        .timeout(Duration::from_secs(30))
        .build()
        .context("cannot build the HTTP client")?;
    // Job ids unique across runs, so every webhook creates a new job.
    let base_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
        * 1_000;
    let next = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(args.count as usize)));
    let statuses = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.max_seconds);
    let mut workers = Vec::new();
    for _ in 0..args.concurrency {
        let (client, next, latencies, statuses) = (
            client.clone(),
            next.clone(),
            latencies.clone(),
            statuses.clone(),
        );
        let (urls, secret, labels) = (args.url.clone(), args.secret.clone(), labels.clone());
        let (count, rate, body_bytes) = (args.count, args.rate, args.body_bytes);
        workers.push(tokio::spawn(async move {
            let label_refs: Vec<&str> = labels.iter().map(String::as_str).collect();
            let mut mine = Vec::new();
            loop {
                let index = next.fetch_add(1, Ordering::Relaxed);
                if index >= count || Instant::now() >= deadline {
                    break;
                }
                let due = match (index * 1_000_000_000).checked_div(rate) {
                    Some(offset) => {
                        let due = started + Duration::from_nanos(offset);
                        tokio::time::sleep_until(due.into()).await;
                        due
                    }
                    // --rate 0: as fast as the server answers.
                    None => Instant::now(),
                };
                let body = payload(base_id + index, &label_refs, body_bytes);
                let signature = sign(secret.as_bytes(), &body);
                let url = &urls[index as usize % urls.len()];
                let result = client
                    .post(url)
                    .header("x-github-event", "workflow_job")
                    .header("x-github-delivery", format!("bench-{base_id}-{index}"))
                    .header("x-hub-signature-256", signature)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await;
                let status = match result {
                    Ok(response) => {
                        let code = response.status().as_u16().to_string();
                        let _ = response.bytes().await;
                        code
                    }
                    Err(error) if error.is_timeout() => "timeout".to_owned(),
                    Err(_) => "connection error".to_owned(),
                };
                mine.push(due.elapsed());
                *statuses.lock().await.entry(status).or_insert(0) += 1;
            }
            latencies.lock().await.extend(mine);
        }));
    }
    for worker in workers {
        worker.await.context("a load worker failed")?;
    }
    let elapsed = started.elapsed();
    let mut latencies = latencies.lock().await.clone();
    latencies.sort();
    let statuses = statuses.lock().await.clone();
    Ok(IntakeReport {
        elapsed,
        latencies,
        statuses,
    })
}

/// Labels written comma-separated on the command line.
fn split_labels(labels: &str) -> Vec<String> {
    labels.split(',').map(|l| l.trim().to_owned()).collect()
}

/// The admin side of the runner benchmarks: who mints registration tokens
/// and submits, for which pool and labels.
#[derive(Args, Debug, Clone)]
pub struct RunnerSide {
    /// An admin token (to mint registration tokens and submit jobs).
    #[arg(long, env = "RUNWAY_TOKEN", hide_env_values = true)]
    token: String,
    /// The pool the runners register in.
    #[arg(long, default_value = "default")]
    pool: String,
    /// Labels of the runners and jobs, comma-separated.
    #[arg(long, default_value = "self-hosted,linux,x64")]
    labels: String,
    /// Runners ask for jobs that start at once (`"start": true`: request →
    /// complete) instead of the two-phase start (request → accept → complete).
    #[arg(long)]
    start_at_once: bool,
    /// (`drain`) Each completion asks for the runner's next job in the same
    /// call (`"next": true`), so a runner working through the queue makes
    /// one call a job; implies `--start-at-once`.
    #[arg(long)]
    next: bool,
}

#[derive(Args, Debug, Clone)]
pub struct LongPollArgs {
    /// The runway server.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    #[command(flatten)]
    side: RunnerSide,
    /// Runners long-polling at once.
    #[arg(long, default_value_t = 100)]
    runners: usize,
    /// Jobs to submit, one at a time.
    #[arg(long, default_value_t = 200)]
    jobs: usize,
    /// Pause between submissions, so each job meets a crowd of waiting runners.
    #[arg(long, default_value_t = 20)]
    gap_ms: u64,
    /// Submit the jobs to this server instead (another replica of the same
    /// store): the job then reaches the runners through a wake-up across
    /// replicas.
    #[arg(long)]
    submit_url: Option<String>,
}

/// `runway-bench longpoll`: how long a submitted job takes to reach one of
/// many waiting runners, from the start of `POST /api/v1/jobs` to the
/// moment a runner's long poll answers with that job.
pub async fn longpoll(args: LongPollArgs) -> anyhow::Result<()> {
    use std::collections::HashMap;
    let base = args.url.trim_end_matches('/').to_owned();
    let labels = split_labels(&args.side.labels);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.runners + 8)
        .timeout(Duration::from_secs(120))
        .build()?;
    let run = format!("{:x}", rand::random::<u32>());
    let runner_tokens: Vec<String> = register_runners(
        &client,
        std::slice::from_ref(&base),
        &args.side.token,
        &args.side.pool,
        &labels,
        args.runners,
        &run,
    )
    .await?
    .into_iter()
    .map(|(_, token)| token)
    .collect();
    let submitted: Arc<Mutex<HashMap<i64, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let latencies = Arc::new(Mutex::new(Vec::new()));
    let received = Arc::new(AtomicU64::new(0));
    let total = args.jobs as u64;
    let mut pollers = Vec::new();
    let start_at_once = args.side.start_at_once;
    for runner_token in runner_tokens {
        let (client, base, submitted, latencies, received) = (
            client.clone(),
            base.clone(),
            submitted.clone(),
            latencies.clone(),
            received.clone(),
        );
        pollers.push(tokio::spawn(async move {
            while received.load(Ordering::Relaxed) < total {
                let Some(id) = request_job(&client, &base, &runner_token, start_at_once).await
                else {
                    continue;
                };
                record_latency(&submitted, &latencies, id, Instant::now()).await;
                received.fetch_add(1, Ordering::Relaxed);
                finish_job(&client, &base, &runner_token, id, (start_at_once, false)).await;
            }
        }));
    }
    // Let every runner reach its long poll before the first job.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let submit_base = args
        .submit_url
        .as_deref()
        .map_or(base.clone(), |url| url.trim_end_matches('/').to_owned());
    for i in 0..args.jobs {
        let body = serde_json::json!({"labels": labels, "script": "true", "external_id": format!("bench-{run}-{i}")});
        // Measured from the start of the submission: it includes the durable enqueue.
        let sent = Instant::now();
        let response: serde_json::Value = client
            .post(format!("{submit_base}/api/v1/jobs"))
            .bearer_auth(&args.side.token)
            .json(&body)
            .send()
            .await?
            .json()
            .await?;
        let Some(id) = response["id"].as_i64() else {
            bail!("submission refused: {response}");
        };
        submitted.lock().await.insert(id, sent);
        tokio::time::sleep(Duration::from_millis(args.gap_ms)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while received.load(Ordering::Relaxed) < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for poller in &pollers {
        poller.abort();
    }
    let mut latencies = latencies.lock().await.clone();
    latencies.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1_000.0;
    println!(
        "{} runners waiting, {} of {} jobs received",
        args.runners,
        latencies.len(),
        args.jobs
    );
    println!(
        "submit → runner ms  p50 {:.2}  p90 {:.2}  p99 {:.2}  max {:.2}",
        ms(percentile(&latencies, 50.0)),
        ms(percentile(&latencies, 90.0)),
        ms(percentile(&latencies, 99.0)),
        ms(latencies.last().copied().unwrap_or_default())
    );
    if (latencies.len() as u64) < total {
        bail!(
            "{} jobs never reached a runner",
            total - latencies.len() as u64
        );
    }
    Ok(())
}

/// A runner got job `id` at `arrived`: its latency from the start of its
/// submission, once the submitter has recorded that (its POST returned).
pub(crate) async fn record_latency(
    submitted: &Mutex<std::collections::HashMap<i64, Instant>>,
    latencies: &Mutex<Vec<Duration>>,
    id: i64,
    arrived: Instant,
) {
    let sent = loop {
        if let Some(sent) = submitted.lock().await.get(&id).copied() {
            break sent;
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    };
    latencies
        .lock()
        .await
        .push(arrived.saturating_duration_since(sent));
}

/// Registers `count` runners of `pool`, spread over `bases` in turn (each
/// with a registration token minted there): (its server, its token).
pub(crate) async fn register_runners(
    client: &reqwest::Client,
    bases: &[String],
    admin_token: &str,
    pool: &str,
    labels: &[String],
    count: usize,
    run: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    let mut runners = Vec::with_capacity(count);
    for (i, base) in bases.iter().cycle().take(count).enumerate() {
        let token: serde_json::Value = client
            .post(format!("{base}/api/v1/registration-tokens"))
            .bearer_auth(admin_token)
            .json(&serde_json::json!({"pool": pool, "ttl": 600}))
            .send()
            .await?
            .json()
            .await?;
        let registered: serde_json::Value = client
            .post(format!("{base}/api/v1/runners/register"))
            .json(&serde_json::json!({"token": token["token"], "name": format!("bench-{run}-{i}"), "labels": labels}))
            .send()
            .await?
            .json()
            .await?;
        let Some(runner_token) = registered["runner_token"].as_str() else {
            bail!("registration refused: {registered}");
        };
        runners.push((base.clone(), runner_token.to_owned()));
    }
    Ok(runners)
}

/// A runner's long poll: the id of the job it was given, if any.
pub(crate) async fn request_job(
    client: &reqwest::Client,
    base: &str,
    runner_token: &str,
    start: bool,
) -> Option<i64> {
    let mut request = client
        .post(format!("{base}/api/v1/jobs/request"))
        .bearer_auth(runner_token);
    // Only when asked: a server older than the one-step start refuses the field.
    if start {
        request = request.json(&serde_json::json!({ "start": true }));
    }
    let response = request.send().await.ok()?;
    if response.status().as_u16() != 201 {
        return None;
    }
    let job: serde_json::Value = response.json().await.ok()?;
    job["id"].as_i64()
}

/// A runner accepts job `id` (unless it `started` at once) and completes
/// it successfully; asked for its `next` job with the completion, returns
/// the id of the job that started.
pub(crate) async fn finish_job(
    client: &reqwest::Client,
    base: &str,
    runner_token: &str,
    id: i64,
    (started, next): (bool, bool),
) -> Option<i64> {
    let url = |path: &str| format!("{base}/api/v1/jobs/{id}/{path}");
    if !started {
        let _ = client
            .post(url("provisioning"))
            .bearer_auth(runner_token)
            .json(&serde_json::json!({"status": "accepted"}))
            .send()
            .await;
    }
    // Only when asked: a server older than `next` refuses the field.
    let body = match next {
        true => serde_json::json!({"exit_code": 0, "next": true}),
        false => serde_json::json!({"exit_code": 0}),
    };
    let response = client
        .post(url("complete"))
        .bearer_auth(runner_token)
        .json(&body)
        .send()
        .await
        .ok()?;
    let done: serde_json::Value = response.json().await.ok()?;
    done["next"]["id"].as_i64()
}

#[derive(Args, Debug, Clone)]
pub struct DrainArgs {
    /// The runway servers, comma-separated or repeated (replicas of one
    /// store): submissions and runners are spread over them in turn.
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:8080")]
    url: Vec<String>,
    #[command(flatten)]
    side: RunnerSide,
    /// Runners taking jobs at once.
    #[arg(long, default_value_t = 16)]
    runners: usize,
    /// Jobs to submit, then drain.
    #[arg(long, default_value_t = 2_000)]
    jobs: usize,
    /// Submissions in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Give up after this many seconds per phase.
    #[arg(long, default_value_t = 120)]
    max_seconds: u64,
}

/// `runway-bench drain`: submit `jobs` jobs through the job API (intake
/// rate), then let `runners` runners take each through the runner API's
/// request → accept → complete until the queue is empty (hand-out rate),
/// with everything spread over the given replicas.
pub async fn drain(args: DrainArgs) -> anyhow::Result<()> {
    if args.url.is_empty() || args.runners == 0 || args.concurrency == 0 {
        bail!("--url, --runners and --concurrency need at least one each");
    }
    let bases: Vec<String> = args
        .url
        .iter()
        .map(|url| url.trim_end_matches('/').to_owned())
        .collect();
    let labels = split_labels(&args.side.labels);
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.runners + args.concurrency)
        .timeout(Duration::from_secs(120))
        .build()?;
    let run = format!("{:x}", rand::random::<u32>());
    let runners = register_runners(
        &client,
        &bases,
        &args.side.token,
        &args.side.pool,
        &labels,
        args.runners,
        &run,
    )
    .await?;
    let budget = Duration::from_secs(args.max_seconds);

    // Intake: every submission durable before the next of its worker.
    let next = Arc::new(AtomicU64::new(0));
    let submit_started = Instant::now();
    let mut submitters = Vec::new();
    for _ in 0..args.concurrency {
        let (client, next, bases, labels, token, run) = (
            client.clone(),
            next.clone(),
            bases.clone(),
            labels.clone(),
            args.side.token.clone(),
            run.clone(),
        );
        let total = args.jobs as u64;
        submitters.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total || submit_started.elapsed() > budget {
                    return anyhow::Ok(());
                }
                let base = &bases[i as usize % bases.len()];
                let body = serde_json::json!({"labels": labels, "script": "true", "external_id": format!("drain-{run}-{i}")});
                let response = client
                    .post(format!("{base}/api/v1/jobs"))
                    .bearer_auth(&token)
                    .json(&body)
                    .send()
                    .await?;
                if !response.status().is_success() {
                    bail!("submission refused: {}", response.text().await?);
                }
            }
        }));
    }
    for submitter in submitters {
        submitter.await.context("a submitter failed")??;
    }
    let submit_elapsed = submit_started.elapsed();

    // Hand-out: request (claim) → accept → complete, until all are done.
    let completed = Arc::new(AtomicU64::new(0));
    let total = args.jobs as u64;
    let drain_started = Instant::now();
    let mut workers = Vec::new();
    let next = args.side.next;
    let start_at_once = args.side.start_at_once || next;
    for (base, runner_token) in runners {
        let (client, completed) = (client.clone(), completed.clone());
        workers.push(tokio::spawn(async move {
            let mut running = None;
            while completed.load(Ordering::Relaxed) < total && drain_started.elapsed() < budget {
                let id = match running.take() {
                    Some(id) => id,
                    None => match request_job(&client, &base, &runner_token, start_at_once).await {
                        Some(id) => id,
                        None => continue,
                    },
                };
                running =
                    finish_job(&client, &base, &runner_token, id, (start_at_once, next)).await;
                completed.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // The last runners wait in a long poll the empty queue never answers.
    let deadline = drain_started + budget;
    while completed.load(Ordering::Relaxed) < total && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let drain_elapsed = drain_started.elapsed();
    for worker in &workers {
        worker.abort();
    }
    let done = completed.load(Ordering::Relaxed);
    let rate = |n: u64, elapsed: Duration| n as f64 / elapsed.as_secs_f64().max(1e-9);
    println!(
        "{} replicas, {} runners, {} jobs",
        bases.len(),
        args.runners,
        args.jobs
    );
    println!(
        "submit    {:.0} jobs/s ({:.2} s)",
        rate(total, submit_elapsed),
        submit_elapsed.as_secs_f64()
    );
    let steps = if args.side.next {
        "complete (next) → complete …"
    } else if args.side.start_at_once {
        "request (start) → complete"
    } else {
        "request → accept → complete"
    };
    println!(
        "drain     {:.0} jobs/s {steps} ({done} in {:.2} s)",
        rate(done, drain_elapsed),
        drain_elapsed.as_secs_f64()
    );
    if done < total {
        bail!(
            "{} jobs were not completed in {} s",
            total - done,
            args.max_seconds
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn bodies_are_padded_to_the_size_asked_and_stay_valid_webhooks() {
        let small = super::payload(7, &["linux"], 0);
        let large = super::payload(7, &["linux"], 7_168);
        assert!(small.len() < 2_000, "{}", small.len());
        assert!((7_168..9_000).contains(&large.len()), "{}", large.len());
        let parsed: serde_json::Value = serde_json::from_slice(&large).unwrap();
        assert_eq!(parsed["workflow_job"]["id"], 7);
        assert_eq!(parsed["repository"]["full_name"], "org/repo");
    }
}
