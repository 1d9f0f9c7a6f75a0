//! `runway-bench pollers`: what waiting runners cost a server (issue 59).
//! Starts `runway serve` (`--runway`, by default the `runway` beside this
//! binary) on a store of its own, registers `--runners` runners, holds one
//! long poll open for each (one async client, not a thread each), and
//! reads the server's CPU time and RSS from `/proc`:
//!
//! - **idle**: every runner waiting, each past its poll's first look at
//!   the queue, no job, over `--idle-seconds`: CPU as a percentage of one
//!   core, and RSS;
//! - **stream**: `--jobs` jobs submitted one at a time while the runners
//!   wait; each is answered to one waiting runner, which starts it in the
//!   same call (`"start": true`) and completes it: the server's CPU per
//!   job end to end, and the wake-up latency from the submission to the
//!   runner's answer (p50, p99).
//!
//! With `--baseline OTHER_RUNWAY` the same rounds run on another build
//! too, alternating, and the table gives each figure's median and the
//! ratio: the old build and the new one on the same machine in the same
//! minutes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use tokio::sync::Mutex;

use crate::load::{finish_job, percentile, record_latency, register_runners, request_job};
use crate::procfs::{context_switches, cpu_time, rss_mib};
use crate::soak::{Scratch, Server};

#[derive(Args, Debug, Clone)]
pub struct PollersArgs {
    /// Runners long-polling at once.
    #[arg(long, default_value_t = 1_000)]
    runners: usize,
    /// The store: `sqlite` (a temporary file) or a PostgreSQL URL (the
    /// benchmark works in schemas of its own and drops them).
    #[arg(long, default_value = "sqlite")]
    store: String,
    /// How long the idle phase is measured.
    #[arg(long, default_value_t = 60)]
    idle_seconds: u64,
    /// Jobs of the stream phase, submitted one at a time.
    #[arg(long, default_value_t = 400)]
    jobs: usize,
    /// Pause between two submissions of the stream.
    #[arg(long, default_value_t = 20)]
    gap_ms: u64,
    /// The long poll's length (`[runner_api] poll_timeout`, seconds).
    #[arg(long, default_value_t = 30)]
    poll_timeout: u64,
    /// Rounds per build (alternating with `--baseline`); medians reported.
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// The `runway` binary to measure; by default the one beside this binary.
    #[arg(long)]
    runway: Option<PathBuf>,
    /// Another `runway` binary (the build before a change) measured in
    /// the same run, rounds alternating.
    #[arg(long)]
    baseline: Option<PathBuf>,
}

const TOKEN: &str = "pollers-admin-token-0123456789";
const POOL: &str = "pollers";
const LABELS: [&str; 2] = ["self-hosted", "linux"];

/// What one round measured.
#[derive(Debug, Clone, Copy)]
struct Figures {
    idle_cpu_percent: f64,
    idle_rss_mib: f64,
    cpu_ms_per_job: f64,
    switches_per_job: f64,
    wake_p50: Duration,
    wake_p99: Duration,
}

impl Figures {
    fn median(rounds: &[Figures]) -> Figures {
        fn mid<T: Copy + PartialOrd>(mut values: Vec<T>) -> T {
            values.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
            values[values.len() / 2]
        }
        Figures {
            idle_cpu_percent: mid(rounds.iter().map(|f| f.idle_cpu_percent).collect()),
            idle_rss_mib: mid(rounds.iter().map(|f| f.idle_rss_mib).collect()),
            cpu_ms_per_job: mid(rounds.iter().map(|f| f.cpu_ms_per_job).collect()),
            switches_per_job: mid(rounds.iter().map(|f| f.switches_per_job).collect()),
            wake_p50: mid(rounds.iter().map(|f| f.wake_p50).collect()),
            wake_p99: mid(rounds.iter().map(|f| f.wake_p99).collect()),
        }
    }
}

fn config_text(url: &str, poll_timeout: u64) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"
database = "{url}"
admin_tokens = ["{TOKEN}"]

[runner_api]
poll_timeout = "{poll_timeout}s"

[[pools]]
name = "{POOL}"
labels = ["self-hosted", "linux"]
max_runners = 100000
"#
    )
}

/// The sum of metric `name`'s series on the server now.
async fn metric(client: &reqwest::Client, base: &str, name: &str) -> f64 {
    let Ok(response) = client.get(format!("{base}/metrics")).send().await else {
        return 0.0;
    };
    let text = response.text().await.unwrap_or_default();
    let series = format!("{name}{{");
    text.lines()
        .filter(|line| line.starts_with(&series))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// How many long polls the server holds now (`runway_runners_polling`).
async fn polling(client: &reqwest::Client, base: &str) -> f64 {
    metric(client, base, "runway_runners_polling").await
}

/// One round on `exe`: a fresh store and server, the runners, both phases.
async fn round(args: &PollersArgs, exe: &Path, dir: &Path, name: &str) -> anyhow::Result<Figures> {
    let store = Scratch::create(&args.store, dir, name).await?;
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(&config, config_text(&store.url, args.poll_timeout))?;
    let result = async {
        let mut server = Server::start(exe, &config).await?;
        let measured = measure(args, &server).await;
        server.stop().await;
        measured
    }
    .await;
    store.drop_it().await;
    result
}

async fn measure(args: &PollersArgs, server: &Server) -> anyhow::Result<Figures> {
    let pid = server.child.id().context("the server has no pid")?;
    let base = server.base.clone();
    let labels: Vec<String> = LABELS.iter().map(|l| (*l).to_owned()).collect();
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.runners + 16)
        .timeout(Duration::from_secs(args.poll_timeout + 60))
        .build()?;
    let run = format!("{:x}", rand::random::<u32>());
    let tokens = register_runners(
        &client,
        std::slice::from_ref(&base),
        TOKEN,
        POOL,
        &labels,
        args.runners,
        &run,
    )
    .await?;
    let submitted: Arc<Mutex<HashMap<i64, Instant>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let received = Arc::new(AtomicU64::new(0));
    let mut pollers = Vec::with_capacity(tokens.len());
    for (_, token) in tokens {
        let (client, base, submitted, latencies, received) = (
            client.clone(),
            base.clone(),
            submitted.clone(),
            latencies.clone(),
            received.clone(),
        );
        pollers.push(tokio::spawn(async move {
            loop {
                let asked = Instant::now();
                let Some(id) = request_job(&client, &base, &token, true).await else {
                    // An empty poll ends at its timeout; one that failed
                    // at once (refused, reset) waits a little first.
                    if asked.elapsed() < Duration::from_secs(1) {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    continue;
                };
                record_latency(&submitted, &latencies, id, Instant::now()).await;
                finish_job(&client, &base, &token, id, (true, false)).await;
                received.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let stop_pollers = |pollers: &[tokio::task::JoinHandle<()>]| {
        for poller in pollers {
            poller.abort();
        }
    };
    // Every runner waiting before anything is measured.
    let deadline = Instant::now() + Duration::from_secs(120);
    while polling(&client, &base).await < args.runners as f64 {
        if Instant::now() > deadline {
            stop_pollers(&pollers);
            bail!("{} long polls were not all held within 120 s", args.runners);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // A poll is counted as it begins, before its first look at the store
    // (a claim): waiting is measured once every runner has made it, so the
    // window holds what waiting costs, not the runners' arrival.
    while metric(&client, &base, "runway_long_poll_looks_total").await < args.runners as f64 {
        if Instant::now() > deadline {
            stop_pollers(&pollers);
            bail!(
                "{} runners did not all look at the queue within 120 s",
                args.runners
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Idle: everyone waits, nothing happens.
    let (cpu_before, idle_started) = (cpu_time(pid)?, Instant::now());
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    let idle_cpu = cpu_time(pid)? - cpu_before;
    let idle_elapsed = idle_started.elapsed();
    let idle_rss = rss_mib(pid)?;
    // Stream: jobs one at a time, each to a waiting runner.
    let (cpu_before, switches_before) = (cpu_time(pid)?, context_switches(pid)?);
    let submitter = client.clone();
    for i in 0..args.jobs {
        let body = serde_json::json!({"labels": labels, "script": "true", "external_id": format!("pollers-{run}-{i}")});
        let sent = Instant::now();
        let response: serde_json::Value = submitter
            .post(format!("{base}/api/v1/jobs"))
            .bearer_auth(TOKEN)
            .json(&body)
            .send()
            .await?
            .json()
            .await?;
        let Some(id) = response["id"].as_i64() else {
            stop_pollers(&pollers);
            bail!("submission refused: {response}");
        };
        submitted.lock().await.insert(id, sent);
        tokio::time::sleep(Duration::from_millis(args.gap_ms)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while received.load(Ordering::Relaxed) < args.jobs as u64 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let stream_cpu = cpu_time(pid)? - cpu_before;
    let stream_switches = context_switches(pid)?.saturating_sub(switches_before);
    stop_pollers(&pollers);
    let done = received.load(Ordering::Relaxed);
    if done < args.jobs as u64 {
        bail!(
            "{} of {} jobs never completed",
            args.jobs as u64 - done,
            args.jobs
        );
    }
    let mut latencies = latencies.lock().await.clone();
    latencies.sort();
    Ok(Figures {
        idle_cpu_percent: idle_cpu.as_secs_f64() / idle_elapsed.as_secs_f64() * 100.0,
        idle_rss_mib: idle_rss,
        cpu_ms_per_job: stream_cpu.as_secs_f64() * 1_000.0 / args.jobs.max(1) as f64,
        switches_per_job: stream_switches as f64 / args.jobs.max(1) as f64,
        wake_p50: percentile(&latencies, 50.0),
        wake_p99: percentile(&latencies, 99.0),
    })
}

/// A row of the table: what, the figure, its unit.
type Row = (&'static str, fn(&Figures) -> f64, &'static str);

pub async fn pollers(args: PollersArgs) -> anyhow::Result<()> {
    let exe = crate::runway_binary(args.runway.as_deref())?;
    let dir = std::env::temp_dir().join(format!("runway-pollers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let result = async {
        let (mut new, mut old) = (Vec::new(), Vec::new());
        for r in 0..args.repeat.max(1) {
            let mut builds = vec![("this", exe.as_path(), &mut new)];
            if let Some(baseline) = &args.baseline {
                builds.push(("baseline", baseline.as_path(), &mut old));
            }
            // Alternate which build goes first.
            if r % 2 == 1 {
                builds.reverse();
            }
            for (name, exe, figures) in builds {
                let measured = round(&args, exe, &dir, &format!("{name}-{r}")).await?;
                eprintln!("round {r} {name}: {measured:?}");
                figures.push(measured);
            }
        }
        Ok::<_, anyhow::Error>((new, old))
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    let (new, old) = result?;
    let new = Figures::median(&new);
    let old = (!old.is_empty()).then(|| Figures::median(&old));
    let backend = if args.store == "sqlite" {
        "SQLite"
    } else {
        "PostgreSQL"
    };
    println!();
    println!(
        "{backend}, {} runners waiting, {} jobs, median of {}",
        args.runners,
        args.jobs,
        args.repeat.max(1)
    );
    let rows: [Row; 6] = [
        ("idle CPU, % of a core", |f| f.idle_cpu_percent, "%"),
        ("idle RSS", |f| f.idle_rss_mib, " MiB"),
        ("CPU per job, end to end", |f| f.cpu_ms_per_job, " ms"),
        ("context switches per job", |f| f.switches_per_job, ""),
        ("wake-up p50", |f| f.wake_p50.as_secs_f64() * 1_000.0, " ms"),
        ("wake-up p99", |f| f.wake_p99.as_secs_f64() * 1_000.0, " ms"),
    ];
    match old {
        Some(old) => {
            println!("| measure | this build | baseline | ratio |");
            println!("| --- | ---: | ---: | ---: |");
            for (what, of, unit) in rows {
                println!(
                    "| {what} | {:.2}{unit} | {:.2}{unit} | {:.2}× |",
                    of(&new),
                    of(&old),
                    of(&new) / of(&old)
                );
            }
        }
        None => {
            println!("| measure | this build |");
            println!("| --- | ---: |");
            for (what, of, unit) in rows {
                println!("| {what} | {:.2}{unit} |", of(&new));
            }
        }
    }
    Ok(())
}
