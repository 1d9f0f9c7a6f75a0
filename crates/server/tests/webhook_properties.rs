//! Properties of webhook intake, through the real router on a real store:
//!
//! - any interleaving, with duplicates, of the events of a set of jobs ends
//!   in the same stored state as the in-order sequence;
//! - arbitrary bytes and arbitrary JSON never panic the handler and are
//!   answered only with 2xx or 4xx.

use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use runway_server::config::{Config, GithubConfig, PoolConfig, Secret};
use runway_server::github::signature::sign;
use runway_server::Service;
use runway_store::JobFilter;

use crate::common;
use serde_json::json;
use tower::ServiceExt;

const SECRET: &str = "property-secret";

fn config() -> Config {
    let defaults = Config::default();
    Config {
        pools: vec![
            PoolConfig {
                name: "small".into(),
                labels: vec!["self-hosted".into(), "linux".into(), "small".into()],
                min_idle: 0,
                max_runners: 10,
                ..PoolConfig::default()
            },
            PoolConfig {
                name: "large".into(),
                labels: vec!["self-hosted".into(), "linux".into(), "large".into()],
                min_idle: 0,
                max_runners: 10,
                ..PoolConfig::default()
            },
        ],
        github: GithubConfig {
            webhook_secrets: vec![Secret::literal(SECRET)],
            required_labels: vec!["self-hosted".into()],
            max_body_bytes: 256 * 1024,
            ..defaults.github.clone()
        },
        ..defaults
    }
}

async fn service(dir: &tempfile::TempDir, name: &str) -> Arc<Service> {
    let store = common::sqlite_store(&dir.path().join(name)).await;
    Arc::new(Service::new(config(), store))
}

async fn post(service: &Arc<Service>, event: &str, delivery: &str, body: Vec<u8>) -> u16 {
    let request = Request::post("/webhooks/github")
        .header("x-github-event", event)
        .header("x-github-delivery", delivery)
        .header("x-hub-signature-256", sign(SECRET.as_bytes(), &body))
        .body(Body::from(body))
        .expect("request");
    let response = runway_server::http::router(service.clone())
        .oneshot(request)
        .await
        .expect("router");
    response.status().as_u16()
}

/// One job's life as GitHub reports it: how far it got, its labels, its
/// conclusion.
#[derive(Debug, Clone)]
struct JobLife {
    id: u64,
    stages: usize,
    labels: Vec<&'static str>,
    conclusion: &'static str,
}

fn job_life(id: u64) -> impl Strategy<Value = JobLife> {
    (
        1usize..=3,
        prop::sample::select(vec![
            vec!["self-hosted", "linux", "small"],
            vec!["self-hosted", "large"],
            vec!["self-hosted", "linux"],
            vec!["self-hosted", "small", "large"],
            vec!["ubuntu-latest"],
        ]),
        prop::sample::select(vec!["success", "failure", "cancelled", "skipped"]),
    )
        .prop_map(move |(stages, labels, conclusion)| JobLife {
            id,
            stages,
            labels,
            conclusion,
        })
}

fn events(life: &JobLife) -> Vec<serde_json::Value> {
    let actions = ["queued", "in_progress", "completed"];
    actions[..life.stages]
        .iter()
        .map(|action| {
            let runner = (*action != "queued").then(|| format!("runner-{}", life.id));
            json!({
                "action": action,
                "workflow_job": {
                    "id": life.id,
                    "run_id": 7,
                    "labels": life.labels,
                    "runner_name": runner,
                    "conclusion": if *action == "completed" { Some(life.conclusion) } else { None },
                    "created_at": "2026-11-21T10:00:00Z",
                    "started_at": "2026-11-21T10:00:30.000Z",
                    "completed_at": if *action == "completed" { Some("2026-11-21T10:05:00Z") } else { None },
                },
                "repository": { "full_name": "org/repo" },
            })
        })
        .collect()
}

/// What must converge: per job, its state, pool, conclusion and runner name.
async fn final_state(service: &Arc<Service>) -> Vec<String> {
    let store = &service.store;
    let mut states = Vec::new();
    for job in store.list_jobs(&JobFilter::default()).await.expect("list") {
        let runner = match job.runner {
            Some(id) => store.get_runner(id).await.expect("runner").map(|r| r.name),
            None => None,
        };
        states.push(format!(
            "{} {} {:?} {:?} {:?}",
            job.external_id,
            job.state,
            job.pool,
            job.conclusion.map(|c| c.as_str()),
            runner
        ));
    }
    states.sort();
    states
}

#[test]
fn any_interleaving_with_duplicates_converges_to_the_in_order_state() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let strategy = (job_life(101), job_life(202), job_life(303)).prop_flat_map(|(a, b, c)| {
        let lives = [a, b, c];
        let in_order: Vec<serde_json::Value> = lives.iter().flat_map(events).collect();
        let n = in_order.len();
        // A shuffled copy of every event, plus up to n duplicates at random places.
        let duplicates = prop::collection::vec((0..n, 0..n + 1, any::<bool>()), 0..=n);
        (
            Just(in_order.clone()),
            Just(in_order).prop_shuffle(),
            duplicates,
        )
    });
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 48,
        ..ProptestConfig::default()
    });
    runner
        .run(&strategy, |(in_order, shuffled, duplicates)| {
            runtime.block_on(async {
                let dir = tempfile::tempdir().expect("dir");
                let ordered = service(&dir, "ordered.db").await;
                for (i, event) in in_order.iter().enumerate() {
                    let status = post(
                        &ordered,
                        "workflow_job",
                        &format!("o-{i}"),
                        event.to_string().into_bytes(),
                    )
                    .await;
                    prop_assert!(status == 202 || status == 200, "status {status}");
                }
                // The shuffled run: each original event once, under its own
                // delivery id, plus duplicates that are either redeliveries
                // (same id) or repeats (new id).
                let mut deliveries: Vec<(String, &serde_json::Value)> = shuffled
                    .iter()
                    .enumerate()
                    .map(|(i, event)| (format!("s-{i}"), event))
                    .collect();
                for (k, (source, position, same_id)) in duplicates.iter().enumerate() {
                    let (id, event) = deliveries[*source % deliveries.len()].clone();
                    let id = if *same_id { id } else { format!("dup-{k}") };
                    deliveries.insert((*position).min(deliveries.len()), (id, event));
                }
                let mixed = service(&dir, "mixed.db").await;
                for (id, event) in deliveries {
                    let status =
                        post(&mixed, "workflow_job", &id, event.to_string().into_bytes()).await;
                    prop_assert!(status == 202 || status == 200, "status {status}");
                }
                let expected = final_state(&ordered).await;
                prop_assert_eq!(final_state(&mixed).await, expected);
                Ok(())
            })
        })
        .expect("interleavings converge");
}

fn arbitrary_json() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(Into::into),
        any::<i64>().prop_map(Into::into),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Into::into),
        ".{0,12}".prop_map(serde_json::Value::String),
        prop::sample::select(vec![
            "queued",
            "in_progress",
            "completed",
            "waiting",
            "self-hosted"
        ])
        .prop_map(|s| serde_json::Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
            prop::collection::btree_map(
                prop::sample::select(vec![
                    "action",
                    "workflow_job",
                    "id",
                    "labels",
                    "runner_name",
                    "conclusion",
                    "started_at",
                    "created_at",
                    "completed_at",
                    "repository",
                    "full_name",
                    "x",
                ])
                .prop_map(str::to_owned),
                inner,
                0..6
            )
            .prop_map(|map| serde_json::Value::Object(map.into_iter().collect())),
        ]
    })
}

#[test]
fn arbitrary_bodies_get_only_2xx_or_4xx() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("dir");
    let service = runtime.block_on(service(&dir, "fuzz.db"));
    let body = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..512),
        arbitrary_json().prop_map(|value| value.to_string().into_bytes()),
        // Nearly valid workflow_job events with arbitrary field values.
        (arbitrary_json(), arbitrary_json(), arbitrary_json(), arbitrary_json()).prop_map(
            |(action, id, labels, runner)| {
                json!({"action": action, "workflow_job": {"id": id, "labels": labels, "runner_name": runner}})
                    .to_string()
                    .into_bytes()
            }
        ),
    ];
    let event = prop::sample::select(vec!["workflow_job", "ping", "push", ""]);
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 400,
        ..ProptestConfig::default()
    });
    runner
        .run(&(body, event, any::<bool>()), |(body, event, signed)| {
            runtime.block_on(async {
                let mut request = Request::post("/webhooks/github")
                    .header("x-github-event", event)
                    .header("x-github-delivery", format!("fuzz-{}", body.len()));
                if signed {
                    request = request.header("x-hub-signature-256", sign(SECRET.as_bytes(), &body));
                }
                let request = request.body(Body::from(body)).expect("request");
                let response = runway_server::http::router(service.clone())
                    .oneshot(request)
                    .await
                    .expect("router");
                let status = response.status().as_u16();
                prop_assert!((200..500).contains(&status), "status {status}");
                if !signed {
                    prop_assert_eq!(status, 401);
                }
                Ok(())
            })
        })
        .expect("no 5xx, no panic");
}
