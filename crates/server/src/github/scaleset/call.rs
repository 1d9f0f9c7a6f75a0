//! One call to the scale-set service: its credentials (the admin token,
//! refreshed), GitHub's refusals and rate limits, and reading the answer.

use super::*;

/// How long a rate limit with no `Retry-After` and no reset time holds
/// the calls back: GitHub's documentation says to wait at least a minute.
pub(super) const RATE_LIMIT_WAIT: Duration = Duration::from_secs(60);

/// How long GitHub asks the client to wait, if the answer is a rate
/// limit: `Retry-After` (seconds), else the reset time of a spent primary
/// limit, else [`RATE_LIMIT_WAIT`]; `None` for any other answer (a 403 that
/// is not a rate limit is a refusal, never a reason to refresh a token).
pub(super) fn rate_limit_wait(
    status: StatusCode,
    headers: &reqwest::header::HeaderMap,
    body: &Value,
    now: Timestamp,
) -> Option<Duration> {
    let number =
        |name: &str| -> Option<u64> { headers.get(name)?.to_str().ok()?.trim().parse().ok() };
    let retry_after = number("retry-after").map(Duration::from_secs);
    let spent = number("x-ratelimit-remaining") == Some(0);
    let says_so = body["message"]
        .as_str()
        .is_some_and(|m| m.to_lowercase().contains("rate limit"));
    let limited = status == StatusCode::TOO_MANY_REQUESTS
        || (status == StatusCode::FORBIDDEN && (retry_after.is_some() || spent || says_so));
    if !limited {
        return None;
    }
    let reset = number("x-ratelimit-reset")
        .filter(|_| spent)
        .map(|at| Timestamp::from_millis(at as i64 * 1000).since(now));
    Some(retry_after.or(reset).unwrap_or(RATE_LIMIT_WAIT))
}

/// The `exp` of a JWT, if it has one (the signature is the service's
/// business, not runway's).
pub(super) fn jwt_expiry(token: &str) -> Option<Timestamp> {
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: Value = serde_json::from_slice(&bytes).ok()?;
    claims["exp"]
        .as_i64()
        .map(|s| Timestamp::from_millis(s * 1000))
}

/// The service's message for a refusal: `message`, else GitHub's `typeName`.
pub(super) fn refusal(operation: &'static str, status: StatusCode, body: &Value) -> GithubError {
    let message = body["message"]
        .as_str()
        .or(body["typeName"].as_str())
        .unwrap_or("no message");
    GithubError::Status {
        operation,
        status: status.as_u16(),
        message: message.chars().take(300).collect(),
    }
}

/// The HTTP status of a refusal, if the error is one.
pub fn status_of(error: &GithubError) -> Option<u16> {
    match error {
        GithubError::Status { status, .. } => Some(*status),
        _ => None,
    }
}

pub(super) fn transport(operation: &'static str, error: reqwest::Error) -> GithubError {
    GithubError::Transport {
        operation,
        message: error.without_url().to_string(),
    }
}

/// A request's answer: status and JSON body (`Null` when not JSON).
pub(super) struct Answer {
    pub(super) operation: &'static str,
    pub(super) status: StatusCode,
    pub(super) body: Value,
}

impl Answer {
    /// The answer if its status is one of `ok`, the service's refusal
    /// otherwise.
    pub(super) fn expect(self, ok: &[StatusCode]) -> Result<Answer, GithubError> {
        if ok.contains(&self.status) {
            Ok(self)
        } else {
            Err(refusal(self.operation, self.status, &self.body))
        }
    }

    /// An answer with the right status and the wrong shape.
    pub(super) fn malformed(&self, message: &str) -> GithubError {
        GithubError::Status {
            operation: self.operation,
            status: self.status.as_u16(),
            message: message.to_owned(),
        }
    }
}

/// One request, as [`ScaleSetClient::send`] takes it: to the Actions
/// service (`path` from its URL on), to a session's message queue, or for
/// the admin connection.
pub(super) struct Call {
    pub(super) operation: &'static str,
    pub(super) method: Method,
    /// From the service URL on.
    pub(super) path: String,
    pub(super) query: Vec<(&'static str, String)>,
    pub(super) headers: Vec<(&'static str, String)>,
    pub(super) body: Option<Value>,
    /// The Actions service's `api-version` query (not on the message
    /// queue's URL nor the admin connection, as GitHub's Go client sends them).
    pub(super) api_version: bool,
    /// Instead of the HTTP client's own (a long poll is held longer).
    pub(super) timeout: Option<Duration>,
}

/// How a request authenticates.
pub(super) enum Auth<'a> {
    /// The admin token, or a session's queue token.
    Bearer(&'a Secret),
    /// A runner registration token, for the admin connection.
    RemoteAuth(&'a Secret),
}

impl Call {
    pub(super) fn new(operation: &'static str, method: Method, path: String) -> Call {
        Call {
            operation,
            method,
            path,
            query: Vec::new(),
            headers: Vec::new(),
            body: None,
            api_version: true,
            timeout: None,
        }
    }

    /// A call outside the Actions service's versioned API.
    pub(super) fn unversioned(mut self) -> Call {
        self.api_version = false;
        self
    }

    pub(super) fn header(mut self, name: &'static str, value: String) -> Call {
        self.headers.push((name, value));
        self
    }

    pub(super) fn timeout(mut self, timeout: Duration) -> Call {
        self.timeout = Some(timeout);
        self
    }

    pub(super) fn query(mut self, key: &'static str, value: String) -> Call {
        self.query.push((key, value));
        self
    }

    pub(super) fn body(mut self, body: Value) -> Call {
        self.body = Some(body);
        self
    }
}

pub(super) const OK: &[StatusCode] = &[StatusCode::OK];

pub(super) const OK_OR_CREATED: &[StatusCode] = &[StatusCode::OK, StatusCode::CREATED];

/// A delete's answers that mean "gone": done now, or already.
pub(super) const GONE: &[StatusCode] = &[
    StatusCode::OK,
    StatusCode::NO_CONTENT,
    StatusCode::NOT_FOUND,
];

impl Answer {
    pub(super) fn scale_set(&self, value: &Value) -> Result<ScaleSet, GithubError> {
        match (value["id"].as_i64(), value["name"].as_str()) {
            (Some(id), Some(name)) => Ok(ScaleSet {
                id,
                name: name.to_owned(),
                runner_group_id: value["runnerGroupId"].as_i64().unwrap_or_default(),
                labels: value["labels"]
                    .as_array()
                    .map(|labels| {
                        labels
                            .iter()
                            .filter_map(|l| l["name"].as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default(),
            }),
            _ => Err(self.malformed("the answer has no scale set id or name")),
        }
    }

    pub(super) fn session(&self, scale_set_id: i64) -> Result<Session, GithubError> {
        let value = &self.body;
        match (
            value["sessionId"].as_str(),
            value["messageQueueUrl"].as_str(),
            value["messageQueueAccessToken"].as_str(),
        ) {
            (Some(id), Some(url), Some(token)) => Ok(Session {
                id: id.to_owned(),
                scale_set_id,
                queue_url: url.to_owned(),
                queue_token: Secret::literal(token),
                statistics: serde_json::from_value(value["statistics"].clone()).ok(),
            }),
            _ => Err(self.malformed("the answer has no session id, queue URL or queue token")),
        }
    }
}

impl ScaleSetClient {
    pub(super) fn count_refresh(&self, metrics: &Metrics, kind: &'static str) {
        metrics
            .scale_set_token_refreshes
            .get_or_create(&PoolKindLabels {
                pool: self.pool.clone(),
                kind,
            })
            .inc();
    }

    /// The service URL and admin token, fetched (again) when there is none
    /// or it is about to expire.
    pub(super) async fn admin(&self, metrics: &Metrics) -> Result<(String, Secret), GithubError> {
        let mut admin = self.admin.lock().await;
        let now = crate::clock::now();
        if let Some(current) = admin.as_ref() {
            if current
                .expires_at
                .is_none_or(|at| now.plus(ADMIN_REFRESH_MARGIN) < at)
            {
                return Ok((current.url.clone(), current.token.clone()));
            }
        }
        let fresh = admin.is_none();
        let registration = self
            .github
            .registration_token(metrics, &self.target)
            .await?;
        let call = Call::new(
            "scale_set_admin_connection",
            Method::POST,
            "actions/runner-registration".into(),
        )
        .unversioned()
        .body(json!({"url": self.config_url, "runner_event": "register"}));
        let url = format!("{}/{}", self.github.api_url(), call.path);
        let answer = self
            .send(metrics, &call, &url, Auth::RemoteAuth(&registration))
            .await?;
        if !answer.status.is_success() {
            return Err(refusal(answer.operation, answer.status, &answer.body));
        }
        let (Some(url), Some(token)) = (answer.body["url"].as_str(), answer.body["token"].as_str())
        else {
            return Err(answer.malformed("the answer has no url or token"));
        };
        let url = format!("{}/", url.trim_end_matches('/'));
        let token = Secret::literal(token);
        if !fresh {
            self.count_refresh(metrics, "admin");
        }
        *admin = Some(Admin {
            url: url.clone(),
            token: token.clone(),
            expires_at: jwt_expiry(token.expose()),
        });
        Ok((url, token))
    }

    /// One request to the Actions service with the admin token; a 401
    /// (the token expired or was revoked early) fetches a new one and tries
    /// once more.
    pub(super) async fn service(
        &self,
        metrics: &Metrics,
        call: Call,
    ) -> Result<Answer, GithubError> {
        for attempt in 0..2 {
            let (url, token) = self.admin(metrics).await?;
            let answer = self
                .send(
                    metrics,
                    &call,
                    &format!("{url}{}", call.path),
                    Auth::Bearer(&token),
                )
                .await?;
            if answer.status == StatusCode::UNAUTHORIZED && attempt == 0 {
                // Revoked or expired early: a new one.
                *self.admin.lock().await = None;
                self.count_refresh(metrics, "admin");
                continue;
            }
            return Ok(answer);
        }
        unreachable!("the loop returns on its second attempt")
    }

    pub(super) async fn send(
        &self,
        metrics: &Metrics,
        call: &Call,
        url: &str,
        auth: Auth<'_>,
    ) -> Result<Answer, GithubError> {
        let operation = call.operation;
        let now = crate::clock::now();
        if let Some(until) = self.hold.lock().ok().and_then(|hold| *hold) {
            if now < until {
                // Rate-limited: not sent, so the limit is not extended.
                return Err(GithubError::Budget {
                    operation,
                    retry_at: until,
                });
            }
        }
        let authorization = match auth {
            Auth::Bearer(token) => format!("Bearer {}", token.expose()),
            Auth::RemoteAuth(token) => format!("RemoteAuth {}", token.expose()),
        };
        let mut request = self
            .github
            .http()
            .request(call.method.clone(), url)
            .query(&call.query)
            .header("authorization", authorization);
        if call.api_version {
            request = request.query(&[("api-version", API_VERSION)]);
        }
        for (name, value) in &call.headers {
            request = request.header(*name, value);
        }
        if let Some(timeout) = call.timeout {
            request = request.timeout(timeout);
        }
        if let Some(body) = &call.body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|error| {
            metrics.github_request(operation, "error");
            transport(operation, error)
        })?;
        let status = response.status();
        metrics.github_request(operation, status.as_str());
        let headers = response.headers().clone();
        let text = response.text().await.unwrap_or_default();
        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
        let now = crate::clock::now();
        if let Some(wait) = rate_limit_wait(status, &headers, &body, now) {
            // Jittered up to a fifth longer, so the pools' clients do not
            // all come back in the same second.
            let wait = wait.mul_f64(1.0 + rand::random::<f64>() * 0.2);
            let until = now.plus(wait);
            if let Ok(mut hold) = self.hold.lock() {
                *hold = Some(hold.map_or(until, |held| held.max(until)));
            }
            metrics
                .scale_set_refusals
                .get_or_create(&PoolKindLabels {
                    pool: self.pool.clone(),
                    kind: "rate_limited",
                })
                .inc();
            tracing::warn!(pool = %self.pool, operation, status = status.as_u16(), wait_ms = wait.as_millis() as u64, "GitHub rate-limited the scale set's calls; none before the wait is over");
            return Err(GithubError::Budget {
                operation,
                retry_at: until,
            });
        }
        if status.is_client_error() || status.is_server_error() {
            let kind = match status.as_u16() {
                401 => "unauthorized",
                403 => "forbidden",
                404 => "not_found",
                409 => "conflict",
                code if code >= 500 => "server_error",
                _ => "other",
            };
            metrics
                .scale_set_refusals
                .get_or_create(&PoolKindLabels {
                    pool: self.pool.clone(),
                    kind,
                })
                .inc();
        }
        Ok(Answer {
            operation,
            status,
            body,
        })
    }
}
