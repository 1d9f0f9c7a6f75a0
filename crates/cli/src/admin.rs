//! Read-only admin commands: `runway jobs`, `runway pools`, `runway runners`.
//! They call the admin API of a running runway and print tables.

use anyhow::{bail, Context};
use clap::Args;
use runway_server::http::api::{JobPageDto, PoolsDto, RunnersDto};

#[derive(Args, Debug, Clone)]
pub struct Connection {
    /// The runway server to ask.
    #[arg(long, env = "RUNWAY_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// An admin token ([server] admin_tokens). Default: the one `runway serve`
    /// wrote to ./runway-admin.token when it started without a config file.
    #[arg(long, env = "RUNWAY_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

/// Where `runway serve` without a config file keeps its generated admin token.
pub const TOKEN_FILE: &str = "runway-admin.token";

impl Connection {
    fn token(&self) -> anyhow::Result<String> {
        if let Some(token) = &self.token {
            return Ok(token.clone());
        }
        std::fs::read_to_string(TOKEN_FILE)
            .map(|t| t.trim().to_owned())
            .map_err(|_| anyhow::anyhow!("no admin token: pass --token or RUNWAY_TOKEN, or run where `runway serve` wrote {TOKEN_FILE}"))
    }
}

#[derive(Args, Debug, Clone)]
pub struct SubmitArgs {
    #[command(flatten)]
    connection: Connection,
    /// The job's labels, comma-separated (default: the out-of-the-box pool `local`).
    #[arg(long, value_delimiter = ',', default_value = "local")]
    labels: Vec<String>,
    /// Seconds the job may run.
    #[arg(long, default_value_t = 3600)]
    timeout: u64,
    /// Submitting the same id twice returns the first job. Default: a
    /// random one, so that the command's own retries (after a timeout, a
    /// refused connection or a 5xx, as during a failover) make one job.
    #[arg(long)]
    external_id: Option<String>,
    /// Wait for the job to finish, print its log and exit with its exit code.
    #[arg(long)]
    wait: bool,
    /// With --wait: give up after this many seconds.
    #[arg(long, default_value_t = 3600)]
    wait_seconds: u64,
    /// The command to run (with `sh -c`).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// One shell word, quoted if it needs to be.
fn shell_quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c))
    {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

pub async fn submit(args: SubmitArgs) -> anyhow::Result<std::process::ExitCode> {
    let token = args.connection.token()?;
    let base = args.connection.url.trim_end_matches('/').to_owned();
    // One argument is a script as written; several are a command to quote.
    let script = if args.command.len() == 1 {
        args.command[0].clone()
    } else {
        args.command
            .iter()
            .map(|w| shell_quote(w))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let client = client();
    let external_id = args
        .external_id
        .clone()
        .unwrap_or_else(|| format!("submit-{:032x}", rand::random::<u128>()));
    let request = serde_json::json!({
        "labels": args.labels,
        "script": script,
        "timeout_seconds": args.timeout,
        "external_id": external_id,
    });
    // Asked again, with the same external id, while the server cannot
    // answer (a restart, a failover): one job however many answers were
    // lost. At most a minute; each try at most 30 s.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut wait = std::time::Duration::from_millis(200);
    let (status, body) = loop {
        let sent = client
            .post(format!("{base}/api/v1/jobs"))
            .bearer_auth(&token)
            .timeout(std::time::Duration::from_secs(30))
            .json(&request)
            .send()
            .await;
        let again = match &sent {
            Ok(response) => {
                response.status().is_server_error()
                    || response.status() == reqwest::StatusCode::TOO_MANY_REQUESTS
            }
            Err(_) => true,
        };
        if !again || std::time::Instant::now() + wait >= deadline {
            let response = sent.with_context(|| format!("cannot reach {base}"))?;
            let status = response.status();
            let body: serde_json::Value = response.json().await.unwrap_or_default();
            break (status, body);
        }
        eprintln!("{base} cannot take the job yet; asking again in {wait:?}");
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(std::time::Duration::from_secs(5));
    };
    if !status.is_success() {
        bail!(
            "{base} refused the job ({status}): {}",
            body["error"].as_str().unwrap_or("")
        );
    }
    let id = body["id"].as_i64().unwrap_or_default();
    eprintln!(
        "job {id} queued in pool {}",
        body["pool"].as_str().unwrap_or("?")
    );
    if !args.wait {
        println!("{id}");
        return Ok(std::process::ExitCode::SUCCESS);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(args.wait_seconds);
    let state = loop {
        let job: serde_json::Value =
            get(&args.connection, &format!("/api/v1/jobs/{id}"), &[]).await?;
        let state = job["state"].as_str().unwrap_or("").to_owned();
        if ["completed", "failed", "cancelled", "unroutable"].contains(&state.as_str()) {
            break job;
        }
        if std::time::Instant::now() >= deadline {
            bail!("job {id} is still {state} after {} s", args.wait_seconds);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let response = client
        .get(format!("{base}/api/v1/jobs/{id}/log"))
        .bearer_auth(&token)
        .send()
        .await
        .with_context(|| format!("cannot read the log of job {id}"))?;
    let exit_code: Option<i64> = response
        .headers()
        .get("x-runway-exit-code")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    print!("{}", response.text().await.unwrap_or_default());
    let conclusion = state["conclusion"].as_str().unwrap_or("");
    eprintln!(
        "job {id} {}{}",
        state["state"].as_str().unwrap_or(""),
        if conclusion.is_empty() {
            String::new()
        } else {
            format!(" ({conclusion})")
        }
    );
    let code = match exit_code {
        Some(code) => u8::try_from(code.clamp(0, 255)).unwrap_or(1),
        None if conclusion == "success" => 0,
        None => 1,
    };
    Ok(std::process::ExitCode::from(code))
}

#[derive(Args, Debug, Clone)]
pub struct JobsArgs {
    #[command(flatten)]
    connection: Connection,
    /// Only jobs in this state (queued, provisioning, running, completed, failed, cancelled, unroutable).
    #[arg(long)]
    state: Option<String>,
    /// Only jobs of this pool.
    #[arg(long)]
    pool: Option<String>,
    /// At most this many, newest first.
    #[arg(long, default_value_t = 50)]
    limit: u32,
    /// Add why each queued job is waiting (and why unroutable ones were refused).
    #[arg(long)]
    explain: bool,
}

#[derive(Args, Debug, Clone)]
pub struct RunnersArgs {
    #[command(flatten)]
    connection: Connection,
    #[arg(long)]
    state: Option<String>,
    #[arg(long)]
    pool: Option<String>,
}

/// The CLI's HTTP client: it names itself (`runway/VERSION`), so the
/// audit trail can tell a change made with the CLI from one made through
/// the API by other clients.
pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .user_agent(concat!("runway/", env!("CARGO_PKG_VERSION")))
        .build()
        .unwrap_or_default()
}

pub(crate) async fn get<T: serde::de::DeserializeOwned>(
    connection: &Connection,
    path: &str,
    query: &[(&str, String)],
) -> anyhow::Result<T> {
    let url = format!("{}{path}", connection.url.trim_end_matches('/'));
    let request = client().get(&url).query(query);
    answer(connection, request, &url).await
}

/// `POST path` with `body`: the answer, or an error that says the server's reason.
pub(crate) async fn post<T: serde::de::DeserializeOwned>(
    connection: &Connection,
    path: &str,
    body: serde_json::Value,
) -> anyhow::Result<T> {
    let url = format!("{}{path}", connection.url.trim_end_matches('/'));
    let request = client().post(&url).json(&body);
    answer(connection, request, &url).await
}

async fn answer<T: serde::de::DeserializeOwned>(
    connection: &Connection,
    request: reqwest::RequestBuilder,
    url: &str,
) -> anyhow::Result<T> {
    let response = request
        .bearer_auth(connection.token()?)
        .send()
        .await
        .with_context(|| format!("cannot reach {url}"))?;
    let status = response.status();
    let body = response
        .text()
        .await
        .with_context(|| format!("cannot read the answer of {url}"))?;
    if !status.is_success() {
        let message = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"].as_str().map(str::to_owned))
            .unwrap_or(body);
        bail!("{url} answered {status}: {message}");
    }
    serde_json::from_str(&body)
        .with_context(|| format!("{url} answered something that is not what runway sends"))
}

/// Left-aligned columns, two spaces apart.
pub(crate) fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, cell)| format!("{cell:<width$}", width = widths[i]))
            .collect();
        padded.join("  ").trim_end().to_owned() + "\n"
    };
    let mut text = line(header.iter().map(|h| (*h).to_owned()).collect());
    for row in rows {
        text.push_str(&line(row));
    }
    text
}

pub(crate) fn or_dash(value: Option<impl ToString>) -> String {
    value
        .map(|v| v.to_string())
        .unwrap_or_else(|| "-".to_owned())
}

pub async fn jobs(args: JobsArgs) -> anyhow::Result<()> {
    let mut query = vec![("limit", args.limit.to_string())];
    if let Some(state) = args.state {
        query.push(("state", state));
    }
    if let Some(pool) = args.pool {
        query.push(("pool", pool));
    }
    if args.explain {
        query.push(("explain", "true".to_owned()));
    }
    let page: JobPageDto = get(&args.connection, "/api/v1/jobs", &query).await?;
    let why = |job: &runway_server::http::api::JobDto| match &job.waiting {
        None => "-".to_owned(),
        Some(waiting) => {
            let code = waiting["code"].as_str().unwrap_or("?");
            let details: Vec<String> = waiting["details"]
                .as_object()
                .map(|d| {
                    d.iter()
                        .map(|(k, v)| match (k.as_str(), v.as_array()) {
                            ("offers", Some(offers)) => format!(
                                "offers={}",
                                offers
                                    .iter()
                                    .map(offer_text)
                                    .collect::<Vec<_>>()
                                    .join(" > ")
                            ),
                            _ => format!(
                                "{k}={}",
                                v.as_str().map(str::to_owned).unwrap_or(v.to_string())
                            ),
                        })
                        .collect()
                })
                .unwrap_or_default();
            if details.is_empty() {
                code.to_owned()
            } else {
                format!("{code} ({})", details.join(", "))
            }
        }
    };
    let rows = page
        .jobs
        .iter()
        .map(|job| {
            let mut row = vec![
                job.id.to_string(),
                job.source.clone(),
                job.external_id.clone(),
                or_dash(job.pool.as_ref()),
                job.state.clone(),
                job.labels.join(","),
                or_dash(job.runner),
                job.attempts.to_string(),
                job.created_at.clone(),
                or_dash(job.conclusion.as_ref().or(job.reason.as_ref())),
            ];
            if args.explain {
                row.push(why(job));
            }
            row
        })
        .collect();
    let mut header = vec![
        "ID",
        "SOURCE",
        "EXTERNAL",
        "POOL",
        "STATE",
        "LABELS",
        "RUNNER",
        "ATTEMPTS",
        "CREATED",
        "RESULT/REASON",
    ];
    if args.explain {
        header.push("WHY");
    }
    print!("{}", table(&header, rows));
    if page.next_cursor.is_some() {
        println!("(more jobs: raise --limit or filter by --state / --pool)");
    }
    Ok(())
}

pub async fn pools(connection: Connection) -> anyhow::Result<()> {
    let pools: PoolsDto = get(&connection, "/api/v1/pools", &[]).await?;
    let rows = pools
        .pools
        .iter()
        .map(|pool| {
            let runners: Vec<String> = pool
                .runners
                .iter()
                .map(|(s, n)| format!("{s}={n}"))
                .collect();
            vec![
                pool.name.clone(),
                pool.labels.join(","),
                pool.queued.to_string(),
                pool.min_idle.to_string(),
                pool.max_runners.to_string(),
                if runners.is_empty() {
                    "-".to_owned()
                } else {
                    runners.join(" ")
                },
            ]
        })
        .collect();
    print!(
        "{}",
        table(
            &["POOL", "LABELS", "QUEUED", "MIN_IDLE", "MAX", "RUNNERS"],
            rows
        )
    );
    Ok(())
}

pub async fn runners(args: RunnersArgs) -> anyhow::Result<()> {
    let mut query = Vec::new();
    if let Some(state) = args.state {
        query.push(("state", state));
    }
    if let Some(pool) = args.pool {
        query.push(("pool", pool));
    }
    let runners: RunnersDto = get(&args.connection, "/api/v1/runners", &query).await?;
    let rows = runners
        .runners
        .iter()
        .map(|runner| {
            vec![
                runner.id.to_string(),
                runner.name.clone(),
                runner.pool.clone(),
                runner.provider.clone(),
                runner.state.clone(),
                or_dash(runner.job),
                runner.requested_at.clone(),
            ]
        })
        .collect();
    print!(
        "{}",
        table(
            &[
                "ID",
                "NAME",
                "POOL",
                "PROVIDER",
                "STATE",
                "JOB",
                "REQUESTED"
            ],
            rows
        )
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn tables_align_columns() {
        let text = super::table(
            &["ID", "NAME"],
            vec![
                vec!["1".into(), "a-long-name".into()],
                vec!["22".into(), "b".into()],
            ],
        );
        assert_eq!(text, "ID  NAME\n1   a-long-name\n22  b\n");
    }
}

#[derive(Args, Debug, Clone)]
pub struct RegistrationTokenArgs {
    #[command(flatten)]
    connection: Connection,
    /// The pool the runner will serve.
    #[arg(long, default_value = "default")]
    pool: String,
    /// Seconds the token stays valid.
    #[arg(long, default_value_t = 3600)]
    ttl: u64,
}

/// Prints a one-time registration token for `runway agent --token`.
pub async fn registration_token(args: RegistrationTokenArgs) -> anyhow::Result<()> {
    let base = args.connection.url.trim_end_matches('/').to_owned();
    let response = client()
        .post(format!("{base}/api/v1/registration-tokens"))
        .bearer_auth(args.connection.token()?)
        .json(&serde_json::json!({"pool": args.pool, "ttl": args.ttl}))
        .send()
        .await
        .with_context(|| format!("cannot reach {base}"))?;
    let status = response.status();
    let body: serde_json::Value = response.json().await.unwrap_or_default();
    if !status.is_success() {
        bail!(
            "{base} refused ({status}): {}",
            body["error"].as_str().unwrap_or("")
        );
    }
    println!("{}", body["token"].as_str().unwrap_or_default());
    Ok(())
}

/// One offer of a waiting job's explanation, short: `aws/m5.large/us-east-1a/spot
/// $0.0350/h r=0.80 chosen`.
fn offer_text(offer: &serde_json::Value) -> String {
    let name = match offer["offer"].as_str() {
        Some(key) if !key.is_empty() => {
            format!("{}/{key}", offer["provider"].as_str().unwrap_or("?"))
        }
        _ => offer["provider"].as_str().unwrap_or("?").to_owned(),
    };
    let state = if offer["chosen"] == true {
        " chosen"
    } else if offer["backoff"].is_object() {
        " backing-off"
    } else {
        ""
    };
    format!(
        "{name} ${:.4}/h r={:.2}{state}",
        offer["price_per_hour"].as_f64().unwrap_or(0.0),
        offer["reliability"].as_f64().unwrap_or(0.0)
    )
}
