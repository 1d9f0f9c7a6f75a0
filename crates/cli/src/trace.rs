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
    Ok((exported, skipped))
}

fn exported_of(job: &Job) -> Option<Exported> {
    let (started, finished) = (job.started_at?, job.finished_at?);
    let repo = serde_json::from_str::<serde_json::Value>(&job.payload)
        .ok()
        .and_then(|payload| payload["repository"].as_str().map(str::to_owned));
    Some(Exported {
        seen: job.created_at,
        duration_ms: finished.as_millis() - started.as_millis(),
        labels: job.labels.clone(),
        repo,
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
        text.push_str(&line.to_string());
        text.push('\n');
    }
    text
}
