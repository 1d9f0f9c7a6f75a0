//! The `runway` binary.

mod act;
mod admin;
mod agent;
mod secrets;
mod sim;
mod trace;

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand, ValueEnum};
use runway_server::{Config, Overrides};
use tracing_subscriber::EnvFilter;

/// mimalloc, not glibc's malloc, for Rust and (its `override` feature)
/// for the bundled SQLite alike: a server holding 10,000 long polls spent
/// a third of its CPU in glibc's free-list upkeep (`_int_malloc`,
/// `unlink_chunk`, `malloc_consolidate`), behind every request's small
/// allocations once the rounds' large reads had fragmented its heap
/// (BENCHMARKS.md, issue 59).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "runway",
    version,
    about = "Routes CI jobs to self-hosted runners and keeps exactly as many runners alive as the work needs."
)]
struct Cli {
    /// Log format on standard error. The level is set with RUNWAY_LOG (e.g. `debug`, `info,runway_server=debug`).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run the service: HTTP API, queue, reconciler and background workers.
    Serve(ConfigArgs),
    /// Work with configuration files.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// List jobs of a running runway, newest first.
    Jobs(admin::JobsArgs),
    /// List the pools of a running runway with their queues and runners.
    Pools(admin::Connection),
    /// List the runners of a running runway.
    Runners(admin::RunnersArgs),
    /// Cancel a queued, provisioning or running job.
    Cancel(act::CancelArgs),
    /// Queue a failed or cancelled job of runway's job API again, as a new job.
    Retry(act::JobArgs),
    /// Drain a runner: no new job; it stops after its current one.
    Drain(act::RunnerArgs),
    /// Terminate an idle runner now (a busy one only with --force).
    Terminate(act::TerminateArgs),
    /// Pause a pool: its queue is kept, no runner is started for it.
    Pause(act::PoolArgs),
    /// Resume a paused pool.
    Resume(act::PoolArgs),
    /// Make a running runway read its config file again (as SIGHUP does).
    Reload(admin::Connection),
    /// Every transition of a job, with its time, runner and reason.
    History(act::JobArgs),
    /// Who changed what through the admin API, newest first.
    Audit(act::AuditArgs),
    /// Print a one-time registration token for `runway agent --token`.
    RegistrationToken(admin::RegistrationTokenArgs),
    /// Submit a job: `runway submit [--labels a,b] [--wait] -- COMMAND...`.
    Submit(admin::SubmitArgs),
    /// Run the reference runner: register, take jobs, run them with `sh -c`.
    Agent(agent::AgentArgs),
    /// Replay a CI workload against scaling policies on a virtual clock.
    Sim(sim::SimArgs),
    /// Traces of the jobs runway saw, for `runway sim --trace`.
    #[command(subcommand)]
    Trace(TraceCommand),
}

#[derive(Subcommand)]
enum TraceCommand {
    /// Write the jobs first seen within `--since` that ran, from the store,
    /// as a `runway sim` trace (JSON lines).
    Export(trace::ExportArgs),
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Validate a configuration and print the effective one, secrets redacted.
    Check(ConfigArgs),
    /// Evaluate one worker configuration (a JSON file) for some condition inputs and print the result as JSON.
    Eval(EvalArgs),
}

#[derive(Args)]
struct EvalArgs {
    /// The worker configuration: a JSON file like examples/worker-config.json.
    file: PathBuf,
    /// A condition input, NAME=VALUE (e.g. provider=ec2, region=us-east-1); repeatable.
    #[arg(long = "set", value_name = "NAME=VALUE")]
    inputs: Vec<String>,
    /// A runway config whose [providers] check condition names and results;
    /// the provider named by `--set provider=NAME` adds its configured
    /// `inputs` (as at launch; `--set` wins). Without it, evaluation is
    /// standalone: any condition name is accepted and no provider
    /// validation runs.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

#[derive(Args)]
struct ConfigArgs {
    #[command(flatten)]
    source: ConfigSource,
    /// Address to listen on; overrides `[server] listen`.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
}

/// Where a command's configuration and store come from.
#[derive(Args, Debug)]
pub struct ConfigSource {
    /// The TOML configuration file (see examples/runway.toml). Without one, built-in defaults apply.
    #[arg(long, env = "RUNWAY_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Database URL (sqlite://PATH or postgres://USER@HOST/DB); overrides `[server] database`.
    #[arg(
        long,
        env = "RUNWAY_DATABASE_URL",
        hide_env_values = true,
        value_name = "URL"
    )]
    database: Option<String>,
}

impl ConfigSource {
    pub fn load(&self, listen: Option<SocketAddr>) -> anyhow::Result<Config> {
        Ok(Config::load(
            self.config.as_deref(),
            &self.overrides(listen),
        )?)
    }

    fn overrides(&self, listen: Option<SocketAddr>) -> Overrides {
        Overrides {
            listen,
            database: self.database.clone(),
        }
    }
}

impl ConfigArgs {
    fn load(&self) -> anyhow::Result<Config> {
        self.source.load(self.listen)
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    // Secrets read from the environment leave it before any thread starts
    // (and so before anything can be spawned): `runway serve` loads its
    // configuration here for that reason.
    let prepared = match prepare(cli.command) {
        Ok(prepared) => prepared,
        Err(error) => return report(error),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(prepared)) {
        Ok(code) => code,
        Err(error) => report(error),
    }
}

/// One line, whole cause chain: what failed and why.
fn report(error: anyhow::Error) -> ExitCode {
    let message = format!("{error:#}");
    eprintln!(
        "error: {}",
        message.split_whitespace().collect::<Vec<_>>().join(" ")
    );
    ExitCode::FAILURE
}

/// A command ready to run: `serve` with its configuration loaded.
enum Prepared {
    Serve(ConfigArgs, Box<Config>),
    Other(Command),
}

/// Loads what must be loaded before the runtime starts, and removes from
/// the environment every secret read from it: a serve's `env:` secrets and
/// `RUNWAY_DATABASE_URL`, an agent's registration token.
fn prepare(command: Command) -> anyhow::Result<Prepared> {
    match command {
        Command::Serve(args) => {
            // Configuration first: a bad file must not create or touch a database.
            let config = args.load()?;
            let mut names = config.secret_environment_variables();
            names.push("RUNWAY_DATABASE_URL".to_owned());
            runway_server::config::secret::remember_environment(&names);
            secrets::scrub(&names);
            Ok(Prepared::Serve(args, Box::new(config)))
        }
        Command::Agent(args) => {
            secrets::scrub(&[
                "RUNWAY_REGISTRATION_TOKEN".to_owned(),
                "RUNWAY_INSTANCE_TOKEN".to_owned(),
            ]);
            Ok(Prepared::Other(Command::Agent(args)))
        }
        other => Ok(Prepared::Other(other)),
    }
}

fn init_logging(format: LogFormat) {
    let filter =
        EnvFilter::try_from_env("RUNWAY_LOG").unwrap_or_else(|_| EnvFilter::new("info,sqlx=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

async fn run(prepared: Prepared) -> anyhow::Result<ExitCode> {
    let command = match prepared {
        Prepared::Serve(args, config) => {
            serve(args, *config).await?;
            return Ok(ExitCode::SUCCESS);
        }
        Prepared::Other(command) => command,
    };
    match command {
        Command::Submit(args) => return admin::submit(args).await,
        // `prepare` loads a serve's configuration; this arm is not reached.
        Command::Serve(args) => {
            let config = args.load()?;
            serve(args, config).await?
        }
        Command::Config(ConfigCommand::Check(args)) => {
            let config = args.load()?;
            print!("{}", config.to_redacted_toml());
        }
        Command::Config(ConfigCommand::Eval(args)) => eval_worker_config(args)?,
        Command::Jobs(args) => admin::jobs(args).await?,
        Command::Pools(connection) => admin::pools(connection).await?,
        Command::Runners(args) => admin::runners(args).await?,
        Command::Agent(args) => agent::run(args).await?,
        Command::Sim(args) => sim::run(args)?,
        Command::Trace(TraceCommand::Export(args)) => trace::export(args).await?,
        Command::RegistrationToken(args) => admin::registration_token(args).await?,
        Command::Cancel(args) => act::cancel(args).await?,
        Command::Retry(args) => act::retry(args).await?,
        Command::Drain(args) => act::drain(args).await?,
        Command::Terminate(args) => act::terminate(args).await?,
        Command::Pause(args) => act::pause(args, true).await?,
        Command::Resume(args) => act::pause(args, false).await?,
        Command::Reload(connection) => act::reload(connection).await?,
        Command::History(args) => act::history(args).await?,
        Command::Audit(args) => act::audit(args).await?,
    }
    Ok(ExitCode::SUCCESS)
}

fn eval_worker_config(args: EvalArgs) -> anyhow::Result<()> {
    let runway_config = match &args.config {
        Some(path) => Some(Config::load(Some(path), &Overrides::default())?),
        None => None,
    };
    let schemas = runway_config
        .as_ref()
        .map(Config::schemas)
        .unwrap_or_default();
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read worker configuration {}", args.file.display()))?;
    let config =
        runway_server::config::worker_config::parse(&text, &args.file.display().to_string())
            .map_err(anyhow::Error::msg)?;
    let mut inputs = std::collections::BTreeMap::new();
    for pair in &args.inputs {
        let Some((name, value)) = pair.split_once('=') else {
            anyhow::bail!("--set {pair:?}: expected NAME=VALUE");
        };
        inputs.insert(name.trim().to_owned(), value.trim().to_owned());
    }
    // As at launch: the named provider's configured inputs, unless given.
    if let (Some(runway_config), Some(provider)) = (&runway_config, inputs.get("provider")) {
        let configured = runway_config.launch_inputs(provider);
        for (name, value) in configured {
            inputs.entry(name).or_insert(value);
        }
    }
    let evaluation = config
        .evaluate(&inputs, &schemas)
        .with_context(|| format!("worker configuration {}", args.file.display()))?;
    println!("{}", serde_json::to_string_pretty(&evaluation.values)?);
    Ok(())
}

async fn serve(args: ConfigArgs, config: Config) -> anyhow::Result<()> {
    let listen = config.server.listen;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let options = runway_server::RunOptions {
        // Only without a config file: then the CLI finds the token there.
        admin_token_file: args
            .source
            .config
            .is_none()
            .then(|| PathBuf::from(admin::TOKEN_FILE)),
        runway_exe: std::env::current_exe().ok(),
        config_path: args.source.config.clone(),
        overrides: args.source.overrides(args.listen),
    };
    runway_server::run(config, listener, options, shutdown_signal()).await?;
    Ok(())
}

/// Completes on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("Ctrl-C received, shutting down"),
        () = terminate => tracing::info!("SIGTERM received, shutting down"),
    }
}
