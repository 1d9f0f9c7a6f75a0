//! The jobs list and a job's page, with the words for why a job waits and what
//! its bids were.

use super::*;

/// `text`, and — where a pool's providers make several offers — which
/// one bidding chose and why.
pub(super) fn bidding(offers: &[crate::app::explain::OfferChoice], text: String) -> String {
    if offers.len() < 2 {
        return text;
    }
    let Some(chosen) = offers.iter().find(|c| c.chosen) else {
        return format!("{text}; every offer is backing off or full");
    };
    let offer = &chosen.offer;
    let name = if offer.key.is_empty() {
        offer.provider.clone()
    } else {
        format!("{} {}", offer.provider, offer.key)
    };
    format!(
        "{text}; bidding chose {name} at ${:.4}/h, reliability {:.2}, over {} other offers",
        offer.price_per_hour,
        offer.reliability,
        offers.len() - 1
    )
}

/// A wait reason in a sentence.
pub(super) fn waiting_text(explanation: &Explanation) -> String {
    use runway_core::planner::WaitReason as W;
    match explanation {
        Explanation::Waiting {
            reason,
            has_providers,
            offers,
            warm,
        } => {
            let text = bidding(
                offers,
                match reason {
                    W::RunnerIdle { runner } => {
                        format!("runner {runner} is idle and takes it at its next poll")
                    }
                    W::RunnerBooting { runner, since } => {
                        format!(
                            "runner {runner} is booting for it (since {})",
                            rfc3339(*since)
                        )
                    }
                    W::StoppedRunnerStarting { runner, ready_by } => {
                        format!(
                            "a stopped runner ({runner}) is starting for it (ready in ~{} s)",
                            ready_by.since(now()).as_secs()
                        )
                    }
                    W::RunnerRequested { provider } => {
                        format!("a runner is being started by {provider}")
                    }
                    W::AtMaxRunners { max_runners } => {
                        format!("the pool is at max_runners ({max_runners})")
                    }
                    W::ProviderBackoff {
                        provider,
                        last_error,
                        retry_at,
                    } => format!(
                        "provider {provider} is backing off until {} after: {last_error}",
                        rfc3339(*retry_at)
                    ),
                    W::NoProviderCapacity if !has_providers => {
                        "no provider starts runners for this pool; waiting for a runner to register"
                            .to_owned()
                    }
                    W::NoProviderCapacity => "no provider has capacity left".to_owned(),
                    W::ScalingRatio { scaling_ratio } => {
                        format!(
                            "scaling_ratio {scaling_ratio} starts fewer runners than queued jobs"
                        )
                    }
                    W::LeaseExpiredRequeued { attempts } => {
                        format!("requeued after a runner's lease expired ({attempts} attempts)")
                    }
                    W::PoolPaused => "the pool is paused".to_owned(),
                    W::KeyAtCap { key, max_running } => format!(
                        "{} already has {max_running} jobs running here (the pool's cap per key)",
                        if key.is_empty() {
                            "its key"
                        } else {
                            key.as_str()
                        }
                    ),
                },
            );
            match warm {
                Some(warm) => format!("{text}; {warm}"),
                None => text,
            }
        }
        Explanation::Unroutable { reason } => {
            format!(
                "unroutable: {}",
                reason.as_deref().unwrap_or("no pool serves its labels")
            )
        }
        Explanation::PoolNotConfigured { .. } => {
            "its pool is no longer in the configuration".to_owned()
        }
        Explanation::Held {
            reason,
            gives_up_at,
        } => format!(
            "held: {} (given up at {} if GitHub has not answered)",
            reason.as_deref().unwrap_or(crate::app::intake::HELD),
            rfc3339(*gives_up_at)
        ),
    }
}

pub(super) fn repository(job: &runway_core::Job) -> Option<String> {
    let details: serde_json::Value = serde_json::from_str(&job.payload).ok()?;
    details["repository"]
        .as_str()
        .or_else(|| details["repo"].as_str())
        .map(str::to_owned)
}

#[derive(Deserialize, Default)]
pub(super) struct JobsQuery {
    pub(super) pool: Option<String>,
    pub(super) state: Option<String>,
    pub(super) repository: Option<String>,
    /// Older than this job (the "Older" link).
    pub(super) cursor: Option<i64>,
    /// Newer than this job (the "Newer" link).
    pub(super) after: Option<i64>,
}

pub(super) fn job_row(job: &runway_core::Job, waiting: Option<&Explanation>) -> serde_json::Value {
    json!({
        "id": job.id.0,
        "pool": job.pool,
        "labels": job.labels,
        "state": job.state.as_str(),
        "waiting": waiting.map(waiting_text).unwrap_or_default(),
        "runner": job.runner.map(|r| r.0),
        // A queued job has no runner yet; the one booting (or idle) for it
        // is named beside it, as its reason names it.
        "runner_for": match waiting {
            Some(Explanation::Waiting {
                reason:
                    runway_core::planner::WaitReason::RunnerBooting { runner, .. }
                    | runway_core::planner::WaitReason::StoppedRunnerStarting { runner, .. }
                    | runway_core::planner::WaitReason::RunnerIdle { runner },
                ..
            }) if job.runner.is_none() => Some(runner.0),
            _ => None,
        },
        "enqueued_at": rfc3339(job.enqueued_at),
        "queued_ago": age(now(), job.enqueued_at),
        "repository": repository(job),
        "source": job.source.as_str(),
        "external_id": job.external_id,
        "share_key": job.share.key,
        "live": !job.state.is_terminal(),
        "retryable": job.source == JobSource::Api
            && matches!(job.state, JobState::Failed | JobState::Cancelled),
    })
}

pub(super) async fn jobs(
    Viewer(session): Viewer,
    State(service): State<Arc<Service>>,
    Query(query): Query<JobsQuery>,
) -> Response {
    let pool = query.pool.clone().filter(|p| !p.is_empty());
    if pool
        .as_deref()
        .is_some_and(|p| !session.caller.scope.covers(Some(p)))
    {
        return refused(OUT_OF_SCOPE);
    }
    let state = query
        .state
        .as_deref()
        .filter(|s| !s.is_empty())
        .and_then(|s| s.parse::<JobState>().ok());
    let repository_filter = query.repository.clone().filter(|r| !r.is_empty());
    let newer = query.after.is_some() && query.cursor.is_none();
    let from = if newer { query.after } else { query.cursor }.map(JobId);
    let Ok((mut shown, further)) = read_jobs_page(
        &service,
        &session,
        state,
        pool.as_ref(),
        repository_filter.as_deref(),
        from,
        newer,
    )
    .await
    else {
        return unavailable();
    };
    // Newest first on every page, whichever way it was read.
    if newer {
        shown.reverse();
    }
    // Older: where an older read stopped; from a newer read, below the
    // page (the page it came from). Newer: where a newer read stopped;
    // from an older read that began at a cursor, above the page.
    let (older, newer_than) = if newer {
        (shown.last().map(|j| j.id), further)
    } else {
        (further, from.and(shown.first().map(|j| j.id)))
    };
    let Ok(explained) = crate::app::explain::explain_jobs(&service, &shown).await else {
        return unavailable();
    };
    let rows: Vec<_> = shown
        .iter()
        .map(|job| job_row(job, explained.get(&job.id)))
        .collect();
    let link = |key: &str, id: JobId| {
        let mut link = format!("/console/jobs?{key}={}", id.0);
        for (key, value) in [
            ("pool", &pool),
            ("state", &query.state),
            ("repository", &repository_filter),
        ] {
            if let Some(value) = value.as_ref().filter(|v| !v.is_empty()) {
                link.push_str(&format!("&{key}={}", url_encode(value)));
            }
        }
        link
    };
    let next_page = older.map(|id| link("cursor", id));
    let newer_page = newer_than.map(|id| link("after", id));
    // This page, for an action to come back to.
    let here = match (query.cursor, query.after) {
        (Some(cursor), _) => link("cursor", JobId(cursor)),
        (None, Some(after)) => link("after", JobId(after)),
        (None, None) => link("cursor", JobId(i64::MAX)),
    };
    let config = service.config();
    page(
        &session,
        "jobs.html",
        "jobs",
        json!({
            "jobs": rows,
            "followed": shown.iter().map(|j| j.id.0).collect::<Vec<_>>(),
            "next_page": next_page,
            "newer_page": newer_page,
            "here": here,
            "pool_names": config
                .pools
                .iter()
                .filter(|p| session.caller.scope.covers(Some(&p.name)))
                .map(|p| p.name.clone())
                .collect::<Vec<_>>(),
            "states": JobState::ALL.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
            "filter": {"pool": pool, "state": query.state, "repository": repository_filter},
        }),
    )
}

/// One page of jobs from `from` (exclusive), older (newest first) or
/// `newer` (oldest first), keeping those the session may see and the
/// repository filter wants; and the cursor to read on from when more lie
/// that way. A filter that hides most reads on until the page is full,
/// up to 20 reads; where that bound stops it, the cursor is where reading
/// stopped.
pub(super) async fn read_jobs_page(
    service: &Service,
    session: &Session,
    state: Option<JobState>,
    pool: Option<&String>,
    repository_filter: Option<&str>,
    from: Option<JobId>,
    newer: bool,
) -> Result<(Vec<runway_core::Job>, Option<JobId>), runway_store::StoreError> {
    let mut shown = Vec::new();
    let mut position = from;
    for _ in 0..20 {
        let filter = JobFilter {
            state,
            pool: pool.cloned(),
            limit: Some(PAGE + 1),
            newest_first: !newer,
            oldest_first: newer,
            before: if newer { None } else { position },
            after: if newer { position } else { None },
        };
        let mut read = service.store.list_jobs(&filter).await?;
        let more = read.len() > PAGE as usize;
        read.truncate(PAGE as usize);
        position = read.last().map(|j| j.id);
        let fetched = read.len();
        for (index, job) in read.into_iter().enumerate() {
            let keep = session.caller.scope.covers(job.pool.as_deref())
                && repository_filter
                    .is_none_or(|wanted| repository(&job).as_deref() == Some(wanted));
            if keep {
                shown.push(job);
            }
            if shown.len() == PAGE as usize {
                // Full: more lie beyond if anything is left after it.
                let left = index + 1 < fetched || more;
                let further = left.then(|| shown.last().map(|j| j.id)).flatten();
                return Ok((shown, further));
            }
        }
        if !more {
            return Ok((shown, None));
        }
    }
    Ok((shown, position))
}

pub(super) fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

pub(super) async fn job(
    Viewer(session): Viewer,
    State(service): State<Arc<Service>>,
    Path(id): Path<i64>,
) -> Response {
    let id = JobId(id);
    let Ok(found) = service.store.get_job(id).await else {
        return unavailable();
    };
    let Some(found) = found else {
        return not_found("No such job.", "/console/jobs", "Jobs");
    };
    if !session.caller.scope.covers(found.pool.as_deref()) {
        return refused(OUT_OF_SCOPE);
    }
    let explanation = crate::app::explain::explain_job(&service, &found)
        .await
        .ok()
        .flatten();
    let steps = service
        .store
        .job_history(id)
        .await
        .ok()
        .flatten()
        .unwrap_or_default();
    let mut before = None;
    let events: Vec<_> = steps
        .iter()
        .map(|step| {
            let event = crate::http::admin::event_name(before, step);
            before = Some(step.state);
            json!({
                "at": rfc3339(step.at),
                "event": event,
                "state": step.state.as_str(),
                "runner": step.runner.map(|r| r.0),
                "conclusion": step.conclusion.map(|c| c.as_str()),
                "reason": step.reason,
            })
        })
        .collect();
    let log = service
        .store
        .get_job_log(id)
        .await
        .ok()
        .flatten()
        .map(|(_, log)| log);
    // What an operator asks of one job: what it runs, for how long it may,
    // how long it waited and ran, and how it ended.
    let payload: serde_json::Value = serde_json::from_str(&found.payload).unwrap_or_default();
    let at = now();
    let span =
        |from: Timestamp, to: Option<Timestamp>| short_duration(to.unwrap_or(at).since(from));
    let facts = json!({
        "script": payload["script"].as_str(),
        "timeout": payload["timeout_seconds"].as_u64().map(|s| short_duration(Duration::from_secs(s))),
        "queued_for": span(found.created_at, found.started_at.or(found.finished_at)),
        "ran_for": found.started_at.map(|started| span(started, found.finished_at)),
        "reason": found.reason,
        "conclusion": found.conclusion.map(|c| c.as_str()),
        "created_at": rfc3339(found.created_at),
        "finished_at": found.finished_at.map(rfc3339),
    });
    page(
        &session,
        "job.html",
        "jobs",
        json!({"job": job_row(&found, explanation.as_ref()), "facts": facts, "events": events, "log": log, "followed": [found.id.0]}),
    )
}
