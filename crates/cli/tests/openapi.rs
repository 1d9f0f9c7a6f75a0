//! The OpenAPI document at `/api/v1/openapi.json`, checked from outside:
//! it is OpenAPI 3.1 and covers every admin and runner API route, and
//! schemathesis (PyPI; `.ci/run` installs it in a venv) fuzzes the real
//! binary against it with every check it has — no 5xx, every status, body
//! and content type as documented, schema-valid requests accepted, invalid
//! ones refused, authentication enforced. Without schemathesis the fuzzing
//! is skipped, except under CI, where that is a failure.

use crate::common;

use std::path::Path;
use std::process::Command;

use common::{client, registration_token, run_checker, runway, spawn_serve, tool, Process};
use serde_json::{json, Value};

const ADMIN: &str = "openapi-test-admin-token";
const READ: &str = "openapi-test-read-token";

/// A server with one pool and no provider: fuzzed job submissions queue
/// and are handed to the fuzzer's runner token, never run.
fn serve(dir: &Path) -> (Process, String) {
    let port = common::free_port();
    std::fs::write(
        dir.join("runway.toml"),
        format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\n\
             admin_tokens = [\"{ADMIN}\"]\nread_tokens = [\"{READ}\"]\n\
             [runner_api]\npoll_timeout = \"1s\"\n\
             [[pools]]\nname = \"default\"\nlabels = [\"self-hosted\", \"linux\"]\n"
        ),
    )
    .expect("write the config");
    let mut command = runway(dir);
    command.args(["serve", "--config", "runway.toml"]);
    spawn_serve(command)
}

fn document(base: &str) -> Value {
    let response = client()
        .get(format!("{base}/api/v1/openapi.json"))
        .send()
        .expect("runway answers");
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().ok(),
        Some("application/json")
    );
    response.json().expect("the document is JSON")
}

/// Every route of the admin and runner APIs, by method and path.
const ROUTES: &[(&str, &str)] = &[
    ("get", "/api/v1/status"),
    ("get", "/healthz"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/api/v1/jobs"),
    ("post", "/api/v1/jobs"),
    ("get", "/api/v1/jobs/{id}"),
    ("post", "/api/v1/jobs/{id}/cancel"),
    ("post", "/api/v1/jobs/{id}/retry"),
    ("get", "/api/v1/jobs/{id}/events"),
    ("get", "/api/v1/jobs/{id}/log"),
    ("post", "/api/v1/jobs/request"),
    ("post", "/api/v1/jobs/{id}/provisioning"),
    ("post", "/api/v1/jobs/{id}/heartbeat"),
    ("post", "/api/v1/jobs/{id}/complete"),
    ("get", "/api/v1/pools"),
    ("post", "/api/v1/pools/{name}/pause"),
    ("post", "/api/v1/pools/{name}/resume"),
    ("get", "/api/v1/runners"),
    ("get", "/api/v1/runners/{id}"),
    ("post", "/api/v1/runners/{id}/drain"),
    ("post", "/api/v1/runners/{id}/terminate"),
    ("post", "/api/v1/runners/{id}/metrics"),
    ("post", "/api/v1/registration-tokens"),
    ("post", "/api/v1/runners/register"),
    ("get", "/api/v1/tasks"),
    ("get", "/api/v1/cluster"),
    ("post", "/api/v1/config/reload"),
    ("get", "/api/v1/audit"),
    ("get", "/api/v1/worker-configs"),
    ("get", "/api/v1/worker-configs/{id}"),
    ("put", "/api/v1/worker-configs/{id}"),
    ("delete", "/api/v1/worker-configs/{id}"),
    ("post", "/api/v1/worker-configs/{id}/evaluate"),
];

#[test]
fn the_document_is_openapi_3_1_and_covers_every_api_route() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (_server, base) = serve(dir.path());
    let doc = document(&base);
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["info"]["title"], "runway");
    let paths = doc["paths"].as_object().expect("paths");
    let mut documented: Vec<(String, String)> = paths
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .into_iter()
                .flat_map(|ops| ops.keys())
                .filter(|key| ["get", "put", "post", "delete", "patch"].contains(&key.as_str()))
                .map(move |method| (method.clone(), path.clone()))
        })
        .collect();
    documented.sort();
    let mut expected: Vec<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    expected.sort();
    assert_eq!(documented, expected);
    // docs/api.md lists every route the document has.
    let api_md = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/api.md"))
        .expect("docs/api.md");
    for (method, path) in &documented {
        let row = format!("| `{} {path}` |", method.to_uppercase());
        assert!(api_md.contains(&row), "docs/api.md lists {row}");
    }

    // Each documented route is routed.
    for (method, path) in ROUTES {
        let url = format!(
            "{base}{}",
            path.replace("{id}", "1").replace("{name}", "default")
        );
        let request = match *method {
            "get" => client().get(url),
            "post" => client().post(url),
            "put" => client().put(url),
            _ => client().delete(url),
        };
        let status = request.send().expect("runway answers").status().as_u16();
        // Without a token, an authenticated route refuses before it looks
        // anything up, so a 404 or 405 here means the route is missing.
        assert!(status != 404 && status != 405, "{method} {path}: {status}");
    }

    // Every authenticated operation names its scheme and documents 401;
    // the schemes exist.
    let schemes = doc["components"]["securitySchemes"]
        .as_object()
        .expect("security schemes");
    for (path, item) in paths {
        for (method, operation) in item.as_object().expect("a path item") {
            let Some(security) = operation["security"].as_array() else {
                assert!(
                    ["/healthz", "/readyz", "/metrics", "/api/v1/status"].contains(&path.as_str()),
                    "{method} {path} names no security"
                );
                continue;
            };
            for requirement in security {
                for scheme in requirement.as_object().expect("a requirement").keys() {
                    assert!(schemes.contains_key(scheme), "{method} {path}: {scheme}");
                }
            }
            if security
                .iter()
                .any(|r| !r.as_object().is_some_and(|o| o.is_empty()))
            {
                assert!(
                    operation["responses"].get("401").is_some(),
                    "{method} {path} does not document 401"
                );
            }
        }
    }
}

/// A runner token for the fuzzer's runner-API requests.
fn runner_token(base: &str) -> String {
    let token = registration_token(base, ADMIN, "default");
    let body: Value = client()
        .post(format!("{base}/api/v1/runners/register"))
        .json(&json!({"token": token, "name": "fuzzer", "labels": ["self-hosted", "linux"]}))
        .send()
        .expect("register")
        .json()
        .expect("a JSON answer");
    body["runner_token"]
        .as_str()
        .expect("a runner token")
        .to_owned()
}

#[test]
fn schemathesis_finds_nothing_against_the_real_binary() {
    let Some(schemathesis) = tool("schemathesis", "schemathesis from PyPI") else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temp dir");
    let (_server, base) = serve(dir.path());
    let runner = runner_token(&base);
    // Runner-token operations get the runner's token; everything else the
    // admin token (read-token refusals are covered by the API tests).
    // Schema-valid requests may still be refused for what a schema cannot
    // say: 409 and 410 for the state of a job or runner (the fuzzer drains
    // its own runner, cancels jobs), 422 for meaning (labels no pool
    // serves, a pool not configured, a timestamp outside the runner's
    // life, repeated rule ids).
    let config = format!(
        r#"
headers = {{ Authorization = "Bearer {ADMIN}" }}

[checks.positive_data_acceptance]
expected-statuses = ["2xx", "401", "403", "404", "409", "410", "422"]

[[operations]]
include-path-regex = '^/api/v1/(jobs/request|jobs/\{{id\}}/(provisioning|heartbeat|complete)|runners/\{{id\}}/metrics)$'
headers = {{ Authorization = "Bearer {runner}" }}
"#
    );
    let config_path = dir.path().join("schemathesis.toml");
    std::fs::write(&config_path, config).expect("write the schemathesis config");
    let mut command = Command::new(&schemathesis);
    command
        .current_dir(dir.path())
        .arg("--config-file")
        .arg(&config_path)
        .args(["run", &format!("{base}/api/v1/openapi.json")])
        .args(["--checks", "all", "--max-examples", "25", "--seed", "1"])
        // One worker: deterministic, and hypothesis's lambda descriptions
        // are not thread-safe (seen: "AST constructor recursion depth
        // mismatch" with two).
        .args(["--workers", "1", "--request-timeout", "10"])
        .arg("--no-color");
    let text = run_checker(command, "schemathesis");
    assert!(
        text.contains("34 selected / 34 total"),
        "schemathesis did not test every operation:\n{text}"
    );
}
