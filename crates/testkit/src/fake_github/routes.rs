//! The fake GitHub's routes: every REST call runway makes, answered in
//! the shape of GitHub's examples and checked against its schema.

use super::*;

pub(super) async fn handle(
    State(state): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    let query = uri.query().unwrap_or_default().to_owned();
    let json_body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let call = format!("{method} {path}");
    // The target's prefix (orgs/X or repos/O/N) and the rest.
    let (scope, rest): (&str, &[&str]) = match segments.as_slice() {
        ["orgs", _, rest @ ..] => ("org", rest),
        ["repos", _, _, rest @ ..] => ("repo", rest),
        ["app", rest @ ..] => ("app", rest),
        _ => ("", &[]),
    };
    let mut redeliver: Option<(String, String, Vec<u8>)> = None;
    if let ["_releases", _] = segments.as_slice() {
        // A release download: public, no token.
        return match state.lock().unwrap().runner_tarball.clone() {
            Some(bytes) => (StatusCode::OK, bytes).into_response(),
            None => StatusCode::NOT_FOUND.into_response(),
        };
    }
    let response = {
        let mut fake = state.lock().unwrap();
        fake.calls.push(call.clone());
        fake.callers
            .push((std::time::SystemTime::now(), call.clone(), bearer(&headers)));
        // Installation tokens: the App's JWT mints them.
        if method == Method::POST
            && scope == "app"
            && matches!(rest, ["installations", _, "access_tokens"])
        {
            if !app_jwt_valid(&fake, &headers) {
                return unauthorised(&mut fake, &call);
            }
            let token = format!("ghs_fake{}", fake.installation_tokens.len() + 1);
            fake.installation_tokens.push(token.clone());
            return (
                StatusCode::CREATED,
                Json(json!({"token": token, "expires_at": now_rfc3339(fake.token_lifetime)})),
            )
                .into_response();
        }
        let app_endpoint = scope == "app";
        let allowed = if app_endpoint {
            app_jwt_valid(&fake, &headers)
        } else {
            authorised(&fake, &headers)
        };
        if !allowed {
            return unauthorised(&mut fake, &call);
        }
        if fake.secondary_limited > 0 {
            fake.secondary_limited -= 1;
            return (
                StatusCode::FORBIDDEN,
                Json(json!({
                    "message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again.",
                    "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"
                })),
            )
                .into_response();
        }
        match (method.clone(), rest) {
            (Method::POST, ["actions", "runners", "generate-jitconfig"]) => {
                let operation = format!("actions/generate-runner-jitconfig-for-{scope}");
                check_request(&mut fake, &operation, &json_body);
                if let Some(status) = fake.refuse_jit {
                    return answer(
                        &mut fake,
                        &operation,
                        status,
                        json!({"message": "Resource not accessible by personal access token", "documentation_url": "https://docs.github.com/rest"}),
                    );
                }
                let mut answer_body = example(&format!(
                    "actions__generate-runner-jitconfig-for-{scope}.201.default.json"
                ));
                let id = fake.next_runner;
                fake.next_runner += 1;
                let name = json_body["name"].as_str().unwrap_or_default().to_owned();
                answer_body["runner"]["id"] = id.into();
                answer_body["runner"]["name"] = name.clone().into();
                answer_body["encoded_jit_config"] = encoded_jit(id, &name).into();
                let labels = json_body["labels"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|l| l.as_str().map(str::to_owned))
                    .collect();
                fake.runners.insert(
                    id,
                    FakeRunner {
                        name,
                        labels,
                        job: None,
                        busy_shown_from: None,
                    },
                );
                answer(&mut fake, &operation, StatusCode::CREATED, answer_body)
            }
            (Method::GET, ["actions", "runners", "downloads"]) => {
                fake.downloads_listed += 1;
                // GitHub's shape; the downloads point at this fake.
                let body = Value::Array(
                    ["x64", "arm64"]
                        .iter()
                        .map(|arch| {
                            let file = format!("actions-runner-linux-{arch}-2.330.0.tar.gz");
                            json!({
                                "os": "linux",
                                "architecture": arch,
                                "download_url": format!("{}/_releases/{file}", fake.base_url),
                                "filename": file,
                            })
                        })
                        .collect(),
                );
                reply(&mut fake, StatusCode::OK, body)
            }
            (Method::GET, ["actions", "runners"]) => {
                // `?name=NAME`: the runners registered under that name.
                let name: Option<String> = url::form_urlencoded::parse(query.as_bytes())
                    .find(|(key, _)| key == "name")
                    .map(|(_, value)| value.into_owned());
                let runners: Vec<Value> = fake
                    .runners
                    .iter()
                    .filter(|(_, r)| name.as_deref().is_none_or(|n| n == r.name))
                    .map(|(id, r)| {
                        json!({
                            "id": id,
                            "name": r.name,
                            "os": "linux",
                            "status": "online",
                            "busy": r.job.is_some(),
                            "labels": [],
                        })
                    })
                    .collect();
                reply(
                    &mut fake,
                    StatusCode::OK,
                    json!({"total_count": runners.len(), "runners": runners}),
                )
            }
            (Method::DELETE, ["actions", "runners", id]) => {
                let operation = format!("actions/delete-self-hosted-runner-from-{scope}");
                if let Some(fault) = fake.delete_faults.pop_front() {
                    let mut response = reply(
                        &mut fake,
                        fault,
                        json!({"message": "Server Error", "documentation_url": "https://docs.github.com/rest"}),
                    );
                    if fault == StatusCode::TOO_MANY_REQUESTS {
                        response
                            .headers_mut()
                            .insert("retry-after", "1".parse().unwrap());
                    }
                    return response;
                }
                let id: u64 = id.parse().unwrap_or(0);
                // The truth, not the lagging flag, decides.
                let (status, body) = match fake.runners.get(&id) {
                    Some(runner) if runner.job.is_some() => (
                        StatusCode::UNPROCESSABLE_ENTITY,
                        json!({"message": format!("Bad request - Runner \"{}\" is still running a job\"", runner.name), "documentation_url": "https://docs.github.com/rest"}),
                    ),
                    Some(_) => {
                        fake.runners.remove(&id);
                        (StatusCode::NO_CONTENT, Value::Null)
                    }
                    None => (
                        StatusCode::NOT_FOUND,
                        json!({"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}),
                    ),
                };
                answer(&mut fake, &operation, status, body)
            }
            (Method::GET, ["actions", "runners", id]) => {
                let operation = format!("actions/get-self-hosted-runner-for-{scope}");
                let id: u64 = id.parse().unwrap_or(0);
                match fake.runners.get(&id).cloned() {
                    Some(runner) => {
                        let mut body = example(&format!(
                            "actions__get-self-hosted-runner-for-{scope}.200.default.json"
                        ));
                        body["id"] = id.into();
                        body["name"] = runner.name.into();
                        body["busy"] = runner
                            .busy_shown_from
                            .is_some_and(|from| Instant::now() >= from)
                            .into();
                        answer(&mut fake, &operation, StatusCode::OK, body)
                    }
                    None => answer(
                        &mut fake,
                        &operation,
                        StatusCode::NOT_FOUND,
                        json!({"message": "Not Found"}),
                    ),
                }
            }
            (Method::GET, ["actions", "runner-groups", id]) if scope == "org" => {
                // Shaped as GitHub documents `runner-groups-org` (the
                // fixtures' OpenAPI subset lacks it).
                let id: u64 = id.parse().unwrap_or(0);
                let (visibility, public) = fake.runner_group.clone();
                let org = segments.get(1).copied().unwrap_or_default();
                let body = json!({
                    "id": id,
                    "name": if id == 1 { "Default" } else { "ci" },
                    "visibility": visibility,
                    "default": id == 1,
                    "runners_url": format!("https://api.github.com/orgs/{org}/actions/runner-groups/{id}/runners"),
                    "inherited": false,
                    "allows_public_repositories": public,
                    "restricted_to_workflows": false,
                    "selected_workflows": [],
                    "workflow_restrictions_read_only": false,
                });
                reply(&mut fake, StatusCode::OK, body)
            }
            (Method::GET, ["actions", "runs", id]) => {
                let operation = "actions/get-workflow-run";
                let id: u64 = id.parse().unwrap_or(0);
                let repository = segments.get(1..3).map(|s| s.join("/")).unwrap_or_default();
                if let Some(status) = fake.refuse_runs {
                    return reply(&mut fake, status, json!({"message": "Server Error"}));
                }
                match fake
                    .runs
                    .get(&id)
                    .cloned()
                    .filter(|r| r.repository == repository)
                {
                    Some(run) => {
                        let mut body = example("actions__get-workflow-run.200.default.json");
                        body["id"] = id.into();
                        body["event"] = run.event.clone().into();
                        body["repository"]["full_name"] = run.repository.clone().into();
                        let own = body["repository"].clone();
                        body["head_repository"] = if run.fork {
                            let mut fork = own.clone();
                            fork["id"] = (own["id"].as_u64().unwrap_or(1) + 1_000_000).into();
                            fork["full_name"] =
                                format!("someone/{}", own["name"].as_str().unwrap_or("fork"))
                                    .into();
                            fork["fork"] = true.into();
                            fork
                        } else {
                            own
                        };
                        answer(&mut fake, operation, StatusCode::OK, body)
                    }
                    None => answer(
                        &mut fake,
                        operation,
                        StatusCode::NOT_FOUND,
                        json!({"message": "Not Found", "documentation_url": "https://docs.github.com/rest"}),
                    ),
                }
            }
            (Method::GET, ["actions", "jobs", id]) => {
                let operation = "actions/get-job-for-workflow-run";
                let id: u64 = id.parse().unwrap_or(0);
                match fake.jobs.get(&id).cloned() {
                    Some(job) => {
                        let mut body =
                            example("actions__get-job-for-workflow-run.200.default.json");
                        body["id"] = id.into();
                        body["status"] = job.status.clone().into();
                        body["conclusion"] = json!(job.conclusion);
                        body["runner_name"] = json!(job.runner_name);
                        body["labels"] = json!(job.labels);
                        // GitHub's example lacks this required field.
                        body["created_at"] = "2019-08-08T08:00:00Z".into();
                        if job.status == "queued" {
                            body["completed_at"] = Value::Null;
                            body["runner_id"] = Value::Null;
                            body["runner_group_id"] = Value::Null;
                            body["runner_group_name"] = Value::Null;
                        }
                        answer(&mut fake, operation, StatusCode::OK, body)
                    }
                    None => answer(
                        &mut fake,
                        operation,
                        StatusCode::NOT_FOUND,
                        json!({"message": "Not Found"}),
                    ),
                }
            }
            (Method::GET, [.., "deliveries"]) => {
                let operation = match scope {
                    "app" => "apps/list-webhook-deliveries",
                    "org" => "orgs/list-webhook-deliveries",
                    _ => "repos/list-webhook-deliveries",
                };
                // As documented: `failure` is a status code of 400–599.
                let failures_only = query.contains("status=failure");
                // Newest first, two per page, so callers must follow the
                // Link header.
                let all: Vec<FakeDelivery> = fake
                    .deliveries
                    .iter()
                    .rev()
                    .filter(|d| !failures_only || (400..=599).contains(&d.status_code))
                    .cloned()
                    .collect();
                let start: usize = query
                    .split('&')
                    .find_map(|p| p.strip_prefix("cursor=v1_"))
                    .and_then(|c| c.parse().ok())
                    .unwrap_or(0);
                let page: Vec<Value> = all
                    .iter()
                    .skip(start)
                    .take(2)
                    .map(|d| {
                        json!({
                            "id": d.id, "guid": d.guid, "delivered_at": d.delivered_at,
                            "redelivery": d.redelivery, "duration": 0.1,
                            "status": d.status(),
                            "status_code": d.status_code, "event": d.event,
                            "action": d.action, "installation_id": 123,
                            "repository_id": 456, "throttled_at": null,
                        })
                    })
                    .collect();
                let mut response = answer(&mut fake, operation, StatusCode::OK, Value::Array(page));
                if start + 2 < all.len() {
                    let link = format!(
                        "<http://fake{path}?per_page=2&cursor=v1_{}>; rel=\"next\"",
                        start + 2
                    );
                    response.headers_mut().insert("link", link.parse().unwrap());
                }
                response
            }
            (Method::POST, [.., "deliveries", id, "attempts"]) => {
                let operation = match scope {
                    "app" => "apps/redeliver-webhook-delivery",
                    "org" => "orgs/redeliver-webhook-delivery",
                    _ => "repos/redeliver-webhook-delivery",
                };
                let id: u64 = id.parse().unwrap_or(0);
                match fake.deliveries.iter().find(|d| d.id == id).cloned() {
                    Some(original) => {
                        let again = (original.guid, original.action, original.body);
                        if fake.hold_redeliveries {
                            fake.held.push(again);
                        } else {
                            redeliver = Some(again);
                        }
                        answer(&mut fake, operation, StatusCode::ACCEPTED, json!({}))
                    }
                    None => answer(
                        &mut fake,
                        operation,
                        StatusCode::NOT_FOUND,
                        json!({"message": "Not Found"}),
                    ),
                }
            }
            _ => (StatusCode::NOT_FOUND, Json(json!({"message": "Not Found"}))).into_response(),
        }
    };
    if let Some((guid, action, body)) = redeliver {
        // GitHub redelivers shortly after it accepted the request.
        let state = state.clone();
        tokio::spawn(async move {
            send_delivery(&state, guid, action, body, true, false).await;
        });
    }
    response
}
