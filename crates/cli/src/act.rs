//! The admin commands that change things: `runway cancel|retry JOB`,
//! `runway drain|terminate RUNNER`, `runway pause|resume POOL`,
//! `runway reload`, and what they leave behind: `runway history JOB`,
//! `runway audit`. Each calls the admin write API of a running runway and
//! prints what it answered; a refusal exits non-zero with the server's reason.

use clap::Args;
use runway_server::http::admin::{AuditPageDto, JobEventsDto, PauseDto, ReloadDto};
use runway_server::http::api::{JobDto, RunnerDto};
use serde_json::json;

use crate::admin::{get, or_dash, post, table, Connection};

#[derive(Args, Debug, Clone)]
pub struct CancelArgs {
    #[command(flatten)]
    connection: Connection,
    /// The job's id.
    job: i64,
    /// Why (recorded on the job and in the audit trail).
    #[arg(long)]
    reason: Option<String>,
}

#[derive(Args, Debug, Clone)]
pub struct JobArgs {
    #[command(flatten)]
    connection: Connection,
    /// The job's id.
    job: i64,
}

#[derive(Args, Debug, Clone)]
pub struct RunnerArgs {
    #[command(flatten)]
    connection: Connection,
    /// The runner's id.
    runner: i64,
}

#[derive(Args, Debug, Clone)]
pub struct TerminateArgs {
    #[command(flatten)]
    connection: Connection,
    /// The runner's id.
    runner: i64,
    /// Terminate it even while it runs a job (the job is cancelled).
    #[arg(long)]
    force: bool,
}

#[derive(Args, Debug, Clone)]
pub struct PoolArgs {
    #[command(flatten)]
    connection: Connection,
    /// The pool's name.
    pool: String,
}

#[derive(Args, Debug, Clone)]
pub struct AuditArgs {
    #[command(flatten)]
    connection: Connection,
    /// At most this many entries, newest first.
    #[arg(long, default_value_t = 50)]
    limit: u32,
}

pub async fn cancel(args: CancelArgs) -> anyhow::Result<()> {
    let path = format!("/api/v1/jobs/{}/cancel", args.job);
    let job: JobDto = post(&args.connection, &path, json!({"reason": args.reason})).await?;
    println!("job {} {}", job.id, job.state);
    Ok(())
}

pub async fn retry(args: JobArgs) -> anyhow::Result<()> {
    let path = format!("/api/v1/jobs/{}/retry", args.job);
    let job: JobDto = post(&args.connection, &path, json!({})).await?;
    println!(
        "job {} queued in pool {} (a retry of job {})",
        job.id,
        job.pool.as_deref().unwrap_or("?"),
        args.job
    );
    Ok(())
}

pub async fn drain(args: RunnerArgs) -> anyhow::Result<()> {
    let path = format!("/api/v1/runners/{}/drain", args.runner);
    let runner: RunnerDto = post(&args.connection, &path, json!({})).await?;
    let when = if runner.state == "busy" {
        "after its current job"
    } else {
        "now"
    };
    println!(
        "runner {} ({}) drained: it stops {when}",
        runner.id, runner.name
    );
    Ok(())
}

pub async fn terminate(args: TerminateArgs) -> anyhow::Result<()> {
    let path = format!("/api/v1/runners/{}/terminate", args.runner);
    let runner: RunnerDto = post(&args.connection, &path, json!({"force": args.force})).await?;
    println!("runner {} ({}) {}", runner.id, runner.name, runner.state);
    Ok(())
}

pub async fn pause(args: PoolArgs, paused: bool) -> anyhow::Result<()> {
    let verb = if paused { "pause" } else { "resume" };
    let path = format!("/api/v1/pools/{}/{verb}", args.pool);
    let done: PauseDto = post(&args.connection, &path, json!({})).await?;
    let state = if done.paused { "paused" } else { "running" };
    let note = if done.changed { "" } else { " (already)" };
    println!("pool {} {state}{note}", done.pool);
    Ok(())
}

pub async fn reload(connection: Connection) -> anyhow::Result<()> {
    let done: ReloadDto = post(&connection, "/api/v1/config/reload", json!({})).await?;
    if done.changed.is_empty() {
        println!("configuration reloaded; nothing changed");
    } else {
        println!(
            "configuration reloaded; changed: {}",
            done.changed.join(", ")
        );
    }
    if !done.restart_needed.is_empty() {
        println!(
            "needs a restart to apply (running values kept): {}",
            done.restart_needed.join(", ")
        );
    }
    Ok(())
}

pub async fn history(args: JobArgs) -> anyhow::Result<()> {
    let path = format!("/api/v1/jobs/{}/events", args.job);
    let history: JobEventsDto = get(&args.connection, &path, &[]).await?;
    let rows = history
        .events
        .iter()
        .map(|event| {
            vec![
                event.at.clone(),
                event.event.clone(),
                event.state.clone(),
                or_dash(event.runner),
                or_dash(event.conclusion.as_ref().or(event.reason.as_ref())),
            ]
        })
        .collect();
    print!(
        "{}",
        table(&["AT", "EVENT", "STATE", "RUNNER", "DETAIL"], rows)
    );
    Ok(())
}

pub async fn audit(args: AuditArgs) -> anyhow::Result<()> {
    let page: AuditPageDto = get(
        &args.connection,
        "/api/v1/audit",
        &[("limit", args.limit.to_string())],
    )
    .await?;
    let rows = page
        .entries
        .iter()
        .map(|entry| {
            vec![
                entry.at.clone(),
                entry.actor.clone(),
                entry.action.clone(),
                entry.target.clone(),
                entry.details.to_string(),
            ]
        })
        .collect();
    print!(
        "{}",
        table(&["AT", "WHO", "ACTION", "TARGET", "DETAILS"], rows)
    );
    Ok(())
}
