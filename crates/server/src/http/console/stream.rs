//! The live stream (`/console/stream`): Server-Sent Events that update the
//! cells a page shows.

use super::*;

/// What a tab's page shows live, from its `page` parameter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Shows {
    /// The overview and pool pages: each pool's counts and state.
    Pools,
    /// The jobs and job pages: the followed jobs' states and reasons.
    Jobs,
    /// The runners pages: each live runner's state and job.
    Runners,
    /// Nothing live.
    Nothing,
    /// A stream that names no page (a script's): all of the above.
    All,
}

impl Shows {
    pub(super) fn of(page: Option<&str>) -> Shows {
        match page {
            None | Some("") => Shows::All,
            Some("overview") => Shows::Pools,
            Some("jobs") => Shows::Jobs,
            Some("runners") => Shows::Runners,
            Some(_) => Shows::Nothing,
        }
    }

    pub(super) fn includes(self, part: Shows) -> bool {
        self == part || self == Shows::All
    }
}

/// The cells of `snapshot` a tab showing `shows`, following `followed`,
/// may see under `scope`. A followed job the snapshot lacks (pruned) gets
/// no cell: a reason is never blanked that was not computed.
pub(super) fn cells_for(
    service: &Service,
    snapshot: &crate::app::live::Snapshot,
    shows: Shows,
    scope: &crate::config::Scope,
    followed: &[JobId],
) -> serde_json::Map<String, serde_json::Value> {
    let mut cells = serde_json::Map::new();
    if shows.includes(Shows::Pools) {
        for pool in pool_rows_of(
            service,
            &snapshot.counts,
            &snapshot.runners,
            &snapshot.paused,
        ) {
            if !scope.covers(Some(&pool.name)) {
                continue;
            }
            let name = &pool.name;
            for (field, value) in [
                ("queued", pool.queued),
                ("running", pool.running),
                ("booting", pool.booting),
                ("idle", pool.idle),
                ("busy", pool.busy),
            ] {
                cells.insert(format!("pool:{name}:{field}"), json!(value.to_string()));
            }
            if let Some(stopped) = pool.stopped {
                cells.insert(format!("pool:{name}:stopped"), json!(stopped.to_string()));
            }
            let state = if pool.paused { "paused" } else { "active" };
            cells.insert(format!("pool:{name}:state"), json!(state));
        }
    }
    if shows.includes(Shows::Jobs) {
        for id in followed {
            let Some((job, why)) = snapshot.jobs.get(id) else {
                continue;
            };
            if !scope.covers(job.pool.as_deref()) {
                continue;
            }
            cells.insert(format!("job:{id}:state"), json!(job.state.as_str()));
            let waiting = why.as_ref().map(waiting_text).unwrap_or_default();
            cells.insert(format!("job:{id}:waiting"), json!(waiting));
        }
    }
    if shows.includes(Shows::Runners) {
        for runner in &snapshot.runners {
            if !scope.covers(Some(&runner.pool)) {
                continue;
            }
            cells.insert(
                format!("runner:{}:state", runner.id),
                json!(runner.state.as_str()),
            );
            let job = runner
                .job
                .map(|j| j.0.to_string())
                .unwrap_or_else(|| "-".to_owned());
            cells.insert(format!("runner:{}:job", runner.id), json!(job));
        }
    }
    cells
}

#[derive(Deserialize)]
pub(super) struct StreamQuery {
    /// The page the tab shows (`overview`, `jobs`, `runners`, …): what it
    /// is sent.
    pub(super) page: Option<String>,
    /// The jobs the page shows (comma-separated ids): their cells follow
    /// them after they finish too.
    pub(super) jobs: Option<String>,
}

/// The most jobs one stream follows by id (a page shows [`PAGE`]).
pub(super) const FOLLOWED: usize = 100;

/// A tab's live updates: each tick, the cells its page shows, taken from
/// the replica's one snapshot of the tick (`app/live.rs`); a tick whose
/// snapshot could not be read sends nothing rather than blanks.
pub(super) async fn stream(
    State(service): State<Arc<Service>>,
    headers: HeaderMap,
    Query(query): Query<StreamQuery>,
) -> Response {
    let Some(opened) = session(&service, &headers).await else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let scope = opened.caller.scope;
    let shows = Shows::of(query.page.as_deref());
    let followed: Vec<JobId> = if shows.includes(Shows::Jobs) {
        query
            .jobs
            .unwrap_or_default()
            .split(',')
            .filter_map(|id| id.trim().parse().ok().map(JobId))
            .take(FOLLOWED)
            .collect()
    } else {
        Vec::new()
    };
    let following = Arc::new(service.console.follow(followed.clone()));
    // Nothing older than the tab: its page was rendered before it opened.
    let seen = std::time::Instant::now();
    let start = (service, scope, followed, headers, following, seen, 0u32);
    let updates = futures_util::stream::unfold(
        start,
        move |(service, scope, followed, headers, following, mut seen, mut tick)| async move {
            loop {
                if tick > 0 {
                    tokio::time::sleep(TICK).await;
                }
                // A session ended meanwhile (logout, its token removed, every
                // session ended) ends its stream within a few ticks.
                if tick > 0 && tick % SESSION_RECHECK_TICKS == 0 {
                    session(&service, &headers).await?;
                }
                tick = tick.wrapping_add(1);
                if shows == Shows::Nothing {
                    // Nothing to send; the keep-alive holds the connection
                    // and the session is still checked.
                    continue;
                }
                let Ok(snapshot) = service.console.snapshot(&service, TICK, seen).await else {
                    continue;
                };
                seen = snapshot.taken;
                let cells = cells_for(&service, &snapshot, shows, &scope, &followed);
                let event = Event::default()
                    .event("update")
                    .data(json!({"cells": cells}).to_string());
                return Some((
                    Ok::<_, std::convert::Infallible>(event),
                    (service, scope, followed, headers, following, seen, tick),
                ));
            }
        },
    );
    Sse::new(updates)
        .keep_alive(KeepAlive::default())
        .into_response()
}
