//! Scoped tokens, every admin route × role × pool in and out of scope: a
//! token may do what its role allows to the pools it covers, is refused
//! 403 otherwise, and sees only its pools in listings.

use axum::http::StatusCode;
use runway_server::config::{Config, Role, Secret, TokenConfig};

use serde_json::{json, Value};

use crate::common;
use common::Harness;

const ADMIN: &str = "scoped-tokens-legacy-admin";

fn token(name: &str, role: Role, pools: &[&str]) -> TokenConfig {
    TokenConfig {
        name: name.into(),
        token: Secret::literal(&format!("{name}-token-0123456789")),
        role,
        pools: pools.iter().map(|p| p.to_string()).collect(),
    }
}

fn bearer(name: &str) -> String {
    format!("{name}-token-0123456789")
}

/// What a route needs, and which pool it is about (`None`: no one pool).
struct Route {
    method: &'static str,
    path: String,
    body: Option<Value>,
    role: Role,
    pool: Option<&'static str>,
}

#[tokio::test]
async fn every_admin_route_by_role_and_scope() {
    let mut config = Config::default();
    config.server.admin_tokens = vec![Secret::literal(ADMIN)];
    config.server.tokens = vec![
        token("a-read", Role::Read, &["team-a"]),
        token("a-operate", Role::Operate, &["team-a*"]),
        token("a-admin", Role::Admin, &["team-a"]),
        token("all-operate", Role::Operate, &["*"]),
        token("all-admin", Role::Admin, &["*"]),
    ];
    config.pools = vec![
        common::pool("team-a", &["self-hosted", "a"]),
        common::pool("team-b", &["self-hosted", "b"]),
    ];
    let h = Harness::new(config).await;
    // A job and a runner in each pool.
    let mut jobs = std::collections::BTreeMap::new();
    let mut runners = std::collections::BTreeMap::new();
    for (pool, label) in [("team-a", "a"), ("team-b", "b")] {
        let (status, job) = h
            .post(
                "/api/v1/jobs",
                ADMIN,
                json!({"labels": [label], "script": "true"}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{job}");
        jobs.insert(pool, job["id"].as_i64().unwrap());
        let (_, token) = h
            .post("/api/v1/registration-tokens", ADMIN, json!({"pool": pool}))
            .await;
        let (_, runner) = h
            .post(
                "/api/v1/runners/register",
                "",
                json!({"token": token["token"], "name": format!("r-{pool}"), "labels": [label]}),
            )
            .await;
        runners.insert(pool, runner["runner_id"].as_i64().unwrap());
    }
    let mut routes = Vec::new();
    for pool in ["team-a", "team-b"] {
        let (job, runner) = (jobs[pool], runners[pool]);
        let label = if pool == "team-a" { "a" } else { "b" };
        let read = |path: String| Route {
            method: "GET",
            path,
            body: None,
            role: Role::Read,
            pool: Some(pool),
        };
        let operate = |path: String, body: Option<Value>| Route {
            method: "POST",
            path,
            body,
            role: Role::Operate,
            pool: Some(pool),
        };
        routes.extend([
            read(format!("/api/v1/jobs/{job}")),
            read(format!("/api/v1/jobs/{job}/events")),
            read(format!("/api/v1/jobs/{job}/log")),
            read(format!("/api/v1/jobs?pool={pool}")),
            read(format!("/api/v1/runners/{runner}")),
            read(format!("/api/v1/runners?pool={pool}")),
            operate(
                "/api/v1/jobs".into(),
                Some(json!({"labels": [label], "script": "true"})),
            ),
            operate(
                "/api/v1/registration-tokens".into(),
                Some(json!({"pool": pool})),
            ),
            operate(format!("/api/v1/pools/{pool}/pause"), None),
            operate(format!("/api/v1/pools/{pool}/resume"), None),
            operate(format!("/api/v1/jobs/{job}/retry"), None),
            operate(format!("/api/v1/runners/{runner}/drain"), None),
        ]);
    }
    for path in [
        "/api/v1/audit",
        "/api/v1/tasks",
        "/api/v1/cluster",
        "/api/v1/worker-configs",
    ] {
        routes.push(Route {
            method: "GET",
            path: path.into(),
            body: None,
            role: Role::Read,
            pool: None,
        });
    }
    routes.push(Route {
        method: "PUT",
        path: "/api/v1/worker-configs/wc".into(),
        body: Some(json!({"pools": ["team-a"], "rules": []})),
        role: Role::Admin,
        pool: None,
    });
    let tokens: [(&str, Role, &[&str]); 5] = [
        ("a-read", Role::Read, &["team-a"]),
        ("a-operate", Role::Operate, &["team-a"]),
        ("a-admin", Role::Admin, &["team-a"]),
        ("all-operate", Role::Operate, &["team-a", "team-b"]),
        ("all-admin", Role::Admin, &["team-a", "team-b"]),
    ];
    let mut wrong = Vec::new();
    for (name, role, covers) in tokens {
        let every_pool = covers.len() == 2;
        for route in &routes {
            let in_scope = match route.pool {
                Some(pool) => covers.contains(&pool),
                None => every_pool,
            };
            let allowed = role >= route.role && in_scope;
            let (status, body) = h
                .call(route.method, &route.path, &bearer(name), route.body.clone())
                .await;
            let refused = status == StatusCode::FORBIDDEN;
            if allowed == refused || status == StatusCode::UNAUTHORIZED {
                wrong.push(format!(
                    "{name} {} {}: {status} {body}",
                    route.method, route.path
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));

    // Listings hold only the token's pools.
    let (_, listed) = h.get("/api/v1/jobs", &bearer("a-read")).await;
    let pools: std::collections::BTreeSet<&str> = listed["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|j| j["pool"].as_str())
        .collect();
    assert_eq!(pools, ["team-a"].into(), "{listed}");
    let (_, listed) = h.get("/api/v1/pools", &bearer("a-read")).await;
    assert_eq!(
        listed["pools"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
    let (_, listed) = h.get("/api/v1/runners", &bearer("a-read")).await;
    assert!(
        listed["runners"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["pool"] == "team-a"),
        "{listed}"
    );
    // The audit trail names the token that acted.
    let (_, audit) = h.get("/api/v1/audit", ADMIN).await;
    assert!(
        audit["entries"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["actor"] == "a-operate" && e["action"] == "pool.pause"),
        "{audit}"
    );
}
