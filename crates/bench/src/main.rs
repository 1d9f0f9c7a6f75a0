//! `runway-bench`: runway's load generators, apart from the product
//! binary. Each subcommand drives a running `runway` (or starts one, or an
//! in-process reconciler on a scratch store) and prints what it measured;
//! BENCHMARKS.md gives the command behind each figure.

mod first_start;
mod load;
mod pollers;
mod procfs;
mod seed;
mod soak;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "runway-bench",
    version,
    about = "Load generators and benchmarks for runway (not needed to run it). Logs go to standard error; the level is set with RUNWAY_LOG."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Send distinct signed `queued` webhooks to a runway and report throughput and latency.
    Intake(load::IntakeArgs),
    /// Measure how fast a submitted job reaches one of many long-polling runners.
    Longpoll(load::LongPollArgs),
    /// Submit jobs, then drain them through many runners (request, accept,
    /// complete), over one or several replicas; report both rates.
    Drain(load::DrainArgs),
    /// What a long history costs: a server on an empty store against one
    /// with a million finished jobs, ended runners and deliveries.
    Soak(soak::SoakArgs),
    /// What a predictive pool's first read of a long history costs the
    /// reconciler's rounds (an in-process reconciler on a scratch store).
    ForecastSeed(seed::SeedArgs),
    /// What a deep queue costs the reconciler's rounds: 1,000 against
    /// 100,000 queued jobs (in-process reconcilers on scratch stores).
    DeepQueue(seed::DeepQueueArgs),
    /// What waiting runners cost a server: CPU and RSS with N long polls
    /// held and no job, then CPU per job and wake-up latency while they
    /// wait (optionally against a baseline build, rounds alternating).
    Pollers(pollers::PollersArgs),
    /// How long a job waits for its runner on pools that differ in how it
    /// comes (cold boot, stopped runner started), one job at a time.
    FirstStart(first_start::FirstStartArgs),
}

/// The `runway` binary: `explicit`, or the one beside this binary.
pub(crate) fn runway_binary(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        return Ok(path.to_owned());
    }
    let me = std::env::current_exe().context("cannot find this binary")?;
    let beside = me.with_file_name(format!("runway{}", std::env::consts::EXE_SUFFIX));
    anyhow::ensure!(
        beside.exists(),
        "no runway binary at {} (build it: cargo build --release --locked -p runway), or pass --runway PATH",
        beside.display()
    );
    Ok(beside)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let filter =
        EnvFilter::try_from_env("RUNWAY_LOG").unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match Cli::parse().command {
        Command::Intake(args) => load::intake(args).await,
        Command::Longpoll(args) => load::longpoll(args).await,
        Command::Drain(args) => load::drain(args).await,
        Command::Soak(args) => soak::soak(args).await,
        Command::ForecastSeed(args) => seed::forecast_seed(args).await,
        Command::DeepQueue(args) => seed::deep_queue(args).await,
        Command::Pollers(args) => pollers::pollers(args).await,
        Command::FirstStart(args) => first_start::first_start(args).await,
    }
}
