//! Worker configurations through the admin API on a real store, and the
//! RFC 124 example kept in `examples/worker-config.json`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use runway_core::worker_config::Schemas;
use runway_server::config::{Config, ProviderConfig, Secret};
use serde_json::{json, Value};
use tower::ServiceExt;

const ADMIN: &str = "worker-config-admin-token";

fn example() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/worker-config.json");
    std::fs::read_to_string(path).expect("examples/worker-config.json")
}

fn inputs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn the_rfc_124_example_evaluates_as_the_rfc_says() {
    let config =
        runway_server::config::worker_config::parse(&example(), "example").expect("parses");
    let east = config
        .evaluate(
            &inputs(&[
                ("provider", "ec2"),
                ("region", "us-east-1"),
                ("availabilityZone", "us-east-1a"),
            ]),
            &Schemas::default(),
        )
        .expect("evaluates");
    assert_eq!(
        east.values,
        json!({
            "scalingRatio": 1,
            "owner": "build-team@my-open-source-project.com",
            "description": "configuration for builds",
            "ec2": { "ImageId": "ami-12345abcdef", "SubnetID": "sn-302433abcdef" },
        })
    );
    assert_eq!(
        east.applied_rules,
        ["basic-options", "ec2-ami", "us-east-1a subnets"]
    );
    let west = config
        .evaluate(
            &inputs(&[("provider", "ec2"), ("region", "us-west-2")]),
            &Schemas::default(),
        )
        .expect("evaluates");
    assert_eq!(
        west.values,
        json!({
            "scalingRatio": 1,
            "owner": "build-team@my-open-source-project.com",
            "description": "configuration for builds",
        })
    );
}

use crate::common;
use common::Harness;

impl Harness {
    /// An admin token and `providers`; no pools.
    async fn worker_configs(providers: Vec<ProviderConfig>) -> Harness {
        let mut config = Config::default();
        config.server.admin_tokens = vec![Secret::literal(ADMIN)];
        config.providers = providers;
        Harness::new(config).await
    }

    /// An admin call, with `If-Match` if given: the status, the ETag, the body.
    async fn admin(
        &self,
        method: &str,
        path: &str,
        if_match: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Option<String>, Value) {
        let mut request = common::request(method, path, ADMIN, body);
        if let Some(version) = if_match {
            let value = version.parse().expect("a header value");
            request.headers_mut().insert("if-match", value);
        }
        let (status, headers, body) = self.exchange(request).await;
        let etag = headers
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        (status, etag, body)
    }
}

fn example_json() -> Value {
    serde_json::from_str(&example()).unwrap()
}

#[tokio::test]
async fn put_get_evaluate_and_delete() {
    let harness = Harness::worker_configs(Vec::new()).await;
    let (status, etag, body) = harness
        .admin(
            "PUT",
            "/api/v1/worker-configs/build",
            None,
            Some(example_json()),
        )
        .await;
    assert_eq!(
        (status, etag.as_deref()),
        (StatusCode::CREATED, Some("\"1\"")),
        "{body}"
    );
    let (status, etag, got) = harness
        .admin("GET", "/api/v1/worker-configs/build", None, None)
        .await;
    assert_eq!((status, etag.as_deref()), (StatusCode::OK, Some("\"1\"")));
    assert_eq!(got["pools"], json!(["build-dbg", "build-opt"]));
    assert_eq!(got["rules"].as_array().map(Vec::len), Some(3));

    let east = json!({"provider": "ec2", "region": "us-east-1", "availabilityZone": "us-east-1a"});
    let (status, _, result) = harness
        .admin(
            "POST",
            "/api/v1/worker-configs/build/evaluate",
            None,
            Some(east.clone()),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{result}");
    assert_eq!(result["config"]["ec2"]["SubnetID"], "sn-302433abcdef");
    let (_, _, again) = harness
        .admin(
            "POST",
            "/api/v1/worker-configs/build/evaluate",
            None,
            Some(east.clone()),
        )
        .await;
    assert_eq!(again, result, "a cached answer is the same answer");
    assert_eq!(harness.service.evaluations.len(), 1);

    // Replacing the configuration invalidates what was cached for it.
    let mut changed = example_json();
    changed["rules"][1]["values"]["ec2"]["ImageId"] = json!("ami-new");
    let (status, etag, _) = harness
        .admin(
            "PUT",
            "/api/v1/worker-configs/build",
            Some("\"1\""),
            Some(changed),
        )
        .await;
    assert_eq!((status, etag.as_deref()), (StatusCode::OK, Some("\"2\"")));
    assert_eq!(harness.service.evaluations.len(), 0);
    let (_, _, fresh) = harness
        .admin(
            "POST",
            "/api/v1/worker-configs/build/evaluate",
            None,
            Some(east),
        )
        .await;
    assert_eq!(fresh["config"]["ec2"]["ImageId"], "ami-new");
    assert_eq!(fresh["version"], 2);

    let (status, _, error) = harness
        .admin(
            "PUT",
            "/api/v1/worker-configs/build",
            Some("\"1\""),
            Some(example_json()),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a stale If-Match is refused: {error}"
    );
    let (_, _, list) = harness
        .admin("GET", "/api/v1/worker-configs", None, None)
        .await;
    assert_eq!(list["worker_configs"][0]["version"], 2);

    let (status, _, _) = harness
        .admin(
            "DELETE",
            "/api/v1/worker-configs/build",
            Some("\"1\""),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (status, _, _) = harness
        .admin(
            "DELETE",
            "/api/v1/worker-configs/build",
            Some("\"2\""),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _, _) = harness
        .admin("GET", "/api/v1/worker-configs/build", None, None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn refusals_say_why() {
    let harness = Harness::worker_configs(vec![ProviderConfig {
        name: "ec2".into(),
        conditions: vec!["availabilityZone".into()],
        required_keys: vec!["ec2.ImageId".into()],
        ..ProviderConfig::for_kind("ec2", "exec").unwrap()
    }])
    .await;
    let (status, _, _) = harness
        .admin(
            "PUT",
            "/api/v1/worker-configs/build",
            None,
            Some(example_json()),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "availabilityZone is declared by ec2"
    );

    let mut other = example_json();
    other["id"] = json!("other");
    other["pools"] = json!(["build-opt", "new-pool"]);
    let (status, _, error) = harness
        .admin("PUT", "/api/v1/worker-configs/other", None, Some(other))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert!(
        error["error"].as_str().unwrap().contains("\"build\""),
        "names the owner: {error}"
    );

    let mut undeclared = example_json();
    undeclared["id"] = json!("u");
    undeclared["pools"] = json!(["p"]);
    undeclared["rules"][2]["conditions"][0]["zone"] = json!("a");
    let (status, _, error) = harness
        .admin("PUT", "/api/v1/worker-configs/u", None, Some(undeclared))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        error["error"].as_str().unwrap().contains("\"zone\""),
        "{error}"
    );

    let duplicate = json!({"pools": [], "rules": [{"rule_id": "a"}, {"rule_id": "a"}]});
    let (status, _, error) = harness
        .admin("PUT", "/api/v1/worker-configs/d", None, Some(duplicate))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        error["error"].as_str().unwrap().contains("rule_id \"a\""),
        "{error}"
    );

    let (status, _, error) = harness
        .admin(
            "POST",
            "/api/v1/worker-configs/build/evaluate",
            None,
            Some(json!({"provider": "ec2", "region": "eu-west-1"})),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "no AMI outside us-east-1: {error}"
    );
    assert!(
        error["error"].as_str().unwrap().contains("ec2.ImageId"),
        "{error}"
    );

    let (status, _, _) = harness
        .admin(
            "PUT",
            "/api/v1/worker-configs/x",
            Some("not-a-version"),
            Some(json!({})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let anonymous = Request::get("/api/v1/worker-configs")
        .body(Body::empty())
        .unwrap();
    let response = runway_server::http::router(harness.service.clone())
        .oneshot(anonymous)
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_puts_with_the_same_if_match_let_exactly_one_win() {
    let harness = Arc::new(Harness::worker_configs(Vec::new()).await);
    let (status, _, _) = harness
        .admin(
            "PUT",
            "/api/v1/worker-configs/build",
            None,
            Some(example_json()),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let mut tasks = Vec::new();
    for writer in 0..8 {
        let harness = harness.clone();
        tasks.push(tokio::spawn(async move {
            let mut body = example_json();
            body["rules"][0]["values"]["owner"] = json!(format!("writer-{writer}"));
            harness
                .admin(
                    "PUT",
                    "/api/v1/worker-configs/build",
                    Some("\"1\""),
                    Some(body),
                )
                .await
                .0
        }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap());
    }
    let wins = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    let conflicts = statuses
        .iter()
        .filter(|s| **s == StatusCode::CONFLICT)
        .count();
    assert_eq!((wins, conflicts), (1, 7), "{statuses:?}");
}

/// A key the pool's EC2 provider does not know (`ec2.SecurityGroupId`
/// for `SecurityGroupIds`) is a 422 naming it, not an error when the
/// first job needs a runner; a value of the wrong shape too. The keys
/// spelled right are taken.
#[tokio::test]
async fn provider_keys_the_pools_providers_refuse_are_a_422_naming_the_key() {
    let mut config = Config::default();
    config.server.admin_tokens = vec![Secret::literal(ADMIN)];
    config.providers = vec![ProviderConfig::for_kind("aws", "ec2").unwrap()];
    let harness = Harness::new(config).await;
    let with = |ec2: Value| {
        json!({"pools": ["local"], "rules": [
            {"rule_id": "ami", "values": {"ec2": {"ImageId": "ami-1"}}},
            {"rule_id": "network", "values": {"ec2": ec2}},
        ]})
    };
    for (ec2, key) in [
        (json!({"SecurityGroupId": ["sg-1"]}), "ec2.SecurityGroupId"),
        (json!({"SecurityGroupIds": "sg-1"}), "ec2.SecurityGroupIds"),
        (json!({"InstanceType": "m5.large"}), "ec2.InstanceType"),
    ] {
        let (status, _, error) = harness
            .admin("PUT", "/api/v1/worker-configs/net", None, Some(with(ec2)))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{error}");
        let message = error["error"].as_str().unwrap_or_default();
        assert!(
            message.contains(key) && message.contains("\"network\""),
            "names the key and the rule: {error}"
        );
    }
    let (status, _, error) = harness
        .admin(
            "PUT",
            "/api/v1/worker-configs/net",
            None,
            Some(with(
                json!({"SecurityGroupIds": ["sg-1"], "SubnetId": "subnet-1"}),
            )),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{error}");
}
