//! `runway-bench first-start`: how long a job waits for its runner on pools
//! that differ in how that runner comes (a cold boot, a stopped runner
//! started for it), measured in the same run: one job at a time, the pools
//! taking turns, each job submitted only once its pool is back at rest (no
//! runner at work, its stock full), from the job's `enqueued_at` to its
//! `started_at` (its runner's accept) as runway records them.

use std::time::{Duration, Instant};

use anyhow::Context;
use runway_core::Timestamp;
use serde_json::{json, Value};

#[derive(clap::Args)]
pub struct FirstStartArgs {
    /// The runway to drive.
    #[arg(long, env = "RUNWAY_URL")]
    url: String,
    /// An admin (or submit-and-read) token.
    #[arg(long, env = "RUNWAY_TOKEN")]
    token: String,
    /// A pool to compare, by name (its first label routes the jobs); the
    /// first is the one the others are compared against.
    #[arg(long = "pool", required = true)]
    pools: Vec<String>,
    /// Jobs per pool.
    #[arg(long, default_value_t = 10)]
    jobs: u32,
    /// What each job runs.
    #[arg(long, default_value = "true")]
    script: String,
    /// Longest wait for a pool to come to rest, or a job to finish.
    #[arg(long, default_value_t = 180)]
    timeout_seconds: u64,
}

struct Client {
    http: reqwest::Client,
    url: String,
    token: String,
}

impl Client {
    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let answer = self
            .http
            .get(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
            .send()
            .await?
            .error_for_status()?;
        Ok(answer.json().await?)
    }

    /// Pool `name` as `GET /api/v1/pools` has it.
    async fn pool(&self, name: &str) -> anyhow::Result<Value> {
        let pools = self.get("/api/v1/pools").await?;
        pools["pools"]
            .as_array()
            .and_then(|pools| pools.iter().find(|p| p["name"] == name).cloned())
            .with_context(|| format!("no pool {name}"))
    }
}

/// Whether a pool is at rest: no job queued or running, no runner but its
/// stopped stock, and that stock at its minimum.
fn at_rest(pool: &Value) -> bool {
    let busy = pool["runners"]
        .as_object()
        .map(|states| {
            states
                .iter()
                .filter(|(state, _)| !matches!(state.as_str(), "stopped" | "terminated" | "failed"))
                .map(|(_, count)| count.as_u64().unwrap_or(0))
                .sum::<u64>()
        })
        .unwrap_or(0);
    let stock_full = pool["stock"].is_null()
        || pool["stock"]["stopped"].as_u64() >= pool["stock"]["min_stopped"].as_u64();
    busy == 0 && pool["queued"].as_u64() == Some(0) && stock_full
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

pub async fn first_start(args: FirstStartArgs) -> anyhow::Result<()> {
    let client = Client {
        http: reqwest::Client::new(),
        url: args.url.trim_end_matches('/').to_owned(),
        token: args.token.clone(),
    };
    let timeout = Duration::from_secs(args.timeout_seconds);
    let mut waits: Vec<Vec<Duration>> = vec![Vec::new(); args.pools.len()];
    for round in 0..args.jobs {
        for (index, name) in args.pools.iter().enumerate() {
            let pool = client.pool(name).await?;
            let label = pool["labels"][0]
                .as_str()
                .with_context(|| format!("pool {name} has no label"))?
                .to_owned();
            let deadline = Instant::now() + timeout;
            while !at_rest(&client.pool(name).await?) {
                anyhow::ensure!(Instant::now() < deadline, "pool {name} never came to rest");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let submitted: Value = client
                .http
                .post(format!("{}/api/v1/jobs", client.url))
                .bearer_auth(&client.token)
                .json(&json!({"labels": [label], "script": args.script, "timeout_seconds": args.timeout_seconds}))
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            let id = submitted["id"].as_i64().context("no job id")?;
            let job = loop {
                let job = client.get(&format!("/api/v1/jobs/{id}")).await?;
                if matches!(
                    job["state"].as_str(),
                    Some("completed" | "failed" | "cancelled")
                ) {
                    break job;
                }
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "job {id} of pool {name} never finished"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            let at = |key: &str| {
                job[key]
                    .as_str()
                    .and_then(runway_server::clock::parse_rfc3339)
                    .with_context(|| format!("job {id} has no {key}"))
            };
            let (enqueued, started): (Timestamp, Timestamp) =
                (at("enqueued_at")?, at("started_at")?);
            let wait = started.since(enqueued);
            eprintln!(
                "round {round}: pool {name}, job {id}: {} ms",
                wait.as_millis()
            );
            waits[index].push(wait);
        }
    }
    let base = median(waits[0].clone());
    println!(
        "pool\tjobs\tmedian_wait_ms\tmin_ms\tmax_ms\tratio_to_{}",
        args.pools[0]
    );
    for (name, waits) in args.pools.iter().zip(waits) {
        let median = median(waits.clone());
        let (min, max) = (
            waits.iter().min().copied().unwrap_or_default(),
            waits.iter().max().copied().unwrap_or_default(),
        );
        println!(
            "{name}\t{}\t{}\t{}\t{}\t{:.2}",
            waits.len(),
            median.as_millis(),
            min.as_millis(),
            max.as_millis(),
            median.as_secs_f64() / base.as_secs_f64().max(1e-9)
        );
    }
    Ok(())
}
