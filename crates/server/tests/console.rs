//! The web console on a real store with a deep queue: 10,000 queued jobs
//! page 50 at a time (each page a different, older slice, every job
//! reachable), the overview shows queue times and provider health, and the
//! worker-configuration, tasks and cluster pages render — evaluating a
//! worker configuration from its form.

use crate::common;

use std::collections::BTreeSet;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use common::Harness;
use runway_core::{JobSource, NewJob, Route, Timestamp};
use runway_server::config::{Config, Secret};
use tower::ServiceExt;

const ADMIN: &str = "console-harness-admin-token";
const QUEUED: usize = 10_000;

/// A job for pool "default", named `external_id`.
fn queued_job(external_id: String) -> NewJob {
    NewJob {
        source: JobSource::Api,
        external_id,
        route: Route::Pool("default".to_owned()),
        labels: vec!["self-hosted".to_owned(), "linux".to_owned()],
        payload: r#"{"script":"true"}"#.to_owned(),
        max_attempts: 3,
        share: Default::default(),
    }
}

async fn harness() -> Harness {
    let mut config = Config::default();
    config.server.admin_tokens = vec![Secret::literal(ADMIN)];
    config.pools = vec![common::pool("default", &["self-hosted", "linux"])];
    Harness::new(config).await
}

/// `(status, location, body)` of `request` through the router.
async fn fetch(harness: &Harness, request: Request<Body>) -> (StatusCode, String, String) {
    let response = runway_server::http::router(harness.service.clone())
        .oneshot(request)
        .await
        .expect("the router answers");
    let status = response.status();
    let location = response
        .headers()
        .get(header::LOCATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let cookie = response
        .headers()
        .get(header::SET_COOKIE)
        .and_then(|v| v.to_str().ok())
        .map(|c| c.split(';').next().unwrap_or("").to_owned());
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("a body");
    let body = String::from_utf8_lossy(&bytes).into_owned();
    // A login answers its cookie where the location would be.
    (status, cookie.unwrap_or(location), body)
}

async fn login(harness: &Harness) -> String {
    let request = Request::post("/console/login")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("token={ADMIN}")))
        .unwrap();
    let (status, cookie, _) = fetch(harness, request).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(cookie.starts_with("runway_session="), "{cookie}");
    cookie
}

async fn page(harness: &Harness, cookie: &str, path: &str) -> String {
    let request = Request::get(path)
        .header(header::COOKIE, cookie)
        .body(Body::empty())
        .unwrap();
    let (status, _, body) = fetch(harness, request).await;
    assert_eq!(status, StatusCode::OK, "{path}: {body}");
    body
}

/// The page's link with `rel` ("next": older, "prev": newer).
fn pager_link(html: &str, rel: &str) -> Option<String> {
    html.split_once(&format!("<a rel=\"{rel}\" href=\""))
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(link, _)| link.replace("&amp;", "&").replace("&#x2f;", "/"))
}

/// The ids of the jobs a jobs page lists, and its link to the next page.
fn listed(html: &str) -> (Vec<i64>, Option<String>) {
    let ids = html
        .split("data-live=\"job:")
        .skip(1)
        .filter_map(|rest| {
            let (id, field) = rest.split_once(':')?;
            field.starts_with("state").then(|| id.parse().ok())?
        })
        .collect();
    (ids, pager_link(html, "next"))
}

#[tokio::test]
async fn ten_thousand_queued_jobs_page_fifty_at_a_time() {
    let harness = harness().await;
    let jobs: Vec<NewJob> = (0..QUEUED)
        .map(|n| queued_job(format!("deep-{n}")))
        .collect();
    for chunk in jobs.chunks(1_000) {
        harness
            .store()
            .enqueue_many(chunk, Timestamp::from_millis(1_000))
            .await
            .expect("enqueue");
    }
    let cookie = login(&harness).await;

    let overview = page(&harness, &cookie, "/").await;
    assert!(
        overview.contains(&format!("data-live=\"pool:default:queued\">{QUEUED}<")),
        "the overview counts the queue"
    );
    assert!(overview.contains("no job started"), "no queue time yet");

    // Every page holds 50 jobs, newest first; following "Older" reaches
    // each job exactly once.
    let mut seen = BTreeSet::new();
    let mut next = Some("/console/jobs?state=queued".to_owned());
    let mut pages = 0;
    while let Some(path) = next.take() {
        let html = page(&harness, &cookie, &path).await;
        let (ids, link) = listed(&html);
        assert!(ids.len() <= 50, "{path}: {} rows", ids.len());
        assert!(ids.windows(2).all(|w| w[0] > w[1]), "{path}: newest first");
        for id in &ids {
            assert!(seen.insert(*id), "job {id} listed twice");
        }
        pages += 1;
        next = link;
    }
    assert_eq!(pages, QUEUED / 50);
    assert_eq!(seen.len(), QUEUED, "every job is reachable");

    // And back: from the oldest page, "Newer" walks every job exactly once
    // more, each page newest first, to the first page, which has no Newer.
    let mut last = "/console/jobs?state=queued".to_owned();
    let mut older = Some(last.clone());
    while let Some(path) = older.take() {
        last = path.clone();
        older = pager_link(&page(&harness, &cookie, &path).await, "next");
    }
    let html = page(&harness, &cookie, &last).await;
    let (oldest, _) = listed(&html);
    let mut back: BTreeSet<i64> = oldest.into_iter().collect();
    let mut newer = pager_link(&html, "prev");
    let mut pages_back = 1;
    let mut first = html;
    while let Some(path) = newer.take() {
        assert!(path.contains("state=queued"), "{path}: keeps the filter");
        let html = page(&harness, &cookie, &path).await;
        let (ids, older) = listed(&html);
        assert_eq!(ids.len(), 50, "{path}");
        assert!(ids.windows(2).all(|w| w[0] > w[1]), "{path}: newest first");
        assert!(older.is_some(), "{path}: an older page is linked");
        for id in ids {
            assert!(back.insert(id), "job {id} listed twice on the way back");
        }
        pages_back += 1;
        newer = pager_link(&html, "prev");
        first = html;
    }
    assert_eq!(pages_back, QUEUED / 50);
    assert_eq!(back, seen, "the way back lists the same jobs");
    assert_eq!(
        listed(&first).0,
        listed(&page(&harness, &cookie, "/console/jobs?state=queued").await).0
    );
}

#[tokio::test]
async fn worker_configs_tasks_and_cluster_pages_render() {
    let harness = harness().await;
    let cookie = login(&harness).await;
    let example = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/worker-config.json"),
    )
    .expect("examples/worker-config.json");
    let request = Request::put("/api/v1/worker-configs/build")
        .header(header::AUTHORIZATION, format!("Bearer {ADMIN}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(example))
        .unwrap();
    let (status, _, body) = fetch(&harness, request).await;
    assert!(status.is_success(), "{body}");

    let html = page(&harness, &cookie, "/console/worker-configs").await;
    assert!(
        html.contains("ec2-ami") && html.contains("Evaluate"),
        "{html}"
    );
    let html = page(
        &harness,
        &cookie,
        "/console/worker-configs?id=build&inputs=provider%3Dec2%0Aregion%3Dus-east-1%0AavailabilityZone%3Dus-east-1a",
    )
    .await;
    assert!(
        html.contains("ami-12345abcdef") && html.contains("us-east-1a subnets"),
        "the evaluation: {html}"
    );
    let html = page(
        &harness,
        &cookie,
        "/console/worker-configs?id=build&inputs=not+a+pair",
    )
    .await;
    assert!(html.contains("is not name=value"), "{html}");

    let html = page(&harness, &cookie, "/console/tasks").await;
    assert!(html.contains("Background tasks"), "{html}");
    let html = page(&harness, &cookie, "/console/cluster").await;
    assert!(html.contains("served by"), "{html}");
}

/// The fleet's history: the sampler records a pool's live state as a
/// minute's sample, and the pool page and the overview draw what was
/// recorded — one point a sampled bucket, gaps where nothing was — with
/// the pool's cost and why its jobs waited.
#[tokio::test]
async fn a_pool_page_charts_the_sampled_history_and_why_jobs_waited() {
    use runway_store::PoolSample;
    const MINUTE: i64 = 60_000;
    let harness = harness().await;
    let store = harness.store();

    // The sampler, on the live state: three queued jobs.
    for n in 0..3 {
        store
            .enqueue(
                &queued_job(format!("sampled-{n}")),
                Timestamp::from_millis(1_000),
            )
            .await
            .expect("enqueue");
    }
    let now = runway_server::clock::now();
    let last = std::sync::Mutex::new(None);
    runway_server::app::history::sample_once(&harness.service, &last, now)
        .await
        .expect("a sample");
    // Asked again within the same minute: nothing more.
    runway_server::app::history::sample_once(&harness.service, &last, now)
        .await
        .expect("no second sample");
    let minute = runway_server::app::history::minute_of(now).as_millis() - MINUTE;
    let sampled = store
        .pool_history(
            Some("default"),
            Timestamp::from_millis(0),
            std::time::Duration::from_secs(60),
        )
        .await
        .expect("history");
    assert_eq!(sampled.len(), 1, "{sampled:?}");
    assert_eq!(sampled[0].at, Timestamp::from_millis(minute));
    assert_eq!(sampled[0].queued, 3.0);
    assert_eq!(sampled[0].started, 0);

    // Forty more minutes recorded over the last hour, every other one
    // missing: 20 more points, with a gap between each.
    let samples: Vec<PoolSample> = (2..42)
        .step_by(2)
        .map(|back| PoolSample {
            pool: "default".to_owned(),
            at: Timestamp::from_millis(minute - back * MINUTE),
            queued: back,
            running: 2,
            booting: 1,
            idle: 0,
            busy: 2,
            stopped: 0,
            started: 4,
            wait_p50_ms: Some(20_000),
            wait_p95_ms: Some(90_000),
            runner_seconds: 180,
            cost_micros: 5_000,
            waits: vec![
                ("pool_paused".to_owned(), 3),
                ("at_max_runners".to_owned(), 1),
            ],
        })
        .collect();
    store.record_pool_samples(&samples).await.expect("record");
    let cookie = login(&harness).await;

    let hour = page(&harness, &cookie, "/console/pools/default").await;
    let charts: Vec<&str> = hour.split("<svg class=\"chart\"").skip(1).collect();
    assert_eq!(charts.len(), 4, "jobs, runners, queue time, cost");
    for chart in &charts {
        assert!(chart.contains("data-buckets=\"60\""), "{chart}");
    }
    assert!(charts[0].contains("data-points=\"21\""), "{}", charts[0]);
    assert!(charts[0].contains("data-series=\"queued\" data-points=\"21\""));
    // The sampled minute has no start: its queue time is a gap.
    assert!(
        charts[2].contains("data-series=\"p95\" data-points=\"20\""),
        "{}",
        charts[2]
    );
    // 20 minutes × 3 runner-minutes; 20 × $0.005 = $0.10.
    assert!(hour.contains("<strong>1.0</strong> runner-hours"), "{hour}");
    assert!(hour.contains("cost <strong>$0.10</strong>"), "{hour}");
    assert!(hour.contains("<strong>80</strong> jobs started"), "{hour}");
    // Why jobs waited: paused first (60 job-minutes), then at max (20).
    let paused = hour
        .find("data-reason=\"pool_paused\"")
        .expect("paused listed");
    let at_max = hour
        .find("data-reason=\"at_max_runners\"")
        .expect("at max listed");
    assert!(paused < at_max);
    assert!(hour.contains("the pool was paused"), "{hour}");
    assert!(hour.contains(">60<") && hour.contains("75 %"), "{hour}");

    // A day in five-minute buckets: the samples fall in fewer buckets.
    let day = page(&harness, &cookie, "/console/pools/default?range=day").await;
    let buckets: std::collections::BTreeSet<i64> = samples
        .iter()
        .map(|s| s.at.as_millis())
        .chain([minute])
        .map(|at| at.div_euclid(5 * MINUTE))
        .collect();
    assert!(
        day.contains("data-buckets=\"288\""),
        "a day of five-minute buckets"
    );
    assert!(
        day.contains(&format!(
            "data-series=\"queued\" data-points=\"{}\"",
            buckets.len()
        )),
        "{day}"
    );

    // The overview: a sparkline of the last hour and the day's cost.
    let overview = page(&harness, &cookie, "/").await;
    assert!(
        overview.contains("aria-label=\"default queued, last hour\" data-points=\"21\""),
        "{overview}"
    );
    assert!(overview.contains("$0.10"), "{overview}");
    assert!(overview.contains("href=\"/console/pools/default\""));

    // An unknown pool is a 404, not an empty chart.
    let request = Request::get("/console/pools/nope")
        .header(header::COOKIE, &cookie)
        .body(Body::empty())
        .unwrap();
    assert_eq!(fetch(&harness, request).await.0, StatusCode::NOT_FOUND);
}

/// The live view is read once a tick for every open tab: tabs share one
/// snapshot while it is fresh, it holds the jobs every tab follows (with
/// why each waits), and a closed tab's jobs are no longer read.
#[tokio::test]
async fn open_tabs_share_one_snapshot_of_the_jobs_they_follow() {
    use std::time::Duration;
    let harness = harness().await;
    let store = harness.store();
    let mut ids = Vec::new();
    for n in 0..3 {
        let enqueued = store
            .enqueue(
                &queued_job(format!("tab-{n}")),
                Timestamp::from_millis(1_000),
            )
            .await
            .expect("enqueue");
        ids.push(enqueued.job.id);
    }
    let board = harness.service.console.clone();
    let first_tab = board.follow(vec![ids[0], ids[1]]);
    let second_tab = board.follow(vec![ids[1], ids[2]]);
    assert_eq!(board.tabs(), 2);
    let opened = std::time::Instant::now();
    let snapshot = board
        .snapshot(&harness.service, Duration::from_secs(60), opened)
        .await
        .expect("a snapshot");
    assert_eq!(snapshot.jobs.len(), 3, "the union of what the tabs follow");
    assert!(
        snapshot.jobs.values().all(|(_, why)| why.is_some()),
        "each queued job says why it waits"
    );
    let again = board
        .snapshot(&harness.service, Duration::from_secs(60), opened)
        .await
        .expect("the same snapshot");
    assert!(
        std::sync::Arc::ptr_eq(&snapshot, &again),
        "read once while fresh"
    );
    // A tab opened after it was taken gets a new one: its page is newer.
    let newer = board
        .snapshot(
            &harness.service,
            Duration::from_secs(60),
            std::time::Instant::now(),
        )
        .await
        .expect("a newer snapshot");
    assert!(
        !std::sync::Arc::ptr_eq(&snapshot, &newer),
        "never older than the tab"
    );
    drop(first_tab);
    let later = board
        .snapshot(&harness.service, Duration::ZERO, opened)
        .await
        .expect("a new snapshot");
    assert!(!std::sync::Arc::ptr_eq(&newer, &later));
    let mut followed: Vec<_> = later.jobs.keys().copied().collect();
    followed.sort();
    assert_eq!(
        followed,
        vec![ids[1], ids[2]],
        "a closed tab's jobs are not read"
    );
    drop(second_tab);
    assert_eq!(board.tabs(), 0);
}

/// The audit page: 50 entries a page with a way to older ones and back,
/// each target a link to its page, the channel apart, details as words.
#[tokio::test]
async fn the_audit_trail_pages_links_its_targets_and_names_the_channel() {
    let harness = harness().await;
    for n in 0..60 {
        harness
            .store()
            .add_audit(&runway_store::AuditEntry {
                id: 0,
                at: Timestamp::from_millis(1_000 + n),
                actor: "ops".to_owned(),
                action: "job.cancel".to_owned(),
                target: format!("job {}", 100 + n),
                details: serde_json::json!({"channel": if n % 2 == 0 { "console" } else { "cli" }, "reason": "wrong branch"})
                    .to_string(),
            })
            .await
            .expect("an audit entry");
    }
    let cookie = login(&harness).await;
    let first = page(&harness, &cookie, "/console/audit")
        .await
        .replace("&#x2f;", "/");
    // The login itself is the newest entry.
    assert_eq!(first.matches("<tr data-audit=").count(), 50, "{first}");
    assert!(
        first.contains("<a href=\"/console/jobs/159\">job 159</a>"),
        "{first}"
    );
    assert!(first.contains("<span class=\"tag\">cli</span>"), "{first}");
    assert!(first.contains("reason: wrong branch"), "{first}");
    assert!(!first.contains("{&quot;"), "no raw JSON: {first}");
    let older = pager_link(&first, "next").expect("an older page");
    let second = page(&harness, &cookie, &older).await;
    assert_eq!(second.matches("<tr data-audit=").count(), 11, "{second}");
    assert!(second.contains("job 100"), "{second}");
    assert!(pager_link(&second, "next").is_none(), "the last page");
    assert!(second.contains("rel=\"first\" href=\"/console/audit\""));
}

/// A predictive pool's page shows its warm pool: why its runners are kept
/// warm, and the recurring batches its forecast expects (issue 47).
#[tokio::test]
async fn a_pool_page_shows_the_batches_its_warm_pool_is_kept_for() {
    use runway_core::forecast::{Expected, ExpectedBatch};
    let harness = harness().await;
    let at = |hh: i64, mm: i64| Timestamp::from_millis((3 * 86_400 + hh * 3_600 + mm * 60) * 1_000);
    let warm = runway_server::app::Warm {
        target: 150,
        forecast: Expected {
            jobs: 150,
            rate: 0,
            batch: 150,
            following: 0,
            group: 0,
            batches: vec![
                ExpectedBatch {
                    earliest: at(2, 0),
                    latest: at(2, 14),
                    jobs: 150,
                    remaining: 150,
                    seen: 4,
                    of: 4,
                    weekly: false,
                    warm: true,
                },
                ExpectedBatch {
                    earliest: at(6, 30),
                    latest: at(6, 38),
                    jobs: 60,
                    remaining: 0,
                    seen: 6,
                    of: 6,
                    weekly: false,
                    warm: false,
                },
            ],
        },
        at: at(1, 58),
    };
    harness
        .service
        .warm
        .lock()
        .unwrap()
        .insert("default".into(), warm);
    let cookie = login(&harness).await;
    let html = page(&harness, &cookie, "/console/pools/default").await;
    assert!(html.contains("data-warm=\"150\""), "{html}");
    assert!(
        html.contains("150 runners are kept warm for the batch expected at 02:00 UTC (150 jobs, 150 still to come; seen on 4 of the last 4 days like today)"),
        "{html}"
    );
    assert!(html.contains("data-batch=\"06:30 UTC\""), "{html}");
    assert!(html.contains("06:30 UTC – 06:38 UTC · daily"));
    assert!(html.contains(">due<") && html.contains(">kept warm<"));
}

/// A pool that keeps stopped runners says on its page how many are
/// stopped and being prepared, within what bounds, what they cost, and how
/// soon a started one is ready (issue 60).
#[tokio::test]
async fn a_pool_page_shows_its_stock_of_stopped_runners() {
    let mut config = Config::default();
    config.server.admin_tokens = vec![Secret::literal(ADMIN)];
    config.providers = vec![runway_server::config::ProviderConfig {
        name: "cloud".into(),
        price_per_hour: 0.1,
        resume_seconds: Some(20.0),
        ..runway_server::config::ProviderConfig::default()
    }];
    config.pools = vec![runway_server::config::PoolConfig {
        min_stopped: 1,
        max_stopped: 3,
        ..common::pool("default", &["self-hosted", "linux"])
    }];
    let harness = Harness::new(config).await;
    let now = Timestamp::from_millis(1_000_000);
    for (i, stopped) in [(0, true), (1, true), (2, false)] {
        let runner = harness
            .service
            .store
            .create_runner(
                &runway_core::runner::NewRunner {
                    name: format!("default-stock-{i}"),
                    pool: "default".into(),
                    provider: "cloud".into(),
                    labels: vec![],
                    stock: true,
                },
                now,
            )
            .await
            .unwrap();
        let mut events = vec![runway_core::RunnerEvent::ProvisioningStarted {
            instance_id: format!("i-{i}"),
        }];
        if stopped {
            events.push(runway_core::RunnerEvent::Stopped);
        }
        for event in events {
            harness
                .service
                .store
                .apply_runner_event(runner.id, &event, now)
                .await
                .unwrap();
        }
    }
    let cookie = login(&harness).await;
    let overview = page(&harness, &cookie, "/").await;
    assert!(
        overview.contains("+<span data-live=\"pool:default:stopped\">2</span> stopped"),
        "{overview}"
    );
    let html = page(&harness, &cookie, "/console/pools/default").await;
    assert!(html.contains("data-stock=\"2\""), "{html}");
    assert!(
        html.contains("2 stopped, 1 being prepared (kept between 1 and 3), costing $0.006 an hour: each is started for a queued job, ready in about 20 s instead of a cold boot."),
        "{html}"
    );
}
