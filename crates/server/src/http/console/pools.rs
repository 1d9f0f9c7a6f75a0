//! The overview and a pool's page: pool rows, health, the queue's recent waits
//! and the history charts over a chosen range.

use super::*;

#[derive(Serialize)]
pub(super) struct PoolRow {
    pub(super) name: String,
    pub(super) labels: Vec<String>,
    pub(super) queued: u64,
    pub(super) running: u64,
    pub(super) booting: u64,
    pub(super) idle: u64,
    pub(super) busy: u64,
    pub(super) max_runners: u32,
    /// Its stock of stopped runners: how many are stopped now (`None`
    /// for a pool that keeps none).
    pub(super) stopped: Option<u64>,
    pub(super) paused: bool,
    /// What its runner group admits beyond its access policy.
    pub(super) warnings: Vec<String>,
}

/// Every configured pool with its live counts: what the overview shows and
/// the stream refreshes.
pub(super) async fn pool_rows(service: &Service) -> Result<Vec<PoolRow>, runway_store::StoreError> {
    let counts = service.store.live_job_counts().await?;
    let runners = service.store.list_live_runners(None).await?;
    let paused = service.store.paused_pools().await?;
    Ok(pool_rows_of(service, &counts, &runners, &paused))
}

/// [`pool_rows`] from what was read.
pub(super) fn pool_rows_of(
    service: &Service,
    counts: &[runway_store::JobCount],
    runners: &[runway_core::Runner],
    paused: &[runway_store::PausedPool],
) -> Vec<PoolRow> {
    let config = service.config();
    let warnings = service
        .runner_group_warnings
        .lock()
        .map(|w| w.clone())
        .unwrap_or_default();
    config
        .pools
        .iter()
        .map(|pool| {
            let jobs = |state: JobState| {
                counts
                    .iter()
                    .filter(|c| c.pool.as_deref() == Some(pool.name.as_str()) && c.state == state)
                    .map(|c| c.count)
                    .sum()
            };
            let runners_in = |states: &[runway_core::RunnerState]| {
                runners
                    .iter()
                    .filter(|r| r.pool == pool.name && states.contains(&r.state))
                    .count() as u64
            };
            use runway_core::RunnerState as R;
            PoolRow {
                name: pool.name.clone(),
                labels: pool.labels.clone(),
                queued: jobs(JobState::Queued),
                running: jobs(JobState::Running),
                booting: runners_in(&[R::Requested, R::Provisioning]),
                idle: runners_in(&[R::Idle]),
                busy: runners_in(&[R::Busy]),
                max_runners: pool.max_runners,
                stopped: (pool.max_stopped > 0).then(|| runners_in(&[R::Stopped])),
                paused: paused.iter().any(|p| p.pool == pool.name),
                warnings: warnings.get(&pool.name).cloned().unwrap_or_default(),
            }
        })
        .collect()
}

pub(super) fn unavailable() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        "the store is unavailable; try again\n",
    )
        .into_response()
}

/// The window of the overview's queue times.
pub(super) const QUEUE_WINDOW: Duration = Duration::from_secs(3600);

/// The most jobs the queue times are computed over (the newest).
pub(super) const QUEUE_SAMPLE: u32 = 50_000;

/// `d` as an operator reads it: "850 ms", "42 s", "3 min 5 s", "2 h 10 min".
pub(super) fn short_duration(d: Duration) -> String {
    let seconds = d.as_secs();
    match seconds {
        0 => format!("{} ms", d.as_millis()),
        1..=59 => format!("{seconds} s"),
        60..=3599 if seconds.is_multiple_of(60) => format!("{} min", seconds / 60),
        60..=3599 => format!("{} min {} s", seconds / 60, seconds % 60),
        _ if seconds % 3600 < 60 => format!("{} h", seconds / 3600),
        _ => format!("{} h {} min", seconds / 3600, seconds % 3600 / 60),
    }
}

/// Per pool: queue times over the last hour, and the providers it may use
/// that the reconciler backs off from.
pub(super) async fn pool_health(
    service: &Service,
    now: Timestamp,
) -> Result<std::collections::BTreeMap<String, serde_json::Value>, runway_store::StoreError> {
    let times = service
        .store
        .queue_times(now.minus(QUEUE_WINDOW), QUEUE_SAMPLE)
        .await?;
    let stats = crate::app::history::queue_percentiles(times);
    let backoffs = service
        .provider_backoffs
        .lock()
        .map(|b| b.clone())
        .unwrap_or_default();
    let config = service.config();
    Ok(config
        .pools
        .iter()
        .map(|pool| {
            let queue = stats.get(&pool.name).map(|(started, p50, p95)| {
                json!({"started": started, "p50": short_duration(*p50), "p95": short_duration(*p95)})
            });
            // A pool that names no provider may use any.
            let backing_off: Vec<serde_json::Value> = backoffs
                .iter()
                .filter(|b| {
                    b.retry_at > now
                        && (pool.providers.is_empty() || pool.providers.contains(&b.provider))
                })
                .map(|b| {
                    json!({"provider": b.provider, "until": rfc3339(b.retry_at), "error": b.last_error})
                })
                .collect();
            (
                pool.name.clone(),
                json!({"queue": queue, "backoffs": backing_off}),
            )
        })
        .collect())
}

/// A chart's time range: how far back, and the width of one bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Range {
    Hour,
    Day,
    Week,
}

impl Range {
    pub(super) fn parse(text: Option<&str>) -> Range {
        match text {
            Some("day") => Range::Day,
            Some("week") => Range::Week,
            _ => Range::Hour,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Range::Hour => "hour",
            Range::Day => "day",
            Range::Week => "week",
        }
    }

    /// (span, bucket): 60 one-minute points, 288 of five minutes, 168 of
    /// an hour.
    pub(super) fn span_and_bucket(self) -> (Duration, Duration) {
        match self {
            Range::Hour => (Duration::from_secs(3600), Duration::from_secs(60)),
            Range::Day => (Duration::from_secs(24 * 3600), Duration::from_secs(300)),
            Range::Week => (
                Duration::from_secs(7 * 24 * 3600),
                Duration::from_secs(3600),
            ),
        }
    }

    /// The buckets' starts, oldest first, the last one holding `now`;
    /// and where reading starts.
    pub(super) fn buckets(self, now: Timestamp) -> (Vec<Timestamp>, Timestamp) {
        let (span, bucket) = self.span_and_bucket();
        let width = bucket.as_millis() as i64;
        let count = (span.as_millis() / bucket.as_millis()) as i64;
        let last = now.as_millis().div_euclid(width) * width;
        let starts: Vec<Timestamp> = (0..count)
            .map(|i| Timestamp::from_millis(last - (count - 1 - i) * width))
            .collect();
        let since = starts.first().copied().unwrap_or(now);
        (starts, since)
    }
}

/// `points` (one pool's, in time order) as one value per bucket of
/// `starts`, by `value`; `None` where no sample fell.
pub(super) fn per_bucket(
    starts: &[Timestamp],
    points: &[&runway_store::PoolHistoryPoint],
    value: impl Fn(&runway_store::PoolHistoryPoint) -> Option<f64>,
) -> Vec<Option<f64>> {
    let by_start: std::collections::BTreeMap<i64, &runway_store::PoolHistoryPoint> =
        points.iter().map(|p| (p.at.as_millis(), *p)).collect();
    starts
        .iter()
        .map(|at| by_start.get(&at.as_millis()).and_then(|p| value(p)))
        .collect()
}

/// What a wait reason's code means, as the pool page's breakdown says it.
pub(super) fn wait_reason_words(code: &str) -> &'static str {
    match code {
        "runner_idle" => "a runner was idle for it (taken at its next poll)",
        "runner_booting" => "a runner was booting for it",
        "stopped_runner_starting" => "a stopped runner was starting for it",
        "runner_requested" => "a runner was being started for it",
        "at_max_runners" => "the pool was at max_runners",
        "provider_backoff" => "a provider was backing off after errors",
        "no_provider_capacity" => "no provider had capacity",
        "scaling_ratio" => "the scaling ratio held it back",
        "lease_expired_requeued" => "requeued after its runner's lease expired",
        "pool_paused" => "the pool was paused",
        "key_at_cap" => "its repository was at its running cap (fair share)",
        _ => "another reason",
    }
}

pub(super) fn money(micros: i64) -> String {
    format!("${:.2}", micros as f64 / 1e6)
}

#[derive(Deserialize)]
pub(super) struct RangeQuery {
    pub(super) range: Option<String>,
}

/// One pool over the last hour, day or week: its jobs, runners, queue
/// times and cost as charts, and why its jobs waited.
pub(super) async fn pool_page(
    Viewer(session): Viewer,
    State(service): State<Arc<Service>>,
    Path(name): Path<String>,
    Query(query): Query<RangeQuery>,
) -> Response {
    let Ok(pools) = pool_rows(&service).await else {
        return unavailable();
    };
    let Some(pool) = pools.into_iter().find(|p| p.name == name) else {
        return not_found("No such pool.", "/", "Overview");
    };
    if !session.caller.scope.covers(Some(&pool.name)) {
        return refused(OUT_OF_SCOPE);
    }
    let now = now();
    let range = Range::parse(query.range.as_deref());
    let (starts, since) = range.buckets(now);
    let (_, bucket) = range.span_and_bucket();
    let (Ok(history), Ok(waits), Ok(health)) = (
        service
            .store
            .pool_history(Some(&pool.name), since, bucket)
            .await,
        service.store.pool_waits(&pool.name, since).await,
        pool_health(&service, now).await,
    ) else {
        return unavailable();
    };
    let points: Vec<&runway_store::PoolHistoryPoint> = history.iter().collect();
    use crate::http::charts::{line_chart, Series};
    let count = |v: f64| format!("{v:.0}");
    let jobs_chart = line_chart(
        "Jobs queued and running",
        &starts,
        &[
            Series {
                name: "queued",
                color: "#b26a00",
                values: per_bucket(&starts, &points, |p| Some(p.queued)),
            },
            Series {
                name: "running",
                color: "#0969da",
                values: per_bucket(&starts, &points, |p| Some(p.running)),
            },
        ],
        count,
    );
    let mut runner_series = vec![
        Series {
            name: "booting",
            color: "#b26a00",
            values: per_bucket(&starts, &points, |p| Some(p.booting)),
        },
        Series {
            name: "idle",
            color: "#2e7d32",
            values: per_bucket(&starts, &points, |p| Some(p.idle)),
        },
        Series {
            name: "busy",
            color: "#0969da",
            values: per_bucket(&starts, &points, |p| Some(p.busy)),
        },
    ];
    // A pool that keeps a stock of stopped runners, or kept one in range.
    let keeps_stock = service
        .config()
        .pool(&pool.name)
        .is_some_and(|config| config.max_stopped > 0);
    if keeps_stock || points.iter().any(|p| p.stopped > 0.0) {
        runner_series.push(Series {
            name: "stopped",
            color: "#6e7781",
            values: per_bucket(&starts, &points, |p| Some(p.stopped)),
        });
    }
    let runners_chart = line_chart("Runners by state", &starts, &runner_series, count);
    let seconds = |ms: Option<i64>| ms.map(|ms| ms as f64 / 1000.0);
    let wait_chart = line_chart(
        "Queue time of the jobs that started",
        &starts,
        &[
            Series {
                name: "p50",
                color: "#0969da",
                values: per_bucket(&starts, &points, |p| seconds(p.wait_p50_ms)),
            },
            Series {
                name: "p95",
                color: "#c62828",
                values: per_bucket(&starts, &points, |p| seconds(p.wait_p95_ms)),
            },
        ],
        crate::http::charts::axis_duration,
    );
    let cost_chart = line_chart(
        "Cost per bucket",
        &starts,
        &[Series {
            name: "cost",
            color: "#66707c",
            values: per_bucket(&starts, &points, |p| Some(p.cost_micros as f64 / 1e6)),
        }],
        |v| format!("${v:.2}"),
    );
    let cost: i64 = history.iter().map(|p| p.cost_micros).sum();
    let runner_seconds: i64 = history.iter().map(|p| p.runner_seconds).sum();
    let started: i64 = history.iter().map(|p| p.started).sum();
    let waited: i64 = waits.iter().map(|(_, jobs)| jobs).sum();
    let waits: Vec<serde_json::Value> = waits
        .iter()
        .map(|(code, jobs)| {
            json!({
                "code": code,
                "words": wait_reason_words(code),
                "job_minutes": jobs,
                "share": format!("{:.0} %", 100.0 * *jobs as f64 / waited.max(1) as f64),
            })
        })
        .collect();
    let health = health.get(&pool.name).cloned().unwrap_or_default();
    let warm = service
        .warm
        .lock()
        .ok()
        .and_then(|warm| warm.get(&pool.name).cloned())
        .map(|w| {
            json!({
                "target": w.target,
                "expected": w.forecast.jobs,
                "why": w.why(),
                "batches": w.forecast.batches.iter().map(|b| json!({
                    "earliest": format!("{} UTC", crate::clock::hh_mm(b.earliest)),
                    "latest": format!("{} UTC", crate::clock::hh_mm(b.latest)),
                    "jobs": b.jobs,
                    "remaining": b.remaining,
                    "seen": b.seen,
                    "of": b.of,
                    "weekly": b.weekly,
                    "warm": b.warm,
                })).collect::<Vec<_>>(),
            })
        });
    let runners = service.store.list_live_runners(Some(&pool.name)).await;
    let config = service.config();
    let stock = runners
        .ok()
        .zip(config.pool(&pool.name))
        .and_then(|(runners, pool)| {
            let stock = crate::http::api::StockDto::of(&config, pool, &runners)?;
            let resume = config
                .stopping_provider(pool)
                .map_or(0.0, |p| p.resume_time().as_secs_f64());
            Some(json!({
                "stopped": stock.stopped,
                "preparing": stock.preparing,
                "min": stock.min_stopped,
                "max": stock.max_stopped,
                "cost": format!("${:.3}", stock.cost_per_hour),
                "resume": format!("{resume:.0}"),
            }))
        });
    page(
        &session,
        "pool.html",
        "overview",
        json!({
            "pool": pool,
            "health": health,
            "range": range.name(),
            "sampled": history.len(),
            "charts": [jobs_chart, runners_chart, wait_chart, cost_chart],
            "cost": money(cost),
            "runner_hours": format!("{:.1}", runner_seconds as f64 / 3600.0),
            "started": started,
            "waits": waits,
            "warm": warm,
            "stock": stock,
        }),
    )
}

/// Per pool, a sparkline of its queued jobs over the last hour, and its
/// runner time and cost over the last day.
pub(super) async fn overview_history(
    service: &Service,
    now: Timestamp,
) -> Result<std::collections::BTreeMap<String, serde_json::Value>, runway_store::StoreError> {
    let (starts, since) = Range::Hour.buckets(now);
    let hour = service
        .store
        .pool_history(None, since, Duration::from_secs(60))
        .await?;
    // The last 24 hours in buckets wider than the window (at most two
    // rows a pool, where the window crosses a bucket's edge), summed below.
    let day = service
        .store
        .pool_history(
            None,
            now.minus(Duration::from_secs(24 * 3600)),
            Duration::from_secs(24 * 3600 * 2),
        )
        .await?;
    let config = service.config();
    Ok(config
        .pools
        .iter()
        .map(|pool| {
            let points: Vec<&runway_store::PoolHistoryPoint> =
                hour.iter().filter(|p| p.pool == pool.name).collect();
            let queued = per_bucket(&starts, &points, |p| Some(p.queued));
            let (cost, seconds) = day
                .iter()
                .filter(|p| p.pool == pool.name)
                .fold((0, 0), |(c, s), p| (c + p.cost_micros, s + p.runner_seconds));
            (
                pool.name.clone(),
                json!({
                    "sparkline": crate::http::charts::sparkline(&format!("{} queued, last hour", pool.name), &queued),
                    "cost": money(cost),
                    "runner_hours": format!("{:.1}", seconds as f64 / 3600.0),
                }),
            )
        })
        .collect())
}

pub(super) async fn overview(State(service): State<Arc<Service>>, headers: HeaderMap) -> Response {
    let Some(session) = session(&service, &headers).await else {
        return login_page(&service, StatusCode::OK, None);
    };
    let Ok(mut pools) = pool_rows(&service).await else {
        return unavailable();
    };
    pools.retain(|pool| session.caller.scope.covers(Some(&pool.name)));
    let Ok(health) = pool_health(&service, now()).await else {
        return unavailable();
    };
    let Ok(history) = overview_history(&service, now()).await else {
        return unavailable();
    };
    let store = match service.store.backend() {
        runway_store::Backend::Sqlite => "sqlite",
        runway_store::Backend::Postgres => "postgres",
    };
    page(
        &session,
        "overview.html",
        "overview",
        json!({"pools": pools, "health": health, "history": history, "version": env!("CARGO_PKG_VERSION"), "store": store}),
    )
}
