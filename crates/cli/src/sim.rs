//! `runway sim`: replays a trace or a synthetic workload against scaling
//! policies on a virtual clock, with the pools and providers of a runway
//! config file. See docs/sim.md.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use runway_core::planner::PoolPolicy;
use runway_providers::factory::ProviderKind;
use runway_server::config::{Config, Overrides, PoolConfig, ProviderConfig};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use runway_sim::report::{compare_counting, Summary};
use runway_sim::{PoolModel, ProviderModel, Setup, Workload};

#[derive(Clone, Copy, ValueEnum)]
pub enum Format {
    Table,
    Json,
    Csv,
}

#[derive(Args)]
pub struct SimArgs {
    /// Pools and providers come from this runway config (as `runway serve`
    /// reads it). Without one: pool `default` (self-hosted, linux, x64;
    /// max_runners 50) on a sim provider booting in 120–180 s at $0.10/h.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// A trace: JSON lines or CSV (docs/sim.md).
    #[arg(long, value_name = "FILE", conflicts_with = "workload")]
    trace: Option<PathBuf>,
    /// A synthetic workload: poisson, diurnal, bursty, mixed, monorepo,
    /// scheduled, fanout or changing (docs/sim.md).
    #[arg(long, value_name = "NAME")]
    workload: Option<String>,
    /// Days the synthetic workload spans.
    #[arg(long, default_value_t = 30)]
    days: u32,
    /// About how many jobs the synthetic workload has.
    #[arg(long, default_value_t = 50_000)]
    jobs: u64,
    /// Seeds the workload and the providers' randomness.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Policies to compare, comma-separated: oracle, runway,
    /// predictive[:QUANTILE], static:N, arc, taskcluster, lambda, gitlab,
    /// reactive-prespawn, or all.
    #[arg(long, value_delimiter = ',', default_value = "all")]
    policy: Vec<String>,
    /// Sweep the predictive policy's wait_value (its quantile) on this
    /// workload beside the reactive policy and the oracle: print every
    /// setting's cost and waits, the cost-versus-mean-wait frontier and the
    /// cheapest setting close to the oracle (with --plot, tune.svg).
    /// Replaces --policy.
    #[arg(long)]
    tune: bool,
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
    /// Write SVG charts into this directory.
    #[arg(long, value_name = "DIR")]
    plot: Option<PathBuf>,
}

fn default_config() -> Config {
    Config {
        pools: vec![PoolConfig {
            max_runners: 50,
            ..PoolConfig::default()
        }],
        providers: vec![ProviderConfig::default()],
        ..Config::default()
    }
}

/// The simulator's view of a runway configuration.
pub fn setup_of(config: &Config, seed: u64) -> Setup {
    let providers = if config.providers.is_empty() {
        vec![ProviderConfig::default()]
    } else {
        config.providers.clone()
    };
    Setup {
        pools: config
            .pools
            .iter()
            .map(|p| PoolModel {
                policy: PoolPolicy {
                    name: p.name.clone(),
                    min_idle: p.min_idle,
                    max_runners: p.max_runners,
                    scaling_ratio: config.scaling_ratio(p, &config.worker_configs),
                    idle_grace: p.idle_grace,
                    boot_timeout: p.boot_timeout,
                    providers: p.providers.clone(),
                    paused: false,
                    delete_surplus_boots: false,
                },
                labels: p.labels.clone(),
                ephemeral: p.ephemeral,
                forecast_quantile: p.forecast_quantile(),
                stopped: p.stopped_policy(),
                stopped_quantile: runway_core::stopped::quantile_for(
                    p.wait_value,
                    stopped_fraction(&providers, p),
                ),
            })
            .collect(),
        providers: providers
            .iter()
            .map(|p| ProviderModel {
                name: p.name.clone(),
                boot_seconds: p.boot_seconds,
                // Only a simulated cloud fails on purpose.
                fail_rate: match p.kind {
                    ProviderKind::Sim { fail_rate, .. } => fail_rate,
                    _ => 0.0,
                },
                price_per_hour: p.price_per_hour,
                max_instances: p.max_instances,
                resume_seconds: p.resume_seconds,
                stopped_price_per_hour: p.stopped_price(),
            })
            .collect(),
        interval: config.scaling.interval,
        default_pool: config.routing.default_pool.clone(),
        required_labels: config.github.required_labels.clone(),
        seed,
    }
}

/// A stopped hour's price as a share of a running one, on the first of
/// `pool`'s providers that keeps stopped runners.
fn stopped_fraction(providers: &[ProviderConfig], pool: &PoolConfig) -> f64 {
    providers
        .iter()
        .filter(|p| pool.providers.is_empty() || pool.providers.contains(&p.name))
        .find(|p| p.resume_seconds.is_some())
        .map_or(1.0, |p| p.stopped_fraction())
}

pub fn run(args: SimArgs) -> anyhow::Result<()> {
    let config = match &args.config {
        Some(path) => Config::load(Some(path), &Overrides::default())?,
        None => default_config(),
    };
    let setup = setup_of(&config, args.seed);
    let jobs = match (&args.trace, &args.workload) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read trace {}", path.display()))?;
            runway_sim::trace::parse(&text).with_context(|| format!("trace {}", path.display()))?
        }
        (None, Some(name)) => Workload {
            kind: name.parse()?,
            days: args.days,
            jobs: args.jobs,
            seed: args.seed,
            pools: setup.pools.iter().map(|p| p.labels.clone()).collect(),
        }
        .generate(),
        (None, None) => anyhow::bail!("give a workload: --trace FILE or --workload NAME"),
    };
    let policies: Vec<String> = if args.tune {
        runway_sim::tune::policies()
    } else if args.policy.iter().any(|p| p == "all") {
        let mut all: Vec<String> = runway_sim::policy::ALL
            .iter()
            .map(|p| p.to_string())
            .collect();
        // Where a pool keeps stopped runners, the policies that use them too.
        if setup.pools.iter().any(|p| p.stopped.keeps_any()) {
            all.extend(["runway+stopped".to_owned(), "predictive+stopped".to_owned()]);
        }
        all
    } else {
        args.policy.clone()
    };
    let started = std::time::Instant::now();
    eprintln!(
        "simulating {} jobs over {:.1} days with {} policies…",
        jobs.len(),
        jobs.last().map_or(0, |j| j.arrival_ms) as f64 / 86_400_000.0,
        policies.len()
    );
    let arrived = AtomicU64::new(0);
    let total = (jobs.len() * policies.len()) as u64;
    let finished = AtomicBool::new(false);
    let outcomes = std::thread::scope(|scope| {
        // A progress bar on stderr, for runs long enough to want one.
        if std::io::stderr().is_terminal() {
            scope.spawn(|| progress(&arrived, total, &finished));
        }
        let outcomes = compare_counting(&setup, &jobs, &policies, &arrived);
        finished.store(true, Ordering::Relaxed);
        outcomes
    })?;
    eprintln!("done in {:.1} s", started.elapsed().as_secs_f64());
    let mut summaries: Vec<Summary> = outcomes.iter().map(Summary::of).collect();
    runway_sim::report::relate(&mut summaries);
    if args.tune {
        let tuning = runway_sim::tune::tune(&summaries);
        print!("{}", runway_sim::tune::report(&tuning));
        if let Some(dir) = &args.plot {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            runway_sim::plot::tune(&dir.join("tune.svg"), &tuning)
                .with_context(|| format!("cannot write tune.svg to {}", dir.display()))?;
            eprintln!("chart written to {}", dir.join("tune.svg").display());
        }
        return Ok(());
    }
    let text = match args.format {
        Format::Table => runway_sim::report::table(&summaries),
        Format::Json => runway_sim::report::json(&summaries),
        Format::Csv => runway_sim::report::csv(&summaries),
    };
    print!("{text}");
    if let Some(dir) = &args.plot {
        runway_sim::plot::write_all(dir, &outcomes, &summaries)
            .with_context(|| format!("cannot write charts to {}", dir.display()))?;
        eprintln!("charts written to {}", dir.display());
    }
    Ok(())
}

/// Redraws `[#####     ] 48%` on stderr every 200 ms until `finished`,
/// once a run has taken a second.
fn progress(arrived: &AtomicU64, total: u64, finished: &AtomicBool) {
    let started = std::time::Instant::now();
    let mut drawn = false;
    while !finished.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(200));
        if started.elapsed() < Duration::from_secs(1) {
            continue;
        }
        let share = arrived.load(Ordering::Relaxed) as f64 / total.max(1) as f64;
        let filled = (share * 30.0).round() as usize;
        eprint!(
            "\r[{}{}] {:3.0}%",
            "#".repeat(filled.min(30)),
            " ".repeat(30 - filled.min(30)),
            share * 100.0
        );
        drawn = true;
    }
    if drawn {
        eprint!("\r{}\r", " ".repeat(40));
    }
}
