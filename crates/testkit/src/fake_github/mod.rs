//! A fake GitHub API for tests: an axum server on loopback that answers with
//! the shapes of GitHub's own examples (`../shared/fixtures/github/openapi`),
//! checks every request and answer against the operation's OpenAPI schema,
//! counts down a rate limit, lags the `busy` flag it shows on runners,
//! refuses to delete a runner that runs a job with 422, records every call,
//! and delivers webhooks to runway (or "drops" them, recording a failed
//! delivery that a redelivery request then really delivers).
//!
//! Authentication is a fixed token, or a GitHub App: a JWT (RS256, checked
//! against the App's public key) mints installation tokens.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde_json::{json, Value};

mod routes;
use routes::handle;

pub const TOKEN: &str = "ghp_test-token-not-real";
pub const HOOK_SECRET: &str = "fake-github-hook-secret";

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/fixtures/github")
}

/// A JIT configuration shaped as GitHub encodes it: base64 of a JSON
/// object of runner file names to base64 contents.
pub fn encoded_jit(id: u64, name: &str) -> String {
    use base64::Engine as _;
    let b64 = |text: String| base64::engine::general_purpose::STANDARD.encode(text);
    let files = json!({
        ".runner": b64(json!({"agentId": id, "agentName": name, "poolId": 1}).to_string()),
        ".credentials": b64(format!("credentials of {name}")),
        ".credentials_rsaparams": b64(format!("rsa parameters of {name}")),
    });
    b64(files.to_string())
}

pub fn example(name: &str) -> Value {
    let text = std::fs::read_to_string(fixtures().join("openapi/examples").join(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn operations() -> &'static Vec<Value> {
    static OPERATIONS: std::sync::OnceLock<Vec<Value>> = std::sync::OnceLock::new();
    OPERATIONS.get_or_init(|| {
        let text =
            std::fs::read_to_string(fixtures().join("openapi/operations-summary.deref.json"))
                .unwrap();
        serde_json::from_str(&text).unwrap()
    })
}

/// An operation of the OpenAPI subset, by `operationId`.
pub fn operation(id: &str) -> &'static Value {
    operations()
        .iter()
        .find(|o| o["operationId"] == id)
        .unwrap_or_else(|| panic!("no operation {id} in the fixtures"))
}

/// Checks `value` against a (dereferenced) OpenAPI schema: types, required
/// keys, no unknown keys where properties are listed, nullability, enums,
/// array items; recursively.
pub fn validate(value: &Value, schema: &Value, at: &str) -> Result<(), String> {
    if value.is_null() {
        return if schema["nullable"] == true || schema.get("type").is_none() {
            Ok(())
        } else {
            Err(format!("{at}: null where {} is required", schema["type"]))
        };
    }
    if let Some(options) = schema["enum"].as_array() {
        if !options.contains(value) {
            return Err(format!("{at}: {value} is not one of {options:?}"));
        }
    }
    let ok = match schema["type"].as_str() {
        None => true,
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        Some("array") => value.is_array(),
        Some("object") => value.is_object(),
        Some(_) => true,
    };
    if !ok {
        return Err(format!("{at}: {value} is not a {}", schema["type"]));
    }
    if let Some(items) = value.as_array() {
        if let Some(min) = schema["minItems"].as_u64() {
            if (items.len() as u64) < min {
                return Err(format!("{at}: fewer than {min} items"));
            }
        }
        for (i, item) in items.iter().enumerate() {
            validate(item, &schema["items"], &format!("{at}[{i}]"))?;
        }
    }
    if let Some(object) = value.as_object() {
        for required in schema["required"].as_array().into_iter().flatten() {
            let key = required.as_str().unwrap_or_default();
            if !object.contains_key(key) {
                return Err(format!("{at}: missing {key}"));
            }
        }
        if let Some(properties) = schema["properties"].as_object() {
            for (key, item) in object {
                match properties.get(key) {
                    Some(property) => validate(item, property, &format!("{at}.{key}"))?,
                    None if schema["additionalProperties"] == false
                        || !properties.is_empty() && at.ends_with("request") =>
                    {
                        return Err(format!("{at}: unknown property {key}"))
                    }
                    None => {}
                }
            }
        }
    }
    Ok(())
}

/// The request body schema of an operation.
pub fn request_schema(id: &str) -> Value {
    let body = &operation(id)["requestBody"];
    body.get("schema").cloned().unwrap_or_else(|| body.clone())
}

fn response_schema(id: &str, status: StatusCode) -> Option<Value> {
    operation(id)["responses"][status.as_str()]
        .get("schema")
        .cloned()
}

#[derive(Debug, Clone)]
pub struct FakeRunner {
    pub name: String,
    pub labels: Vec<String>,
    /// The job GitHub gave it.
    pub job: Option<u64>,
    /// Since when its `busy` flag shows the job (the flag lags).
    pub busy_shown_from: Option<Instant>,
}

#[derive(Debug, Clone)]
pub struct FakeJob {
    pub id: u64,
    pub status: String,
    pub conclusion: Option<String>,
    pub runner_name: Option<String>,
    pub labels: Vec<String>,
    /// `owner/name` and workflow run its webhooks carry (the fixture's
    /// when `None`).
    pub repository: Option<String>,
    pub run_id: Option<u64>,
}

/// A workflow run as `GET /repos/{owner}/{repo}/actions/runs/{id}` shows it.
#[derive(Debug, Clone)]
pub struct FakeRun {
    pub repository: String,
    pub event: String,
    /// Its head repository is a fork of `repository`.
    pub fork: bool,
}

#[derive(Debug, Clone)]
pub struct FakeDelivery {
    pub id: u64,
    pub guid: String,
    pub delivered_at: String,
    pub redelivery: bool,
    /// runway's answer; 0 when it gave none (down, timed out).
    pub status_code: u16,
    pub event: String,
    pub action: String,
    pub body: Vec<u8>,
}

impl FakeDelivery {
    /// GitHub's `status`: `OK` for a 2xx or 3xx answer.
    fn status(&self) -> String {
        match self.status_code {
            0 => "timed out".to_owned(),
            200..=399 => "OK".to_owned(),
            code => format!("Invalid HTTP Response: {code}"),
        }
    }
}

pub enum Auth {
    Token,
    App {
        app_id: u64,
        public_pem: Vec<u8>,
        installation_id: u64,
    },
}

pub struct Fake {
    /// `METHOD /path` of every call, in order.
    pub calls: Vec<String>,
    /// Every call with when it came (since the epoch) and the token it
    /// presented: who made it, where callers hold different tokens.
    pub callers: Vec<(std::time::SystemTime, String, String)>,
    /// Tokens accepted besides [`TOKEN`] (with `Auth::Token`).
    pub also_accepted: Vec<String>,
    /// What GitHub's rate limit has left.
    pub remaining: u32,
    pub runners: BTreeMap<u64, FakeRunner>,
    pub jobs: BTreeMap<u64, FakeJob>,
    pub runs: BTreeMap<u64, FakeRun>,
    /// Answer workflow-run lookups with this status instead (GitHub down).
    pub refuse_runs: Option<StatusCode>,
    /// Every runner group's `visibility` and `allows_public_repositories`.
    pub runner_group: (String, bool),
    pub deliveries: Vec<FakeDelivery>,
    /// Requests or answers that do not match the OpenAPI schemas.
    pub invalid: Vec<String>,
    /// How long a runner's `busy` flag lags its job.
    pub busy_lag: Duration,
    /// Where webhooks go: runway's `/webhooks/github`.
    pub webhook_url: Option<String>,
    pub auth: Auth,
    pub installation_tokens: Vec<String>,
    /// The next this many requests hit a secondary rate limit (403, no
    /// Retry-After, as GitHub documents it can answer).
    pub secondary_limited: u32,
    /// Refuse JIT configurations with this status (a missing permission).
    pub refuse_jit: Option<StatusCode>,
    /// Bad weather for runner deletes: each DELETE of a runner takes the
    /// first status left here and answers it, with no effect (a 5xx burst;
    /// a 429 carries `Retry-After: 1`).
    pub delete_faults: std::collections::VecDeque<StatusCode>,
    /// Accept redelivery requests but hold the redeliveries until
    /// `FakeGithub::release_redeliveries`.
    pub hold_redeliveries: bool,
    held: Vec<(String, String, Vec<u8>)>,
    /// How long the installation tokens it mints live (GitHub: an hour).
    pub token_lifetime: Duration,
    /// How often the runner downloads were listed.
    pub downloads_listed: u32,
    /// What `GET /_releases/actions-runner-linux-ARCH.tar.gz` serves (the
    /// runner's release download, listed by `…/actions/runners/downloads`).
    pub runner_tarball: Option<Vec<u8>>,
    /// Its own address, for the download URLs it lists.
    pub base_url: String,
    next_runner: u64,
    next_delivery: u64,
}

pub type Shared = Arc<Mutex<Fake>>;

pub struct FakeGithub {
    pub url: String,
    pub state: Shared,
}

fn now_rfc3339(offset: Duration) -> String {
    let at = time::OffsetDateTime::now_utc() + offset;
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

impl FakeGithub {
    pub async fn start(remaining: u32, auth: Auth) -> FakeGithub {
        let state: Shared = Arc::new(Mutex::new(Fake {
            calls: Vec::new(),
            callers: Vec::new(),
            also_accepted: Vec::new(),
            remaining,
            runners: BTreeMap::new(),
            jobs: BTreeMap::new(),
            runs: BTreeMap::new(),
            refuse_runs: None,
            runner_group: ("selected".into(), false),
            deliveries: Vec::new(),
            invalid: Vec::new(),
            busy_lag: Duration::from_secs(3600),
            webhook_url: None,
            auth,
            installation_tokens: Vec::new(),
            secondary_limited: 0,
            refuse_jit: None,
            delete_faults: std::collections::VecDeque::new(),
            token_lifetime: Duration::from_secs(3600),
            downloads_listed: 0,
            runner_tarball: None,
            base_url: String::new(),
            next_runner: 23,
            hold_redeliveries: false,
            held: Vec::new(),
            next_delivery: 1000,
        }));
        let router = Router::new().fallback(handle).with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        state.lock().unwrap().base_url = format!("http://{address}");
        FakeGithub {
            url: format!("http://{address}"),
            state,
        }
    }

    pub fn lock(&self) -> std::sync::MutexGuard<'_, Fake> {
        self.state.lock().unwrap()
    }

    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    pub fn calls_starting(&self, prefix: &str) -> usize {
        self.lock()
            .calls
            .iter()
            .filter(|c| c.starts_with(prefix))
            .count()
    }

    pub fn invalid(&self) -> Vec<String> {
        self.lock().invalid.clone()
    }

    /// A job GitHub queued, with labels.
    pub fn queue_job(&self, id: u64, labels: &[&str]) {
        self.lock().jobs.insert(
            id,
            FakeJob {
                id,
                status: "queued".into(),
                conclusion: None,
                runner_name: None,
                labels: labels.iter().map(|l| l.to_string()).collect(),
                repository: None,
                run_id: None,
            },
        );
    }

    /// A job GitHub queued for workflow run `run` of `repository`, whose
    /// run is looked up as `event`, from a fork or not.
    pub fn queue_run_job(
        &self,
        id: u64,
        labels: &[&str],
        repository: &str,
        run: u64,
        event: &str,
        fork: bool,
    ) {
        self.queue_job(id, labels);
        let mut fake = self.lock();
        if let Some(job) = fake.jobs.get_mut(&id) {
            job.repository = Some(repository.to_owned());
            job.run_id = Some(run);
        }
        fake.runs.insert(
            run,
            FakeRun {
                repository: repository.to_owned(),
                event: event.to_owned(),
                fork,
            },
        );
    }

    /// GitHub hands job `id` to the runner named `runner`.
    pub fn start_job(&self, id: u64, runner: &str) {
        let mut fake = self.lock();
        let lag = fake.busy_lag;
        if let Some(r) = fake.runners.values_mut().find(|r| r.name == runner) {
            r.job = Some(id);
            r.busy_shown_from = Some(Instant::now() + lag);
        }
        if let Some(job) = fake.jobs.get_mut(&id) {
            job.status = "in_progress".into();
            job.runner_name = Some(runner.to_owned());
        }
    }

    /// GitHub hands the oldest queued job to the runner named `runner`, if
    /// it is registered and has none: checked and done at once, as GitHub
    /// does (a runner removed meanwhile gets nothing). Returns the job.
    pub fn give_oldest_queued_job(&self, runner: &str) -> Option<u64> {
        let mut fake = self.lock();
        let job = fake
            .jobs
            .values()
            .find(|j| j.status == "queued")
            .map(|j| j.id)?;
        let lag = fake.busy_lag;
        let idle = fake
            .runners
            .values_mut()
            .find(|r| r.name == runner && r.job.is_none())?;
        idle.job = Some(job);
        idle.busy_shown_from = Some(Instant::now() + lag);
        let entry = fake.jobs.get_mut(&job)?;
        entry.status = "in_progress".into();
        entry.runner_name = Some(runner.to_owned());
        Some(job)
    }

    /// The job ends; an ephemeral runner then leaves GitHub by itself.
    pub fn complete_job(&self, id: u64, conclusion: &str) {
        let mut fake = self.lock();
        if let Some(job) = fake.jobs.get_mut(&id) {
            job.status = "completed".into();
            job.conclusion = Some(conclusion.to_owned());
        }
        fake.runners.retain(|_, r| r.job != Some(id));
    }

    pub fn runner_id(&self, name: &str) -> Option<u64> {
        self.lock()
            .runners
            .iter()
            .find(|(_, r)| r.name == name)
            .map(|(id, _)| *id)
    }

    /// The `workflow_job` webhook GitHub would send for job `id` now.
    pub fn webhook(&self, id: u64, action: &str) -> Vec<u8> {
        let fake = self.lock();
        let job = fake.jobs.get(&id).expect("a known job");
        let text =
            std::fs::read_to_string(fixtures().join("webhooks/workflow_job.in_progress.3.json"))
                .unwrap();
        let mut body: Value = serde_json::from_str(&text).unwrap();
        body["action"] = action.into();
        if let Some(repository) = &job.repository {
            body["repository"]["full_name"] = repository.clone().into();
            if let Some((owner, name)) = repository.split_once('/') {
                body["repository"]["name"] = name.into();
                body["repository"]["owner"]["login"] = owner.into();
            }
        }
        let w = &mut body["workflow_job"];
        if let Some(run) = job.run_id {
            w["run_id"] = run.into();
        }
        w["id"] = id.into();
        w["labels"] = json!(job.labels);
        w["status"] = action.into();
        w["conclusion"] = json!(if action == "completed" {
            job.conclusion.clone()
        } else {
            None
        });
        w["runner_name"] = json!(if action == "queued" {
            None
        } else {
            job.runner_name.clone()
        });
        serde_json::to_vec(&body).unwrap()
    }

    /// GitHub delivers (or, with `drop`, fails to deliver) job `id`'s
    /// `action` webhook. Returns runway's status (0 when dropped: no
    /// answer, as when runway is down).
    pub async fn deliver(&self, id: u64, action: &str, drop: bool) -> u16 {
        let body = self.webhook(id, action);
        let guid = format!("guid-{id}-{action}");
        self.send_delivery(guid, action.to_owned(), body, false, drop)
            .await
    }

    /// Makes the redeliveries held so far (`hold_redeliveries`).
    pub async fn release_redeliveries(&self) {
        let held = std::mem::take(&mut self.lock().held);
        for (guid, action, body) in held {
            send_delivery(&self.state, guid, action, body, true, false).await;
        }
    }

    /// `n` deliveries of `event` that runway answered with `status_code`
    /// (0: no answer), recorded as GitHub lists them, newest last.
    pub fn record_deliveries(&self, event: &str, n: usize, status_code: u16) {
        let mut fake = self.lock();
        for _ in 0..n {
            fake.next_delivery += 1;
            let id = fake.next_delivery;
            fake.deliveries.push(FakeDelivery {
                id,
                guid: format!("guid-{event}-{id}"),
                delivered_at: now_rfc3339(Duration::ZERO),
                redelivery: false,
                status_code,
                event: event.to_owned(),
                action: String::new(),
                body: b"{}".to_vec(),
            });
        }
    }

    async fn send_delivery(
        &self,
        guid: String,
        action: String,
        body: Vec<u8>,
        redelivery: bool,
        drop: bool,
    ) -> u16 {
        send_delivery(&self.state, guid, action, body, redelivery, drop).await
    }
}

async fn send_delivery(
    state: &Shared,
    guid: String,
    action: String,
    body: Vec<u8>,
    redelivery: bool,
    drop: bool,
) -> u16 {
    let url = state.lock().unwrap().webhook_url.clone();
    let status_code = match (drop, url) {
        (false, Some(url)) => {
            let signature = sign(HOOK_SECRET.as_bytes(), &body);
            match reqwest::Client::new()
                .post(url)
                .header("content-type", "application/json")
                .header("x-github-event", "workflow_job")
                .header("x-github-delivery", &guid)
                .header("x-hub-signature-256", signature)
                .body(body.clone())
                .send()
                .await
            {
                Ok(response) => response.status().as_u16(),
                Err(_) => 502,
            }
        }
        // A delivery that never reached runway: no answer at all.
        _ => 0,
    };
    let mut fake = state.lock().unwrap();
    fake.next_delivery += 1;
    let id = fake.next_delivery;
    fake.deliveries.push(FakeDelivery {
        id,
        guid,
        delivered_at: now_rfc3339(Duration::ZERO),
        redelivery,
        status_code,
        event: "workflow_job".to_owned(),
        action,
        body,
    });
    status_code
}

/// Answers with rate-limit headers, checking the body against the
/// operation's response schema.
fn answer(fake: &mut Fake, operation: &str, status: StatusCode, body: Value) -> Response {
    if let Some(schema) = response_schema(operation, status) {
        if let Err(problem) = validate(&body, &schema, &format!("{operation} response")) {
            fake.invalid.push(problem);
        }
    }
    reply(fake, status, body)
}

/// An answer with GitHub's rate-limit headers, for an operation the
/// fixtures' OpenAPI subset does not describe (its shape is GitHub's
/// documented one, checked by the caller's parser).
fn reply(fake: &mut Fake, status: StatusCode, body: Value) -> Response {
    fake.remaining = fake.remaining.saturating_sub(1);
    let mut headers = HeaderMap::new();
    headers.insert("x-ratelimit-limit", "5000".parse().unwrap());
    headers.insert(
        "x-ratelimit-remaining",
        fake.remaining.to_string().parse().unwrap(),
    );
    let reset = time::OffsetDateTime::now_utc().unix_timestamp() + 3600;
    headers.insert("x-ratelimit-reset", reset.to_string().parse().unwrap());
    if body.is_null() {
        (status, headers).into_response()
    } else {
        (status, headers, Json(body)).into_response()
    }
}

fn check_request(fake: &mut Fake, operation: &str, body: &Value) {
    if let Err(problem) = validate(
        body,
        &request_schema(operation),
        &format!("{operation} request"),
    ) {
        fake.invalid.push(problem);
    }
}

fn bearer(headers: &HeaderMap) -> String {
    headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
        .to_owned()
}

/// Whether the caller may call an installation (or token) endpoint.
fn authorised(fake: &Fake, headers: &HeaderMap) -> bool {
    let presented = bearer(headers);
    match &fake.auth {
        Auth::Token => presented == TOKEN || fake.also_accepted.contains(&presented),
        Auth::App { .. } => fake.installation_tokens.contains(&presented),
    }
}

/// Whether the caller presents a valid JWT of the App.
fn app_jwt_valid(fake: &Fake, headers: &HeaderMap) -> bool {
    let Auth::App {
        app_id, public_pem, ..
    } = &fake.auth
    else {
        return false;
    };
    let Ok(key) = jsonwebtoken::DecodingKey::from_rsa_pem(public_pem) else {
        return false;
    };
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
    validation.set_issuer(&[app_id.to_string()]);
    validation.set_required_spec_claims(&["exp", "iat", "iss"]);
    jsonwebtoken::decode::<Value>(&bearer(headers), &key, &validation).is_ok()
}

fn unauthorised(fake: &mut Fake, call: &str) -> Response {
    fake.invalid.push(format!("unauthorised: {call}"));
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({"message": "Bad credentials"})),
    )
        .into_response()
}

/// A fresh RSA key pair (PEM private, PEM public) from `openssl`, for App
/// authentication tests; `None` when openssl is not installed.
pub fn rsa_key_pair(dir: &std::path::Path) -> Option<(String, Vec<u8>)> {
    let private = dir.join("app.pem");
    let public = dir.join("app.pub.pem");
    let ok = std::process::Command::new("openssl")
        .args(["genrsa", "-out"])
        .arg(&private)
        .arg("2048")
        .stderr(std::process::Stdio::null())
        .status()
        .ok()?
        .success()
        && std::process::Command::new("openssl")
            .args(["rsa", "-pubout", "-in"])
            .arg(&private)
            .arg("-out")
            .arg(&public)
            .stderr(std::process::Stdio::null())
            .status()
            .ok()?
            .success();
    ok.then(|| {
        (
            std::fs::read_to_string(&private).unwrap(),
            std::fs::read(&public).unwrap(),
        )
    })
}

/// `X-Hub-Signature-256` of `body` under `secret`, as GitHub computes it
/// (HMAC-SHA256, hex): written here, apart from the checker in runway.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    use hmac::Mac as _;
    let mut mac =
        hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}
