//! `runway trace export`: the jobs runway actually saw, as a `runway sim`
//! trace, so a policy can be tried on last month's own workload.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use runway_core::{Job, Timestamp};
use runway_store::{JobFilter, Store};

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The store to read: the configuration's `[server] database`, or `--database`.
    #[command(flatten)]
    source: crate::ConfigSource,
    /// Jobs first seen within this long before now (e.g. 30d, 12h).
    #[arg(long, default_value = "30d")]
    since: String,
    /// Only this pool's jobs.
    #[arg(long)]
    pool: Option<String>,
    /// Write the trace here instead of standard output.
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
}

/// Jobs read from the store a page at a time.
const PAGE: u32 = 1_000;

pub async fn export(args: ExportArgs) -> anyhow::Result<()> {
    let window = runway_providers::settings::duration::parse(&args.since)
        .map_err(|e| anyhow::anyhow!("--since: {e}"))?;
    let config = args.source.load(None)?;
    let url = config.server.database.expose();
    // Reading must not create: an empty store where none was would
    // export nothing and leave a stray file behind.
    if !url.starts_with("postgres") {
        let path = url
            .trim_start_matches("sqlite://")
            .trim_start_matches("sqlite:");
        let path = path.split('?').next().unwrap_or(path);
        if !std::path::Path::new(path).exists() {
            anyhow::bail!("no store at {path}: name it with --database or --config");
        }
    }
    let store = runway_store::open(url, &runway_store::OpenOptions::default())
        .await
        .with_context(|| format!("cannot open {}", runway_store::redact_url(url)))?;
    let since = runway_server::clock::now().minus(window);
    let (trace, skipped) = read(store.as_ref(), since, args.pool.as_deref()).await?;
    let text = render(&trace);
    match &args.output {
        Some(path) => std::fs::write(path, &text)
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => print!("{text}"),
    }
    eprintln!(
        "{} jobs exported; {skipped} left out (never started or not finished)",
        trace.len()
    );
    Ok(())
}

/// One exported job: first seen at, ran for, with labels, of repository.
#[derive(Debug, Clone, PartialEq)]
pub struct Exported {
    pub seen: Timestamp,
    pub duration_ms: i64,
    pub labels: Vec<String>,
    pub repo: Option<String>,
    pub run_id: Option<u64>,
    pub workflow: Option<String>,
    pub finished: Timestamp,
    /// Milliseconds from the last of its run's jobs that had finished
    /// when it was first seen (a job with `needs:`).
    pub started_after_ms: Option<i64>,
}

/// The jobs first seen since `since` (of `pool`, if given) that ran to an
/// end, oldest first, and how many others were left out.
async fn read(
    store: &dyn Store,
    since: Timestamp,
    pool: Option<&str>,
) -> anyhow::Result<(Vec<Exported>, u64)> {
    let mut exported = Vec::new();
    let mut skipped = 0;
    let mut before = None;
    'pages: loop {
        let page = store
            .list_jobs(&JobFilter {
                pool: pool.map(str::to_owned),
                before,
                newest_first: true,
                limit: Some(PAGE),
                ..JobFilter::default()
            })
            .await?;
        let Some(last) = page.last() else {
            break;
        };
        before = Some(last.id);
        for job in &page {
            // Newest first by id, and ids follow first sight.
            if job.created_at < since {
                break 'pages;
            }
            match exported_of(job) {
                Some(one) => exported.push(one),
                None => skipped += 1,
            }
        }
        if page.len() < PAGE as usize {
            break;
        }
    }
    exported.sort_by_key(|job| job.seen);
    follow_runs(&mut exported);
    Ok((exported, skipped))
}

/// Sets `started_after_ms` on each job queued after others of its
/// workflow run had finished: from the last of those finishes.
fn follow_runs(jobs: &mut [Exported]) {
    let mut finishes: std::collections::HashMap<u64, Vec<Timestamp>> =
        std::collections::HashMap::new();
    for job in jobs.iter() {
        if let Some(run) = job.run_id {
            finishes.entry(run).or_default().push(job.finished);
        }
    }
    for job in jobs.iter_mut() {
        let Some(run) = job.run_id else { continue };
        job.started_after_ms = finishes[&run]
            .iter()
            .filter(|finished| **finished <= job.seen)
            .max()
            .map(|finished| job.seen.as_millis() - finished.as_millis());
    }
}

fn exported_of(job: &Job) -> Option<Exported> {
    let (started, finished) = (job.started_at?, job.finished_at?);
    let facts = runway_server::app::intake::GithubFacts::parse(&job.payload);
    Some(Exported {
        seen: job.created_at,
        duration_ms: finished.as_millis() - started.as_millis(),
        labels: job.labels.clone(),
        repo: facts.repository,
        run_id: facts.run_id,
        workflow: facts.workflow,
        finished,
        started_after_ms: None,
    })
}

/// The trace as JSON lines (docs/sim.md): arrivals in seconds from the
/// first job's.
fn render(jobs: &[Exported]) -> String {
    let start = jobs.first().map_or(0, |job| job.seen.as_millis());
    let mut text = format!("# runway trace export: {} jobs\n", jobs.len());
    for job in jobs {
        let mut line = serde_json::json!({
            "arrival_s": (job.seen.as_millis() - start) as f64 / 1000.0,
            "duration_s": job.duration_ms.max(0) as f64 / 1000.0,
            "labels": job.labels,
        });
        if let Some(repo) = &job.repo {
            line["repo"] = repo.clone().into();
        }
        if let Some(run_id) = job.run_id {
            line["run_id"] = run_id.into();
        }
        if let Some(workflow) = &job.workflow {
            line["workflow"] = workflow.clone().into();
        }
        if let Some(after) = job.started_after_ms {
            line["started_after"] = (after.max(0) as f64 / 1000.0).into();
        }
        text.push_str(&line.to_string());
        text.push('\n');
    }
    text
}
