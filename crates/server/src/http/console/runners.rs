//! The runners list and a runner's page.

use super::*;

#[derive(Deserialize)]
pub(super) struct RunnersQuery {
    pub(super) pool: Option<String>,
}

pub(super) async fn runners(
    Viewer(session): Viewer,
    State(service): State<Arc<Service>>,
    Query(query): Query<RunnersQuery>,
) -> Response {
    let pool = query.pool.filter(|p| !p.is_empty());
    let Ok(live) = service.store.list_live_runners(pool.as_deref()).await else {
        return unavailable();
    };
    let at = now();
    let rows: Vec<_> = live
        .iter()
        .filter(|runner| session.caller.scope.covers(Some(&runner.pool)))
        .map(|runner| {
            json!({
                "id": runner.id.0,
                "name": runner.name,
                "pool": runner.pool,
                "provider": runner.provider,
                "state": runner.state.as_str(),
                "job": runner.job.map(|j| j.0),
                "draining": runner.draining,
                "age": age(at, runner.requested_at),
            })
        })
        .collect();
    page(
        &session,
        "runners.html",
        "runners",
        json!({"runners": rows, "pool": pool}),
    )
}

/// One runner, live or ended (a finished job's page links here): its
/// states with their times, why it ended, and what it reported.
pub(super) async fn runner_page(
    Viewer(session): Viewer,
    State(service): State<Arc<Service>>,
    Path(id): Path<i64>,
) -> Response {
    let Ok(found) = service.store.get_runner(RunnerId(id)).await else {
        return unavailable();
    };
    let Some(runner) = found else {
        return not_found(
            "No such runner (ended runners are kept for [retention] ended_runners).",
            "/console/runners",
            "Runners",
        );
    };
    if !session.caller.scope.covers(Some(&runner.pool)) {
        return refused(OUT_OF_SCOPE);
    }
    let reports = service
        .store
        .runner_reports(runner.id)
        .await
        .unwrap_or_default();
    let at = now();
    let when = |t: Option<Timestamp>| t.map(|t| format!("{} ({} ago)", rfc3339(t), age(at, t)));
    let steps: Vec<serde_json::Value> = [
        ("requested", Some(runner.requested_at)),
        ("provisioning", runner.provisioning_at),
        ("idle", runner.idle_at),
        ("busy", runner.busy_at),
        ("terminating", runner.terminating_at),
        ("ended", runner.ended_at),
    ]
    .into_iter()
    .filter_map(|(step, t)| when(t).map(|w| json!({"step": step, "at": w})))
    .collect();
    page(
        &session,
        "runner.html",
        "runners",
        json!({
            "runner": {
                "id": runner.id.0,
                "name": runner.name,
                "pool": runner.pool,
                "provider": runner.provider,
                "instance": runner.instance_id,
                "state": runner.state.as_str(),
                "job": runner.job.map(|j| j.0),
                "reason": runner.reason,
                "draining": runner.draining,
                "labels": runner.labels,
            },
            "steps": steps,
            "reports": reports.iter().map(|(kind, body)| json!({"kind": kind, "body": body})).collect::<Vec<_>>(),
        }),
    )
}

pub(super) fn age(now: Timestamp, since: Timestamp) -> String {
    let seconds = now.since(since).as_secs();
    match seconds {
        0..=119 => format!("{seconds}s"),
        120..=7199 => format!("{}m", seconds / 60),
        7200..=172_799 => format!("{}h", seconds / 3600),
        _ => format!("{}d", seconds / 86_400),
    }
}
