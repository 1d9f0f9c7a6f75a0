//! The web console on a real store with a deep queue: 10,000 queued jobs
//! page 50 at a time (each page a different, older slice, every job
//! reachable), the overview shows queue times and provider health, and the
//! worker-configuration, tasks and cluster pages render — evaluating a
//! worker configuration from its form.

mod common;

use std::collections::BTreeSet;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use common::Harness;
use runway_core::{JobSource, NewJob, Route, Timestamp};
use runway_server::config::{Config, Secret};
use tower::ServiceExt;

const ADMIN: &str = "console-harness-admin-token";
const QUEUED: usize = 10_000;

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
    let next = html
        .split_once("<p class=\"pager\"><a href=\"")
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(link, _)| link.replace("&amp;", "&").replace("&#x2f;", "/"));
    (ids, next)
}

#[tokio::test]
async fn ten_thousand_queued_jobs_page_fifty_at_a_time() {
    let harness = harness().await;
    let jobs: Vec<NewJob> = (0..QUEUED)
        .map(|n| NewJob {
            source: JobSource::Api,
            external_id: format!("deep-{n}"),
            route: Route::Pool("default".to_owned()),
            labels: vec!["self-hosted".to_owned(), "linux".to_owned()],
            payload: r#"{"script":"true"}"#.to_owned(),
            max_attempts: 3,
            share: Default::default(),
        })
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
