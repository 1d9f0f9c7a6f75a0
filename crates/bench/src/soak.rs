//! `runway-bench soak`: what a long history costs a running server. Starts
//! `runway serve` (`--runway`, by default the `runway` beside this binary) twice on the same config, first on an empty
//! store, then on a store seeded with a long history (finished jobs, ended
//! runners, webhook deliveries: `--history` of each), and measures in each,
//! from outside: `GET /api/v1/pools` and `GET /api/v1/jobs?limit=50`
//! latency, webhook intake throughput and p99, and the mean reconcile round
//! (`runway_reconcile_duration_seconds`) with the queue intake left. Prints
//! both and their ratio. SQLite works in a temporary directory; PostgreSQL
//! in schemas of its own, dropped at the end.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use runway_store::seed::{self, History};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::load::{run_intake, IntakeArgs};

#[derive(Args, Debug, Clone)]
pub struct SoakArgs {
    /// The store: `sqlite` (a temporary file) or a PostgreSQL URL (the
    /// benchmark works in schemas of its own and drops them).
    #[arg(long, default_value = "sqlite")]
    store: String,
    /// Finished jobs, ended runners and webhook deliveries in the long
    /// history (each): jobs over the 29 days before now, runners and
    /// deliveries over 6, all within the default retention.
    #[arg(long, default_value_t = 1_000_000)]
    history: u64,
    /// Webhooks each intake run sends (each a new queued job).
    #[arg(long, default_value_t = 4_000)]
    webhooks: u64,
    /// Connections the intake run keeps busy.
    #[arg(long, default_value_t = 16)]
    concurrency: u64,
    /// Requests to each read endpoint, one at a time. Enough that they
    /// span several reconcile rounds (one a second): with 500, the reads
    /// took about a second, so whether a round fell among them decided the
    /// p99 of a phase.
    #[arg(long, default_value_t = 5_000)]
    requests: u32,
    /// Reconcile rounds to average (one a second).
    #[arg(long, default_value_t = 15)]
    rounds: u64,
    /// Runs of each phase, alternating empty and history so the machine's
    /// drift falls on both; the table gives each figure's median.
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// The `runway` binary to serve with; by default the one beside this
    /// binary (cargo builds both into the same directory).
    #[arg(long)]
    runway: Option<std::path::PathBuf>,
}

/// What one phase measured.
#[derive(Clone, Copy)]
struct Figures {
    pools_p50: Duration,
    pools_p99: Duration,
    jobs_p50: Duration,
    jobs_p99: Duration,
    intake_per_second: f64,
    intake_p99: Duration,
    round_mean: Duration,
}

impl Figures {
    /// Each figure's median over `runs` (the upper one of an even count).
    fn median(runs: &[Figures]) -> Figures {
        fn mid<T: Copy + PartialOrd>(mut values: Vec<T>) -> T {
            values.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
            values[values.len() / 2]
        }
        let of = |f: fn(&Figures) -> Duration| mid(runs.iter().map(f).collect());
        Figures {
            pools_p50: of(|f| f.pools_p50),
            pools_p99: of(|f| f.pools_p99),
            jobs_p50: of(|f| f.jobs_p50),
            jobs_p99: of(|f| f.jobs_p99),
            intake_per_second: mid(runs.iter().map(|f| f.intake_per_second).collect()),
            intake_p99: of(|f| f.intake_p99),
            round_mean: of(|f| f.round_mean),
        }
    }
}

const SECRET: &str = "soak-webhook-secret";
const TOKEN: &str = "soak-admin-token-0123456789";
const POOL: &str = "soak";

pub async fn soak(args: SoakArgs) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("runway-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let result = async {
        let (mut empty, mut long) = (Vec::new(), Vec::new());
        for run in 0..args.repeat.max(1) {
            // Alternate which phase goes first, so neither always runs on
            // a machine the other has just warmed (or loaded).
            if run % 2 == 0 {
                empty.push(phase(&args, &dir, "empty", 0).await?);
                long.push(phase(&args, &dir, "history", args.history).await?);
            } else {
                long.push(phase(&args, &dir, "history", args.history).await?);
                empty.push(phase(&args, &dir, "empty", 0).await?);
            }
        }
        Ok::<_, anyhow::Error>((Figures::median(&empty), Figures::median(&long)))
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    let (empty, long) = result?;
    let backend = if args.store == "sqlite" {
        "SQLite"
    } else {
        "PostgreSQL"
    };
    println!();
    let of = if args.repeat > 1 {
        format!(" (median of {})", args.repeat)
    } else {
        String::new()
    };
    println!(
        "| {backend}{of} | empty store | {} finished jobs, ended runners, deliveries | ratio |",
        args.history
    );
    println!("| --- | ---: | ---: | ---: |");
    let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1_000.0);
    let ratio = |a: f64, b: f64| format!("{:.2}×", b / a);
    let rows = [
        ("reconcile round (mean)", empty.round_mean, long.round_mean),
        ("`GET /api/v1/pools` p50", empty.pools_p50, long.pools_p50),
        ("`GET /api/v1/pools` p99", empty.pools_p99, long.pools_p99),
        (
            "`GET /api/v1/jobs?limit=50` p50",
            empty.jobs_p50,
            long.jobs_p50,
        ),
        (
            "`GET /api/v1/jobs?limit=50` p99",
            empty.jobs_p99,
            long.jobs_p99,
        ),
        ("intake p99", empty.intake_p99, long.intake_p99),
    ];
    for (what, a, b) in rows {
        println!(
            "| {what} | {} | {} | {} |",
            ms(a),
            ms(b),
            ratio(a.as_secs_f64(), b.as_secs_f64())
        );
    }
    println!(
        "| intake ({} connections) | {:.0}/s | {:.0}/s | {} |",
        args.concurrency,
        empty.intake_per_second,
        long.intake_per_second,
        ratio(empty.intake_per_second, long.intake_per_second)
    );
    Ok(())
}

/// One server run on a store of its own, with `history` rows seeded first.
async fn phase(args: &SoakArgs, dir: &Path, name: &str, history: u64) -> anyhow::Result<Figures> {
    let store = Scratch::create(&args.store, dir, name).await?;
    let result = measure(args, dir, name, history, &store.url).await;
    store.drop_it().await;
    result
}

async fn measure(
    args: &SoakArgs,
    dir: &Path,
    name: &str,
    history: u64,
    url: &str,
) -> anyhow::Result<Figures> {
    // Migrate, then seed outside any timing.
    drop(
        runway_store::open(url, &runway_store::OpenOptions::default())
            .await
            .context("cannot open the store")?,
    );
    if history > 0 {
        let now = runway_server::clock::now();
        let day = Duration::from_secs(24 * 3600);
        let started = Instant::now();
        seed::seed_history(
            url,
            &History {
                pool: POOL.to_owned(),
                count: history,
                // Within the default retention (30 days of jobs, 7 of
                // runners and deliveries): the steady state, not a first
                // prune.
                jobs_span: day * 29,
                span: day * 6,
                to: now.minus(Duration::from_secs(3600)),
            },
        )
        .await
        .context("cannot seed the history")?;
        eprintln!(
            "seeded {history} finished jobs, ended runners and deliveries in {:.1} s",
            started.elapsed().as_secs_f64()
        );
    }
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(&config, config_text(url))
        .with_context(|| format!("cannot write {}", config.display()))?;
    let mut server = Server::start(&crate::runway_binary(args.runway.as_deref())?, &config).await?;
    let base = server.base.clone();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    wait_ready(&client, &base).await?;
    // The first retention pass (at start) counts every table; measure the
    // steady state after it, as an operator's day would.
    let deadline = Instant::now() + Duration::from_secs(300);
    while metric_lines(&client, &base, "runway_store_rows{")
        .await?
        .is_empty()
    {
        if Instant::now() > deadline {
            bail!("{name}: the first retention pass did not finish within 300 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("{name}: runway serve on {base}");

    let intake = run_intake(&IntakeArgs {
        url: vec![format!("{base}/webhooks/github")],
        secret: SECRET.to_owned(),
        count: args.webhooks,
        rate: 0,
        concurrency: args.concurrency,
        max_seconds: 120,
        labels: "self-hosted,linux,x64".to_owned(),
        body_bytes: 7_168,
        server_pid: None,
    })
    .await?;
    if intake.accepted() < intake.sent() {
        bail!(
            "{name}: {} of {} webhooks were not answered 2xx: {:?}",
            intake.sent() - intake.accepted(),
            intake.sent(),
            intake.statuses
        );
    }
    // The reads after the intake, so both phases list and count the same
    // live jobs (the newest 50 are the intake's); warmed up the same way.
    let _ = timed_gets(&client, &base, "/api/v1/pools", 10).await?;
    let pools = timed_gets(&client, &base, "/api/v1/pools", args.requests).await?;
    let jobs = timed_gets(&client, &base, "/api/v1/jobs?limit=50", args.requests).await?;
    let round_mean = mean_round(&client, &base, args.rounds).await?;
    let pruned = metric_sum(&client, &base, "runway_retention_pruned_total").await?;
    eprintln!(
        "{name}: retention pruned {} rows during the run",
        pruned as u64
    );
    server.stop().await;
    Ok(Figures {
        pools_p50: percentile(&pools, 50.0),
        pools_p99: percentile(&pools, 99.0),
        jobs_p50: percentile(&jobs, 50.0),
        jobs_p99: percentile(&jobs, 99.0),
        intake_per_second: intake.per_second(),
        intake_p99: intake.percentile(99.0),
        round_mean,
    })
}

fn config_text(url: &str) -> String {
    format!(
        r#"[server]
listen = "127.0.0.1:0"
database = "{url}"
admin_tokens = ["{TOKEN}"]

[github]
webhook_secrets = ["{SECRET}"]

[scaling]
interval = "1s"

[[providers]]
name = "sim"
kind = "sim"
boot_seconds = 1
max_instances = 100

[[pools]]
name = "{POOL}"
labels = ["self-hosted", "linux", "x64"]
max_runners = 50
providers = ["sim"]
"#
    )
}

/// `count` sequential GETs of `path` with the admin token; sorted latencies.
async fn timed_gets(
    client: &reqwest::Client,
    base: &str,
    path: &str,
    count: u32,
) -> anyhow::Result<Vec<Duration>> {
    let mut latencies = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let started = Instant::now();
        let response = client
            .get(format!("{base}{path}"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .with_context(|| format!("GET {path}"))?;
        let status = response.status();
        let _ = response.bytes().await?;
        latencies.push(started.elapsed());
        if !status.is_success() {
            bail!("GET {path} answered {status}");
        }
    }
    latencies.sort();
    Ok(latencies)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The mean duration of the next `rounds` reconcile rounds, from the
/// server's own histogram.
async fn mean_round(client: &reqwest::Client, base: &str, rounds: u64) -> anyhow::Result<Duration> {
    let (sum0, count0) = round_totals(client, base).await?;
    let deadline = Instant::now() + Duration::from_secs(rounds * 10 + 30);
    loop {
        let (sum, count) = round_totals(client, base).await?;
        if count - count0 >= rounds as f64 {
            return Ok(Duration::from_secs_f64((sum - sum0) / (count - count0)));
        }
        if Instant::now() > deadline {
            bail!(
                "only {} reconcile rounds ran in {} s",
                count - count0,
                rounds * 10 + 30
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn round_totals(client: &reqwest::Client, base: &str) -> anyhow::Result<(f64, f64)> {
    Ok((
        metric_sum(client, base, "runway_reconcile_duration_seconds_sum").await?,
        metric_sum(client, base, "runway_reconcile_duration_seconds_count").await?,
    ))
}

/// The sum of the `/metrics` samples whose line starts with `series`.
async fn metric_sum(client: &reqwest::Client, base: &str, series: &str) -> anyhow::Result<f64> {
    Ok(metric_lines(client, base, series)
        .await?
        .iter()
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// The `/metrics` lines that start with `series`.
async fn metric_lines(
    client: &reqwest::Client,
    base: &str,
    series: &str,
) -> anyhow::Result<Vec<String>> {
    let text = client
        .get(format!("{base}/metrics"))
        .send()
        .await?
        .text()
        .await?;
    Ok(text
        .lines()
        .filter(|line| line.starts_with(series))
        .map(str::to_owned)
        .collect())
}

async fn wait_ready(client: &reqwest::Client, base: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = client
            .get(format!("{base}/readyz"))
            .send()
            .await
            .map(|r| r.status().is_success())
            .unwrap_or(false);
        if ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("runway at {base} was not ready within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `runway serve` on a config file.
pub(crate) struct Server {
    pub(crate) child: tokio::process::Child,
    pub(crate) base: String,
}

impl Server {
    pub(crate) async fn start(exe: &Path, config: &Path) -> anyhow::Result<Server> {
        let mut child = tokio::process::Command::new(exe)
            .arg("serve")
            .arg("--config")
            .arg(config)
            .env("RUNWAY_LOG", "info")
            .env_remove("RUNWAY_CONFIG")
            .env_remove("RUNWAY_DATABASE_URL")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("cannot start runway serve")?;
        let stderr = child.stderr.take().context("no stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        let base = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await? {
                if let Some(rest) = line.split("address=http://").nth(1) {
                    let address = rest.split_whitespace().next().unwrap_or_default();
                    return Ok(format!("http://{address}"));
                }
            }
            bail!("runway serve exited before it listened")
        })
        .await
        .context("runway serve did not report its address within 60 s")??;
        // Keep draining its log so it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Server { child, base })
    }

    /// SIGTERM, then SIGKILL if it has not stopped within 30 s.
    pub(crate) async fn stop(&mut self) {
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) on our own child's pid has no memory effects.
            unsafe {
                libc::kill(pid as i32, libc::SIGTERM);
            }
        }
        if tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// A store of its own for one phase.
pub(crate) struct Scratch {
    pub(crate) url: String,
    /// PostgreSQL: (the server URL, the schema).
    schema: Option<(String, String)>,
    file: Option<PathBuf>,
}

impl Scratch {
    pub(crate) async fn create(store: &str, dir: &Path, name: &str) -> anyhow::Result<Scratch> {
        if store == "sqlite" {
            let file = dir.join(format!("{name}.db"));
            return Ok(Scratch {
                url: format!("sqlite://{}", file.display()),
                schema: None,
                file: Some(file),
            });
        }
        if !(store.starts_with("postgres://") || store.starts_with("postgresql://")) {
            bail!("--store is `sqlite` or a postgres:// URL");
        }
        let schema = format!("runway_soak_{}_{name}", std::process::id());
        let url = seed::scratch_schema(store, &schema)
            .await
            .context("cannot create a scratch schema")?;
        Ok(Scratch {
            url,
            schema: Some((store.to_owned(), schema)),
            file: None,
        })
    }

    pub(crate) async fn drop_it(self) {
        if let Some((server, schema)) = &self.schema {
            if let Err(error) = seed::drop_schema(server, schema).await {
                eprintln!("could not drop schema {schema}: {error}");
            }
        }
        if let Some(file) = &self.file {
            for suffix in ["", "-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
            }
        }
    }
}
