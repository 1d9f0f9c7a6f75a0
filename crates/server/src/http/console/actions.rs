//! The forms that change something (cancel, retry, drain, pause, bulk actions)
//! and where they send the browser after.

use super::*;

#[derive(Deserialize, Default)]
pub(super) struct ActionForm {
    #[serde(default)]
    pub(super) csrf: String,
    #[serde(default)]
    pub(super) force: Option<String>,
    /// The console page to return to (the jobs list an action was made
    /// from); only a console path is followed.
    #[serde(default)]
    pub(super) back: Option<String>,
}

/// `back` if it is a path of the console's own (no other site, no
/// scheme-relative `//host`), else `default`.
pub(super) fn back_to(back: Option<&str>, default: &str) -> String {
    match back {
        Some(path)
            if path.starts_with("/console/") && !path.contains("//") && !path.contains('\\') =>
        {
            path.to_owned()
        }
        _ => default.to_owned(),
    }
}

/// Where an action goes once done (`Ok`: the page to show), or its
/// refusal as a page that says why, with a link `back`.
pub(super) fn after_action(done: Result<String, crate::app::AppError>, back: &str) -> Response {
    match done {
        Ok(to) => Redirect::to(&to).into_response(),
        Err(error) => {
            let api: crate::http::error::ApiError = error.into();
            (
                api.status,
                Html(format!(
                    "<!doctype html><title>Not done</title><p role=\"alert\">{}</p><p><a href=\"{back}\">Back</a></p>",
                    minijinja::HtmlEscape(&api.message)
                )),
            )
                .into_response()
        }
    }
}

/// A 404 page: `what` is missing, with a link back to `back` (`label`).
pub(super) fn not_found(what: &str, back: &str, label: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        Html(format!(
            "<!doctype html><p>{}</p><p><a href=\"{back}\">{label}</a></p>",
            minijinja::HtmlEscape(what)
        )),
    )
        .into_response()
}

pub(super) fn no_such_action() -> Response {
    (StatusCode::NOT_FOUND, "no such action\n").into_response()
}

pub(super) async fn job_action(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Path((id, action)): Path<(i64, String)>,
    Form(form): Form<ActionForm>,
) -> Result<Response, Response> {
    let session = writer(&service, &headers, &form).await?;
    crate::http::auth::require_job(&service, &session.caller, JobId(id))
        .await
        .map_err(scope_refusal)?;
    let actor = &session.caller.name;
    let done = match action.as_str() {
        "cancel" => admin::cancel_job(&service, actor, JobId(id), None).await,
        "retry" => admin::retry_job(&service, actor, JobId(id)).await,
        _ => return Err(no_such_action()),
    };
    // Back to the list it was made from, else to the job (a retry: the
    // new job).
    let shown = done.map(|job| match &form.back {
        Some(_) => back_to(form.back.as_deref(), "/console/jobs"),
        None => format!("/console/jobs/{}", job.id.0),
    });
    Ok(after_action(shown, &format!("/console/jobs/{id}")))
}

/// Cancels or retries every selected job of the jobs page (`ids`, one
/// field each), each as its own change, then returns to the list. A job
/// that cannot be changed (finished meanwhile, out of the token's scope)
/// is skipped and said; the others are done.
pub(super) async fn bulk_job_action(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, Response> {
    let mut form = ActionForm::default();
    let mut action = String::new();
    let mut ids = Vec::new();
    for (key, value) in url::form_urlencoded::parse(&body) {
        match key.as_ref() {
            "csrf" => form.csrf = value.into_owned(),
            "back" => form.back = Some(value.into_owned()),
            "action" => action = value.into_owned(),
            "ids" => match value.parse::<i64>() {
                Ok(id) => ids.push(JobId(id)),
                Err(_) => {
                    return Err(
                        (StatusCode::BAD_REQUEST, "ids must be job numbers\n").into_response()
                    )
                }
            },
            _ => {}
        }
    }
    let session = writer(&service, &headers, &form).await?;
    if action != "cancel" && action != "retry" {
        return Err(no_such_action());
    }
    if ids.len() > PAGE as usize * 2 {
        return Err((StatusCode::BAD_REQUEST, "at most 100 jobs at once\n").into_response());
    }
    let actor = &session.caller.name;
    let mut refused = Vec::new();
    for id in ids {
        if let Err(error) = crate::http::auth::require_job(&service, &session.caller, id).await {
            refused.push(format!("job {id}: {}", error.message));
            continue;
        }
        let done = match action.as_str() {
            "cancel" => admin::cancel_job(&service, actor, id, None).await,
            _ => admin::retry_job(&service, actor, id).await,
        };
        if let Err(error) = done {
            // The message names the job.
            refused.push(error.message);
        }
    }
    let back = back_to(form.back.as_deref(), "/console/jobs");
    if refused.is_empty() {
        return Ok(Redirect::to(&back).into_response());
    }
    let items: String = refused
        .iter()
        .map(|line| format!("<li>{}</li>", minijinja::HtmlEscape(line)))
        .collect();
    Ok((
        StatusCode::CONFLICT,
        Html(format!(
            "<!doctype html><title>Partly done</title><p role=\"alert\">The other selected jobs were done; these were not:</p><ul>{items}</ul><p><a href=\"{}\">Back</a></p>",
            minijinja::HtmlEscape(&back)
        )),
    )
        .into_response())
}

pub(super) async fn runner_action(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Path((id, action)): Path<(i64, String)>,
    Form(form): Form<ActionForm>,
) -> Result<Response, Response> {
    let session = writer(&service, &headers, &form).await?;
    crate::http::auth::require_runner(&service, &session.caller, RunnerId(id))
        .await
        .map_err(scope_refusal)?;
    let actor = &session.caller.name;
    let force = form.force.as_deref() == Some("true");
    let done = match action.as_str() {
        "drain" => admin::drain_runner(&service, actor, RunnerId(id)).await,
        "terminate" => admin::terminate_runner(&service, actor, RunnerId(id), force).await,
        _ => return Err(no_such_action()),
    };
    let back = "/console/runners";
    Ok(after_action(done.map(|_| back.to_owned()), back))
}

pub(super) async fn pool_action(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Path((name, action)): Path<(String, String)>,
    Form(form): Form<ActionForm>,
) -> Result<Response, Response> {
    let session = writer(&service, &headers, &form).await?;
    if !session.caller.scope.covers(Some(&name)) {
        return Err(refused(OUT_OF_SCOPE));
    }
    let paused = match action.as_str() {
        "pause" => true,
        "resume" => false,
        _ => return Err(no_such_action()),
    };
    let done = admin::set_pool_paused(&service, &session.caller.name, &name, paused).await;
    Ok(after_action(done.map(|_| "/".to_owned()), "/"))
}
